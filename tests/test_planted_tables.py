"""Table behaviours that small planted bugs once broke unnoticed: check rules R1-R6, merge choices, compare."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import fake_run

from opcollect.plans.gemm import GemmCase
from opcollect.project import find_project
from opcollect.tables.compare import compare_tables
from opcollect.tables.merge import merge
from opcollect.tables.provenance import PROVENANCE, read_provenance
from opcollect.tables.rules import check_tables
from opcollect.tables.schema import schema_for_op
from opcollect.tables.sidecar import read_sidecar
from opcollect.tables.verify import verify_tables

CASES = [GemmCase("bfloat16", m, n, 1024) for m in (1, 8, 64) for n in (1024, 2048)]
FAILED = "gemm:bfloat16:m=64,n=2048,k=1024"
DIR = "h200_sxm/gemm/vllm/0.24.0"


@pytest.fixture
def tables(tmp_path):
    root = tmp_path / "tables"
    merge([fake_run(tmp_path / "run", CASES, status={FAILED: "oom"})], root, find_project())
    # R8 (speed of light) reads every table of fabricated latencies as slow: tests/test_physics.py holds it
    assert [f.render() for f in check_tables(root) if f.rule != "R8"] == []
    return root


def _rewrite(tables, name, change):
    path = tables / DIR / name
    pq.write_table(change(pq.read_table(path)), path)


def _set(table, column, values):
    return table.set_column(table.schema.get_field_index(column), column, values)


def _findings(tables, rule):
    return [f for f in check_tables(tables) if f.rule == rule and not f.warning]


# -- check rules -----------------------------------------------------------------------------------


def test_r1_notices_swapped_columns(tables):
    def swap(t):
        names = list(t.column_names)
        i, j = names.index("latency_p25"), names.index("latency_p75")
        names[i], names[j] = names[j], names[i]
        return t.select(names)  # same columns, same values, other order

    _rewrite(tables, "gemm_perf.parquet", swap)
    [finding] = _findings(tables, "R1")
    assert "differ" in finding.message and finding.path.endswith("gemm_perf.parquet")


def test_r1_notices_swapped_columns_in_the_failures_table(tables):
    def swap(t):
        names = list(t.column_names)
        i, j = names.index("error_class"), names.index("message")
        names[i], names[j] = names[j], names[i]
        return t.select(names)

    _rewrite(tables, ".opcollect/gemm_failures.parquet", swap)
    [finding] = _findings(tables, "R1")
    assert finding.path.endswith(".opcollect/gemm_failures.parquet")


def test_r3_notices_latency_above_p75(tables):
    _rewrite(tables, "gemm_perf.parquet", lambda t: _set(t, "latency_p75", pc.multiply(t["latency"], 0.999)))
    [finding] = _findings(tables, "R3")
    assert "p25 <= latency <= p75" in finding.message and len(finding.keys) == 5


def test_r3_notices_latency_below_p25(tables):
    _rewrite(tables, "gemm_perf.parquet", lambda t: _set(t, "latency_p25", pc.multiply(t["latency"], 1.001)))
    [finding] = _findings(tables, "R3")
    assert "p25 <= latency <= p75" in finding.message


def test_r4_notices_a_failure_outside_the_plan(tables):
    _rewrite(tables, ".opcollect/gemm_plan.parquet", lambda t: t.filter(pc.not_equal(t["case_id"], FAILED)))
    findings = _findings(tables, "R4")
    assert [f.message for f in findings] == ["failures outside the plan"]
    assert findings[0].keys == (FAILED,)


def test_r4_notices_a_row_outside_the_plan(tables):
    measured = "gemm:bfloat16:m=1,n=1024,k=1024"
    _rewrite(tables, ".opcollect/gemm_plan.parquet", lambda t: t.filter(pc.not_equal(t["case_id"], measured)))
    assert [(f.message, f.keys) for f in _findings(tables, "R4")] == [("rows outside the plan", (measured,))]


def test_r4_notices_a_case_both_measured_and_failed(tables):
    measured = "gemm:bfloat16:m=1,n=1024,k=1024"
    _rewrite(
        tables, ".opcollect/gemm_failures.parquet", lambda t: _set(t, "case_id", pa.array([measured] * t.num_rows))
    )
    messages = [f.message for f in _findings(tables, "R4")]
    assert "cases both measured and failed" in messages


def _edit_sidecar(tables, change, name=PROVENANCE):
    path = tables / DIR / name
    data = yaml.safe_load(path.read_text())
    change(data["tables"]["gemm_perf"])
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def test_r5_notices_a_wrong_failure_count(tables):
    _edit_sidecar(tables, lambda t: t.update(failures=t["failures"] + 1))  # the record alone counts failures
    [finding] = _findings(tables, "R5")
    assert "5 rows/1 failures, sidecar says 5/2" in finding.message


def test_r5_notices_a_wrong_row_count(tables):
    # both files edited alike: collection_meta.yaml says what the record makes, and the files disagree
    _edit_sidecar(tables, lambda t: t.update(rows=t["rows"] - 1))
    _edit_sidecar(tables, lambda t: t.update(rows=t["rows"] - 1), name="collection_meta.yaml")
    [finding] = _findings(tables, "R5")
    assert "sidecar says 4/1" in finding.message


def test_r6_notices_a_wrong_version(tables):
    _rewrite(tables, "gemm_perf.parquet", lambda t: _set(t, "version", pa.array(["0.23.0"] * t.num_rows)))
    [finding] = _findings(tables, "R6")
    assert "version is not '0.24.0'" in finding.message and len(finding.keys) == 5


@pytest.mark.parametrize("column,value", [("framework", "SGLang"), ("op_name", "bmm")])
def test_r6_notices_a_wrong_framework_or_op_name(tables, column, value):
    _rewrite(tables, "gemm_perf.parquet", lambda t: _set(t, column, pa.array([value] * t.num_rows)))
    [finding] = _findings(tables, "R6")
    assert finding.message.startswith(f"{column} is not")


# -- merge -----------------------------------------------------------------------------------------


def _rows(tables):
    return {r["case_id"]: r for r in pq.read_table(tables / DIR / "gemm_perf.parquet").to_pylist()}


def _failures(tables):
    return {r["case_id"]: r for r in pq.read_table(tables / DIR / ".opcollect/gemm_failures.parquet").to_pylist()}


def test_a_newer_measurement_replaces_an_older_one_and_a_failure_never_does(tmp_path):
    tables = tmp_path / "tables"
    first = fake_run(tmp_path / "a", CASES, latency=1.0, run_id="a", recorded_at="2026-01-01T00:00:00.000+00:00")
    merge([first], tables, find_project())
    newer = fake_run(
        tmp_path / "b",
        CASES,
        latency=2.0,
        run_id="b",
        recorded_at="2026-02-01T00:00:00.000+00:00",
        status={FAILED: "oom"},
    )
    merge([newer], tables, find_project())
    rows = _rows(tables)
    assert len(rows) == len(CASES) and not _failures(tables)  # the later oom did not replace the row
    assert rows[FAILED]["latency"] == 1.0
    assert {r["latency"] for cid, r in rows.items() if cid != FAILED} == {2.0}
    assert verify_tables(tables).clean  # every rewritten file is hashed anew in the manifest
    assert [f.render() for f in check_tables(tables) if f.rule != "R8"] == []


def test_the_latest_record_wins_within_one_merge(tmp_path):
    old = fake_run(tmp_path / "a", CASES, latency=3.0, run_id="a", recorded_at="2026-01-01T00:00:00.000+00:00")
    new = fake_run(tmp_path / "b", CASES, latency=2.0, run_id="b", recorded_at="2026-03-01T00:00:00.000+00:00")
    for order in ([old, new], [new, old]):
        tables = tmp_path / f"tables-{order[0].name}"
        merge(order, tables, find_project())
        assert {r["latency"] for r in _rows(tables).values()} == {2.0}


def test_a_table_with_unrecorded_cases_is_partial(tmp_path):
    tables = tmp_path / "tables"
    [written] = merge([fake_run(tmp_path / "r", CASES, status={FAILED: "missing"})], tables, find_project())
    assert written.status == "partial"
    meta = read_sidecar(tables / DIR / "collection_meta.yaml")
    assert meta.tables["gemm_perf"].status == "partial"
    assert read_provenance(tables / DIR / PROVENANCE).tables["gemm_perf"].status == "partial"
    findings = check_tables(tables)
    assert [f.rule for f in findings if not f.warning] == []
    assert [(f.rule, f.keys) for f in findings if f.warning and f.rule != "R8"] == [("R4", (FAILED,))]
    [complete] = merge([fake_run(tmp_path / "r2", CASES, run_id="r2")], tmp_path / "t2", find_project())
    assert complete.status == "complete"


def test_sidecar_events_count_each_runs_rows_and_failures(tmp_path):
    tables = tmp_path / "tables"
    run = fake_run(tmp_path / "r", CASES, status={FAILED: "oom", "gemm:bfloat16:m=1,n=1024,k=1024": "timeout"})
    merge([run], tables, find_project())
    [event] = read_provenance(tables / DIR / PROVENANCE).tables["gemm_perf"].events
    assert (event.run_id, event.rows, event.failures) == ("r1", 4, 2)
    [collection] = read_sidecar(tables / DIR / "collection_meta.yaml").tables["gemm_perf"].collections
    assert collection.rows == 4


# -- compare ---------------------------------------------------------------------------------------


def _perf_table(path, rows):
    """A gemm perf table from (m, kernel_source, latency) rows."""
    schema = schema_for_op("gemm").perf
    records = [
        {
            "framework": "VLLM",
            "version": "0.24.0",
            "device": "NVIDIA H200",
            "op_name": "gemm",
            "kernel_source": kernel,
            "gemm_dtype": "bfloat16",
            "m": m,
            "n": 1024,
            "k": 1024,
            "latency": latency,
            "latency_p25": latency,
            "latency_p75": latency,
            "samples": 10,
            "noise": 0.0,
            "timing": "graph",
            "case_id": f"gemm:bfloat16:m={m},n=1024,k=1024",
        }
        for m, kernel, latency in rows
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records, schema=schema), path)
    return path


def test_compare_takes_the_fastest_kernel_of_old_and_of_new(tmp_path):
    old = _perf_table(tmp_path / "old" / "gemm_perf.parquet", [(1, "a", 2.0), (1, "b", 1.0), (2, "a", 4.0)])
    new = _perf_table(tmp_path / "new" / "gemm_perf.parquet", [(1, "a", 1.5), (1, "c", 3.0), (2, "c", 2.0)])
    c = compare_tables(old, new)
    assert c.shared == 2
    by_key = {key: (o, n, q) for key, o, n, q in c.largest}
    assert by_key["op_name=gemm,gemm_dtype=bfloat16,m=1,n=1024,k=1024"] == (1.0, 1.5, 1.5)
    assert by_key["op_name=gemm,gemm_dtype=bfloat16,m=2,n=1024,k=1024"] == (4.0, 2.0, 0.5)
    assert c.median == pytest.approx(1.0)  # of 1.5 and 0.5
    assert sorted(c.points) == [(1.0, 1.5), (2.0, 0.5)]


def test_non_monotonic_steps_are_found_per_kernel(tmp_path):
    table = [(1, "a", 1.0), (1, "b", 2.0), (2, "a", 1.1), (2, "b", 2.2), (4, "a", 1.2), (4, "b", 2.4)]
    path = _perf_table(tmp_path / "t" / "gemm_perf.parquet", table)
    assert compare_tables(path, path).non_monotonic == []
    dip = _perf_table(tmp_path / "d" / "gemm_perf.parquet", table[:4] + [(4, "a", 0.5), (4, "b", 2.4)])
    [(key, before, after)] = compare_tables(dip, dip).non_monotonic
    assert key == "op_name=gemm,gemm_dtype=bfloat16,m=4,n=1024,k=1024" and (before, after) == (1.1, 0.5)


def test_a_step_counts_as_non_monotonic_past_a_five_percent_drop(tmp_path):
    base = [(1, "a", 1.0), (2, "a", 1.1)]
    within = _perf_table(tmp_path / "w" / "gemm_perf.parquet", [*base, (4, "a", 1.1 * 0.951)])
    assert compare_tables(within, within).non_monotonic == []
    past = _perf_table(tmp_path / "p" / "gemm_perf.parquet", [*base, (4, "a", 1.1 * 0.949)])
    [(_, before, after)] = compare_tables(past, past).non_monotonic
    assert (before, after) == (1.1, 1.1 * 0.949)
