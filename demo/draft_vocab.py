"""The draft's output vocabulary: the token ids the target actually writes, most frequent first.

    .venv/bin/python demo/draft_vocab.py [--size 4096] [--out demo/draft]

Counts, over the teacher data in demo/work/data (never the held-out prompts), the target's greedy
tokens and the input tokens, breaks ties by id (BPE ids run roughly from frequent to rare), adds every
special token, and writes OUT/draft_vocab.json = {"ids": [...sorted...], "size", "source"}. The bundle
names it in `speculative.draft_vocab`; the draft then scores only these ids (runner/models/draft_vocab.py).
"""

from __future__ import annotations

import argparse
import glob
import json
from pathlib import Path

import torch
from safetensors.torch import load_file

DEMO = Path(__file__).resolve().parent
DATA = DEMO / "work" / "data"
TOKENIZER = DEMO / "work" / "tokenizer" / "tokenizer.json"
VOCAB = 49152


def draft_vocab(size: int) -> list[int]:
    """The `size` most used ids in the teacher data, plus the special tokens."""
    counts = torch.zeros(VOCAB, dtype=torch.float64)
    shards = sorted(glob.glob(str(DATA / "*.safetensors")))
    if not shards:
        raise SystemExit(f"no teacher data in {DATA}: run demo/distill.py gen first")
    for shard in shards:
        data = load_file(shard)
        counts += torch.bincount(data["topk_idx"][:, 0].long(), minlength=VOCAB).double()
        counts += torch.bincount(data["tokens"].long(), minlength=VOCAB).double()
    special = [t["id"] for t in json.loads(TOKENIZER.read_text())["added_tokens"] if t.get("special")]
    order = (counts * VOCAB - torch.arange(VOCAB, dtype=torch.float64)).argsort(descending=True).tolist()
    chosen = list(dict.fromkeys(special + order))[:size]
    return sorted(chosen)


def write_draft_vocab(out: Path, size: int) -> Path:
    path = out / "draft_vocab.json"
    ids = draft_vocab(size)
    path.write_text(json.dumps({"ids": ids, "size": len(ids), "source": "teacher greedy + input tokens of demo/work/data, most frequent"}, separators=(",", ":")))
    return path


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--out", default=str(DEMO / "draft"))
    args = ap.parse_args()
    print(write_draft_vocab(Path(args.out), args.size))
