"""Mixture-of-experts layers at every valid (moe_tp_size, moe_ep_size) split of each model's experts."""

from __future__ import annotations

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


def splits(gpus: list[int], inter: int, experts: int) -> list[tuple[int, int]]:
    """(tp, ep) with tp x ep in gpus, ep <= experts, experts % ep == 0 and inter % tp == 0."""
    found = []
    for total in gpus:
        for tp in range(1, total + 1):
            if total % tp:
                continue
            ep = total // tp
            if ep <= experts and experts % ep == 0 and inter % tp == 0:
                found.append((tp, ep))
    return sorted(set(found))


def expand(grid: MoeGrid, shapes: Mapping[str, ModelShapes]) -> list[Group]:
    base = {(s.hidden_size, s.inter_size, s.topk, s.num_experts) for s in grid.shapes}
    origins = model_origins(base, shapes, "moe")
    configs = sorted(base | origins.keys())
    rows = {}
    for dtype in grid.dtypes:
        values = []
        for hidden, inter, topk, experts in configs:
            for tp, ep in splits(grid.gpus, inter, experts):
                for distribution in grid.distributions:
                    for tokens in grid.num_tokens:
                        values.append((dtype, tokens, hidden, inter, topk, experts, tp, ep, distribution))
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
    return "fused_moe_triton"


def _sglang(sm: str, group: Group) -> str:
    if group.dtype == "nvfp4":
        return "flashinfer_cutlass_moe"
    return "fused_moe_triton"


def _trtllm(sm: str, group: Group) -> str:
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
