"""Mixture-of-experts layers at every valid (moe_tp_size, moe_ep_size) split of each model's experts."""

from __future__ import annotations

from itertools import product
from typing import Mapping, NamedTuple

from opcollect.cases.grids import MoeGrid
from opcollect.cases.profiles import ModelShapes
from opcollect.plans.base import Group, OpPlan, make_groups, sm_at_least
from opcollect.plans.gemm import model_origins


class MoeCase(NamedTuple):
    moe_dtype: str
    num_tokens: int
    hidden_size: int
    inter_size: int  # the model's expert inter size; each rank holds inter_size / moe_tp_size
    topk: int
    num_experts: int
    moe_tp_size: int
    moe_ep_size: int
    distribution: str


# Per-rank inter_size must be a whole number of weight blocks: 128x128 block-scaled fp8 experts refuse anything
# else (vLLM 0.24.0 model_executor/layers/quantization/fp8.py:Fp8MoEMethod.create_weights raises "is not
# divisible by weight quantization block_n"; the collector's TRT-LLM and SGLang harnesses raise the same).
BLOCK_INTER = {"fp8_block": 128}


def splits(gpus: list[int], inter: int, experts: int, max_tp: int | None = None) -> list[tuple[int, int]]:
    """(tp, ep) with tp x ep in gpus, tp <= max_tp, ep <= experts, experts % ep == 0 and inter % tp == 0."""
    found = []
    for total in gpus:
        for tp in range(1, total + 1):
            if total % tp or (max_tp is not None and tp > max_tp):
                continue
            ep = total // tp
            if ep <= experts and experts % ep == 0 and inter % tp == 0:
                found.append((tp, ep))
    return sorted(set(found))


def served_dtypes(grid: MoeGrid) -> dict[tuple[int, int, int, int], list[str]]:
    """The formats each listed shape is served in (its own list, else the grid's)."""
    return {(s.hidden_size, s.inter_size, s.topk, s.num_experts): s.dtypes or grid.dtypes for s in grid.shapes}


def expand(grid: MoeGrid, shapes: Mapping[str, ModelShapes]) -> list[Group]:
    served = served_dtypes(grid)
    origins = model_origins(set(served), shapes, "moe")
    configs = sorted(served.keys() | origins.keys())
    # groups in the grid's dtype order, then the formats only some shapes are served in
    dtypes = list(dict.fromkeys([*grid.dtypes, *(d for s in grid.shapes for d in s.dtypes or ())]))
    split_of = {
        (inter, experts): splits(grid.gpus, inter, experts, grid.max_tp_size) for _, inter, _, experts in configs
    }
    rows = {}
    for dtype in dtypes:
        block = BLOCK_INTER.get(dtype, 1)
        values = []
        for hidden, inter, topk, experts in configs:
            if dtype not in served.get((hidden, inter, topk, experts), grid.dtypes):
                continue
            for tp, ep in split_of[(inter, experts)]:
                if (inter // tp) % block:
                    continue
                for distribution in grid.distributions:
                    fixed = ((hidden,), (inter,), (topk,), (experts,), (tp,), (ep,), (distribution,))
                    values.extend(product((dtype,), grid.num_tokens, *fixed))
        if values:
            rows[(dtype,)] = values
    return make_groups(
        "moe", MoeCase, ("moe_dtype",), rows, origins, ("hidden_size", "inter_size", "topk", "num_experts")
    )


def _cost(c: MoeCase) -> float:
    local_inter = c.inter_size // c.moe_tp_size
    local_experts = c.num_experts // c.moe_ep_size
    weights = 3.0 * local_experts * c.hidden_size * local_inter
    return 6.0 * c.num_tokens * c.topk * c.hidden_size * local_inter / c.moe_ep_size + weights


def _torch(sm: str, group: Group) -> str:
    # torch._grouped_mm runs bf16 grouped GEMMs on Hopper and newer; elsewhere one GEMM per expert
    return "torch._grouped_mm" if sm_at_least(sm, 90) else "per_expert_loop"


def _vllm(sm: str, group: Group) -> str:
    if group.dtype == "nvfp4":
        return "cutlass_moe_fp4"
    if group.dtype == "fp8_block" and sm_at_least(sm, 90):
        return "deep_gemm_moe"
    if group.dtype == "int4_wo":
        return "marlin_moe_wna16"
    if group.dtype == "w4a16_mxfp4":
        # fused_moe/oracle/mxfp4.py: TRTLLM-Gen on the SM100 family, OAI Triton kernels on SM90, else Marlin
        return {"90": "triton_kernels_mxfp4", "100": "flashinfer_trtllm_mxfp4", "103": "flashinfer_trtllm_mxfp4"}.get(
            sm, "marlin_mxfp4"
        )
    if group.dtype == "w4a8_mxfp4_mxfp8":
        return "flashinfer_trtllm_mxfp4_mxfp8" if sm in ("100", "103") else "flashinfer_cutlass_mxfp4_mxfp8"
    return "fused_moe_triton"


def _sglang(sm: str, group: Group) -> str:
    if group.dtype == "nvfp4":
        return "flashinfer_cutlass_moe"
    if group.dtype == "int4_wo":
        return "flashinfer_trtllm" if sm in ("100", "103") else "marlin_moe"
    if group.dtype == "w4a16_mxfp4":
        return {"100": "flashinfer_mxfp4", "103": "flashinfer_mxfp4", "120": "marlin_moe"}.get(sm, "fused_moe_triton")
    if group.dtype == "w4a8_mxfp4_mxfp8":
        return "flashinfer_mxfp4"
    return "fused_moe_triton"


def _trtllm(sm: str, group: Group) -> str:
    if group.dtype in ("w4a16_mxfp4", "w4a8_mxfp4_mxfp8") and sm_at_least(sm, 100):
        return "trtllm.trtllm_gen_fused_moe"
    return "trtllm.cutlass_fused_moe"


PLAN = OpPlan(
    name="moe",
    family="moe",
    table="moe_perf",
    op_name="moe",
    case_type=MoeCase,
    dtype_fields=("moe_dtype",),
    expand=expand,
    tp_sizes=lambda grid: tuple(sorted(set(grid.gpus))),
    dispatch={"torch": _torch, "vllm": _vllm, "sglang": _sglang, "trtllm": _trtllm},
    cost=_cost,
)
