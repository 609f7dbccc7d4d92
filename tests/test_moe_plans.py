"""MoE, MLA and quantized GEMM plans: framework splits, per-model formats, SM89 fp8_block, int4 weight-only
GEMM on torch, MLA tp labels, and coverage of the reference H200 tables (slices in tests/data/reference)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import cases_of
from pydantic import ValidationError

from opcollect.cases.grids import MoeGrid
from opcollect.plans.mla import rank_labels
from opcollect.plans.moe import splits
from opcollect.plans.planner import PlanOptions

REFERENCE = Path(__file__).parent / "data" / "reference"
VERSIONS = {"vllm": "0.24.0", "sglang": "0.5.14", "trtllm": "1.3.0rc20"}
MOE_KEY = ("moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts")
MOE_KEY += ("moe_tp_size", "moe_ep_size", "distribution")
MLA_KEY = ("mla_dtype", "kv_cache_dtype", "num_heads", "batch_size", "isl", "tp_size", "step")
GPT_OSS = {(2880, 2880, 4, 128), (2880, 2880, 4, 32)}
DEEPSEEK_V3 = (7168, 2048, 8, 256)
KIMI_K2 = (7168, 2048, 8, 384)


def moe_cases(planner, backend, sm):
    return cases_of(planner.plan(backend, sm, PlanOptions(ops=("moe",))).ops["moe"])


def shape(c) -> tuple[int, int, int, int]:
    return c.hidden_size, c.inter_size, c.topk, c.num_experts


def formats(cases) -> dict[tuple, set[str]]:
    found: dict[tuple, set[str]] = {}
    for c in cases:
        found.setdefault(shape(c), set()).add(c.moe_dtype)
    return found


# -- splits ----------------------------------------------------------------------------------------


def test_vllm_splits_experts_by_tensor_or_expert_parallel_never_both(planner):
    plan = planner.plan("vllm", "90", PlanOptions(ops=("moe",))).ops["moe"]
    pairs = {(c.moe_tp_size, c.moe_ep_size) for c in cases_of(plan)}
    assert not any(tp > 1 and ep > 1 for tp, ep in pairs)
    assert {tp for tp, ep in pairs if ep == 1} == {1, 2, 4, 8, 16, 32}
    assert {ep for tp, ep in pairs if tp == 1} == {1, 2, 4, 8, 16, 32, 64, 128, 256}
    assert plan.skipped["vllm-moe-tp-or-ep"] > 0


@pytest.mark.parametrize("backend", ["sglang", "trtllm"])
def test_sglang_and_trtllm_split_up_to_256_gpus_with_tp_at_most_32(planner, backend):
    pairs = {(c.moe_tp_size, c.moe_ep_size) for c in moe_cases(planner, backend, "90")}
    assert max(tp * ep for tp, ep in pairs) == 256 and max(tp for tp, _ in pairs) == 32
    assert {(1, 256), (2, 128), (8, 32), (32, 8), (16, 16), (4, 4)} <= pairs
    assert all(tp * ep <= 256 and tp <= 32 for tp, ep in pairs)


def test_split_rules_hold_per_shape(planner):
    for c in moe_cases(planner, "trtllm", "90"):
        assert c.num_experts % c.moe_ep_size == 0 and c.inter_size % c.moe_tp_size == 0
        if c.moe_dtype == "fp8_block":  # 128x128 weight blocks: per-rank inter is whole blocks
            assert (c.inter_size // c.moe_tp_size) % 128 == 0
    assert splits([64], 2048, 8, max_tp=32) == [(8, 8), (16, 4), (32, 2)]
    assert (64, 1) in splits([64], 2048, 8)  # no cap unless the grid sets one


# -- per-model formats -----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["vllm", "sglang", "trtllm"])
def test_models_are_planned_only_in_the_formats_they_are_served_in(planner, backend):
    sm90 = formats(moe_cases(planner, backend, "90"))
    for gpt_oss in GPT_OSS:
        assert sm90[gpt_oss] == {"w4a16_mxfp4"}  # gpt-oss ships MXFP4 experts only
    assert sm90[DEEPSEEK_V3] == {"fp8_block"}
    assert sm90[(2048, 768, 8, 128)] == {"bfloat16", "fp8", "fp8_block"}  # Qwen3-30B-A3B: every format
    assert "w4a16_mxfp4" not in sm90[(2048, 768, 8, 128)]
    sm100 = formats(moe_cases(planner, backend, "100"))
    assert sm100[(2880, 2880, 4, 128)] == {"w4a16_mxfp4", "w4a8_mxfp4_mxfp8"}
    assert sm100[DEEPSEEK_V3] == {"fp8_block", "nvfp4"}


def test_kimi_int4_and_the_torch_backend_refusals(planner):
    assert formats(moe_cases(planner, "vllm", "90"))[KIMI_K2] == {"fp8_block", "int4_wo"}
    assert formats(moe_cases(planner, "sglang", "90"))[KIMI_K2] == {"fp8_block", "int4_wo"}
    torch = planner.plan("torch", "90", PlanOptions(ops=("moe",))).ops["moe"]
    torch_shapes = formats(cases_of(torch))
    assert set(torch.by_dtype) == {"bfloat16"} and torch.skipped["torch-no-quantized-moe-mla"] > 0
    assert not GPT_OSS & torch_shapes.keys()  # MXFP4 only, which the torch runner cannot time


@pytest.mark.parametrize(("sm", "dispatch"), [("80", "per_expert_loop"), ("89", "per_expert_loop"),
                                             ("90", "torch._grouped_mm"), ("100", "torch._grouped_mm")])  # fmt: skip
def test_torch_moe_runs_grouped_mm_from_hopper_and_one_gemm_per_expert_before(planner, sm, dispatch):
    moe = planner.plan("torch", sm, PlanOptions(ops=("moe",))).ops["moe"]
    assert moe.ids and set(moe.dispatch) == {dispatch}


# -- skips that changed ----------------------------------------------------------------------------


def test_fp8_block_on_sm89_where_the_framework_has_a_kernel(planner):
    def dtypes(backend, op):
        return planner.plan(backend, "89", PlanOptions(ops=(op,))).ops[op].by_dtype

    assert "fp8_block" in dtypes("vllm", "gemm") and "fp8_block" in dtypes("vllm", "moe")
    assert "fp8_block" in dtypes("trtllm", "gemm")
    assert "fp8_block" not in dtypes("trtllm", "moe")  # grouped block-scaled GEMM is DeepGEMM (SM90+) only
    # SGLang 0.5.14 falls back to its Triton block-fp8 GEMM below SM90 (fp8_utils.py:_dispatch_auto_backend)
    sglang = planner.plan("sglang", "89", PlanOptions(ops=("gemm",))).ops["gemm"]
    assert sglang.by_dtype["fp8_block"] > 0 and "sglang_triton_w8a8_block_fp8" in sglang.by_dispatch
    sm86 = planner.plan("vllm", "86", PlanOptions(ops=("gemm", "moe")))
    assert all("fp8_block" not in s.by_dtype for s in sm86.ops.values())


def test_int4_weight_only_gemm_is_planned_for_torch(planner):
    cpu = planner.plan("torch", "cpu", PlanOptions(ops=("gemm",))).ops["gemm"]
    assert cpu.by_dispatch["torch._weight_int4pack_mm_for_cpu"] == cpu.by_dtype["int4_wo"] > 0
    sm90 = planner.plan("torch", "90", PlanOptions(ops=("gemm",))).ops["gemm"]
    assert sm90.by_dispatch["torch._weight_int4pack_mm"] == sm90.by_dtype["int4_wo"] > 0
    assert set(sm90.skipped) >= {"torch-no-quantized-gemm"} and "fp8_block" not in sm90.by_dtype


def test_w4a8_mxfp4_needs_sm100_and_trtllm_w4a16_needs_sm90_to_119(planner):
    assert "w4a8_mxfp4_mxfp8" not in planner.plan("sglang", "90", PlanOptions(ops=("moe",))).ops["moe"].by_dtype
    assert "w4a8_mxfp4_mxfp8" not in planner.plan("sglang", "120", PlanOptions(ops=("moe",))).ops["moe"].by_dtype
    assert "w4a8_mxfp4_mxfp8" in planner.plan("vllm", "100", PlanOptions(ops=("moe",))).ops["moe"].by_dtype
    trtllm = {
        sm: planner.plan("trtllm", sm, PlanOptions(ops=("moe",))).ops["moe"].by_dtype for sm in ("89", "90", "120")
    }
    assert "w4a16_mxfp4" in trtllm["90"] and "w4a16_mxfp4" not in trtllm["89"] and "w4a16_mxfp4" not in trtllm["120"]


def test_a_shape_listed_twice_is_refused():
    shape = {"hidden_size": 8, "inter_size": 8, "topk": 1, "num_experts": 2}
    grid = {"dtypes": ["bfloat16"], "num_tokens": [1], "distributions": ["balanced"], "gpus": [1]}
    other = {**shape, "num_experts": 4, "dtypes": ["w4a16_mxfp4"]}
    assert MoeGrid.model_validate({**grid, "shapes": [shape, other]}).shapes[1].dtypes == ["w4a16_mxfp4"]
    with pytest.raises(ValidationError, match="listed twice"):
        MoeGrid.model_validate({**grid, "shapes": [shape, {**shape, "dtypes": ["fp8"]}]})
    with pytest.raises(ValidationError, match="at least 1 item"):
        MoeGrid.model_validate({**grid, "shapes": [{**shape, "dtypes": []}]})


# -- the int4 runner on the CPU --------------------------------------------------------------------


def test_int4_weight_only_gemm_runs_on_the_cpu():
    torch = pytest.importorskip("torch")
    from opcollect.backends.torch import footprint, gemm, measure
    from opcollect.plans.gemm import GemmCase
    from opcollect.runtime.contract import KernelLimit
    from opcollect.runtime.harness import TimingConfig

    quick = TimingConfig(max_noise=0.2, min_samples=3, max_case_seconds=0.02, warmup_seconds=0.001)
    case = GemmCase("int4_wo", 8, 256, 512)
    [result] = measure("gemm", "torch._weight_int4pack_mm_for_cpu", [case], "cpu", quick)
    assert result.stats.latency > 0 and result.kernel_source == "torch._weight_int4pack_mm_for_cpu"
    # the ATen op it ran is the one its label means, and a plain linear is not
    from opcollect.backends.kernels import contradicts_label

    assert "aten::_weight_int4pack_mm_for_cpu" in result.observed.kernels
    assert not contradicts_label("torch", result.kernel_source, result.observed.kernels, "gemm")
    assert contradicts_label("torch", result.kernel_source, ["aten::linear", "aten::mm"], "gemm")
    assert footprint("gemm", case) < footprint("gemm", GemmCase("bfloat16", 8, 256, 512))
    with pytest.raises(KernelLimit, match="k % 128"):
        measure("gemm", "x", [GemmCase("int4_wo", 8, 256, 360)], "cpu", quick)
    # the kernel the runner times computes x @ dequant(w)^T, dequant = (q - 8) * scale + zero per group along k
    n, k, group = 32, 256, gemm.INT4_GROUP
    q = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
    scales = torch.rand(k // group, n, 2, dtype=torch.bfloat16)
    x = torch.randn(4, k, dtype=torch.bfloat16)
    packed = torch._convert_weight_to_int4pack_for_cpu(q, gemm.INT4_INNER_K_TILES)
    out = torch._weight_int4pack_mm_for_cpu(x, packed, group, scales).float()
    per_k = scales.float().repeat_interleave(group, 0).transpose(0, 1)  # (n, k, 2)
    reference = x.float() @ ((q.float() - 8) * per_k[..., 0] + per_k[..., 1]).t()
    assert torch.allclose(out, reference, rtol=2e-2, atol=2e-2 * reference.abs().max().item())


# -- MLA labels ------------------------------------------------------------------------------------


def test_mla_labels_each_rank_head_count_with_the_smallest_tp(planner):
    expected = {(128, 1), (64, 1), (32, 2), (16, 4), (8, 8), (4, 16), (2, 32), (1, 64)}
    for op in ("mla_context", "mla_generation"):
        plan = planner.plan("sglang", "90", PlanOptions(ops=(op,))).ops[op]
        assert {(c.num_heads, c.tp_size) for c in cases_of(plan)} == expected, op
    assert rank_labels([128], [1, 2, 4]) == {128: 1, 64: 2, 32: 4}
    assert rank_labels([128, 64], [1, 2, 4]) == {128: 1, 64: 1, 32: 2, 16: 4}
    assert rank_labels([96], [1, 2, 4, 8]) == {96: 1, 48: 2, 24: 4, 12: 8}


# -- coverage of the reference tables --------------------------------------------------------------


def reference_keys(path: Path, columns) -> set[tuple]:
    pq = pytest.importorskip("pyarrow.parquet")
    table = pq.read_table(path, columns=list(columns)).to_pydict()
    return set(zip(*(table[c] for c in columns)))


@pytest.mark.parametrize("backend", ["vllm", "sglang", "trtllm"])
def test_moe_plan_covers_the_reference_moe_table(planner, backend):
    path = REFERENCE / "moe_slices" / backend / VERSIONS[backend] / "moe_perf.parquet"
    ref = reference_keys(path, MOE_KEY)
    selection = planner.plan(backend, "90", PlanOptions(ops=("moe",))).ops["moe"]
    missing = ref - set(selection.values)
    assert len(ref) > 500 and len(missing) <= 0.01 * len(ref), sorted(missing)[:5]
    assert reference_keys(path, ("op_name",)) == {(selection.op.op_name,)}


@pytest.mark.parametrize("backend", ["sglang", "trtllm"])
@pytest.mark.parametrize("phase", ["context", "generation"])
def test_mla_plans_cover_the_reference_mla_tables(planner, backend, phase):
    path = REFERENCE / "mla_slices" / backend / VERSIONS[backend] / f"{phase}_mla_perf.parquet"
    ref = reference_keys(path, MLA_KEY)
    op = f"mla_{phase}"
    selection = planner.plan(backend, "90", PlanOptions(ops=(op,))).ops[op]
    assert len(ref) > 200 and ref <= set(selection.values), sorted(ref - set(selection.values))[:5]
    assert reference_keys(path, ("op_name",)) == {(selection.op.op_name,)}  # rows join on op_name too
