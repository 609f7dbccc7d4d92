"""Measuring a prepared case with torch: the CPU path, and the CUDA path with graphs and a cold L2."""

from __future__ import annotations

import math
from functools import partial
from typing import Callable

from opcollect.runtime.contract import Measured, Prepared
from opcollect.runtime.harness import (
    Sampled,
    Stats,
    TimingConfig,
    calls_for,
    measure_cpu,
    sample_until_stable,
    summarize,
    untimed,
)
from opcollect.runtime.observe import observe

# the working set of one graph replay should be at least this many L2 sizes, so inputs come from HBM
L2_MULTIPLE = 3
MAX_ROTATION = 64
GRAPH_SAMPLE_SECONDS = 1e-3  # one graph replay lasts about this long
GRAPH_MAX_CALLS = 256  # captured calls per graph: enough to hide launch gaps, few enough to capture fast
FIRST_CASE_WARMUP_SECONDS = 1.0  # lets clocks ramp before the first case of a worker


def is_cuda(device: str) -> bool:
    return device.startswith("cuda")


def rotation_copies(footprint_bytes: int, l2_bytes: int, free_bytes: int) -> int:
    """Input sets to cycle so that one pass touches >= L2_MULTIPLE x L2, within half the free memory."""
    if footprint_bytes <= 0:
        return 1
    wanted = math.ceil(L2_MULTIPLE * l2_bytes / footprint_bytes)
    affordable = max(1, (free_bytes // 2) // footprint_bytes)
    return max(1, min(wanted, affordable, MAX_ROTATION))


def l2_bytes(device: str) -> int:
    import torch

    props = torch.cuda.get_device_properties(torch.device(device))
    return int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)


def measure(
    prepare: Callable[[int], Prepared], footprint: int, device: str, config: TimingConfig, first_case: bool = False
) -> tuple[Stats, str]:
    """Time one case: ``prepare(copies)`` builds it with that many rotating input sets."""
    import torch

    if not is_cuda(device):
        prepared = prepare(1)
        return measure_cpu(prepared.call, config, threads=torch.get_num_threads()), prepared.kernel_source
    cache = l2_bytes(device)
    copies = rotation_copies(footprint, cache, torch.cuda.mem_get_info(torch.device(device))[0])
    prepared = prepare(copies)
    # rotation keeps the L2 cold when one pass over the copies exceeds it; otherwise flush before each call
    rotates = copies * footprint >= L2_MULTIPLE * cache
    l2 = f"rotate:{copies}" if rotates else "flush"
    return _measure_cuda(prepared, copies, device, config, l2, first_case), prepared.kernel_source


def _measure_cuda(
    prepared: Prepared, copies: int, device: str, config: TimingConfig, l2: str, first_case: bool
) -> Stats:
    import torch

    stream = torch.cuda.Stream(device=device)
    flush = _flush_buffer(device) if l2 == "flush" else None
    with torch.cuda.stream(stream):
        for _ in range(3):  # lazy init, autotuning and allocator growth happen outside the graph
            prepared.call()
        stream.synchronize()
        calls = max(
            copies, min(GRAPH_MAX_CALLS, calls_for(lambda: _synced(prepared.call, stream), GRAPH_SAMPLE_SECONDS))
        )
        if flush is not None:
            calls = 1  # each sample flushes the L2, then times one replay of one captured call
        # a capturable op is always replayed from a graph, so the host gaps between a framework op's kernels
        # stay outside the events in both regimes; only an op whose capture fails is timed eagerly
        graph = _capture(prepared, calls, stream) if prepared.graph_safe else None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    nvml = _Nvml.open(device)

    def sample() -> float | None:
        with torch.cuda.stream(stream):
            if flush is not None:
                flush.zero_()
            start.record(stream)
            if graph is not None:
                graph.replay()
            else:
                for _ in range(calls):
                    prepared.call()
            end.record(stream)
        end.synchronize()
        if nvml is not None and nvml.throttled():
            return None
        return start.elapsed_time(end) / 1e3 / calls

    if first_case:
        warm = TimingConfig(config.max_noise, 1, FIRST_CASE_WARMUP_SECONDS, FIRST_CASE_WARMUP_SECONDS)
        sample_until_stable(sample, warm)
    raw: Sampled = sample_until_stable(sample, config)
    return summarize(
        raw, "graph" if graph is not None else "eager", calls, l2=l2, sm_clock_mhz=nvml.sm_clock() if nvml else None
    )


def _flush_buffer(device: str):
    """A buffer of L2_MULTIPLE x L2 bytes; zeroing it evicts the previous sample's data from the L2."""
    import torch

    return torch.empty(L2_MULTIPLE * l2_bytes(device), dtype=torch.int8, device=device)


def _synced(call: Callable[[], None], stream) -> None:
    call()
    stream.synchronize()


def _capture(prepared: Prepared, calls: int, stream):
    """A CUDA graph of ``calls`` back-to-back calls, or None when the op cannot be captured."""
    import torch

    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(calls):
                prepared.call()
        graph.replay()
        stream.synchronize()
        return graph
    except Exception:  # capture is refused by ops that sync with the host: time them eagerly
        torch.cuda.synchronize()
        return None


class _Nvml:
    """SM clock and throttle reasons through NVML, when pynvml is installed and answers."""

    # reasons that slow the SM below its application clock; idle and the app-clock setting are not
    SLOWDOWN = 0x4 | 0x8 | 0x20 | 0x40 | 0x80  # SW power cap, HW slowdown, SW thermal, HW thermal, HW power brake

    def __init__(self, pynvml, handle):
        self.pynvml, self.handle = pynvml, handle

    @classmethod
    def open(cls, device: str) -> "_Nvml | None":
        try:
            import pynvml
            import torch

            pynvml.nvmlInit()
            index = torch.device(device).index or 0
            return cls(pynvml, pynvml.nvmlDeviceGetHandleByIndex(index))
        except Exception:
            return None

    def throttled(self) -> bool:
        try:
            return bool(self.pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(self.handle) & self.SLOWDOWN)
        except Exception:
            return False

    def sm_clock(self) -> float | None:
        try:
            return float(self.pynvml.nvmlDeviceGetClockInfo(self.handle, self.pynvml.NVML_CLOCK_SM))
        except Exception:
            return None


_measured_cases = 0  # cases this worker has timed: the first one warms the clocks up first


def measure_cases(runner, dispatch: str, cases: list, device: str, config: TimingConfig) -> list[Measured]:
    """Time ``cases`` with a backend's Runner: per case through its prepare, or the whole row at once."""
    global _measured_cases
    if runner.measure_row is not None:
        return runner.measure_row(cases, device, config)
    results = []
    for case in cases:
        if runner.untimed is not None and runner.untimed(case):
            results.append(Measured(untimed(), dispatch))  # the plan holds it at 0: nothing runs, nothing observed
            continue
        built: list[Prepared] = []
        stats, kernel = measure(
            partial(_kept, built, partial(runner.prepare, case, dispatch, device)),
            runner.footprint(case),
            device,
            config,
            first_case=_measured_cases == 0,
        )
        _measured_cases += 1
        # one more call, after the samples so the profiler cannot touch them: what it launched (runtime/observe.py)
        results.append(Measured(stats, kernel, observed=observe(built[-1].call, device)))
        del built
        if is_cuda(device):
            import torch

            # the caching allocator keeps this case's blocks; the next capacity check must see them free
            torch.cuda.empty_cache()
    return results


def _kept(built: list, prepare: Callable[[int], Prepared], copies: int) -> Prepared:
    """``prepare(copies)``, kept in ``built`` so the case can be observed after measure() timed it."""
    built.append(prepare(copies))
    return built[-1]


def random_tensor(shape, dtype, device: str, generator_seed: int = 0):
    """Deterministic random data in ``dtype`` (fp8 is drawn in bf16 and converted)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(generator_seed)
    draw = torch.bfloat16 if dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else dtype
    if is_cuda(device):
        out = torch.randn(shape, dtype=draw, device=device, generator=gen)
    else:  # uniform is several times faster than normal on the CPU
        out = torch.rand(shape, dtype=draw, device=device, generator=gen).sub_(0.5)
    return out.to(dtype) if draw != dtype else out
