"""The value rules (tables/values.py): merge admits only rows that pass them and counts the rest as garbage;
check enforces the same rules on what TABLES holds.

A rule: latency finite and positive (>= 0 for compute_scale, a difference of two timings), 0 <= p25 <= latency
<= p75 all finite, samples >= 1, noise finite and >= 0, timing graph/eager/cpu (none: a case the plan holds at 0,
not run), key columns equal to their case ID, timestamps that parse and are not in the future.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from conftest import fake_run, run_cli

from opcollect.plans.gemm import GemmCase
from opcollect.plans.quantize import QuantizeCase
from opcollect.project import find_project
from opcollect.tables.compare import compare_tables
from opcollect.tables.merge import merge
from opcollect.tables.provenance import PROVENANCE, read_provenance
from opcollect.tables.rules import check_tables
from opcollect.tables.sidecar import read_sidecar
from opcollect.tables.values import bad_time, record_faults
from opcollect.tables.verify import verify_tables

DIR = "h200_sxm/gemm/vllm/0.24.0"
CASES = [GemmCase("bfloat16", m, 1024, 1024) for m in range(1, 19)]


def _id(m: int) -> str:
    return f"gemm:bfloat16:m={m},n=1024,k=1024"


def _edit_records(run, edits: dict) -> None:
    """Rewrite the shard's records of the given case IDs: edits[case_id](record) changes one in place."""
    [shard] = list((run / "shards").glob("*.jsonl"))
    lines = []
    for raw in shard.read_text().splitlines():
        record = json.loads(raw)
        change = edits.get(record.get("case_id"))
        if change is not None:
            change(record)
        lines.append(json.dumps(record))  # NaN and Infinity written as Python writes them, as a crafted shard may
    shard.write_text("\n".join(lines) + "\n")


def _stats(**values):
    def change(record):
        record["stats"].update(values)

    return change


def _set(**values):
    def change(record):
        record.update(values)

    return change


def _ids(tables) -> set[str]:
    return set(pq.read_table(tables / DIR / "gemm_perf.parquet")["case_id"].to_pylist())


# every way a status=ok record can fail the rules, one case each; m=18 stays good
BROKEN = {
    _id(1): _set(stats=None),  # status ok with no stats
    _id(2): _stats(latency=float("nan")),
    _id(3): _stats(latency=-0.125, latency_p25=-0.2),
    _id(4): _stats(latency=0.0, latency_p25=0.0),
    _id(5): _stats(samples=0),
    _id(6): _stats(noise=-1.0),
    _id(7): _stats(noise=float("nan")),
    _id(8): _stats(timing="bogus"),
    _id(9): _stats(latency_p25=2.0),  # p25 above the median
    _id(10): _stats(latency_p75=float("inf")),
    _id(11): _set(recorded_at="2999-01-01T00:00:00.000+00:00"),  # in the future
    _id(12): _set(recorded_at="not a date"),
    _id(13): _set(attempt="x"),  # a line of the wrong type: garbage, not an ArrowInvalid traceback
    _id(14): _stats(latency="fast"),
    _id(15): _set(status="bogus"),
    _id(16): _set(attempt=0),  # attempts count from 1
    _id(17): lambda record: record.pop("recorded_at"),  # no time: it could win over any timed record
}


def test_merge_admits_only_records_that_pass_the_value_rules(tmp_path):
    run = fake_run(tmp_path / "run", CASES)
    _edit_records(run, BROKEN)
    tables = tmp_path / "tables"
    done = run_cli("merge", str(run), "--into", str(tables))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert f"{run}: skipped {len(BROKEN)} garbage shard lines (2 not a record, " in done.stdout, done.stdout
    # each line once, under the first rule it breaks: no stats, NaN, negative and 0 are the latency's four
    assert (
        "(2 not a record, 1 status neither ok nor failed, 1 attempt below 1, 3 recorded_at unparsable or in the "
        "future, 4 latency not "
        "finite and positive, 2 0 <= p25 <= latency <= p75 broken, 1 samples below 1, 2 noise not finite and >= 0, 1 "
        "timing not one of graph, eager, cpu, none)"
    ) in done.stdout, done.stdout
    assert _ids(tables) == {_id(18)}  # none of the broken records became a row, nor a failure
    assert pq.read_table(tables / DIR / ".opcollect/gemm_failures.parquet").num_rows == 0
    [event] = read_provenance(tables / DIR / PROVENANCE).tables["gemm_perf"].events
    assert event.garbage_lines == len(BROKEN) and event.rows == 1
    assert read_provenance(tables / DIR / PROVENANCE).tables["gemm_perf"].status == "partial"
    findings = check_tables(tables)
    assert [f.render() for f in findings if not f.warning] == []
    # the broken cases are planned and missing: a partial table
    assert [f.rule for f in findings if f.rule != "R8"] == ["R4"]


def test_a_failure_record_is_held_to_the_rules_that_apply_to_it(tmp_path):
    """A failure has no stats: it passes without them, but not with a recorded_at that does not parse."""
    run = fake_run(tmp_path / "run", CASES[:3], status={_id(1): "oom", _id(2): "oom"})
    _edit_records(run, {_id(2): _set(recorded_at="yesterday")})
    tables = tmp_path / "tables"
    merge([run], tables, find_project(), say=lambda line: None)
    failures = pq.read_table(tables / DIR / ".opcollect/gemm_failures.parquet")["case_id"].to_pylist()
    assert failures == [_id(1)] and _ids(tables) == {_id(3)}


def test_r3_refuses_a_latency_of_exactly_zero(tmp_path):
    """0 ms is no measurement: merge does not admit it and check names it; the smallest positive latency passes."""
    run = fake_run(tmp_path / "run", CASES[:3], latency_of=lambda c: {1: 0.0, 2: 5e-324}.get(c.m, 1.0))
    tables = tmp_path / "tables"
    merge([run], tables, find_project(), say=lambda line: None)
    assert _ids(tables) == {_id(2), _id(3)}
    path = tables / DIR / "gemm_perf.parquet"
    perf = pq.read_table(path)
    for name in ("latency", "latency_p25"):  # p25 0 too: the quantiles stay in order, latency alone is wrong
        values = [0.0 if cid == _id(3) else v for cid, v in zip(perf["case_id"].to_pylist(), perf[name].to_pylist())]
        perf = perf.set_column(perf.schema.get_field_index(name), name, pa.array(values, pa.float64()))
    pq.write_table(perf, path)
    r3 = [f for f in check_tables(tables) if f.rule == "R3"]
    assert [(f.message, f.keys, f.warning) for f in r3] == [("latency not finite and positive", (_id(3),), False)]


def test_the_sidecar_keeps_runs_that_left_only_failures(tmp_path):
    """collection_meta.yaml lists each run that left rows or failures: a run of failures alone is one of them; a run
    that left neither is listed only when no run left anything."""
    measured = fake_run(tmp_path / "a", CASES[:2], run_id="a", recorded_at="2026-11-01T00:00:00.000+00:00")
    failed = fake_run(
        tmp_path / "b",
        CASES[2:4],
        run_id="b",
        recorded_at="2026-11-02T00:00:00.000+00:00",
        status={_id(3): "oom", _id(4): "kernel_limit"},
    )
    nothing = fake_run(
        tmp_path / "c", CASES[4:5], run_id="c", recorded_at="2026-11-03T00:00:00.000+00:00", status={_id(5): "missing"}
    )
    tables = tmp_path / "tables"
    merge([measured, failed, nothing], tables, find_project())
    [meta] = read_sidecar(tables / DIR / "collection_meta.yaml").tables.values()
    assert [(c.collected_at[:10], c.rows) for c in meta.collections] == [("2026-11-01", 2), ("2026-11-02", 0)]
    events = read_provenance(tables / DIR / PROVENANCE).tables["gemm_perf"].events
    assert [(e.run_id, e.rows, e.failures) for e in events] == [("a", 2, 0), ("b", 0, 2), ("c", 0, 0)]


def _rehash(tables, rel: str) -> None:
    manifest = tables / "manifest.json"
    data = json.loads(manifest.read_text())
    path = tables / rel
    data["files"][rel] = {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "size": path.stat().st_size}
    manifest.write_text(json.dumps(data, indent=1) + "\n")


def test_a_stored_row_that_fails_the_value_rules_does_not_stick(tmp_path):
    """A row TABLES holds from before merge held rows to the rules (NaN latency, a key column its case ID does not
    name) is dropped by the next merge, which says so; the table is partial until the case is measured again."""
    tables = tmp_path / "tables"
    merge([fake_run(tmp_path / "a", CASES[:3], run_id="a")], tables, find_project())
    path = tables / DIR / "gemm_perf.parquet"
    perf = pq.read_table(path)
    latency = [float("nan"), *perf["latency"].to_pylist()[1:]]
    perf = perf.set_column(perf.schema.get_field_index("latency"), "latency", pa.array(latency, pa.float64()))
    m = [1, 4096, 3]  # the row of m=2 says m=4096
    perf = perf.set_column(perf.schema.get_field_index("m"), "m", pa.array(m, pa.int64()))
    pq.write_table(perf, path)
    record = tables / DIR / PROVENANCE
    data = yaml.safe_load(record.read_text())
    data["tables"]["gemm_perf"]["file_sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    record.write_text(yaml.safe_dump(data, sort_keys=False))
    for rel in (f"{DIR}/gemm_perf.parquet", f"{DIR}/{PROVENANCE}"):
        _rehash(tables, rel)
    assert verify_tables(tables).clean  # a tree that verifies, holding rows that check refuses
    rules = {(f.rule, f.message) for f in check_tables(tables)}
    assert ("R3", "latency not finite and positive") in rules and ("R6", "m is not the one its case ID names") in rules
    said = []
    merge([fake_run(tmp_path / "b", CASES[3:4], run_id="b")], tables, find_project(), say=said.append)
    assert said == [
        f"{tables / DIR / 'gemm_perf.parquet'}: dropped stored rows that fail the value rules (1 latency not finite "
        "and positive, 1 m is not the one its case ID names); re-collect them"  # NaN breaks the order too: counted once
    ]
    assert _ids(tables) == {_id(3), _id(4)}
    assert read_provenance(tables / DIR / PROVENANCE).tables["gemm_perf"].status == "partial"
    assert [f.render() for f in check_tables(tables) if not f.warning] == []


def test_check_holds_failures_key_columns_to_their_case_id(tmp_path):
    tables = tmp_path / "tables"
    merge([fake_run(tmp_path / "a", CASES[:2], status={_id(1): "oom"})], tables, find_project())
    path = tables / DIR / ".opcollect/gemm_failures.parquet"
    failures = pq.read_table(path)
    failures = failures.set_column(failures.schema.get_field_index("n"), "n", pa.array([7], pa.int64()))
    pq.write_table(failures, path)
    [finding] = [f for f in check_tables(tables) if f.rule == "R6"]
    assert (finding.path, finding.message, finding.keys) == (str(path), "n is not the one its case ID names", (_id(1),))


# compute_scale: a latency that is a difference of two timings (OpPlan.latency_is_difference), at least 0
QDIR = "h200_sxm/quantize/vllm/0.24.0"
QSOURCE = "dynamic_per_token_scaled_fp8_quant_minus_static_scaled_fp8_quant"
QCASES = [QuantizeCase(m, 4096, "fp8") for m in (1, 2, 4, 8)]


def _qids(tables) -> dict[int, float]:
    perf = pq.read_table(tables / QDIR / "computescale_perf.parquet")
    return dict(zip(perf["m"].to_pylist(), perf["latency"].to_pylist()))


def test_a_compute_scale_row_of_latency_0_is_merged_and_passes_check(tmp_path):
    """The dynamic quant no slower than the static one: the row says 0, as the reference's do (runtime/harness.py
    difference()); merge admits it and check's R3 passes it. Below 0 is still refused."""
    latencies = {1: 0.0, 2: -1e-3, 4: 0.0, 8: 2e-3}
    run = fake_run(
        tmp_path / "run", QCASES, op="compute_scale", kernel_source=QSOURCE, latency_of=lambda c: latencies[c.m]
    )
    tables = tmp_path / "tables"
    done = run_cli("merge", str(run), "--into", str(tables))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "(1 latency not finite and >= 0)" in done.stdout, done.stdout
    assert _qids(tables) == {1: 0.0, 4: 0.0, 8: 2e-3}
    findings = check_tables(tables)
    assert [f.render() for f in findings if not f.warning] == []
    assert [f.rule for f in findings if f.rule != "R8"] == ["R4"]  # m=2 is planned and missing: a partial table
    # a stored compute_scale row below 0 is named under R3 with the rule its op is held to
    path = tables / QDIR / "computescale_perf.parquet"
    perf = pq.read_table(path)
    values = [-1e-3 if m == 8 else v for m, v in zip(perf["m"].to_pylist(), perf["latency"].to_pylist())]
    perf = perf.set_column(perf.schema.get_field_index("latency"), "latency", pa.array(values, pa.float64()))
    pq.write_table(perf, path)
    r3 = [(f.message, f.keys) for f in check_tables(tables) if f.rule == "R3"]
    assert ("latency not finite and >= 0", (perf["case_id"][perf["m"].to_pylist().index(8)].as_py(),)) in r3
    assert all(message != "latency not finite and positive" for message, _ in r3)


def test_compare_takes_no_ratio_of_a_compute_scale_row_of_0(tmp_path):
    latency_of = lambda c: 0.0 if c.m < 4 else 1e-3  # noqa: E731
    run = fake_run(tmp_path / "run", QCASES, op="compute_scale", kernel_source=QSOURCE, latency_of=latency_of)
    tables = tmp_path / "tables"
    merge([run], tables, find_project(), say=lambda line: None)
    path = tables / QDIR / "computescale_perf.parquet"
    c = compare_tables(path, path)
    assert c.shared == 2 and c.median == 1.0
    assert c.left_out == [f"{path}: left out 2 rows: latency 0 (a difference of two timings), no ratio"] * 2


def test_shard_records_are_held_to_the_latency_rule_of_their_own_op():
    """One shard may hold records of several ops: a latency of 0 is admitted for a compute_scale record alone."""
    ops = ["gemm", "compute_scale", "compute_scale", "gemm", "scale_matrix"]
    latency = [0.0, 0.0, -1e-3, 1.0, 0.0]
    records = pa.table(
        {
            "op": ops,
            "status": ["ok"] * 5,
            "attempt": [1] * 5,
            "recorded_at": ["2026-11-30T00:00:00.000+00:00"] * 5,
            "stats.latency": latency,
            "stats.latency_p25": [max(v, 0.0) for v in latency],
            "stats.latency_p75": [max(v, 0.0) for v in latency],
            "stats.samples": [10] * 5,
            "stats.noise": [0.0] * 5,
            "stats.timing": ["graph"] * 5,
        }
    )
    faults = {f.what: f.mask.to_pylist() for f in record_faults(records)}
    assert faults == {
        "latency not finite and positive": [True, False, False, False, True],
        "latency not finite and >= 0": [False, False, True, False, False],
        "0 <= p25 <= latency <= p75 broken": [False, False, True, False, False],  # below 0 is below p25 too
    }


def test_stored_failures_carry_their_attempts_through_a_later_merge(tmp_path):
    """A failure TABLES holds keeps its attempt count when another run merges in; a later failed attempt replaces it."""
    tables = tmp_path / "tables"
    first = fake_run(tmp_path / "a", CASES[:2], run_id="a", status={_id(1): "oom"})
    _edit_records(first, {_id(1): _set(attempt=3)})
    merge([first], tables, find_project(), say=lambda line: None)
    merge([fake_run(tmp_path / "b", CASES[2:3], run_id="b")], tables, find_project(), say=lambda line: None)
    failures = pq.read_table(tables / DIR / ".opcollect/gemm_failures.parquet")
    assert list(zip(failures["case_id"].to_pylist(), failures["attempts"].to_pylist())) == [(_id(1), 3)]
    again = fake_run(
        tmp_path / "c", CASES[:1], run_id="c", status={_id(1): "oom"}, recorded_at="2026-11-30T01:00:00.000+00:00"
    )
    _edit_records(again, {_id(1): _set(attempt=4)})
    merge([again], tables, find_project(), say=lambda line: None)
    failures = pq.read_table(tables / DIR / ".opcollect/gemm_failures.parquet")
    assert failures["attempts"].to_pylist() == [4] and _ids(tables) == {_id(2), _id(3)}


def test_a_time_minutes_ahead_is_clock_skew_and_an_hour_ahead_is_the_future():
    """Hosts' clocks differ by a little: up to ten minutes ahead of the merging host is skew, more is refused."""
    now = datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc)

    def ahead(minutes: float) -> str:
        return (now + timedelta(minutes=minutes)).isoformat()

    assert bad_time(ahead(-600), now) is None and bad_time(ahead(9), now) is None and bad_time(ahead(10), now) is None
    for minutes in (11, 60, 600):
        assert bad_time(ahead(minutes), now) == f"{ahead(minutes)!r} is in the future"
    assert bad_time("2026-12-02T12:05:00+05:00", now) is None  # 07:05 UTC: hours behind, whatever its offset says
    assert bad_time("2026-12-02T12:05:00", now) == "'2026-12-02T12:05:00' has no UTC offset"
