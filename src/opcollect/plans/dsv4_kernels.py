"""Kernels inside DeepSeek-V4's attention, timed alone: the CSA indexer's paged MQA logits
(dsv4_paged_mqa_logits_module_perf, vLLM and SGLang), the HCA layer's sparse MLA (dsv4_hca_attn_module_perf,
vLLM) and the CSA indexer's top-k, as a calibration (dsv4_csa_topk_calib_perf, SGLang).

num_heads is the model's num_attention_heads here (the consumer keys these tables by it, dsv4.rs:917-962) and
tp_size 1; vLLM adds the rank's heads as local_num_heads (collector/vllm/collect_dsv4_attn.py:796-813), a column
SGLang's paged table does not have (collector/sglang/deepseekv4_sparse_modules.py:685-698): OpPlan.columns leaves
it out of SGLang's table, whose keys are the rest.

- paged MQA logits: DeepGEMM's scoring of the compressed indexer cache, q [m, index_n_heads, index_head_dim] fp8
  against every cached c4 token of a sequence (vLLM: vllm.utils.deep_gemm.fp8_fp4_paged_mqa_logits, SGLang:
  deep_gemm.fp8_paged_mqa_logits). mla_dtype fp8_e4m3 is the query's, as both collectors label it.
- HCA sparse MLA: DeepseekV4Attention.forward_mqa over the sliding window and the 128-to-1 compressed KV, without
  the projections (collector/vllm/collect_dsv4_attn.py:674-711, 752-791).
- top-k calibration: SGLang's topk_transform_512 (v1: prefill, which passes raw indices, dsv4/indexer.py:595-612)
  or topk_transform_512_v2 (v2: decode, SGLANG_OPT_USE_TOPK_V2, environ.py:827) over rows of indexer scores that
  are all equal (score_mode *_flat: the tie-break path the module rows' dummy weights take) or have their top-k at
  the causal tail (*_top_last); the consumer subtracts flat - top_last from the CSA module rows
  (aiconfigurator-core dsv4.rs:467-503, 815-900).

Deliberate differences from the reference:
- version: SGLang's paged and top-k rows say ``kernel-level`` (deepseekv4_sparse_modules.py:714); ours say the
  framework version the rows were timed with, as every table's do (the consumer does not read it there).
- top-k rows whose compressed length (step + isl) // 4 (at least 1) is no more than the model's index_topk keep
  every token: the reference writes latency 0.0 for them without timing (deepseekv4_sparse_modules.py:1202-1208),
  so that the consumer's correction is exactly 0 there (5074 of the reference's 9004 rows). OpPlan.zero_latency
  names those cases: a runner's Runner.untimed has the harness write them at 0 without running (timing "none",
  runtime/harness.py untimed), and the value rules (tables/values.py) admit a 0 on them alone.
- vLLM's paged rows give the m = batch_size x isl query rows causal lengths that run on across the requests
  (collector :628-634) where SGLang repeats them per request (:469); the keys are the same, the bound below
  takes the per-request (smaller) count.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple

from opcollect.cases.dsv4 import CSA, HCA
from opcollect.cases.grids_dsv4 import Dsv4Grid, Dsv4TopkGrid
from opcollect.cases.profiles import ModelShapes
from opcollect.plans import dsv4
from opcollect.plans.base import Group, OpPlan, make_groups, refines
from opcollect.plans.work import Work, causal_pairs

KV_TOKEN_BYTES = 584  # a cached DeepSeek-V4 token in FlashMLA's fp8_ds_mla layout (vLLM sparse_mla.py:98-110)
INDEX_TOKEN_BYTES = 132  # a cached indexer token: 128 fp8 values and an fp32 scale (collector :586-593)


class Dsv4KernelCase(NamedTuple):
    model: str
    architecture: str
    mla_dtype: str
    kv_cache_dtype: str
    gemm_type: str
    num_heads: int  # the model's
    local_num_heads: int  # the rank's; not a column of SGLang's table
    batch_size: int
    isl: int
    tp_size: int
    step: int
    compress_ratio: int


class Dsv4TopkCase(NamedTuple):
    model: str
    architecture: str
    mla_dtype: str
    kv_cache_dtype: str
    gemm_type: str
    num_heads: int  # the model's
    batch_size: int
    isl: int
    tp_size: int
    step: int
    compress_ratio: int
    score_mode: str  # v1_flat, v1_top_last (prefill), v2_flat, v2_top_last (decode); after latency in the table


def _shapes(sweep, a) -> list[tuple[int, int, int]]:
    """A sweep's context shapes, then its decode shapes that are not among them."""
    found: dict[tuple[int, int, int], None] = {}
    if sweep.context is not None:
        found.update(dict.fromkeys(dsv4.context_shapes(sweep.context, a.max_position_embeddings)))
    if sweep.decode is not None:
        found.update(dict.fromkeys(dsv4.decode_shapes(sweep.decode, a.max_position_embeddings)))
    return list(found)


def _expand_kernel(op: str, ratio: int):
    def expand(grid: Dsv4Grid, shapes: Mapping[str, ModelShapes]) -> list[Group]:
        rows: dict[tuple, dict[tuple, None]] = {}
        origins = {}
        for sweep in grid.sweeps:
            for name, a in dsv4.models(grid, shapes, dsv4.keeps(ratio)):
                origins[(name,)] = frozenset({name})
                found = _shapes(sweep, a)
                for p in sweep.precisions:
                    for gemm_type in sweep.gemm_types:
                        key = (p.mla_dtype, p.kv_cache_dtype, gemm_type)
                        bucket = rows.setdefault(key, {})
                        for tp in sweep.tp_sizes:
                            if a.num_heads % tp:
                                continue
                            local = a.num_heads // tp
                            for batch, isl, step in found:
                                bucket[
                                    (name, a.architecture, *key, a.num_heads, local, batch, isl, tp, step, ratio)
                                ] = None
        values = {key: list(found) for key, found in rows.items()}
        return make_groups(op, Dsv4KernelCase, dsv4.DTYPE_FIELDS, values, origins, ("model",))

    return expand


def expand_topk(grid: Dsv4TopkGrid, shapes: Mapping[str, ModelShapes]) -> list[Group]:
    """Each score mode at every context shape with the prefill top-k (v1) and at every decode shape with the
    decode one (v2), as the reference collector plans them (deepseekv4_sparse_modules.py:1009-1014)."""
    rows: dict[tuple, dict[tuple, None]] = {}
    origins = {}
    for sweep in grid.sweeps:
        for name, a in dsv4.models(grid, shapes, dsv4.keeps(CSA)):
            origins[(name,)] = frozenset({name})
            parts = []
            if sweep.context is not None:
                parts.append(("v1", dsv4.context_shapes(sweep.context, a.max_position_embeddings)))
            if sweep.decode is not None:
                parts.append(("v2", dsv4.decode_shapes(sweep.decode, a.max_position_embeddings)))
            for p in sweep.precisions:
                for gemm_type in sweep.gemm_types:
                    key = (p.mla_dtype, p.kv_cache_dtype, gemm_type)
                    bucket = rows.setdefault(key, {})
                    for tp in sweep.tp_sizes:
                        for version, found in parts:
                            for batch, isl, step in found:
                                for mode in grid.score_modes:
                                    row = (name, a.architecture, *key, a.num_heads, batch, isl, tp, step, CSA)
                                    bucket[(*row, f"{version}_{mode}")] = None
    values = {key: list(found) for key, found in rows.items()}
    return make_groups("dsv4_csa_topk_calib", Dsv4TopkCase, dsv4.DTYPE_FIELDS, values, origins, ("model",))


def _sum_floor(n: int, ratio: int) -> int:
    """sum of j // ratio for j = 1 .. n."""
    q, r = divmod(n, ratio)
    return ratio * q * (q - 1) // 2 + q * (r + 1)


def c4_pairs(batch: int, isl: int, step: int) -> int:
    """(query row, compressed token) pairs when each request's query j (1..isl) sees (step + j) // 4 compressed
    tokens, at least 1 (the collectors' context_lens, clamp(min=1))."""
    short = max(0, min(isl, 3 - step))  # rows whose (step + j) // 4 is 0: clamped to 1
    return batch * (_sum_floor(step + isl, CSA) - _sum_floor(step, CSA) + short)


def paged_work(c: Dsv4KernelCase) -> Work | None:
    """Every (query row, compressed token) pair per request (c4_pairs: vLLM's packed rows count more) scored by
    every index head, 2 x index_head_dim FLOPs each at fp8's rate; the fp8 queries and fp32 head weights read once,
    one request's indexer cache read once, the fp32 logits written once. None without the model's dimensions."""
    d = dsv4.DIMS.get(c.model)
    if d is None:
        return None
    pairs = c4_pairs(c.batch_size, c.isl, c.step)
    rows = c.batch_size * c.isl
    heads = d.index_n_heads
    moved = rows * heads * (d.index_head_dim + 4) + max(1, (c.step + c.isl) // CSA) * INDEX_TOKEN_BYTES + pairs * 4
    return Work({"fp8": 2.0 * heads * d.index_head_dim * pairs}, moved)


def hca_work(c: Dsv4KernelCase) -> Work | None:
    """Per request, query j (1..isl) attends to min(window, step + j) window tokens and (step + j) // 128
    compressed ones, each of the rank's heads 2 x (512 + 512) FLOPs per pair at bf16's rate (FlashMLA computes in
    bf16 from the fp8 cache); each request's cache read once, the bf16 queries read and outputs written once."""
    d = dsv4.DIMS.get(c.model)
    if d is None:
        return None
    compressed = _sum_floor(c.step + c.isl, HCA) - _sum_floor(c.step, HCA)
    pairs = c.batch_size * (causal_pairs(c.isl, c.step, d.sliding_window) + compressed)
    total = c.step + c.isl
    cached = c.batch_size * (min(total, d.sliding_window) + total // HCA) * KV_TOKEN_BYTES
    activations = 2 * c.batch_size * c.isl * c.local_num_heads * d.head_dim * 2
    return Work({"bfloat16": 2.0 * c.local_num_heads * 2 * d.head_dim * pairs}, cached + activations)


def trivial_topk(c: Dsv4TopkCase) -> bool:
    """No selection happens: the longest row's compressed length (step + isl) // 4 (at least 1) is within the
    model's index_topk, so the top-k is every token and the reference writes latency 0.0
    (deepseekv4_sparse_modules.py:1202-1208). A model without DIMS: never (its cases are timed)."""
    d = dsv4.DIMS.get(c.model)
    return d is not None and max(1, (c.step + c.isl) // CSA) <= d.index_topk


def topk_work(c: Dsv4TopkCase) -> Work | None:
    """Every row's fp32 scores read once and its index_topk int32 indices written once; no tensor-core work. None
    for a trivial top-k (latency 0, no bound) or a model without DIMS."""
    d = dsv4.DIMS.get(c.model)
    if d is None or trivial_topk(c):
        return None
    rows = c.batch_size * c.isl
    return Work({}, c4_pairs(c.batch_size, c.isl, c.step) * 4 + rows * d.index_topk * 4)


def _kernel_cost(c) -> float:
    return c.batch_size * c.isl * (c.step + c.isl + 64)


def _fixed(name: str):
    def dispatch(sm: str, group: Group) -> str:
        return name

    return dispatch


def _sglang_paged(sm: str, group: Group) -> str:
    """DeepGEMM's fp8_paged_mqa_logits, the label of the reference collector (deepseekv4_sparse_modules.py:
    251-255) and what SGLang 0.5.14's indexer calls unless an env picks tilelang, aiter or torch
    (srt/layers/attention/dsv4/indexer.py:512-529); on SM120 the server's DeepSeek-V4 hook sets
    SGLANG_FP8_PAGED_MQA_LOGITS_TORCH (server_args.py:3799), which calls fp8_paged_mqa_logits_torch_sm120 (:523-525)."""
    return "fp8_paged_mqa_logits_torch_sm120" if sm == "120" else "deep_gemm.fp8_paged_mqa_logits"


def _vllm_hca(sm: str, group: Group) -> str:
    return dsv4.vllm_backend(sm)  # the layer's backend name, as the collector labels these rows (:779-780)


@refines(("score_mode",))
def _sglang_topk(sm: str, dispatch: str, case: Dsv4TopkCase) -> str:
    """topk_transform_v1 for the prefill rows, topk_transform_v2 for the decode ones: the reference collector's
    labels, topk_transform_ + the score mode's version (deepseekv4_sparse_modules.py:704-707). SGLang 0.5.14 runs
    v1 where prefill hands it raw indices (deepseek_v4_backend.py:360-361, dsv4/indexer.py:595-612) and v2 in
    decode (SGLANG_OPT_USE_TOPK_V2 default True, environ.py:827); SM120 turns v2 off (server_args.py:3796), so its
    decode rows are skipped there (plans/skips.py sglang-topk-v2-off-on-sm120)."""
    return "topk_transform_" + case.score_mode.split("_", 1)[0]


def _kernel_plan(name: str, expand, dispatch, work, columns=None) -> OpPlan:
    return OpPlan(
        name=name,
        family=dsv4.FAMILY,
        table=f"{name}_perf",
        op_name=name,
        case_type=Dsv4KernelCase,
        dtype_fields=dsv4.DTYPE_FIELDS,
        expand=expand,
        tp_sizes=lambda grid: (),
        dispatch=dispatch,
        cost=_kernel_cost,
        columns=columns or {},
        work=work,
    )


NONE = _fixed("no-such-table")  # a backend without the table: plans/skips.py skips it

PAGED_MQA_LOGITS = _kernel_plan(
    "dsv4_paged_mqa_logits_module",
    _expand_kernel("dsv4_paged_mqa_logits_module", CSA),
    {
        "torch": _fixed("torch_paged_mqa_logits"),
        # vLLM 0.24.0's indexer decode calls DeepGEMM's fp8_fp4_paged_mqa_logits on every CUDA SM
        # (model_executor/layers/sparse_attn_indexer.py:324; utils/deep_gemm.py:565), the collector's label (:743)
        "vllm": _fixed("vllm.utils.deep_gemm.fp8_fp4_paged_mqa_logits"),
        "sglang": _sglang_paged,
        "trtllm": NONE,
    },
    paged_work,
    columns={"sglang": {"local_num_heads": None}},
)
HCA_ATTN = _kernel_plan(
    "dsv4_hca_attn_module",
    _expand_kernel("dsv4_hca_attn_module", HCA),
    {"torch": _fixed("torch_sparse_mla"), "vllm": _vllm_hca, "sglang": NONE, "trtllm": NONE},
    hca_work,
)
TOPK_CALIB = OpPlan(
    name="dsv4_csa_topk_calib",
    family=dsv4.FAMILY,
    table="dsv4_csa_topk_calib_perf",
    op_name="dsv4_csa_topk_calib",
    case_type=Dsv4TopkCase,
    dtype_fields=dsv4.DTYPE_FIELDS,
    expand=expand_topk,
    tp_sizes=lambda grid: (),
    dispatch={"torch": _fixed("torch.topk"), "vllm": NONE, "sglang": _fixed("topk_transform"), "trtllm": NONE},
    cost=_kernel_cost,
    after_latency=("score_mode",),
    case_dispatch={"sglang": _sglang_topk},
    zero_latency=trivial_topk,
    work=topk_work,
)
KERNELS = (PAGED_MQA_LOGITS, HCA_ATTN, TOPK_CALIB)
