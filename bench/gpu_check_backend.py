"""A backend module for gpu_check's illegal_address check: the torch backend, plus one dispatch that
writes through a wild pointer. The pool's worker loads it by module path (`--backend gpu_check_backend`,
with bench/ on PYTHONPATH), as it loads any backend named by a dotted path (backends/__init__.py)."""

from __future__ import annotations

from opcollect.backends.torch import (  # noqa: F401  (the Backend interface, re-exported)
    FRAMEWORK,
    device_sm,
    devices,
    footprint,
    free_memory,
    identity,
    setup_worker,
)
from opcollect.backends.torch import measure as torch_measure

ILLEGAL = "gpu_check.illegal_address"


def measure(op: str, dispatch: str, cases: list, device: str, config):
    if dispatch == ILLEGAL:
        illegal_address(device)
    return torch_measure(op, dispatch, cases, device, config)


def illegal_address(device: str) -> None:
    """Store 4 TiB past a small tensor (Triton), or, without Triton, an out-of-range gather (device assert).

    Either leaves the CUDA context unusable; the synchronize raises, the worker classifies it fatal."""
    import torch

    if not device.startswith("cuda"):  # gpu_check --device cpu rehearses the pool's side of the check
        raise RuntimeError("CUDA error: an illegal memory access was encountered (simulated on the CPU)")
    target = torch.zeros(16, dtype=torch.float32, device=device)
    try:
        from gpu_check_kernels import poke
    except ImportError:
        index = torch.full((1,), 1 << 30, dtype=torch.int64, device=device)
        target[index].sum()
    else:
        poke(target, 1 << 40)
    torch.cuda.synchronize(torch.device(device))
    raise RuntimeError("gpu_check: the wild write did not fault")
