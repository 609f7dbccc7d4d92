"""The host's own figures for the speed-of-light bound on the CPU: a short probe at worker start.

A GPU's figures come from its datasheet (systems/*.yaml); a CPU's vary with the host, its core count and the
threads torch is given, so each CPU worker measures them once, after its threads are set, and the figures go into
its runtime identity (the shard's runtime line, then merge's provenance record; check R8 reads them there).

Measured: torch.matmul throughput per dtype on square operands, best of the calls within a time budget, and
copy bandwidth of a buffer larger than the last-level cache (read plus write bytes per second). Budget: about
PROBE_SECONDS in all. The figures are what torch reached, not the silicon's peak: tables/physics.py allows rows
a headroom over them.

torch is imported inside the function: the runtime imports this module without it.
"""

from __future__ import annotations

import time
from pathlib import Path

PROBE_SECONDS = 0.3  # the whole probe, about: matmul per dtype and the copy share it
MATMUL_SIZE = {"float32": 512, "bfloat16": 512}
COPY_FLOOR_BYTES = 64 * 2**20  # the copy buffer: at least this, and twice the last-level cache
COPY_CEILING_BYTES = 256 * 2**20


CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")  # where Linux lists cpu0's caches, one index* each


def cache_bytes(caches: Path = CACHE_DIR) -> int | None:
    """The largest CPU cache of cpu0 as Linux reports it (``caches``/index*/size, e.g. "32K"), or None."""
    sizes = []
    for entry in caches.glob("index*/size"):
        try:
            text = entry.read_text().strip()
        except OSError:
            continue
        unit = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text[:-1] if text[-1:] in "KMG" else text
        if digits.isdigit():
            sizes.append(int(digits) * unit)
    return max(sizes) if sizes else None


def _best_seconds(call, budget: float, at_least: int = 2) -> float:
    """The fastest of the calls made within ``budget`` seconds (at least ``at_least`` of them), after one warm-up."""
    call()
    best, spent, calls = float("inf"), 0.0, 0
    while calls < at_least or spent < budget:
        start = time.perf_counter()
        call()
        took = time.perf_counter() - start
        best, spent, calls = min(best, took), spent + took, calls + 1
    return best


def host_figures(device: str) -> dict | None:
    """{"dense_tflops": {dtype: TFLOP/s}, "bandwidth_bytes_per_s", "cache_bytes", "threads", "seconds"} of this
    host, or None on a GPU (its figures are the system's datasheet's)."""
    if device.startswith("cuda"):
        return None
    import torch

    began = time.perf_counter()
    share = PROBE_SECONDS / (len(MATMUL_SIZE) + 1)
    tflops = {}
    with torch.inference_mode():
        for name, n in MATMUL_SIZE.items():
            dtype = getattr(torch, name)
            a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
            tflops[name] = 2.0 * n**3 / _best_seconds(lambda a=a, b=b: torch.matmul(a, b), share) / 1e12
        cache = cache_bytes()
        size = min(COPY_CEILING_BYTES, max(COPY_FLOOR_BYTES, 2 * (cache or 0)))
        src = torch.ones(size, dtype=torch.uint8)
        dst = torch.empty_like(src)
        copy = _best_seconds(lambda: dst.copy_(src), share, at_least=1)
    return {
        "dense_tflops": tflops,
        "bandwidth_bytes_per_s": int(2 * size / copy),
        "cache_bytes": cache,
        "threads": torch.get_num_threads(),
        "seconds": round(time.perf_counter() - began, 3),
    }
