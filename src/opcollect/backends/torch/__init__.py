"""The plain-PyTorch backend: PyTorch's own kernels, on a GPU or the CPU. The embedded default."""

from __future__ import annotations

import os
import platform
from functools import partial

from opcollect.backends.torch import attention, comm, gemm, mla, moe, timing
from opcollect.runtime.contract import KernelLimit, Measured
from opcollect.runtime.harness import TimingConfig

FRAMEWORK = "torch"


def identity(device: str) -> dict:
    import torch

    cuda = timing.is_cuda(device)
    name = torch.cuda.get_device_name(torch.device(device)) if cuda else (platform.processor() or "cpu")
    return {
        "framework": FRAMEWORK,
        "version": torch.__version__.split("+")[0],
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "driver": _driver() if cuda else None,
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


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def setup_worker(device: str, threads: int | None) -> None:
    import torch

    if timing.is_cuda(device):
        torch.cuda.set_device(torch.device(device))
    elif threads:
        torch.set_num_threads(threads)


def free_memory(device: str) -> int:
    if timing.is_cuda(device):
        import torch

        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


# per op: the bytes one measurement allocates, and the runner that prepares it for a number of input copies
RUNNERS = {
    "gemm": (gemm.footprint, gemm.prepare),
    "attention_context": (partial(attention.footprint, context=True), partial(attention.prepare, context=True)),
    "attention_generation": (partial(attention.footprint, context=False), partial(attention.prepare, context=False)),
    "moe": (moe.footprint, moe.prepare),
    "mla_context": (partial(mla.footprint, context=True), partial(mla.prepare, context=True)),
    "mla_generation": (partial(mla.footprint, context=False), partial(mla.prepare, context=False)),
    "comm": (comm.footprint, None),  # timed a whole row at a time by comm.measure_row
}


def _runner(op: str):
    if op not in RUNNERS:
        raise KernelLimit(f"the torch backend has no runner for op {op!r}")
    return RUNNERS[op]


def footprint(op: str, case) -> int:
    return _runner(op)[0](case)


_measured_cases = 0


def measure(op: str, dispatch: str, cases: list, device: str, config: TimingConfig) -> list[Measured]:
    global _measured_cases
    if op == "comm":
        return comm.measure_row(cases, device, config)
    results = []
    for case in cases:
        size, prepare = _runner(op)
        stats, kernel = timing.measure(
            partial(prepare, case, dispatch, device), size(case), device, config, first_case=_measured_cases == 0
        )
        _measured_cases += 1
        results.append(Measured(stats, kernel))
        if timing.is_cuda(device):
            import torch

            # the caching allocator keeps this case's blocks; the next capacity check must see them free
            torch.cuda.empty_cache()
    return results


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
    return ["cpu"] * (workers or 1)


def device_sm(device: str) -> str:
    if not timing.is_cuda(device):
        return "cpu"
    import torch

    major, minor = torch.cuda.get_device_capability(torch.device(device))
    return f"{major}{minor}"
