"""YAML loading into typed models, with one-line errors that name the file and field path."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from opcollect.errors import InputError

try:
    _Loader = yaml.CSafeLoader
except AttributeError:  # libyaml missing: the pure-Python loader is ~8x slower but equivalent
    _Loader = yaml.SafeLoader

M = TypeVar("M", bound=BaseModel)


def read_yaml(path: Path) -> object:
    try:
        text = Path(path).read_bytes().decode()
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror}); check the path") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: {not_utf8(exc)}; save it as UTF-8 text") from None
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError(f"{path}:{where} invalid YAML: {problem}") from None


def not_utf8(exc: UnicodeDecodeError) -> str:
    """What is wrong with bytes that are not UTF-8: the first bad byte and its offset."""
    return f"not UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})"


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
