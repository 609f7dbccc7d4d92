"""Sampling and the stopping rule, shared by the CPU, CUDA and multi-rank paths.

A path supplies ``sample()``: the seconds of one call, however it measures them (perf_counter_ns
around K calls, CUDA events around a graph replay of K calls, the max over ranks). ``measure`` warms up
by time, then samples until the relative IQR is at most ``max_noise`` after ``min_samples`` samples, or
until ``max_case_seconds`` have passed. It reports the median as latency, in milliseconds.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace
from typing import Callable, Literal

# how a row was timed; "none": not run, a case the plan holds at latency 0 (untimed(), OpPlan.zero_latency)
Timing = Literal["graph", "eager", "cpu", "none"]
CAP_MIN_SAMPLES = 3
HARD_CAP_FACTOR = 4.0


@dataclass(frozen=True)
class TimingConfig:
    max_noise: float = 0.01  # relative IQR, (p75 - p25) / median
    min_samples: int = 10
    max_case_seconds: float = 1.0
    warmup_seconds: float = 0.1

    @staticmethod
    def for_device(
        kind: str, max_noise: float | None = None, min_samples: int | None = None, max_case_seconds: float | None = None
    ) -> "TimingConfig":
        """Defaults per device kind: a CPU case is kept short so a CPU collection ends in minutes."""
        base = (
            TimingConfig(min_samples=5, max_case_seconds=0.25, warmup_seconds=0.002)
            if kind == "cpu"
            else TimingConfig()
        )
        return TimingConfig(
            max_noise=base.max_noise if max_noise is None else max_noise,
            min_samples=base.min_samples if min_samples is None else min_samples,
            max_case_seconds=base.max_case_seconds if max_case_seconds is None else max_case_seconds,
            warmup_seconds=base.warmup_seconds,
        )


@dataclass(frozen=True)
class Stats:
    latency: float  # median, ms
    latency_p25: float
    latency_p75: float
    samples: int
    noise: float  # relative IQR
    timing: Timing
    calls_per_sample: int
    sampled_seconds: float  # time spent inside timed samples
    warmup_seconds: float
    l2: str = "warm"  # how the inputs meet the cache: warm, rotate:<copies>, flush
    threads: int | None = None
    sm_clock_mhz: float | None = None
    throttled_dropped: int = 0


def untimed() -> Stats:
    """The Stats of a case written without running it: one the plan holds at latency exactly 0 (OpPlan.zero_latency,
    e.g. a top-k that keeps every entry, whose reference row is 0: plans/dsv4_kernels.py trivial_topk). Latency and
    its quartiles 0, no sample, timing "none": the value rules admit it on such a case alone (tables/values.py)."""
    return Stats(0.0, 0.0, 0.0, 0, 0.0, "none", 0, 0.0, 0.0, l2="none")


def difference(minuend: Stats, subtrahend: Stats) -> Stats:
    """The Stats of (minuend - subtrahend), two timings taken in the same row (compute_scale: a dynamic FP8 quant
    less the static one, as the reference collector defines it).

    latency is max(0, the medians' difference), the reference's quantity: where the minuend is no slower, the
    difference is nothing measurable and the row says 0 (tables/values.py admits 0 for such ops). p25 and p75 are
    the widest difference the two interquartile ranges allow, clipped so 0 <= p25 <= latency <= p75 always holds.
    noise is (p75 - p25) relative to the minuend's median, the time actually measured, not to the difference: it
    stays finite when the difference is 0 and says how wide the spread is against what was timed. samples is the
    fewer of the two (each median rests on at least that many); seconds and drops are summed, the clocks averaged,
    and the timing and L2 regime kept where the two agree.
    """
    latency = max(0.0, minuend.latency - subtrahend.latency)
    p25 = min(max(0.0, minuend.latency_p25 - subtrahend.latency_p75), latency)
    p75 = max(minuend.latency_p75 - subtrahend.latency_p25, latency)
    clocks = [s.sm_clock_mhz for s in (minuend, subtrahend) if s.sm_clock_mhz is not None]
    return replace(
        minuend,
        latency=latency,
        latency_p25=p25,
        latency_p75=p75,
        samples=min(minuend.samples, subtrahend.samples),
        noise=(p75 - p25) / minuend.latency if minuend.latency > 0 else float("inf"),
        timing=minuend.timing if minuend.timing == subtrahend.timing else "eager",
        calls_per_sample=min(minuend.calls_per_sample, subtrahend.calls_per_sample),
        sampled_seconds=minuend.sampled_seconds + subtrahend.sampled_seconds,
        warmup_seconds=minuend.warmup_seconds + subtrahend.warmup_seconds,
        l2=minuend.l2 if minuend.l2 == subtrahend.l2 else f"{minuend.l2},{subtrahend.l2}",
        sm_clock_mhz=sum(clocks) / len(clocks) if clocks else None,
        throttled_dropped=minuend.throttled_dropped + subtrahend.throttled_dropped,
    )


def quartiles(samples: list[float]) -> tuple[float, float, float]:
    """p25, median and p75 by linear interpolation between closest ranks (numpy's default)."""
    if len(samples) == 1:
        return samples[0], samples[0], samples[0]
    p25, median, p75 = statistics.quantiles(samples, n=4, method="inclusive")
    return p25, median, p75


def relative_iqr(samples: list[float]) -> float:
    p25, median, p75 = quartiles(samples)
    return (p75 - p25) / median if median > 0 else float("inf")


@dataclass(frozen=True)
class Sampled:
    """Raw outcome of the stopping rule, before a path adds what it knows (timing, L2, clocks)."""

    samples: list[float]  # seconds per call
    sampled_seconds: float
    warmup_seconds: float
    dropped: int


def sample_until_stable(
    sample: Callable[[], float | None],
    config: TimingConfig,
    clock: Callable[[], float] = time.perf_counter,
) -> Sampled:
    """Warm up for ``warmup_seconds`` (at least one call), then apply the stopping rule.

    ``sample`` returns the seconds of one call, or None for a sample to drop (e.g. taken while the GPU
    throttled); dropped samples are counted and do not enter the statistics.
    """
    start = clock()
    sample()
    while clock() - start < config.warmup_seconds:
        sample()
    warm = clock() - start
    kept: list[float] = []
    dropped = 0
    inside = 0.0
    began = clock()
    next_check = config.min_samples
    while True:
        value = sample()
        if value is None:
            dropped += 1
        else:
            kept.append(value)
            inside += value
        n = len(kept)
        if n >= next_check:
            if relative_iqr(kept) <= config.max_noise:
                break
            next_check = n + max(1, n // 8)  # re-check at growing intervals: sorting is O(n log n)
        spent = clock() - began
        # the cap needs a few samples, so one hiccup cannot become the median; 4x the cap ends any case
        if (spent >= config.max_case_seconds and n >= min(CAP_MIN_SAMPLES, config.min_samples)) or (
            spent >= HARD_CAP_FACTOR * config.max_case_seconds and n >= 1
        ):
            break
        if dropped > 10 * max(n, config.min_samples):
            break
    return Sampled(kept, inside, warm, dropped)


def summarize(raw: Sampled, timing: Timing, calls_per_sample: int, **extra) -> Stats:
    if not raw.samples:
        raise RuntimeError(f"no usable sample: {raw.dropped} dropped")
    p25, median, p75 = quartiles(raw.samples)
    return Stats(
        latency=median * 1e3,
        latency_p25=p25 * 1e3,
        latency_p75=p75 * 1e3,
        samples=len(raw.samples),
        noise=(p75 - p25) / median if median > 0 else float("inf"),
        timing=timing,
        calls_per_sample=calls_per_sample,
        sampled_seconds=raw.sampled_seconds,
        warmup_seconds=raw.warmup_seconds,
        throttled_dropped=raw.dropped,
        **extra,
    )


def calls_for(call: Callable[[], None], target_seconds: float, clock=time.perf_counter) -> int:
    """How many back-to-back calls make one sample last about ``target_seconds`` (at least 1).

    The first call pays one-time costs (allocation, kernel selection); the estimate uses the next ones.
    """
    call()
    once = float("inf")
    for _ in range(3):
        start = clock()
        call()
        once = min(once, clock() - start)
        if once > target_seconds:
            break
    return max(1, min(10_000, int(target_seconds / max(once, 1e-7))))


def measure_cpu(
    call: Callable[[], None], config: TimingConfig, threads: int, sample_target_seconds: float = 2e-4
) -> Stats:
    """CPU path: perf_counter_ns around K back-to-back calls, K sized so a sample lasts ~0.2 ms."""
    calls = calls_for(call, sample_target_seconds)
    now = time.perf_counter_ns

    def sample() -> float:
        start = now()
        for _ in range(calls):
            call()
        return (now() - start) / 1e9 / calls

    raw = sample_until_stable(sample, config)
    # sampled_seconds counts every call inside the timed samples
    raw = Sampled(raw.samples, raw.sampled_seconds * calls, raw.warmup_seconds, raw.dropped)
    return summarize(raw, "cpu", calls, threads=threads)
