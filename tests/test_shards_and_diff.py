"""--shard i/N splits a plan into disjoint shards whose union is the plan; plan-diff reports changes."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import yaml
from conftest import run_cli

from opcollect.plans.deal import deal_plan
from opcollect.plans.planner import PlanOptions, Row, check_exactly_once


@pytest.mark.parametrize("count", [1, 3, 7])
def test_shards_are_disjoint_and_cover_the_plan(planner, count):
    ops = ("gemm", "attention_generation", "mla_context", "comm")
    whole = planner.plan("sglang", "100", PlanOptions(ops=ops))
    shards = [planner.plan("sglang", "100", PlanOptions(ops=ops, shard=(i, count))) for i in range(count)]
    for op in ops:
        seen: list[str] = []
        for shard in shards:
            seen.extend(shard.ops[op].ids)
        assert len(seen) == len(set(seen)), op  # disjoint
        assert set(seen) == set(whole.ops[op].ids), op  # union is the whole
        # each shard counts its own cases by dtype and by dispatch, and the shards' counts add up to the whole's
        for count_of in ("by_dtype", "by_dispatch"):
            counts = [getattr(shard.ops[op], count_of) for shard in shards]
            assert [sum(c.values()) for c in counts] == [len(s.ops[op].ids) for s in shards], (op, count_of)
            assert sum(map(Counter, counts), Counter()) == getattr(whole.ops[op], count_of), (op, count_of)
    if count > 1:  # dealt by predicted time (plans/deal.py), not by count: the shards' predicted seconds match
        assert deal_plan(whole, count, planner.tree.systems).balance < 1.01
    comm_rows = [r.row_id for s in shards for r in s.ops["comm"].rows]
    assert sorted(comm_rows) == sorted(r.row_id for r in whole.ops["comm"].rows)  # batch rows stay whole


def test_exactly_once_check_fails_on_a_bad_batch():
    ids = ["a", "b", "c"]
    check_exactly_once("op", ids, [Row("r1", "x", ("a", "b")), Row("r2", "x", ("c",))])
    with pytest.raises(AssertionError, match="1 cases twice"):
        check_exactly_once("op", ids, [Row("r1", "x", ("a", "b")), Row("r2", "x", ("b", "c"))])
    with pytest.raises(AssertionError, match="miss 1"):
        check_exactly_once("op", ids, [Row("r1", "x", ("a", "b"))])


def test_plan_diff_reports_added_removed_and_dispatch(tree_copy, tmp_path):
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    base = ["plan", "--root", str(tree_copy), "--backend", "torch", "--sm", "cpu"]
    assert run_cli(*base, "-o", str(old)).returncode == 0
    grid = tree_copy / "cases" / "base_ops" / "gemm.yaml"
    data = yaml.safe_load(grid.read_text())
    data["narrowed"]["cpu"]["m"] = [1, 8, 32]  # 64 -> 32
    grid.write_text(yaml.safe_dump(data))
    assert run_cli(*base, "-o", str(new)).returncode == 0
    done = run_cli("plan-diff", str(old), str(new))
    assert done.returncode == 0, done.stderr
    gemm_line = next(line for line in done.stdout.splitlines() if line.startswith("gemm:"))
    added = int(gemm_line.split("+")[1].split()[0])
    removed = int(gemm_line.split("-")[1].split()[0])
    assert added == removed > 0
    assert "e.g. gemm:" in done.stdout and "m=32," in done.stdout
    assert "attention_context: unchanged" in done.stdout


def test_plan_diff_on_summaries(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(run_cli("plan", "--backend", "vllm", "--sm", "86", "--json", "--ops", "gemm").stdout)
    b.write_text(run_cli("plan", "--backend", "vllm", "--sm", "89", "--json", "--ops", "gemm").stdout)
    done = run_cli("plan-diff", str(a), str(b))
    assert done.returncode == 0, done.stderr
    assert "gemm: +" in done.stdout and "dtype fp8_block: 0 -> " in done.stdout
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hello": 1}))
    refused = run_cli("plan-diff", str(a), str(bad))
    assert refused.returncode == 2 and "neither a plan file" in refused.stderr


def test_plan_diff_of_summaries_reports_a_change_of_dispatch_alone(tmp_path):
    """Two summaries with the same cases and dtypes whose dispatch counts differ: a change, not 'unchanged'."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    summary = json.loads(run_cli("plan", "--backend", "torch", "--sm", "cpu", "--json", "--ops", "gemm").stdout)
    a.write_text(json.dumps(summary))
    gemm = summary["ops"]["gemm"]
    old = dict(gemm["by_dispatch"])
    gemm["by_dispatch"] = {"torch.nn.functional.linear": gemm["cases"]}
    b.write_text(json.dumps(summary))
    done = run_cli("plan-diff", str(a), str(b))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "gemm: +0 added, -0 removed, ~0 changed"
    int4 = old["torch._weight_int4pack_mm_for_cpu"]
    assert f"  dispatch torch._weight_int4pack_mm_for_cpu: {int4} -> 0" in done.stdout.splitlines()


def test_plan_diff_reports_an_op_that_only_one_side_plans(tmp_path):
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    base = ["plan", "--backend", "torch", "--sm", "cpu", "-o"]
    assert run_cli(*base, str(old), "--ops", "gemm,attention_generation").returncode == 0
    assert run_cli(*base, str(new), "--ops", "gemm,attention_context").returncode == 0
    context = len(json.loads(new.read_text())["ops"]["attention_context"]["case_id"])
    generation = len(json.loads(old.read_text())["ops"]["attention_generation"]["case_id"])
    done = run_cli("plan-diff", str(old), str(new))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "gemm: unchanged" in lines
    assert f"attention_generation: +0 added, -{generation} removed, ~0 changed" in lines
    assert f"attention_context: +{context} added, -0 removed, ~0 changed" in lines
