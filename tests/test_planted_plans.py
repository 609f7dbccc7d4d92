"""Planning behaviours that small planted bugs once broke unnoticed: hashes, skips, shards, case IDs, splits."""

from __future__ import annotations

import itertools

import pytest

from opcollect.errors import InputError
from opcollect.plans.base import make_groups, sm_at_least
from opcollect.plans.gemm import GemmCase
from opcollect.plans.hashes import collector_files, collector_hash
from opcollect.plans.moe import splits
from opcollect.plans.ops import OPS
from opcollect.plans.planner import PlanOptions, plan_of_cases
from opcollect.plans.skips import decide, skip

HASH = "0" * 64
CASES = [GemmCase("bfloat16", m, n, 1024) for m in (1, 16) for n in (1024, 2048)]


# -- plan_hash -------------------------------------------------------------------------------------


def test_plan_hash_changes_with_the_dispatch_of_an_unbatched_op():
    a = plan_of_cases("vllm", "90", "gemm", CASES, "cutlass", HASH)
    b = plan_of_cases("vllm", "90", "gemm", CASES, "cublas", HASH)
    assert a.ops["gemm"].rows is None  # gemm has no batch rows: the case is its own row
    assert a.ops["gemm"].ids == b.ops["gemm"].ids
    assert a.plan_hash != b.plan_hash


def test_plan_hash_changes_when_the_planner_dispatches_differently(planner, monkeypatch):
    options = PlanOptions(ops=("gemm",))
    before = planner.plan("vllm", "90", options)
    monkeypatch.setitem(OPS["gemm"].dispatch, "vllm", lambda sm, group: "some_other_kernel")
    after = planner.plan("vllm", "90", options)
    assert before.ops["gemm"].ids == after.ops["gemm"].ids
    assert before.plan_hash != after.plan_hash


def test_plan_hash_changes_with_the_sm_for_the_same_cases(planner):
    a = plan_of_cases("vllm", "90", "gemm", CASES, "cutlass", HASH)
    b = plan_of_cases("vllm", "89", "gemm", CASES, "cutlass", HASH)
    assert a.plan_hash != b.plan_hash
    # the torch GEMM plan is the same on sm 89 and 90 (same cases, same dispatch): only the SM differs
    p89 = planner.plan("torch", "89", PlanOptions(ops=("gemm",)))
    p90 = planner.plan("torch", "90", PlanOptions(ops=("gemm",)))
    assert p89.ops["gemm"].ids == p90.ops["gemm"].ids and p89.ops["gemm"].dispatch == p90.ops["gemm"].dispatch
    assert p89.plan_hash != p90.plan_hash


def test_plan_hash_changes_with_the_backend_for_the_same_cases():
    a = plan_of_cases("vllm", "90", "gemm", CASES, "cutlass", HASH)
    b = plan_of_cases("sglang", "90", "gemm", CASES, "cutlass", HASH)
    assert a.plan_hash != b.plan_hash


# -- collector_hash --------------------------------------------------------------------------------


def _mini_tree(root):
    (root / "src" / "opcollect").mkdir(parents=True)
    (root / "cases").mkdir()
    (root / "src" / "opcollect" / "alpha.py").write_text("X = 1\n")
    (root / "cases" / "grid.yaml").write_text("m: [1, 2]\n")
    return root


def test_collector_hash_changes_when_a_hashed_file_is_renamed(tmp_path):
    root = _mini_tree(tmp_path / "tree")
    before = collector_hash(root)
    (root / "src" / "opcollect" / "alpha.py").rename(root / "src" / "opcollect" / "beta.py")
    assert collector_files(root) == ["cases/grid.yaml", "src/opcollect/beta.py"]
    assert collector_hash(root) != before


def test_collector_hash_changes_when_content_moves_between_files(tmp_path):
    """Same bytes in total, split differently over the same two files."""
    a = _mini_tree(tmp_path / "a")
    b = _mini_tree(tmp_path / "b")
    (a / "src" / "opcollect" / "alpha.py").write_text("X = 1\nY = 2\n")
    (a / "cases" / "grid.yaml").write_text("")
    (b / "src" / "opcollect" / "alpha.py").write_text("X = 1\n")
    (b / "cases" / "grid.yaml").write_text("Y = 2\n")
    assert collector_hash(a) != collector_hash(b)


# -- skips -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("sm", ["80", "86"])
def test_fp8_gemm_is_not_planned_before_sm89(planner, sm):
    for backend in ("vllm", "sglang", "trtllm", "torch"):
        sel = planner.plan(backend, sm, PlanOptions(ops=("gemm",))).ops["gemm"]
        assert "fp8" not in sel.by_dtype, (backend, sm)
        assert not any(i.startswith("gemm:fp8:") for i in sel.ids), (backend, sm)
        assert sel.skipped.get("fp8-needs-sm89", 0) > 0, (backend, sm)


@pytest.mark.parametrize("sm", ["89", "90"])
def test_fp8_gemm_is_planned_from_sm89(planner, sm):
    sel = planner.plan("vllm", sm, PlanOptions(ops=("gemm",))).ops["gemm"]
    assert sel.by_dtype.get("fp8", 0) > 0
    assert "fp8-needs-sm89" not in sel.skipped


def test_a_model_skip_leaves_shapes_another_model_also_needs():
    shapes = [(128, 256), (4096, 4096), (1280, 8192)]
    values = [("bfloat16", m, n, k) for n, k in shapes for m in (1, 16)]
    origins = {(4096, 4096): frozenset({"A-8B", "B-8B"}), (1280, 8192): frozenset({"A-70B"})}
    [group] = make_groups("gemm", GemmCase, ("gemm_dtype",), {("bfloat16",): values}, origins, ("n", "k"))
    arch = {"A-8B": "AForCausalLM", "A-70B": "AForCausalLM", "B-8B": "BForCausalLM"}
    decision = decide("torch", "gemm", "cpu", "x", group, arch, [skip("no-a", model="AForCausalLM")])
    kept = {values[i][2:] for i in decision.kept}
    assert kept == {(128, 256), (4096, 4096)}  # the base grid's shape, and one that B also brings
    assert decision.skipped == {"no-a": 2}


# -- shards and options ----------------------------------------------------------------------------


def test_shard_index_must_be_below_the_count():
    PlanOptions(shard=(2, 3))
    PlanOptions(shard=(0, 1))
    for bad in [(3, 3), (-1, 3), (0, 0), (1, 1)]:
        with pytest.raises(InputError, match="shards are counted from 0"):
            PlanOptions(shard=bad)


@pytest.mark.parametrize("count", [2, 3])
def test_shards_partition_unbatched_and_batched_ops_and_keep_run_order(planner, count):
    ops = ("gemm", "comm")
    whole = planner.plan("vllm", "90", PlanOptions(ops=ops))
    shards = [planner.plan("vllm", "90", PlanOptions(ops=ops, shard=(i, count))) for i in range(count)]
    for op in ops:
        seen = [case_id for s in shards for case_id in s.ops[op].ids]
        assert sorted(seen) == sorted(whole.ops[op].ids), op  # disjoint, and together the whole
        position = {case_id: i for i, case_id in enumerate(whole.ops[op].ids)}
        for s in shards:
            assert s.ops[op].ids, (op, "every shard gets work")
            order = [position[c] for c in s.ops[op].ids]
            assert order == sorted(order), (op, "a shard keeps the plan's run order")
            assert s.plan_hash == whole.plan_hash
    rows = sorted(r.row_id for s in shards for r in s.ops["comm"].rows)
    assert rows == sorted(r.row_id for r in whole.ops["comm"].rows)


TORCH_UNPLANNED = {"custom_allreduce", "mla_context_module", "mla_generation_module"}


def test_smoke_plans_at_most_four_cases_per_op(planner):
    smoke = planner.plan("torch", "cpu", PlanOptions(smoke=True))
    full = planner.plan("torch", "cpu")
    # torch plans no custom_allreduce (no all-reduce of its own) and no MLA module; every other op 1 to 4 cases
    assert {name for name, sel in full.ops.items() if not sel.ids} == TORCH_UNPLANNED
    for name, sel in smoke.ops.items():
        assert 1 <= len(sel.ids) <= 4 or name in TORCH_UNPLANNED, name
        assert set(sel.ids) <= set(full.ops[name].ids), name
    assert len(smoke.ops["gemm"].ids) == 4 < len(full.ops["gemm"].ids)
    # spread evenly over the cheaper half of the kept cases: its cheapest, its dearest, and two between
    for name in ("gemm", "attention_context"):
        op = full.ops[name].op
        costs = sorted(op.cost(op.case_type._make(v)) for v in full.ops[name].values)
        half = costs[: (len(costs) + 1) // 2]
        chosen = sorted(op.cost(op.case_type._make(v)) for v in smoke.ops[name].values)
        assert len(half) > 8 and chosen[0] == half[0] and chosen[-1] == half[-1], name
        assert half[len(half) // 4] <= chosen[1] <= chosen[2] <= half[3 * len(half) // 4], name


# -- case IDs and dispatch -------------------------------------------------------------------------


def test_case_id_reads_as_documented():
    plan = plan_of_cases("vllm", "90", "gemm", [GemmCase("fp8", 4096, 7168, 2048)], "cutlass", HASH)
    assert plan.ops["gemm"].ids == ["gemm:fp8:m=4096,n=7168,k=2048"]


def test_every_case_id_names_every_non_dtype_field(planner):
    plan = planner.plan(
        "vllm", "90", PlanOptions(ops=("attention_context", "attention_generation", "mla_context_module"))
    )
    for name, sel in plan.ops.items():
        assert len(set(sel.ids)) == len(sel.ids), name
        cases = [sel.op.case_type._make(v) for v in sel.values]
        assert len({sel.op.label_of(c) for c in cases}) > 1, name  # several dtype groups the IDs must keep apart
        step = max(1, len(sel.ids) // 50)
        for case_id, case in zip(sel.ids[::step], cases[::step]):
            dtype = getattr(case, sel.op.dtype_field)
            assert case_id.startswith(f"{name}:{dtype}:"), case_id
            for field in sel.op.fields:
                if field != sel.op.dtype_field:
                    assert f"{field}={getattr(case, field)}" in case_id.split(":", 2)[2].split(","), (case_id, field)


def test_sm_at_least_is_inclusive():
    assert sm_at_least("90", 90) and sm_at_least("100", 90) and sm_at_least("80", 80)
    assert not sm_at_least("89", 90) and not sm_at_least("cpu", 0)


def test_dispatch_switches_at_the_documented_sm(planner):
    sglang90 = planner.plan("sglang", "90", PlanOptions(ops=("gemm",))).ops["gemm"]
    assert "sglang_deepgemm_gemm_nt_f8f8bf16" in sglang90.by_dispatch  # DeepGEMM needs Hopper (SM90) or newer
    vllm90 = planner.plan("vllm", "90", PlanOptions(ops=("gemm",))).ops["gemm"]
    # vLLM's CUTLASS block-fp8 kernel from SM90 on takes the shapes DeepGEMM cannot
    assert "CutlassFp8BlockScaledMMKernel" in vllm90.by_dispatch
    assert "TritonFp8BlockScaledMMKernel" not in vllm90.by_dispatch
    vllm100 = planner.plan("vllm", "100", PlanOptions(ops=("attention_context",))).ops["attention_context"]
    vllm90 = planner.plan("vllm", "90", PlanOptions(ops=("attention_context",))).ops["attention_context"]
    assert "vllm_flashinfer_trtllmprefill" in vllm100.by_dispatch  # FlashInfer's TRT-LLM kernels on Blackwell
    assert set(vllm90.by_dispatch) == {"vllm_flash_attn_fa3", "vllm_flash_attn_fa4"}


# -- MoE splits ------------------------------------------------------------------------------------


def _expected_splits(gpus, inter, experts):
    found = set()
    for total in gpus:
        for tp, ep in itertools.product(range(1, total + 1), repeat=2):
            if tp * ep == total and ep <= experts and experts % ep == 0 and inter % tp == 0:
                found.add((tp, ep))
    return sorted(found)


@pytest.mark.parametrize(
    "gpus,inter,experts",
    [([1, 2, 4, 8], 2048, 8), ([8], 64, 8), ([4], 6, 6), ([2, 4, 8, 16], 1536, 128), ([4, 8], 768, 3)],
)
def test_moe_splits_are_every_valid_tp_ep_pair(gpus, inter, experts):
    assert splits(gpus, inter, experts) == _expected_splits(gpus, inter, experts)


def test_moe_pure_expert_parallel_split_is_kept():
    assert (1, 8) in splits([8], 64, 8)  # one expert per rank
    assert (1, 4) not in splits([4], 64, 6)  # 6 experts do not spread evenly over 4 ranks
