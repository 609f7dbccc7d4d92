"""DeepSeek-V4's attention module in plain PyTorch: dsv4_{csa,hca}_{context,generation}_module_perf.

What one forward of a layer computes at one rank, as vLLM 0.24.0 builds it (DeepseekV4Attention.forward,
models/deepseek_v4/attention.py:320-366; attention_impl :428-507) with the math of SGLang 0.5.14's torch fallbacks:
- fused_wqa_wkv [hidden -> q_lora + head_dim] (:199-206), RMSNorm of both parts (q_norm, kv_norm, :342-348); wq_b
  [q_lora -> heads x head_dim], a weightless RMSNorm per head and RoPE on the last qk_rope_head_dim dims of q and kv
  (_fused_qnorm_rope_kv_insert, :509-596: GPT-J interleaved pairs), kv written to the sliding-window cache;
- the compressor (compressor.py:177-399; save_partial_states and the compress kernel,
  common/ops/fused_compress_quant_cache.py:113-300): every compress_ratio tokens one entry, the softmax over the
  window's score + ape (per feature) weighing its kv, RMSNorm, RoPE at the block's first position; CSA (ratio 4)
  overlaps two blocks (coff 2: the older block's first head_dim features, the current block's second), HCA (128)
  does not;
- for CSA the indexer (attention.py:663-802): q = wq_b(qr) [index_n_heads x index_head_dim] with RoPE, head
  weights = weights_proj(x) x index_head_dim^-0.5 x index_n_heads^-0.5, its own ratio-4 compressor for the keys,
  logits = sum_h w_h relu(q_h . k) (SGLang's fp8_paged_mqa_logits_torch, srt/layers/attention/dsv4/indexer.py:49-112)
  and the top index_topk compressed entries a query may see (its (position + 1) // 4 first; topk_transform_512's
  torch fallback, indexer.py:223-306: every one when no more are visible);
- sparse attention over the window's last sliding_window tokens and the selected (CSA) or all visible (HCA)
  compressed entries, one latent KV head as key and value, scale head_dim^-0.5, the per-head attention sink in the
  softmax's denominator (flash_mla_sparse_fwd, nvidia/flashmla.py:237-350; SGLang's _sm120_sparse_decode_fwd,
  srt/layers/attention/flash_mla_sm120.py:125-193);
- the inverse RoPE, the grouped wo_a (o_groups / tp groups, einsum tgd,grd->tgr) and wo_b (SGLang's MQALayer.forward,
  srt/models/deepseek_v4.py:1051-1084).

Deliberate differences: one fp32, bf16 or fp16 dtype per part (no fp8 cache or FP8 GEMMs: plans/skips.py
torch-no-fp8-dsv4); the rank's heads are computed, not FlashMLA's padding to 64 or 128 (flashmla.py:59-66); RoPE
has plain frequencies (theta 10000, no YaRN); the partial states of blocks not yet complete are not saved; the
projections of the indexer's and compressor's inputs are plain GEMMs, sequential (serving overlaps them on streams).
The model's dimensions are plans/dsv4.py's DIMS, by the case's model; qk_rope_head_dim is 64 in every
DeepSeek-V4 config (cases/models/DeepseekV4ForCausalLM.yaml).
"""

from __future__ import annotations

from opcollect.backends.torch.reference import CHUNK_ELEMENTS, admitted_dtype, chunk, element_bytes, rms_norm
from opcollect.runtime.contract import KernelLimit, Prepared
from opcollect.runtime.timing import random_tensor

ROPE = 64  # qk_rope_head_dim of DeepSeek-V4-Flash and -Pro
THETA = 10000.0
CSA = 4  # the compress ratio with an indexer and overlapping blocks (compressor.py:216-217)
DTYPES = ("float32", "bfloat16", "float16")


def model_dims(case):
    """plans/dsv4.py's dimensions of the case's model; KernelLimit for a model they do not hold."""
    from opcollect.plans.dsv4 import DIMS  # the planner's table of the profiles: CPU-only, no framework

    found = DIMS.get(case.model)
    if found is None:
        raise KernelLimit(f"the torch DeepSeek-V4 reference knows no dimensions of {case.model} (plans/dsv4.py DIMS)")
    return found


def dtype_of(name: str):
    return admitted_dtype(name, DTYPES, "DeepSeek-V4")


def rope_tables(positions):
    """cos and sin [..., ROPE / 2] of positions (a tensor)."""
    import torch

    inv = THETA ** (-torch.arange(0, ROPE, 2, dtype=torch.float32, device=positions.device) / ROPE)
    angles = positions.float().unsqueeze(-1) * inv
    return angles.cos(), angles.sin()


def rotate(x, cos, sin, inverse: bool = False):
    """GPT-J RoPE (interleaved pairs) of x's last ROPE dims; cos and sin broadcast to [..., ROPE / 2]."""
    import torch

    tail = x[..., -ROPE:].float().unflatten(-1, (ROPE // 2, 2))
    even, odd = tail[..., 0], tail[..., 1]
    sin = -sin if inverse else sin
    turned = torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)
    return torch.cat((x[..., :-ROPE], turned.to(x.dtype)), dim=-1)


def compress(kv, score, ape, ratio: int, norm_weight, cos, sin):
    """The compressed entries [b, n, D] of n consecutive blocks of ``ratio`` tokens: kv and score [b, L, coff x D]
    fp32 hold positions first x ratio - (coff - 1) x ratio onwards, L = (n + coff - 1) x ratio, a position below 0
    as score -inf; ape [ratio, coff x D]; cos and sin [n, ROPE / 2] at each block's first position."""
    import torch

    b, length, width = kv.shape
    coff = 2 if ratio == CSA else 1
    dim = width // coff
    blocks = length // ratio
    kv = kv.view(b, blocks, ratio, width)
    score = score.view(b, blocks, ratio, width) + ape
    if coff == 2:  # entry c: block c - 1's first D features, block c's last D (the kernel's head_offset)
        kv = torch.cat((kv[:, :-1, :, :dim], kv[:, 1:, :, dim:]), dim=2)
        score = torch.cat((score[:, :-1, :, :dim], score[:, 1:, :, dim:]), dim=2)
    pooled = (kv * torch.softmax(score, dim=2)).sum(dim=2)
    return rotate(rms_norm(pooled, norm_weight), cos, sin)


def indexer_logits(q, weights, keys):
    """[b, S, C] fp32: sum over heads h of weights[b, s, h] x relu(q[b, s, h] . keys[b, c]), chunk by chunk."""
    import torch

    b, queries, heads, _ = q.shape
    keys = keys.float()
    out = torch.empty(b, queries, keys.shape[1], dtype=torch.float32, device=q.device)
    rows = chunk(queries, b * heads * keys.shape[1])
    for s in range(0, queries, rows):
        scores = torch.einsum("bshd,bcd->bshc", q[:, s : s + rows].float(), keys).relu_()
        out[:, s : s + rows] = torch.einsum("bshc,bsh->bsc", scores, weights[:, s : s + rows].float())
    return out


def select(logits, visible, k: int):
    """The indices [..., min(k, C)] of the k highest logits among each row's first ``visible`` entries, -1 where
    fewer are visible (then every visible one is selected)."""
    import torch

    columns = torch.arange(logits.shape[-1], device=logits.device)
    hidden = columns >= visible.unsqueeze(-1)
    top = logits.masked_fill(hidden, float("-inf")).topk(min(k, logits.shape[-1]), dim=-1, sorted=False).indices
    return top.masked_fill(top >= visible.unsqueeze(-1), -1)


def sparse_attention(q, kv, indices, sink, scale: float):
    """[b, S, H, D]: each query row attends to the rows of kv [b, M, D] its indices [b, S, K] name (-1: none), kv
    as key and value, the per-head sink [H] in the softmax's denominator."""
    import torch

    b, queries, heads, _ = q.shape
    width = indices.shape[-1]
    out = torch.empty_like(q)
    batch = torch.arange(b, device=q.device).view(b, 1, 1)
    rows = chunk(queries, b * width * (q.shape[-1] + heads))
    for s in range(0, queries, rows):
        idx = indices[:, s : s + rows]
        gathered = kv[batch, idx.clamp(min=0)].to(q.dtype)  # [b, s, K, D]
        scores = torch.einsum("bshd,bskd->bshk", q[:, s : s + rows], gathered).float() * scale
        scores.masked_fill_((idx < 0).unsqueeze(2), float("-inf"))
        sinks = sink.float().view(1, 1, heads, 1).expand(*scores.shape[:3], 1)
        probs = torch.softmax(torch.cat((scores, sinks), dim=-1), dim=-1)[..., :width]
        out[:, s : s + rows] = torch.einsum("bshk,bskd->bshd", probs.to(q.dtype), gathered)
    return out


def window_indices(step: int, queries: int, window: int, device):
    """[S, window]: query j (position step + j) sees positions step + j - window + 1 .. step + j, as indices into a
    buffer that starts at position max(0, step - window + 1); -1 below position 0."""
    import torch

    start = max(0, step - window + 1)
    positions = step + torch.arange(queries, device=device).unsqueeze(1) - torch.arange(window, device=device)
    return (positions - start).masked_fill(positions < 0, -1)


def compressed_indices(step: int, queries: int, entries: int, ratio: int, offset: int, device):
    """[S, entries]: every compressed entry c query j may see (c < (step + j + 1) // ratio) at offset + c, else -1."""
    import torch

    visible = (step + 1 + torch.arange(queries, device=device)) // ratio
    columns = torch.arange(entries, device=device)
    return (columns + offset).expand(queries, entries).masked_fill(columns >= visible.unsqueeze(1), -1)


def recent_length(step: int, queries: int, window: int) -> int:
    """Positions the sliding-window buffer holds: from max(0, step - window + 1) to step + queries - 1."""
    return step + queries - max(0, step - window + 1)


def footprint(case) -> int:
    d = model_dims(case)
    b, queries, heads = case.batch_size, case.isl, case.num_heads
    total = case.step + queries
    entries = total // case.compress_ratio
    gemm, kv, mla = (element_bytes(getattr(case, f)) for f in ("gemm_type", "kv_cache_dtype", "mla_dtype"))
    coff = 2 if case.compress_ratio == CSA else 1
    weights = d.hidden_size * (d.q_lora_rank + d.head_dim + 2 * coff * d.head_dim) + d.q_lora_rank * heads * d.head_dim
    weights += heads * d.head_dim * d.o_lora_rank + max(1, d.o_groups // case.tp_size) * d.o_lora_rank * d.hidden_size
    cache = b * (recent_length(case.step, queries, d.sliding_window) + entries) * d.head_dim * kv
    tokens = b * queries
    activations = tokens * (d.hidden_size * 2 * gemm + heads * d.head_dim * 3 * mla + 2 * coff * d.head_dim * 4)
    width = d.sliding_window + (min(d.index_topk, entries) if case.compress_ratio == CSA else entries)
    activations += tokens * width * 8
    if case.compress_ratio == CSA:
        index = d.index_n_heads * d.index_head_dim  # wq_b; then weights_proj and the compressor's [hidden, 4 x dim]
        weights += d.q_lora_rank * index + d.hidden_size * (d.index_n_heads + 4 * d.index_head_dim)
        cache += b * entries * d.index_head_dim * kv
        activations += tokens * (entries * 4 + d.index_n_heads * (d.index_head_dim + 1) * 4)
    return weights * gemm + cache + activations + 3 * CHUNK_ELEMENTS * 4


class Compressor:
    """One compressor (the attention's, head_dim 512, or the indexer's, 128): its GEMM, ape and norm weights,
    the fp32 (kv, score) of the cached tokens its next entries need, and the entries it completes per forward."""

    def __init__(self, hidden: int, dim: int, ratio: int, batch: int, step: int, queries: int, dtype, device, seed):
        import torch

        self.ratio, self.coff = ratio, 2 if ratio == CSA else 1
        width = self.coff * dim
        self.weight = random_tensor((hidden, 2 * width), dtype, device, seed).mul_(hidden**-0.5)
        self.ape = random_tensor((ratio, width), torch.float32, device, seed + 1)
        self.norm = 1 + random_tensor((dim,), torch.float32, device, seed + 2)
        total = step + queries
        self.first, self.last = step // ratio, total // ratio  # the entries this forward completes
        start = self.first * ratio - (self.coff - 1) * ratio
        self.cached = step - max(start, 0)  # tokens of the window already seen, from the state cache
        self.pad = max(0, -start)  # positions below 0
        self.used = self.last * ratio - step  # new tokens inside a completed block
        self.state = random_tensor((batch, self.cached, 2 * width), torch.float32, device, seed + 3)
        positions = torch.arange(self.first, self.last, device=device) * ratio
        self.cos, self.sin = rope_tables(positions)

    def __call__(self, x, batch: int):
        """The entries [b, last - first, dim] of x's tokens [b x S, hidden], or None when no block completes."""
        import torch
        import torch.nn.functional as F

        kv_score = (x @ self.weight).float().view(batch, -1, self.weight.shape[1])
        if self.last <= self.first:
            return None
        both = torch.cat((self.state, kv_score[:, : self.used]), dim=1)
        kv, score = both.chunk(2, dim=-1)
        if self.pad:
            kv = F.pad(kv, (0, 0, self.pad, 0))
            score = F.pad(score, (0, 0, self.pad, 0), value=float("-inf"))
        return compress(kv, score, self.ape, self.ratio, self.norm, self.cos, self.sin)


class Indexer:
    """The CSA indexer: its query projection, head weights and ratio-4 compressor, and the compressed keys of the
    cached tokens (attention.py:663-802)."""

    def __init__(self, d, batch: int, step: int, queries: int, gemm, kv_dtype, device):
        import torch

        self.heads, self.dim, self.shape = d.index_n_heads, d.index_head_dim, (batch, queries)
        self.w_qb = random_tensor((d.q_lora_rank, self.heads * self.dim), gemm, device, 30).mul_(d.q_lora_rank**-0.5)
        self.w_w = random_tensor((d.hidden_size, self.heads), gemm, device, 31).mul_(d.hidden_size**-0.5)
        self.scale = self.dim**-0.5 * self.heads**-0.5  # fused_indexer_q_rope_quant's two factors (:783-790)
        self.compressor = Compressor(d.hidden_size, self.dim, CSA, batch, step, queries, gemm, device, 32)
        self.keys = random_tensor((batch, (step + queries) // CSA, self.dim), kv_dtype, device, 33)
        self.visible = (step + 1 + torch.arange(queries, device=device)) // CSA  # entries each query may see

    def __call__(self, x, qr, cos, sin, topk: int):
        """The selected entries [b, S, min(topk, C)] of each query (-1: none)."""
        import torch

        q = (qr @ self.w_qb).view(*self.shape, self.heads, self.dim)
        q = rotate(q, cos.unsqueeze(1), sin.unsqueeze(1))
        weights = (x @ self.w_w).to(torch.float32).view(*self.shape, self.heads) * self.scale
        made = self.compressor(x, self.shape[0])
        if made is not None:
            self.keys[:, self.compressor.first : self.compressor.last] = made.to(self.keys.dtype)
        return select(indexer_logits(q, weights, self.keys), self.visible, topk)


def prepare(case, dispatch: str, device: str, copies: int) -> Prepared:
    """The module of the case's ratio with its caches filled for step cached tokens per request; each call runs
    one forward of batch_size x isl new tokens."""
    import torch

    d = model_dims(case)
    gemm, kv_dtype, mla = (dtype_of(getattr(case, f)) for f in ("gemm_type", "kv_cache_dtype", "mla_dtype"))
    b, queries, heads, step, ratio = case.batch_size, case.isl, case.num_heads, case.step, case.compress_ratio
    dim = d.head_dim
    groups = max(1, d.o_groups // case.tp_size)  # n_local_groups (attention.py:178)
    if heads * dim % groups:
        raise KernelLimit(f"{heads} heads do not split into {groups} output groups")

    def weight(shape, seed):
        return random_tensor(shape, gemm, device, seed).mul_(shape[-2] ** -0.5)

    w_a, w_qb = weight((d.hidden_size, d.q_lora_rank + dim), 1), weight((d.q_lora_rank, heads * dim), 2)
    wo_a = weight((groups, heads * dim // groups, d.o_lora_rank), 3).transpose(1, 2)  # [G, o_lora, H x D / G]
    wo_b = weight((groups * d.o_lora_rank, d.hidden_size), 4)
    q_norm, kv_norm = (1 + random_tensor((n,), torch.float32, device, s) for n, s in ((d.q_lora_rank, 5), (dim, 6)))
    sink = random_tensor((heads,), torch.float32, device, 7)
    entries = (step + queries) // ratio
    recent = recent_length(step, queries, d.sliding_window)
    # one buffer: the window's tokens, then the compressed entries, as FlashMLA's gathered workspace
    cache = random_tensor((b, recent + entries, dim), kv_dtype, device, 8)
    compressor = Compressor(d.hidden_size, dim, ratio, b, step, queries, gemm, device, 10)
    cos, sin = rope_tables(step + torch.arange(queries, device=device))  # [S, ROPE / 2]
    window = window_indices(step, queries, d.sliding_window, device).expand(b, queries, -1)
    indexer = Indexer(d, b, step, queries, gemm, kv_dtype, device) if ratio == CSA else None
    fixed = None  # HCA: every visible entry, fixed by the shapes (vLLM builds them with its metadata, c128a_*)
    if indexer is None:
        fixed = torch.cat(
            (window, compressed_indices(step, queries, entries, ratio, recent, device).expand(b, -1, -1)), -1
        )
    xs = [random_tensor((b * queries, d.hidden_size), gemm, device, 20 + i) for i in range(copies)]
    state = {"i": 0}

    def forward(x) -> None:
        qr_kv = x @ w_a
        qr, kv = rms_norm(qr_kv[:, : d.q_lora_rank], q_norm), rms_norm(qr_kv[:, d.q_lora_rank :], kv_norm)
        q = rms_norm((qr @ w_qb).view(b, queries, heads, dim))
        q = rotate(q, cos.unsqueeze(1), sin.unsqueeze(1)).to(mla)
        cache[:, recent - queries : recent] = rotate(kv.view(b, queries, dim), cos, sin).to(kv_dtype)
        made = compressor(x, b)
        if made is not None:
            cache[:, recent + compressor.first : recent + compressor.last] = made.to(kv_dtype)
        indices = fixed
        if indexer is not None:
            chosen = indexer(x, qr, cos, sin, d.index_topk)
            indices = torch.cat((window, (chosen + recent).masked_fill(chosen < 0, -1)), dim=-1)
        o = sparse_attention(q, cache, indices, sink, dim**-0.5)
        o = rotate(o, cos.unsqueeze(1), sin.unsqueeze(1), inverse=True).to(gemm).reshape(b * queries, groups, -1)
        torch.einsum("tgd,grd->tgr", o, wo_a).flatten(1) @ wo_b

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        with torch.no_grad():
            forward(xs[i])

    return Prepared(call, dispatch)
