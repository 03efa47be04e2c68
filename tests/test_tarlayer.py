"""Layer tars: byte-equal to what kit's Go writer produces, reproducible, and read back safely."""

from __future__ import annotations

import hashlib
import io
import os
import time
import stat
import subprocess
import tarfile
import tracemalloc
from pathlib import Path

import pytest

import goldentar
from core.errors import BundleError
from bundler.format.tarread import extract_layer, iter_layer
from bundler.format.tarwrite import encode_header, write_layer

GO_TAR = Path(__file__).parent / "data" / "go-tar"
SPLIT_PATH = "target/" + "d" * 60 + "/" + "e" * 50 + "/weights.bin"  # > 100 bytes: USTAR prefix + name
PAX_PATH = "target/" + "x" * 150 + "/" + "y" * 150 + "/z.txt"  # > 255 bytes, no split fits: PAX
UNICODE_PATH = "target/café.txt"  # non-ASCII: PAX

FILES = {
    "Kitfile": b"manifestVersion: 1.0.0\n",
    "README.md": b"# readme\n",
    "other/skip.txt": b"not in the target layer\n",
    "target/config.json": b'{"hidden_size": 8}\n',
    "target/run.sh": b"#!/bin/sh\necho hi\n",
    "target/a.txt": b"a\n",
    "target/a/inner.txt": b"inner\n",
    "target/sub/block.bin": bytes(range(256)) * 5,
    "target/sub/deeper/empty.bin": b"",
    SPLIT_PATH: b"split\n",
    PAX_PATH: b"pax\n",
    UNICODE_PATH: b"accent\n",
}
EXECUTABLE = "target/run.sh"


def make_context(root: Path, file_mode: int = 0o644, exec_mode: int = 0o755, dir_mode: int = 0o755, mtime: int | None = None) -> Path:
    """The test tree: nested dirs, an executable, an empty dir, long and non-ASCII names."""
    for rel, data in FILES.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        p.chmod(exec_mode if rel == EXECUTABLE else file_mode)
    (root / "target" / "emptydir").mkdir()
    for d in sorted((p for p in root.rglob("*") if p.is_dir()), reverse=True):
        d.chmod(dir_mode)
    if mtime is not None:
        for p in root.rglob("*"):
            os.utime(p, (mtime, mtime))
    return root


def layer_bytes(context: Path, path: str, **kw) -> bytes:
    out = io.BytesIO()
    write_layer(context, path, out, **kw)
    return out.getvalue()


def names_of(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
        return tf.getnames()


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under root: kind, permission bits and content."""
    snap: dict[str, tuple] = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        rel = p.relative_to(root).as_posix()
        if stat.S_ISDIR(st.st_mode):
            snap[rel] = ("dir", stat.S_IMODE(st.st_mode))
        else:
            snap[rel] = ("file" if stat.S_ISREG(st.st_mode) else "other", stat.S_IMODE(st.st_mode), p.read_bytes())
    return snap


@pytest.fixture
def ctx(tmp_path: Path) -> Path:
    return make_context(tmp_path / "ctx")


# ---------------------------------------------------------------------------------------------
# Go's encoding


def _octal(field: bytes) -> int:
    text = field.strip(b" \x00")
    return int(text, 8) if text else 0


def _cstr(field: bytes) -> str:
    return field.split(b"\x00", 1)[0].decode()


def reencode(data: bytes) -> bytes:
    """Read every header's fields from the raw bytes and write them again with encode_header."""
    out, pos, pax = b"", 0, {}
    while data[pos : pos + 512] != bytes(512):
        blk = data[pos : pos + 512]
        size, typeflag = _octal(blk[124:136]), blk[156:157]
        body = -(-size // 512) * 512
        if typeflag == b"x":  # Go's PAX record: its values apply to the next header
            records = data[pos + 512 : pos + 512 + size]
            while records:
                length = int(records.split(b" ", 1)[0])
                key, value = records[:length].split(b" ", 1)[1][:-1].split(b"=", 1)
                pax[key.decode()] = value.decode()
                records = records[length:]
            pos += 512 + body
            continue
        name = _cstr(blk[0:100])
        if _cstr(blk[345:500]):
            name = _cstr(blk[345:500]) + "/" + name
        name = pax.pop("path", name)
        header = encode_header(
            name,
            typeflag=typeflag,
            size=size,
            mode=_octal(blk[100:108]),
            uid=_octal(blk[108:116]),
            gid=_octal(blk[116:124]),
            mtime=_octal(blk[136:148]),
            uname=_cstr(blk[265:297]),
            gname=_cstr(blk[297:329]),
            linkname=_cstr(blk[157:257]),
        )
        body = 0 if typeflag in (b"1", b"2", b"5") else body
        out += header + data[pos + 512 : pos + 512 + body]
        pos += 512 + body
    return out + bytes(1024)


@pytest.mark.parametrize("name", ["file-and-dir.tar", "ustar.tar", "trailing-slash.tar", "writer.tar"])
def test_encode_header_reproduces_go_archive_tar_golden_files(name: str) -> None:
    data = (GO_TAR / name).read_bytes()
    assert reencode(data) == data


def test_size_over_8_gib_goes_into_a_pax_record_and_reads_back() -> None:
    header = encode_header("big.bin", typeflag=b"0", size=2**33, mode=0o644)
    assert header[0:21] == b"PaxHeaders.0/big.bin\x00"
    assert header[512:531] == b"19 size=8589934592\n"
    assert header[1024 + 124 : 1024 + 136] == b"00000000000\x00"  # Go writes 0 where the value does not fit
    member, _ = next(iter_layer(io.BytesIO(header), "big.bin"))
    assert (member.name, member.size) == ("big.bin", 2**33)


# ---------------------------------------------------------------------------------------------
# Writing layers


def test_layer_equals_an_independent_writer_byte_for_byte(ctx: Path) -> None:
    data = layer_bytes(ctx, "target/")
    assert data == goldentar.build_layer(ctx, "target")
    assert b"PaxHeaders.0" in data and b"caf.txt" in data  # PAX fallback exercised, non-ASCII dropped from the ustar name
    assert b"\x00target/" + b"d" * 60 + b"/" + b"e" * 50 + b"\x00" in data  # a prefix field holds the split path
    assert len(data) % 512 == 0 and data.endswith(bytes(1024)) and len(data) % 10240 != 0


def test_write_layer_returns_digest_size_and_files_in_archive_order(ctx: Path) -> None:
    out = io.BytesIO()
    seen: list[int] = []
    result = write_layer(ctx, "target", out, progress=seen.append)
    data = out.getvalue()
    assert result.digest == "sha256:" + hashlib.sha256(data).hexdigest()
    assert result.size == len(data) == sum(seen)
    expected = [n for n in names_of(data) if n in FILES]
    assert [f.path for f in result.files] == expected
    for f in result.files:
        assert (f.sha256, f.size) == (hashlib.sha256(FILES[f.path]).hexdigest(), len(FILES[f.path]))
        assert f.mode == (0o755 if f.path == EXECUTABLE else 0o644)


def test_entries_follow_kits_walk_order(ctx: Path) -> None:
    names = names_of(layer_bytes(ctx, "target"))
    assert names[0] == "target"
    # filepath.Walk: a directory's names sorted, each directory's tree right after its name.
    assert names.index("target/a") < names.index("target/a/inner.txt") < names.index("target/a.txt")
    assert names.index("target/sub") < names.index("target/sub/block.bin") < names.index("target/sub/deeper")


def test_layer_extracts_to_the_same_files_with_python_tarfile_and_gnu_tar(ctx: Path, tmp_path: Path) -> None:
    layer = tmp_path / "layer.tar"
    layer.write_bytes(layer_bytes(ctx, "target"))
    by_python, by_gnu = tmp_path / "py", tmp_path / "gnu"
    by_python.mkdir()
    by_gnu.mkdir()
    with tarfile.open(layer) as tf:
        tf.extractall(by_python, filter="tar")
    subprocess.run(["tar", "-xpf", str(layer), "-C", str(by_gnu)], check=True)  # -p: modes as stored, not umasked
    expected = {
        rel: (kind, 0o755 if kind == "dir" or rel == EXECUTABLE else 0o644, *rest)
        for rel, (kind, _mode, *rest) in snapshot(ctx).items()
        if rel == "target" or rel.startswith("target/")
    }
    assert snapshot(by_python) == expected
    assert snapshot(by_gnu) == expected


def test_digest_ignores_mtimes_permissions_and_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        first = make_context(tmp_path / "one", mtime=1_000_000_000)
        os.umask(0o077)
        second = make_context(tmp_path / "two", file_mode=0o600, exec_mode=0o700, dir_mode=0o700, mtime=1_700_000_123)
    finally:
        os.umask(old)
    for path in ("target", "README.md", "."):
        assert layer_bytes(first, path) == layer_bytes(second, path)


def test_parent_directories_come_first_and_siblings_stay_out(tmp_path: Path) -> None:
    for rel in ("models/target/w.bin", "models/other/x.bin", "models/notes.txt", "models/target/sub/y.bin"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x")
    names = names_of(layer_bytes(tmp_path, "models/target/"))
    assert names == ["models", "models/target", "models/target/sub", "models/target/sub/y.bin", "models/target/w.bin"]


def test_nested_layers_and_kitfiles_are_left_out(ctx: Path) -> None:
    (ctx / ".kitignore").write_text("*.tmp\n")
    (ctx / "target" / "Kitfile").write_text("kept: only the context root's Kitfile is kit's\n")
    names = names_of(layer_bytes(ctx, ".", exclude=["target/"]))
    assert names == ["README.md", "other", "other/skip.txt"]
    assert "target/Kitfile" in names_of(layer_bytes(ctx, "target"))


def test_a_file_entry_is_a_layer_of_one_file(ctx: Path) -> None:
    out = io.BytesIO()
    result = write_layer(ctx, "README.md", out)
    assert names_of(out.getvalue()) == ["README.md"]
    assert [(f.path, f.size, f.mode) for f in result.files] == [("README.md", len(FILES["README.md"]), 0o644)]


def test_symlink_is_refused_before_anything_is_written(ctx: Path) -> None:
    (ctx / "target" / "sub" / "link").symlink_to("../config.json")
    out = io.BytesIO()
    with pytest.raises(BundleError) as err:
        write_layer(ctx, "target", out)
    assert err.value.code == "invalid-bundle"
    assert "target/sub/link: symlinks are not packed" in err.value.message
    assert out.getvalue() == b""


def test_fifo_is_refused(ctx: Path) -> None:
    os.mkfifo(ctx / "target" / "pipe")
    with pytest.raises(BundleError) as err:
        write_layer(ctx, "target", io.BytesIO())
    assert err.value.code == "invalid-bundle" and "target/pipe" in err.value.message and "fifo" in err.value.message


def test_missing_layer_path_is_an_invalid_kitfile(ctx: Path) -> None:
    with pytest.raises(BundleError) as err:
        write_layer(ctx, "nowhere/", io.BytesIO())
    assert err.value.code == "invalid-kitfile"


class _Discard:
    """An output that keeps nothing, so memory measured is the writer's own."""

    def write(self, data: bytes) -> int:
        return len(data)


def test_a_forked_child_packs_after_its_parent_did(tmp_path: Path) -> None:
    """A child forked after an in-process pack (a fuzz campaign's workers) packs a file big enough to be hashed
    on the second thread: it finishes instead of waiting on the parent's executor, whose thread it lacks."""
    (tmp_path / "big").mkdir()
    with open(tmp_path / "big" / "weights.bin", "wb") as f:
        f.truncate(4 * 1024 * 1024)
    write_layer(tmp_path, "big", _Discard())  # type: ignore[arg-type]  # the parent's executor now exists
    pid = os.fork()
    if pid == 0:  # the child: exit 0 once the layer is written
        try:
            write_layer(tmp_path, "big", _Discard())  # type: ignore[arg-type]
        except BaseException:  # noqa: BLE001 - the child reports by its exit status only
            os._exit(1)
        os._exit(0)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        raise AssertionError("the forked child did not finish packing in 30 s")
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_50_mb_file_packs_with_flat_memory(tmp_path: Path) -> None:
    size = 50 * 1024 * 1024
    (tmp_path / "big").mkdir()
    with open(tmp_path / "big" / "weights.bin", "wb") as f:
        f.truncate(size)  # sparse: cheap to make, read back as zeros
    tracemalloc.start()
    try:
        result = write_layer(tmp_path, "big", _Discard())  # type: ignore[arg-type]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 1024 * 1024, f"peak {peak} bytes"
    assert result.files[0].sha256 == hashlib.sha256(bytes(size)).hexdigest()


# ---------------------------------------------------------------------------------------------
# Reading layers


def hostile(*members: tarfile.TarInfo | tuple[tarfile.TarInfo, bytes], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    """A tar built by Python's tarfile with whatever entries an attacker likes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for m in members:
            info, data = m if isinstance(m, tuple) else (m, b"")
            info.size = len(data) if info.type in (tarfile.REGTYPE, tarfile.AREGTYPE) else 0
            tf.addfile(info, io.BytesIO(data) if data else None)
    return buf.getvalue()


def info(name: str, type: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type, ti.linkname, ti.mode = type, linkname, 0o644
    return ti


def consume(data: bytes, layer: str) -> list[tuple[str, bytes | None]]:
    return [(m.name, r.read() if r else None) for m, r in iter_layer(io.BytesIO(data), layer)]


UNSAFE = {
    "absolute": (hostile(info("/target/evil")), "/target/evil"),
    "dotdot": (hostile(info("target/../../evil")), "target/../../evil"),
    "symlink": (hostile(info("target/link", tarfile.SYMTYPE, "/etc/passwd")), "is a symlink"),
    "hardlink": (hostile((info("target/a"), b"a"), info("target/hard", tarfile.LNKTYPE, "target/a")), "is a hardlink"),
    "char-device": (hostile(info("target/tty", tarfile.CHRTYPE)), "is a character device"),
    "block-device": (hostile(info("target/sda", tarfile.BLKTYPE)), "is a block device"),
    "fifo": (hostile(info("target/pipe", tarfile.FIFOTYPE)), "is a fifo"),
    "duplicate": (hostile((info("target/a"), b"1"), (info("target/a"), b"2")), "appears twice"),
    "outside-layer": (hostile(info("target", tarfile.DIRTYPE), (info("other/evil"), b"x")), "outside the layer path"),
    "pax-path-dotdot": (hostile((info("target/" + "x" * 120 + "/../../../evil"), b"x")), "has a '..' component"),
    "gnu-longname-dotdot": (hostile((info("target/" + "x" * 120 + "/../../../evil"), b"x"), fmt=tarfile.GNU_FORMAT), "has a '..' component"),
    "below-a-file": (hostile((info("target/a"), b"x"), (info("target/a/b"), b"y")), "lies below the file"),
}


@pytest.mark.parametrize("case", list(UNSAFE))
def test_iter_layer_refuses_unsafe_entries(case: str) -> None:
    data, words = UNSAFE[case]
    with pytest.raises(BundleError) as err:
        consume(data, "target/")
    assert err.value.code == "unsafe-archive"
    assert err.value.message.startswith("target/: entry '") and words in err.value.message


def test_iter_layer_refuses_a_file_where_a_parent_directory_of_the_layer_belongs() -> None:
    data = hostile((info("models"), b"x"), info("models/target", tarfile.DIRTYPE))
    with pytest.raises(BundleError) as err:
        consume(data, "models/target")
    assert err.value.code == "unsafe-archive" and "entry 'models' is outside the layer path" in err.value.message


def test_iter_layer_round_trips_write_layer(ctx: Path) -> None:
    data = layer_bytes(ctx, "target")
    members = [(m, r.read() if r else None) for m, r in iter_layer(io.BytesIO(data), "target")]
    assert [m.name for m, _ in members] == names_of(data)
    for m, content in members:
        if m.kind == "file":
            assert content == FILES[m.name] == data[m.offset_data : m.offset_data + m.size]
            assert m.mode == (0o755 if m.name == EXECUTABLE else 0o644)
        else:
            assert content is None and m.mode == 0o755


def test_iter_layer_skips_content_left_unread(ctx: Path) -> None:
    data = layer_bytes(ctx, "target")
    assert [m.name for m, _ in iter_layer(io.BytesIO(data), "target")] == names_of(data)


def test_iter_layer_reads_gnu_long_names() -> None:
    name = "target/" + "n" * 150 + ".bin"
    data = hostile(info("target", tarfile.DIRTYPE), (info(name), b"long"), fmt=tarfile.GNU_FORMAT)
    assert consume(data, "target") == [("target", None), (name, b"long")]


@pytest.mark.parametrize("cut", ["in-content", "before-end-blocks", "between-end-blocks"])
def test_truncated_archive_is_an_integrity_error(ctx: Path, cut: str) -> None:
    data = layer_bytes(ctx, "target/sub")  # target, target/sub, block.bin (1280 bytes), deeper, empty.bin
    at = {"in-content": 512 * 3 + 700, "before-end-blocks": len(data) - 1024, "between-end-blocks": len(data) - 512}[cut]
    with pytest.raises(BundleError) as err:
        consume(data[:at], "target/sub")
    assert err.value.code == "integrity" and "truncated" in err.value.message


def test_corrupt_header_checksum_is_an_integrity_error(ctx: Path) -> None:
    data = bytearray(layer_bytes(ctx, "README.md"))
    data[0] ^= 0x01
    with pytest.raises(BundleError) as err:
        consume(bytes(data), "README.md")
    assert err.value.code == "integrity" and "checksum" in err.value.message


# ---------------------------------------------------------------------------------------------
# Extracting layers


def test_extract_writes_normalised_modes_whatever_the_umask(ctx: Path, tmp_path: Path) -> None:
    out = io.BytesIO()
    written = write_layer(ctx, "target", out)
    dest = tmp_path / "dest"
    dest.mkdir()
    old = os.umask(0o077)
    try:
        records = extract_layer(io.BytesIO(out.getvalue()), "target", dest)
    finally:
        os.umask(old)
    assert records == written.files
    snap = snapshot(dest)
    assert snap["target/run.sh"] == ("file", 0o755, FILES["target/run.sh"])
    assert snap[PAX_PATH] == ("file", 0o644, FILES[PAX_PATH])
    assert snap[UNICODE_PATH] == ("file", 0o644, FILES[UNICODE_PATH])
    assert snap["target/emptydir"] == ("dir", 0o755)


def test_extract_refuses_a_tampered_file_and_leaves_none_of_it(ctx: Path, tmp_path: Path) -> None:
    out = io.BytesIO()
    expected = {f.path: f.sha256 for f in write_layer(ctx, "target", out).files}
    expected["target/config.json"] = hashlib.sha256(b"what was signed").hexdigest()
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(BundleError) as err:
        extract_layer(io.BytesIO(out.getvalue()), "target", dest, expected)
    assert err.value.code == "tampered" and "target/config.json" in err.value.message
    assert not (dest / "target" / "config.json").exists()


def test_extract_refuses_a_file_the_signature_does_not_list(ctx: Path, tmp_path: Path) -> None:
    out = io.BytesIO()
    expected = {f.path: f.sha256 for f in write_layer(ctx, "target", out).files}
    del expected["target/run.sh"]
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(BundleError) as err:
        extract_layer(io.BytesIO(out.getvalue()), "target", dest, expected)
    assert err.value.code == "extra-file" and not (dest / "target" / "run.sh").exists()


def test_extract_never_follows_a_symlinked_directory_in_dest(ctx: Path, tmp_path: Path) -> None:
    outside, dest = tmp_path / "outside", tmp_path / "dest"
    outside.mkdir()
    dest.mkdir()
    (dest / "target").symlink_to(outside)
    with pytest.raises(BundleError) as err:
        extract_layer(io.BytesIO(layer_bytes(ctx, "target")), "target", dest)
    assert err.value.code == "unsafe-archive" and "symlink" in err.value.message
    assert list(outside.iterdir()) == []


def test_extract_never_writes_through_a_symlinked_file_in_dest(ctx: Path, tmp_path: Path) -> None:
    precious, dest = tmp_path / "precious.txt", tmp_path / "dest"
    precious.write_bytes(b"keep me")
    (dest / "target").mkdir(parents=True)
    (dest / "target" / "a.txt").symlink_to(precious)
    with pytest.raises(BundleError) as err:
        extract_layer(io.BytesIO(layer_bytes(ctx, "target")), "target", dest)
    assert err.value.code == "unsafe-archive" and "target/a.txt" in err.value.message
    assert precious.read_bytes() == b"keep me"


def test_extract_of_a_hostile_archive_writes_nothing_outside_dest(tmp_path: Path) -> None:
    dest = tmp_path / "deep" / "dest"
    dest.mkdir(parents=True)
    data = hostile(info("target", tarfile.DIRTYPE), (info("target/ok.txt"), b"ok"), (info("target/../../evil"), b"evil"))
    with pytest.raises(BundleError) as err:
        extract_layer(io.BytesIO(data), "target", dest)
    assert err.value.code == "unsafe-archive"
    assert not (tmp_path / "deep" / "evil").exists() and not (tmp_path / "evil").exists()
