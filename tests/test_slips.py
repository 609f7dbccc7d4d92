"""Behaviours a one-character slip breaks silently, each found by a bug planted by someone who had not read the
tests (scripts/blind_mutants.json) that no test caught: how a dead worker is described, which attempt a row's
records carry and which of two records of a case counts, what a plan file may hold, when a run directory may be
re-used, what merge reports about the system, the consumer's table names, the noise bound, the release date, the
collector hash, plan-diff of summaries, GEMM exclusions, decode caps, Slurm resumes, sliding windows and the
power-law sample range."""

from __future__ import annotations

import json
import random
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest
from conftest import ROOT, fake_run, gemm_plan, run_cli
from crafted_plans import craft, set_column, set_key

from opcollect.backends.torch import routing
from opcollect.cases.grids import GemmGrid, GenerationAttentionGrid
from opcollect.cases.profiles import parse_config
from opcollect.cluster import submit
from opcollect.cluster.record import SlurmRecord, Submission, write_record
from opcollect.cluster.scripts import SlurmOptions
from opcollect.errors import InputError
from opcollect.plans.attention import generation_steps
from opcollect.plans.comm import CommCase
from opcollect.plans.diff import diff_plans
from opcollect.plans.gemm import GemmCase
from opcollect.plans.gemm import expand as gemm_expand
from opcollect.plans.hashes import collector_hash
from opcollect.plans.planfile import write_plan
from opcollect.plans.planner import plan_of_cases
from opcollect.project import find_project
from opcollect.release.package import newest_collection
from opcollect.runtime.planfile import read_plan
from opcollect.runtime.pool import _log_tail, _signal_name
from opcollect.runtime.run import _tasks
from opcollect.runtime.rundir import prepare_run_dir, recorded
from opcollect.runtime.shards import ShardWriter
from opcollect.tables import consumer
from opcollect.tables.merge import merge
from opcollect.tables.provenance import PROVENANCE, read_provenance
from opcollect.tables.rules import check_tables


def test_a_dead_workers_log_is_quoted_by_its_tail(tmp_path):
    log = tmp_path / "worker-0.log"
    log.write_text("loading the backend\n" + "x" * 2000 + "\nRuntimeError: the line that says why")
    tail = _log_tail(log, 600)
    assert tail.endswith("RuntimeError: the line that says why") and "loading the backend" not in tail
    assert tail.startswith("x")  # the head was cut, the tail kept


def test_an_exit_code_and_a_signal_are_named_apart():
    assert _signal_name(0) == "exited with code 0"
    assert _signal_name(3) == "exited with code 3"
    assert _signal_name(-9) == "killed by SIGKILL"
    assert _signal_name(None) == "still running"


def test_a_row_carries_one_more_than_the_highest_attempt_of_its_cases(tmp_path):
    cases = [CommCase("half", "all_reduce", 2, size) for size in (1024, 2048, 4096)]
    path = tmp_path / "plan.json"
    write_plan(plan_of_cases("torch", "cpu", "comm", cases, "gloo", collector_hash(ROOT)), path)
    plan = read_plan(path)
    [row] = plan.ops["comm"].rows  # one process group: the three sizes are one row
    tried = {row.case_ids[0]: 2, row.case_ids[1]: 0, row.case_ids[2]: 1}
    [task] = _tasks(plan, set(), lambda cid: tried[cid])
    assert task.attempt == 3  # a retried case's record must supersede its attempt 2


def test_of_two_records_of_one_attempt_the_later_counts(tmp_path):
    run_dir = tmp_path / "run"
    fake_run(run_dir, [GemmCase("bfloat16", 1, 64, 64)])
    [case_id] = recorded(run_dir).latest
    writer = ShardWriter(run_dir / "shards" / "r2-w0.jsonl")
    writer.append({"case_id": case_id, "op": "gemm", "status": "failed", "error_class": "timeout", "attempt": 1})
    writer.close()
    assert recorded(run_dir).latest[case_id]["status"] == "failed"


@pytest.mark.parametrize(
    ("change", "field"),
    [(set_column("m", True), "m"), (set_key("shard", {"index": 3, "count": 3}), "shard")],
    ids=["a-bool-as-a-count", "shard-index-equal-to-count"],
)
def test_a_plan_file_holding_what_no_plan_holds_is_refused(tmp_path, change, field):
    path = craft(gemm_plan(tmp_path / "plan.json", [(1, 64, 64)]), change)
    with pytest.raises(InputError, match=field):
        read_plan(path)


def test_a_run_directory_killed_before_its_first_record_runs_again_without_resume(tmp_path):
    path = gemm_plan(tmp_path / "plan.json", [(1, 64, 64)])
    plan = read_plan(path)
    run_dir = tmp_path / "run"
    prepare_run_dir(run_dir, path, plan, resume=False).lock.release()
    assert (run_dir / "run.json").is_file() and not list((run_dir / "shards").iterdir())
    again = prepare_run_dir(run_dir, path, plan, resume=False)  # nothing recorded: nothing to lose
    assert again.latest == {}
    again.lock.release()


def test_merge_counts_the_worker_devices_and_takes_the_median_clock(tmp_path):
    run_dir = tmp_path / "run"
    fake_run(run_dir, [GemmCase("bfloat16", m, 64, 64) for m in (1, 2, 4)])
    [shard] = (run_dir / "shards").iterdir()
    lines = [json.loads(line) for line in shard.read_text().splitlines()]
    second = {**lines[0], "runtime_id": "r1.w1.1", "worker": 1, "worker_device": "cuda:1"}
    clocks = iter((1980.0, 1500.0, 1700.0))
    for line in lines[1:]:
        line["stats"]["sm_clock_mhz"] = next(clocks)
    lines[2]["runtime_id"] = "r1.w1.1"
    shard.write_text("".join(json.dumps(line) + "\n" for line in [lines[0], second, *lines[1:]]))
    tables = tmp_path / "tables"
    [written] = merge([run_dir], tables, find_project())
    system = read_provenance(tables / written.path.rsplit("/", 1)[0] / PROVENANCE).system
    assert system.gpus == 2 and system.sm_clock_mhz == 1700.0


def test_the_consumer_takes_a_files_table_name_up_to_its_last_dot():
    assert consumer.stem("gemm_perf.parquet") == "gemm_perf"
    assert consumer.stem("gemm_perf.parquet.bak") == "gemm_perf.parquet"  # a table the sidecar does not cover


def test_a_row_exactly_at_the_noise_bound_is_not_noisy(tmp_path):
    tables = tmp_path / "tables"
    merge([fake_run(tmp_path / "run", [GemmCase("bfloat16", 1, 64, 64)])], tables, find_project())
    noise = 0.02  # what fake_run records
    assert not [f for f in check_tables(tables, noise_bound=noise) if f.rule == "R7"]
    assert [f for f in check_tables(tables, noise_bound=noise / 2) if f.rule == "R7"]


def test_the_release_date_is_the_newest_collection():
    def meta(*stamps):
        return {"tables": {"gemm_perf": {"collections": [{"collected_at": s} for s in stamps]}}}

    metas = {
        "a/collection_meta.yaml": meta("2026-11-01T00:00:00+00:00", "2026-11-30T12:00:00+00:00"),
        "b/collection_meta.yaml": meta("2026-11-15T00:00:00+00:00"),
    }
    assert newest_collection(metas) == int(datetime(2026, 11, 30, 12, tzinfo=timezone.utc).timestamp())


def test_a_patch_file_under_images_is_part_of_the_collector_hash(tmp_path):
    (tmp_path / "src" / "opcollect").mkdir(parents=True)
    (tmp_path / "src" / "opcollect" / "a.py").write_text("x = 1\n")
    patch = tmp_path / "images" / "vllm" / "fix.patch"
    patch.parent.mkdir(parents=True)
    patch.write_text("--- a\n+++ b\n")
    before = collector_hash(tmp_path)
    patch.write_text("--- a\n+++ c\n")
    assert collector_hash(tmp_path) != before


def test_plan_diff_of_summaries_counts_removed_cases(tmp_path):
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(run_cli("plan", "--backend", "torch", "--sm", "cpu", "--ops", "moe", "--json").stdout)
    new.write_text(run_cli("plan", "--backend", "torch", "--sm", "cpu", "--ops", "moe", "--smoke", "--json").stdout)
    planned = {name: json.loads(p.read_text())["ops"]["moe"]["cases"] for name, p in (("old", old), ("new", new))}
    fewer = planned["old"] - planned["new"]
    assert fewer > 0
    [moe] = diff_plans(old, new)
    assert (moe.added, moe.removed) == (0, fewer)
    [back] = diff_plans(new, old)
    assert (back.added, back.removed) == (fewer, 0)
    done = run_cli("plan-diff", str(old), str(new))
    assert done.returncode == 0 and f"moe: +0 added, -{fewer} removed" in done.stdout


def test_an_excluded_n_k_pair_leaves_out_that_pair_only():
    grid = GemmGrid(dtypes=["bfloat16"], m=[1], n=[1024, 4096], k=[1024, 4096], exclude_nk=[{"n": 1024, "k": 4096}],
                    model_tp_sizes=[1])  # fmt: skip
    pairs = {(v[2], v[3]) for group in gemm_expand(grid, {}) for v in group.values}  # (dtype, m, n, k)
    assert (1024, 4096) not in pairs and (4096, 1024) in pairs and len(pairs) == 3


def test_a_decode_batch_fits_by_the_step_plus_one_tokens_it_caches():
    grid = GenerationAttentionGrid.model_construct(
        step=[1, 3, 7], batch_size=[1, 2, 4, 8], max_tokens_mha=8, max_tokens_gqa=8, cap_rules=["tokens"],
        min_batch_sizes_per_step=1, drop_longest_step_from_batch=None,
    )  # fmt: skip
    # batch b at step s caches s + 1 tokens each: b x (s + 1) <= 8
    assert sorted(generation_steps(grid, 8, 8, 128)) == [(1, 1), (1, 3), (1, 7), (2, 1), (2, 3), (4, 1)]


@pytest.mark.parametrize("state", ["running", "pending"])
def test_a_resume_waits_for_a_shard_still_queued_or_running(tmp_path, monkeypatch, state):
    root = tmp_path / "runs"
    root.mkdir()
    write_record(root, SlurmRecord(2, (Submission("12", "13", (0, 1)),), None))
    states = [SimpleNamespace(index=0, state=state), SimpleNamespace(index=1, state="failed")]
    monkeypatch.setattr(submit, "shard_states", lambda root: states)
    with pytest.raises(InputError, match=r"shards \[0\] are still queued or running"):
        submit.resubmit(root, None, SlurmOptions(shards=2, device="cpu"), ROOT)


@pytest.mark.parametrize(("pattern", "windows"), [(1, (0,)), (2, (0, 512)), (6, (0, 512))])
def test_a_sliding_window_pattern_of_one_slides_nowhere(pattern, windows):
    keys = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336}
    spec = parse_config("x", "FooForCausalLM", "m", {**keys, "sliding_window": 512, "sliding_window_pattern": pattern})
    assert spec.layout.attention.windows == windows


def test_power_law_samples_come_from_the_small_range_until_pairs_exceed_the_experts(monkeypatch):
    ranges = []

    def recorded(rng, size, alpha, xmin, xmax):
        ranges.append((xmin, xmax))
        return [1.0] * size

    monkeypatch.setattr(routing, "sample_power_law", recorded)
    routing.power_law_counts(16, 128, 8, 1, 1.2, random.Random(0))  # 16 x 8 pairs = 128 experts
    routing.power_law_counts(17, 128, 8, 1, 1.2, random.Random(0))
    assert ranges == [(0.01, 2.0), (1.0, 17 * 0.8)]
