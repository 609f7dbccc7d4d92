"""Context (prefill) and generation (decode) attention over generic and per-rank model head configs."""

from __future__ import annotations

from typing import Mapping, NamedTuple

from opcollect.cases.grids import AttentionGrid, ContextAttentionGrid, GenerationAttentionGrid
from opcollect.cases.profiles import ModelShapes
from opcollect.plans.base import Group, OpPlan, make_groups, sm_at_least
from opcollect.plans.gemm import model_origins


class AttentionCase(NamedTuple):
    batch_size: int
    isl: int
    num_heads: int
    num_key_value_heads: int
    head_dim: int
    beam_width: int
    attn_dtype: str
    kv_cache_dtype: str
    step: int
    window_size: int


def head_configs(grid: AttentionGrid, shapes: Mapping[str, ModelShapes]):
    """Sorted (num_heads, kv_heads, head_dim, window) configs and the ones only models add."""
    sweep = grid.heads
    base = set()
    for heads in sweep.num_heads:
        for kv in sweep.kv_heads:
            kv_heads = kv or heads  # 0 means MHA
            if kv_heads <= heads and heads % kv_heads == 0:
                for head_dim in sweep.head_dim:
                    for window in sweep.window_size:
                        base.add((heads, kv_heads, head_dim, window))
    origins = model_origins(base, shapes, "attention")
    return sorted(base | origins.keys()), origins


SHAPE_FIELDS = ("num_heads", "num_key_value_heads", "head_dim", "window_size")


def _expand(op: str, grid: AttentionGrid, shapes, lengths: list[int], context: bool) -> list[Group]:
    configs, origins = head_configs(grid, shapes)
    rows = {}
    for p in grid.precisions:
        values = []
        for heads, kv, head_dim, window in configs:
            cap = grid.max_tokens_mha if kv == heads else grid.max_tokens_gqa
            for batch in grid.batch_size:
                for length in lengths:
                    # context: batch x isl new tokens; generation: batch x (step + 1) cached tokens
                    tokens = batch * length if context else batch * (length + 1)
                    if tokens <= cap:
                        isl, step = (length, 0) if context else (1, length)
                        values.append(
                            (batch, isl, heads, kv, head_dim, 1, p.attn_dtype, p.kv_cache_dtype, step, window)
                        )
        rows[(p.attn_dtype, p.kv_cache_dtype)] = values
    return make_groups(op, AttentionCase, ("attn_dtype", "kv_cache_dtype"), rows, origins, SHAPE_FIELDS)


def expand_context(grid: ContextAttentionGrid, shapes) -> list[Group]:
    return _expand("attention_context", grid, shapes, grid.isl, context=True)


def expand_generation(grid: GenerationAttentionGrid, shapes) -> list[Group]:
    return _expand("attention_generation", grid, shapes, grid.step, context=False)


def _context_cost(c: AttentionCase) -> float:
    span = min(c.isl, c.window_size) if c.window_size else c.isl
    return 4.0 * c.batch_size * c.isl * span * c.num_heads * c.head_dim


def _generation_cost(c: AttentionCase) -> float:
    span = min(c.step + 1, c.window_size) if c.window_size else c.step + 1
    return 4.0 * c.batch_size * span * c.num_key_value_heads * c.head_dim + c.batch_size * span * c.num_heads


def _vllm(sm: str, group: Group) -> str:
    if sm_at_least(sm, 100):
        return "FLASHINFER"
    return "FLASH_ATTN" if sm_at_least(sm, 80) else "TRITON_ATTN"


def _sglang(sm: str, group: Group) -> str:
    if sm == "90":
        return "fa3"
    return "trtllm_mha" if sm_at_least(sm, 100) else "flashinfer"


def _trtllm_context(sm: str, group: Group) -> str:
    return "trtllm.fmha"


def _trtllm_generation(sm: str, group: Group) -> str:
    return "trtllm.xqa"


def _torch(sm: str, group: Group) -> str:
    return "torch.nn.functional.scaled_dot_product_attention"


CONTEXT = OpPlan(
    name="attention_context",
    family="attention",
    table="context_attention_perf",
    op_name="context_attention",
    case_type=AttentionCase,
    dtype_fields=("attn_dtype", "kv_cache_dtype"),
    expand=expand_context,
    tp_sizes=lambda grid: tuple(grid.model_tp_sizes),
    dispatch={"torch": _torch, "vllm": _vllm, "sglang": _sglang, "trtllm": _trtllm_context},
    cost=_context_cost,
)

GENERATION = OpPlan(
    name="attention_generation",
    family="attention",
    table="generation_attention_perf",
    op_name="generation_attention",
    case_type=AttentionCase,
    dtype_fields=("attn_dtype", "kv_cache_dtype"),
    expand=expand_generation,
    tp_sizes=lambda grid: tuple(grid.model_tp_sizes),
    dispatch={"torch": _torch, "vllm": _vllm, "sglang": _sglang, "trtllm": _trtllm_generation},
    cost=_generation_cost,
)
