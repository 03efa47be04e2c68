"""Sign a bundle in the store, and find its signatures: an OCI artifact whose subject is the bundle manifest."""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from bundler import cosign, keys, signature
from bundler.errors import BundleError
from bundler.manifest import OCI_EMPTY, OCI_MANIFEST, Descriptor, go_json, parse_descriptor
from bundler.modelkit import ModelKit
from bundler.refs import Ref
from bundler.store import Store
from bundler.tarlayer import iter_layer

EMPTY_CONFIG = b"{}"
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


def file_hashes(store: Store, mk: ModelKit) -> tuple[dict[str, str], dict[str, str]]:
    """(path -> sha256, path -> role) of every file in the bundle, read from its layers."""
    hashes: dict[str, str] = {}
    roles: dict[str, str] = {}
    for spec, desc in mk.layers:
        with open(store.blob_path(desc.digest), "rb") as f:
            for member, content in iter_layer(f, spec.path):
                if member.kind != "file" or content is None:
                    continue
                h = hashlib.sha256()
                while chunk := content.read(1 << 20):
                    h.update(chunk)
                hashes[member.name] = h.hexdigest()
                roles[member.name] = spec.role
    return hashes, roles


def sign_modelkit(
    store: Store,
    mk: ModelKit,
    private_key: Any,
    files: Mapping[str, str] | None = None,
    roles: Mapping[str, str] | None = None,
    valid_days: float = DEFAULT_VALID_DAYS,
    cosign_legacy: bool = False,
) -> SignResult:
    """Sign a bundle and store the signature artifacts beside it (files/roles: from pack, else read from the
    layers): the model-signing one, the cosign-style one, and with `cosign_legacy` cosign's older tag form."""
    if files is None or roles is None:
        files, roles = file_hashes(store, mk)
    fields = signed_fields(mk, roles, valid_days)
    payload = signature.sign(files, fields, private_key, model_name=mk.kitfile.name)
    # The same key signs the manifest digest as cosign does, for admission controllers (bundler.cosign);
    # it expires with the model-signing signature.
    cosign_payload = cosign.sign_digest(mk.digest, private_key, {cosign.EXPIRES_ANNOTATION: fields["expires"]})
    with store.transaction() as staging:
        desc = _stage_artifact(staging, mk, payload, {"dev.sigstore.bundle.content": "dsse-envelope", "dev.sigstore.bundle.predicateType": signature.PREDICATE_TYPE})
        cosign_desc = _stage_artifact(staging, mk, cosign_payload, cosign.artifact_annotations(signature.parse_time(fields["created"])))
        staging.commit()
        store.add_untagged(desc, signature.SIGSTORE_BUNDLE_MEDIA_TYPE)
        store.add_untagged(cosign_desc, signature.SIGSTORE_BUNDLE_MEDIA_TYPE)
        for old in _own_expired(store, mk.digest, private_key.public_key()):
            if old != desc.digest:  # the new one stays even if it is already expired (--valid-days <= 0)
                store.remove_manifest(old)
        for old in _own_cosign_expired(store, mk.digest, private_key.public_key()):
            if old != cosign_desc.digest:  # as above: a renewal replaces this key's expired ones
                store.remove_manifest(old)
    if cosign_legacy:
        _store_legacy(store, mk, private_key, {cosign.EXPIRES_ANNOTATION: fields["expires"]})
    return SignResult(mk.digest, keys.key_id(private_key.public_key()), desc.digest, cosign_desc.digest)


def _stage_artifact(staging: Any, mk: ModelKit, payload: bytes, annotations: Mapping[str, str]) -> Descriptor:
    """Stage a signature artifact (an OCI referrer of the bundle manifest holding one Sigstore bundle)."""
    layer = Descriptor(signature.SIGSTORE_BUNDLE_MEDIA_TYPE, staging.add_bytes(payload).digest, len(payload))
    config = Descriptor(OCI_EMPTY, staging.add_bytes(EMPTY_CONFIG).digest, len(EMPTY_CONFIG))
    manifest = go_json(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "artifactType": signature.SIGSTORE_BUNDLE_MEDIA_TYPE,
            "config": config.as_dict(),
            "layers": [layer.as_dict()],
            "subject": mk.manifest_desc.as_dict() | {"mediaType": OCI_MANIFEST},
            "annotations": dict(annotations),
        }
    )
    return Descriptor(OCI_MANIFEST, staging.add_bytes(manifest).digest, len(manifest))


def _store_legacy(store: Store, mk: ModelKit, private_key: Any, annotations: Mapping[str, str]) -> Descriptor:
    """Store cosign's legacy signature image for the bundle (pushed as the `sha256-<hex>.sig` tag), replacing
    an earlier one: the tag holds one image. Its `subject` keeps it with its bundle in `gc`."""
    payload = cosign.legacy_payload(mk.digest, mk.ref.name, annotations)
    with store.transaction() as staging:
        layer = Descriptor(cosign.SIMPLE_SIGNING_MEDIA_TYPE, staging.add_bytes(payload).digest, len(payload))
        config_bytes = cosign.legacy_config(layer.digest)
        config = Descriptor(cosign.OCI_IMAGE_CONFIG, staging.add_bytes(config_bytes).digest, len(config_bytes))
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
        store.add_untagged(desc, cosign.SIMPLE_SIGNING_MEDIA_TYPE)
    return desc


def find_legacy_signatures(store: Store, subject_digest: str) -> list[tuple[Descriptor, bytes, dict[str, Any]]]:
    """The bundle's cosign legacy signature images in the store: (descriptor, manifest bytes, manifest)."""
    out = []
    for desc in store.untagged(cosign.SIMPLE_SIGNING_MEDIA_TYPE):
        try:
            data, manifest = store.read_json_blob(desc)
        except BundleError:
            continue
        subject = manifest.get("subject") if isinstance(manifest, dict) else None
        if isinstance(subject, dict) and subject.get("digest") == subject_digest:
            out.append((desc, data, manifest))
    return out


def attach_signature(store: Store, mk: ModelKit, payload: bytes, annotations: Mapping[str, str]) -> Descriptor:
    """Store a Sigstore bundle made elsewhere (cosign, Sigstore's own libraries) as a signature artifact of
    the bundle; `verify` judges it like any other."""
    with store.transaction() as staging:
        desc = _stage_artifact(staging, mk, payload, annotations)
        staging.commit()
        store.add_untagged(desc, signature.SIGSTORE_BUNDLE_MEDIA_TYPE)
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
            expires = claims.bundle.get("expires")
            if isinstance(expires, str) and signature.parse_time(expires) <= now:
                out.append(desc.digest)
        except BundleError:
            continue
    return out


def _signature_artifacts(store: Store) -> Iterator[tuple[Descriptor, str, bytes]]:
    """Every readable signature artifact in the store: (its descriptor, its subject's digest, its Sigstore bundle bytes)."""
    for desc in store.untagged(signature.SIGSTORE_BUNDLE_MEDIA_TYPE):
        try:
            _, manifest = store.read_json_blob(desc)
        except BundleError:
            continue  # a damaged signature artifact counts as no signature; verify then says so
        subject = manifest.get("subject") if isinstance(manifest, dict) else None
        if not isinstance(subject, dict) or not isinstance(subject.get("digest"), str):
            continue
        layers = manifest.get("layers")
        if not isinstance(layers, list) or len(layers) != 1:
            continue
        try:
            layer = parse_descriptor(layers[0], f"signature {desc.digest} layer")
            if layer.media_type != signature.SIGSTORE_BUNDLE_MEDIA_TYPE:
                continue
            data, _ = store.read_json_blob(layer)
            # Its config too (the empty JSON object): verify and push walk this artifact, so every blob of it is checked.
            store.read_json_blob(parse_descriptor(manifest.get("config"), f"signature {desc.digest} config"))
        except BundleError:
            continue
        yield desc, subject["digest"], data


def damaged_signatures(store: Store, subject_digest: str) -> list[str]:
    """Digests of signature artifacts whose manifest names `subject_digest` but which `find_signatures` leaves
    out: one of their blobs is missing or does not match its digest and size (or the artifact is malformed)."""
    usable = {desc.digest for desc, _ in find_signatures(store, subject_digest)}
    out = []
    for desc in store.untagged(signature.SIGSTORE_BUNDLE_MEDIA_TYPE):
        try:
            _, manifest = store.read_json_blob(desc)
        except BundleError:
            continue  # its subject cannot be told
        subject = manifest.get("subject") if isinstance(manifest, dict) else None
        if isinstance(subject, dict) and subject.get("digest") == subject_digest and desc.digest not in usable:
            out.append(desc.digest)
    return out


def find_signatures(store: Store, subject_digest: str) -> list[tuple[Descriptor, bytes]]:
    """Signature artifacts in the store whose subject is `subject_digest`, with their Sigstore bundle bytes."""
    return [(desc, data) for desc, subject, data in _signature_artifacts(store) if subject == subject_digest]


def signed_releases(store: Store, name: str, version: str) -> set[str]:
    """The manifest digests this store knows as release `name version`, signed: the signatures it holds
    (their predicate's name, version and manifest digest, over that very subject) and the digests verify
    remembers for its rollback check (.specbundle/versions.json).

    Signatures are read, not verified: the store keeps only those it made or pull verified, and this only
    decides what pack and sign refuse to make, never what is trusted.
    """
    from bundler.verify import ROLLBACK_STATE, _memory  # verify imports this module

    found: set[str] = set()
    for _, subject, data in _signature_artifacts(store):
        claims = signature.read_unverified(data)
        fields = claims.bundle if claims is not None else {}
        if (fields.get("name"), fields.get("version"), fields.get("manifest_digest")) == (name, version, subject):
            found.add(subject)
    remembered = _memory(store.state(ROLLBACK_STATE), name)["digests"].get(version)
    if isinstance(remembered, str):
        found.add(remembered)
    return found


def check_new_release(store: Store, name: str, version: str, digest: str) -> None:
    """Refuse to make `name version` with content `digest` when the store has that release signed with other
    content: verify would refuse one of the two as a replaced release (`rollback`). The same content passes."""
    other = sorted(signed_releases(store, name, version) - {digest})
    if other:
        raise BundleError("rollback", f"{name} {version} is already signed in this store with other content "
                          f"({other[0][:19]}…): raise package.version in the Kitfile for a new release")


def sign_checked(store: Store, ref: Ref, private_key: Any, valid_days: float = DEFAULT_VALID_DAYS, cosign_legacy: bool = False) -> SignResult:
    """`bundle sign`: refuse what `bundle pack --key` refuses, then sign. In order: verify's integrity checks
    (no signature needed yet: a damaged bundle is never signed), the content checks verify and run make
    (bundler.contentcheck, on the files extracted into a private temp directory), and no other content
    signed in this store as the same name and version."""
    from bundler.contentcheck import check_stored
    from bundler.verify import verify_bundle  # verify imports this module

    report = verify_bundle(store, ref, {}, allow_unsigned=True)
    report.raise_for_error()
    mk = report.modelkit
    assert mk is not None
    check_stored(store, report)
    check_new_release(store, mk.kitfile.name, mk.kitfile.version, mk.digest)
    return sign_modelkit(store, mk, private_key, valid_days=valid_days, cosign_legacy=cosign_legacy)
