"""DeepSeek's sparse attention (DSA: DeepSeek-V3.2, GLM-5.x) in plain PyTorch: the module at one rank
(dsa_{context,generation}_module_perf) and GLM-5's three kernels alone (glm5_{mqa_logits,topk,dsa_attn}_module_perf).

The module, one forward of isl new tokens per request after `step` cached ones (a decode row: 1 after `step`), as
vLLM 0.24.0 builds it (MultiHeadLatentAttentionWrapper.forward, model_executor/layers/mla.py:120-182):
- fused_qkv_a_proj [hidden -> q_lora + kv_lora + qk_rope], RMSNorm of q_c and kv_c, q_b_proj [q_lora -> heads x
  (qk_nope + qk_rope)], RoPE (interleaved, models/deepseek_v2.py:983-988) on q_pe and k_pe; the latent (kv_c, k_pe),
  576 wide, written to the cache;
- the lightning indexer (Indexer.forward, deepseek_v2.py:678-743): q = wq_b(q_c) [index_heads x index_head_dim],
  k = LayerNorm(wk(x)), RoPE (NeoX, :1030-1035) on their first qk_rope dims, head weights = weights_proj(x) x
  index_heads^-0.5 x index_head_dim^-0.5 (:738-741), k written to the index cache; logits = sum_h w_h relu(q_h . k)
  in fp32 (fp8_mqa_logits_torch, v1/attention/ops/rocm_aiter_mla_sparse.py:473-521, the DeepGEMM reference) over
  every token a query may see, and the top index_topk of them (top_k_per_row_prefill,
  model_executor/layers/sparse_attn_indexer.py:243-256);
- absorbed MLA over only the selected tokens (FlashMLA sparse, forward_mqa, v1/attention/backends/mla/
  flashmla_sparse.py:857-894: one 576-wide latent head as key, its first 512 as value; scale (qk_nope +
  qk_rope)^-0.5, deepseek_v2.py:920), then W_UV per head and o_proj.
A prefill whose requests' tokens all fit in index_topk keeps every token: its indexer only computes and stores the
keys, as SGLang 0.5.14 does for an extend batch (srt/layers/attention/dsa/dsa_indexer.py:1393-1412,
_forward_cuda_k_only :979-1000); a decode step scores them all the same (vLLM scores every step). The
op_name ..._skip_indexer layers run no indexer at all and reuse the previous layer's top-k (SGLang's forward_mla.py:
253-273): here the given indices, each query's latest min(index_topk, visible) tokens.

The GLM-5 kernels, with the reference collector's inputs (collector/sglang/glm5_dsa_sparse_modules.py:211-499):
- mqa_logits: index_heads x index_head_dim queries of each request's isl tokens scored against its step + isl keys
  (every key of the request: with clean_logits=False the causal tail is left to the top-k, and DeepGEMM reads only
  each row's [ks, ke), so up to twice its work here where step is small against isl);
- topk: fp32 scores, all zeros (flat) or -5 + noise with each row's causal last index_topk at 5 + noise (top_last),
  the top index_topk of each row's step + j + 1 visible tokens; fast_topk_transform_fused also maps them through
  the page table. A request of at most index_topk tokens selects every token: the plan holds its latency at 0
  (plans/dsa_kernels.py TOPK.zero_latency, collector :349-351) and the harness does not run it;
- dsa_attn: the sparse MLA alone, the model's heads of 576-wide queries, scale 576^-0.5 (collector :472-499) over
  each query's latest min(index_topk, visible) tokens (the collector gives every row its request's first ones).

Deliberate differences: one bf16 or fp32 dtype per part (no fp8 cache, fp8 index keys or FP8 GEMMs: KernelLimit);
the indexer's Hadamard rotation of q and k (SGLang's rotate_activation, dsa_indexer.py:310-320), orthogonal and so
without effect on the logits in exact arithmetic, is left out; RoPE has plain frequencies (theta 10000, no YaRN);
projections run one after another (serving overlaps some on streams). The dimensions are plans/dsa.py's DIMS, by
the case's architecture.
"""

from __future__ import annotations

from opcollect.backends.torch.reference import CHUNK_ELEMENTS, EPS, admitted_dtype, chunk, element_bytes, rms_norm
from opcollect.runtime.contract import KernelLimit, Prepared
from opcollect.runtime.timing import random_tensor

KV_LORA = 512  # the latent's value part; the key adds qk_rope (plans/mla.py)
THETA = 10000.0
DTYPES = ("float32", "bfloat16")


def model_dims(case):
    """plans/dsa.py's dimensions of the case's architecture; KernelLimit for one they do not hold."""
    from opcollect.plans.dsa import DIMS  # the planner's table: CPU-only, no framework

    found = DIMS.get(case.architecture)
    if found is None:
        raise KernelLimit(f"the torch DSA reference knows no dimensions of {case.architecture} (plans/dsa.py DIMS)")
    return found


def dtype_of(name: str):
    return admitted_dtype(name, DTYPES, "DSA")


def rope_tables(positions, dim: int, theta: float = THETA):
    """cos and sin [S, dim / 2] of positions [S]."""
    import torch

    inv = theta ** (-torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) / dim)
    angles = positions.float().unsqueeze(-1) * inv
    return angles.cos(), angles.sin()


def rope(x, cos, sin, interleaved: bool):
    """RoPE of x's whole last dim: interleaved pairs (GPT-J) or halves (NeoX); cos and sin broadcast to [..., D/2]."""
    import torch

    xf = x.float()
    if interleaved:
        even, odd = xf[..., 0::2], xf[..., 1::2]
        return torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2).to(x.dtype)
    first, second = xf.chunk(2, dim=-1)
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1).to(x.dtype)


def index_scores(q, weights, keys):
    """[b, S, N] fp32: sum over heads h of weights[b, s, h] x relu(q[b, s, h] . keys[b, n]), chunk by chunk."""
    import torch

    b, queries, heads, _ = q.shape
    keys = keys.float()
    out = torch.empty(b, queries, keys.shape[1], dtype=torch.float32, device=q.device)
    rows = chunk(queries, b * heads * keys.shape[1])
    for s in range(0, queries, rows):
        scores = torch.einsum("bshd,bnd->bshn", q[:, s : s + rows].float(), keys).relu_()
        out[:, s : s + rows] = torch.einsum("bshn,bsh->bsn", scores, weights[:, s : s + rows].float())
    return out


def causal_topk(scores, step: int, k: int):
    """[b, S, min(k, N)]: the k highest scores[b, j] among the step + j + 1 tokens query j may see, -1 where it sees
    fewer (then it keeps every one)."""
    import torch

    queries, keys = scores.shape[1], scores.shape[2]
    visible = step + 1 + torch.arange(queries, device=scores.device).unsqueeze(1)  # [S, 1]
    hidden = torch.arange(keys, device=scores.device) >= visible
    top = scores.masked_fill(hidden, float("-inf")).topk(min(k, keys), dim=-1, sorted=False).indices
    return top.masked_fill(top >= visible, -1)


def recent_indices(step: int, queries: int, k: int, device):
    """[S, min(k, step + S)]: the latest min(k, visible) tokens query j sees (step + j + 1 visible), -1 past them."""
    import torch

    width = min(k, step + queries)
    visible = step + 1 + torch.arange(queries, device=device).unsqueeze(1)
    picked = visible - width + torch.arange(width, device=device)
    return picked.masked_fill(picked < 0, -1)


def sparse_mla(q, cache, indices, scale: float):
    """[b, S, H, 512]: query rows q [b, S, H, 576] over the cache rows [b, N, 576] their indices [b, S, K] name (-1:
    none), the latent as key and its first 512 as value."""
    import torch

    b, queries, heads, _ = q.shape
    width = indices.shape[-1]
    out = q.new_empty(b, queries, heads, KV_LORA)
    batch = torch.arange(b, device=q.device).view(b, 1, 1)
    rows = chunk(queries, b * width * (q.shape[-1] + heads))
    for s in range(0, queries, rows):
        idx = indices[:, s : s + rows]
        gathered = cache[batch, idx.clamp(min=0)].to(q.dtype)  # [b, s, K, 576]
        scores = torch.einsum("bshd,bskd->bshk", q[:, s : s + rows], gathered).float() * scale
        scores.masked_fill_((idx < 0).unsqueeze(2), float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(q.dtype)
        out[:, s : s + rows] = torch.einsum("bshk,bskd->bshd", probs, gathered[..., :KV_LORA])
    return out


class DsaModule:
    """One DSA attention layer at one rank: its weights, its latent and index caches holding `step` cached tokens
    per request, and the forward of `queries` new tokens per request."""

    def __init__(self, d, heads, batch, step, queries, gemm, kv, mla, device, indexer: bool, prefill: bool = True):
        import torch

        self.d, self.heads, self.batch, self.step, self.queries = d, heads, batch, step, queries
        self.mla, self.indexer = mla, indexer
        self.qk = d.qk_nope + d.qk_rope
        self.scale = self.qk**-0.5

        def weight(shape, seed):
            return random_tensor(shape, gemm, device, seed).mul_(shape[-2] ** -0.5)

        self.w_a = weight((d.hidden, d.q_lora + KV_LORA + d.qk_rope), 1)
        self.w_qb = weight((d.q_lora, heads * self.qk), 2)
        self.w_uk = weight((heads, d.qk_nope, KV_LORA), 3).to(mla)  # kv_b_proj's key half, absorbed into q
        self.w_uv = weight((heads, KV_LORA, d.v_head), 4).to(mla)  # its value half, applied to the output
        self.w_o = weight((heads * d.v_head, d.hidden), 5)
        self.q_norm, self.kv_norm = (
            1 + random_tensor((n,), torch.float32, device, s) for n, s in ((d.q_lora, 6), (KV_LORA, 7))
        )
        total = step + queries
        self.cache = random_tensor((batch, total, KV_LORA + d.qk_rope), kv, device, 8)
        self.cos, self.sin = rope_tables(step + torch.arange(queries, device=device), d.qk_rope)
        # a prefill whose tokens all fit in index_topk keeps every one: the indexer then only stores keys
        self.keeps_all = prefill and total <= d.index_topk
        self.fixed = recent_indices(step, queries, d.index_topk, device).expand(batch, -1, -1)
        if indexer:
            self.wq_i = weight((d.q_lora, d.index_heads * d.index_dim), 10)
            self.wk_i = weight((d.hidden, d.index_dim), 11)
            self.ww_i = weight((d.hidden, d.index_heads), 12)
            self.k_norm = (
                1 + random_tensor((d.index_dim,), torch.float32, device, 13),
                random_tensor((d.index_dim,), torch.float32, device, 14),
            )
            self.index_cache = random_tensor((batch, total, d.index_dim), kv, device, 15)

    def _index(self, x, q_c):
        """The indexer: stores the new tokens' index keys, and returns each query's top-k tokens."""
        import torch
        import torch.nn.functional as F

        d, shape, rope_dim = self.d, (self.batch, self.queries), self.d.qk_rope
        k = F.layer_norm((x @ self.wk_i).float(), (d.index_dim,), *self.k_norm, eps=EPS).view(*shape, d.index_dim)
        k = torch.cat((rope(k[..., :rope_dim], self.cos, self.sin, False), k[..., rope_dim:]), dim=-1)
        self.index_cache[:, self.step :] = k.to(self.index_cache.dtype)
        if self.keeps_all:
            return self.fixed
        q = (q_c @ self.wq_i).view(*shape, d.index_heads, d.index_dim)
        cos, sin = self.cos.unsqueeze(1), self.sin.unsqueeze(1)
        q = torch.cat((rope(q[..., :rope_dim], cos, sin, False), q[..., rope_dim:]), dim=-1)
        weights = (x @ self.ww_i).float().view(*shape, d.index_heads) * (d.index_heads**-0.5 * d.index_dim**-0.5)
        return causal_topk(index_scores(q, weights, self.index_cache), self.step, d.index_topk)

    def forward(self, x):
        """The layer's output [batch x queries, hidden] for the new tokens' hidden states x."""
        import torch

        d, b, s, h = self.d, self.batch, self.queries, self.heads
        qkv = x @ self.w_a
        q_c = rms_norm(qkv[:, : d.q_lora], self.q_norm)
        kv_c = rms_norm(qkv[:, d.q_lora : d.q_lora + KV_LORA], self.kv_norm)
        k_pe = rope(qkv[:, d.q_lora + KV_LORA :].view(b, s, d.qk_rope), self.cos, self.sin, True)
        self.cache[:, self.step :] = torch.cat((kv_c.view(b, s, KV_LORA), k_pe), dim=-1).to(self.cache.dtype)
        q = (q_c @ self.w_qb).view(b, s, h, self.qk)
        q_pe = rope(q[..., d.qk_nope :], self.cos.unsqueeze(1), self.sin.unsqueeze(1), True)
        indices = self._index(x, q_c) if self.indexer else self.fixed
        q_latent = torch.einsum("bshn,hnl->bshl", q[..., : d.qk_nope].to(self.mla), self.w_uk)
        o = sparse_mla(torch.cat((q_latent, q_pe.to(self.mla)), dim=-1), self.cache, indices, self.scale)
        o = torch.einsum("bshl,hlv->bshv", o, self.w_uv)
        return o.reshape(b * s, h * d.v_head).to(self.w_o.dtype) @ self.w_o


def _rotating(inputs: list, run, dispatch: str) -> Prepared:
    import torch

    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % len(inputs)
        with torch.no_grad():
            run(*inputs[i])

    return Prepared(call, dispatch)


def module_footprint(case) -> int:
    d = model_dims(case)
    b, heads, tokens, total = case.batch_size, case.num_heads, case.batch_size * case.isl, case.step + case.isl
    gemm, kv = element_bytes(case.gemm_type), element_bytes(case.kv_cache_dtype)
    weights = d.hidden * (d.q_lora + KV_LORA + d.qk_rope) + d.q_lora * heads * (d.qk_nope + d.qk_rope)
    weights += heads * (d.qk_nope + d.v_head) * KV_LORA + heads * d.v_head * d.hidden
    weights += d.q_lora * d.index_heads * d.index_dim + d.hidden * (d.index_dim + d.index_heads)
    cache = b * total * (KV_LORA + d.qk_rope + d.index_dim) * kv
    activations = tokens * (2 * d.hidden + d.q_lora + heads * (KV_LORA + d.qk_rope) * 3) * 4
    activations += tokens * (min(d.index_topk, total) * 8 + total * 4 + d.index_heads * d.index_dim * 4)
    return weights * gemm + cache + activations + 3 * CHUNK_ELEMENTS * 4


def prepare_module(case, dispatch: str, device: str, copies: int) -> Prepared:
    """The layer with its caches filled for step cached tokens per request; each call runs one forward of
    batch_size x isl new tokens (isl 1: a decode step)."""
    from opcollect.plans.dsa import SKIP_INDEXER

    d = model_dims(case)
    gemm, kv, mla = (dtype_of(getattr(case, f)) for f in ("gemm_type", "kv_cache_dtype", "mla_dtype"))
    b, queries = case.batch_size, case.isl
    indexer, prefill = not case.op_name.endswith(SKIP_INDEXER), case.op_name.startswith("dsa_context_module")
    module = DsaModule(d, case.num_heads, b, case.step, queries, gemm, kv, mla, device, indexer, prefill)
    xs = [(random_tensor((b * queries, d.hidden), gemm, device, 20 + i),) for i in range(copies)]
    return _rotating(xs, module.forward, dispatch)


# --- GLM-5's kernels alone ---


def mqa_footprint(case) -> int:
    d = model_dims(case)
    rows, keys = case.batch_size * case.isl, case.step + case.isl
    q = rows * d.index_heads * (d.index_dim * element_bytes(case.mla_dtype) + 4)
    cache = case.batch_size * keys * d.index_dim * element_bytes(case.kv_cache_dtype)
    return q + cache + rows * keys * 4 + 3 * CHUNK_ELEMENTS * 4


def prepare_mqa(case, dispatch: str, device: str, copies: int) -> Prepared:
    import torch

    d = model_dims(case)
    mla, kv = dtype_of(case.mla_dtype), dtype_of(case.kv_cache_dtype)
    b, queries, keys = case.batch_size, case.isl, case.step + case.isl
    inputs = [
        (
            random_tensor((b, queries, d.index_heads, d.index_dim), mla, device, 10 * i),
            random_tensor((b, queries, d.index_heads), torch.float32, device, 10 * i + 1),
            random_tensor((b, keys, d.index_dim), kv, device, 10 * i + 2),
        )
        for i in range(copies)
    ]
    return _rotating(inputs, index_scores, dispatch)


def trivial_topk(case) -> bool:
    """The plan's zero-latency rule (OpPlan.zero_latency of glm5_topk_module): every token fits in index_topk."""
    from opcollect.plans.dsa_kernels import TOPK  # CPU-only planner code, no framework

    return bool(TOPK.zero_latency(case))


def topk_scores(mode: str, step: int, queries: int, batch: int, k: int, device: str):
    """[b, S, step + S] fp32: zeros (flat), or -5 + noise with each row's last min(k, visible) visible tokens at 5 +
    noise (top_last), as the collector's _make_glm5_topk_scores (glm5_dsa_sparse_modules.py:274-303)."""
    import torch

    keys = step + queries
    if mode == "flat":
        return torch.zeros(batch, queries, keys, device=device)
    if mode != "top_last":
        raise KernelLimit(f"the torch top-k knows score modes flat and top_last, not {mode}")
    scores = -5.0 + 0.05 * random_tensor((batch, queries, keys), torch.float32, device, 1)
    visible = step + 1 + torch.arange(queries, device=device).unsqueeze(1)
    columns = torch.arange(keys, device=device)
    tail = (columns < visible) & (columns >= visible - k)
    return torch.where(tail, 5.0 + random_tensor((batch, queries, keys), torch.float32, device, 2), scores)


def topk_footprint(case) -> int:
    if trivial_topk(case):
        return 0  # not run
    rows, keys = case.batch_size * case.isl, case.step + case.isl
    return rows * keys * 4 * 3 + rows * model_dims(case).index_topk * 8


def prepare_topk(case, dispatch: str, device: str, copies: int) -> Prepared:
    k = model_dims(case).index_topk
    inputs = [(topk_scores(case.score_mode, case.step, case.isl, case.batch_size, k, device),) for _ in range(copies)]
    return _rotating(inputs, lambda scores: causal_topk(scores, case.step, k), dispatch)


def attn_footprint(case) -> int:
    d = model_dims(case)
    rows, keys, width = case.batch_size * case.isl, case.step + case.isl, min(d.index_topk, case.step + case.isl)
    q = rows * case.num_heads * (2 * KV_LORA + d.qk_rope) * element_bytes(case.mla_dtype)
    cache = case.batch_size * keys * (KV_LORA + d.qk_rope) * element_bytes(case.kv_cache_dtype)
    return q + cache + rows * width * 8 + 3 * CHUNK_ELEMENTS * 4


def prepare_attn(case, dispatch: str, device: str, copies: int) -> Prepared:
    d = model_dims(case)
    mla, kv = dtype_of(case.mla_dtype), dtype_of(case.kv_cache_dtype)
    b, queries, latent = case.batch_size, case.isl, KV_LORA + d.qk_rope
    indices = recent_indices(case.step, queries, d.index_topk, device).expand(b, -1, -1)
    inputs = [
        (
            random_tensor((b, queries, case.num_heads, latent), mla, device, 10 * i),
            random_tensor((b, case.step + queries, latent), kv, device, 10 * i + 1),
        )
        for i in range(copies)
    ]
    return _rotating(inputs, lambda q, cache: sparse_mla(q, cache, indices, latent**-0.5), dispatch)
