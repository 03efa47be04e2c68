"""Export the best distilled draft checkpoint to demo/draft/ (a Hugging Face directory, bf16 safetensors).

    .venv/bin/python demo/export_draft.py [--ckpt best.pt] [--dtype bfloat16]

Writes demo/draft/config.json, generation_config.json and model.safetensors (< 60 MB), and prints the
checkpoint's training state (step, minutes, held-out acceptance). Quick: safe to run while training runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, GenerationConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from draft_vocab import write_draft_vocab  # noqa: E402

DEMO = Path(__file__).resolve().parent
WORK = DEMO / "work"
INIT_DIR = WORK / "init"
CKPT_DIR = WORK / "ckpt"
TARGET_DIR = WORK / "target"
DRAFT_DIR = DEMO / "draft"


def main() -> int:
    """Load the checkpoint into the draft architecture and save it in the chosen dtype."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default="best.pt", help="checkpoint file in demo/work/ckpt/")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--out", default=str(DRAFT_DIR))
    ap.add_argument("--vocab-size", type=int, default=4096, help="ids in draft_vocab.json (the draft head's vocabulary)")
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("DEMO_THREADS", "1")))
    ck = torch.load(CKPT_DIR / args.ckpt, weights_only=False, map_location="cpu")
    model = AutoModelForCausalLM.from_pretrained(str(INIT_DIR), dtype=torch.float32)
    model.load_state_dict(ck["model"])
    model.to(getattr(torch, args.dtype))
    model.config.dtype = getattr(torch, args.dtype)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".draft-"))
    model.save_pretrained(str(tmp), safe_serialization=True)
    GenerationConfig.from_pretrained(str(TARGET_DIR if TARGET_DIR.exists() else INIT_DIR)).save_pretrained(str(tmp))
    write_draft_vocab(tmp, args.vocab_size)
    tmp.chmod(0o755)
    for p in tmp.iterdir():
        p.chmod(0o644)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    size = sum(p.stat().st_size for p in out.iterdir())
    print(json.dumps({"out": str(out), "bytes": size, "dtype": args.dtype, **ck["state"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
