"""Behaviours the eighth blind round (scripts/blind_mutants_8.json: bugs planted by someone who had not read the
tests) found unchecked: each test here fails with its bug planted."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from opcollect.collect import run_flags
from opcollect.runtime.run import RunOptions
from opcollect.yamlio import describe_validation_error


class _Shape(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    m: int
    n: int
    k: int


@pytest.mark.parametrize(
    ("data", "more"),
    [
        ({"m": 1, "n": 2, "k": "x"}, ""),  # one error: nothing more
        ({"m": 1, "n": "y", "k": "x"}, " (+1 more)"),
        ({"m": "z", "n": "y", "k": "x"}, " (+2 more)"),
    ],
)
def test_a_validation_error_counts_the_errors_after_the_one_it_names(data, more):
    with pytest.raises(ValidationError) as exc:
        _Shape.model_validate(data)
    line = describe_validation_error("shape.yaml", exc.value)
    assert line.startswith("shape.yaml: field '")
    assert line.endswith(f"(got 'x'){more}" if not more else more), line
    assert line.count("more)") == (1 if more else 0)


def test_run_flags_carry_zero_values_and_leave_out_only_unset_ones():
    flags = run_flags(RunOptions(case_timeout=30.0, max_noise=0.0, min_samples=1, max_case_seconds=0.5, workers=2))
    assert flags == [
        "--case-timeout",
        "30.0",
        "--max-noise",
        "0.0",
        "--min-samples",
        "1",
        "--max-case-seconds",
        "0.5",
        "--workers",
        "2",
    ]
    assert run_flags(RunOptions()) == ["--case-timeout", "120.0"]
