"""Backends: one package per framework; framework imports only inside their functions."""

from __future__ import annotations

import importlib
from types import ModuleType

from opcollect.errors import InputError
from opcollect.names import BACKENDS


def load_backend(name: str) -> ModuleType:
    """``opcollect.backends.<name>`` for a known backend; a dotted module path names any other."""
    module = f"opcollect.backends.{name}" if name in BACKENDS else name
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            raise InputError(f"backend {name!r}: no module {module}; known backends: {', '.join(BACKENDS)}") from None
        raise
