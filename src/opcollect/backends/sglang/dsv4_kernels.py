"""DeepSeek-V4's CSA indexer kernels at one rank as SGLang 0.5.14 calls them: its paged MQA logits
(dsv4_paged_mqa_logits_module) and its top-k, as a calibration (dsv4_csa_topk_calib). Each row times the one kernel
call the indexer makes, C4IndexerBackendMixin.forward_c4_indexer (srt/layers/attention/dsv4/indexer.py:432-660),
with the metadata serving builds for it: PagedIndexerMetadata (dsv4/metadata.py:96-160), SGLang's own class, over
the page table and compressed lengths the DeepSeek-V4 backend derives (deepseek_v4_backend.py:1670-1723, 264-288).
The reference collector is collector/sglang/deepseekv4_sparse_modules.py at 095f58a5 ("S:" below).

Paths are relative to the wheel's sglang/srt/. A case is batch_size requests of isl new tokens after step cached
ones; the indexer sees batch_size x isl query rows (prefill expands each request causally, deepseek_v4_backend.py:
1559-1660; decode has one row per request):
- Row j of a request stands at position step + j and its compressed length is (step + j + 1) // 4, unclamped
  (c4_topk_lengths_raw, the indexer's c4_seq_lens: dsv4/metadata_kernel.py:42, deepseek_v4_backend.py:553-558).
- The page table holds one row per query row of its request's pages of 256 tokens (page_size 256, which the
  backend and the metadata assert: deepseek_v4_backend.py:489, dsv4/metadata.py:148), as many as the longest
  request needs (req_to_token[.., :max_seq_len:256] // 256, :1695-1698); each request has its own pages.
- The indexer cache: per page 64 compressed tokens (c4_page_size) of 128 fp8 values, then their 64 fp32 scales,
  viewed [pages, 64, 1, 132] (indexer.py:485-506; the layout of dsa_inputs.fill_index).
- logits: what the indexer picks (indexer.py:512-529) on q fp8 [rows, 1, index_n_heads, index_head_dim], that
  cache, the fp32 head weights [rows, index_n_heads], the lengths [rows, 1], the page table, the metadata's DeepGEMM
  schedule and max_c4_seq_len (pages x 64), clean_logits False (:552-561): deep_gemm.fp8_paged_mqa_logits unless an
  environment flag picks the torch fallback (fp8_paged_mqa_logits_torch, or its SM120 twin). TileLang's and AITER's
  (SGLANG_OPT_USE_TILELANG_INDEXER, SGLANG_OPT_USE_AITER_INDEXER) are refused: not modelled here.
- top-k: over fp32 scores [rows, max_c4_seq_len], the rows' lengths and the page table, into int32 page indices
  [rows, index_topk] (c4_sparse_page_indices, deepseek_v4_backend.py:354-362) with the c4 page size 64
  (indexer.py:595-612): topk_transform_512 (v1) with raw indices, as prefill passes c4_sparse_raw_indices (:360-361);
  topk_transform_512_v2 with the metadata's plan_topk_v2 (dsv4/metadata.py:141-144) where SGLANG_OPT_USE_TOPK_V2
  (default True, environ.py:827) and no raw indices, as decode runs it; topk_transform_512_pytorch_vectorized where
  SGLANG_TOPK_TRANSFORM_512_TORCH. Scores are the reference's two anchors (S:1094-1118, backends/torch/dsv4_kernels
  topk_scores): all zeros (*_flat) or -5 + noise with each row's last index_topk visible entries at 5 + noise
  (*_top_last). A case whose longest row keeps every entry (trivial_topk) is held at 0 by the plan, not run.
The server's DeepSeek-V4 hook sets the indexer flags per device (server_args.py:3787-3808: SM120 turns TOPK_V2 off
and the torch logits on; HIP also AITER's indexer on and the JIT metadata off); the runner's ServerArgs runs no hook
(context.py), so it sets them itself for each build (hook_flags). kernel_source names what the flags chose.

Deliberate differences from the reference collector:
- Lengths are serving's, (step + j + 1) // 4; the reference clamps them to at least 1 (S:469, S:1204), which differs
  only in rows before position 3.
- The logits and scores are max_c4_seq_len = pages x 64 wide, as serving's metadata makes them; the reference
  passes full_c4 (S:479) and a score row padded to 4 (S:1109).
- Each request has its own pages of the indexer cache; the reference's rows all read one shared set of blocks
  (S:461-470). The metadata (DeepGEMM's schedule, the v2 plan) is SGLang's PagedIndexerMetadata, as serving builds it.
- One graph replay times one call; the reference repeats it 4 times per replay (S:286-292).
- version is the framework's, not ``kernel-level`` (plans/dsv4_kernels.py).
"""

from __future__ import annotations

from typing import NamedTuple

from opcollect.backends.sglang.dsa_kernels import rotating
from opcollect.runtime.contract import KernelLimit, Prepared
from opcollect.runtime.dtypes import ceil_div
from opcollect.runtime.timing import random_tensor

PAGE_SIZE = 256  # DeepSeek-V4's KV page (deepseek_v4_backend.py:489)
RATIO = 4  # CSA's compression
C4_PAGE = PAGE_SIZE // RATIO  # compressed tokens a page holds: the indexer cache's block_kv (indexer.py:486)
INDEX_TOKEN_BYTES = 132  # 128 fp8 values and an fp32 scale (head_dim_with_sf, indexer.py:489)
TOPKS = (512, 1024)  # what the top-k kernels compile for (jit_kernel/dsv4/topk.py:20; backend :344-348)
LOGITS_ALIGN = 256  # DeepGEMM aligns a logits row to its split_kv of 256 on SM90/SM100 (collector :676-678)
LABELS = ("fp8_e4m3", "fp8_e4m3", "fp8_block")  # the reference's key labels (S:714-716): fp8 queries and cache
MODES = ("v1_flat", "v1_top_last", "v2_flat", "v2_top_last")
TOPK_V2 = "SGLANG_OPT_USE_TOPK_V2"
TOPK_TORCH = "SGLANG_TOPK_TRANSFORM_512_TORCH"
LOGITS_TORCH = "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH"
TILELANG = "SGLANG_OPT_USE_TILELANG_INDEXER"
AITER = "SGLANG_OPT_USE_AITER_INDEXER"
JIT_METADATA = "SGLANG_OPT_USE_JIT_INDEXER_METADATA"


class Batch(NamedTuple):
    rows: int  # batch_size x isl query rows
    pages: int  # 256-token pages of a request
    width: int  # max_c4_seq_len: the logits' and scores' row width


def batch(case) -> Batch:
    pages = ceil_div(case.step + case.isl, PAGE_SIZE)
    return Batch(case.batch_size * case.isl, pages, pages * C4_PAGE)


def check(case, op: str):
    """plans/dsv4.py's dimensions of the case's model, refusing before any framework import what the kernels do
    not run."""
    from opcollect.plans.dsv4 import DIMS  # the planner's table of the profiles: CPU-only, no framework

    labels = (case.mla_dtype, case.kv_cache_dtype, case.gemm_type)
    if labels != LABELS:
        raise KernelLimit(f"{op} runs fp8 queries and an fp8 indexer cache under the labels {LABELS}, not {labels}")
    if case.compress_ratio != RATIO:
        raise KernelLimit(f"the CSA indexer compresses by {RATIO}, not {case.compress_ratio}")
    if case.batch_size < 1 or case.isl < 1 or case.step < 0:
        raise KernelLimit(f"{op} needs requests with new tokens: {case}")
    d = DIMS.get(case.model)
    if d is None:
        raise KernelLimit(f"the SGLang DeepSeek-V4 kernel runner knows no dimensions of {case.model} (plans/dsv4.py)")
    if d.index_topk not in TOPKS:
        raise KernelLimit(f"SGLang's DeepSeek-V4 top-k runs index_topk {TOPKS}, not {d.index_topk}")
    return d


def trivial_topk(case) -> bool:
    """The plan's zero-latency rule (plans/dsv4_kernels.py trivial_topk, the reference's S:1202-1208)."""
    from opcollect.plans.dsv4_kernels import trivial_topk as rule  # CPU-only planner code, no framework

    return rule(case)


def hook_flags(sm120: bool, hip: bool) -> dict[str, bool]:
    """The indexer flags the DeepSeek-V4 model hook sets on this device (server_args.py:3787-3808)."""
    if sm120:
        return {TOPK_V2: False, LOGITS_TORCH: True}
    if hip:
        return {TOPK_V2: False, AITER: True, LOGITS_TORCH: True, JIT_METADATA: False}
    return {}


def device_kind() -> tuple[bool, bool]:
    from sglang.srt.utils.common import is_hip, is_sm120_supported

    return bool(is_sm120_supported()), bool(is_hip())


def logits_choice(flag, sm120: bool) -> str:
    """The paged-logits function the indexer picks (indexer.py:512-529), by name; ``flag(name)`` reads a flag."""
    for name in (TILELANG, AITER):
        if flag(name):
            raise KernelLimit(f"{name} picks an indexer the SGLang DeepSeek-V4 runner does not model")
    if flag(LOGITS_TORCH):
        return "fp8_paged_mqa_logits_torch_sm120" if sm120 else "fp8_paged_mqa_logits_torch"
    return "deep_gemm.fp8_paged_mqa_logits"


def topk_choice(flag, version: str) -> str:
    """The top-k the indexer runs (indexer.py:595-612): prefill passes raw indices, so never v2."""
    if flag(TOPK_TORCH):
        return "topk_transform_512_pytorch_vectorized"
    return "topk_transform_v2" if version == "v2" and flag(TOPK_V2) else "topk_transform_v1"


def row_tables(case, device: str):
    """(compressed lengths int32 [rows], page table int32 [rows, pages]) of the batch, as the backend derives them."""
    import torch

    b = batch(case)
    causal = case.step + 1 + torch.arange(case.isl, dtype=torch.int32, device=device)
    lengths = (causal // RATIO).repeat(case.batch_size)
    first = torch.arange(case.batch_size, dtype=torch.int32, device=device) * b.pages
    pages = first.unsqueeze(1) + torch.arange(b.pages, dtype=torch.int32, device=device)
    return lengths, pages.repeat_interleave(case.isl, dim=0).contiguous()


def indexer_metadata(case, device: str):
    """SGLang's PagedIndexerMetadata of the batch (its DeepGEMM schedule and v2 plan under the flags now set)."""
    from sglang.srt.layers.attention.dsv4.metadata import PagedIndexerMetadata

    lengths, table = row_tables(case, device)
    return PagedIndexerMetadata(page_size=PAGE_SIZE, page_table=table, c4_seq_lens=lengths)


def _flags(envs, flags: dict):
    from opcollect.backends.sglang.mhc import flags_set

    return flags_set(envs, flags)


# --- the paged MQA logits ---


def paged_footprint(case) -> int:
    from opcollect.plans.dsv4 import DIMS

    d = DIMS.get(case.model)
    if d is None:
        return 0  # prepare refuses the model before any allocation
    b = batch(case)
    q = b.rows * d.index_n_heads * (d.index_head_dim + 4)
    cache = case.batch_size * b.pages * C4_PAGE * INDEX_TOKEN_BYTES
    logits = b.rows * ceil_div(b.width, LOGITS_ALIGN) * LOGITS_ALIGN * 4
    return q + cache + logits + b.rows * (b.pages + 2) * 4


def prepare_paged(case, dispatch: str, device: str, copies: int) -> Prepared:
    d = check(case, "dsv4_paged_mqa_logits_module")
    import sglang.srt.layers.attention.dsv4.indexer as dsv4_indexer
    import torch
    from sglang.srt.environ import envs

    from opcollect.backends.sglang.dsa_inputs import fill_index

    sm120, hip = device_kind()
    with _flags(envs, hook_flags(sm120, hip)):
        label = logits_choice(lambda name: bool(getattr(envs, name).get()), sm120)
        meta = indexer_metadata(case, device)
    if label.startswith("deep_gemm"):
        # the DeepGEMM module SGLang's indexers call (the DeepSeek-V4 one imports it at the call, indexer.py:529)
        import sglang.srt.layers.attention.dsa.dsa_indexer as dsa_indexer  # a namespace package: no `from dsa`

        deep_gemm = dsa_indexer.deep_gemm
        if isinstance(deep_gemm, Exception):
            raise KernelLimit(f"SGLang's indexer has no DeepGEMM here: {deep_gemm}")
        fn = deep_gemm.fp8_paged_mqa_logits
    else:
        fn = getattr(dsv4_indexer, label)
    b = batch(case)
    heads, dim = d.index_n_heads, d.index_head_dim
    lengths = meta.c4_seq_lens.unsqueeze(-1)  # [rows, 1]: next_n 1, as the indexer passes them (:548-549)
    gen = torch.Generator(device=device).manual_seed(77)
    sets = []
    for i in range(copies):
        cache = torch.empty(case.batch_size * b.pages, C4_PAGE * INDEX_TOKEN_BYTES, dtype=torch.uint8, device=device)
        fill_index(cache, gen)
        sets.append(
            (
                random_tensor((b.rows, 1, heads, dim), torch.float8_e4m3fn, device, 10 * i),
                cache.view(-1, C4_PAGE, 1, INDEX_TOKEN_BYTES),
                random_tensor((b.rows, heads), torch.float32, device, 10 * i + 1),
            )
        )

    def run(q, cache, weights) -> None:
        fn(q, cache, weights, lengths, meta.page_table, meta.deep_gemm_metadata, meta.max_c4_seq_len, False)

    return rotating(sets, run, label)


# --- the top-k ---


def topk_footprint(case) -> int:
    if trivial_topk(case):
        return 0  # not run
    from opcollect.plans.dsv4 import DIMS

    d = DIMS.get(case.model)
    if d is None:
        return 0
    b = batch(case)
    return b.rows * b.width * 4 + b.rows * (2 * d.index_topk + b.pages + 4) * 4


def prepare_topk(case, dispatch: str, device: str, copies: int) -> Prepared:
    d = check(case, "dsv4_csa_topk_calib")
    if case.score_mode not in MODES:
        raise KernelLimit(f"SGLang's DeepSeek-V4 top-k is timed on score modes {MODES}, not {case.score_mode!r}")
    if trivial_topk(case):
        raise KernelLimit("every row keeps all its entries: the plan holds the case at 0, untimed")
    import sglang.srt.layers.attention.dsv4.indexer as dsv4_indexer
    import torch
    from sglang.srt.environ import envs

    from opcollect.backends.torch.dsv4_kernels import topk_scores

    version = case.score_mode.split("_", 1)[0]
    sm120, hip = device_kind()
    with _flags(envs, hook_flags(sm120, hip)):
        label = topk_choice(lambda name: bool(getattr(envs, name).get()), version)
        meta = indexer_metadata(case, device)
    b = batch(case)
    lengths, table, plan = meta.c4_seq_lens, meta.page_table, meta.topk_metadata
    out = torch.full((b.rows, d.index_topk), -1, dtype=torch.int32, device=device)
    raw = torch.empty_like(out) if version == "v1" else None  # prefill's c4_sparse_raw_indices
    sets = [(topk_scores(case.score_mode, lengths, b.width, d.index_topk, device),) for _ in range(copies)]

    def run(scores) -> None:
        if label == "topk_transform_v2":
            dsv4_indexer.topk_transform_512_v2(scores, lengths, table, out, meta.c4_page_size, plan)
        elif label == "topk_transform_v1":
            dsv4_indexer.topk_transform_512(scores, lengths, table, out, meta.c4_page_size, raw)
        else:
            dsv4_indexer.topk_transform_512_pytorch_vectorized(scores, lengths, table, out, meta.c4_page_size, raw)

    return rotating(sets, run, label)
