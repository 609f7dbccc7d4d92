"""Multi-head latent attention (DeepSeek style), context and generation, with per-rank head counts."""

from __future__ import annotations

from typing import Mapping, NamedTuple

from opcollect.cases.grids import ContextMlaGrid, GenerationMlaGrid, MlaGrid
from opcollect.cases.profiles import ModelShapes
from opcollect.plans.base import Group, OpPlan, make_groups, sm_at_least
from opcollect.plans.gemm import model_origins


class MlaCase(NamedTuple):
    mla_dtype: str
    kv_cache_dtype: str
    num_heads: int  # per rank
    batch_size: int
    isl: int
    tp_size: int
    step: int


def _expand(op: str, grid: MlaGrid, shapes: Mapping[str, ModelShapes], lengths: list[int], context: bool):
    base = {(h,) for h in grid.num_heads}
    origins = model_origins(base, shapes, "mla")
    totals = sorted(base | origins.keys())
    # cases are keyed by heads per rank and tp_size; total heads = num_heads x tp_size
    rank_origins = {
        (total // tp, tp): models for (total,), models in origins.items() for tp in grid.tp_size if total % tp == 0
    }
    rows = {}
    for p in grid.precisions:
        values = []
        for (total,) in totals:
            for tp in grid.tp_size:
                if total % tp:
                    continue
                for batch in grid.batch_size:
                    for length in lengths:
                        tokens = batch * length if context else batch * (length + 1)
                        if tokens <= grid.max_tokens:
                            isl, step = (length, 0) if context else (1, length)
                            values.append((p.mla_dtype, p.kv_cache_dtype, total // tp, batch, isl, tp, step))
        rows[(p.mla_dtype, p.kv_cache_dtype)] = values
    return make_groups(op, MlaCase, ("mla_dtype", "kv_cache_dtype"), rows, rank_origins, ("num_heads", "tp_size"))


def expand_context(grid: ContextMlaGrid, shapes) -> list[Group]:
    return _expand("mla_context", grid, shapes, grid.isl, context=True)


def expand_generation(grid: GenerationMlaGrid, shapes) -> list[Group]:
    return _expand("mla_generation", grid, shapes, grid.step, context=False)


# absorbed MLA per head: 576-wide keys (kv_lora 512 + rope 64), 512-wide values
def _context_cost(c: MlaCase) -> float:
    return 2.0 * c.batch_size * c.isl * c.isl * c.num_heads * (576 + 512)


def _generation_cost(c: MlaCase) -> float:
    return 2.0 * c.batch_size * (c.step + 1) * (c.num_heads * (576 + 512) + 576)


def _torch(sm: str, group: Group) -> str:
    return "torch.mla_absorbed"


def _vllm(sm: str, group: Group) -> str:
    if sm == "90":
        return "FLASHMLA"
    return "CUTLASS_MLA" if sm_at_least(sm, 100) else "TRITON_MLA"


def _sglang(sm: str, group: Group) -> str:
    if sm == "90":
        return "flashmla"
    return "trtllm_mla" if sm_at_least(sm, 100) else "triton"


def _trtllm(sm: str, group: Group) -> str:
    return "trtllm.mla"


def _mla_plan(name: str, table: str, op_name: str, expand, cost) -> OpPlan:
    return OpPlan(
        name=name,
        family="mla",
        table=table,
        op_name=op_name,
        case_type=MlaCase,
        dtype_fields=("mla_dtype", "kv_cache_dtype"),
        expand=expand,
        tp_sizes=lambda grid: tuple(grid.tp_size),
        dispatch={"torch": _torch, "vllm": _vllm, "sglang": _sglang, "trtllm": _trtllm},
        cost=cost,
    )


CONTEXT = _mla_plan("mla_context", "context_mla_perf", "context_mla", expand_context, _context_cost)
GENERATION = _mla_plan("mla_generation", "generation_mla_perf", "generation_mla", expand_generation, _generation_cost)
