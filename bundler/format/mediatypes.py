"""Every media type and artifact type the bundle format writes or reads, each written once (as KitOps keeps
its own in pkg/lib/constants/mediaType.go)."""

from __future__ import annotations

__all__ = [
    "ATTESTATION_PREDICATES", "CYCLONEDX_BOM", "DSSE_ENVELOPE", "IN_TOTO", "PREDICATE_TYPE_ANNOTATION", "SLSA_PROVENANCE_V1",
    "MODELKIT_ARTIFACT", "MODELKIT_CONFIG", "MODELPACK_ARTIFACT", "MODELPACK_CONFIG", "MODELPACK_KINDS", "OCI_EMPTY",
    "OCI_IMAGE_CONFIG", "OCI_INDEX", "OCI_MANIFEST", "RUN_RECORD", "SIGSTORE_BUNDLE", "SIGSTORE_BUNDLE_TYPES", "SIMPLE_SIGNING",
    "layer_kind", "layer_media_type", "modelpack_layer", "modelpack_media_type",
]

# OCI image-spec: every manifest we write (bundle, signature, run record) and the lists of manifests (a
# registry's referrers answer, the referrers tag schema fallback).
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
# The config of an artifact that has none (signatures, run records): the two-byte blob `{}`.
OCI_EMPTY = "application/vnd.oci.empty.v1+json"
# The config of cosign's legacy `sha256-<hex>.sig` image, which is an ordinary image.
OCI_IMAGE_CONFIG = "application/vnd.oci.image.config.v1+json"

# KitOps ModelKit: the manifest's artifactType, its config (the Kitfile as JSON), and one uncompressed tar
# layer type per kind of Kitfile entry.
MODELKIT_ARTIFACT = "application/vnd.kitops.modelkit.manifest.v1+json"
MODELKIT_CONFIG = "application/vnd.kitops.modelkit.config.v1+json"
LAYER_KINDS = ("model", "modelpart", "code", "dataset", "docs")

# CNCF ModelPack (modelpack/model-spec, specs-go/v1/mediatype.go): the manifest's artifactType, its config
# (descriptor, config, modelfs), and layers of one kind each, a raw file or an uncompressed tar. The spec's
# +gzip and +zstd forms are not read: a compressed layer's digest does not pin the bytes a runtime mounts.
MODELPACK_ARTIFACT = "application/vnd.cncf.model.manifest.v1+json"
MODELPACK_CONFIG = "application/vnd.cncf.model.config.v1+json"
MODELPACK_KINDS = ("weight", "weight.config", "doc", "code", "dataset")
MODELPACK_FORMS = ("raw", "tar")

# A Sigstore bundle v0.3: the layer of a signature artifact and that artifact's artifactType, for our
# model-signing signature and the cosign-style one alike.
SIGSTORE_BUNDLE = "application/vnd.dev.sigstore.bundle.v0.3+json"
# The same version's older spelling, which cosign and sigstore-go still read (so do we; we write the first).
SIGSTORE_BUNDLE_TYPES = (SIGSTORE_BUNDLE, "application/vnd.dev.sigstore.bundle+json;version=0.3")
# A layer of cosign's legacy signature image: the simple-signing payload, its signature in an annotation.
SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"

# The DSSE payloadType of an in-toto Statement (every envelope we sign or verify).
IN_TOTO = "application/vnd.in-toto+json"
# A run record artifact: its artifactType is the in-toto type (CONTRACT.md section 5), its one layer a bare
# DSSE envelope.
RUN_RECORD = IN_TOTO
DSSE_ENVELOPE = "application/vnd.dsse.envelope.v1+json"

# The standard attestations (bundler.trust.attest): in-toto predicate types that policy engines know. Each is
# stored as cosign 3 stores an attestation, a Sigstore bundle referrer (artifactType SIGSTORE_BUNDLE) whose
# manifest names the predicate type in PREDICATE_TYPE_ANNOTATION: that annotation tells them from signatures.
CYCLONEDX_BOM = "https://cyclonedx.org/bom"
SLSA_PROVENANCE_V1 = "https://slsa.dev/provenance/v1"
ATTESTATION_PREDICATES = (CYCLONEDX_BOM, SLSA_PROVENANCE_V1)
PREDICATE_TYPE_ANNOTATION = "dev.sigstore.bundle.predicateType"


def layer_media_type(kind: str) -> str:
    """The media type of an uncompressed ModelKit layer of `kind` (one of LAYER_KINDS)."""
    return f"application/vnd.kitops.modelkit.{kind}.v1.tar"


def layer_kind(media_type: str) -> str | None:
    """The kind word of a ModelKit layer media type, or None if it is not one (compressed layers included)."""
    for kind in LAYER_KINDS:
        if media_type == layer_media_type(kind):
            return kind
    return None


def modelpack_media_type(kind: str, form: str) -> str:
    """The media type of a ModelPack layer of `kind` (one of MODELPACK_KINDS) in `form` (raw or tar)."""
    return f"application/vnd.cncf.model.{kind}.v1.{form}"


def modelpack_layer(media_type: str) -> tuple[str, str] | None:
    """(kind, form) of a ModelPack layer media type we read, or None (compressed layers included)."""
    for kind in MODELPACK_KINDS:
        for form in MODELPACK_FORMS:
            if media_type == modelpack_media_type(kind, form):
                return kind, form
    return None
