"""YAML loading into typed models, with one-line errors that name the file and field path.

Files are read by opcollect.inputs (a regular file, of bounded size). The safe loader builds no objects from
tags; libyaml refuses nesting past its own bound (a YAMLError), the pure-Python loader past the recursion limit."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from opcollect.errors import InputError
from opcollect.inputs import MIB, not_utf8, read_bytes

try:
    _Loader = yaml.CSafeLoader
except AttributeError:  # libyaml missing: the pure-Python loader is ~8x slower but equivalent
    _Loader = yaml.SafeLoader

M = TypeVar("M", bound=BaseModel)
MAX_BYTES = 16 * MIB  # the largest committed YAML (a selection) is ~100 KB; a sidecar a few KB


def read_yaml(
    path: Path,
    what: str = "YAML file",
    fix: str = "check the path",
    *,
    limit: int = MAX_BYTES,
    tree: Path | None = None,
) -> object:
    """The YAML value in the regular file at ``path`` (read by opcollect.inputs: no FIFO, size bound)."""
    data = read_bytes(path, what, fix, limit=limit, tree=tree)
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: {not_utf8(exc)}; save it as UTF-8 text") from None
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError(f"{path}:{where} invalid YAML: {problem}") from None
    except RecursionError:  # only the pure-Python loader recurses
        raise InputError(f"{path}: YAML nested too deeply; {fix}") from None


def _path(loc: tuple) -> str:
    return ".".join(str(part) for part in loc if part != "[key]") or "(top level)"


def describe_validation_error(source: str, exc: ValidationError) -> str:
    """One line: the source, the failing field path, what was expected and what was found.

    An unknown field is reported before the missing field it usually misspells, with a suggestion.
    """
    errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
    err = errors[0]
    kind = err["type"]
    if kind == "missing":
        detail = "missing required field; add it"
    elif kind == "extra_forbidden":
        detail = "unknown field; remove it or fix its spelling"
        parent, name = err["loc"][:-1], str(err["loc"][-1])
        missing = [str(e["loc"][-1]) for e in errors if e["type"] == "missing" and e["loc"][:-1] == parent]
        close = difflib.get_close_matches(name, missing, n=1, cutoff=0.5)
        if close:
            detail += f" (did you mean {close[0]!r}?)"
    elif kind == "value_error" and isinstance(err.get("input"), dict):  # a check across fields names them
        detail = err["msg"]
    else:
        detail = f"{err['msg']} (got {err.get('input')!r})"
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{source}: field '{_path(err['loc'])}': {detail}{more}"


def validate(source: str, data: object, model: type[M]) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InputError(describe_validation_error(source, exc)) from None


def load_typed(path: Path, model: type[M]) -> M:
    return validate(str(path), read_yaml(path), model)
