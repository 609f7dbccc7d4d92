"""Context and generation attention through scaled_dot_product_attention; GQA and sliding windows.

kernel_source is the SDPA backend that ran: the first of flash, memory-efficient, cuDNN and math that
accepts the case, as SDPA itself would choose it.
"""

from __future__ import annotations

from opcollect.runtime.contract import KernelLimit, Prepared
from opcollect.runtime.timing import random_tensor

ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _dtype(name: str):
    import torch

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(name)
    if dtype is None:
        raise KernelLimit(f"scaled_dot_product_attention takes no {name} inputs")
    return dtype


def kv_length(case, context: bool) -> int:
    """Keys per sequence the kernel reads: a sliding window bounds the decode cache it keeps."""
    if context:
        return case.isl
    length = case.step + 1
    return min(length, case.window_size) if case.window_size else length


def footprint(case, context: bool) -> int:
    elem = ELEMENT_BYTES.get(case.attn_dtype, 2)
    queries = case.isl if context else 1
    keys = kv_length(case, context)
    q_and_out = 2 * case.batch_size * case.num_heads * queries * case.head_dim
    kv = 2 * case.batch_size * case.num_key_value_heads * keys * case.head_dim
    mask = queries * keys if context and case.window_size else 0
    return (q_and_out + kv) * elem + mask


def sdpa_backends():
    from torch.nn.attention import SDPBackend

    return [
        ("flash_attention", SDPBackend.FLASH_ATTENTION),
        ("efficient_attention", SDPBackend.EFFICIENT_ATTENTION),
        ("cudnn_attention", SDPBackend.CUDNN_ATTENTION),
        ("math", SDPBackend.MATH),
    ]


def first_accepting_backend(run_once) -> tuple[str, object]:
    """The first SDPA backend that runs ``run_once`` without refusing it."""
    from torch.nn.attention import sdpa_kernel

    refusals = []
    for name, backend in sdpa_backends():
        try:
            with sdpa_kernel([backend]):
                run_once()
            return name, backend
        except RuntimeError as exc:  # "No available kernel" and shape/dtype refusals
            refusals.append(f"{name}: {str(exc).splitlines()[0][:80]}")
    raise KernelLimit("no SDPA backend accepts the case; " + "; ".join(refusals))


def prepare(case, dispatch: str, device: str, copies: int, context: bool) -> Prepared:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    if case.kv_cache_dtype != case.attn_dtype:
        raise KernelLimit(f"SDPA reads a {case.attn_dtype} cache, not {case.kv_cache_dtype}")
    dtype = _dtype(case.attn_dtype)
    b, h, kvh, d = case.batch_size, case.num_heads, case.num_key_value_heads, case.head_dim
    queries, keys = (case.isl, case.isl) if context else (1, kv_length(case, context))
    qs = [random_tensor((b, h, queries, d), dtype, device, i) for i in range(copies)]
    ks = [random_tensor((b, kvh, keys, d), dtype, device, 100 + i) for i in range(copies)]
    vs = [random_tensor((b, kvh, keys, d), dtype, device, 200 + i) for i in range(copies)]
    gqa = h != kvh
    mask = None
    causal = context
    if context and case.window_size and case.window_size < case.isl:
        # causal band: query i sees keys i - window + 1 .. i
        pos = torch.arange(case.isl, device=device)
        mask = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - case.window_size)
        causal = False
    state = {"i": 0}

    def run_once() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        F.scaled_dot_product_attention(qs[i], ks[i], vs[i], attn_mask=mask, is_causal=causal, enable_gqa=gqa)

    name, backend = first_accepting_backend(run_once)

    def call() -> None:
        with sdpa_kernel([backend]):
            run_once()

    return Prepared(call, f"sdpa.{name}")
