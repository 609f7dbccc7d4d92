"""Failure classes. A failure never stops the run; a sticky CUDA error replaces the worker."""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Literal

from opcollect.runtime.contract import KernelLimit

ErrorClass = Literal["kernel_limit", "oom", "timeout", "crash", "unexpected"]

# a kernel saying no: unsupported shapes, dtypes or architectures
_LIMIT_PATTERNS = (
    "not supported",
    "unsupported",
    "not implemented",
    "no kernel image",
    "no available kernel",
    "divisible by",
    "must be a multiple",
    "only supports",
    "expected all tensors to be on the same device",
)
# errors after which the CUDA context is unusable: the worker must be replaced
_STICKY_PATTERNS = (
    "illegal memory access",
    "device-side assert",
    "unspecified launch failure",
    "misaligned address",
    "cuda error: an illegal",
    "uncorrectable ecc",
    "cudaerrorlaunchfailure",
)


@dataclass(frozen=True)
class Failure:
    error_class: ErrorClass
    message: str
    fatal: bool = False  # the worker must be replaced


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:500]


def classify(exc: BaseException) -> Failure:
    text = str(exc).lower()
    if isinstance(exc, KernelLimit):
        return Failure("kernel_limit", str(exc)[:500])
    if type(exc).__name__ == "OutOfMemoryError" or "out of memory" in text or isinstance(exc, MemoryError):
        return Failure("oom", _first_line(exc))
    if any(p in text for p in _STICKY_PATTERNS):
        return Failure("unexpected", _first_line(exc), fatal=True)
    if isinstance(exc, NotImplementedError) or any(p in text for p in _LIMIT_PATTERNS):
        return Failure("kernel_limit", _first_line(exc))
    tail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-3:])
    return Failure("unexpected", tail.strip()[-1500:])
