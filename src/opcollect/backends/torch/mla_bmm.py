"""The MLA absorb batched matmuls of generation (DeepSeek-V3 dimensions) with torch.bmm.

mla_gen_pre projects each head's no-rope query into the latent space: q_nope [tokens, heads, 128] viewed
head-major x W_UK [heads, 128, 512] -> [heads, tokens, 512]. mla_gen_post projects the attention output
back per head: [tokens, heads, 512] viewed head-major x W_UV [heads, 512, 128], written into a head-major
view of a [tokens, heads, 128] buffer. Layouts and dimensions are the ones the reference collector times
(collector/vllm/collect_mla_bmm.py, as vLLM's mla_attention.py calls torch.bmm); num_heads is per rank.
"""

from __future__ import annotations

from opcollect.runtime.contract import KernelLimit, Prepared
from opcollect.runtime.timing import random_tensor

KERNEL_SOURCE = "torch.bmm"
QK_NOPE, KV_LORA, V = 128, 512, 128
SHAPES = {"mla_gen_pre": (QK_NOPE, KV_LORA), "mla_gen_post": (KV_LORA, V)}  # (in, out) per head
ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def dims(case) -> tuple[int, int]:
    """The per-head (in, out) widths of the case's matmul."""
    found = SHAPES.get(case.op_name)
    if found is None:
        raise KernelLimit(f"mla_bmm has no op_name {case.op_name!r}; it times {', '.join(SHAPES)}")
    return found


def footprint(case) -> int:
    d_in, d_out = dims(case)
    elem = ELEMENT_BYTES.get(case.bmm_dtype, 2)
    t, h = case.num_tokens, case.num_heads
    return (t * h * d_in + h * d_in * d_out + t * h * d_out) * elem


def prepare(case, dispatch: str, device: str, copies: int) -> Prepared:
    import torch

    d_in, d_out = dims(case)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(case.bmm_dtype)
    if dtype is None:
        # fp8: torch has no batched fp8 matmul (torch._scaled_mm is 2-D); a loop over heads is no kernel any
        # framework serves the absorb with
        raise KernelLimit(f"the torch backend has no {case.bmm_dtype} batched matmul")
    t, h = case.num_tokens, case.num_heads
    xs = [random_tensor((t, h, d_in), dtype, device, i) for i in range(copies)]
    ws = [random_tensor((h, d_in, d_out), dtype, device, 1000 + i) for i in range(copies)]
    # pre writes a head-major [heads, tokens, 512]; post a head-major view of a token-major [tokens, heads, 128]
    pre = case.op_name == "mla_gen_pre"
    outs = [
        torch.empty((h, t, d_out), dtype=dtype, device=device)
        if pre
        else torch.empty((t, h, d_out), dtype=dtype, device=device).transpose(0, 1)
        for _ in range(copies)
    ]
    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        torch.bmm(xs[i].transpose(0, 1), ws[i], out=outs[i])

    return Prepared(call, KERNEL_SOURCE)
