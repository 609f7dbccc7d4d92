"""Whether a row moved between two tables: same, faster, slower or ambiguous, from each row's p25-p75 interval.

The rule follows NVIDIA nvbench's robust compare (python/scripts/nvbench_compare_robust.py, NVIDIA/nvbench at
66212f1): each measurement is an interval around its median, and

- a change is real (FAST/SLOW there, faster/slower here) only when the two intervals are disjoint and the gap
  between them, relative to the lower of the two facing bounds, is at least ``min_gap`` (nvbench's
  ``clear_gap_relative``, whose default 0.005 is ours: compare_intervals_for_clear_gap, symmetric_frac_diff);
- "same" needs the two medians close and the intervals to overlap, and the noise (the relative dispersion) of both
  under a ceiling (compare_intervals_for_same, same_relative_dispersion_ceiling); anything else is undecided
  (AMBG there, ambiguous here).

Where we differ, and why: nvbench's interval is [min, q3]; a table row keeps only its quartiles, so ours is
[latency_p25, latency_p75]. nvbench calls two medians close within 0.5% of each other and asks the intervals to
overlap by half the narrower one; we call them close when they differ by less than either row's IQR, a closeness
measured in the rows' own noise: a row collected at 1% noise (the GPU stopping rule) is "same" only within about
1%, a noisier one within its own spread, which a re-run on a shared CPU needs (its medians move by several percent
between runs while each row's IQR is 10-15%). The ceiling on noise and the floor on samples apply to every verdict
(a disjoint pair of intervals from five samples or a 60% spread is no evidence of a change): such a row is
ambiguous. The floor is 10 samples, the GPU harness's minimum: a CPU case may stop at 5 samples that agree within
1% in a quiet moment, an IQR far narrower than the spread between runs. Rows without quartiles (the reference
tables, collected before they were recorded) have no noise to judge: they compare by the NEW/OLD ratio against a
stated tolerance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

SAME, FASTER, SLOWER, AMBIGUOUS = "same", "faster", "slower", "ambiguous"
VERDICTS = (SAME, FASTER, SLOWER, AMBIGUOUS)
MOVED = (FASTER, SLOWER)


class Measured(NamedTuple):
    """One row's timing: the median latency, and (None on a legacy row) its quartiles and sample count."""

    latency: float
    p25: float | None = None
    p75: float | None = None
    samples: int | None = None

    @property
    def has_interval(self) -> bool:
        return self.p25 is not None and self.p75 is not None and self.samples is not None

    @property
    def noise(self) -> float:
        """The relative IQR, (p75 - p25) / median, as the harness computes it (runtime/harness.py)."""
        return (self.p75 - self.p25) / self.latency if self.latency > 0 else math.inf


@dataclass(frozen=True)
class Thresholds:
    min_gap: float = 0.005  # nvbench's clear_gap_relative (default preset)
    # a relative IQR above this, on either row, leaves the verdict ambiguous; nvbench's same_relative_dispersion_ceiling
    # is 0.02, for GPU timings: a CPU row's IQR is often 10-15%, and a GPU row past its sampling cap is noisy too
    max_noise: float = 0.25
    min_samples: int = 10  # fewer samples on either row: ambiguous (the GPU harness's own minimum; see above)
    tolerance: float = 0.05  # legacy rows: NEW/OLD within [1/(1+t), 1+t] is the same

    def describe(self) -> str:
        return (
            f"intervals p25-p75; real change: disjoint by >= {self.min_gap:.1%}; ambiguous: noise > "
            f"{self.max_noise:.0%} or < {self.min_samples} samples; rows without quartiles: the same when NEW/OLD is "
            f"within [{1 / (1 + self.tolerance):.3f}, {1 + self.tolerance:.3f}] (tolerance {self.tolerance:.0%})"
        )


DEFAULT_THRESHOLDS = Thresholds()


class Verdict(NamedTuple):
    verdict: str  # one of VERDICTS
    reason: str  # why, in a few words


def _valid(m: Measured) -> bool:
    values = (m.latency, m.p25, m.p75)
    return all(math.isfinite(v) for v in values) and 0 <= m.p25 <= m.latency <= m.p75 and m.latency > 0


def by_ratio(old: float, new: float, tolerance: float) -> Verdict:
    """Legacy rows: NEW/OLD beyond 1 + tolerance is slower, under 1 / (1 + tolerance) faster, else the same."""
    ratio = new / old
    if ratio >= 1 + tolerance:
        return Verdict(SLOWER, f"ratio {ratio:.3f} >= {1 + tolerance:.3f}, no quartiles")
    if ratio <= 1 / (1 + tolerance):
        return Verdict(FASTER, f"ratio {ratio:.3f} <= {1 / (1 + tolerance):.3f}, no quartiles")
    return Verdict(SAME, f"ratio {ratio:.3f} within tolerance {tolerance:.0%}, no quartiles")


def classify(old: Measured, new: Measured, t: Thresholds = DEFAULT_THRESHOLDS) -> Verdict:
    """The verdict on one key: OLD's row against NEW's."""
    if not (old.has_interval and new.has_interval):
        return by_ratio(old.latency, new.latency, t.tolerance)
    if not (_valid(old) and _valid(new)):
        return Verdict(AMBIGUOUS, "quartiles not around a positive median")
    fewest = min(old.samples, new.samples)
    if fewest < t.min_samples:
        return Verdict(AMBIGUOUS, f"{fewest} samples < {t.min_samples}")
    noisiest = max(old.noise, new.noise)
    if noisiest > t.max_noise:
        return Verdict(AMBIGUOUS, f"noise {noisiest:.1%} > {t.max_noise:.0%}")
    if new.p25 > old.p75:  # disjoint, NEW above: the gap relative to the lower facing bound (nvbench's)
        gap = (new.p25 - old.p75) / old.p75
        if gap >= t.min_gap:
            return Verdict(SLOWER, f"intervals apart by {gap:.1%}")
        return Verdict(AMBIGUOUS, f"intervals apart by {gap:.2%} < {t.min_gap:.1%}")
    if old.p25 > new.p75:
        gap = (old.p25 - new.p75) / new.p75
        if gap >= t.min_gap:
            return Verdict(FASTER, f"intervals apart by {gap:.1%}")
        return Verdict(AMBIGUOUS, f"intervals apart by {gap:.2%} < {t.min_gap:.1%}")
    # the intervals overlap: never a change; the same when the medians differ by less than either row's IQR
    shift = abs(new.latency - old.latency)
    if shift == 0 or shift < min(old.p75 - old.p25, new.p75 - new.p25):
        return Verdict(SAME, f"medians {shift / old.latency:.1%} apart, within both IQRs")
    return Verdict(AMBIGUOUS, f"intervals overlap, medians {shift / old.latency:.1%} apart: beyond an IQR")
