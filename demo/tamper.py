"""Flip one byte in the middle of a role's layer blob in a store (for the demo's refusal step)."""

from __future__ import annotations

import sys
from pathlib import Path

from bundler.store.modelkit import load_modelkit
from bundler.store.refs import parse_ref
from bundler.store.layout import Store


def main(store_dir: str, ref: str, role: str) -> None:
    store = Store(Path(store_dir))
    mk = load_modelkit(store, parse_ref(ref))
    desc = next(d for spec, d in mk.layers if spec.role == role)
    path = store.blob_path(desc.digest)
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    print(f"flipped one byte at offset {len(data) // 2} of the {role} layer {desc.digest[:19]}…")


if __name__ == "__main__":
    main(*sys.argv[1:4])
