"""Runtime behaviours that small planted bugs once broke unnoticed: resume, failure classes, capacity, timing."""

from __future__ import annotations

import statistics
from types import SimpleNamespace

import pytest
from conftest import gemm_plan

from opcollect.plans.planfile import read_plan
from opcollect.runtime.contract import KernelLimit, Measured
from opcollect.runtime.failures import classify
from opcollect.runtime.harness import Sampled, TimingConfig, sample_until_stable, summarize
from opcollect.runtime.run import _tasks
from opcollect.runtime.rundir import Recorded, recorded
from opcollect.runtime.shards import ShardWriter, read_shard
from opcollect.runtime.worker import CAPACITY_SHARE, check_capacity, run_task

# -- resume: the latest attempt per case -----------------------------------------------------------


def _record(case_id, attempt, status="ok"):
    record = {"case_id": case_id, "op": "gemm", "status": status, "attempt": attempt}
    if status != "ok":
        record.update(error_class="oom", message="out of memory")
    return record


def _write_shard(run_dir, name, records):
    writer = ShardWriter(run_dir / "shards" / name)
    writer.append_runtime({"runtime_id": name})
    for record in records:
        writer.append(record)
    writer.close()


@pytest.mark.parametrize("newer_file", ["a-first.jsonl", "z-last.jsonl"])
def test_resume_takes_the_latest_attempt_across_shard_files(tmp_path, newer_file):
    older_file = "z-last.jsonl" if newer_file == "a-first.jsonl" else "a-first.jsonl"
    _write_shard(tmp_path, older_file, [_record("c1", 1, "failed"), _record("c2", 2, "failed")])
    _write_shard(tmp_path, newer_file, [_record("c1", 2, "ok"), _record("c2", 3, "ok"), _record("c3", 1)])
    state = recorded(tmp_path)
    assert {cid: r["attempt"] for cid, r in state.latest.items()} == {"c1": 2, "c2": 3, "c3": 1}
    assert {cid: r["status"] for cid, r in state.latest.items()} == {"c1": "ok", "c2": "ok", "c3": "ok"}
    assert state.attempts("c2") == 3


def test_resume_takes_the_latest_attempt_within_one_shard(tmp_path):
    _write_shard(tmp_path, "r1-w0.jsonl", [_record("c1", 1, "failed"), _record("c1", 2, "failed"), _record("c1", 3)])
    state = recorded(tmp_path)
    assert state.latest["c1"]["attempt"] == 3 and state.latest["c1"]["status"] == "ok"


def test_retry_failed_runs_failed_cases_again_and_plain_resume_does_not():
    state = Recorded({"ok": _record("ok", 1), "bad": _record("bad", 2, "failed")})
    assert state.done(retry_failed=False) == {"ok", "bad"}
    assert state.done(retry_failed=True) == {"ok"}
    assert state.attempts("bad") == 2 and state.attempts("never-ran") == 0


def test_tasks_skip_done_cases_and_number_attempts(tmp_path):
    shapes = [(1, 8, 8), (2, 8, 8), (4, 8, 8)]
    plan = read_plan(gemm_plan(tmp_path / "plan.json", shapes))
    ids = plan.ops["gemm"].ids
    state = Recorded({ids[0]: _record(ids[0], 1), ids[1]: _record(ids[1], 2, "failed")})
    plain = _tasks(plan, state.done(False), state.attempts)
    assert [(t.case_ids, t.attempt) for t in plain] == [((ids[2],), 1)]
    retry = _tasks(plan, state.done(True), state.attempts)
    assert [(t.case_ids, t.attempt) for t in retry] == [((ids[1],), 3), ((ids[2],), 1)]
    assert retry[1].cases == ({"gemm_dtype": "float32", "m": 4, "n": 8, "k": 8},)


def test_a_corrupt_line_inside_a_shard_is_skipped_not_the_rest(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_bytes(b'{"case_id": "a"}\n{"case_id": "b", oops\n{"case_id": "c"}\n')
    assert [r["case_id"] for r in read_shard(path)] == ["a", "c"]


# -- failure classes -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        "CUDA error: an illegal memory access was encountered",
        "CUDA error: device-side assert triggered",
        "CUDA error: unspecified launch failure",
        "CUDA error: misaligned address",
    ],
)
def test_sticky_cuda_errors_are_fatal(message):
    failure = classify(RuntimeError(message))
    assert failure.fatal and failure.error_class == "unexpected"
    assert message in failure.message


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total capacity)"),
        RuntimeError("CUDA error: out of memory"),
        MemoryError(),
        type("OutOfMemoryError", (RuntimeError,), {})("Tried to allocate 20.00 MiB"),
    ],
)
def test_out_of_memory_is_oom_and_not_fatal(exc):
    failure = classify(exc)
    assert failure.error_class == "oom" and not failure.fatal


@pytest.mark.parametrize(
    "message",
    [
        "FlashAttention only supports Ampere GPUs or newer.",
        "CUDA error: no kernel image is available for execution on the device",
        "No available kernel. Aborting execution.",
        "head_size must be a multiple of 8",
        "k must be divisible by 16",
        "\"addmm_impl_cpu_\" not implemented for 'Half'",
        "fp8 e4m3 is not supported on this device",
        "Unsupported data type Float8_e4m3fn",
        "Expected all tensors to be on the same device, but found at least two devices",
    ],
)
def test_kernel_limit_messages(message):
    failure = classify(RuntimeError(message))
    assert failure.error_class == "kernel_limit" and not failure.fatal, message


def test_kernel_limit_exceptions():
    assert classify(NotImplementedError("aten::_scaled_mm for CPU")).error_class == "kernel_limit"
    refused = classify(KernelLimit("does not fit: needs 3.00 GiB"))
    assert refused.error_class == "kernel_limit" and refused.message == "does not fit: needs 3.00 GiB"
    other = classify(ValueError("boom"))
    assert other.error_class == "unexpected" and not other.fatal and "boom" in other.message


# -- the worker's answer ---------------------------------------------------------------------------


def _backend(raises=None, free=2**30, need=1):
    def measure(op, dispatch, cases, device, config):
        if raises is not None:
            raise raises
        return [Measured(summarize(Sampled([1e-3], 1e-3, 0.0, 0), "cpu", 1), "k")] * len(cases)

    return SimpleNamespace(measure=measure, free_memory=lambda device: free, footprint=lambda op, case: need)


TASK = {
    "row_id": "r",
    "op": "gemm",
    "dispatch": "x",
    "case_ids": ["a", "b"],
    "cases": [{"gemm_dtype": "float32", "m": 1, "n": 8, "k": 8}, {"gemm_dtype": "float32", "m": 2, "n": 8, "k": 8}],
}


def test_worker_marks_a_sticky_error_fatal_and_others_not():
    sticky = run_task(_backend(RuntimeError("CUDA error: an illegal memory access")), TASK, "cpu", TimingConfig())
    assert sticky["fatal"] is True
    assert [r["case_id"] for r in sticky["results"]] == ["a", "b"]
    assert {r["status"] for r in sticky["results"]} == {"failed"}
    oom = run_task(_backend(RuntimeError("CUDA out of memory")), TASK, "cpu", TimingConfig())
    assert oom["fatal"] is False and {r["error_class"] for r in oom["results"]} == {"oom"}
    ok = run_task(_backend(), TASK, "cpu", TimingConfig())
    assert ok["fatal"] is False and [r["status"] for r in ok["results"]] == ["ok", "ok"]


def test_capacity_check_keeps_a_margin_of_the_free_memory():
    free = 10 * 2**30
    case = SimpleNamespace()
    check_capacity(_backend(free=free, need=int(0.89 * free)), "gemm", case, "cpu")
    for need in (int(0.91 * free), int(0.99 * free), free):
        with pytest.raises(KernelLimit, match="does not fit"):
            check_capacity(_backend(free=free, need=need), "gemm", case, "cpu")
    assert CAPACITY_SHARE < 1.0
    refused = run_task(_backend(free=free, need=free), TASK, "cpu", TimingConfig())
    assert {r["error_class"] for r in refused["results"]} == {"kernel_limit"} and not refused["fatal"]


# -- the harness summary ---------------------------------------------------------------------------


def _ms(values):
    return Sampled([v / 1e3 for v in values], sum(values) / 1e3, 0.0, 0)


def test_latency_is_the_median_not_the_mean():
    stats = summarize(_ms([1, 1, 1, 1, 100]), "cpu", 1)
    assert stats.latency == pytest.approx(1.0)
    assert statistics.mean([1, 1, 1, 1, 100]) > 10  # the mean would be far off
    odd = summarize(_ms([5, 1, 9, 3, 7]), "cpu", 1)
    assert odd.latency == pytest.approx(5.0)


@pytest.mark.parametrize("values", [[1, 2, 3, 4], [9, 1, 8, 2, 7, 3, 6, 4, 5], [10, 20], [3.0, 1.0, 2.0, 50.0, 4.0]])
def test_p25_and_p75_are_the_inclusive_quartiles(values):
    stats = summarize(_ms(values), "cpu", 1)
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    assert stats.latency_p25 == pytest.approx(q1)
    assert stats.latency == pytest.approx(median)
    assert stats.latency_p75 == pytest.approx(q3)
    assert stats.noise == pytest.approx((q3 - q1) / median)
    assert stats.samples == len(values)


def test_a_single_sample_is_its_own_median_and_quartiles():
    """The 4x hard cap can end a slow case after one sample: it still gets statistics."""
    stats = summarize(_ms([7.5]), "cpu", 1)
    assert stats.latency == stats.latency_p25 == stats.latency_p75 == pytest.approx(7.5)
    assert stats.noise == 0.0 and stats.samples == 1


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _sampler(values, clock):
    index = [0]

    def sample():
        value = values[index[0] % len(values)]
        index[0] += 1
        clock.now += value
        return value

    return sample


def test_a_perfectly_quiet_case_stops_at_min_samples_even_with_zero_noise_allowed():
    clock = _Clock()
    config = TimingConfig(max_noise=0.0, min_samples=6, max_case_seconds=100.0, warmup_seconds=0.0)
    raw = sample_until_stable(_sampler([1e-3], clock), config, clock)
    assert len(raw.samples) == 6


@pytest.mark.parametrize("spread,stops_at_min", [(0.008, True), (0.012, False)])
def test_default_noise_bound_is_one_percent(spread, stops_at_min):
    """Half the samples at 1, half at 1 + spread: the relative IQR is about the spread."""
    clock = _Clock()
    config = TimingConfig(min_samples=8, max_case_seconds=0.05, warmup_seconds=0.0)
    raw = sample_until_stable(_sampler([1e-3, (1 + spread) * 1e-3], clock), config, clock)
    assert (len(raw.samples) == 8) is stops_at_min
