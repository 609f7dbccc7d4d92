"""What the torch references of the module tables share (dsa.py, dsv4.py, msa.py): the dtypes they admit, the
chunking that bounds their intermediates, and the RMS norm their projections use. torch is imported inside the
functions that compute, so planning can import the modules that name these."""

from __future__ import annotations

from opcollect.runtime.contract import KernelLimit

CHUNK_ELEMENTS = 2**24  # the largest per-chunk intermediate (scores, gathered KV), in elements
EPS = 1e-6  # rms_norm_eps: the collectors set 1e-6 (collector/vllm/collect_dsv4_attn.py:134-136)


def admitted_dtype(name: str, dtypes: tuple[str, ...], what: str):
    """The torch dtype ``name``, or KernelLimit when the ``what`` reference does not compute in it."""
    import torch

    if name not in dtypes:
        raise KernelLimit(f"the torch {what} reference computes in {'/'.join(dtypes)}, not {name}")
    return getattr(torch, name)


def element_bytes(name: str) -> int:
    return 4 if name == "float32" else 2


def chunk(total: int, per_row: int) -> int:
    """Rows per chunk so that one chunk's intermediate stays within CHUNK_ELEMENTS."""
    return max(1, min(total, CHUNK_ELEMENTS // max(1, per_row)))


def rms_norm(x, weight=None, eps: float = EPS):
    import torch

    xf = x.float()
    out = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    return (out if weight is None else out * weight.float()).to(x.dtype)
