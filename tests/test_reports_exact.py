"""The whole text of each user-facing summary, line for line, for a small input whose every number is known.

A test that asks only whether a phrase appears misses a count left out, a ranking turned one-sided or a state
mis-mapped; these compare every line against text derived by hand from the inputs built here."""

from __future__ import annotations

import json

import yaml
from conftest import fake_run, gemm_plan, run_cli, slurm_says

from opcollect.plans.gemm import GemmCase
from opcollect.project import find_project
from opcollect.tables.merge import merge

KEY = "op_name=gemm,gemm_dtype=bfloat16,m={m},n=1024,k=1024"
DIR = "h200_sxm/gemm/vllm/0.24.0"


def _quiet_merge(runs, into):
    merge(runs, into, find_project(), say=lambda line: None)


def test_compare_prints_every_count_ratio_change_and_step(tmp_path):
    """OLD: three keys at 1 ms (fake_run's p25/p75 are latency x0.99/x1.01, 10 samples). NEW: m=1 at 0.5 ms,
    m=2 at 4 ms, m=3 at 1 ms. Ratios (key order m=1,2,3): 0.5, 4.0, 1.0; sorted 0.5, 1.0, 4.0, so the median is
    1.0 and the inclusive deciles are p10 = 0.5 + 0.2 * 0.5 = 0.6 and p90 = 1.0 + 0.8 * 3.0 = 3.4.
    m=2: NEW p25 3.96 above OLD p75 1.01, gap (3.96 - 1.01) / 1.01 = 292.1%: slower. m=1: OLD p25 0.99 above NEW
    p75 0.505, gap (0.99 - 0.505) / 0.505 = 96.0%: faster. m=3: medians equal: same. |log 4| > |log 0.5| > 0
    ranks m=2, m=1, m=3. Along m in NEW, 4 -> 1 ms at m=3 drops by more than 5%: one step."""
    cases = [GemmCase("bfloat16", m, 1024, 1024) for m in (1, 2, 3)]
    new = {1: 0.5, 2: 4.0, 3: 1.0}
    a, b = tmp_path / "a", tmp_path / "b"
    _quiet_merge([fake_run(tmp_path / "ra", cases, latency=1.0)], a)
    _quiet_merge([fake_run(tmp_path / "rb", cases, latency_of=lambda c: new[c.m])], b)
    done = run_cli("compare", str(a), str(b), "--op", "gemm")
    assert done.returncode == 0, done.stderr
    old1 = "old 1 ms [0.99-1.01, 10 samples]"
    assert done.stdout.splitlines() == [
        "gemm_perf: 3 shared keys; NEW/OLD median 1.000, p10 0.600, p90 3.400",
        "verdicts: 1 same, 1 faster, 1 slower, 0 ambiguous",
        "rule: intervals p25-p75; real change: disjoint by >= 0.5%; ambiguous: noise > 25% or < 10 samples; "
        "rows without quartiles: the same when NEW/OLD is within [0.952, 1.050] (tolerance 5%)",
        "largest real changes (2 rows faster or slower beyond both rows' noise):",
        f"  {KEY.format(m=2)}: slower x4.000: {old1}, new 4 ms [3.96-4.04, 10 samples]; intervals apart by 292.1%",
        f"  {KEY.format(m=1)}: faster x0.500: {old1}, new 0.5 ms [0.495-0.505, 10 samples]; intervals apart by 96.0%",
        "largest deviations:",
        f"  {KEY.format(m=2)}: old 1 ms, new 4 ms, ratio 4.000",
        f"  {KEY.format(m=1)}: old 1 ms, new 0.5 ms, ratio 0.500",
        f"  {KEY.format(m=3)}: old 1 ms, new 1 ms, ratio 1.000",
        "non-monotonic steps along m in NEW (drop > 5%): 1",
        f"  {KEY.format(m=3)}: 4 -> 1 ms",
    ]
    assert done.stdout.endswith("\n") and not done.stdout.endswith("\n\n")


def test_plan_diff_prints_each_count_dtype_dispatch_and_example(tmp_path):
    """OLD plans m=1,2; NEW m=2,4,8 (float32, one dispatch): +2 added (m=4, m=8), -1 removed (m=1), ~0 changed;
    float32 and the dispatch go 2 -> 3; the examples are the added IDs, sorted, then the removed one."""
    old = gemm_plan(tmp_path / "old.json", [(1, 1024, 1024), (2, 1024, 1024)])
    new = gemm_plan(tmp_path / "new.json", [(2, 1024, 1024), (4, 1024, 1024), (8, 1024, 1024)])
    done = run_cli("plan-diff", str(old), str(new))
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "gemm: +2 added, -1 removed, ~0 changed\n"
        "  dtype float32: 2 -> 3\n"
        "  dispatch torch.nn.functional.linear: 2 -> 3\n"
        "  e.g. gemm:float32:m=4,n=1024,k=1024\n"
        "  e.g. gemm:float32:m=8,n=1024,k=1024\n"
        "  e.g. gemm:float32:m=1,n=1024,k=1024\n"
    )
    same = run_cli("plan-diff", str(old), str(old))
    assert same.returncode == 0 and same.stdout == "gemm: unchanged\n", same.stderr


def _tables(tmp_path):
    root = tmp_path / "tables"
    cases = [GemmCase("bfloat16", m, n, 1024) for m in (1, 8) for n in (1024, 2048)]
    _quiet_merge([fake_run(tmp_path / "run", cases, status={"gemm:bfloat16:m=8,n=2048,k=1024": "oom"})], root)
    return root


def test_verify_prints_each_difference_by_kind_and_their_count(tmp_path):
    """One file modified (it is also the perf table the provenance record hashes: a sidecar mismatch), one
    missing, two planted: five differences, over the files the manifest lists."""
    tables = _tables(tmp_path)
    listed = len(json.loads((tables / "manifest.json").read_text())["files"])
    clean = run_cli("verify", str(tables))
    assert clean.returncode == 0 and clean.stdout == f"{listed} files checked: verified\n", clean.stderr
    perf = tables / DIR / "gemm_perf.parquet"
    data = bytearray(perf.read_bytes())
    data[len(data) // 2] ^= 0x01
    perf.write_bytes(bytes(data))
    (tables / DIR / ".opcollect/gemm_failures.parquet").unlink()
    (tables / DIR / "notes.txt").write_text("hello")
    (tables / "todo.txt").write_text("more")
    done = run_cli("verify", str(tables))
    assert done.returncode == 1, done.stderr
    assert done.stdout == (  # checked: the files the manifest lists, not the files on disk (one more here)
        f"modified: {DIR}/gemm_perf.parquet\n"
        f"missing: {DIR}/.opcollect/gemm_failures.parquet\n"
        f"unexpected: {DIR}/notes.txt\n"
        "unexpected: todo.txt\n"
        f"sidecar mismatch: {DIR}/gemm_perf.parquet\n"
        f"{listed} files checked: 5 differences\n"
    )


def test_check_prints_each_finding_then_its_violations_and_warnings(tmp_path):
    """fake_run's 1 ms for a bfloat16 GEMM of m <= 8, n <= 2048, k = 1024 is far under 1% of H200's speed of light
    (about 1 us to read a 2-4 MiB weight): R8 warns on each of the 3 measured rows (m=8,n=2048 failed), median and
    p10 0.0%. Clean otherwise: 0 violations, 1 warning. Then collection_meta.yaml's gemm_perf rows edited (3 measured
    rows, the file says 6): one R5 violation, as check_tables words it (tests/test_check_verify.py pins it)."""
    tables = _tables(tmp_path)
    perf = tables / DIR / "gemm_perf.parquet"
    keys = ", ".join(f"gemm_dtype=bfloat16,m={m},n={n},k=1024" for m, n in ((1, 1024), (1, 2048), (8, 1024)))
    sol = "speed of light on h200_sxm: median 0.0%, p10 0.0% of 3 rows; 3 rows under 1% of it"
    r8 = f"R8 warning: {perf}: {sol}: {keys}"
    clean = run_cli("check", str(tables))
    assert clean.returncode == 0, clean.stderr
    assert clean.stdout == f"{r8}\ncheck {tables}: 0 violations, 1 warnings\n"
    meta = tables / DIR / "collection_meta.yaml"
    data = yaml.safe_load(meta.read_text())
    data["tables"]["gemm_perf"]["rows"] = 6
    meta.write_text(yaml.safe_dump(data, sort_keys=False))
    done = run_cli("check", str(tables))
    assert done.returncode == 1, done.stderr
    # a directory whose sidecar disagrees with its record gets that one finding, no table rule (rules.py _check_v2)
    assert done.stdout.splitlines() == [
        f"R5 violation: {meta}: field 'tables.gemm_perf.rows' differs from .opcollect/provenance.yaml; "
        "restore the file or re-merge",
        f"check {tables}: 1 violations, 0 warnings",
    ]


def test_status_describes_each_shard_then_the_counts_by_state(tmp_path):
    """Four shards, one per state with a hint: 2 done, 1 failed, 1 running (counts sorted by state name); cases
    recorded are measured + failed: 4 + (3 + 1) + 0 + (1 + 1) = 10 of 4 x 4 = 16."""
    from opcollect.cluster.status import ShardStatus, describe

    states = [
        ShardStatus(0, "done", 4, 0, 4, "COMPLETED"),
        ShardStatus(1, "done", 3, 1, 4, None),
        ShardStatus(2, "failed", 0, 0, 4, "FAILED"),
        ShardStatus(3, "running", 1, 1, 4, "RUNNING"),
    ]
    assert describe(tmp_path, states).splitlines() == [
        "shard 0: done (Slurm: COMPLETED), 4/4 cases (0 failed)",
        "shard 1: done, 4/4 cases (1 failed)",
        "shard 2: failed (Slurm: FAILED), 0/4 cases (0 failed)",
        "shard 3: running (Slurm: RUNNING), 2/4 cases (1 failed)",
        f"{tmp_path}: 4 shards: 2 done, 1 failed, 1 running; 10/16 planned cases recorded",
        f"resubmit the shards not done: opcollect collect ... --slurm --resume {tmp_path}",
    ]
    pending = [ShardStatus(0, "pending", 0, 0, 3, "PENDING"), ShardStatus(1, "done", 2, 1, 3, None)]
    assert describe(tmp_path, pending).splitlines() == [
        "shard 0: pending (Slurm: PENDING), 0/3 cases (0 failed)",
        "shard 1: done, 3/3 cases (1 failed)",
        f"{tmp_path}: 2 shards: 1 done, 1 pending; 3/6 planned cases recorded",
    ]


def test_status_of_a_run_root_on_disk_counts_each_shards_own_records(tmp_path, monkeypatch):
    """A two-shard root; sacct (as Slurm prints it) says task 0 COMPLETING and task 1 FAILED. Shard 0 with every
    case recorded, one of them failed, is done whatever Slurm still says; shard 1 with none recorded is failed."""
    from opcollect.cluster.record import SlurmRecord, Submission, write_record
    from opcollect.cluster.status import describe, planned_ids, shard_states
    from opcollect.cluster.submit import prepare_root
    from opcollect.plans.planner import PlanOptions

    root, planned = prepare_root(find_project(), "torch", "cpu", PlanOptions(ops=("gemm",), smoke=True), 2,
                                 tmp_path / "run")  # fmt: skip
    write_record(root, SlurmRecord(2, (Submission("999999990", "999999991", (0, 1)),), None))
    slurm_says(tmp_path, monkeypatch, "999999990_0|COMPLETING\n999999990_1|FAILED\n")
    zero, one = (sorted(planned_ids(root / f"shard-{i}" / "plan.json")) for i in (0, 1))
    shard = root / "shard-0"
    (shard / "run.json").write_text("{}")
    (shard / "shards").mkdir(exist_ok=True)
    with open(shard / "shards" / "w0.jsonl", "w") as out:
        for i, case_id in enumerate(zero):
            out.write(json.dumps({"case_id": case_id, "status": "failed" if i == 0 else "ok", "attempt": 1}) + "\n")
    assert planned == len(zero) + len(one)
    assert describe(root, shard_states(root)).splitlines() == [
        f"shard 0: done (Slurm: COMPLETING), {len(zero)}/{len(zero)} cases (1 failed)",
        f"shard 1: failed (Slurm: FAILED), 0/{len(one)} cases (0 failed)",
        f"{root}: 2 shards: 1 done, 1 failed; {len(zero)}/{planned} planned cases recorded",
        f"resubmit the shards not done: opcollect collect ... --slurm --resume {root}",
    ]


def test_status_takes_each_cases_latest_attempt_and_of_equal_attempts_the_later_record(tmp_path):
    """As the run's own resume reads a shard (rundir.recorded): the highest attempt speaks, and of two records of
    one attempt (a worker killed after writing, its case run again under the same attempt) the later one."""
    from opcollect.cluster.status import _latest_status
    from opcollect.runtime.rundir import recorded

    shard = tmp_path / "shard-0"
    (shard / "shards").mkdir(parents=True)
    lines = [
        ("c1", 1, "failed"),
        ("c1", 1, "ok"),  # the same attempt, later: it stands
        ("c2", 2, "ok"),
        ("c2", 1, "failed"),  # an older attempt written after: it does not
        ("c3", 1, "ok"),
        ("c3", 1, "timeout"),
        ("elsewhere", 1, "ok"),  # not this shard's plan
    ]
    with open(shard / "shards" / "w0.jsonl", "w") as out:
        for case_id, attempt, status in lines:
            out.write(json.dumps({"case_id": case_id, "status": status, "attempt": attempt}) + "\n")
    found = _latest_status(shard, {"c1", "c2", "c3", "never"})
    assert found == {"c1": "ok", "c2": "ok", "c3": "timeout"}
    assert found == {cid: r["status"] for cid, r in recorded(shard).latest.items() if cid in found}


def test_the_end_of_run_summary_counts_rows_failures_by_class_and_missing_cases(tmp_path):
    """Six planned cases: m=2 failed oom, m=3 and m=5 failed timeout, m=4 never recorded: 2 rows, failures
    oom 1, timeout 2 (sorted by class), 1 of 6 missing; fake_run's rows ran their plan's dispatch (cutlass)."""
    from opcollect.runtime.run import RunSummary, describe

    cases = [GemmCase("bfloat16", m, 1024, 1024) for m in range(1, 7)]
    status = {f"gemm:bfloat16:m={m},n=1024,k=1024": s for m, s in ((2, "oom"), (3, "timeout"), (4, "missing"),
                                                                  (5, "timeout"))}  # fmt: skip
    run = fake_run(tmp_path / "run", cases, status=status)
    text = describe(RunSummary(run, "r1", 6, 0, 2, {"oom": 1, "timeout": 2}))
    assert text == (
        f"run r1: measured 2 this run (0 recorded before); {run}: 2 rows, failures oom 1, timeout 2, "
        "1 of 6 planned cases missing; every row ran the kernel its plan named"
    )
    with_cost = describe(RunSummary(run, "r1", 6, 0, 2, {"oom": 1, "timeout": 2}, cost="cost: a line"))
    assert with_cost.splitlines() == [text, "cost: a line"]
