"""Absorbed multi-head latent attention (DeepSeek-V3 dimensions) in PyTorch.

Per rank with h heads: queries are projected into the 512-wide latent space (bmm with W_UK) and joined
with their 64-wide rotary part. All heads share one latent cache (576-wide keys, its first 512 as
values), so the heads fold into the query rows, as MLA kernels do: one bmm for the scores, a softmax
(causal in context), one bmm for the values, then each head is projected back (bmm with W_UV).
"""

from __future__ import annotations

from opcollect.runtime.contract import KernelLimit, Prepared
from opcollect.runtime.timing import random_tensor

KV_LORA, ROPE, NOPE, V = 512, 64, 128, 128


def _lengths(case, context: bool) -> tuple[int, int]:
    return (case.isl, case.isl) if context else (1, case.step + 1)


def footprint(case, context: bool) -> int:
    elem = 4 if case.mla_dtype == "float32" else 2
    queries, keys = _lengths(case, context)
    rows = case.batch_size * queries * case.num_heads
    activations = rows * (NOPE + ROPE + 2 * (KV_LORA + ROPE) + KV_LORA + V)
    scores = rows * keys * 2
    cache = case.batch_size * keys * (KV_LORA + ROPE)
    weights = case.num_heads * (NOPE * KV_LORA + KV_LORA * V)
    return (activations + scores + cache + weights) * elem


def attend(q, cache, heads: int, queries: int, hidden, scale: float):
    """Heads folded into query rows: q (b, heads*queries, 576) over cache (b, keys, 576) -> (b, heads*queries, 512).

    ``hidden`` (queries x keys, True where a query may not look) applies to every head; None in decode.
    """
    import torch

    b, keys = cache.shape[0], cache.shape[1]
    scores = torch.bmm(q, cache.transpose(1, 2)).mul_(scale)
    if hidden is not None:
        scores.view(b, heads, queries, keys).masked_fill_(hidden, float("-inf"))
    return torch.bmm(torch.softmax(scores, dim=-1), cache[..., :KV_LORA])


def prepare(case, dispatch: str, device: str, copies: int, context: bool) -> Prepared:
    import torch

    if case.mla_dtype not in ("bfloat16", "float32") or case.kv_cache_dtype != case.mla_dtype:
        raise KernelLimit(
            f"the torch MLA runner computes in bf16/fp32 only, not {case.mla_dtype}/{case.kv_cache_dtype}"
        )
    dtype = torch.bfloat16 if case.mla_dtype == "bfloat16" else torch.float32
    b, h = case.batch_size, case.num_heads
    queries, keys = _lengths(case, context)
    scale = (NOPE + ROPE) ** -0.5
    w_uk = random_tensor((h, NOPE, KV_LORA), dtype, device, 1)
    w_uv = random_tensor((h, KV_LORA, V), dtype, device, 2)
    q_nope = [random_tensor((h, b * queries, NOPE), dtype, device, 10 + i) for i in range(copies)]
    q_rope = [random_tensor((h, b * queries, ROPE), dtype, device, 20 + i) for i in range(copies)]
    caches = [random_tensor((b, keys, KV_LORA + ROPE), dtype, device, 30 + i) for i in range(copies)]
    # query position i (its heads folded in) sees keys 0..i; decode sees the whole cache
    hidden = torch.triu(torch.ones(queries, keys, dtype=torch.bool, device=device), diagonal=1) if context else None
    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        q_latent = torch.cat([torch.bmm(q_nope[i], w_uk), q_rope[i]], dim=-1)  # (h, b*q, 576)
        q = q_latent.view(h, b, queries, KV_LORA + ROPE).transpose(0, 1).reshape(b, h * queries, KV_LORA + ROPE)
        out = (
            attend(q, caches[i], h, queries, hidden, scale)
            .view(b, h, queries, KV_LORA)
            .transpose(0, 1)
            .reshape(h, b * queries, KV_LORA)
        )
        torch.bmm(out, w_uv)

    return Prepared(call, dispatch)
