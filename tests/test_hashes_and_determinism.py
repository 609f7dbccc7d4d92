"""collector_hash and plan_hash are stable across runs, machines and directories, and sensitive to change."""

from __future__ import annotations

import json
import os
import shutil

from conftest import ROOT, run_cli

from opcollect.plans.hashes import collector_files, collector_hash
from opcollect.plans.planfile import read_plan, to_json
from opcollect.plans.planner import Planner, PlanOptions
from opcollect.project import find_project


def _summary(*args, cwd=None, seed="0"):
    done = run_cli("plan", "--json", *args, cwd=cwd, env={"PYTHONHASHSEED": seed})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_hashes_identical_across_processes_seeds_and_directories(tmp_path):
    a = _summary("--backend", "sglang", "--sm", "90", "--ops", "moe,comm", seed="1")
    b = _summary("--backend", "sglang", "--sm", "90", "--ops", "moe,comm", cwd=tmp_path, seed="12345")
    assert a["collector_hash"] == b["collector_hash"] and a["plan_hash"] == b["plan_hash"]


def test_collector_hash_ignores_location_and_order(tree_copy, tmp_path):
    moved = tmp_path / "elsewhere" / "tree"
    shutil.copytree(tree_copy, moved)
    for path in moved.rglob("*.yaml"):  # new mtimes, same content
        os.utime(path, (1, 1))
    assert collector_hash(tree_copy) == collector_hash(moved) == collector_hash(ROOT)


def test_collector_hash_changes_with_every_hashed_file(tree_copy):
    before = collector_hash(tree_copy)
    files = collector_files(tree_copy)
    assert "src/opcollect/plans/skips.py" in files and "cases/base_ops/gemm.yaml" in files
    assert "systems/h200_sxm.yaml" in files
    assert not any(f.endswith(".json") or "__pycache__" in f for f in files)
    for rel in ("src/opcollect/plans/skips.py", "cases/models/LlamaForCausalLM.yaml", "systems/cpu.yaml"):
        path = tree_copy / rel
        original = path.read_bytes()
        path.write_bytes(original + b"\n# edit\n")
        assert collector_hash(tree_copy) != before, rel
        path.write_bytes(original)
    assert collector_hash(tree_copy) == before
    (tree_copy / "images" / "notes.json").write_text("{}")
    (tree_copy / "src" / "opcollect" / "__pycache__").mkdir(exist_ok=True)
    (tree_copy / "src" / "opcollect" / "__pycache__" / "x.py").write_text("x = 1")
    assert collector_hash(tree_copy) == before
    (tree_copy / "images" / "torch").mkdir(exist_ok=True)
    (tree_copy / "images" / "torch" / "Dockerfile").write_text("FROM scratch\n")
    assert collector_hash(tree_copy) != before


def test_plan_is_deterministic_and_round_trips(tmp_path):
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    args = ("plan", "--backend", "torch", "--sm", "cpu")
    assert run_cli(*args, "-o", str(first), env={"PYTHONHASHSEED": "3"}).returncode == 0
    assert run_cli(*args, "-o", str(second), env={"PYTHONHASHSEED": "4"}).returncode == 0
    assert first.read_bytes() == second.read_bytes()
    plan = read_plan(first)
    fresh = Planner(find_project()).plan("torch", "cpu")
    assert plan.plan_hash == fresh.plan_hash and plan.total_cases == fresh.total_cases
    assert [tuple(c) for c in plan.ops["gemm"].cases] == fresh.ops["gemm"].values
    assert [r.case_ids for r in plan.ops["comm"].rows] == [r.case_ids for r in fresh.ops["comm"].rows]


def test_plan_hash_tracks_the_selection(planner):
    whole = planner.plan("vllm", "90", PlanOptions(ops=("mla_context", "comm")))
    again = planner.plan("vllm", "90", PlanOptions(ops=("mla_context", "comm")))
    fewer = planner.plan("vllm", "90", PlanOptions(ops=("mla_context",)))
    other_sm = planner.plan("vllm", "100", PlanOptions(ops=("mla_context", "comm")))
    sharded = planner.plan("vllm", "90", PlanOptions(ops=("mla_context", "comm"), shard=(1, 3)))
    assert whole.plan_hash == again.plan_hash
    assert len({whole.plan_hash, fewer.plan_hash, other_sm.plan_hash}) == 3
    assert sharded.plan_hash == whole.plan_hash  # a shard belongs to its whole plan
    assert to_json(whole) == to_json(again)


def test_smoke_picks_at_most_four_cheap_cases_per_op_deterministically(planner):
    smoke = planner.plan("torch", "cpu", PlanOptions(smoke=True))
    again = planner.plan("torch", "cpu", PlanOptions(smoke=True))
    full = planner.plan("torch", "cpu")
    unplanned = {name for name, sel in full.ops.items() if not sel.ids}
    # torch plans no custom_allreduce (no all-reduce of its own) and no MLA module; every other op 1 to 4 cases
    assert unplanned == {"custom_allreduce", "mla_context_module", "mla_generation_module"}
    for name, sel in smoke.ops.items():
        assert 1 <= len(sel.ids) <= 4 or name in unplanned, name
        assert set(sel.ids) <= set(full.ops[name].ids)
        assert sel.ids == again.ops[name].ids
    op = full.ops["gemm"].op
    gemm_costs = sorted(op.cost(op.case_type._make(v)) for v in full.ops["gemm"].values)
    median = gemm_costs[len(gemm_costs) // 2]
    assert all(op.cost(op.case_type._make(v)) <= median for v in smoke.ops["gemm"].values)
    assert smoke.plan_hash != full.plan_hash


def test_case_filter_keeps_only_matching_prefixes(planner):
    plan = planner.plan("vllm", "90", PlanOptions(ops=("gemm", "moe"), case_filter="gemm:fp8:m=128,"))
    assert len(plan.ops["gemm"].ids) > 0 and not plan.ops["moe"].ids
    assert all(i.startswith("gemm:fp8:m=128,") for i in plan.ops["gemm"].ids)
    every = planner.plan("vllm", "90", PlanOptions(ops=("gemm",))).ops["gemm"].ids
    assert plan.ops["gemm"].ids == [i for i in every if i.startswith("gemm:fp8:m=128,")]
    # a text inside the IDs but at the start of none selects nothing: the filter is a prefix, not a search
    inside = planner.plan("vllm", "90", PlanOptions(ops=("gemm", "moe"), case_filter="fp8:m=128,"))
    assert not inside.ops["gemm"].ids and not inside.ops["moe"].ids


def test_case_ids_are_unique_per_op(planner):
    plan = planner.plan("trtllm", "100")
    for name, sel in plan.ops.items():
        assert len(set(sel.ids)) == len(sel.ids), name
