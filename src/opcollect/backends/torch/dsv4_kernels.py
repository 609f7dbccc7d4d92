"""Kernels inside DeepSeek-V4's attention, timed alone, in plain PyTorch (backends/torch/dsv4.py holds the math):
dsv4_paged_mqa_logits_module_perf, dsv4_hca_attn_module_perf and dsv4_csa_topk_calib_perf.

- paged MQA logits: batch_size requests of isl query rows, each row's index_n_heads x index_head_dim query scored
  against its request's max(1, (step + isl) // 4) compressed indexer keys, sum_h w_h relu(q_h . k) (SGLang 0.5.14's
  fp8_paged_mqa_logits_torch, srt/layers/attention/dsv4/indexer.py:49-112). Every row is scored against all its
  request's keys, as the kernel's clean_logits=False output leaves the causal tail to the top-k (the kernel skips
  the keys beyond each row's length: up to twice the work here where step is small against isl). The lengths
  repeat per request, as SGLang's collector sets them (deepseekv4_sparse_modules.py:469; vLLM's runs them on across
  the packed rows, collector/vllm/collect_dsv4_attn.py:628-634).
- HCA sparse MLA: forward_mqa alone (collector/vllm/collect_dsv4_attn.py:674-711): local_num_heads query heads over
  the sliding window and every visible 128-to-1 entry, with the attention sink (dsv4.sparse_attention), without the
  projections or cache writes.
- top-k calibration: batch_size x isl rows of fp32 scores, row j of a request as long as max(1, (step + j + 1) // 4)
  entries, all zeros (score_mode *_flat) or the top index_topk at the causal tail (*_top_last), as the reference
  collector makes them (deepseekv4_sparse_modules.py:1094-1118); the top-k of each row's visible entries
  (dsv4.select: torch.topk, -1 past the row's length; topk_transform_512's torch fallback, indexer.py:223-306, which
  maps them to pages besides). v1 and v2 are SGLang's prefill and decode kernels; torch has one top-k.
  A case whose longest row holds no more than index_topk entries selects every entry: the plan holds its latency
  as exactly 0 (plans/dsv4_kernels.py trivial_topk, the reference's rule, deepseekv4_sparse_modules.py:1202-1208),
  and the harness writes it without running it (Runner.untimed, runtime/timing.py measure_cases: timing "none").
"""

from __future__ import annotations

from opcollect.backends.torch import dsv4, reference
from opcollect.runtime.contract import Prepared
from opcollect.runtime.timing import random_tensor

INDEX_RATIO = dsv4.CSA


def _rotating(inputs: list, run) -> Prepared:
    import torch

    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % len(inputs)
        with torch.no_grad():
            run(*inputs[i])

    return Prepared(call, "")


def paged_footprint(case) -> int:
    d = dsv4.model_dims(case)
    rows = case.batch_size * case.isl
    keys = max(1, (case.step + case.isl) // INDEX_RATIO)
    q = rows * d.index_n_heads * (d.index_head_dim * reference.element_bytes(case.mla_dtype) + 4)
    cache = case.batch_size * keys * d.index_head_dim * reference.element_bytes(case.kv_cache_dtype)
    return q + cache + rows * keys * 4 + 3 * reference.CHUNK_ELEMENTS * 4


def prepare_paged(case, dispatch: str, device: str, copies: int) -> Prepared:
    import torch

    d = dsv4.model_dims(case)
    mla, kv = dsv4.dtype_of(case.mla_dtype), dsv4.dtype_of(case.kv_cache_dtype)
    b, queries, heads, dim = case.batch_size, case.isl, d.index_n_heads, d.index_head_dim
    keys = max(1, (case.step + queries) // INDEX_RATIO)
    inputs = [
        (
            random_tensor((b, queries, heads, dim), mla, device, 10 * i),
            random_tensor((b, queries, heads), torch.float32, device, 10 * i + 1),
            random_tensor((b, keys, dim), kv, device, 10 * i + 2),
        )
        for i in range(copies)
    ]
    prepared = _rotating(inputs, dsv4.indexer_logits)
    return Prepared(prepared.call, dispatch)


def hca_footprint(case) -> int:
    d = dsv4.model_dims(case)
    queries = case.batch_size * case.isl
    entries = (case.step + case.isl) // case.compress_ratio
    recent = dsv4.recent_length(case.step, case.isl, d.sliding_window)
    q = 2 * queries * case.local_num_heads * d.head_dim * reference.element_bytes(case.mla_dtype)
    cache = case.batch_size * (recent + entries) * d.head_dim * reference.element_bytes(case.kv_cache_dtype)
    return q + cache + queries * (d.sliding_window + entries) * 8 + 3 * reference.CHUNK_ELEMENTS * 4


def prepare_hca(case, dispatch: str, device: str, copies: int) -> Prepared:
    import torch

    d = dsv4.model_dims(case)
    mla, kv = dsv4.dtype_of(case.mla_dtype), dsv4.dtype_of(case.kv_cache_dtype)
    b, queries, heads, step, ratio = case.batch_size, case.isl, case.local_num_heads, case.step, case.compress_ratio
    entries = (step + queries) // ratio
    recent = dsv4.recent_length(step, queries, d.sliding_window)
    window = dsv4.window_indices(step, queries, d.sliding_window, device)
    every = dsv4.compressed_indices(step, queries, entries, ratio, recent, device)
    indices = torch.cat((window, every), dim=-1).expand(b, -1, -1)
    sink = random_tensor((heads,), torch.float32, device, 1)
    inputs = [
        (
            random_tensor((b, queries, heads, d.head_dim), mla, device, 10 * i),
            random_tensor((b, recent + entries, d.head_dim), kv, device, 10 * i + 1),
        )
        for i in range(copies)
    ]
    prepared = _rotating(inputs, lambda q, cache: dsv4.sparse_attention(q, cache, indices, sink, d.head_dim**-0.5))
    return Prepared(prepared.call, dispatch)


def row_lengths(case, device: str):
    """Each row's compressed length: max(1, (step + j + 1) // 4) for j < isl, repeated per request."""
    import torch

    causal = case.step + 1 + torch.arange(case.isl, device=device)
    return (causal // INDEX_RATIO).clamp(min=1).repeat(case.batch_size)


def trivial(case) -> bool:
    """The plan's zero-latency rule for the case (OpPlan.zero_latency: plans/dsv4_kernels.py trivial_topk)."""
    from opcollect.plans.dsv4_kernels import trivial_topk  # CPU-only planner code, no framework

    return trivial_topk(case)


def topk_scores(mode: str, lengths, width: int, topk: int, device: str):
    """[rows, width] fp32: zeros (flat), or -5 + noise with each row's last min(topk, length) entries at 5 + noise
    (top_last), as the reference's _make_topk_scores makes them."""
    import torch

    rows = lengths.numel()
    if mode.endswith("_flat"):
        return torch.zeros(rows, width, device=device)
    scores = -5.0 + 0.05 * random_tensor((rows, width), torch.float32, device, 1)
    offsets = torch.arange(width, device=device)
    lengths = lengths.to(torch.int64).unsqueeze(1)
    tail = (offsets < lengths) & (offsets >= lengths - min(topk, width))
    return torch.where(tail, 5.0 + random_tensor((rows, width), torch.float32, device, 2), scores)


def topk_footprint(case) -> int:
    if trivial(case):
        return 0  # not run
    d = dsv4.model_dims(case)
    rows = case.batch_size * case.isl
    width = max(1, (case.step + case.isl) // INDEX_RATIO)
    return rows * width * 4 * 3 + rows * d.index_topk * 8


def prepare_topk(case, dispatch: str, device: str, copies: int) -> Prepared:
    d = dsv4.model_dims(case)
    lengths = row_lengths(case, device)
    width = int(lengths.max())
    inputs = [(topk_scores(case.score_mode, lengths, width, d.index_topk, device),) for _ in range(copies)]
    prepared = _rotating(inputs, lambda scores: dsv4.select(scores, lengths, d.index_topk))
    return Prepared(prepared.call, dispatch)
