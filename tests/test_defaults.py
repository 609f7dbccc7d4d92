"""The defaults each command states in its --help are the values it uses: a default changed in one place and not
the other misleads every user who reads the help, and a default that drifted changes every table silently."""

from __future__ import annotations

import pytest

from opcollect.cli import build_parser
from opcollect.runtime.harness import TimingConfig
from opcollect.tables.noise import DEFAULT_THRESHOLDS
from opcollect.tables.rules import NOISE_BOUND


def _parse(*argv):
    return build_parser().parse_args(list(argv))


def test_run_and_collect_defaults():
    run = _parse("run", "--plan", "p.json", "--out", "o")
    assert (run.case_timeout, run.device, run.resume, run.retry_failed) == (120.0, "auto", False, False)
    assert (run.max_noise, run.min_samples, run.max_case_seconds, run.workers) == (None, None, None, None)
    collect = _parse("collect", "torch")
    assert (collect.case_timeout, collect.device, collect.gpus, collect.shards) == (120.0, "auto", "all", 1)
    assert (collect.container_runtime, collect.slurm, collect.local, collect.smoke) == ("none", False, False, False)
    assert collect.model_config == [] and collect.tables is None and collect.gpus_per_task is None


@pytest.mark.parametrize(
    ("kind", "noise", "samples", "cap", "warmup"), [("cpu", 0.01, 5, 0.25, 0.002), ("cuda", 0.01, 10, 1.0, 0.1)]
)
def test_the_timing_defaults_are_the_ones_the_help_states(kind, noise, samples, cap, warmup):
    config = TimingConfig.for_device(kind)
    assert (config.max_noise, config.min_samples, config.max_case_seconds, config.warmup_seconds) == (
        noise, samples, cap, warmup,
    )  # fmt: skip
    helps = {a.dest: a.help for a in build_parser()._subparsers._group_actions[0].choices["run"]._actions}
    assert f"(default {noise})" in helps["max_noise"]
    assert (
        f"GPU {TimingConfig.for_device('cuda').min_samples}, CPU {TimingConfig.for_device('cpu').min_samples}"
        in (helps["min_samples"])
    )
    cpu, gpu = TimingConfig.for_device("cpu").max_case_seconds, TimingConfig.for_device("cuda").max_case_seconds
    assert f"GPU {gpu}, CPU {cpu}" in helps["max_case_seconds"]
    assert "(default 120)" in helps["case_timeout"]


def test_check_and_compare_defaults():
    check = _parse("check", "T")
    assert (check.noise_bound, check.strict) == (0.05, False)
    assert NOISE_BOUND == 0.05  # check_tables' own default, for callers that pass none
    compare = _parse("compare", "A", "B")
    t = DEFAULT_THRESHOLDS
    assert (compare.min_gap, compare.noise_ceiling, compare.min_samples, compare.tolerance) == (
        t.min_gap, t.max_noise, t.min_samples, t.tolerance,
    )  # fmt: skip
    assert (t.min_gap, t.max_noise, t.min_samples, t.tolerance) == (0.005, 0.25, 10, 0.05)
