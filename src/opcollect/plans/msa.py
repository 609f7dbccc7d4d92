"""MiniMax-M3's block-sparse attention (MSA) as a framework's whole attention module at one rank, prefill and decode:
the reference's msa/<fw>/<ver>/msa_*_module_perf (vLLM 0.24.0, TensorRT-LLM 1.3.0rc23).

The module is the fused q/k/v/index projection, q/k norms with partial rope and the KV insert, the index top-k over
128-token blocks, the sparse attention over the chosen blocks and o_proj. Columns and key are mla_*_module_perf's
(plans/mla_module.py MlaModuleCase): num_heads on the rank at tp_size 1, the rank's KV heads max(1, heads / 16) as
both collectors emulate them. Context rows: isl new tokens after `step` cached ones; decode rows: isl 1 after `step`
cached tokens, 2^k - 1 as the reference holds them (cases/base_ops/msa_generation_module.yaml).

TensorRT-LLM's table is at its second pin, 1.3.0rc23, whose MSA route differs by SM (an `implementation` field
rc20 lacks): dispatch here follows the SM rule, and the version the runner finds installed picks the route it
times (the runtime looks runners up by installed version; backends/trtllm/__init__.py).

Deliberate differences from the reference collector, none in the key columns: vLLM's decode sweep drops a case
whose KV cache would pass 90% of the device's memory before it runs (collector/vllm/collect_msa_module.py:116-154,
six 128-head rows on an H200); here every case is planned and a case that does not fit is refused at run time.
TensorRT-LLM's 128-head cases, which fail by construction, are skipped with their reason (plans/skips.py).
"""

from __future__ import annotations

from opcollect.cases.grids_sparse import ContextModuleGrid, GenerationModuleGrid
from opcollect.cases.sparse import Msa
from opcollect.names import BACKENDS
from opcollect.plans.base import Group, OpPlan
from opcollect.plans.dsa import sparse_pairs
from opcollect.plans.mla_module import MlaModuleCase
from opcollect.plans.sparse_sweeps import (
    NOT_THIS_FRAMEWORK,
    by_sweep,
    context_shapes,
    generation_shapes,
    rank_heads,
    sweep_groups,
    sweep_models,
)
from opcollect.plans.work import Work, causal_pairs, format_of

DTYPES = ("mla_dtype", "kv_cache_dtype", "gemm_type")


def _expand(op: str, grid, shapes, context: bool) -> list[Group]:
    rows: dict[tuple, list[tuple]] = {}
    for sweep in grid.sweeps:
        for m in sweep_models(op, sweep, shapes, Msa):
            if context:
                found = context_shapes(sweep, None)
            else:
                found = [(b, 1, step) for b, step in generation_shapes(sweep, None)]
            for p in sweep.precisions:
                for gemm in sweep.gemm_types or ["bfloat16"]:
                    key = (p.mla_dtype, p.kv_cache_dtype, gemm)
                    rows.setdefault((tuple(sweep.backends), key), []).extend(
                        (m.label, m.attention.architecture, *key, heads, b, isl, tp, step)
                        for heads, tp in rank_heads(sweep, m.attention)
                        for b, isl, step in found
                    )
    return sweep_groups(op, MlaModuleCase, DTYPES, rows)


def expand_context(grid: ContextModuleGrid, shapes) -> list[Group]:
    return _expand("msa_context_module", grid, shapes, context=True)


def expand_generation(grid: GenerationModuleGrid, shapes) -> list[Group]:
    return _expand("msa_generation_module", grid, shapes, context=False)


def _vllm(sm: str, group: Group) -> str:
    """The class vLLM 0.24.0 builds for the sparse layer (the reference's kernel_source is type(impl).__name__,
    collector/vllm/collect_msa_module.py:803): MiniMaxM3SparseMSAImpl on the SM100 family for top-k blocks 4, 8, 16
    or 32 and any cache but fp8_e5m2, MiniMaxM3SparseTritonImpl elsewhere (models/minimax_m3/common/
    sparse_attention.py:391-422, chosen at nvidia/model.py:501-513); MiniMax-M3 keeps 16 blocks, its cache is bf16
    or fp8 (e4m3)."""
    return "MiniMaxM3SparseMSAImpl" if sm in ("100", "103") else "MiniMaxM3SparseTritonImpl"


def _trtllm(sm: str, group: Group) -> str:
    """TensorRT-LLM 1.3.0rc23 sets MiniMaxM3SparseAttentionConfig.implementation "msa" on SM100/103, "triton"
    elsewhere, and the reference labels them msa_fmha_sm100 and default (collector/trtllm/collect_msa_module.py:
    358-367, :766-777; rc20 has no such field and runs Triton: default)."""
    return "msa_fmha_sm100" if sm in ("100", "103") else "default"


RULES = {
    "vllm": _vllm,
    "trtllm": _trtllm,
    "sglang": lambda sm, group: NOT_THIS_FRAMEWORK,  # SGLang 0.5.14 has no MiniMax-M3 model: no sweep names it
    "torch": lambda sm, group: "torch.msa_reference",
}

# MiniMax-M3's attention (cases/models/MiniMaxM3ForCausalLM.yaml): hidden 6144, heads of 128, 16 query heads per KV
# head, index keys of 128, the top 16 blocks of 128 tokens; the consumer hard-codes the same (sdk/models/
# minimax_m3.py:36-42)
HIDDEN, HEAD_DIM, GROUP, INDEX_DIM, TOPK_TOKENS = 6144, 128, 16, 128, 16 * 128
ARCHITECTURES = frozenset({"MiniMaxM3ForCausalLM"})


def work(c: MlaModuleCase) -> Work | None:
    """The q/k/v/o projections and the index branch's (as many index heads as KV heads, the fewest of the
    frameworks': vLLM shards them with K and V) once per token at gemm_type's rate; 2 x (128 + 128) FLOPs per head
    for each of the at most 16 x 128 tokens a query attends to, and 2 x 128 per index head for every token it
    scores. Weights, the hidden states in and out, each request's attended K and V (its last query's) and every
    token's index key (bf16) cross memory once. None for another architecture."""
    if c.architecture not in ARCHITECTURES:
        return None
    g, a = format_of(c.gemm_type), format_of(c.mla_dtype)
    heads, kv = c.num_heads, max(1, c.num_heads // GROUP)
    tokens = c.batch_size * c.isl
    weights = HIDDEN * (heads + 2 * kv + kv + 1) * HEAD_DIM + heads * HEAD_DIM * HIDDEN
    total = c.step + c.isl  # a decode step's `step` are cached tokens, its own is one more
    pairs = c.batch_size * sparse_pairs(c.isl, c.step, TOPK_TOKENS)
    scored = c.batch_size * causal_pairs(c.isl, c.step, 0)
    flops = {g.peak: 2.0 * tokens * weights}
    flops[a.peak] = flops.get(a.peak, 0.0) + 2.0 * heads * 2 * HEAD_DIM * pairs + 2.0 * kv * INDEX_DIM * scored
    kv_bytes = format_of(c.kv_cache_dtype).act
    read = c.batch_size * (min(TOPK_TOKENS, total) * kv * 2 * HEAD_DIM * kv_bytes + total * INDEX_DIM * 2)
    return Work(flops, weights * g.weight + tokens * HIDDEN * 2 * 2 + read)


def cost(c: MlaModuleCase) -> float:
    found = work(c)
    if found is None:
        return float(c.batch_size * c.isl * (c.step + c.isl) * c.num_heads)
    return sum(found.flops.values()) + found.bytes


def _plan(name: str, expand) -> OpPlan:
    return OpPlan(
        name=name,
        family="msa",
        table=f"{name}_perf",
        op_name=name,
        case_type=MlaModuleCase,
        dtype_fields=DTYPES,
        expand=expand,
        tp_sizes=lambda grid: (),
        dispatch={backend: by_sweep(backend, RULES[backend]) for backend in BACKENDS},
        cost=cost,
        work=work,
    )


CONTEXT = _plan("msa_context_module", expand_context)
GENERATION = _plan("msa_generation_module", expand_generation)
