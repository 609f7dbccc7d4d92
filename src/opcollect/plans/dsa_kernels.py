"""GLM-5's DSA layer split into its sparse kernels at one rank (SGLang 0.5.14): the indexer's fp8 MQA logits, its
top-k and the sparse MLA kernel, the reference's sparse_attention/sglang/0.5.14/glm5_{mqa_logits,topk,dsa_attn}_
module_perf. The consumer reads them only for SGLang's context-parallel prefill of GlmMoeDsa models (its Rust
load_cp_sparse; sdk/models/deepseek_v32.py:119-125), so SGLang alone has a sweep; torch has a CPU one.

Columns (collector/sglang/glm5_dsa_sparse_modules.py:127-178): mla_*_module_perf's plus compress_ratio, and the
top-k's score_mode after latency. Rows cover the DSA module sweep's prefill inputs and decode steps
(cases/base_ops/glm5_*.yaml); one per shape, two for the top-k (flat and top_last scores).

Deliberate differences from the reference:
- version: the reference writes `kernel-level` (:170); ours is the framework version the rows were timed at (the
  consumer reads no version column of these tables).
- The key columns keep the reference's labels although they are not what runs: mla_dtype and kv_cache_dtype
  fp8_e4m3 (the consumer's enums have no such name; it reads no dtype column here: tables/consumer.py), num_heads 64
  where the logits kernel runs the indexer's 32 heads, a bf16 cache under dsa_attn's fp8_e4m3 label.
- The top-k of a request whose tokens all fit in index_topk selects every token: the reference writes latency 0
  there without running the kernel (:349-351); OpPlan.zero_latency admits exactly those rows at 0.
"""

from __future__ import annotations

from typing import NamedTuple

from opcollect.cases.grids_sparse import KernelGrid, KernelSweep
from opcollect.cases.sparse import Dsa
from opcollect.errors import InputError
from opcollect.names import BACKENDS
from opcollect.plans import mla
from opcollect.plans.base import Group, OpPlan
from opcollect.plans.dsa import DIMS, sparse_pairs
from opcollect.plans.sparse_sweeps import by_sweep, prefill_shapes, sweep_groups
from opcollect.plans.work import Work, causal_pairs, format_of


class Glm5Case(NamedTuple):
    model: str
    architecture: str
    mla_dtype: str  # the reference's label (fp8_e4m3, dsa_attn bfloat16)
    kv_cache_dtype: str
    gemm_type: str
    num_heads: int  # the model's own
    batch_size: int
    isl: int
    tp_size: int
    step: int
    compress_ratio: int  # 1: GLM-5's DSA compresses nothing


class Glm5TopkCase(NamedTuple):
    model: str
    architecture: str
    mla_dtype: str
    kv_cache_dtype: str
    gemm_type: str
    num_heads: int
    batch_size: int
    isl: int
    tp_size: int
    step: int
    compress_ratio: int
    score_mode: str  # flat (all scores equal) or top_last (clear winners); after latency in the table


DTYPES = ("mla_dtype", "kv_cache_dtype", "gemm_type")


def kernel_shapes(sweep: KernelSweep, max_positions: int | None) -> list[tuple[int, int, int]]:
    """(batch_size, isl, step): the prefill inputs, then the decode steps (isl 1) not among them."""
    long = sweep.long
    base = [
        (b, s)
        for b in sweep.batch_size
        for s in sweep.isl
        if b * s <= sweep.max_tokens and not (long and s >= long.from_length and b > long.max_batch)
    ]
    shapes = prefill_shapes(base, sweep.prefix, sweep.prefix_ceilings, max_positions, sweep.max_kv_tokens)
    fits = (lambda step: True) if max_positions is None else (lambda step: step < max_positions)
    dl = sweep.decode_long
    decode = [
        (b, 1, step)
        for step in sweep.step
        for b in sweep.batch_size
        if b * step <= sweep.max_decode_tokens
        and not (dl and step >= dl.from_length and b > dl.max_batch)
        and fits(step)
    ]
    have = set(decode) | set(shapes)
    decode += [(1, 1, c - 1) for c in sweep.step_ceilings if fits(c - 1) and (1, 1, c - 1) not in have]
    return shapes + decode


def _expand(op: str, grid: KernelGrid, shapes, topk: bool) -> list[Group]:
    rows: dict[tuple, list[tuple]] = {}
    for sweep in grid.sweeps:
        spec = shapes.get(sweep.model.profile)
        if spec is None or not isinstance(spec.sparse, Dsa):
            raise InputError(
                f"cases/base_ops/{op}.yaml: model {sweep.model.model!r} names profile {sweep.model.profile!r}, which "
                f"has no DSA keys; name a profile of cases/models whose config has index_topk (known: "
                f"{', '.join(sorted(shapes))})"
            )
        a, labels = spec.sparse, sweep.labels
        key = (labels.mla_dtype, labels.kv_cache_dtype, labels.gemm_type)
        head = (sweep.model.model, a.architecture, *key, a.heads)
        modes = tuple(sweep.score_modes) if topk else ((),)
        rows.setdefault((tuple(sweep.backends), key), []).extend(
            (*head, b, isl, 1, step, 1, *((mode,) if topk else ()))
            for b, isl, step in kernel_shapes(sweep, a.max_positions)
            for mode in modes
        )
    return sweep_groups(op, Glm5TopkCase if topk else Glm5Case, DTYPES, rows)


INDEX_TOPK = 2048  # GLM-5's index_topk (cases/models/GlmMoeDsaForCausalLM.yaml)


def _dims(c):
    return DIMS.get(c.architecture)


def mqa_work(c: Glm5Case) -> Work | None:
    """DeepGEMM's fp8 MQA logits: 2 x index_dim FLOPs per index head for every (query, key) pair a request sees at
    fp8's rate; the fp8 queries and keys read once, the fp32 logits written once per pair."""
    d = _dims(c)
    if d is None:
        return None
    pairs = c.batch_size * causal_pairs(c.isl, c.step, 0)
    tokens = c.batch_size * c.isl
    moved = tokens * d.index_heads * (d.index_dim + 4) + c.batch_size * (c.step + c.isl) * d.index_dim + pairs * 4
    return Work({format_of("fp8").peak: 2.0 * d.index_heads * d.index_dim * pairs}, moved)


def topk_work(c: Glm5TopkCase) -> Work | None:
    """No FLOPs to speak of: every fp32 score read once and the chosen int32 indices written once."""
    pairs = c.batch_size * causal_pairs(c.isl, c.step, 0)
    chosen = c.batch_size * sparse_pairs(c.isl, c.step, INDEX_TOPK)
    return Work({}, pairs * 4.0 + chosen * 4.0)


def attn_work(c: Glm5Case) -> Work | None:
    """The sparse MLA kernel over the top-k tokens at MLA's least pair cost (2 x (qk_nope + qk_rope + v_head) per
    head, plans/dsa.py); the 576-wide queries, 512-wide outputs, each request's chosen latents (its last query's, in
    bf16 as the kernel runs) and the chosen indices cross memory once."""
    d = _dims(c)
    if d is None:
        return None
    pairs = c.batch_size * sparse_pairs(c.isl, c.step, d.index_topk)
    tokens, heads = c.batch_size * c.isl, c.num_heads
    keys = c.batch_size * min(d.index_topk, c.step + c.isl)
    moved = tokens * heads * (mla.LATENT + mla.KV_LORA) * 2 + keys * mla.LATENT * 2 + pairs * 4
    return Work({format_of("bfloat16").peak: 2.0 * heads * (d.qk_nope + d.qk_rope + d.v_head) * pairs}, moved)


def _cost(work):
    def cost(c) -> float:
        found = work(c)
        if found is None:
            return float(c.batch_size * c.isl * (c.step + c.isl))
        return sum(found.flops.values()) + found.bytes

    return cost


def _plan(name: str, kernel: str, torch: str, case_type: type, work, **extra) -> OpPlan:
    topk = case_type is Glm5TopkCase
    rules = {"sglang": lambda sm, group: kernel, "torch": lambda sm, group: torch}
    return OpPlan(
        name=name,
        family="sparse_attention",
        table=f"{name}_perf",
        op_name=name,
        case_type=case_type,
        dtype_fields=DTYPES,
        expand=lambda grid, shapes: _expand(name, grid, shapes, topk),
        tp_sizes=lambda grid: (),
        # the kernel the collector calls, on every SM (glm5_dsa_sparse_modules.py:107-116, :345)
        dispatch={b: by_sweep(b, rules.get(b, lambda sm, group: kernel)) for b in BACKENDS},
        cost=_cost(work),
        work=work,
        **extra,
    )


MQA_LOGITS = _plan("glm5_mqa_logits_module", "deep_gemm.fp8_mqa_logits", "torch.mqa_logits", Glm5Case, mqa_work)
# SGLANG_DSA_FUSE_TOPK defaults to True (srt/environ.py:582): the fused top-k and page transform, else fast_topk_v2
TOPK = _plan(
    "glm5_topk_module",
    "fast_topk_transform_fused",
    "torch.topk",
    Glm5TopkCase,
    topk_work,
    after_latency=("score_mode",),
    zero_latency=lambda c: c.step + c.isl <= INDEX_TOPK,
)
DSA_ATTN = _plan("glm5_dsa_attn_module", "flash_mla_sparse_fwd", "torch.sparse_mla", Glm5Case, attn_work)
