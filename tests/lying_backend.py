"""A test backend whose label lies about what ran, and is the torch backend otherwise.

A GEMM case with k=LIAR runs torch.bmm through the real harness (runtime/timing.py measure_cases, so the profiler
observes it as any case) but reports the label torch.nn.functional.linear: its observed ATen ops contradict its
label. It stands in for a torch plan's backend with `run --test-backend lying_backend`; tests put this directory on
PYTHONPATH.
"""

from __future__ import annotations

import opcollect.backends.torch as torch_backend
from opcollect.runtime import timing
from opcollect.runtime.contract import Prepared, Runner

LIAR = 17

identity = torch_backend.identity
setup_worker = torch_backend.setup_worker
free_memory = torch_backend.free_memory
devices = torch_backend.devices
device_sm = torch_backend.device_sm
footprint = torch_backend.footprint


def _bmm_labelled_linear(case, dispatch: str, device: str, copies: int) -> Prepared:
    import torch

    a = torch.rand((2, case.m, case.k), device=device)
    b = torch.rand((2, case.k, case.n), device=device)
    return Prepared(lambda: torch.bmm(a, b), "torch.nn.functional.linear")


LYING = Runner(lambda case: 0, _bmm_labelled_linear)


def measure(op, dispatch, cases, device, config):
    if op == "gemm" and any(case.k == LIAR for case in cases):
        return timing.measure_cases(LYING, dispatch, cases, device, config)
    return torch_backend.measure(op, dispatch, cases, device, config)
