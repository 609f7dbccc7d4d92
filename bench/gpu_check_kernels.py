"""A Triton kernel for gpu_check's illegal_address check, in its own module: Triton resolves the names a
kernel uses from its module's globals, and only the GPU worker imports this module."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _store_at(ptr, offset):
    tl.store(ptr + offset, 1.0)


def poke(tensor, offset: int) -> None:
    """Write 1.0 ``offset`` elements past the start of ``tensor`` (an offset far outside any mapping faults)."""
    _store_at[(1,)](tensor, offset)
