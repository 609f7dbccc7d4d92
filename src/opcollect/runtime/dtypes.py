"""Bytes per element of the dtypes cases name: shared by the planner (costs) and every backend."""

from __future__ import annotations

from math import prod

ELEMENT_BYTES = {"half": 2, "bfloat16": 2, "float32": 4, "int8": 1, "fp8": 1}


def message_bytes(dtype: str, message_size: int) -> int:
    """Bytes of a message of ``message_size`` elements of ``dtype``."""
    return message_size * ELEMENT_BYTES[dtype]


def ceil_div(a: int, b: int) -> int:
    """Blocks of ``b`` that hold ``a`` (scale tensors of block-quantized weights, pages of a cache)."""
    return -(-a // b)


# bytes per element of the torch dtypes a runner's layout names its tensors in (names without "torch.")
TENSOR_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1, "int64": 8, "int32": 4, "int8": 1,
                "uint8": 1}  # fmt: skip


def tensor_bytes(specs) -> int:
    """Bytes of the tensors ``specs`` names, each a (name, shape, torch dtype name) as the runners' layouts hold."""
    return sum(prod(shape) * TENSOR_BYTES[dtype] for _, shape, dtype in specs)
