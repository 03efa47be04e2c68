"""Load and validate a Kitfile: YAML (no aliases), JSON Schema, the kitops model, then the roles and paths."""

from __future__ import annotations

__all__ = ["DRAFT_FREE_METHODS", "KITFILE_NAMES", "Kitfile", "LayerSpec", "MODEL_ROLES", "kitfile_from_data", "load_kitfile", "parse_kitfile", "pickle_files", "runner_params", "with_speculative"]

import json
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import jsonschema
import yaml
from kitops.modelkit.kitfile import Kitfile as KitopsKitfile

from core.errors import BundleError
from bundler.format.schemacheck import validator

SCHEMA_NAME = "kitfile.schema.json"  # in the `schemas` package
MAX_KITFILE_BYTES = 1 << 20
MAX_YAML_DEPTH = 32
KITFILE_NAMES = ("Kitfile", "kitfile", ".kitfile")
# Weights stored with pickle can run code when loaded: refused in model roles.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt", ".pickle")
MODEL_ROLES = ("target", "draft")
REQUIRED_ROLES = ("target", "draft", "tokenizer")
# The methods a bundle without a draft model may name: proposals that need no weights (runner.decoding.ngram).
DRAFT_FREE_METHODS = ("ngram",)


@dataclass(frozen=True)
class LayerSpec:
    """One Kitfile entry, which becomes one layer."""

    role: str  # target | draft | tokenizer | part | code | dataset | docs
    kind: str  # the media type word: model | modelpart | code | dataset | docs
    path: str  # normalised, relative to the context, no trailing slash
    section: str  # where it sits in the Kitfile: model, parts, code, datasets, docs
    index: int  # position within its section


@dataclass(frozen=True)
class Kitfile:
    """A validated Kitfile: the document as written, and its layers in kit's order."""

    data: dict[str, Any]
    layers: tuple[LayerSpec, ...]

    @property
    def name(self) -> str:
        return self.data["package"]["name"]

    @property
    def version(self) -> str:
        return self.data["package"]["version"]

    @property
    def parameters(self) -> dict[str, Any]:
        return dict(self.data["model"].get("parameters") or {})

    @property
    def has_draft(self) -> bool:
        """Whether the bundle carries a draft model (one without asks for draft-free speculation)."""
        return any(spec.role == "draft" for spec in self.layers)

    def role_paths(self) -> dict[str, str]:
        """role -> path for the roles the runner needs: target, tokenizer and, where the bundle has one, draft."""
        return {spec.role: spec.path for spec in self.layers if spec.role in REQUIRED_ROLES}


def runner_params(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """The Kitfile's model.parameters as the runner takes them: the speculative settings plus the dtype."""
    params = dict(parameters.get("speculative") or {})
    if parameters.get("dtype"):
        params["dtype"] = parameters["dtype"]
    return params


def _invalid(where: str, what: str) -> BundleError:
    return BundleError("invalid-kitfile", f"{where}: {what}")


def _parse_yaml(text: str, where: str) -> Any:
    """Safe YAML with aliases refused (a billion-laughs bomb needs them) and nesting bounded."""
    try:
        depth = 0
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent):
                raise _invalid(where, f"line {event.start_mark.line + 1}: YAML aliases are not allowed")
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_YAML_DEPTH:
                    raise _invalid(where, f"nested deeper than {MAX_YAML_DEPTH} levels")
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1}: " if mark else ""
        raise _invalid(where, f"{at}not valid YAML ({getattr(exc, 'problem', None) or exc})") from None


def normalise_path(raw: str, where: str) -> str:
    """A context-relative posix path, or an invalid-kitfile error saying why not."""
    if "://" in raw or raw.startswith(("s3:", "kit:")):
        raise _invalid(where, f"path {raw!r} is remote; only local paths are packed")
    if "\\" in raw or "\x00" in raw:
        raise _invalid(where, f"path {raw!r} has a backslash or NUL")
    if raw.startswith("/"):
        raise _invalid(where, f"path {raw!r} is absolute; paths are relative to the context")
    if ".." in raw.split("/"):
        raise _invalid(where, f"path {raw!r} escapes the context with '..'")
    norm = posixpath.normpath(raw)
    if norm in (".", ""):
        raise _invalid(where, f"path {raw!r} names the whole context; name a file or directory in it")
    return norm


def _layer_specs(data: dict[str, Any], where: str) -> tuple[LayerSpec, ...]:
    model = data["model"]
    specs = [LayerSpec("target", "model", normalise_path(model["path"], f"{where} model.path"), "model", 0)]
    for i, part in enumerate(model.get("parts", [])):
        role = part["type"] if part["type"] in ("draft", "tokenizer") else "part"
        specs.append(LayerSpec(role, "modelpart", normalise_path(part["path"], f"{where} model.parts[{i}].path"), "parts", i))
    for section, kind in (("code", "code"), ("datasets", "dataset"), ("docs", "docs")):
        for i, entry in enumerate(data.get(section, [])):
            specs.append(LayerSpec(kind, kind, normalise_path(entry["path"], f"{where} {section}[{i}].path"), section, i))
    seen: dict[str, str] = {}
    for spec in specs:
        if spec.path in seen:
            raise _invalid(where, f"path {spec.path!r} appears twice ({seen[spec.path]} and {spec.section})")
        seen[spec.path] = spec.section
    draft_free = _speculative_methods(data, where) == DRAFT_FREE_METHODS
    for role in REQUIRED_ROLES:
        count = sum(spec.role == role for spec in specs)
        if count == 0 and role == "draft" and draft_free:
            continue
        if count == 0 and role == "draft":  # named as the schema's message names it: the part to add, or the way out
            raise _invalid(where, "no draft part (add `- {name: draft, path: draft/, type: draft}`, or ask for draft-free "
                                  "speculation: model.parameters.speculative.methods: [ngram])")
        if count != 1:
            what = "missing" if count == 0 else f"given {count} times"
            raise _invalid(where, f"the {role} role is {what}: a bundle has one target (model.path), one part of type draft and one of type tokenizer")
    return tuple(specs)


def _speculative_methods(data: dict[str, Any], where: str) -> tuple[str, ...] | None:
    """The methods the Kitfile names (None: not named), checked against the prompt-lookup sizes given."""
    speculative = (data["model"].get("parameters") or {}).get("speculative") or {}
    ngram = speculative.get("ngram") or {}
    if ngram.get("min_n") and ngram.get("max_n") and ngram["min_n"] > ngram["max_n"]:
        raise _invalid(where, f"model.parameters.speculative.ngram: min_n {ngram['min_n']} is above max_n {ngram['max_n']}")
    methods = speculative.get("methods")
    return tuple(methods) if methods else None


def with_speculative(text: str, updates: Mapping[str, Any], where: str = "Kitfile") -> str:
    """Kitfile text with `updates` merged into model.parameters.speculative and the rest of the text as it
    was (comments, order, style): only the speculative node is rewritten (in flow style), or added."""
    data = _parse_yaml(text, where)
    kitfile_from_data(data, where)
    expected = {**data, "model": {**data["model"], "parameters": {**(data["model"].get("parameters") or {})}}}
    expected["model"]["parameters"]["speculative"] = {**(expected["model"]["parameters"].get("speculative") or {}), **updates}
    node, path = yaml.compose(text, Loader=yaml.SafeLoader), []
    for key in ("model", "parameters", "speculative"):
        child = next((v for k, v in node.value if k.value == key), None) if isinstance(node, yaml.MappingNode) else None
        if child is None:
            break
        node, path = child, [*path, key]
    value: Any = expected
    for key in path:
        value = value[key]
    span = text[node.start_mark.index:node.end_mark.index]
    # a block node's span runs on to the next key's indentation: the edit ends at the span's last newline
    cut = span.rfind("\n") if "\n" in span and not span[span.rfind("\n") + 1:].strip() else len(span)
    end = node.start_mark.index + cut
    if len(path) < 3 and isinstance(node, yaml.MappingNode) and not node.flow_style and node.value:
        missing = ("model", "parameters", "speculative")[len(path)]  # add the missing key as the node's last line
        indent = " " * node.value[0][0].start_mark.column
        line = f"{indent}{missing}: {json.dumps(value[missing])}\n"
        edited = text[:end + 1] + line + text[end + 1:] if end < len(text) else text + "\n" + line
    else:
        edited = text[:node.start_mark.index] + json.dumps(value) + text[end:]  # JSON is YAML's flow style
    if _parse_yaml(edited, where) != expected:
        raise _invalid(where, "the speculative settings could not be written in place; edit the Kitfile by hand")
    kitfile_from_data(expected, where)
    return edited


def parse_kitfile(text: str, where: str = "Kitfile") -> Kitfile:
    """Validate Kitfile text (schema, kitops model, roles, paths); no file system access."""
    if len(text.encode()) > MAX_KITFILE_BYTES:
        raise _invalid(where, f"larger than {MAX_KITFILE_BYTES} bytes")
    return kitfile_from_data(_parse_yaml(text, where), where)


def _depth(value: Any) -> int:
    """Nesting depth of maps and lists, counted without recursion (the value may be hostile)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            if level <= MAX_YAML_DEPTH:  # deeper is refused anyway: no need to walk it all
                stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _friendly(error: jsonschema.ValidationError) -> str:
    """A schema error as a user can act on it: no raw regular expressions or schema jargon."""
    field = str(error.absolute_path[-1]) if error.absolute_path else ""
    if error.validator == "pattern":
        if field == "version":
            return f"{error.instance!r} must be a version like 1.0.0"
        return f"{error.instance!r} is not allowed here (see Kitfile.example for the form)"
    if error.validator == "minItems" and field == "parts" and isinstance(error.instance, list):
        present = {p.get("type") for p in error.instance if isinstance(p, dict)}
        missing = [role for role in ("draft", "tokenizer") if role not in present]
        if missing == ["draft"]:
            return "no draft part (add `- {name: draft, path: draft/, type: draft}`, or ask for draft-free speculation: model.parameters.speculative.methods: [ngram])"
        if missing:
            return "no " + " and no ".join(f"{r} part (add `- {{name: {r}, path: {r}/, type: {r}}}`)" for r in missing)
        return f"needs at least {error.validator_value} parts: a draft and a tokenizer"
    if error.validator in ("minItems", "minLength", "minProperties"):
        return "must not be empty" if field else "is empty"
    if error.validator == "required":
        return error.message.replace("is a required property", "is missing")
    return error.message


def kitfile_from_data(data: Any, where: str = "Kitfile") -> Kitfile:
    """Validate an already-parsed Kitfile document (from YAML, or from a bundle's config)."""
    if not isinstance(data, dict):
        raise _invalid(where, "not a YAML mapping")
    if _depth(data) > MAX_YAML_DEPTH:  # a config read from JSON never went through _parse_yaml's bound
        raise _invalid(where, f"nested deeper than {MAX_YAML_DEPTH} levels")
    errors = sorted(validator(SCHEMA_NAME).iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        at = ".".join(str(p) for p in first.absolute_path) or "(top level)"
        raise _invalid(where, f"{at}: {_friendly(first)}")
    try:
        KitopsKitfile(**data)  # the reference model of the format must accept it too
    except Exception as exc:  # pydantic's ValidationError, or TypeError from its setters
        raise _invalid(where, f"rejected by the KitOps Kitfile model: {str(exc).splitlines()[0]}") from None
    return Kitfile(data=data, layers=_layer_specs(data, where))


def load_kitfile(context: Path, kitfile: Path | None = None) -> Kitfile:
    """Read and validate the Kitfile of a context directory, and check its paths against the tree."""
    if not context.is_dir():
        raise BundleError("missing-input", f"context {context} is not a directory")
    path = kitfile if kitfile is not None else next((context / n for n in KITFILE_NAMES if (context / n).is_file()), context / "Kitfile")
    if not path.is_file():
        raise BundleError("missing-input", f"no Kitfile at {path}")
    if kitfile is None and path.is_symlink() and not path.resolve().is_relative_to(context.resolve()):
        # The context is read as untrusted input: a Kitfile link leading out of it is not followed (`-f` is).
        raise _invalid(str(path), f"a link to {os.readlink(path)!r}, outside the context; give it with -f if it is yours")
    raw = path.read_bytes()[: MAX_KITFILE_BYTES + 1]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _invalid(str(path), "not UTF-8 text") from None
    parsed = parse_kitfile(text, str(path))
    check_tree(context, parsed)
    return parsed


def pickle_files(names: list[str]) -> list[str]:
    """The names that are pickle-based weight files."""
    return [n for n in names if n.lower().endswith(PICKLE_SUFFIXES)]


def check_tree(context: Path, kitfile: Kitfile) -> None:
    """Every path exists inside the context (no symlink escapes) and model roles hold no pickle weights."""
    root = context.resolve()
    for spec in kitfile.layers:
        target = context / spec.path
        if not target.exists():
            raise _invalid(str(context), f"{spec.role} path {spec.path!r} does not exist")
        if not target.resolve().is_relative_to(root):
            raise _invalid(str(context), f"{spec.role} path {spec.path!r} resolves outside the context")
        for path in [target, *target.rglob("*")] if target.is_dir() else [target]:
            if path.is_symlink() or not (path.is_file() or path.is_dir()):
                kind = "a symlink" if path.is_symlink() else "not a regular file or directory"
                raise BundleError("invalid-bundle", f"{path.relative_to(context)} is {kind}: only regular files and directories are packed")
        if spec.role in MODEL_ROLES:
            names = [str(p.relative_to(context)) for p in target.rglob("*")] if target.is_dir() else [spec.path]
            found = pickle_files(names)
            if found:
                raise BundleError("pickle-weights", f"{spec.role} holds pickle-based weights {found[0]!r}: convert to safetensors")
            ggufs = [n for n in names if n.endswith(".gguf")]  # GGUF: tensors and metadata, no code
            if len(ggufs) > 1:
                raise _invalid(str(context), f"{spec.role} path {spec.path!r} holds {len(ggufs)} GGUF files; a role holds one")
            if ggufs and any(n.endswith(".safetensors") for n in names):
                raise _invalid(str(context), f"{spec.role} path {spec.path!r} holds both GGUF and safetensors weights")
            if target.is_dir() and not ggufs and not any(target.rglob("*.safetensors")):
                raise _invalid(str(context), f"{spec.role} path {spec.path!r} holds no *.safetensors or *.gguf weights")
