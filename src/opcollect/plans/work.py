"""The least work an op's case must do: its FLOPs at each tensor-core rate, the bytes it must move at least once
from memory, and the bytes each GPU must send over its link. Each op's plan module writes its own formula beside
its case type (OpPlan.work); tables/physics.py turns a Work into the speed-of-light time of a system.

Every figure here is a LOWER bound on what any implementation must do: operands and results cross memory once
(no re-reads, no scale factors, no workspace), the cheapest legal algorithm is counted (e.g. a causal mask's
half), and where the plan cannot know a count exactly (routed tokens under a power law) the smallest it can be is
taken. A bound built from them can be loose, never too tight.
"""

from __future__ import annotations

from typing import Literal, Mapping, NamedTuple

# the tensor-core rates a system lists (systems/*.yaml dense_tflops); a dtype maps to the rate it computes at
Peak = Literal["float32", "bfloat16", "fp8", "int8", "nvfp4"]


class Work(NamedTuple):
    flops: Mapping[Peak | None, float]  # FLOPs by the rate they run at; None: a rate the plan cannot name
    bytes: float  # bytes that must cross memory at least once
    link_bytes: float = 0.0  # bytes each GPU must send one way over its link (collectives)
    gpus: int = 1  # GPUs the op spans: within an NVLink domain, a node, or across the network


class Format(NamedTuple):
    """How a dtype label stores and computes: bytes per activation and per weight element, and its rate."""

    act: float
    weight: float
    peak: Peak | None


# dtype labels of the plans and of the reference tables. Block and group scales are left out (lower bound);
# weight-only formats compute at the activations' bf16 rate, W4A8 at fp8's.
FORMATS: dict[str, Format] = {
    "float32": Format(4, 4, "float32"),
    "bfloat16": Format(2, 2, "bfloat16"),
    "float16": Format(2, 2, "bfloat16"),
    "half": Format(2, 2, "bfloat16"),  # nccl-tests' name for float16
    "fp8": Format(1, 1, "fp8"),
    "fp8_block": Format(1, 1, "fp8"),
    "int8": Format(1, 1, "int8"),
    "nvfp4": Format(0.5, 0.5, "nvfp4"),
    "int4_wo": Format(2, 0.5, "bfloat16"),
    "w4a16_mxfp4": Format(2, 0.5, "bfloat16"),
    "w4a8_mxfp4_mxfp8": Format(1, 0.5, "fp8"),
}
# a label this table does not know: the smallest element and no rate (physics takes the system's highest)
UNKNOWN = Format(0.5, 0.5, None)


def format_of(dtype: str) -> Format:
    return FORMATS.get(dtype, UNKNOWN)


def causal_pairs(queries: int, prefix: int, window: int) -> int:
    """(query, key) pairs a causal mask keeps when ``queries`` new tokens follow ``prefix`` cached ones: query i
    (1-based) sees prefix + i keys, at most ``window`` of them (0: no window)."""
    full = queries * prefix + queries * (queries + 1) // 2
    if not window or window >= prefix + queries:
        return full
    below = max(0, min(queries, window - prefix))  # queries whose span is still under the window
    return below * prefix + below * (below + 1) // 2 + (queries - below) * window
