"""The plain-PyTorch backend: PyTorch's own kernels, on a GPU or the CPU. The embedded default."""

from __future__ import annotations

import os
import platform
from functools import partial

from opcollect.backends.torch import attention, comm, gemm, mla, moe
from opcollect.runtime import timing
from opcollect.runtime.contract import ANY_DISPATCH, KernelLimit, Measured, Registry, Runner
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


RUNNERS = Registry(FRAMEWORK)
# one runner per op serves every dispatch a torch plan emits: each runner reads the dispatch itself
RUNNERS.add("gemm", Runner(gemm.footprint, gemm.prepare))
for _context, _suffix in ((True, "context"), (False, "generation")):
    RUNNERS.add(
        f"attention_{_suffix}",
        Runner(partial(attention.footprint, context=_context), partial(attention.prepare, context=_context)),
    )
    RUNNERS.add(
        f"mla_{_suffix}", Runner(partial(mla.footprint, context=_context), partial(mla.prepare, context=_context))
    )
RUNNERS.add("moe", Runner(moe.footprint, moe.prepare))
RUNNERS.add("comm", Runner(comm.footprint, measure_row=comm.measure_row))  # one process group times a whole row


def footprint(op: str, case) -> int:
    return RUNNERS.find(op, ANY_DISPATCH).footprint(case)


_measured_cases = 0


def measure(op: str, dispatch: str, cases: list, device: str, config: TimingConfig) -> list[Measured]:
    global _measured_cases
    runner = RUNNERS.find(op, dispatch)
    if runner.measure_row is not None:
        return runner.measure_row(cases, device, config)
    results = []
    for case in cases:
        stats, kernel = timing.measure(
            partial(runner.prepare, case, dispatch, device),
            runner.footprint(case),
            device,
            config,
            first_case=_measured_cases == 0,
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
