"""Encoder (vision tower) attention: full, non-causal scaled_dot_product_attention, heads equal to KV heads.

The batch is padded: every sequence has isl tokens, stored [batch, isl, heads, head_dim] and passed to SDPA
as [batch, heads, isl, head_dim] views, as vLLM's torch SDPA ViT path does (vit_attn_wrappers.py:apply_sdpa,
190-206). The reference collectors run a uniform varlen batch (cu_seqlens of equal steps), the same work.
kernel_source is the SDPA backend that ran, chosen as attention.py chooses it.
"""

from __future__ import annotations

from opcollect.backends.torch.attention import ELEMENT_BYTES, _dtype, first_accepting_backend
from opcollect.runtime.contract import Prepared
from opcollect.runtime.timing import random_tensor


def footprint(case) -> int:
    elem = ELEMENT_BYTES.get(case.attn_dtype, 2)
    return 4 * case.batch_size * case.isl * case.num_heads * case.head_dim * elem  # q, k, v and the output


def prepare(case, dispatch: str, device: str, copies: int) -> Prepared:
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    dtype = _dtype(case.attn_dtype)
    shape = (case.batch_size, case.isl, case.num_heads, case.head_dim)
    qs = [random_tensor(shape, dtype, device, i) for i in range(copies)]
    ks = [random_tensor(shape, dtype, device, 100 + i) for i in range(copies)]
    vs = [random_tensor(shape, dtype, device, 200 + i) for i in range(copies)]
    scale = case.head_dim**-0.5
    state = {"i": 0}

    def run_once() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        q, k, v = (t[i].transpose(1, 2) for t in (qs, ks, vs))
        F.scaled_dot_product_attention(q, k, v, is_causal=False, scale=scale)

    name, backend = first_accepting_backend(run_once)

    def call() -> None:
        with sdpa_kernel([backend]):
            run_once()

    return Prepared(call, f"sdpa.{name}")
