"""`bundle init`: a bundle context from two model directories as downloaded, checked as `run` would check it.

The context is built in a hidden temp directory beside CONTEXT and renamed into place only when the Kitfile
validates and the pair passes the checks `bundle run` makes before loading any weights (the tokenizer gate,
config agreement, the pairing policy): a refused pair leaves nothing behind.
"""

from __future__ import annotations

__all__ = ["init_context", "sanitise_name"]

import json
import os
import re
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bundler.format import boundedjson
from bundler.trust.contentcheck import check_content
from core.errors import BundleError
from bundler.format.kitfile import DRAFT_FREE_METHODS, Kitfile, load_kitfile, pickle_files
from bundler.format.layerread import TOKENIZER_FILES

# The settings of the README's decoding benchmark (demo/Kitfile): what the measured speed-up used.
DEFAULT_SPECULATIVE: dict[str, Any] = {
    "draft_tokens": 4,
    "adaptive": False,
    "draft_confidence": 0.3,
    "min_acceptance": 0.1,
    "min_size_ratio": 4,
}
DEFAULT_VERSION = "1.0.0"
DRAFT_VOCAB_FILE = "draft_vocab.json"
DTYPES = ("float32", "bfloat16", "float16")  # what the Kitfile schema's model.parameters.dtype allows
# The Kitfile schema's patterns for package.name and package.version (schemas/kitfile.schema.json).
NAME_PATTERN = re.compile(r"^[a-z0-9]+([._-][a-z0-9]+)*$")
VERSION_PATTERN = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.-]+)?$")
MAX_NAME = 128
MAX_CONFIG_BYTES = 4 << 20  # a config.json is a few kB


@dataclass(frozen=True)
class RoleFiles:
    """What init put in one role directory of the context."""

    role: str
    source: Path
    files: int
    bytes: int
    linked: int  # hard links to the source files
    copied: int  # copies, where a link was not possible (another file system, a file not ours)


@dataclass(frozen=True)
class InitResult:
    """The context written, its Kitfile's name and version, and what the checks found."""

    context: Path
    kitfile: Kitfile
    roles: list[RoleFiles]
    fingerprint: str
    pairing: dict[str, Any]
    dtype: str | None
    skipped: list[str] = field(default_factory=list)  # hidden entries of the sources left out (.git, .cache)

    @property
    def name(self) -> str:
        return self.kitfile.name

    @property
    def version(self) -> str:
        return self.kitfile.version


def sanitise_name(raw: str) -> str:
    """A directory name as a Kitfile package name: lower case, separators [._-] between runs of [a-z0-9]."""
    name = re.sub(r"[^a-z0-9._-]+", "-", raw.lower())
    name = re.sub(r"[._-]*([._-])[._-]*", r"\1", name)  # a run of separators becomes its middle one
    return name.strip("._-")[:MAX_NAME].rstrip("._-")


def _source_dir(path: Path, flag: str) -> Path:
    if not path.is_dir():
        raise BundleError("missing-input", f"{flag} {path}: not a directory")
    return path


def _cache_blobs(root: Path) -> Path | None:
    """The `blobs/` of the Hugging Face cache repository whose snapshot `root` is (`models--*/snapshots/<rev>`)."""
    snapshots = root.parent
    repo = snapshots.parent
    if snapshots.name == "snapshots" and repo.name.startswith("models--"):
        return repo / "blobs"
    return None


def _model_dir_name(directory: Path) -> str:
    """A model directory's name: for a cache snapshot its repository's (`models--Org--Name` -> `Name`), not the revision."""
    root = Path(os.path.realpath(directory))
    return root.parent.parent.name.split("--")[-1] if _cache_blobs(root) is not None else root.name


def _inside(path: Path, areas: tuple[Path, ...]) -> bool:
    return any(path == area or path.is_relative_to(area) for area in areas)


def _refuse_link(link: Path, real: Path, root: Path, blobs: Path | None) -> None:
    """A link whose target leaves the source directory (and its cache repository's blobs/): named, with where it leads."""
    where = f"{root}" + (f" or {blobs}" if blobs else "")
    raise BundleError("invalid-bundle", f"{link} is a link to {os.readlink(link)!r} ({real}), outside {where}: init "
                      "reads only files inside the model directory; copy the file in if it belongs to the model")


def _source_files(directory: Path) -> tuple[list[tuple[str, Path]], list[str]]:
    """(relative name, real file) for every file under a download directory, and the hidden entries left out.

    A model directory is untrusted input: a link is followed only where it resolves inside the directory, or,
    for a Hugging Face cache snapshot (`models--*/snapshots/<rev>/`, whose files are links into the repository's
    `blobs/`), inside that repository's blobs/. Any other link (upwards, absolute, into /proc or another cache
    repository) is refused before anything is read, and a directory link leaving the tree is never walked.
    Hidden entries (.git, .cache/huggingface, .gitattributes) are no part of the model.
    """
    root = Path(os.path.realpath(directory))
    blobs = _cache_blobs(root)
    areas = (root,) if blobs is None else (root, Path(os.path.realpath(blobs)))
    found: list[tuple[str, Path]] = []
    skipped: list[str] = []
    seen: set[str] = set()
    # followlinks=False: directory links are judged below, and walked (inside the tree) only after that.
    pending: list[tuple[Path, Path]] = [(root, Path("."))]
    while pending:
        top, rel_top = pending.pop(0)
        real_top = os.path.realpath(top)
        if real_top in seen:  # a directory link loop, or a link to a directory walked already
            continue
        seen.add(real_top)
        try:
            entries = sorted(os.scandir(top), key=lambda e: e.name)
        except OSError as err:
            raise BundleError("missing-input", f"{directory / rel_top}: cannot list directory ({err.strerror})") from None
        subdirs: list[tuple[Path, Path]] = []
        for entry in entries:
            rel = rel_top / entry.name
            if entry.name.startswith("."):
                skipped.append(str(rel))
                continue
            path = Path(entry.path)
            real = Path(os.path.realpath(path))
            if entry.is_symlink() and not _inside(real, areas):
                _refuse_link(directory / rel, real, root, blobs)
            try:
                mode = real.stat().st_mode
            except OSError:
                raise BundleError("missing-input", f"{directory / rel}: a link to nothing") from None
            if stat.S_ISDIR(mode):
                subdirs.append((path, rel))
            elif stat.S_ISREG(mode):
                found.append((str(rel), real))
            else:
                raise BundleError("invalid-bundle", f"{directory / rel} is not a regular file: only regular files are packed")
        pending[0:0] = subdirs  # depth first, in name order
    return found, skipped


def _place(files: list[tuple[str, Path]], dest: Path, role: str, source: Path) -> RoleFiles:
    """Hard-link each file into dest (a copy where the file system refuses a link)."""
    linked = copied = size = 0
    for rel, src in files:
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, out)  # weights are gigabytes: a link costs nothing, and pack only reads them
            linked += 1
        except OSError:  # another device (EXDEV), or not our file under fs.protected_hardlinks (EPERM)
            shutil.copyfile(src, out)
            copied += 1
        size += out.stat().st_size
    dest.mkdir(parents=True, exist_ok=True)
    return RoleFiles(role, source, len(files), size, linked, copied)


def _read_config(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "config.json"
    if not path.is_file():
        raise BundleError("invalid-bundle", f"{model_dir} has no config.json: is it a Hugging Face model directory?")
    data = boundedjson.read_json(path, "config.json", max_bytes=MAX_CONFIG_BYTES)  # a download is untrusted input
    if not isinstance(data, dict):
        raise BundleError("invalid-bundle", f"{path} is not a JSON object")
    return data


def config_dtype(config: dict[str, Any]) -> str | None:
    """The dtype a config.json names (`dtype`, or `torch_dtype` before transformers 5), if the schema allows it."""
    value = config.get("dtype") or config.get("torch_dtype")
    return value if value in DTYPES else None


def kitfile_text(name: str, version: str, model_name: str, description: str, dtype: str | None, speculative: dict[str, Any],
                 draft: bool = True) -> str:
    """The Kitfile of CONTRACT.md section 1 for a context laid out by init (JSON scalars are YAML); without
    a draft, the bundle asks for draft-free speculation."""
    spec = ", ".join(f"{k}: {json.dumps(v)}" for k, v in speculative.items())
    dtype_line = f"    dtype: {dtype}\n" if dtype else ""
    draft_line = "    - {name: draft, path: draft/, type: draft}\n" if draft else ""
    return f"""manifestVersion: 1.0.0
package:
  name: {name}
  version: {json.dumps(version)}
  description: {json.dumps(description)}
model:
  name: {json.dumps(model_name)}
  path: target/
  framework: transformers
  parts:
{draft_line}    - {{name: tokenizer, path: tokenizer/, type: tokenizer}}
  parameters:
{dtype_line}    speculative: {{{spec}}}
"""


def init_context(
    target: Path,
    draft: Path | None,
    out: Path,
    tokenizer: Path | None = None,
    name: str | None = None,
    version: str | None = None,
) -> InitResult:
    """Lay out CONTEXT (target/, draft/, tokenizer/, Kitfile) from two downloaded model directories and check it.

    The tokenizer files come from `tokenizer`, else from the target directory. Without a draft the context
    asks for draft-free speculation (methods: [ngram]). Nothing is left at `out` unless every check passes.
    """
    target = _source_dir(target, "--target")
    draft = _source_dir(draft, "--draft") if draft is not None else None
    tok_source = _source_dir(tokenizer, "--tokenizer") if tokenizer is not None else target
    out = _new_context_dir(out)
    version = _checked_version(version)
    model_name, name = _package_name(target, name)

    sources = {"target": _source_files(target), **({"draft": _source_files(draft)} if draft is not None else {})}
    _refuse_pickles(sources, target, draft)
    tok_files = _tokenizer_files(tok_source, "--tokenizer" if tokenizer is not None else "--target")

    dtype = config_dtype(_read_config(target))
    speculative = _speculative(draft)
    description = (f"{_model_dir_name(target)} (target) with {_model_dir_name(draft)} (draft)" if draft is not None
                   else f"{_model_dir_name(target)} (target), draft-free speculation")

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.init-", dir=out.parent))
    try:
        roles = [
            _place(sources["target"][0], staging / "target", "target", target),
            *([_place(sources["draft"][0], staging / "draft", "draft", draft)] if draft is not None else []),
            _place(tok_files, staging / "tokenizer", "tokenizer", tok_source),
        ]
        (staging / "Kitfile").write_text(kitfile_text(name, version, model_name, description, dtype, speculative, draft is not None),
                                         encoding="utf-8")
        kitfile = load_kitfile(staging)  # the schema, the kitops model, every path, no pickle: as pack checks
        checked = check_content(staging, kitfile)  # what verify and run would refuse, refused here
        os.chmod(staging, 0o777 & ~_umask())  # mkdtemp made it 0700; a context is an ordinary directory
        _move_into_place(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    skipped = [name for _, left in sources.values() for name in left]
    return InitResult(out, kitfile, roles, checked.fingerprint, checked.pairing, dtype, skipped)


def _new_context_dir(out: Path) -> Path:
    """`-o` as init writes it: refused unless it is new or an empty directory."""
    if out.name in ("", ".", ".."):  # `-o .`: the staging directory goes beside the real directory
        out = out.resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BundleError("usage", f"-o {out}: exists and is not an empty directory; init writes a new context")
    return out


def _checked_version(version: str | None) -> str:
    """--version (else DEFAULT_VERSION), as the Kitfile schema's package.version pattern allows it."""
    version = version or DEFAULT_VERSION
    if not VERSION_PATTERN.match(version):
        raise BundleError("usage", f"--version {version!r} must be a version like 1.0.0")
    return version


def _package_name(target: Path, name: str | None) -> tuple[str, str]:
    """(model name, package name): the target directory's name made a package name, and --name (else that one),
    as the Kitfile schema's package.name pattern allows it."""
    model_name = sanitise_name(_model_dir_name(target))
    name = name if name is not None else model_name
    if not NAME_PATTERN.match(name) or len(name) > MAX_NAME:
        hint = "" if name else f" (none could be made from the directory name {_model_dir_name(target)!r})"
        raise BundleError("usage", f"--name {name!r}: a package name is lower-case letters and digits, "
                          f"separated by single '.', '_' or '-'{hint}")
    return model_name, name


def _refuse_pickles(sources: dict[str, tuple[list[tuple[str, Path]], list[str]]], target: Path, draft: Path | None) -> None:
    """Refuse pickle-based weights in either model directory."""
    for role, (files, _) in sources.items():
        found = pickle_files([rel for rel, _ in files])
        if found:  # refused before anything is linked or copied
            raise BundleError("pickle-weights", f"{role} {(target if role == 'target' else draft) / found[0]} holds "
                              "pickle-based weights: remove it (keep the *.safetensors) or download safetensors only")


def _tokenizer_files(tok_source: Path, flag: str) -> list[tuple[str, Path]]:
    """The tokenizer files at the top of `tok_source` (given as `flag`), which must hold a tokenizer.json."""
    tok_files = [(n, p) for n, p in _source_files(tok_source)[0] if "/" not in n and n in TOKENIZER_FILES]
    if not any(n == "tokenizer.json" for n, _ in tok_files):
        raise BundleError("missing-input", f"{flag} {tok_source} has no tokenizer.json: give --tokenizer DIR with the "
                          "target's tokenizer.json (and tokenizer_config.json)")
    return tok_files


def _speculative(draft: Path | None) -> dict[str, Any]:
    """The Kitfile's speculative parameters: the benchmark's settings with a draft (and its draft vocabulary where
    it ships one), else draft-free speculation."""
    speculative = dict(DEFAULT_SPECULATIVE) if draft is not None else {"methods": list(DRAFT_FREE_METHODS)}
    if draft is not None and (draft / DRAFT_VOCAB_FILE).is_file():  # the draft scores only these ids (runner/models/draft_vocab.py)
        speculative["draft_vocab"] = DRAFT_VOCAB_FILE
    return speculative


def _move_into_place(staging: Path, out: Path) -> None:
    """Rename the staged context to `out`. An empty directory already there (maybe the shell's cwd, which a
    rename over it would orphan) gets the staged entries instead, the Kitfile last; a failure takes them back."""
    if not out.exists():
        os.rename(staging, out)  # atomic on one file system
        return
    moved: list[Path] = []
    try:
        for entry in sorted(staging.iterdir(), key=lambda p: p.name == "Kitfile"):
            os.rename(entry, out / entry.name)
            moved.append(out / entry.name)
        staging.rmdir()
    except BaseException:
        for path in moved:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
