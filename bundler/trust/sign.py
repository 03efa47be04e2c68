"""Sign a bundle in the store: OCI artifacts whose subject is the bundle manifest (bundler.store.referrers finds them)."""

from __future__ import annotations

__all__ = ["attach_signature", "sign_checked", "sign_modelkit", "signed_fields"]

import datetime as dt
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from bundler.trust import cosign, keys, signature
from core.errors import BundleError
from bundler.trust.contentcheck import check_stored
from bundler.format.manifest import Descriptor, go_json
from bundler.format.mediatypes import OCI_IMAGE_CONFIG, OCI_MANIFEST, SIGSTORE_BUNDLE, SIMPLE_SIGNING
from bundler.store.modelkit import ModelKit, file_hashes
from bundler.store.referrers import find_legacy_signatures, find_signatures, stage_artifact
from bundler.store.refs import Ref
from bundler.trust.releases import check_new_release
from bundler.store.layout import Staging, Store
from bundler.trust.verify import verify_bundle

DEFAULT_VALID_DAYS = 365


@dataclass(frozen=True)
class SignResult:
    digest: str  # the bundle's manifest digest
    key_id: str
    signature_digest: str  # the signature artifact's manifest digest
    cosign_digest: str = ""  # the cosign-style signature artifact's manifest digest


def signed_fields(mk: ModelKit, roles: Mapping[str, str], valid_days: float, now: dt.datetime | None = None) -> dict[str, Any]:
    """Our fields in the model-signing predicate: what this signature vouches for, and until when."""
    now = now or dt.datetime.now(dt.timezone.utc)
    return {
        "name": mk.kitfile.name,
        "version": mk.kitfile.version,
        "manifest_digest": mk.digest,
        "config_digest": mk.config_desc.digest,
        "roles": dict(sorted(roles.items())),
        "created": signature.format_time(now),
        "expires": signature.format_time(now + dt.timedelta(days=valid_days)),
    }



def sign_modelkit(
    store: Store,
    mk: ModelKit,
    private_key: Any,
    files: Mapping[str, str] | None = None,
    roles: Mapping[str, str] | None = None,
    valid_days: float = DEFAULT_VALID_DAYS,
    cosign_legacy: bool = False,
    certificates: Sequence[Any] = (),
) -> SignResult:
    """Sign a bundle and store the signature artifacts beside it (files/roles: from pack, else read from the
    layers): the model-signing one, the cosign-style one, and with `cosign_legacy` cosign's older tag form.
    With `certificates` (the leaf of `private_key`, then its chain) the model-signing signature carries them."""
    if files is None or roles is None:
        files, roles = file_hashes(store, mk)
    fields = signed_fields(mk, roles, valid_days)
    if certificates and keys.key_id(certificates[0].public_key()) != keys.key_id(private_key.public_key()):
        raise BundleError("key-error", "the signing certificate (--cert) is not the certificate of the private key (--key)")
    payload = signature.sign(files, fields, private_key, model_name=mk.kitfile.name, certificates=certificates)
    # The same key signs the manifest digest as cosign does, for admission controllers (bundler.trust.cosign);
    # it expires with the model-signing signature.
    cosign_payload = cosign.sign_digest(mk.digest, private_key, {cosign.EXPIRES_ANNOTATION: fields["expires"]})
    with store.transaction() as staging:
        desc = _stage_artifact(staging, mk, payload, {"dev.sigstore.bundle.content": "dsse-envelope", "dev.sigstore.bundle.predicateType": signature.PREDICATE_TYPE})
        cosign_desc = _stage_artifact(staging, mk, cosign_payload, cosign.artifact_annotations(signature.parse_time(fields["created"])))
        staging.commit()
        store.add_untagged(desc, SIGSTORE_BUNDLE)
        store.add_untagged(cosign_desc, SIGSTORE_BUNDLE)
        for old in _own_expired(store, mk.digest, private_key.public_key()):
            if old != desc.digest:  # the new one stays even if it is already expired (--valid-days <= 0)
                store.remove_manifest(old)
        for old in _own_cosign_expired(store, mk.digest, private_key.public_key()):
            if old != cosign_desc.digest:  # as above: a renewal replaces this key's expired ones
                store.remove_manifest(old)
    if cosign_legacy:
        _store_legacy(store, mk, private_key, {cosign.EXPIRES_ANNOTATION: fields["expires"]})
    return SignResult(mk.digest, keys.key_id(private_key.public_key()), desc.digest, cosign_desc.digest)


def _stage_artifact(staging: Staging, mk: ModelKit, payload: bytes, annotations: Mapping[str, str]) -> Descriptor:
    """Stage a signature artifact (an OCI referrer of the bundle manifest holding one Sigstore bundle)."""
    return stage_artifact(staging, SIGSTORE_BUNDLE, SIGSTORE_BUNDLE, payload, mk.manifest_desc, annotations)


def _store_legacy(store: Store, mk: ModelKit, private_key: Any, annotations: Mapping[str, str]) -> Descriptor:
    """Store cosign's legacy signature image for the bundle (pushed as the `sha256-<hex>.sig` tag), replacing
    an earlier one: the tag holds one image. Its `subject` keeps it with its bundle in `gc`."""
    payload = cosign.legacy_payload(mk.digest, mk.ref.name, annotations)
    with store.transaction() as staging:
        layer = Descriptor(SIMPLE_SIGNING, staging.add_bytes(payload).digest, len(payload))
        config_bytes = cosign.legacy_config(layer.digest)
        config = Descriptor(OCI_IMAGE_CONFIG, staging.add_bytes(config_bytes).digest, len(config_bytes))
        manifest = go_json(
            {
                "schemaVersion": 2,
                "mediaType": OCI_MANIFEST,
                "config": config.as_dict(),
                "layers": [layer.as_dict() | {"annotations": {cosign.SIGNATURE_ANNOTATION: cosign.legacy_sign(payload, private_key)}}],
                "subject": mk.manifest_desc.as_dict() | {"mediaType": OCI_MANIFEST},
            }
        )
        desc = Descriptor(OCI_MANIFEST, staging.add_bytes(manifest).digest, len(manifest))
        staging.commit()
        for old, _, _ in find_legacy_signatures(store, mk.digest):
            store.remove_manifest(old.digest)
        store.add_untagged(desc, SIMPLE_SIGNING)
    return desc



def attach_signature(store: Store, mk: ModelKit, payload: bytes, annotations: Mapping[str, str]) -> Descriptor:
    """Store a Sigstore bundle made elsewhere (cosign, Sigstore's own libraries) as a signature artifact of
    the bundle; `verify` judges it like any other."""
    with store.transaction() as staging:
        desc = _stage_artifact(staging, mk, payload, annotations)
        staging.commit()
        store.add_untagged(desc, SIGSTORE_BUNDLE)
    return desc


def _own_cosign_expired(store: Store, subject_digest: str, public_key: Any) -> list[str]:
    """Digests of this bundle's cosign-style signatures by this very key that have expired."""
    kid = keys.key_id(public_key)
    out = []
    for desc, payload in find_signatures(store, subject_digest):
        if cosign.kind_of(payload) != cosign.KIND:
            continue
        try:
            cosign.verify_digest(payload, {kid: public_key}, subject_digest)
        except BundleError as err:
            if err.code == "expired":
                out.append(desc.digest)
    return out


def _own_expired(store: Store, subject_digest: str, public_key: Any) -> list[str]:
    """Digests of this bundle's signatures made by this very key that have expired: a renewal replaces them.

    Only signatures that verify with the signing key count as its own (a hint alone proves nothing).
    """
    now = dt.datetime.now(dt.timezone.utc)
    kid = keys.key_id(public_key)
    out = []
    for desc, payload in find_signatures(store, subject_digest):
        try:
            claims = signature.verify(payload, {kid: public_key})
            expires = signature.signed_expiry(claims.bundle.get("expires"), "signed expires")
            if expires is not None and expires <= now:
                out.append(desc.digest)
        except BundleError:  # not this key's, or an expiry verify refuses anyway: left as it is
            continue
    return out


def sign_checked(store: Store, ref: Ref, private_key: Any, valid_days: float = DEFAULT_VALID_DAYS, cosign_legacy: bool = False,
                 certificates: Sequence[Any] = ()) -> SignResult:
    """`bundle sign`: refuse what `bundle pack --key` refuses, then sign. In order: verify's integrity checks
    (no signature needed yet: a damaged bundle is never signed), the content checks verify and run make
    (bundler.trust.contentcheck, on the files extracted into a private temp directory), and no other content
    signed in this store as the same name and version."""

    report = verify_bundle(store, ref, {}, allow_unsigned=True)
    report.raise_for_error()
    mk = report.modelkit
    assert mk is not None
    check_stored(store, report)
    check_new_release(store, mk.kitfile.name, mk.kitfile.version, mk.digest)
    return sign_modelkit(store, mk, private_key, valid_days=valid_days, cosign_legacy=cosign_legacy, certificates=certificates)
