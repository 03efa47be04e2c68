"""GGUF bundles before any weights load: which files, then the pair's checks (the tokenizer gate, pairing) and
the memory it will take, all from the files' headers (`gguf_header.py`; the gate is `gguf_tokenizer_gate.py`).
"""

from __future__ import annotations

__all__ = ["bundle_format", "estimate_memory", "gguf_files", "parameters", "preflight"]

from collections.abc import Mapping
from pathlib import Path

from core.errors import BundleError
from runner.checks.gguf_header import read_header, short_repr
from runner.checks.gguf_tokenizer_gate import check_tokenizers
from runner.checks.pairing import PairingPolicy



def gguf_files(directory: Path) -> list[Path]:
    """The *.gguf files directly in a role's directory."""
    return sorted(p for p in Path(directory).iterdir() if p.is_file() and p.name.endswith(".gguf"))


def has_safetensors(directory: Path) -> bool:
    return any(p.name.endswith(".safetensors") for p in Path(directory).iterdir())


def bundle_format(dirs: Mapping[str, Path]) -> str:
    """"gguf" when target and draft each hold one GGUF file, "safetensors" when neither holds any;
    a pair that mixes the two, or a role with several GGUF files, is refused (exit 6)."""
    kinds = {}
    for role in (r for r in ("target", "draft") if r in dirs):  # no draft: a bundle for draft-free speculation
        files = gguf_files(dirs[role])
        if len(files) > 1:
            raise BundleError("invalid-bundle", f"the {role} holds {len(files)} GGUF files; a role holds one")
        if files and has_safetensors(dirs[role]):
            raise BundleError("invalid-bundle", f"the {role} holds both a GGUF and safetensors weights")
        kinds[role] = "gguf" if files else "safetensors"
    if kinds["target"] != kinds.get("draft", kinds["target"]):
        raise BundleError("invalid-bundle", f"the target is {kinds['target']} and the draft {kinds['draft']}: "
                          "a bundle pairs two GGUF files or two safetensors models, not one of each")
    return kinds["target"]


def parameters(header: Mapping) -> int:
    count = 0
    for shape, _ in header["tensors"].values():
        n = 1
        for d in shape:
            n *= d
        count += n
    return count


def check_pairing(headers: Mapping[str, Mapping], params: Mapping) -> dict:
    """Same `general.architecture` (unless allow_cross_family), the same vocabulary size (the output
    tensor's rows), and the target at least min_size_ratio times the draft's parameters."""
    policy = PairingPolicy.from_params(params)
    arch = {role: headers[role]["metadata"].get("general.architecture", "unknown") for role in ("target", "draft")}
    if arch["target"] != arch["draft"] and not policy.allow_cross_family:
        raise BundleError("model-family", f"target is {arch['target']}, draft is {arch['draft']}: different model "
                          "families (set speculative.allow_cross_family in the Kitfile to allow)")
    vocab = {role: (headers[role]["tensors"].get("token_embd.weight", ((0,), 0))[0] or (0,))[-1] for role in arch}
    if vocab["target"] != vocab["draft"]:
        raise BundleError("model-family", f"target embeds {vocab['target']} tokens, draft {vocab['draft']}")
    counts = {role: parameters(headers[role]) for role in arch}
    ratio = counts["target"] / max(counts["draft"], 1)
    min_ratio = policy.min_size_ratio
    if ratio < min_ratio:
        raise BundleError("size-ratio", f"target has {counts['target']:,} parameters, draft {counts['draft']:,}: "
                          f"ratio {ratio:.2f} < {min_ratio:g} (speculative.min_size_ratio)")
    return {"target_family": arch["target"], "draft_family": arch["draft"], "target_parameters": counts["target"],
            "draft_parameters": counts["draft"], "size_ratio": ratio}


def preflight(dirs: Mapping[str, Path], params: Mapping) -> dict:
    """The checks of a GGUF pair before any weights load (what runner.run.preflight is for safetensors): one
    file per role, the tokenizer gate, pairing. Returns {"files", "headers", "fingerprint", "pairing"};
    raises BundleError on the first failure."""
    files = {role: gguf_files(dirs[role])[0] for role in ("target", "draft") if role in dirs}
    headers = {role: read_header(path) for role, path in files.items()}
    # the tokenizer gate before pairing, as for safetensors
    fingerprint_ = check_tokenizers(files, headers)
    pairing = check_pairing(headers, params) if "draft" in files else {
        "target_family": headers["target"]["metadata"].get("general.architecture", "unknown"), "draft_family": None,
        "target_parameters": parameters(headers["target"]), "draft_parameters": 0, "size_ratio": None}
    return {"files": files, "headers": headers, "fingerprint": fingerprint_, "pairing": pairing}


def _count(metadata: Mapping, key: str, default: int) -> int:
    """A size from the metadata (a layer or head count): a non-negative integer, else the file is refused."""
    value = metadata.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BundleError("invalid-bundle", f"GGUF metadata {key} is {short_repr(value)}, not a count")
    return value


def estimate_memory(headers: Mapping[str, Mapping], n_ctx: int) -> dict:
    """Weights (tensor bytes as stored) plus each model's f16 KV cache for n_ctx positions."""
    weights = sum(b for h in headers.values() for _, b in h["tensors"].values())
    kv = 0
    for h in headers.values():
        m = h["metadata"]
        arch = m.get("general.architecture", "llama")
        layers, embd = _count(m, f"{arch}.block_count", 0), _count(m, f"{arch}.embedding_length", 0)
        heads, kv_heads = _count(m, f"{arch}.attention.head_count", 1), _count(m, f"{arch}.attention.head_count_kv", 0)
        kv_width = embd // max(heads, 1) * (kv_heads or heads)
        kv += 2 * layers * n_ctx * kv_width * 2  # K and V, f16
    overhead = 64 * 2**20  # llama.cpp's compute buffers and the binding's (measured order of magnitude)
    total = weights + kv + overhead
    return {"weights_bytes": weights, "kv_cache_bytes": kv, "activation_bytes": overhead, "loader_bytes": 0,
            "total_bytes": total, "predicted_peak_bytes": total}
