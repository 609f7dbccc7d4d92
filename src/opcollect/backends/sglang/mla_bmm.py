"""DeepSeek MLA's absorb BMMs as SGLang 0.5.14's DeepseekV2AttentionMLA runs them in a decode step, to mla_bmm_perf.

Paths are relative to the wheel's sglang/srt/models/deepseek_common/. The absorbed forward brackets the attention
with two batched matmuls over the rank's heads (attention_forward_methods/forward_mla.py):
- mla_gen_pre: q_nope x W_UK, (tokens, h, 128) -> (h, tokens, 512). q_nope is the first 128 of each head's 192
  q features, a strided view of q_b_proj's output (forward_mla.py:278, 305); bf16 W_UK: torch.bmm(q_nope.transpose(0,
  1), w_kc) (:396-397); fp8 W_UK: per_tensor_quant_mla_fp8 of q_nope.transpose(0, 1) into a zeroed scale, then
  bmm_fp8(q_val, w_kc, q_scale, w_scale, bfloat16) (:377-395).
- mla_gen_post: attn_output x W_UV, (tokens, h, 512) -> (tokens, h * 128). attn_output is the attention's output
  viewed (tokens, h, 512) (:585); bf16: torch.bmm(attn_output.transpose(0, 1), w_vc, out=) into the o_proj input's
  (h, tokens, 128) view (:727-740); fp8: per_tensor_quant_mla_fp8 then bmm_fp8, transposed back and flattened,
  which copies (:688-713).
bmm_fp8 is forward_mla's own wrapper of sgl_kernel.bmm_fp8 (a custom op that allocates the output, :57-82); the
zeroed scale is a fresh torch.zeros((1,)) with cuBLAS >= 12.9, else a pre-zeroed slot of the forward's
BumpAllocator (:385-391; deepseek_common/utils.py:54). W_UK and W_UV are the column-major views the weight loader
leaves (deepseek_weight_loader.py:584-590); an fp8 one carries one per-tensor fp32 scale (w_scale), as
block_quant_to_tensor_quant / channel_quant_to_tensor_quant give it (deepseek_weight_loader.py:531-548; a 128x128
block-fp8 kv_b_proj is dequantized to bf16 on CUDA instead, :517-530, and runs the bf16 rows). The calls are the
reference collector's (collector/sglang/collect_mla_bmm.py), with serving's layouts: its q_nope is contiguous and
its fp8 post BMM leaves out the flatten.

kernel_source: "sglang_torch_bmm" for bf16 weights, "sglang_sgl_kernel_bmm_fp8" for fp8 ones (the reference's
labels), as forward_mla branches on w_kc / w_vc's dtype. bmm_fp8 (cuBLASLt fp8) needs SM 89, as the collector
gates it.
"""

from __future__ import annotations

from opcollect.backends.sglang.mla import KV_LORA_RANK, QK_NOPE_HEAD_DIM, QK_ROPE_HEAD_DIM, V_HEAD_DIM
from opcollect.runtime.contract import KernelLimit, Prepared
from opcollect.runtime.devices import device_sm

# op_name -> (k, n): x (tokens, h, k) x W (h, k, n)
DIMS = {"mla_gen_pre": (QK_NOPE_HEAD_DIM, KV_LORA_RANK), "mla_gen_post": (KV_LORA_RANK, V_HEAD_DIM)}
SOURCES = {"bfloat16": "sglang_torch_bmm", "fp8": "sglang_sgl_kernel_bmm_fp8"}
FP8_MIN_SM = 89
Q_HEAD_DIM = QK_NOPE_HEAD_DIM + QK_ROPE_HEAD_DIM  # 192: q_b_proj's features per head


def dims(case) -> tuple[int, int]:
    if case.op_name not in DIMS:
        raise KernelLimit(f"SGLang's MLA has no absorb BMM {case.op_name!r} (mla_gen_pre, mla_gen_post)")
    if case.bmm_dtype not in SOURCES:
        raise KernelLimit(f"SGLang's absorb BMM runs bfloat16 or fp8 weights, not {case.bmm_dtype}")
    return DIMS[case.op_name]


def footprint(case) -> int:
    """The input (q_b_proj's whole output for pre, of which q_nope is a view), W, the bf16 output and, for fp8, the
    quantized input, the two scales and the post BMM's flattened copy."""
    k, n = dims(case)
    t, h = case.num_tokens, case.num_heads
    fp8 = case.bmm_dtype == "fp8"
    x = t * h * (Q_HEAD_DIM if case.op_name == "mla_gen_pre" else k) * 2
    weight = h * k * n * (1 if fp8 else 2)
    out = t * h * n * 2
    if not fp8:
        return x + weight + out
    flattened = out if case.op_name == "mla_gen_post" else 0
    return x + weight + out + t * h * k + 8 + flattened


def weight(h: int, k: int, n: int, fp8: bool, device: str, seed: int):
    """W (h, k, n) in the loader's layout: W_UK is w_kc.transpose(1, 2).contiguous().transpose(1, 2), W_UV is
    w_vc.contiguous().transpose(1, 2) (deepseek_weight_loader.py:584-590): both a (h, n, k) buffer viewed (h, k, n)."""
    import torch

    from opcollect.runtime.timing import random_tensor

    w = random_tensor((h, n, k), torch.bfloat16, device, seed)
    return (w.to(torch.float8_e4m3fn) if fp8 else w).transpose(1, 2)


def activations(case, device: str, seed: int):
    """pre: q_nope, the (tokens, h, 128) head of q viewed (tokens, h, 192) (forward_mla.py:278, 305); post: the
    attention output (tokens, h, 512), contiguous (:585)."""
    import torch

    from opcollect.runtime.timing import random_tensor

    t, h = case.num_tokens, case.num_heads
    if case.op_name == "mla_gen_pre":
        q = random_tensor((t, h, Q_HEAD_DIM), torch.bfloat16, device, seed)
        return q.split([QK_NOPE_HEAD_DIM, QK_ROPE_HEAD_DIM], dim=-1)[0]
    return random_tensor((t, h, KV_LORA_RANK), torch.bfloat16, device, seed)


def bf16_call(case, pairs):
    """torch.bmm as forward_mla runs it on bf16 weights (:396-397 pre, :727-740 post)."""
    import torch

    h, n = case.num_heads, DIMS[case.op_name][1]
    state = {"i": 0}

    def pre() -> None:
        i = state["i"] = (state["i"] + 1) % len(pairs)
        x, w = pairs[i]
        torch.bmm(x.transpose(0, 1), w)

    def post() -> None:
        i = state["i"] = (state["i"] + 1) % len(pairs)
        x, w = pairs[i]
        out = torch.empty((x.shape[0], h * n), dtype=x.dtype, device=x.device)
        torch.bmm(x.transpose(0, 1), w, out=out.view(-1, h, n).transpose(0, 1))

    return pre if case.op_name == "mla_gen_pre" else post


def fp8_call(case, pairs, w_scale, device: str):
    """per_tensor_quant_mla_fp8 + forward_mla's bmm_fp8 as forward_mla runs them on fp8 weights (:377-395 pre,
    :688-713 post)."""
    import torch
    from sglang.srt.layers.quantization.fp8_kernel import per_tensor_quant_mla_fp8
    from sglang.srt.models.deepseek_common.attention_forward_methods.forward_mla import bmm_fp8
    from sglang.srt.models.deepseek_common.utils import _is_cublas_ge_129

    slots = [torch.zeros((1,), dtype=torch.float32, device=device) for _ in pairs]  # the BumpAllocator's, pre-zeroed
    post = case.op_name == "mla_gen_post"
    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % len(pairs)
        x, w = pairs[i]
        zero = torch.zeros((1,), dtype=torch.float32, device=x.device) if _is_cublas_ge_129 else slots[i]
        x_val, x_scale = per_tensor_quant_mla_fp8(x.transpose(0, 1), zero)
        out = bmm_fp8(x_val, w, x_scale, w_scale, torch.bfloat16)
        if post:
            out.transpose(0, 1).flatten(1, 2)  # the o_proj input: a copy of the (h, tokens, 128) output

    return call


def prepare(case, dispatch: str, device: str, copies: int) -> Prepared:
    k, n = dims(case)
    fp8 = case.bmm_dtype == "fp8"
    sm = device_sm(device)
    if fp8 and not (sm.isdigit() and int(sm) >= FP8_MIN_SM):
        raise KernelLimit(f"sgl_kernel's bmm_fp8 (cuBLASLt fp8) needs CUDA SM >= {FP8_MIN_SM}, not {sm}")
    import torch

    from opcollect.backends.sglang.context import sglang_context

    h = case.num_heads
    with sglang_context(device), torch.device(device):
        pairs = [(activations(case, device, i), weight(h, k, n, fp8, device, 1000 + i)) for i in range(copies)]
        if not fp8:
            return Prepared(bf16_call(case, pairs), SOURCES["bfloat16"])
        # one per-tensor scale, shaped as scaled_fp8_quant gives it (fp8_kernel.py:1861)
        w_scale = torch.ones((1,), dtype=torch.float32, device=device)
        return Prepared(fp8_call(case, pairs, w_scale, device), SOURCES["fp8"])
