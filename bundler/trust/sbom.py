"""The bundle's bill of materials: a CycloneDX 1.6 ML-BOM built with cyclonedx-python-lib.

  metadata.component     the bundle (name, version, purl pkg:oci/NAME@<manifest digest>), the Kitfile's
                         speculative settings (tune's choice where `tune --write` put one) as a property
  components             target and draft as `machine-learning-model` components, the tokenizer as `data`:
                         each with its layer's sha256, its licence (the entry's, else the model's, else the
                         package's), its files (type `file`, sha256 each), and for models the parameter count,
                         the weights' dtype or GGUF quantization, and a `modelCard` naming the architecture
  dependencies           the bundle on its parts, the draft on the target and the tokenizer, the target on
                         the tokenizer

What is read comes from config.json, the safetensors headers and the GGUF header (runner/checks: no weight
is loaded); what is not there is left out, never guessed. The library has no model for `modelCard`, so it is
added to the serialized JSON, and the whole document is checked with the library's strict 1.6 validator
before it is signed. cyclonedx is imported only here, when a BOM is built.
"""

from __future__ import annotations

__all__ = ["ModelFacts", "PREDICATE_TYPE", "build_bom", "measured_metrics", "model_facts", "validate_bom"]

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bundler.format.kitfile import Kitfile
from bundler.format.mediatypes import CYCLONEDX_BOM
from core.errors import BundleError

PREDICATE_TYPE = CYCLONEDX_BOM
SPEC_VERSION = "1.6"
MAX_VERSION = 1024  # CycloneDX 1.6's `version`: maxLength


@dataclass(frozen=True)
class ModelFacts:
    """What the headers of one model role say (each None where they do not say it)."""

    format: str  # safetensors | gguf
    parameters: int | None = None
    architecture: str | None = None  # config.json's architectures[0]
    family: str | None = None  # config.json's model_type, GGUF's general.architecture
    dtypes: tuple[str, ...] = ()  # the tensors' storage types (safetensors: F32, BF16, ...)
    quantization: str | None = None  # config.json's quantization_config.quant_method, GGUF's general.file_type
    extra: dict[str, str] = field(default_factory=dict)


def model_facts(model_dir: Path, ranges: Mapping[Path, Any] | None = None) -> ModelFacts:
    """The facts of a model directory: a GGUF file's header, else config.json and the safetensors headers
    (`ranges`: weight files left in their layer blobs, as runner.checks.modelinfo takes them)."""
    from runner.checks import gguf_header, gguf_model, modelinfo  # torch-free readers of headers

    ggufs = gguf_model.gguf_files(model_dir)
    if ggufs:
        header = gguf_header.read_header(ggufs[0])
        meta = header["metadata"]
        return ModelFacts("gguf", gguf_model.parameters(header), None, _str(meta.get("general.architecture")),
                          quantization=_gguf_file_type(meta.get("general.file_type")))
    config = modelinfo.read_raw_config(model_dir)
    dtypes = set()
    for path, where in modelinfo.safetensors_files(model_dir, ranges).items():
        dtypes.update(str(t.get("dtype")) for t in modelinfo.read_safetensors_header(path, where).values() if isinstance(t, dict))
    archs = config.get("architectures")
    quant = config.get("quantization_config")
    return ModelFacts(
        "safetensors", modelinfo.count_parameters(model_dir, ranges), _str(archs[0]) if isinstance(archs, list) and archs else None,
        _str(config.get("model_type")), tuple(sorted(dtypes)),
        _str(quant.get("quant_method")) if isinstance(quant, dict) else None,
        {"config_dtype": v} if (v := _str(config.get("torch_dtype") or config.get("dtype"))) else {},
    )


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _gguf_file_type(value: Any) -> str | None:
    """GGUF's general.file_type as llama.cpp names it (MOSTLY_Q4_1, ...)."""
    if not isinstance(value, int):
        return None
    from gguf.constants import LlamaFileType

    try:
        return LlamaFileType(value).name
    except ValueError:
        return f"file_type {value}"


# ---------------------------------------------------------------- the document


def _licence(kitfile: Kitfile, role: str) -> str | None:
    """The entry's licence, else the model's (for the model entry and its parts), else the package's."""
    data = kitfile.data
    model = data.get("model") or {}
    entry = None
    if role == "target":
        entry = model
    else:
        entry = next((p for p in model.get("parts") or [] if p.get("type") == role), None)
    for holder in (entry, model, data.get("package")):
        if isinstance(holder, dict) and _str(holder.get("license")):
            return holder["license"]
    return None


def _entry_name(kitfile: Kitfile, role: str) -> str:
    model = kitfile.data.get("model") or {}
    if role == "target":
        return _str(model.get("name")) or "target"
    part = next((p for p in model.get("parts") or [] if p.get("type") == role), {})
    return _str(part.get("name")) or role


def _component(kitfile: Kitfile, role: str, path: str, layer_digest: str, files: Mapping[str, str], facts: ModelFacts | None) -> Any:
    from cyclonedx.contrib.license.factories import LicenseFactory
    from cyclonedx.model import HashAlgorithm, HashType, Property
    from cyclonedx.model.component import Component, ComponentType

    def sha256(hex_digest: str) -> list[Any]:
        return [HashType(alg=HashAlgorithm.SHA_256, content=hex_digest)]

    licence = _licence(kitfile, role)
    props = {"specbundle:role": role, "specbundle:path": path}
    if facts is not None:
        props["specbundle:format"] = facts.format
        if facts.parameters is not None:
            props["specbundle:parameters"] = str(facts.parameters)
        if facts.dtypes:
            props["specbundle:dtype"] = ",".join(facts.dtypes)
        if facts.quantization:
            props["specbundle:quantization"] = facts.quantization
        props.update({f"specbundle:{k}": v for k, v in facts.extra.items()})
    component = Component(
        type=ComponentType.MACHINE_LEARNING_MODEL if facts is not None else ComponentType.DATA,
        name=_entry_name(kitfile, role), bom_ref=role, hashes=sha256(layer_digest.split(":", 1)[1]),
        licenses=[LicenseFactory().make_from_string(licence)] if licence else None,
        properties=[Property(name=k, value=v) for k, v in props.items()],
        description=f"the {role} of {kitfile.name} {kitfile.version}; its hash is its layer's (a kit-style tar)",
    )
    for name, digest in sorted(files.items()):
        if name == path or name.startswith(path + "/"):
            component.components.add(Component(type=ComponentType.FILE, name=name, bom_ref=f"{role}:{name}", hashes=sha256(digest)))
    return component


def _model_card(facts: ModelFacts) -> dict[str, Any]:
    params: dict[str, Any] = {"task": "text-generation"}
    if facts.family:
        params["architectureFamily"] = facts.family
    if facts.architecture:
        params["modelArchitecture"] = facts.architecture
    return {"modelParameters": params}


def measured_metrics(bench: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A `bundle bench --json` report (schemas/bench-report.schema.json) as CycloneDX performance metrics: the
    acceptance rate and the speed-ups it measured, each as the report gives it; nothing it lacks."""
    prompts = bench.get("per_prompt")
    where = f"bundle bench, {len(prompts)} prompts" if isinstance(prompts, list) else "bundle bench"
    names = {"acceptance_rate": "acceptance rate (accepted / drafted tokens)",
             "speedup_vs_target": "speed-up over the target alone (tokens/s)",
             "speedup_vs_runner_plain": "speed-up over plain decoding by the same runner (tokens/s)",
             "mean_accepted_length": "mean accepted length per target pass"}
    return [{"type": label, "value": str(bench[key]), "slice": where} for key, label in names.items()
            if isinstance(bench.get(key), (int, float)) and not isinstance(bench.get(key), bool)]


def build_bom(kitfile: Kitfile, manifest_digest: str, layers: Mapping[str, tuple[str, str]], files: Mapping[str, str],
              facts: Mapping[str, ModelFacts], measured: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The ML-BOM as JSON: `layers` role -> (path, layer digest) for target, draft (where there is one) and
    tokenizer; `files` every file's path -> sha256; `facts` role -> ModelFacts for the model roles; `measured`
    (measured_metrics) goes into the model card of the draft (the target's where there is no draft) as its
    quantitative analysis. Checked with the strict CycloneDX 1.6 validator (internal error if it does not pass)."""
    from packageurl import PackageURL

    from bundler import __version__
    from cyclonedx.model import HashAlgorithm, HashType, Property
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.output.json import JsonV1Dot6

    bom = Bom()
    bom.metadata.tools.components.add(Component(type=ComponentType.APPLICATION, name="specbundle", version=__version__))
    speculative = kitfile.parameters.get("speculative")
    props = {"specbundle:speculative": json.dumps(speculative, sort_keys=True)} if speculative else {}
    fits = len(kitfile.version) <= MAX_VERSION
    if not fits:  # a SemVer the Kitfile allows but CycloneDX's version field does not: kept whole as a property
        props["specbundle:version"] = kitfile.version
    bundle = Component(
        type=ComponentType.MACHINE_LEARNING_MODEL, name=kitfile.name, version=kitfile.version if fits else None, bom_ref="bundle",
        purl=PackageURL(type="oci", name=kitfile.name, version=manifest_digest),
        hashes=[HashType(alg=HashAlgorithm.SHA_256, content=manifest_digest.split(":", 1)[1])],
        description="a speculative-decoding bundle (KitOps ModelKit); its hash is its OCI manifest's",
        properties=[Property(name=k, value=v) for k, v in props.items()] or None,
    )
    bom.metadata.component = bundle
    parts = {role: _component(kitfile, role, path, digest, files, facts.get(role)) for role, (path, digest) in layers.items()}
    bom.components.update(parts.values())
    bom.register_dependency(bundle, list(parts.values()))
    if "tokenizer" in parts:
        for role in ("target", "draft"):
            if role in parts:
                bom.register_dependency(parts[role], [parts["tokenizer"]])
    if "draft" in parts and "target" in parts:
        bom.register_dependency(parts["draft"], [parts["target"]])
    document = json.loads(JsonV1Dot6(bom).output_as_string())
    measured_role = "draft" if "draft" in facts else "target"
    for item in document.get("components", []):
        role = item.get("bom-ref")
        if role in facts:
            item["modelCard"] = _model_card(facts[role])
            if measured and role == measured_role:
                item["modelCard"]["quantitativeAnalysis"] = {"performanceMetrics": measured}
    problem = validate_bom(document)
    if problem:
        raise BundleError("internal", f"the CycloneDX {SPEC_VERSION} BOM does not validate: {problem}")
    return document


def validate_bom(document: Mapping[str, Any]) -> str | None:
    """What the strict CycloneDX 1.6 JSON schema finds wrong with `document`, or None."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(document))
    return None if error is None else str(error)[:500]
