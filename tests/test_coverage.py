"""`plan --against TABLES`: how many key rows of an existing tree a plan covers, and the missing patterns."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ROOT

from opcollect.cli import main
from opcollect.errors import InputError
from opcollect.plans.coverage import coverage as coverage_of
from opcollect.plans.coverage import render_coverage, table_coverage
from opcollect.plans.ops import OPS
from opcollect.plans.planner import plan_of_cases

REFERENCE = ROOT / "tests" / "data" / "reference" / "aiconfigurator-h200"
GEMM = REFERENCE / "gemm" / "vllm" / "0.24.0" / "gemm_perf.parquet"
CONTEXT = REFERENCE / "attention" / "sglang" / "0.5.14" / "context_attention_perf.parquet"
NCCL = REFERENCE / "comm" / "nccl" / "2.29.2" / "nccl_perf.parquet"


def key_rows(path: Path, op: str) -> list[tuple]:
    """The table's rows as the op's case tuples (field order), duplicates kept."""
    fields = list(OPS[op].fields)
    table = pq.read_table(path, columns=fields)
    return list(zip(*(table.column(name).to_pylist() for name in fields)))


def summary(found: dict) -> tuple:
    return found["keys"], found["covered"], found["percent"], [(p["pattern"], p["keys"]) for p in found["patterns"]]


# ---- the reference slices, with plans cut from them so the expected figures are known exactly


def test_reference_gemm_slice_missing_dtype_then_m_values_top_8():
    values = [v for v in key_rows(GEMM, "gemm") if v[0] != "fp8_block" and v[1] <= 1024]
    found = table_coverage(OPS["gemm"], values, GEMM, "vllm")
    assert found["key_columns"] == ["op_name", "gemm_dtype", "m", "n", "k"]
    assert (found["keys"], found["covered"], found["missing"], found["percent"]) == (4884, 1936, 2948, 39.6)
    patterns = [(p["pattern"], p["keys"]) for p in found["patterns"]]
    assert patterns[0] == ("gemm_dtype=fp8_block", 1628)
    assert len(patterns) == 8 and all(label.startswith("m=") and n == 44 for label, n in patterns[1:])
    assert found["patterns_left_off"] == 23  # 31 values of m above 1024, 8 shown with the dtype
    assert len(found["examples"]) == 5 and set(found["examples"][0]) == set(found["key_columns"])


def test_reference_attention_slice_values_then_a_pair():
    op = "attention_context"
    values = [v for v in key_rows(CONTEXT, op) if v[4] in (64, 128) and (v[3], v[4]) != (4, 128)]
    found = table_coverage(OPS[op], values, CONTEXT, "sglang")
    assert summary(found) == (
        3264,
        1394,
        42.7,
        [("head_dim=256", 1156), ("head_dim=192", 476), ("(num_key_value_heads,head_dim)=(4,128)", 238)],
    )
    pair = found["patterns"][2]
    assert pair["columns"] == ["num_key_value_heads", "head_dim"] and pair["values"] == [4, 128]
    assert pair["examples"][0]["num_key_value_heads"] == 4 and pair["examples"][0]["head_dim"] == 128


def test_reference_nccl_slice_other_collectives_are_missing():
    values = [v for v in key_rows(NCCL, "comm") if _collective(v) == "all_reduce"]
    found = table_coverage(OPS["comm"], values, NCCL, "vllm")
    assert summary(found) == (
        504,
        126,
        25.0,
        [("op_name=all_gather", 126), ("op_name=alltoall", 126), ("op_name=reduce_scatter", 126)],
    )


def _collective(values: tuple) -> str:
    fields = OPS["comm"].fields
    return values[fields.index("op_name")] if "op_name" in fields else "all_reduce"


def test_reference_slice_through_the_cli_json(capsys):
    """The real vLLM plan against the slice tree (no system level): the backend's tables and NCCL only."""
    assert (
        main(["plan", "--backend", "vllm", "--sm", "90", "--ops", "gemm,comm", "--against", str(REFERENCE), "--json"])
        == 0
    )
    report = json.loads(capsys.readouterr().out)["coverage"]
    assert report["backend"] == "vllm" and report["sm"] == "90" and report["tables_root"] == str(REFERENCE)
    assert [t["path"] for t in report["tables"]] == [
        "gemm/vllm/0.24.0/gemm_perf.parquet",
        "comm/nccl/2.29.2/nccl_perf.parquet",
    ]
    for table in report["tables"]:
        assert table["op"] in ("gemm", "comm")
        assert table["keys"] == table["covered"] + table["missing"]
        assert abs(table["percent"] - 100 * table["covered"] / table["keys"]) <= 0.1
        assert (table["percent"] == 100.0) == (table["missing"] == 0)
        shown = sum(p["keys"] for p in table["patterns"])
        assert shown <= table["missing"] and (shown < table["missing"]) == (table["patterns_left_off"] > 0)
        assert len(table["patterns"]) <= 8 and len(table["examples"]) <= 5
        for pattern in table["patterns"]:
            assert set(pattern) == {"pattern", "columns", "values", "keys", "examples"}


# ---- a hand-made tree: every figure and pattern below is worked out by hand


def _write(path: Path, framework: str, op_name: str, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = {"framework": [framework] * len(rows), "version": ["1.0"] * len(rows), "device": ["H200"] * len(rows)}
    columns["op_name"] = [row.pop("op_name", op_name) for row in rows]
    columns["kernel_source"] = [row.pop("kernel_source", "k") for row in rows]
    for name in rows[0]:
        columns[name] = [row[name] for row in rows]
    columns["latency"] = [0.5] * len(rows)
    pq.write_table(pa.table(columns), path)


GEMM_TABLE = [
    {"gemm_dtype": d, "m": m, "n": n, "k": k}
    for d in ("bfloat16", "fp8", "int4_wo")
    for m in (1, 2, 4)
    for n, k in ((128, 256), (256, 128), (512, 512))
]
GEMM_PLAN = [
    {"gemm_dtype": "bfloat16", "m": m, "n": n, "k": k}
    for m in (1, 2, 4, 8)
    for n, k in ((128, 256), (256, 128), (512, 128), (128, 512))
] + [{"gemm_dtype": "fp8", "m": m, "n": n, "k": k} for m in (1, 2) for n, k in ((128, 256), (256, 128))]

ATTENTION = {"isl": 16, "beam_width": 1, "attn_dtype": "bfloat16", "kv_cache_dtype": "bfloat16", "step": 0}
CONTEXT_TABLE = [
    {**ATTENTION, "batch_size": b, "num_heads": h, "num_key_value_heads": kv, "head_dim": d, "window_size": 0}
    for b in (1, 2)
    for h, kv in ((8, 8), (8, 2), (16, 2))
    for d in (128, 256)
]
CONTEXT_PLAN = [
    {**ATTENTION, "batch_size": b, "num_heads": h, "num_key_value_heads": kv, "head_dim": 128, "window_size": 0}
    for b in (1, 2)
    for h, kv in ((8, 8), (8, 2), (16, 16))
]

NCCL_TABLE = [
    {"op_name": o, "nccl_dtype": "half", "num_gpus": g, "message_size": s}
    for o in ("all_reduce", "all_gather")
    for g in (2, 4)
    for s in (1024, 4096)
] + [{"op_name": "all_reduce", "nccl_dtype": "int8", "num_gpus": 4, "message_size": 4096}]
# (half, 4, 4096) is missing though every pair of its values is planned: "other combinations"
NCCL_PLAN = [("half", 2, 1024), ("half", 4, 1024), ("half", 2, 4096), ("int8", 4, 4096)]


@pytest.fixture
def tables(tmp_path) -> Path:
    root = tmp_path / "TABLES"
    system = root / "h200_sxm"
    (root).mkdir()
    (root / "h200_sxm.yaml").write_text("data_dir: h200_sxm\n")
    gemm = [dict(row) for row in GEMM_TABLE] + [{**GEMM_TABLE[0], "kernel_source": "other"}]  # a duplicate key
    _write(system / "gemm" / "vllm" / "1.0" / "gemm_perf.parquet", "VLLM", "gemm", gemm)
    (system / "gemm" / "vllm" / "1.0" / ".opcollect").mkdir()
    (system / "gemm" / "vllm" / "1.0" / ".opcollect" / "gemm_perf.parquet").write_bytes(b"never read")
    (system / "gemm" / "sglang" / "1.0").mkdir(parents=True)
    (system / "gemm" / "sglang" / "1.0" / "gemm_perf.parquet").write_bytes(b"another backend: never read")
    context = [dict(row) for row in CONTEXT_TABLE]
    _write(
        system / "attention" / "vllm" / "1.0" / "context_attention_perf.parquet", "VLLM", "context_attention", context
    )
    moe = [{"moe_dtype": "fp8", "num_tokens": 1, "hidden_size": 8, "inter_size": 8, "topk": 1, "num_experts": 2}]
    _write(system / "moe" / "vllm" / "1.0" / "moe_perf.parquet", "VLLM", "moe", moe)
    module = [{"model": "m", "mla_dtype": "bfloat16", "num_heads": 8}]
    _write(system / "mla" / "vllm" / "1.0" / "mla_context_module_perf.parquet", "VLLM", "mla_context_module", module)
    _write(system / "comm" / "nccl" / "2.29.2" / "nccl_perf.parquet", "TRTLLM", "", [dict(r) for r in NCCL_TABLE])
    return root


def _plan():
    """vLLM sm90 planning exactly the hand-made cases: gemm, context attention and NCCL (no moe)."""
    nccl = OPS["comm"].case_type._fields
    comm = [
        {"nccl_dtype": d, "op_name": "all_reduce", "num_gpus": g, "message_size": s}
        if "op_name" in nccl
        else {"nccl_dtype": d, "num_gpus": g, "message_size": s}
        for d, g, s in NCCL_PLAN
    ]
    plans = [
        plan_of_cases("vllm", "90", op, [OPS[op].case_type(**case) for case in cases], "d", "h" * 64)
        for op, cases in (("gemm", GEMM_PLAN), ("attention_context", CONTEXT_PLAN), ("comm", comm))
    ]
    return replace(plans[0], ops={op: sel for p in plans for op, sel in p.ops.items()})


def test_hand_made_tree_figures_and_patterns(tables):
    report = coverage_of(_plan(), tables)
    by_path = {t["path"]: t for t in report["tables"]}
    assert list(by_path) == [
        "h200_sxm/gemm/vllm/1.0/gemm_perf.parquet",
        "h200_sxm/attention/vllm/1.0/context_attention_perf.parquet",
        "h200_sxm/moe/vllm/1.0/moe_perf.parquet",
        "h200_sxm/mla/vllm/1.0/mla_context_module_perf.parquet",
        "h200_sxm/comm/nccl/2.29.2/nccl_perf.parquet",
    ]
    gemm = by_path["h200_sxm/gemm/vllm/1.0/gemm_perf.parquet"]
    # 27 keys (the duplicate row counts once): bfloat16 6 and fp8 4 covered
    assert summary(gemm) == (
        27,
        10,
        37.0,
        [("gemm_dtype=int4_wo", 9), ("(n,k)=(512,512)", 6), ("(gemm_dtype,m)=(fp8,4)", 2)],
    )
    assert gemm["plan_keys"] == 20 and gemm["missing"] == 17 and gemm["patterns_left_off"] == 0
    context = by_path["h200_sxm/attention/vllm/1.0/context_attention_perf.parquet"]
    assert summary(context) == (12, 4, 33.3, [("head_dim=256", 6), ("(num_heads,num_key_value_heads)=(16,2)", 2)])
    nccl = by_path["h200_sxm/comm/nccl/2.29.2/nccl_perf.parquet"]
    assert summary(nccl) == (9, 4, 44.4, [("op_name=all_gather", 4), ("other combinations", 1)])
    other = nccl["patterns"][1]
    assert other["columns"] == [] and other["examples"] == [
        {"nccl_dtype": "half", "op_name": "all_reduce", "num_gpus": 4, "message_size": 4096}
    ]
    for path in ("h200_sxm/moe/vllm/1.0/moe_perf.parquet", "h200_sxm/mla/vllm/1.0/mla_context_module_perf.parquet"):
        assert by_path[path]["op"] is None and by_path[path]["note"] == "no op plans this table"

    text = render_coverage(report)
    assert "h200_sxm/gemm/vllm/1.0/gemm_perf.parquet (gemm): 10 of 27 keys covered (37.0%), 17 missing" in text
    assert "      gemm_dtype=int4_wo: 9 keys\n" in text
    assert "      (num_heads,num_key_value_heads)=(16,2): 2 keys\n" in text
    assert "      other combinations: 1 key, e.g. " in text and "num_gpus=4" in text
    assert "h200_sxm/moe/vllm/1.0/moe_perf.parquet: no op plans this table" in text


def test_types_match_strings_as_strings(tmp_path):
    """A key column stored with another type is cast to the plan's: a float 128.0 is the int 128."""
    path = tmp_path / "gemm_perf.parquet"
    rows = [{"gemm_dtype": "bfloat16", "m": 1, "n": 128, "k": 256}]
    _write(path, "VLLM", "gemm", rows)
    table = pq.read_table(path)
    table = table.set_column(table.schema.get_field_index("k"), "k", pa.array([256.0]))
    pq.write_table(table, path)
    case = OPS["gemm"].case_type(gemm_dtype="bfloat16", m=1, n=128, k=256)
    assert table_coverage(OPS["gemm"], [tuple(case)], path, "vllm")["covered"] == 1
    table = table.set_column(table.schema.get_field_index("m"), "m", pa.array(["one"]))
    pq.write_table(table, path)
    with pytest.raises(InputError, match=r"gemm_perf.parquet: column m is string, the plan's m is int64"):
        table_coverage(OPS["gemm"], [tuple(case)], path, "vllm")


# ---- bad input: one line, exit 2


def _error(capsys, *args: str) -> str:
    assert main(["plan", "--backend", "vllm", "--sm", "90", "--ops", "gemm", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and captured.err.startswith("opcollect: error: ")
    return captured.err


def test_bad_tables_one_line_exit_2(capsys, tmp_path, tables):
    assert "no such directory" in _error(capsys, "--against", str(tmp_path / "absent"))
    (tmp_path / "file").write_text("x")
    assert "not a directory" in _error(capsys, "--against", str(tmp_path / "file"))
    (tmp_path / "empty" / "h200_sxm").mkdir(parents=True)
    assert "not a TABLES tree" in _error(capsys, "--against", str(tmp_path / "empty"))
    gemm = tables / "h200_sxm" / "gemm" / "vllm" / "1.0" / "gemm_perf.parquet"
    gemm.write_bytes(b"PAR1 not really")
    err = _error(capsys, "--against", str(tables), "-o", str(tmp_path / "plan.json"))
    assert f"{gemm}: not a readable parquet table" in err
    assert not (tmp_path / "plan.json").exists()  # a bad TABLES stops the plan before it is written


def test_no_table_of_the_backend_and_all_are_refused(capsys, tmp_path, tables):
    only_sglang = tmp_path / "sglang-only"
    _write(only_sglang / "gemm" / "sglang" / "1.0" / "gemm_perf.parquet", "SGLang", "gemm", [dict(GEMM_TABLE[0])])
    assert "no table of backend vllm (nor nccl)" in _error(capsys, "--against", str(only_sglang))
    err = _error(capsys, "--backend", "all", "--against", str(tables))
    assert "--against compares one plan: give one --backend and one --sm, not all" in err


def test_plain_plan_never_imports_pyarrow():
    code = (
        "import sys, io, contextlib\n"
        "from opcollect.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert main(['plan', '--backend', 'vllm', '--sm', '90', '--ops', 'gemm']) == 0\n"
        "assert 'pyarrow' not in sys.modules and 'torch' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


# ---- edges: a hidden file, a table of no key column, one key column, a null key, no rows, patterns left off


def test_a_hidden_table_file_is_not_read(tables):
    hidden = tables / "h200_sxm" / "gemm" / "vllm" / "1.0" / ".gemm_perf.parquet"
    hidden.write_bytes(b"a dot-file: never read")
    paths = [t["path"] for t in coverage_of(_plan(), tables)["tables"]]
    assert "h200_sxm/gemm/vllm/1.0/gemm_perf.parquet" in paths and not [p for p in paths if "/." in p]


def test_a_table_without_any_key_column_of_its_op_is_refused(tmp_path):
    path = tmp_path / "gemm_perf.parquet"
    _write(path, "VLLM", "gemm", [{"hidden_size": 8}])
    case = OPS["gemm"].case_type(gemm_dtype="bfloat16", m=1, n=128, k=256)
    with pytest.raises(InputError) as raised:
        table_coverage(OPS["gemm"], [tuple(case)], path, "vllm")
    assert str(raised.value) == (
        f"{path}: none of the gemm key columns (gemm_dtype, m, n, k) is in this table; is it a table of another op? "
        "Restore it or leave it out of TABLES"
    )


def _one_column(path: Path, m: list) -> Path:
    """A GEMM table whose only key column is m (nullable), kernel_source 'k'."""
    n = len(m)
    columns = {"framework": ["VLLM"] * n, "version": ["1.0"] * n, "device": ["H200"] * n, "op_name": ["gemm"] * n}
    columns |= {"kernel_source": ["k"] * n, "m": pa.array(m, pa.int64()), "latency": [0.5] * n}
    pq.write_table(pa.table(columns), path)
    return path


def test_one_key_column_a_null_key_and_no_row_at_a_planned_key(tmp_path):
    """Keys of one column (and the constant op_name) match the plan's m; a null key sorts last; no row at a
    planned key: the dispatch line says so."""
    path = _one_column(tmp_path / "gemm_perf.parquet", [2, None, 1, 8])
    planned = [tuple(OPS["gemm"].case_type("bfloat16", m, 128, 256)) for m in (8, 16)]
    found = table_coverage(OPS["gemm"], planned, path, "vllm", ["k", "k"])
    assert (found["keys"], found["covered"], found["missing"], found["plan_keys"]) == (4, 1, 3, 2)
    assert [e["m"] for e in found["examples"]] == [1, 2, None]
    assert found["dispatch"] == {"rows": 1, "agreeing": 1, "percent": 100.0, "disagreements": []}
    path = _one_column(tmp_path / "gemm_perf.parquet", [2, None])
    found = table_coverage(OPS["gemm"], planned, path, "vllm", ["k", "k"])
    assert found["dispatch"]["rows"] == 0
    report = {"tables_root": "/T", "backend": "vllm", "sm": "90", "plan_hash": "a" * 64, "cases": 2}
    text = render_coverage({**report, "tables": [{"path": "gemm_perf.parquet", **found}]})
    assert text.splitlines()[1:] == [
        "  gemm_perf.parquet (gemm): 0 of 2 keys covered (0.0%), 2 missing; the plan has 2 keys",
        "      dispatch: no row of the table at a key the plan has",
        "      m=2: 1 key",
        "      m=None: 1 key",
    ]
    path = _one_column(tmp_path / "gemm_perf.parquet", [])
    found = table_coverage(OPS["gemm"], planned, path, "vllm")
    assert (found["keys"], found["covered"], found["percent"], found["patterns"]) == (0, 0, 100.0, [])


def test_the_dispatch_lines_count_agreeing_rows_and_each_disagreement(tmp_path):
    """Three planned keys, all in the table (kernel_source k): the plan names j at two of them, k at one."""
    path = _one_column(tmp_path / "gemm_perf.parquet", [8, 16, 32, 8])
    planned = [tuple(OPS["gemm"].case_type("bfloat16", m, 128, 256)) for m in (8, 16, 32)]
    found = table_coverage(OPS["gemm"], planned, path, "vllm", ["j", "k", "j"])
    report = {"tables_root": "/T", "backend": "vllm", "sm": "90", "plan_hash": "a" * 64, "cases": 3}
    text = render_coverage({**report, "tables": [{"path": "gemm_perf.parquet", **found}]})
    assert text.splitlines()[1:] == [
        "  gemm_perf.parquet (gemm): 3 of 3 keys covered (100.0%), 0 missing; the plan has 3 keys",
        "      dispatch names the table's kernel_source in 1 of 4 rows at covered keys (25.0%)",
        "        plan j where the table has k: 3 rows",
    ]


def test_render_counts_the_patterns_left_off():
    """The reference GEMM slice (test above): 8 patterns shown of 31, the other 23 hold 2,948 - 1,628 - 7 x 44."""
    values = [v for v in key_rows(GEMM, "gemm") if v[0] != "fp8_block" and v[1] <= 1024]
    found = table_coverage(OPS["gemm"], values, GEMM, "vllm")
    report = {"tables_root": "/T", "backend": "vllm", "sm": "90", "plan_hash": "a" * 64, "cases": len(values)}
    text = render_coverage({**report, "tables": [{"path": "gemm_perf.parquet", **found}]})
    assert text.endswith("      m=1793: 44 keys\n      ... 23 more patterns: 1,012 keys\n")


def test_a_tree_holding_only_mhc_tables_is_read_for_their_coverage(tmp_path):
    """Every family a plan writes is one --against reads: here mHC's (mhc/<backend>/<version>/mhc_module_perf)."""
    from conftest import fake_run

    from opcollect.plans.mhc import MhcCase
    from opcollect.project import find_project
    from opcollect.tables.merge import merge

    cases = [MhcCase(op, "DeepseekV4ForCausalLM", t, 1, 4, 4096, 20) for op in ("pre", "post") for t in (1, 8)]
    label = "vllm.model_executor.kernels.mhc.tilelang.mhc_{op}_tilelang"
    run = fake_run(tmp_path / "run", cases, op="mhc", kernel_source=label)
    merge([run], tmp_path / "tables", find_project(), say=lambda line: None)
    plan = plan_of_cases("vllm", "90", "mhc", cases, label, "0" * 64)
    [table] = coverage_of(plan, tmp_path / "tables")["tables"]
    assert table["path"] == "h200_sxm/mhc/vllm/0.24.0/mhc_module_perf.parquet"
    assert (table["keys"], table["covered"], table["missing"], table["dispatch"]["agreeing"]) == (4, 4, 0, 4)
