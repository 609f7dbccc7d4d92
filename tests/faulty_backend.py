"""A test backend that misbehaves on purpose, by the GEMM case's k, and is the torch backend otherwise.

k=11 segfaults, k=12 hangs, k=13 raises, k=14 needs a petabyte (refused by the real capacity check),
k=15 raises a sticky CUDA error (the worker must be replaced). It stands in for a torch plan's backend with
`run --test-backend faulty_backend` (a plan names no module); tests put this directory on PYTHONPATH.
"""

from __future__ import annotations

import ctypes
import time

import opcollect.backends.torch as torch_backend

SEGFAULT, HANG, RAISE, HUGE, STICKY = 11, 12, 13, 14, 15

identity = torch_backend.identity
setup_worker = torch_backend.setup_worker
free_memory = torch_backend.free_memory
devices = torch_backend.devices
device_sm = torch_backend.device_sm


def footprint(op, case):
    if op == "gemm" and case.k == HUGE:
        return 2**50
    return torch_backend.footprint(op, case)


def measure(op, dispatch, cases, device, config):
    for case in cases:
        if op == "gemm" and case.k == SEGFAULT:
            ctypes.string_at(0)  # a real SIGSEGV
        if op == "gemm" and case.k == HANG:
            time.sleep(3600)
        if op == "gemm" and case.k == RAISE:
            raise ValueError("boom from the faulty backend")
        if op == "gemm" and case.k == STICKY:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
    return torch_backend.measure(op, dispatch, cases, device, config)
