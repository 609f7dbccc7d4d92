"""A torch-free test backend: its workers start at once and answer fixed statistics.

By the GEMM case's k: 12 hangs, 15 raises a sticky CUDA error (the worker must be replaced), 16 raises a
CUDA out-of-memory error (the worker goes on), 20 takes SLOW_SECONDS; a comm case takes SLOW_SECONDS too. A slow
case's kernel_source carries the wall-clock interval it ran in ("light:<pid>:<start>:<end>"). Loaded by workers
as a dotted module path; tests put this directory on PYTHONPATH.
"""

from __future__ import annotations

import os
import platform
import time

from opcollect.runtime.contract import Measured
from opcollect.runtime.harness import Stats

HANG, STICKY, OOM, SLOW = 12, 15, 16, 20
SLOW_SECONDS = 0.4


def identity(device):
    return {
        "framework": "light",
        "version": "0.0",
        "python": platform.python_version(),
        "torch": None,
        "cuda": None,
        "driver": None,
        "nccl_version": None,
        "device": "cpu",
        "pid": os.getpid(),
    }


def setup_worker(device, threads):
    pass


def free_memory(device):
    return 2**40


def footprint(op, case):
    return 1024


def devices(kind, workers):
    return ["cpu"] * (workers or 1)


def device_sm(device):
    return "cpu"


def measure(op, dispatch, cases, device, config):
    found = []
    for case in cases:
        if op == "gemm" and case.k == HANG:
            time.sleep(3600)
        if op == "gemm" and case.k == STICKY:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        if op == "gemm" and case.k == OOM:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        stats = Stats(1.0, 0.9, 1.1, 5, 0.2, "cpu", 1, 0.01, 0.0, threads=1)
        if op == "comm" or (op == "gemm" and case.k == SLOW):
            start = time.time()
            time.sleep(SLOW_SECONDS)
            found.append(Measured(stats, f"light:{os.getpid()}:{start}:{time.time()}"))
            continue
        found.append(Measured(stats, f"light:{os.getpid()}"))
    return found
