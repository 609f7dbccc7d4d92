"""The absorb BMMs of vLLM 0.24.0's MLA generation (DeepSeek-V3 dimensions: qk_nope 128, qk_rope 64, kv_lora_rank 512,
v_head_dim 128), as MLAAttention runs them on the decode tokens, in bf16 with torch.bmm.

mla_gen_pre: forward_impl's query absorb (model_executor/layers/attention/mla_attention.py:739-792): the no-rope part of
the [tokens, heads, 192] query, head-major, times W_UK_T [heads, 128, 512] into a new [heads, tokens, 512] tensor.
mla_gen_post: MLAAttention._v_up_proj (mla_attention.py:1012-1034), called as forward_impl calls it (:831-832): the
[tokens, heads, 512] attention output, head-major, times W_UV [heads, 512, 128] into a head-major view of the
[tokens, heads * 128] output.

W_UK_T and W_UV are vLLM's own: a kv_b_proj built as DeepseekV2MLAAttention builds it (models/deepseek_v2.py:961-967)
under DeepSeek-V3's block-fp8 checkpoint config (mla.py's quant_config("fp8_block")), its weights post-processed as
the model loader does, then MLAAttention.process_weights_after_loading (mla_attention.py:874-970) run on a stand-in
holding what that method and _v_up_proj read (AbsorbLayer), so both tensors keep the strides vLLM gives them (views
of the dequantized kv_b_proj weight, not packed copies). Building the whole attention module per case instead would
bring its MLA backend, cache and projections for two matmuls. On CUDA both BMMs are torch.bmm in the activation dtype;
AITER's fp8/fp4 BMMs are ROCm-only (mla_attention.py:520-527, 757-777, 1016-1031), so an fp8 bmm_dtype is refused.
verified_on: vllm==0.24.0
"""

from __future__ import annotations

from dataclasses import dataclass

from opcollect.backends.vllm.mla import DEEPSEEK_V3
from opcollect.runtime.contract import KernelLimit, Prepared

KERNEL_SOURCE = "vllm_torch_bmm"
KV_LORA = DEEPSEEK_V3["kv_lora_rank"]
NOPE = DEEPSEEK_V3["qk_nope_head_dim"]
ROPE = DEEPSEEK_V3["qk_rope_head_dim"]
V = DEEPSEEK_V3["v_head_dim"]
BF16_BYTES = 2
OPS = ("mla_gen_pre", "mla_gen_post")
PREFIX = "opcollect.mla_bmm"
# the KV-cache scales set_default_quant_scales fills at the end of process_weights_after_loading (attention.py:95-119)
SCALE_NAMES = ("_k_scale", "_v_scale", "_q_scale", "_prob_scale")


def check_case(case) -> None:
    if case.op_name not in OPS:
        raise KernelLimit(f"mla_bmm has no op_name {case.op_name!r}; vLLM's MLA runs {', '.join(OPS)}")
    if case.bmm_dtype != "bfloat16":
        raise KernelLimit(
            f"vLLM on CUDA runs the MLA absorb BMMs in bf16 torch.bmm only, not {case.bmm_dtype}: its fp8 BMM is ROCm "
            "AITER's (mla_attention.py:768-777, 1027-1031)"
        )


def footprint(case) -> int:
    """W_UK_T and W_UV (together the dequantized [512, heads * 256] kv_b_proj weight they view), the input and the
    output of the one BMM."""
    n, t = case.num_heads, case.num_tokens
    weights = KV_LORA * n * (NOPE + V) * BF16_BYTES
    if case.op_name == "mla_gen_pre":
        return weights + (t * n * (NOPE + ROPE) + n * t * KV_LORA) * BF16_BYTES  # the whole query, the latent query
    return weights + (t * n * KV_LORA + t * n * V) * BF16_BYTES  # the latent attention output, the output


@dataclass
class AbsorbLayer:
    """What MLAAttention.process_weights_after_loading and _v_up_proj read of their layer (mla_attention.py:874-970,
    1012-1034), set as MLAAttention.__init__ sets it (mla_attention.py:353-527). process_weights_after_loading adds
    W_UK_T and W_UV."""

    kv_b_proj: object
    num_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    v_head_dim: int
    is_aiter_triton_fp8_bmm_enabled: bool
    is_aiter_triton_fp4_bmm_enabled: bool
    layer_name: str
    _k_scale: object
    _v_scale: object
    _q_scale: object
    _prob_scale: object
    # the attention layer's own quant config; None: its KV scales keep their defaults (the BMM weights do not read it)
    quant_config: object = None


def absorb_layer(kv_b_proj, num_heads: int, fp8_bmm: bool, fp4_bmm: bool, device: str) -> AbsorbLayer:
    import torch

    scales = {name: torch.tensor(1.0, dtype=torch.float32, device=device) for name in SCALE_NAMES}
    return AbsorbLayer(
        kv_b_proj=kv_b_proj,
        num_heads=num_heads,
        kv_lora_rank=KV_LORA,
        qk_nope_head_dim=NOPE,
        v_head_dim=V,
        is_aiter_triton_fp8_bmm_enabled=fp8_bmm,
        is_aiter_triton_fp4_bmm_enabled=fp4_bmm,
        layer_name=f"{PREFIX}.attn",
        **scales,
    )


def absorb_pre(q, w_uk_t):
    """forward_impl's absorb (mla_attention.py:743-792, no head padding: only CUTLASS_MLA pads, cutlass_mla.py:141):
    [tokens, heads, 192] -> [heads, tokens, 128] x [heads, 128, 512] -> [tokens, heads, 512] (a view)."""
    import torch

    q_nope, _ = q.split([NOPE, ROPE], dim=-1)
    q_nope = q_nope.transpose(0, 1)
    heads, tokens, _ = q_nope.shape
    out = q_nope.new_empty((heads, tokens, w_uk_t.shape[2]))
    torch.bmm(q_nope, w_uk_t, out=out)
    return out.transpose(0, 1)


def prepare(case, dispatch: str, device: str, copies: int) -> Prepared:
    check_case(case)
    import torch
    from vllm._aiter_ops import rocm_aiter_ops
    from vllm.model_executor.layers.attention import MLAAttention
    from vllm.model_executor.layers.linear import ColumnParallelLinear

    from opcollect.backends.vllm.context import vllm_context
    from opcollect.backends.vllm.mla import fill_and_process, quant_config
    from opcollect.runtime.timing import random_tensor

    # MLAAttention.__init__ reads these once (mla_attention.py:520-527); true only with ROCm AITER
    fp8_bmm = bool(rocm_aiter_ops.is_fp8bmm_enabled())
    fp4_bmm = bool(rocm_aiter_ops.is_fp4bmm_enabled())
    if fp8_bmm or fp4_bmm:
        raise KernelLimit("vLLM runs the MLA absorb BMMs with AITER here, not torch.bmm")
    n, t = case.num_heads, case.num_tokens
    dtype = torch.bfloat16
    quant = quant_config("fp8_block")  # DeepSeek-V3's checkpoint: block-fp8 kv_b_proj
    layers = []
    with vllm_context(device, quant_config=quant):
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)  # the model loader's dtype: kv_b_proj's params_dtype and out dtype
        try:
            with torch.device(device):
                for _ in range(copies):
                    kv_b_proj = ColumnParallelLinear(
                        KV_LORA, n * (NOPE + V), bias=False, quant_config=quant, prefix=f"{PREFIX}.kv_b_proj"
                    )
                    fill_and_process(kv_b_proj, dtype, device)  # random fp8 weights, Fp8LinearMethod's post-processing
                    layer = absorb_layer(kv_b_proj, n, fp8_bmm, fp4_bmm, device)
                    MLAAttention.process_weights_after_loading(layer, dtype)
                    layer.kv_b_proj = None  # W_UK_T and W_UV are views of its dequantized weight, not of it
                    layers.append(layer)
        finally:
            torch.set_default_dtype(previous)
    w = layers[0].W_UK_T if case.op_name == "mla_gen_pre" else layers[0].W_UV
    wanted = (n, NOPE, KV_LORA) if case.op_name == "mla_gen_pre" else (n, KV_LORA, V)
    if tuple(w.shape) != wanted or w.dtype != dtype:
        raise RuntimeError(f"vLLM made a {w.dtype} {tuple(w.shape)} absorb weight, the case needs bf16 {wanted}")
    state = {"i": 0}
    if case.op_name == "mla_gen_pre":
        qs = [random_tensor((t, n, NOPE + ROPE), dtype, device, i) for i in range(copies)]

        def call() -> None:
            i = state["i"] = (state["i"] + 1) % copies
            absorb_pre(qs[i], layers[i].W_UK_T)

        return Prepared(call, KERNEL_SOURCE)

    xs = [random_tensor((t, n, KV_LORA), dtype, device, i) for i in range(copies)]
    outs = [torch.empty((t, n * V), dtype=dtype, device=device) for _ in range(copies)]

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        MLAAttention._v_up_proj(layers[i], xs[i], out=outs[i])

    return Prepared(call, KERNEL_SOURCE)
