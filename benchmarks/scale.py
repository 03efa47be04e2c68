"""Real-size loading: `bundle run` against transformers' own loading on a 1B-class target.

Builds (under --work, not committed) a random-weight target of Llama-3.2-1B's shape (hidden 2048, 16 layers,
32 heads, 8 KV heads, intermediate 8192, tied embeddings) over a 49152-token byte-level BPE tokenizer trained
here on synthetic words (the demo tokenizer's size), bf16, sharded in 1 GB files with an index; a 2-layer
draft (hidden 1024); packs and signs them. Then, each in a fresh process, from page cache (one untimed warm-up
read of every file), best of --rounds:

  transformers   `AutoModelForCausalLM.from_pretrained(target dir, dtype=bfloat16)` + one greedy token
  bundle_run     `bundle run REF --max-new-tokens 1 --json` (verify, extract, gate, load both, one token)
  bundle_verify  `bundle verify REF` alone

Each is measured as the process's wall time from start to exit (imports included, as a user waits for them)
and its peak resident memory (os.wait4's ru_maxrss); the first token of both must be the same. Prints a table and, last, one JSON line with the
acceptance checks of issue 16:
  peak_rss_ratio  = bundle_run / transformers                      (<= 1.25)
  ttft_budget_s   = bundle_verify + 1.2 x transformers             (bundle_run <= it)

    .venv/bin/python benchmarks/scale.py [--work DIR] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

REF = "scale-spec:1.0.0"
VOCAB = 49152
TARGET = dict(hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=8192)
DRAFT = dict(hidden=1024, layers=2, heads=16, kv_heads=4, intermediate=4096)
SHARD_BYTES = 1 << 30
PROMPT = "Write one sentence about the sea."


def _tokenizer(directory: Path) -> None:
    """A 49152-token byte-level BPE trained on random words (deterministic), with the test chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from tests.tinymodels import SPECIAL_TOKENS, write_tokenizer

    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(3, 9))) for _ in range(400_000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator((" ".join(words[i : i + 100]) for i in range(0, len(words), 100)), trainer)
    write_tokenizer(directory, tok)


def _model(directory: Path, shape: dict, seed: int) -> int:
    """Random bf16 weights of a Llama of `shape` in <= 1 GB safetensors shards (+ index when sharded)."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.tinymodels import BOS, EOS, PAD, SPECIAL_TOKENS

    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=shape["hidden"], intermediate_size=shape["intermediate"],
        num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
        max_position_embeddings=8192, tie_word_embeddings=True, rope_theta=500000.0, dtype="bfloat16",
        bos_token_id=SPECIAL_TOKENS.index(BOS), eos_token_id=SPECIAL_TOKENS.index(EOS), pad_token_id=SPECIAL_TOKENS.index(PAD),
    )
    with torch.device("meta"):
        names = {k: v.shape for k, v in LlamaForCausalLM(config).state_dict().items() if k != "lm_head.weight"}
    directory.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(directory)
    gen = torch.Generator().manual_seed(seed)
    shards: list[dict] = [{}]
    size = 0
    for name, shp in names.items():
        t = (torch.ones(shp) if name.endswith("norm.weight") else torch.randn(shp, generator=gen) * 0.02).to(torch.bfloat16)
        if size and size + t.numel() * 2 > SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += t.numel() * 2
    weight_map, total = {}, 0
    for i, tensors in enumerate(shards):
        fname = "model.safetensors" if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(tensors, str(directory / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in tensors})
        total += sum(t.numel() * 2 for t in tensors.values())
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return total


def build(work: Path) -> dict:
    """The context, the signed bundle in a store, and the key; reused when already built."""
    from bundler.trust.keys import generate_keypair
    from tests.tinymodels import write_kitfile

    ctx, store = work / "ctx", work / "store"
    done = work / "built.json"
    if done.is_file():
        return json.loads(done.read_text())
    _tokenizer(ctx / "tokenizer")
    target_bytes = _model(ctx / "target", TARGET, 0)
    draft_bytes = _model(ctx / "draft", DRAFT, 1)
    write_kitfile(ctx, name="scale-spec", speculative={"draft_tokens": 4, "min_acceptance": 0.0})
    kit = (ctx / "Kitfile").read_text().replace("    speculative:", "    dtype: bfloat16\n    speculative:")
    (ctx / "Kitfile").write_text(kit)
    private, public = generate_keypair(work / "keys")
    subprocess.run([sys.executable, "-m", "bundler", "pack", str(ctx), "-t", REF, "--key", str(private), "--store", str(store)],
                   check=True, stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
    info = {"ctx": str(ctx), "store": str(store), "public": str(public), "target_bytes": target_bytes, "draft_bytes": draft_bytes}
    done.write_text(json.dumps(info))
    return info


HF_SCRIPT = """
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[2])
ids = tok.apply_chat_template([{"role": "user", "content": sys.argv[3]}], add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16).eval()
with torch.no_grad():
    out = model.generate(ids, max_new_tokens=1, do_sample=False)
print(out[0, -1].item())
"""


def _run_measured(cmd: list[str]) -> tuple[float, int, str]:
    """Like _measure, with the peak RSS of this very child (wait4 before anything else reaps it)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
    start = time.perf_counter()
    with open(os.devnull, "wb") as devnull, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=devnull, env=env) as proc:
        assert proc.stdout is not None
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:5])} failed with exit {proc.returncode}")
    return wall, usage.ru_maxrss * 1024, out.decode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/specbundle-scale"))
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    info = build(args.work)
    print(f"built in {time.perf_counter() - t:.0f} s: target {info['target_bytes'] / 2**30:.2f} GiB, draft {info['draft_bytes'] / 2**30:.2f} GiB")
    for path in Path(info["store"]).rglob("*"):  # warm the page cache
        if path.is_file():
            with open(path, "rb") as f:
                while f.read(1 << 24):
                    pass
    py, store, key, ctx = sys.executable, info["store"], info["public"], Path(info["ctx"])
    commands = {
        "transformers": [py, "-c", HF_SCRIPT, str(ctx / "target"), str(ctx / "tokenizer"), PROMPT],
        "bundle_run": [py, "-m", "bundler", "run", REF, "--prompt", PROMPT, "--max-new-tokens", "1", "--json", "--key", key, "--store", store],
        "bundle_verify": [py, "-m", "bundler", "verify", REF, "--key", key, "--store", store],
    }
    best: dict[str, dict] = {}
    for r in range(args.rounds):
        for name, cmd in commands.items():
            wall, rss, out = _run_measured(cmd)
            row = {"wall_s": wall, "peak_rss_bytes": rss}
            if name == "transformers":
                row["token"] = int(out.split()[-1])
            if name == "bundle_run":
                report = json.loads(out)
                row["timings"] = report.get("timings")
                row["memory"] = report.get("memory")
                row["forward"] = report.get("forward")
                row["token"] = report["tokens"][0]
            print(f"round {r + 1} {name:14s} {wall:7.2f} s  peak RSS {rss / 2**30:6.2f} GiB", flush=True)
            if name not in best or wall < best[name]["wall_s"]:
                best[name] = {**row, "peak_rss_bytes": min(rss, best.get(name, row)["peak_rss_bytes"])}
    hf, run, verify = best["transformers"], best["bundle_run"], best["bundle_verify"]
    result = {
        "target_bytes": info["target_bytes"],
        "draft_bytes": info["draft_bytes"],
        "transformers": hf,
        "bundle_run": run,
        "bundle_verify": verify,
        "peak_rss_ratio": run["peak_rss_bytes"] / hf["peak_rss_bytes"],
        "ttft_budget_s": verify["wall_s"] + 1.2 * hf["wall_s"],
        "rss_ok": run["peak_rss_bytes"] <= 1.25 * hf["peak_rss_bytes"],
        "ttft_ok": run["wall_s"] <= verify["wall_s"] + 1.2 * hf["wall_s"],
        "same_token": hf["token"] == run["token"],  # the first greedy token, bf16: transformers' and ours
        "preflight_over_measured": (run["memory"] or {}).get("predicted_peak_bytes", 0) / run["peak_rss_bytes"],
        "load": os.getloadavg(),
    }
    print(f"peak RSS: bundle run {run['peak_rss_bytes'] / 2**30:.2f} GiB = {result['peak_rss_ratio']:.2f}x transformers (<= 1.25: {result['rss_ok']})")
    print(f"to first token: bundle run {run['wall_s']:.2f} s, budget verify {verify['wall_s']:.2f} + 1.2 x transformers {hf['wall_s']:.2f} = {result['ttft_budget_s']:.2f} s ({result['ttft_ok']})")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
