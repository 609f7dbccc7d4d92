"""The devices a worker runs on, as every backend sees them through torch: which to start workers on, their
SM, free memory, and the probe of the runtime (python, torch, CUDA, driver, NCCL, device name).

torch is imported inside the functions: the runtime imports this module without it.
"""

from __future__ import annotations

import os
import platform
import sys

from opcollect.runtime.contract import KernelLimit
from opcollect.runtime.timing import is_cuda


def probe(device: str) -> dict:
    """The framework-independent part of a worker's identity."""
    import torch

    cuda = is_cuda(device)
    name = torch.cuda.get_device_name(torch.device(device)) if cuda else (platform.processor() or "cpu")
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "driver": _driver() if cuda else None,
        # on the CPU the collectives run on gloo: TABLES keeps its nccl_perf under this name
        "nccl_version": _nccl_version() if cuda else f"gloo-{torch.__version__.split('+')[0]}",
        "device": name if cuda else "cpu",
        "device_detail": None if cuda else _cpu_model(),
    }


def _nccl_version() -> str | None:
    """The NCCL torch.distributed runs, e.g. '2.26.2' (TABLES keeps nccl_perf under that version)."""
    import torch

    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None
    return ".".join(str(part) for part in version) if isinstance(version, tuple) else str(version)


def _driver() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else version
    except Exception:
        return None


CPUINFO = "/proc/cpuinfo"


def _cpu_model(cpuinfo: str = CPUINFO) -> str:
    """The CPU's model name as Linux reports it ("model name\t: <name>"), else the platform's word for it."""
    try:
        with open(cpuinfo) as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def setup_worker(device: str, threads: int | None) -> None:
    import torch

    if is_cuda(device):
        torch.cuda.set_device(torch.device(device))
    elif threads:
        torch.set_num_threads(threads)


def free_memory(device: str) -> int:
    if is_cuda(device):
        import torch

        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def devices(requested: str, workers: int | None) -> list[str]:
    """The devices to start one worker on each: every visible GPU for cuda, ``workers`` slots for cpu."""
    import torch

    kind = requested
    if requested == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cuda":
        count = torch.cuda.device_count()
        if count == 0:
            raise KernelLimit("--device cuda: no CUDA device answers; use --device cpu")
        return [f"cuda:{i}" for i in range(min(count, workers or count))]
    cores = cpu_cores()
    if workers is not None and workers > cores:
        # more CPU workers than cores only time each other's contention; each worker gets cores // workers threads
        print(f"--workers {workers}: this machine has {cores} cores; running {cores} CPU workers", file=sys.stderr)
        workers = cores
    return ["cpu"] * (workers or 1)


def cpu_cores() -> int:
    """The cores this process may run on (its affinity, which a container's cpuset narrows), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity on this platform
        return max(1, os.cpu_count() or 1)


def device_sm(device: str) -> str:
    if not is_cuda(device):
        return "cpu"
    import torch

    major, minor = torch.cuda.get_device_capability(torch.device(device))
    return f"{major}{minor}"
