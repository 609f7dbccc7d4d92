"""The stopping rule and statistics of the timing harness, on synthetic and real samples."""

from __future__ import annotations

import itertools
from dataclasses import astuple

import pytest

from opcollect.runtime.harness import TimingConfig, measure_cpu, quartiles, relative_iqr, sample_until_stable, summarize


class FakeClock:
    """Advances by what each sample reports, so time-based rules are exact."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def feeder(values, clock):
    it = itertools.cycle(values) if isinstance(values, list) else values

    def sample():
        value = next(it)
        clock.now += value if value is not None else 1e-3
        return value

    return sample


def test_quartiles_interpolate_between_closest_ranks():
    data = [5.0, 1.0, 4.0, 2.0, 3.0, 9.0, 7.0]  # sorted: 1 2 3 4 5 7 9
    assert quartiles(data) == (2.5, 4.0, 6.0)  # numpy's default: positions 1.5, 3 and 4.5
    assert quartiles([3.0]) == (3.0, 3.0, 3.0)


def test_stops_at_min_samples_when_quiet():
    clock = FakeClock()
    config = TimingConfig(max_noise=0.01, min_samples=10, max_case_seconds=100, warmup_seconds=0)
    raw = sample_until_stable(feeder([1e-3], clock), config, clock)
    assert len(raw.samples) == 10


def test_noisy_samples_run_until_the_time_cap():
    clock = FakeClock()
    config = TimingConfig(max_noise=0.01, min_samples=5, max_case_seconds=0.5, warmup_seconds=0)
    raw = sample_until_stable(feeder([1e-3, 2e-3, 3e-3, 4e-3], clock), config, clock)
    assert 0.5 <= raw.sampled_seconds <= 0.51
    assert relative_iqr(raw.samples) > 0.01


def test_one_slow_sample_does_not_end_a_case():
    clock = FakeClock()
    config = TimingConfig(max_noise=0.01, min_samples=5, max_case_seconds=0.25, warmup_seconds=0)
    raw = sample_until_stable(feeder(iter([0.6] + [2e-3] * 1000), clock), config, clock)
    assert len(raw.samples) >= 3 and sorted(raw.samples)[len(raw.samples) // 2] == 2e-3


def test_a_slow_case_stops_at_four_times_the_cap():
    clock = FakeClock()
    config = TimingConfig(max_noise=0.01, min_samples=5, max_case_seconds=0.25, warmup_seconds=0)
    raw = sample_until_stable(feeder([0.6, 0.9], clock), config, clock)
    assert len(raw.samples) == 2 and raw.sampled_seconds == 1.5


def test_noise_settles_after_outliers():
    clock = FakeClock()
    values = [5e-3, 9e-3, 2e-3] + [1e-3] * 100
    config = TimingConfig(max_noise=0.01, min_samples=5, max_case_seconds=100, warmup_seconds=0)
    raw = sample_until_stable(feeder(iter(values), clock), config, clock)
    assert relative_iqr(raw.samples) <= 0.01 and len(raw.samples) < 40


def test_warmup_is_by_time_and_outside_the_samples():
    clock = FakeClock()
    config = TimingConfig(max_noise=0.5, min_samples=3, max_case_seconds=10, warmup_seconds=0.05)
    raw = sample_until_stable(feeder([1e-2], clock), config, clock)
    assert raw.warmup_seconds == pytest.approx(0.05, abs=0.011)
    assert len(raw.samples) == 3


def test_dropped_samples_are_counted_not_used():
    clock = FakeClock()
    config = TimingConfig(max_noise=0.01, min_samples=4, max_case_seconds=100, warmup_seconds=0)
    raw = sample_until_stable(feeder([1e-3, None], clock), config, clock)
    assert raw.dropped >= 3 and None not in raw.samples
    stats = summarize(raw, "graph", 7, l2="rotate:4")
    assert stats.throttled_dropped == raw.dropped and stats.calls_per_sample == 7 and stats.l2 == "rotate:4"
    assert stats.latency == pytest.approx(1.0) and stats.latency_p25 <= stats.latency <= stats.latency_p75


def test_samples_dropped_before_the_first_kept_one_do_not_end_the_case():
    """A GPU throttled as the case starts drops its first samples: the case waits for kept ones, and gives up only
    after ten times min_samples drops with nothing kept."""
    clock = FakeClock()
    config = TimingConfig(max_noise=0.01, min_samples=4, max_case_seconds=100, warmup_seconds=0)
    # the warm-up call takes the first of six throttled samples
    raw = sample_until_stable(feeder(iter([None] * 6 + [1e-3] * 100), clock), config, clock)
    assert raw.dropped == 5 and raw.samples == [1e-3] * 4
    never = sample_until_stable(feeder([None], clock), config, clock)
    assert never.samples == [] and never.dropped == 41


def test_cpu_path_times_a_real_call():
    import time

    def busy():
        end = time.perf_counter() + 2e-4
        while time.perf_counter() < end:
            pass

    stats = measure_cpu(busy, TimingConfig(max_noise=0.05, min_samples=5, max_case_seconds=0.3, warmup_seconds=0.01), 1)
    assert stats.timing == "cpu" and stats.threads == 1
    assert 0.19 <= stats.latency <= 0.5  # ms
    assert stats.latency_p25 <= stats.latency <= stats.latency_p75


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
def test_each_flag_given_is_kept_as_given_zero_too_and_the_rest_are_the_devices_defaults(kind):
    default = TimingConfig.for_device(kind)
    assert TimingConfig.for_device(kind, max_noise=0.0) == TimingConfig(0.0, *astuple(default)[1:])
    assert default.max_noise > 0
    given = TimingConfig.for_device(kind, max_noise=0.2, min_samples=default.min_samples + 7, max_case_seconds=0.125)
    assert (given.max_noise, given.min_samples, given.max_case_seconds) == (0.2, default.min_samples + 7, 0.125)
    assert given.warmup_seconds == default.warmup_seconds
    assert (default.min_samples, default.max_case_seconds) == ((5, 0.25) if kind == "cpu" else (10, 1.0))


@pytest.mark.parametrize("min_samples, stops_at", [(10, 3), (2, 2)])
def test_the_time_cap_waits_for_its_minimum_sample_count(min_samples, stops_at):
    # noisy samples of 0.2 s against a cap of 0.25 s: the cap is passed at the 2nd sample, and the case ends at
    # the smaller of 3 samples and min_samples (well before 4x the cap)
    clock = FakeClock()
    config = TimingConfig(max_noise=0.0001, min_samples=min_samples, max_case_seconds=0.25, warmup_seconds=0)
    raw = sample_until_stable(feeder([0.2, 0.21], clock), config, clock)
    assert len(raw.samples) == stops_at


def test_a_median_of_0_is_unusable_not_perfectly_stable():
    assert relative_iqr([0.0] * 7) == float("inf")
    clock = FakeClock()
    config = TimingConfig(max_noise=0.01, min_samples=5, max_case_seconds=0.1, warmup_seconds=0)

    def zero() -> float:
        clock.now += 1e-3
        return 0.0

    raw = sample_until_stable(zero, config, clock)
    assert len(raw.samples) > 5  # the noise check never passed: sampling ran to the time cap


def test_a_batched_rows_deadline_is_scaled_by_its_cases(tmp_path, monkeypatch):
    """A row of 4 cases of 0.4 s each, with a case timeout of 0.8 s: 1.6 s in all, within 4 x 0.8 s."""
    import os

    from conftest import TESTS
    from light_backend import SLOW, SLOW_SECONDS

    from opcollect.runtime.pool import Pool, Task

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, (str(TESTS), os.environ.get("PYTHONPATH")))))
    monkeypatch.syspath_prepend(str(TESTS))
    ids = tuple(f"gemm:float32:m={m},n=8,k={SLOW}" for m in (1, 2, 3, 4))
    cases = tuple({"gemm_dtype": "float32", "m": m, "n": 8, "k": SLOW} for m in (1, 2, 3, 4))
    answered = []
    timeout = 2 * SLOW_SECONDS
    pool = Pool("light_backend", ["cpu"], None, TimingConfig(), timeout, tmp_path, lambda w, t, r: answered.extend(r))
    pool.run([Task("row", "gemm", "x", ids, cases, 1)])
    assert [r["status"] for r in answered] == ["ok"] * 4, answered
