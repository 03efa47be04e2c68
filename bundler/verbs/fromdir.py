"""`bundle serve --from-dir`: a directory `bundle fetch` filled, its evidence, and the check a server runs on it.

`fetch` (bundler.verbs.fetch) leaves the evidence beside the bundle's files in `DIR/.specbundle/`: the manifest
and config exactly as signed, the Sigstore signature that verified and where it came from. `checked_dir` needs no
store, only the trusted keys: the signature over the manifest digest again (`signed_files`: the one decision of
which signatures a directory may carry, which `fetch` runs on what it is about to leave, so the two accept
the same), the signed name and expiry, the expected reference (`--expect`), the release memory, and that the
files below DIR are exactly the signed ones. `loaded_dir` then reads every file once from DIR, hashing the bytes
it keeps: the small files and GGUF weights into a copy only this server can write, torch weights straight into
the loader's buffers (runner.models.loading hashes the buffers it loads from); the pair loads from those.
"""

from __future__ import annotations

__all__ = [
    "CONFIG", "EVIDENCE", "MANIFEST", "ORIGIN", "SIGNATURE", "CheckedDir", "Expected", "check_fetched", "checked_dir",
    "EXPECT_ENV", "URI_SCHEMES", "expected_from", "loaded_dir", "parse_expected", "private_copy", "signed_files",
]

import contextlib
import datetime as dt
import hashlib
import os
import re
import shutil
import stat
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from bundler.format import boundedjson
from bundler.format.kitfile import Kitfile, kitfile_from_data
from bundler.format.modelpack import is_modelpack, read_modelpack
from bundler.format.tarwrite import write_layer
from bundler.store.layout import MAX_JSON_BLOB, Store
from bundler.store.modelkit import strip_layer_info
from bundler.store.refs import STORAGE_SCHEMES, parse_storage_reference, without_userinfo
from bundler.trust import cosign, signature
from bundler.trust.releases import ROLLBACK_STATE, memory, remember, version_key
from bundler.trust.signature_checks import check_expiry, check_files
from core.errors import BundleError

EVIDENCE = ".specbundle"  # beside the bundle's files: what fetch verified, for serve --from-dir
MANIFEST, CONFIG, SIGNATURE, ORIGIN = "manifest.json", "config.json", "signature.json", "origin.json"
HASH_WORKERS = 4  # hashlib releases the GIL: files hash in parallel
COPY_CHUNK = 1 << 20
URI_SCHEMES = STORAGE_SCHEMES  # the storage URI forms --expect takes besides a reference
EXPECT_ENV = "BUNDLE_EXPECT"  # --expect's variable (a Deployment's env)
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class Expected:
    """What the operator expects the directory to hold (`--expect`): a signed name, a version tag, a digest."""

    shown: str  # the reference as given, scheme and credentials left out: the name reported when it holds
    name: str | None  # the repository's last component: the signed package name
    version: str | None  # from a version tag (`1.0.0`, `v1.0.0`); another tag pins no version
    digest: str | None


@dataclass(frozen=True)
class CheckedDir:
    """A fetched directory whose evidence held and whose file names are exactly the signed ones: what serve
    loads, once each file's bytes hash to `files` as they are read."""

    root: Path
    ref: str  # the name reported: the --expect reference that matched, else the signed name:version
    digest: str
    signer: str
    kitfile: Kitfile
    files: dict[str, str]  # path -> sha256: the signed list (model-signing) or the signed layers' files (cosign)
    kind: str  # the signature that decided: model-signing, or cosign (files hashed already, from the layers)


def parse_expected(text: str) -> Expected:
    """`name:tag`, `name@sha256:…`, a bare `sha256:…`, or a `bundle://` / `kit://` storage URI, read as fetch
    reads its STORAGE_URI (a `user:password@` before the host dropped), as an Expected; anything else is a usage
    error."""
    text = text.strip()
    if not text:  # `--expect ''` or BUNDLE_EXPECT='': set, but pinning nothing; never read as "no expectation"
        raise BundleError("usage", "--expect (or $BUNDLE_EXPECT) is set but empty: give the expected bundle, or unset it")
    if _DIGEST.match(text):
        return Expected(text, None, None, text)
    if text.startswith("sha256:"):
        raise BundleError("usage", f"--expect {text!r}: a digest is sha256: and 64 lowercase hex digits")
    try:
        ref = parse_storage_reference(text)  # user:password@host: never shown, never compared
    except BundleError as err:
        raise BundleError("usage", f"--expect: {err.message}") from None
    if ref is None:
        raise BundleError("usage", f"--expect {without_userinfo(text)!r}: expected NAME[:TAG], NAME@sha256:<hex>, sha256:<hex> or a {' / '.join(URI_SCHEMES)} URI")
    return Expected(str(ref), ref.repository.rsplit("/", 1)[-1], ref.version, ref.digest)  # tag and digest: both checked


def expected_from(value: str | None, environ: Mapping[str, str] = os.environ) -> Expected | None:
    """serve --from-dir's expectation: --expect, else $BUNDLE_EXPECT, parsed; None when neither is set. A variable
    set but empty (which click drops as if unset) is a usage error: an operator who set it meant to pin."""
    if value is None and EXPECT_ENV in environ:
        value = environ[EXPECT_ENV]
    return None if value is None else parse_expected(value)


def _read(evidence: Path, name: str) -> bytes:
    path = evidence / name
    if not path.is_file() or path.is_symlink():
        raise BundleError("missing-file", f"{path} is missing: fetch the bundle with `bundle fetch` first (`--evidence-only` beside an image volume)")
    return boundedjson.read_regular(path, MAX_JSON_BLOB, f"{EVIDENCE}/{name}")


def _signed_kitfile(manifest: Any, config: Any) -> Kitfile:
    """The Kitfile the signed manifest carries: a ModelKit's config, or a ModelPack's annotation or layer roles."""
    if isinstance(manifest, dict) and is_modelpack(manifest):
        return read_modelpack(manifest, config, f"{EVIDENCE}/{MANIFEST}")[0]
    return kitfile_from_data(strip_layer_info(config), f"{EVIDENCE}/{CONFIG}")


def _modelpack_files(manifest: Mapping[str, Any], config: Any) -> dict[str, str]:
    """A cosign-style signature over a ModelPack of raw layers: each file's sha256 is its signed layer digest
    (the blob is the file). A tar layer cannot be checked from a mount's files and is refused."""
    hashes: dict[str, str] = {}
    for _, layer in read_modelpack(manifest, config, f"{EVIDENCE}/{MANIFEST}")[1]:
        if layer.form != "raw":
            raise BundleError("invalid-bundle", f"layer {layer.filepath!r} is a tar: a cosign-style signature vouches for a mounted ModelPack of raw layers only (sign it with `bundle sign`)")
        hashes[layer.filepath] = layer.digest.removeprefix("sha256:")
    return hashes


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _files_on_disk(root: Path) -> dict[str, Path]:
    """Every file below root but the evidence, by bundle path; a link or special file is refused."""
    found: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if here == root:
            dirnames[:] = [d for d in dirnames if d != EVIDENCE]
        for name in dirnames + filenames:
            path = here / name
            if path.is_symlink() or not (path.is_dir() or path.is_file()):
                raise BundleError("unsafe-archive", f"{path.relative_to(root)} in {root} is a link or a special file")
        for name in filenames:
            found[(here / name).relative_to(root).as_posix()] = here / name
    return found


class _Discard:
    """A layer written nowhere: write_layer hashes what it would write."""

    def write(self, data: bytes | memoryview) -> int:
        return len(data)


def _layer_files(root: Path, manifest: Mapping[str, Any], config: Mapping[str, Any], kitfile: Kitfile) -> dict[str, str]:
    """A cosign-style signature pins the manifest digest only, so the files' hashes come from the signed layer
    digests: each layer is written again from the files below root, as `kit pack` and `bundle pack` write it
    (the same bytes for the same files, CONTRACT.md 2), and must have its signed digest. A layer written
    another way cannot be checked from its files and is refused; fetch refuses it too (it runs this check)."""
    raw_layers = manifest.get("layers")
    signed = {d.get("digest") for d in raw_layers if isinstance(d, dict)} if isinstance(raw_layers, list) else set()
    hashes: dict[str, str] = {}
    for spec in kitfile.layers:
        entry = config["model"] if spec.section == "model" else config["model"]["parts"][spec.index] if spec.section == "parts" else config[spec.section][spec.index]
        want = entry.get("digest") if isinstance(entry, dict) else None
        if want not in signed:
            raise BundleError("invalid-bundle", f"{EVIDENCE}/{CONFIG}: entry {spec.path!r} names no layer of the signed manifest")
        signed.discard(want)
        nested = [o.path for o in kitfile.layers if o is not spec and o.path.startswith(spec.path + "/")]  # their own layers, as pack does
        result = write_layer(root, spec.path, _Discard(), exclude=[*nested, EVIDENCE])  # type: ignore[arg-type]
        if result.digest != want:
            raise BundleError("digest-mismatch", f"{spec.path} in {root} does not make its signed layer {str(want)[:19]}… again "
                              "(changed since fetch, or a layer not written as kit writes it: sign the bundle with `bundle sign`)")
        hashes.update({record.path: record.sha256 for record in result.files})
    if signed:
        raise BundleError("invalid-bundle", f"the signed manifest's layer {sorted(signed)[0][:19]}… is named by no Kitfile entry")
    return hashes


def signed_files(root: Path, sig: bytes, digest: str, manifest: Mapping[str, Any], config: Mapping[str, Any], kitfile: Kitfile,
                 trusted: Mapping[str, Any], now: dt.datetime) -> tuple[str, dict[str, str], str]:
    """Which signature a fetched directory may carry, and what it vouches for: (key id, path -> sha256, kind).

    A model-signing signature verifies with a trusted key over this manifest digest, names the config's package
    and version and is not expired; its file list is the signed one. A cosign-style one (verify accepts it where
    no model-signing signature names a trusted key) is by a trusted key over this manifest digest and not
    expired; its files are those of the signed layers (`_layer_files`). `fetch` leaves only a signature this
    accepts, and runs it before it keeps anything."""
    if cosign.kind_of(sig) == cosign.KIND:
        held = cosign.verify_digest(sig, trusted, digest, now)
        files = _modelpack_files(manifest, config) if is_modelpack(manifest) else _layer_files(root, manifest, config, kitfile)
        return held.key_id, files, cosign.KIND
    claims = signature.verify(sig, trusted)
    if claims.bundle.get("manifest_digest") != digest:
        raise BundleError("signature-mismatch", f"the signature is over manifest {str(claims.bundle.get('manifest_digest'))[:19]}…, the evidence is {digest[:19]}…")
    if (claims.bundle.get("name"), claims.bundle.get("version")) != (kitfile.name, kitfile.version):
        raise BundleError("signature-mismatch", f"the signature is for {claims.bundle.get('name')} {claims.bundle.get('version')}, the config is {kitfile.name} {kitfile.version}")
    check_expiry(claims, now)
    return claims.key_id, dict(claims.files), cosign.MODEL_SIGNING_KIND


def _check_expected(expect: Expected | None, kitfile: Kitfile, digest: str) -> str:
    """The name to report: the expectation, once the signed name, version and digest agree with it (else
    signature-mismatch, or rollback for an older signed version); the signed name:version without one."""
    held = f"the directory holds {kitfile.name} {kitfile.version} ({digest[:19]}…)"
    if expect is None:
        return f"{kitfile.name}:{kitfile.version}"
    if expect.digest and expect.digest != digest:
        raise BundleError("signature-mismatch", f"{held}, not the expected {expect.shown}")
    if expect.name and expect.name != kitfile.name:
        raise BundleError("signature-mismatch", f"{held}: its signed name is not {expect.name!r} (--expect {expect.shown})")
    if expect.version and expect.version != kitfile.version.split("+", 1)[0]:
        older = version_key(kitfile.version) < version_key(expect.version)
        raise BundleError("rollback" if older else "signature-mismatch", f"{held}: {'older than' if older else 'not'} the expected {expect.version} (--expect {expect.shown})")
    return expect.shown if expect.name else f"{kitfile.name}:{kitfile.version}"


def _check_release(store: Store | None, expect: Expected | None, kitfile: Kitfile, digest: str) -> None:
    """The release memory of `verify` (bundler.trust.releases), kept in the server's store: a release older than
    one served before, or a release signed again with other content, is refused, then this one remembered. A
    digest pinned by --expect is the operator's exact choice (the way to go back on purpose) and skips it."""
    if store is None or expect is None or expect.digest:
        return
    name, version = kitfile.name, kitfile.version
    try:
        seen = memory(store.state(ROLLBACK_STATE), name)
        known = seen["digests"].get(version)
        if known and known != digest:
            raise BundleError("rollback", f"{name} {version} was served here before with other content ({str(known)[:19]}…): refusing a replaced release")
        if seen["highest"] and version_key(version) < version_key(seen["highest"]):
            raise BundleError("rollback", f"{name} {version} is older than {seen['highest']}, served here before (pin the digest with --expect NAME@sha256:… to go back on purpose)")
        remember(store, name, version, digest)
    except OSError as err:
        raise BundleError("usage", f"cannot keep the release memory in {store.root} ({err.strerror}): set BUNDLE_HOME to a writable directory") from None


def checked_dir(root: Path, trusted: Mapping[str, Any], now: dt.datetime | None = None, *, expect: Expected | None = None,
                store: Store | None = None, evidence: Path | None = None) -> CheckedDir:
    """Check a fetched directory against its evidence before anything is read from it; raises the first failure.

    The config must be the manifest's, the signature one `signed_files` accepts, the signed name, version and
    digest those `expect` names (when given), the release not older than one `store` remembers serving (when
    given, with an expectation), and the files below root exactly the signed ones. Their bytes are hashed
    where they are read (`loaded_dir`, `check_fetched`). `evidence`: where the manifest, config and signature
    lie when not in `root/.specbundle` (a read-only image volume, with the evidence `fetch --evidence-only` left)."""
    root = Path(root)
    if not root.is_dir():
        raise BundleError("usage", f"--from-dir {root}: not a directory")
    where = Path(evidence) if evidence is not None else root / EVIDENCE
    manifest_bytes, config_bytes, sig = _read(where, MANIFEST), _read(where, CONFIG), _read(where, SIGNATURE)
    digest = "sha256:" + hashlib.sha256(manifest_bytes).hexdigest()
    manifest = boundedjson.loads(manifest_bytes, f"{EVIDENCE}/{MANIFEST}")
    config_digest = manifest.get("config", {}).get("digest") if isinstance(manifest, dict) and isinstance(manifest.get("config"), dict) else None
    if config_digest != "sha256:" + hashlib.sha256(config_bytes).hexdigest():
        raise BundleError("digest-mismatch", f"{EVIDENCE}/{CONFIG} is not the config the manifest {digest[:19]}… names")
    config = boundedjson.loads(config_bytes, f"{EVIDENCE}/{CONFIG}")
    kitfile = _signed_kitfile(manifest, config)
    ref = _check_expected(expect, kitfile, digest)  # a refusal before any file is read; a match trusts nothing yet
    on_disk = _files_on_disk(root)  # links and special files refused before the layers are written again
    signer, files, kind = signed_files(root, sig, digest, manifest, config, kitfile, trusted, now or dt.datetime.now(dt.timezone.utc))
    check_files({p: 0 for p in on_disk}, signature.SignedClaims(signer, files, {}, {}))  # missing-file, extra-file, tampered
    _check_release(store, expect, kitfile, digest)
    return CheckedDir(root, ref, digest, signer, kitfile, files, kind)


def _mismatch(path: str, root: Path) -> BundleError:
    return BundleError("digest-mismatch", f"{path} in {root} does not hash to its signed sha256 (changed since fetch)")


def check_fetched(root: Path, trusted: Mapping[str, Any], evidence: Path | None = None) -> CheckedDir:
    """What `serve --from-dir` will check, run by `fetch` on the directory it is about to leave: `checked_dir`
    and every file's sha256, so fetch keeps nothing serve would refuse."""
    checked = checked_dir(root, trusted, evidence=evidence)
    if checked.kind != cosign.KIND:  # a cosign-style check hashed every file already, writing the layers again
        paths = sorted(checked.files)
        with ThreadPoolExecutor(HASH_WORKERS) as pool:
            for path, got in zip(paths, pool.map(_sha256, [root / p for p in paths])):
                if got != checked.files[path]:
                    raise _mismatch(path, root)
    return checked


def _open_signed(path: Path, shown: str, root: Path) -> int:
    """A signed file of the directory opened for reading: gone is missing-file, a link put there is unsafe-archive."""
    try:
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise BundleError("missing-file", f"signed file {shown} is not in {root} any more") from None
    except OSError as err:
        raise BundleError("unsafe-archive", f"{shown} in {root} cannot be read as a regular file ({err.strerror})") from None


def _size(path: Path, shown: str, root: Path) -> int:
    fd = _open_signed(path, shown, root)
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def _copy_hashed(src: Path, dst: Path, want: str, shown: str, root: Path) -> None:
    """src's bytes into dst (new, read-only) and into sha256 from the same buffer: what is kept is what was hashed."""
    fd = _open_signed(src, shown, root)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BundleError("unsafe-archive", f"{shown} in {root} is not a regular file")
        out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o400)
        digest, buf = hashlib.sha256(), bytearray(COPY_CHUNK)
        view = memoryview(buf)
        try:
            while n := os.readv(fd, [buf]):
                digest.update(view[:n])
                written = 0
                while written < n:
                    written += os.write(out, view[written:n])
        finally:
            os.close(out)
        if hasattr(os, "posix_fadvise"):  # the volume's pages are not needed again
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    if digest.hexdigest() != want:
        raise _mismatch(shown, root)


@contextlib.contextmanager
def private_copy(checked: CheckedDir, weights_in_place: bool = True) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Each signed file read once from the directory, hashed from the bytes kept. Torch weights (the target's and
    the draft's *.safetensors, which the loader reads once into its buffers and hashes) stay where they are and
    come back as (path -> FileRange); everything else goes into a new directory under $TMPDIR that only this
    process's user can reach, removed when the block ends (llama.cpp's map of a GGUF keeps its file until the
    process ends). Yields (the copy's root, weight ranges). weights_in_place=False: the torch weights are copied
    too (a third-party runtime opens paths: bundler.serve.runtimes)."""
    from runner.checks.modelinfo import FileRange  # torch-free

    roles = checked.kitfile.role_paths()
    gguf = any(p.endswith(".gguf") for p in checked.files)
    loader_reads = {p for p in checked.files if weights_in_place and not gguf and p.endswith(".safetensors") and any(
        p.startswith(roles[r].strip("/") + "/") and "/" not in p[len(roles[r].strip("/")) + 1:] for r in ("target", "draft") if r in roles)}
    try:
        copy = Path(tempfile.mkdtemp(prefix="specbundle-serve-"))  # mode 0700
    except OSError as err:
        raise BundleError("usage", f"cannot make a private copy of {checked.root} under {tempfile.gettempdir()} ({err.strerror}): set TMPDIR to a writable directory") from None
    try:
        try:
            todo = sorted((p for p in checked.files if p not in loader_reads), key=lambda p: -_size(checked.root / p, p, checked.root))
            for path in todo:
                (copy / path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with ThreadPoolExecutor(HASH_WORKERS) as pool:
                for job in [pool.submit(_copy_hashed, checked.root / p, copy / p, checked.files[p], p, checked.root) for p in todo]:
                    job.result()
            ranges = {p: FileRange(checked.root / p, 0, _size(checked.root / p, p, checked.root)) for p in sorted(loader_reads)}
        except OSError as err:
            raise BundleError("usage", f"cannot make a private copy of {checked.root} in {copy} ({err.strerror}): set TMPDIR to a directory with room") from None
        yield copy, ranges
    finally:
        shutil.rmtree(copy, ignore_errors=True)


@contextlib.contextmanager
def loaded_dir(root: Path, trusted: Mapping[str, Any], context: tuple[int, int], *, expect: Expected | None = None,
               store: Store | None = None, evidence: Path | None = None, **options: Any) -> Iterator[tuple[Any, dict[str, Any], list[str]]]:
    """`checked_dir`, then load the pair as `run` does (runner.run.load_pair: the same checks and refusals) from
    what `private_copy` read: every byte loaded is a byte hashed against the signed list, and nothing written
    to the directory afterwards reaches the server. Yields (pair, {"ref", "digest", "signer"}, checks)."""
    from bundler.verbs.run import runner_params
    from runner.run import load_pair  # torch is imported only when a bundle runs

    checked = checked_dir(root, trusted, expect=expect, store=store, evidence=evidence)
    with private_copy(checked) as (copy, ranges):
        pair = load_pair(copy, checked.kitfile.role_paths(), runner_params(checked.kitfile.parameters), context=context,
                         verified_files=checked.files, weight_ranges=ranges, **options)
    checks = ["signature", "signed-name", "expiry", "files", "file-hashes"] + (["expected"] if expect else [])
    yield pair, {"ref": checked.ref, "digest": checked.digest, "signer": checked.signer}, checks
