"""GLM-5's DSA layer split into its sparse kernels at one rank, as SGLang 0.5.14 calls them (glm5_mqa_logits_module,
glm5_topk_module, glm5_dsa_attn_module): the kernel alone on the reference collector's inputs
(collector/sglang/glm5_dsa_sparse_modules.py at 095f58a5, "G:" below), called through what SGLang's DSA layer calls.

Paths are relative to the wheel's sglang/srt/. A case is `batch_size` requests of `isl` new tokens after `step` cached
ones; the kernels see them as one ragged batch of M = batch x isl query rows over the concatenated keys of every
request (batch segments of step + isl keys), as SGLang's indexer lays out an extend batch (Indexer._get_topk_ragged,
layers/attention/dsa/dsa_indexer.py:794-977).
- mqa (G:211-263): deep_gemm.fp8_mqa_logits, the module object SGLang's indexer calls (dsa_indexer.py:62-66, :892),
  with fp8 queries [M, index_n_heads, index_head_dim], fp8 keys with fp32 scales (ones), fp32 head weights and each
  row's [ks, ke) in the concatenated keys, clean_logits=False. Split along the rows when the fp32 logits would not
  fit a budget (below).
- topk (G:305-469): SGLang's DSATopKBackend("sgl-kernel", the server's default dsa_topk_backend, server_args.py:
  1427-1433).topk_transform with the PAGED method (dsa_topk_backend.py:74-113): sgl_kernel's
  fast_topk_transform_fused when SGLANG_DSA_FUSE_TOPK (default True, environ.py:582), else fast_topk_v2; the
  reference's two score anchors, flat (all zeros) and top_last (-5 + noise, each row's last index_topk visible
  keys at 5 + noise). A prefill row (isl > 1) scores the concatenated keys, each row its own request's window from
  row_starts (the kernel reads [row_starts, row_starts + lengths), sgl_kernel/top_k.py:64-66), the page table one
  row per request (one per query row when split, as _get_topk_ragged's PAGED chunks, dsa_indexer.py:952-975); a
  decode row (isl 1) one compact 64-padded score row per request, no row_starts (the decode transform,
  G:444-469). A request of at most index_topk tokens selects every token: the plan holds it at latency 0
  (plans/dsa_kernels.py TOPK.zero_latency, G:349-351) and the harness does not run it (untimed).
- dsa_attn (G:472-502): sgl_kernel.flash_mla.flash_mla_sparse_fwd as DeepseekSparseAttnBackend.
  _forward_flashmla_sparse calls it (layers/attention/dsa_backend.py:1921-1968): bf16 queries of 576, a bf16 latent
  cache [keys, 1, 576], indices [M, 1, index_topk] naming the first min(index_topk, step + isl) keys of each row's
  request, -1 past them, scale 576^-0.5, d_v 512; the heads padded to a multiple of 64 (Hopper) or 128 (SM100 and
  later) as that method pads them (the reference's 64 heads on SM90, 128 on SM100, G:485).

Rows split (mqa and a prefill top-k): when M x keys reaches the indexer's static threshold
(Indexer._MQA_LOGITS_STATIC_SKIP_ELEMS, 8e6), at most budget // (keys x 4) rows a part, the budget
min(free x SGLANG_DSA_MQA_LOGITS_FREE_MEM_FRACTION (0.2, environ.py:594), total x
Indexer._MQA_LOGITS_TOTAL_MEM_FRACTION (0.3)) of the device's memory when the case is prepared: the reference's
standalone bound (G:182-208), serving's without the cap its mem_fraction_static adds (dsa_indexer.py:741-775).

Deliberate differences from the reference collector:
- One timed call runs every part of a split row, replayed from one CUDA graph (runtime/timing.py); the reference
  sums the parts' separately graphed timings (G:396-441).
- A split top_last top-k keeps one score buffer for all its parts, every part's winners written in its own rows'
  windows: where one request spans several parts at the same buffer row, a later part's window also holds the
  earlier part's winners (the reference refills the buffer per part, G:403-423). flat scores are equal everywhere.
- The free memory the split reads is the worker's after this case's inputs are allocated.
- version is the framework's (plans/dsa_kernels.py); the key columns are the reference's labels, checked here.
"""

from __future__ import annotations

from typing import NamedTuple

from opcollect.runtime.contract import KernelLimit, Prepared
from opcollect.runtime.timing import random_tensor

LATENT, KV_LORA = 576, 512  # the sparse MLA's query/key width (kv_lora_rank + qk_rope_head_dim) and value width
SCORE_PAGE = 64  # a decode score row is padded to whole 64-token pages (the page size and DeepGEMM block, G:282-283)
MODES = ("flat", "top_last")
# what the reference writes in the key columns (G:150-156); the kernels run fp8 logits inputs and a bf16 sparse MLA
LABELS = {
    "glm5_mqa_logits_module": ("fp8_e4m3", "fp8_e4m3", "fp8_block"),
    "glm5_topk_module": ("fp8_e4m3", "fp8_e4m3", "fp8_block"),
    "glm5_dsa_attn_module": ("bfloat16", "fp8_e4m3", "fp8_block"),
}
SPLIT_THRESHOLD = 8_000_000  # Indexer._MQA_LOGITS_STATIC_SKIP_ELEMS (dsa_indexer.py:326), for footprints only
SOURCES = {
    "mqa": "deep_gemm.fp8_mqa_logits",
    "dsa_attn": "flash_mla_sparse_fwd",
    "fused": "fast_topk_transform_fused",
    "unfused": "fast_topk_v2",
}


class Ragged(NamedTuple):
    """The batch as the kernels see it."""

    rows: int  # M = batch x isl query rows
    segment: int  # keys of one request: step + isl
    keys: int  # the concatenated keys of every request


def dims(case):
    """plans/dsa.py's dimensions of the case's architecture (the planner's table: CPU-only, no framework)."""
    from opcollect.plans.dsa import DIMS

    found = DIMS.get(case.architecture)
    if found is None:
        raise KernelLimit(f"the SGLang GLM-5 kernel runner knows no dimensions of {case.architecture} (plans/dsa.py)")
    return found


def check(case, op: str):
    """The case's dimensions, refusing before any framework import what the kernels do not run."""
    labels = (case.mla_dtype, case.kv_cache_dtype, case.gemm_type)
    if labels != LABELS[op]:
        raise KernelLimit(f"{op} runs fixed dtypes under the reference's labels {LABELS[op]}, not {labels}")
    if case.compress_ratio != 1:
        raise KernelLimit(f"GLM-5's DSA compresses nothing: compress_ratio 1, not {case.compress_ratio}")
    if case.batch_size < 1 or case.isl < 1 or case.step < 0:
        raise KernelLimit(f"{op} needs requests with new tokens: {case}")
    return dims(case)


def ragged(case) -> Ragged:
    segment = case.step + case.isl
    return Ragged(case.batch_size * case.isl, segment, case.batch_size * segment)


def trivial_topk(case) -> bool:
    """The plan's zero-latency rule: every token of a request fits in index_topk (nothing to select)."""
    from opcollect.plans.dsa_kernels import TOPK

    return bool(TOPK.zero_latency(case))


def split_rows(rows: int, keys: int, free: int, total: int, limits) -> int:
    """Rows a part of a split score holds; ``limits``: (static threshold, bytes per logit, total fraction, free
    fraction), SGLang's (see the module docstring)."""
    static, per_logit, total_fraction, free_fraction = limits
    if rows * keys < static:
        return rows
    budget = min(int(free * free_fraction), int(total * total_fraction))
    return min(rows, max(1, budget // (keys * per_logit)))


def sm_major(device: str) -> int:
    import torch

    return torch.cuda.get_device_capability(torch.device(device))[0]


def device_memory(device: str) -> tuple[int, int]:
    """(free, total) bytes of the device."""
    import torch

    return torch.cuda.mem_get_info(torch.device(device))


def part_rows(rows: int, keys: int, device: str) -> int:
    """split_rows with SGLang's indexer limits and the device's memory now."""
    from sglang.srt.environ import envs
    from sglang.srt.layers.attention.dsa.dsa_indexer import Indexer

    limits = (
        Indexer._MQA_LOGITS_STATIC_SKIP_ELEMS,
        Indexer._MQA_LOGITS_BYTES_PER_ELEM,
        Indexer._MQA_LOGITS_TOTAL_MEM_FRACTION,
        envs.SGLANG_DSA_MQA_LOGITS_FREE_MEM_FRACTION.get(),
    )
    return split_rows(rows, keys, *device_memory(device), limits)


def row_ranges(case, device: str):
    """(ks, ke) int32 [M]: each query row's [start, end) in the concatenated keys, its request's segment up to and
    including itself (G:228-234)."""
    import torch

    r = ragged(case)
    starts = torch.arange(case.batch_size, dtype=torch.int32, device=device) * r.segment
    ks = torch.repeat_interleave(starts, case.isl)
    causal = torch.arange(1, case.isl + 1, dtype=torch.int32, device=device).repeat(case.batch_size)
    return ks, (ks + case.step + causal).clamp(max=r.keys)


def parts(rows: int, step: int):
    return [(s, min(s + step, rows)) for s in range(0, rows, step)]


def rotating(sets: list, run, label: str) -> Prepared:
    """A call running ``run(*set)`` on the next of the input sets without autograd (the DSA and DeepSeek-V4 kernel
    rows' rotation of copies), labelled ``label``."""
    import torch

    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % len(sets)
        with torch.no_grad():
            run(*sets[i])

    return Prepared(call, label)


# --- the indexer's fp8 MQA logits ---


def score_bytes(rows: int, keys: int) -> int:
    """fp32 scores of one part: whole below the split threshold; above it the split keeps a part within its
    free-memory budget when the case is prepared, which the capacity check need not hold back for."""
    return 4 * min(rows * keys, SPLIT_THRESHOLD)


def mqa_footprint(case) -> int:
    d, r = dims(case), ragged(case)
    inputs = r.rows * d.index_heads * (d.index_dim + 4) + r.keys * (d.index_dim + 4) + r.rows * 8
    return inputs + score_bytes(r.rows, r.keys)


def prepare_mqa(case, dispatch: str, device: str, copies: int) -> Prepared:
    d = check(case, "glm5_mqa_logits_module")
    import sglang.srt.layers.attention.dsa.dsa_indexer as dsa_indexer  # a namespace package: no `from dsa import`
    import torch

    deep_gemm = dsa_indexer.deep_gemm  # the module the indexer calls; an ImportError where DeepGEMM is missing
    if isinstance(deep_gemm, Exception):
        raise KernelLimit(f"SGLang's indexer has no DeepGEMM here: {deep_gemm}")
    r = ragged(case)
    fp8 = torch.float8_e4m3fn
    ks, ke = row_ranges(case, device)
    sets = [
        (
            random_tensor((r.rows, d.index_heads, d.index_dim), fp8, device, 10 * i),
            random_tensor((r.keys, d.index_dim), fp8, device, 10 * i + 1),
            torch.ones(r.keys, dtype=torch.float32, device=device),
            random_tensor((r.rows, d.index_heads), torch.float32, device, 10 * i + 2),
        )
        for i in range(copies)
    ]
    spans = parts(r.rows, part_rows(r.rows, r.keys, device))

    def run(q, k, k_scale, weights) -> None:
        for s, e in spans:
            deep_gemm.fp8_mqa_logits(q[s:e], (k, k_scale), weights[s:e], ks[s:e], ke[s:e], clean_logits=False)

    return rotating(sets, run, SOURCES["mqa"])


# --- the indexer's top-k ---


def topk_footprint(case) -> int:
    if trivial_topk(case):
        return 0  # not run
    d, r = dims(case), ragged(case)
    width = r.keys if case.isl > 1 else -(-r.segment // SCORE_PAGE) * SCORE_PAGE
    table = r.keys if case.isl > 1 else r.rows * r.segment
    return score_bytes(r.rows, width) + table * 4 + r.rows * (d.index_topk * 4 + 16)


def write_winners(score, rows, lengths, starts, topk: int, generator) -> None:
    """top_last: in each of ``rows`` (buffer rows) the last min(lengths, topk) keys of its window from ``starts`` at
    5 + noise (G:291-302, :407-423)."""
    import torch

    counts = lengths.to(torch.int64).clamp(min=0, max=topk)
    offsets = torch.arange(topk, dtype=torch.int64, device=score.device)
    columns = (starts.to(torch.int64) + lengths.to(torch.int64) - counts).unsqueeze(1) + offsets.unsqueeze(0)
    valid = offsets.unsqueeze(0) < counts.unsqueeze(1)
    row_ids = rows.unsqueeze(1).expand_as(columns)
    winners = torch.empty(int(valid.sum().item()), dtype=torch.float32, device=score.device)
    winners.normal_(mean=5.0, std=1.0, generator=generator)
    score[row_ids[valid], columns[valid]] = winners


def topk_scores(mode: str, shape, device: str, seed: int):
    import torch

    if mode == "flat":
        return torch.zeros(shape, dtype=torch.float32, device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    return torch.empty(shape, dtype=torch.float32, device=device).normal_(-5.0, 0.05, generator=generator)


class TopkCall(NamedTuple):
    """One part's arguments of DSATopKBackend.topk_transform."""

    lengths: object
    page_table: object
    cu_seqlens_q: object
    row_starts: object | None


def topk_parts(case, device: str, rows_per_part: int) -> list[tuple[int, int, TopkCall]]:
    """Each part's (first row, end row, arguments): a prefill's ragged windows, or a decode's compact rows."""
    import torch

    r = ragged(case)

    def arange(n, **kw):
        return torch.arange(n, dtype=torch.int32, device=device, **kw)

    if case.isl == 1:  # one compact row per request over its own step + 1 keys (G:444-469)
        lengths = torch.full((r.rows,), r.segment, dtype=torch.int32, device=device)
        table = arange(r.segment).view(1, r.segment).repeat(r.rows, 1).contiguous()
        return [(0, r.rows, TopkCall(lengths, table, arange(r.rows + 1), None))]
    lengths = (case.step + 1 + arange(case.isl)).repeat(case.batch_size)
    starts, _ = row_ranges(case, device)
    table = arange(r.keys).view(case.batch_size, r.segment)
    if rows_per_part >= r.rows:  # the request's own metadata (G:372-376)
        cu = arange(case.batch_size + 1) * case.isl
        return [(0, r.rows, TopkCall(lengths, table, cu, starts))]
    request = torch.repeat_interleave(torch.arange(case.batch_size, device=device), case.isl)
    return [
        (s, e, TopkCall(lengths[s:e], table[request[s:e]], arange(e - s + 1), starts[s:e]))
        for s, e in parts(r.rows, rows_per_part)
    ]


def prepare_topk(case, dispatch: str, device: str, copies: int) -> Prepared:
    d = check(case, "glm5_topk_module")
    if case.score_mode not in MODES:
        raise KernelLimit(f"SGLang's top-k is timed on score modes {MODES}, not {case.score_mode!r}")
    if trivial_topk(case):
        raise KernelLimit("a request within index_topk selects every token: the plan holds it at 0, untimed")
    import torch
    from sglang.srt.environ import envs
    from sglang.srt.layers.attention.dsa.dsa_topk_backend import DSATopKBackend, TopkTransformMethod

    backend = DSATopKBackend("sgl-kernel")
    label = SOURCES["fused" if envs.SGLANG_DSA_FUSE_TOPK.get() else "unfused"]
    r = ragged(case)
    if case.isl == 1:
        rows_per_part, width = r.rows, -(-r.segment // SCORE_PAGE) * SCORE_PAGE
    else:
        rows_per_part, width = part_rows(r.rows, r.keys, device), r.keys
    calls = topk_parts(case, device, rows_per_part)
    buffer_rows = max(e - s for s, e, _ in calls)
    sets = []
    for i in range(copies if buffer_rows == r.rows else 1):  # a split score is one buffer within the budget
        score = topk_scores(case.score_mode, (buffer_rows, width), device, 1234 + i)
        if case.score_mode == "top_last":
            generator = torch.Generator(device=device).manual_seed(4321 + i)
            for s, e, part in calls:
                starts = part.row_starts if part.row_starts is not None else torch.zeros_like(part.lengths)
                rows = torch.arange(e - s, device=device)
                write_winners(score, rows, part.lengths, starts, d.index_topk, generator)
        sets.append((score,))

    def run(score) -> None:
        for s, e, part in calls:
            backend.topk_transform(
                logits=score[: e - s],
                lengths=part.lengths,
                topk=d.index_topk,
                topk_transform_method=TopkTransformMethod.PAGED,
                attn_metadata=PageTable(part.page_table),
                cu_seqlens_q_topk=part.cu_seqlens_q,
                row_starts=part.row_starts,
            )

    return rotating(sets, run, label)


class PageTable(NamedTuple):
    """What the PAGED transform reads of the DSA metadata: its page table of page size 1 (dsa_topk_backend.py:
    96-100)."""

    page_table_1: object


# --- the sparse MLA ---


def padded_heads(heads: int, sm_major: int) -> int:
    """The heads flash_mla_sparse_fwd runs: a multiple of 64 on Hopper, of 128 from SM100 (dsa_backend.py:1932-1950)."""
    required = 128 if sm_major >= 10 else 64
    if heads % required == 0:
        return heads
    if required % heads:
        raise KernelLimit(f"{heads} heads cannot be padded to {required} (dsa_backend.py:1943-1946)")
    return required


def attn_footprint(case) -> int:
    d, r = dims(case), ragged(case)
    heads = max(case.num_heads, 128)
    return r.rows * heads * (LATENT + KV_LORA) * 2 + r.keys * LATENT * 2 + r.rows * (d.index_topk * 4 + heads * 8)


def prepare_attn(case, dispatch: str, device: str, copies: int) -> Prepared:
    d = check(case, "glm5_dsa_attn_module")
    import torch
    from sgl_kernel.flash_mla import flash_mla_sparse_fwd

    heads, r = padded_heads(case.num_heads, sm_major(device)), ragged(case)
    valid = min(d.index_topk, r.segment)
    starts, _ = row_ranges(case, device)
    indices = torch.full((r.rows, 1, d.index_topk), -1, dtype=torch.int32, device=device)
    indices[:, :, :valid] = starts.view(-1, 1, 1) + torch.arange(valid, dtype=torch.int32, device=device)
    sets = [
        (
            random_tensor((r.rows, heads, LATENT), torch.bfloat16, device, 10 * i),
            random_tensor((r.keys, 1, LATENT), torch.bfloat16, device, 10 * i + 1),
        )
        for i in range(copies)
    ]

    def run(q, kv) -> None:
        flash_mla_sparse_fwd(q=q, kv=kv, indices=indices, sm_scale=LATENT**-0.5, d_v=KV_LORA)

    return rotating(sets, run, SOURCES["dsa_attn"])
