"""Backends: one package per framework; framework imports only inside their functions."""

from __future__ import annotations

import importlib
from collections.abc import Collection
from types import ModuleType

from opcollect.errors import InputError
from opcollect.names import BACKENDS


def load_backend(name: str, modules: Collection[str] = ()) -> ModuleType:
    """``opcollect.backends.<name>`` for a backend opcollect knows; a dotted module path only when ``modules``
    names it. ``modules`` comes from code or the command line (the test suite's fake backends, `run
    --test-backend`), never from a plan: a name read from data never chooses what is imported."""
    if name in BACKENDS:
        module = f"opcollect.backends.{name}"
    elif name in modules:
        module = name
    else:
        raise InputError(f"backend {name!r} is not one opcollect knows ({', '.join(BACKENDS)})")
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            raise InputError(f"backend {name!r}: no module {module}; known backends: {', '.join(BACKENDS)}") from None
        raise
