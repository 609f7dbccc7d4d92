"""Behaviours of the tables, runtime and cluster modules that no earlier test held: each test here fails with a
small plausible bug planted in the function it names."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest
from conftest import fake_run, gemm_plan
from crafted_plans import craft, set_column, set_key

from opcollect.cluster import slurm, status, submit
from opcollect.cluster.record import SlurmRecord, Submission, read_record, write_record
from opcollect.cluster.scripts import SlurmOptions
from opcollect.errors import InputError
from opcollect.plans.gemm import GemmCase
from opcollect.project import find_project
from opcollect.runtime.harness import Sampled, TimingConfig, calls_for, sample_until_stable, summarize
from opcollect.runtime.planfile import read_plan
from opcollect.runtime.pool import Task
from opcollect.runtime.rundir import recorded
from opcollect.runtime.shards import ShardWriter
from opcollect.tables import consumer
from opcollect.tables import provenance as pv
from opcollect.tables.merge import _host_figures, merge
from opcollect.tables.provenance import HostFigures
from opcollect.tables.rules import check_tables
from opcollect.tables.values import Fault, tally, time_fault


def _mask(*bits: int) -> pa.Array:
    return pa.array([bool(b) for b in bits], pa.bool_())


def test_tally_counts_each_row_once_under_the_first_rule_it_breaks():
    """tally: a row is counted under its first fault; later faults count only rows no earlier fault took."""
    faults = [
        Fault("R3", "a", _mask(1, 1, 0, 0, 0)),
        Fault("R3", "b", _mask(0, 1, 1, 0, 0)),
        Fault("R3", "c", _mask(1, 0, 1, 1, 0)),
        Fault("R3", "d", _mask(1, 1, 1, 0, 0)),
    ]
    assert tally(faults) == (("a", 2), ("b", 1), ("c", 1))


def test_time_fault_flags_null_unparsable_and_future_times_alone():
    """time_fault: a null, an unparsable or a future time is a bad row; a good time repeated is not."""
    from datetime import datetime, timezone

    now = datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc)
    values = pa.array(
        ["2026-12-01T00:00:00+00:00", None, "yesterday", "2027-01-01T00:00:00+00:00", "2026-12-01T00:00:00+00:00"],
        pa.string(),
    )
    fault = time_fault(values, "recorded_at bad", now)
    assert (fault.rule, fault.what, fault.mask.to_pylist()) == (
        "R3",
        "recorded_at bad",
        [False, True, True, True, False],
    )
    assert time_fault(pa.array(["2026-12-01T00:00:00+00:00"] * 2, pa.string()), "x", now) is None


def test_check_names_at_most_ten_offending_rows_and_counts_them_all(tmp_path):
    """rules._ids: a finding counts every offending row but names only the first MAX_KEYS (10), in table order."""
    cases = [GemmCase("bfloat16", m, 1024, 1024) for m in range(1, 13)]
    tables = tmp_path / "tables"
    merge([fake_run(tmp_path / "run", cases)], tables, find_project(), say=lambda line: None)
    [noisy] = [f for f in check_tables(tables, noise_bound=0.01) if f.rule == "R7"]
    assert noisy.message == "12 rows with noise above 0.01" and noisy.warning
    assert noisy.keys == tuple(f"gemm:bfloat16:m={m},n=1024,k=1024" for m in range(1, 11))


def _workers(*figures) -> SimpleNamespace:
    """A run whose workers probed these host figures (None: a worker that probed nothing)."""
    return SimpleNamespace(runtimes={f"w{i}": {"host_figures": f} for i, f in enumerate(figures)})


def test_host_figures_take_each_figures_highest_over_every_worker_of_every_run():
    """merge._host_figures: per dtype the highest positive rate, the highest bandwidth and cache over workers."""
    first = {"dense_tflops": {"float32": 0.5, "bfloat16": None}, "bandwidth_bytes_per_s": 7, "cache_bytes": 300}
    second = {"dense_tflops": {"float32": 0.75, "bfloat16": 0.0, "float16": 1.5}, "bandwidth_bytes_per_s": 9}
    third = {"dense_tflops": {"float32": 0.25}, "bandwidth_bytes_per_s": 3, "cache_bytes": 100}
    host = _host_figures([_workers(first, None), _workers(second, third)])
    assert host == HostFigures(dense_tflops={"float32": 0.75, "float16": 1.5}, bandwidth_bytes_per_s=9, cache_bytes=300)
    assert _host_figures([_workers({"dense_tflops": {"float32": 0.5}, "bandwidth_bytes_per_s": 0})]) is None
    assert _host_figures([_workers({"dense_tflops": {"float32": 0.0}, "bandwidth_bytes_per_s": 5})]) is None
    assert _host_figures([_workers(None)]) is None
    no_cache = _host_figures([_workers({"dense_tflops": {"float32": 0.5}, "bandwidth_bytes_per_s": 5})])
    assert no_cache == HostFigures(dense_tflops={"float32": 0.5}, bandwidth_bytes_per_s=5, cache_bytes=None)


def _event(run_id: str, rows: int, failures: int, finished: bool = True) -> pv.Event:
    at = f"2026-11-0{run_id[-1]}T00:00:00+00:00"
    return pv.Event(run_id=run_id, collected_at=at, finished_at=at if finished else None, host="h", shard=None,
                    rows=rows, failures=failures, image=None, image_digest=None, plan_hash="c" * 64)  # fmt: skip


def _entry(events: list, rows: int = 3) -> pv.TableMeta:
    return pv.TableMeta(file_sha256="a" * 64, rows=rows, failures=2, status="partial", collector_ref=None,
                        collector_hash="b" * 64, case_plan_hash="d" * 64, events=events)  # fmt: skip


def _record(tables: dict, nccl_version: str | None = "2.26.2", image_digest: str | None = "") -> pv.Provenance:
    runtime = pv.Runtime(framework="vllm", version="0.24.0", nccl_version=nccl_version, image="img",
                         image_digest=image_digest, python=None, torch=None, cuda=None, driver=None)  # fmt: skip
    system = pv.System(name="h200_sxm", device="NVIDIA H200", sm="90", gpus=1, sm_clock_mhz=None, clocks_locked=None)
    return pv.Provenance(schema_version=1, runtime=runtime, system=system, tables=tables)


def test_collection_meta_lists_the_runs_that_left_rows_or_failures_and_an_unfinished_one_as_partial():
    """provenance.collection_meta: a collection per run with rows or failures (all runs when none did); a run
    without finished_at is partial; the table's rows and status and the runtime come from the record."""
    gemm = _entry([_event("r1", 3, 0), _event("r2", 0, 0), _event("r3", 0, 2, finished=False)], rows=5)
    moe = _entry([_event("r4", 0, 0), _event("r5", 0, 0, finished=False)], rows=0)
    meta = pv.collection_meta(_record({"gemm_perf": gemm, "moe_perf": moe}))
    assert meta.runtime.model_dump() == {"framework": "vllm", "version": "0.24.0", "image": "img",
                                         "image_variant": None, "image_digest": None}  # fmt: skip
    got = {name: (t.rows, t.status, [(c.collected_at[:10], c.rows, c.status, c.collector_ref) for c in t.collections])
           for name, t in meta.tables.items()}  # fmt: skip
    assert got == {
        "gemm_perf": (
            5,
            "partial",
            [("2026-11-01", 3, "complete", "unknown"), ("2026-11-03", 0, "partial", "unknown")],
        ),
        "moe_perf": (0, "partial", [("2026-11-04", 0, "complete", "unknown"), ("2026-11-05", 0, "partial", "unknown")]),
    }


def test_collection_meta_names_nccl_only_for_a_directory_holding_nccl_perf_alone():
    """provenance.collection_meta: NCCL's directory says framework nccl at the NCCL version; others the backend."""
    nccl = pv.collection_meta(_record({"nccl_perf": _entry([_event("r1", 3, 0)])})).runtime
    assert (nccl.framework, nccl.version) == ("nccl", "2.26.2")
    unknown = pv.collection_meta(_record({"nccl_perf": _entry([_event("r1", 3, 0)])}, nccl_version=None)).runtime
    assert (unknown.framework, unknown.version) == ("vllm", "0.24.0")
    both = {"nccl_perf": _entry([_event("r1", 3, 0)]), "gemm_perf": _entry([_event("r1", 3, 0)])}
    assert pv.collection_meta(_record(both)).runtime.framework == "vllm"


def test_a_sidecar_that_differs_from_the_record_is_named_by_its_first_differing_field(tmp_path):
    """provenance.check_sidecar_matches: the path of the first differing field, list items by index."""
    record = _record({"gemm_perf": _entry([_event("r1", 3, 0), _event("r3", 0, 2)])}, image_digest="sha256:x")
    good = pv.collection_meta(record)
    pv.check_sidecar_matches(tmp_path / "meta.yaml", good, record)  # the same: no error
    data = good.model_dump(mode="json", exclude_none=True)
    data["tables"]["gemm_perf"]["collections"][1]["rows"] = 5
    with pytest.raises(InputError, match=r"meta.yaml: field 'tables.gemm_perf.collections\[1\].rows' differs from"):
        pv.check_sidecar_matches(tmp_path / "meta.yaml", consumer.CollectionMeta(**data), record)
    data = good.model_dump(mode="json", exclude_none=True)
    del data["tables"]["gemm_perf"]["collections"][0]
    data["runtime"]["image_digest"] = "sha256:y"
    with pytest.raises(InputError, match=r"field 'runtime.image_digest' differs"):
        pv.check_sidecar_matches(tmp_path / "meta.yaml", consumer.CollectionMeta(**data), record)
    data["runtime"]["image_digest"] = "sha256:x"
    with pytest.raises(InputError, match=r"field 'tables.gemm_perf.collections' differs"):
        pv.check_sidecar_matches(tmp_path / "meta.yaml", consumer.CollectionMeta(**data), record)


@pytest.mark.parametrize(
    ("change", "refused"),
    [
        pytest.param(set_column("k", 2**40), None, id="count-max-dim-at"),
        pytest.param(set_column("gemm_dtype", "x" * 128), None, id="name-128-at"),
        pytest.param(set_column("gemm_dtype", "x" * 129), "columns.gemm_dtype", id="name-128-past"),
        pytest.param(set_column("gemm_dtype", ""), "columns.gemm_dtype", id="name-empty"),
        pytest.param(set_key("shard", {"index": 0, "count": 2**40}), None, id="shards-max-dim-at"),
        pytest.param(set_key("shard", {"index": 0, "count": 2**40 + 1}), "shard", id="shards-max-dim-past"),
        pytest.param(set_key("shard", {"index": 0, "count": 1}), None, id="shard-0-of-1"),
        pytest.param(set_key("shard", {"index": -1, "count": 2}), "shard", id="shard-index-below-0"),
    ],
)
def test_plan_file_bounds_of_names_counts_and_shards(tmp_path, change, refused):
    """runtime.planfile: a name is 1-128 characters, a count at most 2**40, a shard the i-th (0 <= i < N <= 2**40)."""
    path = craft(gemm_plan(tmp_path / "plan.json", [(1, 64, 64)]), change)
    if refused is None:
        assert read_plan(path).total_cases == 1
    else:
        with pytest.raises(InputError, match=f"field '[^']*{refused}'"):
            read_plan(path)


def test_recorded_takes_of_equal_attempts_the_later_record_and_counts_a_missing_attempt_as_1(tmp_path):
    """rundir.recorded: a later record of the same attempt replaces the earlier; no attempt field is attempt 1."""
    writer = ShardWriter(tmp_path / "shards" / "r1-w0.jsonl")
    for case_id, attempt, outcome in [("c1", 1, "failed"), ("c1", 1, "ok"), ("c2", None, "failed"), ("c2", 1, "ok"),
                                     ("c3", 2, "ok"), ("c3", None, "failed"), ("c4", None, "ok"), ("c5", 1, "failed"),
                                     ("c5", None, "ok")]:  # fmt: skip
        writer.append({"case_id": case_id, "status": outcome, **({} if attempt is None else {"attempt": attempt})})
    writer.close()
    state = recorded(tmp_path)
    assert {cid: (r.get("attempt"), r["status"]) for cid, r in state.latest.items()} == {
        "c1": (1, "ok"),
        "c2": (1, "ok"),
        "c3": (2, "ok"),
        "c4": (None, "ok"),
        "c5": (None, "ok"),
    }
    assert [state.attempts(c) for c in ("c1", "c3", "c4", "c6")] == [1, 2, 1, 0]


def test_the_noise_check_after_min_samples_comes_every_eighth_of_the_samples_so_far():
    """harness.sample_until_stable: checks at 16, 18, 20, 22 (n + n // 8): quiet from sample 21, it stops at 22."""
    now = [100.0]

    def sample():
        value = next(values)
        now[0] += value
        return value

    values = iter([1.0] + [2.0**-3] * 5 + [2.0**-10] * 100)  # the warm-up call takes the 1.0
    config = TimingConfig(max_noise=0.01, min_samples=16, max_case_seconds=1e6, warmup_seconds=0)
    raw = sample_until_stable(sample, config, clock=lambda: now[0])
    assert len(raw.samples) == 22 and raw.samples[:5] == [2.0**-3] * 5 and raw.dropped == 0
    assert raw.warmup_seconds == 1.0 and raw.sampled_seconds == 5 * 2.0**-3 + 17 * 2.0**-10


@pytest.mark.parametrize(
    ("times", "calls", "made"),
    [
        pytest.param([1.0, 2.0**-12, 2.0**-13, 2.0**-14], 4, 4, id="the-least-of-three-after-the-first"),
        pytest.param([1.0, 2.0**-10, 2.0**-14, 2.0**-14], 1, 2, id="one-call-past-the-target-ends-the-estimate"),
        pytest.param([1.0, 2.0**-14, 2.0**-12, 2.0**-11], 4, 4, id="not-the-last"),
    ],
)
def test_calls_for_sizes_a_sample_by_the_fastest_call_after_the_first(times, calls, made):
    """harness.calls_for: the first call is not timed; then the least of up to 3, stopping past the target."""
    now, left = [0.0], iter(times)

    def call():
        now[0] += next(left)

    assert calls_for(call, 2.0**-12, clock=lambda: now[0]) == calls
    assert len(times) - len(list(left)) == made


def test_summarize_reports_the_quartiles_in_milliseconds_and_carries_the_counts():
    """harness.summarize: median/p25/p75 in ms, noise the relative IQR, sample count, seconds and drops as given."""
    raw = Sampled([5e-3, 1e-3, 4e-3, 2e-3, 3e-3], sampled_seconds=0.75, warmup_seconds=0.125, dropped=3)
    stats = summarize(raw, "eager", 6, l2="flush")
    assert (stats.latency, stats.latency_p25, stats.latency_p75) == pytest.approx((3.0, 2.0, 4.0))
    assert stats.noise == pytest.approx(2 / 3) and stats.samples == 5 and stats.timing == "eager"
    assert (stats.sampled_seconds, stats.warmup_seconds, stats.throttled_dropped) == (0.75, 0.125, 3)
    assert (stats.calls_per_sample, stats.l2, stats.threads) == (6, "flush", None)


def test_submit_gives_a_resubmissions_tasks_to_sbatch_and_records_it_after_the_earlier_ones(tmp_path, monkeypatch):
    """submit.submit: --array only for a subset of the shards, the merge job afterany the array, slurm.json appended
    on a resubmission and started anew otherwise."""
    monkeypatch.chdir(tmp_path)
    root, tables = tmp_path / "runs", Path("TABLES")  # relative: slurm.json holds it resolved
    root.mkdir()
    first = Submission("10", "11", (0, 1, 2))
    write_record(root, SlurmRecord(3, (first,), "/old"))
    asked, ids = [], iter(["20", "21", "30", "31"])

    def sbatch(script, *, array=None, dependency=None):
        asked.append((script.name, array, dependency))
        return next(ids)

    monkeypatch.setattr(slurm, "sbatch", sbatch)
    options = SlurmOptions(shards=3, device="cpu")
    again = submit.submit(root, tables, options, tmp_path, [1, 2], 7, resubmission=True)
    assert again == submit.Submitted(root, "20", "21", (1, 2), 7)
    assert asked == [("collect.sbatch", "1,2", None), ("merge.sbatch", None, "afterany:20")]
    second = Submission("20", "21", (1, 2))
    assert read_record(root) == SlurmRecord(3, (first, second), str(tmp_path.resolve() / "TABLES"))
    asked.clear()
    anew = submit.submit(root, tables, options, tmp_path, [0, 1, 2], 9)
    assert (anew.array_job, anew.merge_job, anew.tasks, anew.planned) == ("30", "31", (0, 1, 2), 9)
    assert asked == [("collect.sbatch", None, None), ("merge.sbatch", None, "afterany:30")]
    assert read_record(root) == SlurmRecord(3, (Submission("30", "31", (0, 1, 2)),), str(tables.resolve()))


def test_slurms_word_on_a_shard_is_that_of_its_latest_submission(monkeypatch):
    """status._slurm_says: a task's state from the last submission that ran it; answered when any job answered."""
    said = {"10": {0: "COMPLETED", 1: "FAILED", 2: "RUNNING"}, "20": {1: "PENDING", 2: "CANCELLED"}, "30": None}
    monkeypatch.setattr(status, "task_states", lambda job: said[job])
    record = SlurmRecord(3, (Submission("10", "11", (0, 1, 2)), Submission("20", "21", (1,))), None)
    assert status._slurm_says(record) == ({0: "COMPLETED", 1: "PENDING", 2: "RUNNING"}, True)
    late = SlurmRecord(3, (Submission("10", "11", (0, 1, 2)), Submission("30", "31", (1,))), None)
    assert status._slurm_says(late) == ({0: "COMPLETED", 1: "FAILED", 2: "RUNNING"}, True)
    silent = SlurmRecord(3, (Submission("30", "31", (0, 1, 2)),), None)
    assert status._slurm_says(silent) == ({}, False)


def test_resubmit_passes_every_shards_planned_cases_the_records_shard_count_and_tables(tmp_path, monkeypatch):
    """submit.resubmit: the not-done shards, planned over all shards, slurm.json's shard count and TABLES."""
    states = [status.ShardStatus(0, "done", 4, 0, 4, "COMPLETED"), status.ShardStatus(1, "failed", 1, 1, 5, "FAILED"),
              status.ShardStatus(2, "incomplete", 0, 0, 6, None)]  # fmt: skip
    monkeypatch.setattr(submit, "shard_states", lambda root: states)
    asked = []
    monkeypatch.setattr(submit, "submit", lambda *args, **kw: asked.append((args, kw)) or "submitted")
    write_record(tmp_path, SlurmRecord(3, (), "/recorded/TABLES"))
    assert submit.resubmit(tmp_path, None, SlurmOptions(shards=7, device="cpu"), tmp_path / "co") == "submitted"
    [((root, tables, options, checkout, tasks, planned), kw)] = asked
    assert (root, tables, options.shards, checkout, tasks, planned) == (
        tmp_path,
        Path("/recorded/TABLES"),
        3,
        tmp_path / "co",
        [1, 2],
        15,
    )
    assert kw == {"resubmission": True}
    asked.clear()
    submit.resubmit(tmp_path, tmp_path / "given", SlurmOptions(shards=3, device="cpu"), tmp_path)
    assert asked[0][0][1] == tmp_path / "given"
    states[1:] = [status.ShardStatus(1, "done", 5, 0, 5, None)]
    assert submit.resubmit(tmp_path, None, SlurmOptions(shards=2, device="cpu"), tmp_path) is None


def test_a_rows_ranks_are_the_most_gpus_any_of_its_cases_spans_else_one():
    """pool.Task.ranks: the largest num_gpus over the row's cases; 1 for cases without it, or for no case."""

    def task(*cases):
        return Task("r", "comm", "nccl", tuple(f"c{i}" for i in range(len(cases))), cases, 1)

    assert task({"num_gpus": 2}, {"num_gpus": 8}, {"num_gpus": 4}).ranks == 8
    assert task({"m": 16}, {"m": 32}).ranks == 1
    assert task({"m": 16}, {"num_gpus": 2}).ranks == 2
    assert task().ranks == 1
