"""Bytes per element of the dtypes cases name: shared by the planner (costs) and every backend."""

from __future__ import annotations

ELEMENT_BYTES = {"half": 2, "bfloat16": 2, "float32": 4, "int8": 1, "fp8": 1}


def message_bytes(dtype: str, message_size: int) -> int:
    """Bytes of a message of ``message_size`` elements of ``dtype``."""
    return message_size * ELEMENT_BYTES[dtype]


def ceil_div(a: int, b: int) -> int:
    """Blocks of ``b`` that hold ``a`` (scale tensors of block-quantized weights, pages of a cache)."""
    return -(-a // b)
