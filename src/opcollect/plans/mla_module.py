"""A framework's whole MLA module (DeepSeek's attention block: projections, norms, rope and the MLA kernel)
at one rank, context and generation: the module tables of the reference (mla_*_module_perf).

vLLM times its DeepseekV2MLAAttention this way; the kernel-only MLA tables (plans/mla.py) are the other
frameworks'. num_heads are the heads on the rank and tp_size is 1, as the reference labels these tables.
"""

from __future__ import annotations

from typing import NamedTuple

from opcollect.cases.grids import ContextMlaModuleGrid, GenerationMlaModuleGrid, MlaModuleGrid
from opcollect.names import BACKENDS
from opcollect.plans import mla, selection
from opcollect.plans.base import Group, OpPlan, make_groups, refines
from opcollect.plans.work import Work, format_of


class MlaModuleCase(NamedTuple):
    model: str
    architecture: str
    mla_dtype: str
    kv_cache_dtype: str
    gemm_type: str
    num_heads: int  # on the rank
    batch_size: int
    isl: int
    tp_size: int
    step: int


# (hidden_size, q_lora_rank) of each architecture whose module the grids time (cases/models/<architecture>.yaml);
# its MLA heads are DeepSeek-V3's (plans/mla.py)
PROJECTIONS = {"DeepseekV3ForCausalLM": (7168, 1536)}


def work(c: MlaModuleCase) -> Work | None:
    """The kernel's attention (plans/mla.py attention_work) plus the module's projections for the b * isl tokens
    on the rank: the fused q_a + kv_a [hidden -> q_lora + 576] (replicated), q_b [q_lora -> heads * 192], kv_b's
    least cost and o [heads * 128 -> hidden], 2 FLOPs per weight per token at gemm_type's rate (kv_b too: its rate
    is at least bf16's). Every projection's weights are read once at gemm_type's width, the hidden states read and
    written once in bf16. None for an architecture without its dimensions here: no bound."""
    dims = PROJECTIONS.get(c.architecture)
    if dims is None:
        return None
    hidden, q_lora = dims
    g, a = format_of(c.gemm_type), format_of(c.mla_dtype)
    pairs, kv_b, moved = mla.attention_work(c, format_of(c.kv_cache_dtype).act, a.act)
    heads = c.num_heads
    weights = (
        hidden * (q_lora + mla.LATENT)
        + q_lora * heads * (mla.QK_NOPE + mla.QK_ROPE)
        + mla.KV_LORA * heads * (mla.QK_NOPE + mla.V_HEAD)
        + heads * mla.V_HEAD * hidden
    )
    tokens = c.batch_size * c.isl
    projections = 2.0 * tokens * (weights - mla.KV_LORA * heads * (mla.QK_NOPE + mla.V_HEAD))
    flops = {g.peak: projections + kv_b}
    flops[a.peak] = flops.get(a.peak, 0.0) + pairs
    return Work(flops, weights * g.weight + tokens * hidden * 2 * 2 + moved)


def _expand(op: str, grid: MlaModuleGrid, lengths: list[int], context: bool) -> list[Group]:
    rows: dict[tuple, list[tuple]] = {}
    for p in grid.precisions:
        for gemm_type in grid.gemm_types:
            rows[(p.mla_dtype, p.kv_cache_dtype, gemm_type)] = [
                (m.model, m.architecture, p.mla_dtype, p.kv_cache_dtype, gemm_type, heads, batch, *shape)
                for m in grid.models
                for heads in sorted(grid.num_heads, reverse=True)
                for batch in grid.batch_size
                for length in lengths
                if batch * length <= grid.max_tokens
                for shape in [(length, 1, 0) if context else (1, 1, length)]
            ]
    return make_groups(op, MlaModuleCase, ("mla_dtype", "kv_cache_dtype", "gemm_type"), rows)


def expand_context(grid: ContextMlaModuleGrid, shapes) -> list[Group]:
    return _expand("mla_context_module", grid, grid.isl, context=True)


def expand_generation(grid: GenerationMlaModuleGrid, shapes) -> list[Group]:
    return _expand("mla_generation_module", grid, grid.step, context=False)


def _vllm(sm: str, group: Group) -> str:
    """The MLA backend vLLM's selector gives DeepSeek's MLA at this SM and KV dtype (platforms/cuda.py:395-490,
    run by scripts/selection_tables.py into cases/selection); plans/mla.py's rule where the file has no answer."""
    chosen = selection.vllm_mla(sm, str(group.constants.get("kv_cache_dtype")))
    return chosen if chosen is not None else mla.CONTEXT.dispatch["vllm"](sm, group)


@refines(("isl", "mla_dtype"))  # mla_dtype: the fp8 prefill query
def _vllm_context(sm: str, dispatch: str, case: MlaModuleCase) -> str:
    return mla._vllm_context(sm, dispatch, case)


def _plan(name: str, table: str, expand, cost, case_dispatch) -> OpPlan:
    return OpPlan(
        name=name,
        family="mla",
        table=table,
        op_name=name,
        case_type=MlaModuleCase,
        dtype_fields=("mla_dtype", "kv_cache_dtype", "gemm_type"),
        expand=expand,
        tp_sizes=lambda grid: (),
        # the MLA backend the framework selects inside the module: plans/mla.py's per SM and KV dtype; the
        # backends without module tables skip these ops (plans/skips.py)
        dispatch={backend: _vllm if backend == "vllm" else mla.CONTEXT.dispatch[backend] for backend in BACKENDS},
        cost=cost,
        case_dispatch=case_dispatch,
        work=work,
    )


CONTEXT = _plan(
    "mla_context_module", "mla_context_module_perf", expand_context, mla.CONTEXT.cost, {"vllm": _vllm_context}
)
GENERATION = _plan("mla_generation_module", "mla_generation_module_perf", expand_generation, mla.GENERATION.cost, {})
