"""Writing a bundle's standard attestations (bundler.trust.attestation): the SBOM and the SLSA provenance, signed
with the bundle's key. `bundle pack --key` writes them from the context it packed; `bundle attest REF --key`
writes them for a bundle already in the store (an older one), after it verifies with that key's public half.
"""

from __future__ import annotations

__all__ = ["Written", "attest_context", "attest_stored", "read_bench"]

import datetime as dt
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bundler.format.kitfile import MODEL_ROLES
from bundler.store.layout import Store
from bundler.store.modelkit import ModelKit, load_modelkit
from bundler.store.refs import Ref
from bundler.trust import attestation, cosign, dsse, keys, provenance, sbom
from bundler.trust.extract import extract_leaving_in_blobs, make_writable
from bundler.trust.verify import verify_bundle
from core.errors import BundleError

PART_ROLES = ("target", "draft", "tokenizer")


@dataclass(frozen=True)
class Written:
    kind: str  # sbom | provenance
    digest: str  # the attestation artifact's manifest digest
    statement: dict[str, Any]


def _write(store: Store, mk: ModelKit, files: Mapping[str, str], facts: Mapping[str, sbom.ModelFacts], private_key: keys.PrivateKey,
           written_by: str, started: dt.datetime | None, finished: dt.datetime | None, bench: Mapping[str, Any] | None = None) -> list[Written]:
    layers = {spec.role: (spec.path, desc.digest) for spec, desc in mk.layers if spec.role in PART_ROLES}
    predicates = {
        "sbom": sbom.build_bom(mk.kitfile, mk.digest, layers, files, facts, sbom.measured_metrics(bench) if bench else None),
        "provenance": provenance.build_provenance(mk.kitfile.data, str(mk.ref), files, written_by, started, finished),
    }
    created = finished or dt.datetime.now(dt.timezone.utc)
    hint = cosign.cosign_hint(private_key)
    out = []
    for kind, predicate in predicates.items():
        statement = dsse.statement(mk.kitfile.name, mk.digest.split(":", 1)[1], attestation.KINDS[kind], predicate)
        bundle = attestation.sign_statement(statement, private_key)
        desc = attestation.store_attestation(store, mk.manifest_desc, attestation.KINDS[kind], bundle, created, replace_hint=hint)
        out.append(Written(kind, desc.digest, statement))
    return out


def attest_context(store: Store, ref: Ref, context: Path, files: Mapping[str, str], private_key: keys.PrivateKey,
                   started: dt.datetime) -> list[Written]:
    """After `pack --key`: the attestations of the bundle `ref` names, read from the context it was packed from
    (`files`: every packed file's path -> sha256)."""
    mk = load_modelkit(store, ref)
    facts = {spec.role: sbom.model_facts(context / spec.path) for spec, _ in mk.layers if spec.role in MODEL_ROLES}
    return _write(store, mk, files, facts, private_key, "bundle pack", started, dt.datetime.now(dt.timezone.utc))


def read_bench(path: Path) -> dict[str, Any]:
    """A `bundle bench --json` report from a file, checked against schemas/bench-report.schema.json (usage error)."""
    from bundler.format import boundedjson
    from bundler.format.schemacheck import schema_problem

    report = boundedjson.read_json(path, "bench report", code="usage")
    problem = schema_problem("bench-report.schema.json", report)
    if problem:
        raise BundleError("usage", f"{path} is not a `bundle bench --json` report: {problem}")
    return report


def attest_stored(store: Store, ref: Ref, private_key: keys.PrivateKey, bench: Mapping[str, Any] | None = None) -> list[Written]:
    """`bundle attest`: verify the bundle with the key's public half (its signature must be this key's), read
    the model headers from a checkout whose weights stay in their blobs, then write the attestations; `bench`
    (read_bench) puts what `bundle bench` measured into the SBOM's model card."""
    from runner.checks.modelinfo import FileRange  # torch-free; imported here to keep `bundle --help` light

    public = private_key.public_key()
    report = verify_bundle(store, ref, {keys.key_id(public): public}, record=False)
    report.raise_for_error()
    assert report.modelkit is not None and report.claims is not None
    mk = report.modelkit
    tmp = Path(tempfile.mkdtemp(prefix="specbundle-attest-", dir=store.private_dir("tmp")))
    try:
        root = tmp / "bundle"
        spans = extract_leaving_in_blobs(store, report, root, leave=lambda name: name.endswith(".safetensors"))
        ranges = {root / name: FileRange(span.blob, span.offset, span.size) for name, span in spans.items()}
        facts = {spec.role: sbom.model_facts(root / spec.path, ranges) for spec, _ in mk.layers if spec.role in MODEL_ROLES}
    finally:
        make_writable(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
    return _write(store, mk, report.claims.files, facts, private_key, "bundle attest", None, None, bench)
