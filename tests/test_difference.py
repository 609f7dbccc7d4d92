"""runtime/harness.py difference(): the Stats of a latency that is a difference of two timings taken in one row
(compute_scale: a dynamic FP8 quant less the static one), the rule every quantize runner reports by.

latency = max(0, median difference), the reference collector's quantity; p25/p75 the widest difference the two
interquartile ranges allow, clipped so 0 <= p25 <= latency <= p75; noise relative to the minuend's median.
"""

from __future__ import annotations

import math
import random

import pyarrow as pa
import pytest

from opcollect.runtime.harness import Stats, difference
from opcollect.tables.values import measured_faults


def stats(latency, p25, p75, **extra) -> Stats:
    fields = dict(samples=20, noise=(p75 - p25) / latency, timing="graph", calls_per_sample=8, sampled_seconds=0.5,
                  warmup_seconds=0.1, l2="rotate:4", sm_clock_mhz=1980.0, throttled_dropped=1)  # fmt: skip
    return Stats(latency, p25, p75, **(fields | extra))


def test_a_positive_difference_by_hand():
    got = difference(stats(5.0, 4.9, 5.2), stats(3.0, 2.95, 3.1, samples=12, sm_clock_mhz=1960.0))
    assert got.latency == pytest.approx(2.0)
    assert got.latency_p25 == pytest.approx(4.9 - 3.1) and got.latency_p75 == pytest.approx(5.2 - 2.95)
    assert got.noise == pytest.approx(0.45 / 5.0)  # relative to the dynamic (minuend) median, not the 2.0
    assert got.samples == 12 and got.calls_per_sample == 8  # each median rests on at least the fewer samples
    assert got.sampled_seconds == pytest.approx(1.0) and got.warmup_seconds == pytest.approx(0.2)
    assert got.sm_clock_mhz == pytest.approx(1970.0) and got.throttled_dropped == 2
    assert (got.timing, got.l2) == ("graph", "rotate:4")


def test_merged_fields_where_the_two_timings_differ():
    got = difference(
        stats(5.0, 4.9, 5.2, sm_clock_mhz=None), stats(3.0, 2.9, 3.1, timing="eager", l2="flush", calls_per_sample=2)
    )
    assert (got.timing, got.l2, got.calls_per_sample, got.sm_clock_mhz) == ("eager", "rotate:4,flush", 2, 1980.0)
    neither = difference(stats(5.0, 4.9, 5.2, sm_clock_mhz=None), stats(3.0, 2.9, 3.1, sm_clock_mhz=None))
    assert neither.sm_clock_mhz is None


def test_overlapping_spreads_clip_p25_at_0():
    got = difference(stats(0.030, 0.025, 0.040), stats(0.028, 0.020, 0.035))
    assert got.latency == pytest.approx(0.002) and got.latency_p25 == 0.0
    assert got.latency_p75 == pytest.approx(0.020) and got.noise == pytest.approx(0.020 / 0.030)


@pytest.mark.parametrize(
    "minuend, subtrahend, p75",
    [
        ((3.0, 2.8, 3.3), (3.1, 2.9, 3.2), 3.3 - 2.9),  # slower subtrahend, overlapping spreads
        ((2.0, 1.9, 2.1), (2.0, 1.9, 2.1), 2.1 - 1.9),  # equal medians
        ((3.0, 2.9, 3.1), (4.0, 3.9, 4.1), 0.0),  # disjoint: every quantile 0
    ],
)
def test_a_difference_that_is_not_positive_is_0_with_a_finite_noise(minuend, subtrahend, p75):
    got = difference(stats(*minuend), stats(*subtrahend))
    assert (got.latency, got.latency_p25) == (0.0, 0.0)
    assert got.latency_p75 == pytest.approx(p75)
    assert math.isfinite(got.noise) and got.noise == pytest.approx(p75 / minuend[0])


def _random_stats(rng: random.Random) -> Stats:
    """Quartiles as a harness writes them: 0 < p25 <= median <= p75; sometimes all three equal."""
    median = rng.choice([rng.uniform(1e-4, 10.0), 10 ** rng.uniform(-4, 1)])
    p25 = median * (1 - rng.choice([0.0, rng.uniform(0, 0.9)]))
    p75 = median * (1 + rng.choice([0.0, rng.uniform(0, 2.0)]))
    return stats(median, p25, p75, samples=rng.randint(1, 500), timing=rng.choice(["graph", "eager", "cpu"]))


def test_the_quantiles_stay_in_order_and_the_row_passes_the_value_rules():
    rng = random.Random(22)
    rows = []
    for _ in range(2000):
        a, b = _random_stats(rng), _random_stats(rng)
        if rng.random() < 0.1:  # equal medians: the boundary
            b = stats(a.latency, b.latency_p25 * a.latency / b.latency, b.latency_p75 * a.latency / b.latency)
        got = difference(a, b)
        assert 0.0 <= got.latency_p25 <= got.latency <= got.latency_p75, (a, b, got)
        assert got.latency == max(0.0, a.latency - b.latency)
        assert math.isfinite(got.noise) and got.noise >= 0
        assert got.samples == min(a.samples, b.samples)
        rows.append(got)
    zeros = sum(r.latency == 0.0 for r in rows)
    assert 0 < zeros < len(rows)  # both branches ran
    table = pa.table(
        {
            "latency": [r.latency for r in rows],
            "latency_p25": [r.latency_p25 for r in rows],
            "latency_p75": [r.latency_p75 for r in rows],
            "samples": [r.samples for r in rows],
            "noise": [r.noise for r in rows],
            "timing": [r.timing for r in rows],
        }
    )
    assert measured_faults(table, difference=True) == []  # every row difference() writes is admitted
    [fault] = measured_faults(table)  # held to a timed kernel's rule, the zero rows alone are refused
    assert (fault.what, fault.count) == ("latency not finite and positive", zeros)
