"""MiniMax-M3's block-sparse attention (MSA) module in plain PyTorch: msa_{context,generation}_module_perf.

One forward of a sparse layer at one rank, isl new tokens per request after `step` cached ones (a decode row: 1
after `step`), as vLLM 0.24.0 computes it (MiniMaxM3SparseAttention.forward, models/minimax_m3/nvidia/model.py:
551-632, with the Triton impls, the ones SM90 runs):
- one fused GEMM [hidden -> q | k | v | index_q | index_k] (MinimaxM3QKVParallelLinearWithIndexer,
  model_executor/layers/linear.py:1306-1383): heads, kv_heads = max(1, heads / 16), as many index heads as KV heads
  (nvidia/model.py:424-431), one shared index-key head, every head 128 wide;
- Gemma RMSNorm per head (x * rsqrt(mean x^2 + eps) * (1 + w), MiniMAXGemmaRMSNorm, nvidia/model.py:109-137) and
  partial NeoX RoPE on the first 64 dims of q, k, index_q and index_k (fused_minimax_m3_qknorm_rope_kv_insert,
  _custom_ops.py:2553-2596; rotary_emb and index_rotary_emb are one, nvidia/model.py:466-490); k, v and index_k
  written to the caches;
- the indexer (MiniMaxM3IndexerTritonImpl.forward, common/indexer.py:391-453): per index head, each 128-token
  block's score is the max over its tokens the query may see of index_q . index_k (_index_block_score_kernel,
  common/ops/index_topk.py:82-172, no scale); the top 16 blocks among the (position + 128) // 128 a query sees, the
  last one (sparse_local_block 1) always among them and none forced at the start (sparse_init_block 0;
  _topk_index_kernel, :186-292, MASK_INIT and MASK_LOCAL False, :746-747), -1 past the blocks it sees;
- each KV head's 16 query heads attend to the causal tokens of their index head's blocks, scale head_dim^-0.5, no
  sink (_gqa_sparse_fwd_kernel, common/ops/sparse_attn.py:76-230), then o_proj.

Deliberate differences: one bf16 or fp32 dtype per part (no fp8 cache or FP8 GEMMs: KernelLimit); the index cache
is bf16 as vLLM's default indexer_kv_dtype; RoPE has plain frequencies at rope_theta 5e6 (transformers_utils/configs/
minimax_m3.py:32) without the model's rope scaling; the rank's heads are computed (plans/msa.py's geometry: GROUP
query heads per KV head).
"""

from __future__ import annotations

from typing import NamedTuple

from opcollect.backends.torch.reference import CHUNK_ELEMENTS, admitted_dtype, chunk
from opcollect.runtime.contract import KernelLimit, Prepared
from opcollect.runtime.timing import random_tensor

EPS = 1e-6  # rms_norm_eps
THETA = 5_000_000.0  # rope_theta
DTYPES = ("float32", "bfloat16")


class Geometry(NamedTuple):
    hidden: int
    head_dim: int
    group: int  # query heads per KV head
    index_dim: int
    block: int  # sparse_block_size: tokens per block, one KV page
    topk_blocks: int
    rotary: int  # head_dim x partial_rotary_factor
    local_blocks: int = 1  # sparse_local_block: the latest blocks always kept
    init_blocks: int = 0  # sparse_init_block: the first blocks always kept


def model_geometry(case) -> Geometry:
    """MiniMax-M3's geometry (plans/msa.py's constants: cases/models/MiniMaxM3ForCausalLM.yaml); KernelLimit for
    another architecture."""
    from opcollect.plans import msa  # the planner's constants: CPU-only, no framework

    if case.architecture not in msa.ARCHITECTURES:
        raise KernelLimit(f"the torch MSA reference knows no geometry of {case.architecture} (plans/msa.py)")
    block = 128  # sparse_block_size
    return Geometry(msa.HIDDEN, msa.HEAD_DIM, msa.GROUP, msa.INDEX_DIM, block, msa.TOPK_TOKENS // block, 64)


def dtype_of(name: str):
    return admitted_dtype(name, DTYPES, "MSA")


def gemma_norm(x, weight, eps: float = EPS):
    import torch

    xf = x.float()
    return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * (1 + weight.float())).to(x.dtype)


def partial_rope(x, cos, sin):
    """NeoX RoPE of x's first 2 x cos.shape[-1] dims (halves), the rest unchanged; cos and sin broadcast."""
    import torch

    rotary = 2 * cos.shape[-1]
    first, second = x[..., : rotary // 2].float(), x[..., rotary // 2 : rotary].float()
    turned = torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)
    return torch.cat((turned.to(x.dtype), x[..., rotary:]), dim=-1)


def block_scores(index_q, index_keys, step: int, block: int):
    """[b, S, G, blocks] fp32: per index head, the max over each block's tokens query j (position step + j) may see
    of index_q . index_key; -inf for a block it sees none of."""
    import torch
    import torch.nn.functional as F

    b, queries, heads, _ = index_q.shape
    keys = index_keys.shape[1]
    blocks = -(-keys // block)
    out = torch.empty(b, queries, heads, blocks, dtype=torch.float32, device=index_q.device)
    positions = torch.arange(keys, device=index_q.device)
    rows = chunk(queries, b * heads * blocks * block)
    for s in range(0, queries, rows):
        scores = torch.einsum("bsgd,bnd->bsgn", index_q[:, s : s + rows].float(), index_keys.float())
        seen = step + s + torch.arange(scores.shape[1], device=index_q.device)
        scores.masked_fill_((positions > seen.unsqueeze(1)).view(1, -1, 1, keys), float("-inf"))
        scores = F.pad(scores, (0, blocks * block - keys), value=float("-inf"))
        out[:, s : s + rows] = scores.view(b, -1, heads, blocks, block).amax(dim=-1)
    return out


def block_topk(scores, step: int, g: Geometry):
    """[b, S, G, min(topk_blocks, blocks)]: the blocks each query keeps per index head, its latest local_blocks and
    first init_blocks forced in, -1 past the (step + j + block) // block blocks query j sees."""
    import torch

    queries, blocks = scores.shape[1], scores.shape[3]
    valid = ((step + torch.arange(queries, device=scores.device) + g.block) // g.block).view(1, -1, 1, 1)
    columns = torch.arange(blocks, device=scores.device)
    seen = columns < valid
    ranked = scores.nan_to_num(nan=-1e30).masked_fill(~seen, float("-inf"))
    ranked = ranked.masked_fill(seen & (columns >= valid - g.local_blocks), 1e29)
    ranked = ranked.masked_fill(seen & (columns < g.init_blocks), 1e30)
    top = ranked.topk(min(g.topk_blocks, blocks), dim=-1, sorted=False).indices
    return top.masked_fill(top >= valid, -1)


def block_sparse_attention(q, k_cache, v_cache, chosen, step: int, block: int, scale: float):
    """[b, S, H, D]: query heads q [b, S, H, D], KV head g's H / G of them, over the tokens of the blocks chosen
    [b, S, G, K] for g (-1: none) that query j (position step + j) may see, in the caches [b, N, G, D]."""
    import torch

    b, queries, heads, dim = q.shape
    keys, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group, width = heads // kv_heads, chosen.shape[-1] * block
    out = torch.empty_like(q)
    batch = torch.arange(b, device=q.device).view(b, 1, 1, 1)
    head = torch.arange(kv_heads, device=q.device).view(1, 1, kv_heads, 1)
    offsets = torch.arange(block, device=q.device)
    rows = chunk(queries, b * kv_heads * width * (2 * dim + group))
    for s in range(0, queries, rows):
        picked = chosen[:, s : s + rows]
        tokens = (picked.unsqueeze(-1) * block + offsets).flatten(-2)  # [b, s, G, K x block]
        seen = step + s + torch.arange(picked.shape[1], device=q.device)
        hidden = (picked < 0).repeat_interleave(block, dim=-1) | (tokens > seen.view(1, -1, 1, 1))
        where = tokens.clamp(0, keys - 1)
        k, v = k_cache[batch, where, head].to(q.dtype), v_cache[batch, where, head].to(q.dtype)  # [b, s, G, T, D]
        qg = q[:, s : s + rows].view(b, -1, kv_heads, group, dim)
        scores = torch.einsum("bsgqd,bsgtd->bsgqt", qg, k).float() * scale
        scores.masked_fill_(hidden.unsqueeze(3), float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(q.dtype)
        out[:, s : s + rows] = torch.einsum("bsgqt,bsgtd->bsgqd", probs, v).reshape(b, -1, heads, dim)
    return out


class MsaModule:
    """One sparse layer at one rank: its weights, K/V and index-key caches holding `step` cached tokens per request,
    and the forward of `queries` new tokens per request."""

    def __init__(self, g: Geometry, heads: int, batch: int, step: int, queries: int, gemm, kv, mla, device):
        import torch

        self.g, self.heads, self.kv_heads = g, heads, max(1, heads // g.group)
        self.batch, self.step, self.queries, self.mla = batch, step, queries, mla
        d, kvh = g.head_dim, self.kv_heads
        self.split = (heads * d, kvh * d, kvh * d, kvh * g.index_dim, g.index_dim)
        self.w_qkv = random_tensor((g.hidden, sum(self.split)), gemm, device, 1).mul_(g.hidden**-0.5)
        self.w_o = random_tensor((heads * d, g.hidden), gemm, device, 2).mul_((heads * d) ** -0.5)
        self.norms = [
            0.1 * random_tensor((n,), torch.float32, device, 3 + i)
            for i, n in enumerate((d, d, g.index_dim, g.index_dim))
        ]
        total = step + queries
        self.k_cache = random_tensor((batch, total, kvh, d), kv, device, 8)
        self.v_cache = random_tensor((batch, total, kvh, d), kv, device, 9)
        self.index_cache = random_tensor((batch, total, g.index_dim), kv, device, 10)
        positions = step + torch.arange(queries, device=device)
        inv = THETA ** (-torch.arange(0, g.rotary, 2, dtype=torch.float32, device=device) / g.rotary)
        angles = positions.float().unsqueeze(-1) * inv  # [S, rotary / 2]
        self.cos, self.sin = angles.cos(), angles.sin()

    def forward(self, x):
        """The layer's output [batch x queries, hidden] for the new tokens' hidden states x."""
        g, b, s, kvh = self.g, self.batch, self.queries, self.kv_heads
        q, k, v, iq, ik = (x @ self.w_qkv).split(self.split, dim=-1)
        cos, sin = self.cos.unsqueeze(1), self.sin.unsqueeze(1)  # over the heads
        q_w, k_w, iq_w, ik_w = self.norms
        q = partial_rope(gemma_norm(q.view(b, s, self.heads, g.head_dim), q_w), cos, sin)
        k = partial_rope(gemma_norm(k.view(b, s, kvh, g.head_dim), k_w), cos, sin)
        iq = partial_rope(gemma_norm(iq.view(b, s, kvh, g.index_dim), iq_w), cos, sin)
        ik = partial_rope(gemma_norm(ik.view(b, s, g.index_dim), ik_w), self.cos, self.sin)
        self.k_cache[:, self.step :] = k.to(self.k_cache.dtype)
        self.v_cache[:, self.step :] = v.reshape(b, s, kvh, g.head_dim).to(self.v_cache.dtype)
        self.index_cache[:, self.step :] = ik.to(self.index_cache.dtype)
        chosen = block_topk(block_scores(iq, self.index_cache, self.step, g.block), self.step, g)
        o = block_sparse_attention(
            q.to(self.mla), self.k_cache, self.v_cache, chosen, self.step, g.block, g.head_dim**-0.5
        )
        return o.reshape(b * s, self.heads * g.head_dim).to(self.w_o.dtype) @ self.w_o


def footprint(case) -> int:
    g = model_geometry(case)
    b, heads, tokens, total = case.batch_size, case.num_heads, case.batch_size * case.isl, case.step + case.isl
    kvh = max(1, heads // g.group)
    gemm = 4 if case.gemm_type == "float32" else 2
    kv = 4 if case.kv_cache_dtype == "float32" else 2
    width = (heads + 3 * kvh) * g.head_dim + g.index_dim
    weights = g.hidden * width + heads * g.head_dim * g.hidden
    cache = b * total * (2 * kvh * g.head_dim + g.index_dim) * kv
    blocks = -(-total // g.block)
    activations = tokens * (2 * g.hidden + 2 * width + heads * g.head_dim * 2) * 4 + tokens * kvh * blocks * 12
    return weights * gemm + cache + activations + 4 * CHUNK_ELEMENTS * 4


def prepare(case, dispatch: str, device: str, copies: int) -> Prepared:
    """The layer with its caches filled for step cached tokens per request; each call runs one forward of
    batch_size x isl new tokens (isl 1: a decode step)."""
    import torch

    g = model_geometry(case)
    gemm, kv, mla = (dtype_of(getattr(case, f)) for f in ("gemm_type", "kv_cache_dtype", "mla_dtype"))
    b, queries = case.batch_size, case.isl
    module = MsaModule(g, case.num_heads, b, case.step, queries, gemm, kv, mla, device)
    xs = [random_tensor((b * queries, g.hidden), gemm, device, 20 + i) for i in range(copies)]
    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        with torch.no_grad():
            module.forward(xs[i])

    return Prepared(call, dispatch)
