"""compare: reference against itself, two of our runs, monotonicity, and the plot."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import REFERENCE, fake_run, run_cli

from opcollect.errors import InputError
from opcollect.plans.gemm import GemmCase
from opcollect.project import find_project
from opcollect.tables.compare import compare_tables, version_pairs
from opcollect.tables.merge import merge


def test_reference_table_against_itself():
    path = REFERENCE / "gemm/vllm/0.24.0/gemm_perf.parquet"
    c = compare_tables(path, path)
    # every distinct (op_name, gemm_dtype, m, n, k) of the fixture slice is one shared key, counted here independently
    key = ["op_name", "gemm_dtype", "m", "n", "k"]
    assert c.shared == pq.read_table(path, columns=key).group_by(key).aggregate([]).num_rows > 10
    assert c.median == c.p10 == c.p90 == 1.0
    assert all(ratio == 1.0 for *_, ratio in c.largest) and len(c.largest) == 10
    attention = compare_tables(REFERENCE / "attention", REFERENCE / "attention", op="attention_generation")
    assert attention.table == "generation_attention_perf" and attention.median == 1.0


def test_two_runs_of_ours(tmp_path):
    cases = [GemmCase("bfloat16", m, n, 4096) for m in (1, 16, 256) for n in (1024, 4096)]
    a, b = tmp_path / "a", tmp_path / "b"
    merge([fake_run(tmp_path / "ra", cases, latency=1.0)], a, find_project())
    merge([fake_run(tmp_path / "rb", cases, latency=1.5)], b, find_project())
    png = tmp_path / "ratio.png"
    done = run_cli("compare", str(a), str(b), "--op", "gemm", "--plot", str(png))
    assert done.returncode == 0, done.stderr
    assert "gemm_perf: 6 shared keys; NEW/OLD median 1.500, p10 1.500, p90 1.500" in done.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_non_monotonic_steps_are_reported(tmp_path):
    cases = [GemmCase("bfloat16", m, 1024, 1024) for m in (1, 2, 4, 8)]
    tables = tmp_path / "t"
    run = fake_run(tmp_path / "r", cases)
    # make m=4 faster than m=2 by rewriting the shard's latencies in place
    shard = next((run / "shards").glob("*.jsonl"))
    text = shard.read_text().splitlines()
    text = [
        line.replace('"latency":1.0,', '"latency":0.5,').replace('"latency_p25":0.99', '"latency_p25":0.49')
        if "m=4," in line
        else line
        for line in text
    ]
    shard.write_text("\n".join(text) + "\n")
    merge([run], tables, find_project())
    c = compare_tables(tables, tables, op="gemm")
    assert [key for key, *_ in c.non_monotonic] == ["op_name=gemm,gemm_dtype=bfloat16,m=4,n=1024,k=1024"]


def test_ambiguous_directory_asks_for_op():
    with pytest.raises(InputError, match="2 tables match; pick one with --op"):
        compare_tables(REFERENCE / "attention", REFERENCE / "attention")


def test_rows_without_a_finite_positive_latency_are_left_out_and_named(tmp_path):
    """A NaN or negative latency gives no ratio: no 'ratio -0.125' nor 'median nan'; a warning counts them."""
    cases = [GemmCase("bfloat16", m, 1024, 1024) for m in (1, 2, 4, 8)]
    a, b = tmp_path / "a", tmp_path / "b"
    merge([fake_run(tmp_path / "ra", cases, latency=1.0)], a, find_project())
    merge([fake_run(tmp_path / "rb", cases, latency=2.0)], b, find_project())
    path = b / "h200_sxm/gemm/vllm/0.24.0/gemm_perf.parquet"
    table = pq.read_table(path)
    latency = [float("nan"), -0.125, 2.0, 2.0]  # as a table written before merge held rows to the value rules
    pq.write_table(table.set_column(table.schema.get_field_index("latency"), "latency", pa.array(latency)), path)
    c = compare_tables(a, b, op="gemm")
    assert (c.shared, c.median, c.p10, c.p90) == (2, 2.0, 2.0, 2.0)
    assert all(ratio == 2.0 for *_, ratio in c.largest)
    assert c.left_out == [f"{path}: left out 2 rows: latency not finite and positive"]
    done = run_cli("compare", str(a), str(b))
    assert done.returncode == 0 and "nan" not in done.stdout and "-0.125" not in done.stdout, done.stdout
    assert f"warning: {path}: left out 2 rows: latency not finite and positive" in done.stdout


def test_tables_of_two_ops_are_named_as_such(tmp_path):
    """NEW holds no table of OLD's op: --op cannot help, and the message does not suggest it."""
    merge([fake_run(tmp_path / "r", [GemmCase("bfloat16", 1, 8, 8)])], tmp_path / "t", find_project())
    with pytest.raises(
        InputError, match="attention: no gemm_perf table to compare with OLD's .*; give two tables"
    ) as e:
        compare_tables(tmp_path / "t", REFERENCE / "attention")
    assert "--op" not in str(e.value)


def test_an_absent_path_and_tables_without_a_shared_key(tmp_path):
    with pytest.raises(InputError) as e:
        compare_tables(tmp_path / "absent", REFERENCE / "gemm")
    assert str(e.value) == f"{tmp_path / 'absent'}: no such table or directory"
    a, b = tmp_path / "a", tmp_path / "b"
    merge([fake_run(tmp_path / "ra", [GemmCase("bfloat16", 1, 1024, 1024)])], a, find_project())
    merge([fake_run(tmp_path / "rb", [GemmCase("bfloat16", 2, 1024, 1024)])], b, find_project())
    with pytest.raises(InputError) as e:
        compare_tables(a, b)
    perf = "h200_sxm/gemm/vllm/0.24.0/gemm_perf.parquet"
    assert str(e.value) == f"{a / perf} and {b / perf} share no key; are they the same op and grid?"


def test_version_pairs_join_only_the_tables_opcollect_writes(tmp_path):
    """bump-report's pairs: each table of the backend at OLD with the same table at NEW; a table no schema of ours
    names (nothing to join it on) and a table NEW lacks make no pair."""
    tables = tmp_path / "t"
    cases = [GemmCase("bfloat16", 1, 1024, 1024)]
    merge(
        [fake_run(tmp_path / "a", cases), fake_run(tmp_path / "b", cases, version="0.25.0", run_id="b")],
        tables,
        find_project(),
    )
    old, new = tables / "h200_sxm/gemm/vllm/0.24.0", tables / "h200_sxm/gemm/vllm/0.25.0"
    for directory in (old, new):
        (directory / "custom_perf.parquet").write_bytes((old / "gemm_perf.parquet").read_bytes())
    (old / "moe_perf.parquet").write_bytes((old / "gemm_perf.parquet").read_bytes())
    assert version_pairs(tables, tables, "vllm", "0.24.0", "0.25.0") == [
        (old / "gemm_perf.parquet", new / "gemm_perf.parquet")
    ]


def test_plot_without_matplotlib_is_one_line(tmp_path):
    a = tmp_path / "a"
    merge([fake_run(tmp_path / "ra", [GemmCase("bfloat16", m, 1024, 1024) for m in (1, 2)])], a, find_project())
    blocker = tmp_path / "blocker" / "matplotlib"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('matplotlib is not installed here')\n")
    png = tmp_path / "ratio.png"
    done = run_cli(
        "compare",
        str(a),
        str(a),
        "--plot",
        str(png),
        env={"PYTHONPATH": os.pathsep.join(filter(None, (str(blocker.parent), os.environ.get("PYTHONPATH"))))},
    )
    assert (
        done.returncode == 2
        and done.stderr == "opcollect: error: --plot needs matplotlib: pip install 'opcollect[plot]'\n"
    )
    assert not png.exists()


def test_the_summary_names_the_tenth_and_ninetieth_percentiles_of_the_ratios(tmp_path):
    """Eleven keys whose NEW/OLD ratios are 1.0, 1.1, ..., 2.0: p10 1.1, median 1.5, p90 1.9."""
    cases = [GemmCase("bfloat16", m, 1024, 1024) for m in range(1, 12)]
    a, b = tmp_path / "a", tmp_path / "b"
    merge([fake_run(tmp_path / "ra", cases, latency=1.0)], a, find_project(), say=lambda line: None)
    merge([fake_run(tmp_path / "rb", cases, latency_of=lambda c: 1.0 + (c.m - 1) / 10)], b, find_project(),
          say=lambda line: None)  # fmt: skip
    c = compare_tables(a, b, op="gemm")
    assert c.shared == 11 and (round(c.p10, 6), round(c.median, 6), round(c.p90, 6)) == (1.1, 1.5, 1.9)
    assert [round(ratio, 6) for *_, ratio in c.largest][:2] == [2.0, 1.9]


def test_the_largest_deviations_rank_faster_and_slower_alike_by_their_factor(tmp_path):
    """A key 4x faster deviates more than one 3x slower: the list ranks |log ratio|, not the slowdowns alone."""
    cases = [GemmCase("bfloat16", m, 1024, 1024) for m in (1, 2, 3)]
    a, b = tmp_path / "a", tmp_path / "b"
    new = {1: 0.25, 2: 3.0, 3: 1.1}
    merge([fake_run(tmp_path / "ra", cases, latency=1.0)], a, find_project(), say=lambda line: None)
    merge([fake_run(tmp_path / "rb", cases, latency_of=lambda c: new[c.m])], b, find_project(), say=lambda line: None)
    c = compare_tables(a, b, op="gemm")
    assert [(key.split(",")[2], round(ratio, 6)) for key, _, _, ratio in c.largest] == [
        ("m=1", 0.25),
        ("m=2", 3.0),
        ("m=3", 1.1),
    ]


def test_a_step_between_two_series_is_no_step_along_the_sweep(tmp_path):
    """Each n is its own series along m: n=512's slowest row followed by n=1024's fastest is no drop."""
    cases = [GemmCase("bfloat16", m, n, 1024) for n in (512, 1024) for m in (1, 2, 4, 8)]
    tables = tmp_path / "t"
    run = fake_run(tmp_path / "r", cases, latency_of=lambda c: c.m * (1.0 if c.n == 1024 else 3.0))
    merge([run], tables, find_project(), say=lambda line: None)
    c = compare_tables(tables, tables, op="gemm")
    assert c.non_monotonic == []
