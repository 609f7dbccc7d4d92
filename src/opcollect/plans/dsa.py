"""DeepSeek's sparse attention (DSA: DeepSeek-V3.2, GLM-5.x) as a framework's whole attention module at one rank,
prefill and decode: the module tables of the reference (sparse_attention/<fw>/<ver>/dsa_*_module_perf).

The module is the MLA projections, the lightning indexer (its projections, fp8 MQA logits over every cached token
and the top index_topk tokens) and the sparse MLA kernel over those tokens. Columns are mla_*_module_perf's, in
its order (plans/mla_module.py), with op_name a key: SGLang writes the layers that skip the indexer (GLM-5.2 runs
it on one layer in four) into the same table as op_name <op>_skip_indexer. Context rows: isl new tokens after
`step` cached ones; decode rows: isl 1, `step` the cache (vLLM and TensorRT-LLM count the new token in it, SGLang
does not). Each framework's sweep is its own (cases/base_ops/dsa_*.yaml, plans/sparse_sweeps.py).

Deliberate differences from the reference collector, none in the key columns:
- The SGLang dense-prefill threshold is 2048 (SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD, which SGLang sets to
  the model's index_topk, server_args.py:3528-3541): every DSA config the consumer ships has index_topk 2048, so a
  --model config with another index_topk has its dense-prefill rows dispatched at 2048 (the runner records what
  ran).
- The cases the H200 reference lacks because they fail are planned, their failures recorded: vLLM's 800 fp8-cache
  prefills below 32 heads with batch x isl from 65536 (FlashMLA sparse's fp8 mixed-batch path,
  v1/attention/backends/mla/flashmla_sparse.py:63, :515-545), SGLang's 84 one-million-token ceilings at batch 32
  (illegal memory accesses, collector/sglang/registry.py:131-134), vLLM's SM100 decodes at 1, 2 and 4 heads
  (FlashInfer's trtllm-gen sparse decode has no such tile, collector/vllm/collect_mla_module.py:893-902).
- SGLang's H200 reference is two collections: its full layers were timed on GLM-5 and GLM-5-FP8 (July), its
  indexer-skipping ones on GLM-5.2 (August); the grid names them so (the consumer keys on architecture, not model).
"""

from __future__ import annotations

from typing import NamedTuple

from opcollect.cases.grids_sparse import ContextModuleGrid, GenerationModuleGrid
from opcollect.cases.sparse import Dsa
from opcollect.names import BACKENDS
from opcollect.plans import mla
from opcollect.plans.base import Group, OpPlan, refines
from opcollect.plans.sparse_sweeps import (
    by_sweep,
    context_shapes,
    generation_shapes,
    rank_heads,
    sm_major,
    sweep_groups,
    sweep_models,
)
from opcollect.plans.work import Work, causal_pairs, format_of

SKIP_INDEXER = "_skip_indexer"  # SGLang's op_name suffix for the layers that reuse the previous top-k


class DsaModuleCase(NamedTuple):
    op_name: str  # dsa_<phase>_module, or SGLang's dsa_<phase>_module_skip_indexer
    model: str
    architecture: str
    mla_dtype: str
    kv_cache_dtype: str
    gemm_type: str
    num_heads: int  # on the rank
    batch_size: int
    isl: int
    tp_size: int  # SGLang's emulated TP; 1 where a rank's heads are swept directly
    step: int


DTYPES = ("mla_dtype", "kv_cache_dtype", "gemm_type")


def _expand(op: str, grid, shapes, context: bool) -> list[Group]:
    rows: dict[tuple, list[tuple]] = {}
    for sweep in grid.sweeps:
        backends = tuple(sweep.backends)
        for m in sweep_models(op, sweep, shapes, Dsa):
            a = m.attention
            name = op + (SKIP_INDEXER if m.skip_indexer else "")
            if context:
                found = [(b, s, p) for b, s, p in context_shapes(sweep, a.max_positions)]
            else:
                found = [(b, 1, step) for b, step in generation_shapes(sweep, a.max_positions)]
            for p in sweep.precisions:
                for gemm in sweep.gemm_types or [a.gemm_type]:
                    key = (p.mla_dtype, p.kv_cache_dtype, gemm)
                    rows.setdefault((backends, key), []).extend(
                        (name, m.label, a.architecture, *key, heads, b, isl, tp, step)
                        for heads, tp in rank_heads(sweep, a)
                        for b, isl, step in found
                    )
    return sweep_groups(op, DsaModuleCase, DTYPES, rows)


def expand_context(grid: ContextModuleGrid, shapes) -> list[Group]:
    return _expand("dsa_context_module", grid, shapes, context=True)


def expand_generation(grid: GenerationModuleGrid, shapes) -> list[Group]:
    return _expand("dsa_generation_module", grid, shapes, context=False)


# --- dispatch: what each framework selects inside the module, per SM (the table's kernel_source) ---


def _vllm(sm: str, group: Group) -> str:
    """vLLM 0.24.0's sparse MLA backend (platforms/cuda.py:93-142; the reference's kernel_source is
    attn_backend.get_name(), collector/vllm/collect_mla_module.py:286-300): on the SM100 family FlashInfer's for an
    fp8 cache, and for bf16 at 16 heads or fewer (_vllm_heads), FlashMLA's otherwise; FlashMLA's on SM90 (the only
    sparse entry of its list); FlashInfer's SM120 kernel there (every DSA case fails on SM120: skips.py)."""
    major = sm_major(sm)
    if major == 10:
        return "FLASHINFER_MLA_SPARSE" if group.constants["kv_cache_dtype"] == "fp8" else "FLASHMLA_SPARSE"
    if major == 12:
        return "FLASHINFER_MLA_SPARSE_SM120"
    return "FLASHMLA_SPARSE"


@refines(("num_heads",), ("FLASHMLA_SPARSE",))
def _vllm_heads(sm: str, dispatch: str, case: DsaModuleCase) -> str:
    """A bf16 cache on the SM100 family prefers FlashInfer's sparse MLA at 16 heads or fewer ("FlashMLA uses
    padding", platforms/cuda.py:106-116)."""
    if dispatch == "FLASHMLA_SPARSE" and sm_major(sm) == 10 and case.num_heads <= 16:
        return "FLASHINFER_MLA_SPARSE"
    return dispatch


def _sglang_impl(sm: str, group: Group, context: bool) -> str:
    """SGLang 0.5.14's DSA backends (server_args.py:3431-3479 _set_default_dsa_backends): bf16 KV prefill
    flashmla_sparse, decode fa3 (Hopper) or trtllm (major 10 and up); fp8 KV flashmla_kv (Hopper) or trtllm for
    both. The reference names sglang_dsa_indexer_<impl> (collector/sglang/collect_mla_module.py:1790-1792,
    :2138-2140)."""
    blackwell = sm_major(sm) >= 10
    if group.constants["kv_cache_dtype"] == "fp8":
        impl = "trtllm" if blackwell else "flashmla_kv"
    elif context:
        impl = "flashmla_sparse"
    else:
        impl = "trtllm" if blackwell else "fa3"
    return f"sglang_dsa_indexer_{impl}"


SGLANG_IMPLS = frozenset(f"sglang_dsa_indexer_{impl}" for impl in ("flashmla_sparse", "flashmla_kv", "trtllm", "fa3"))
DENSE_KV_LEN = 2048  # SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD: the models' index_topk (module docstring)
MAX_KV_CHUNK = 128 * 1024  # SGLANG_MAX_KV_CHUNK_CAPACITY (srt/environ.py:566)


@refines(("op_name", "isl", "step", "batch_size"), SGLANG_IMPLS)
def _sglang_context(sm: str, dispatch: str, case: DsaModuleCase) -> str:
    """SGLang runs a short prefill as dense MHA (dsa_backend.py:2431-2467 use_mha): on SM90 and SM100-109, when
    the longest request (step + isl) is within the dense threshold and the batch's tokens within the KV chunk
    capacity; named sglang_dsa_dense_mha_{fa3 | trtllm_ragged} whichever op (collect_mla_module.py:1786-1789).
    Otherwise the indexer path, sglang_dsa_skip_indexer_<impl> for the indexer-skipping layers."""
    if dispatch not in SGLANG_IMPLS:
        return dispatch
    total = case.step + case.isl
    major = sm_major(sm)
    if (sm == "90" or major == 10) and total <= DENSE_KV_LEN and case.batch_size * total <= MAX_KV_CHUNK:
        return "sglang_dsa_dense_mha_" + ("fa3" if sm == "90" else "trtllm_ragged")
    return _sglang_generation(sm, dispatch, case)


@refines(("op_name",), SGLANG_IMPLS)
def _sglang_generation(sm: str, dispatch: str, case: DsaModuleCase) -> str:
    if dispatch in SGLANG_IMPLS and case.op_name.endswith(SKIP_INDEXER):
        return dispatch.replace("_indexer_", "_skip_indexer_", 1)
    return dispatch


def _dispatch(backend: str, context: bool):
    rules = {
        "vllm": _vllm,
        "sglang": lambda sm, group: _sglang_impl(sm, group, context),
        # TensorRT-LLM's DSA rows name no kernel: a static label (collector/trtllm/collect_mla_module.py:974)
        "trtllm": lambda sm, group: "default",
        "torch": lambda sm, group: "torch.dsa_reference",
    }
    return by_sweep(backend, rules[backend])


# --- the least work (speed of light) ---


class Dims(NamedTuple):
    hidden: int
    q_lora: int
    qk_nope: int
    qk_rope: int
    v_head: int
    index_heads: int
    index_dim: int
    index_topk: int


# each architecture's module, from its profile (cases/models); the consumer hard-codes the same per architecture
# (aiconfigurator_core sdk/operations/dsa.py:47-70 DSA_MODEL_DIMS)
DIMS = {
    "DeepseekV32ForCausalLM": Dims(7168, 1536, 128, 64, 128, 64, 128, 2048),
    "GlmMoeDsaForCausalLM": Dims(6144, 2048, 192, 64, 256, 32, 128, 2048),
}


def sparse_pairs(queries: int, prefix: int, topk: int) -> int:
    """(query, key) pairs when query i (1-based) after ``prefix`` cached tokens reads min(topk, prefix + i) keys."""
    dense = max(0, min(queries, topk - prefix))  # the queries that still see fewer than topk keys
    return causal_pairs(dense, prefix, 0) + (queries - dense) * topk


def work(c: DsaModuleCase) -> Work | None:
    """Every projection's weights once per token (2 FLOPs per weight, at gemm_type's rate: the fused q_a/kv_a, q_b,
    kv_b once per query as the absorbed form applies it, o, and the indexer's key projection wk unless the layer
    skips the indexer) and MLA's expanded pair cost (2 x (qk_nope + qk_rope + v_head) per head) over the top-k keys
    each query reads. The indexer's scoring (its wq_b and head-weight projections, 2 x index_dim fp8 FLOPs per index
    head and key) only for the queries that see more than index_topk keys: a shorter request keeps every key, and
    SGLang then runs dense MHA without it. Weights, the hidden states in and out, each request's read keys (its last
    query's top-k, 576-wide latents) and, for a scoring request, every key's fp8 index key cross memory once. A decode
    query sees `step` keys (the fewest of the frameworks' counts). None for an architecture without its dimensions
    here."""
    d = DIMS.get(c.architecture)
    if d is None:
        return None
    g, a = format_of(c.gemm_type), format_of(c.mla_dtype)
    heads, tokens = c.num_heads, c.batch_size * c.isl
    weights = (
        d.hidden * (d.q_lora + mla.LATENT)
        + d.q_lora * heads * (d.qk_nope + d.qk_rope)
        + mla.KV_LORA * heads * (d.qk_nope + d.v_head)
        + heads * d.v_head * d.hidden
    )
    prefix = c.step if c.isl > 1 else c.step - 1  # a decode step's own token is among its step keys
    indexer = not c.op_name.endswith(SKIP_INDEXER)
    if indexer:
        weights += d.hidden * d.index_dim  # wk: every new token's index key goes to the cache
    pairs = c.batch_size * sparse_pairs(c.isl, prefix, d.index_topk)
    flops = {g.peak: 2.0 * tokens * weights}
    flops[a.peak] = flops.get(a.peak, 0.0) + 2.0 * heads * (d.qk_nope + d.qk_rope + d.v_head) * pairs
    read = c.batch_size * min(d.index_topk, prefix + c.isl) * mla.LATENT * format_of(c.kv_cache_dtype).act
    moved = weights * g.weight + tokens * d.hidden * 2 * 2 + read
    dense = min(c.isl, max(0, d.index_topk - prefix))  # the queries that keep every key they see
    if indexer and dense < c.isl:
        scoring = c.batch_size * (c.isl - dense)
        score_weights = d.q_lora * d.index_heads * d.index_dim + d.hidden * d.index_heads
        flops[g.peak] += 2.0 * scoring * score_weights
        fp8 = format_of("fp8")
        seen = c.batch_size * (causal_pairs(c.isl, prefix, 0) - causal_pairs(dense, prefix, 0))
        flops[fp8.peak] = flops.get(fp8.peak, 0.0) + 2.0 * d.index_heads * d.index_dim * seen
        moved += score_weights * g.weight + c.batch_size * (prefix + c.isl) * d.index_dim
    return Work(flops, moved)


def cost(c: DsaModuleCase) -> float:
    """Relative work: FLOPs plus bytes of the bound, or the tokens and keys where it has none."""
    found = work(c)
    if found is None:
        return float(c.batch_size * c.isl * (c.step + c.isl) * c.num_heads)
    return sum(found.flops.values()) + found.bytes


def _plan(name: str, expand, case_dispatch) -> OpPlan:
    return OpPlan(
        name=name,
        family="sparse_attention",
        table=f"{name}_perf",
        op_name=None,  # each case's: SGLang's skip_indexer layers share the table
        case_type=DsaModuleCase,
        dtype_fields=DTYPES,
        expand=expand,
        tp_sizes=lambda grid: (),
        dispatch={backend: _dispatch(backend, name == "dsa_context_module") for backend in BACKENDS},
        cost=cost,
        case_dispatch=case_dispatch,
        work=work,
    )


CONTEXT = _plan("dsa_context_module", expand_context, {"vllm": _vllm_heads, "sglang": _sglang_context})
GENERATION = _plan("dsa_generation_module", expand_generation, {"vllm": _vllm_heads, "sglang": _sglang_generation})
