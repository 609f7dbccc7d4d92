"""A vision tower's attention (non-causal, no KV cache) through SGLang 0.5.14's VisionAttention, to
encoder_attention_perf.

Paths are relative to the wheel's sglang/srt/. The runner builds VisionAttention as Qwen3-VL's vision block does
(models/qwen3_vl.py:193-206: use_qkv_parallel, flatten_batch, no quant config, the rank's heads) and reads the
attention implementation it chose: VisionAttention._determine_attention_backend (layers/attention/vision.py:1065-1108)
takes --mm-attention-backend, else on CUDA "fa3" on SM 9x, "fa4" on SM 10x but 10.3, "triton_attn" elsewhere, and
builds QKV_BACKEND_IMPL[name] (vision.py:862-872, 976-986). Its name, mapped to the reference's label
(collector/sglang/collect_attn_encoder.py), is kernel_source: fa3 -> flash_attention_v3, fa4 -> flash_attention_v4,
triton_attn -> triton.

Timed is that implementation's kernel call, with the arguments its forward hands it for batch_size images of isl
patches each (q, k, v contiguous (b * s, h, d), vision.py:1226-1229; cu_seqlens the equal-length int32 offsets,
vision.py:126-138; softmax_scale the layer's, None for Qwen3-VL):
- VisionFlash3Attention: flash_attn_varlen_func(..., window_size=(-1, -1)) (vision.py:459-474);
- VisionFlash4Attention: flash_attn_varlen_func(..., ver=4) (vision.py:505-528);
- VisionTritonAttention: context_attention_fwd into a fresh output, is_causal=False (vision.py:389-407).
flash_attn_varlen_func and context_attention_fwd are the names vision.py binds (sglang.jit_kernel.flash_attention on
CUDA, triton_ops/prefill_attention.py). Each forward also derives seq_lens and max_seqlen from cu_seqlens per layer
and reads max_seqlen to the host (.item()); the runner derives them once, as the reference does, so the call is one
capturable kernel launch (the QKV and output projections are GEMMs, timed as such).
"""

from __future__ import annotations

from opcollect.runtime.contract import KernelLimit, Prepared

REFERENCE_NAMES = {"fa3": "flash_attention_v3", "fa4": "flash_attention_v4", "triton_attn": "triton"}
ATTN_DTYPES = ("bfloat16",)  # SGLang's ViT attention runs in the model dtype; it has no fp8 path
PREFIX = "visual.blocks.0.attn"


def check_case(case) -> None:
    if case.attn_dtype not in ATTN_DTYPES:
        raise KernelLimit(f"SGLang's vision attention runs bfloat16, not {case.attn_dtype}")


def footprint(case) -> int:
    """q, k, v and the output (bf16), the fp32 log-sum-exp, cu_seqlens and seq_lens."""
    tokens = case.batch_size * case.isl
    elements = tokens * case.num_heads * case.head_dim
    return 4 * elements * 2 + tokens * case.num_heads * 4 + (2 * case.batch_size + 1) * 4


def chosen_backend(case, device: str):
    """(SGLang's backend name, the implementation object, softmax_scale) of the VisionAttention Qwen3-VL builds,
    on this device and with the global server args."""
    import torch
    from sglang.srt.layers.attention.vision import QKV_BACKEND_IMPL, VisionAttention

    from opcollect.backends.sglang.context import sglang_context

    h, d = case.num_heads, case.head_dim
    with sglang_context(device), torch.device(device):
        layer = VisionAttention(
            embed_dim=h * d,
            num_heads=h,
            head_dim=d,  # Qwen3-VL passes head_size, which VisionAttention maps to head_dim (vision.py:921-927)
            projection_size=h * d,
            use_qkv_parallel=True,
            proj_bias=True,
            flatten_batch=True,
            quant_config=None,
            prefix=PREFIX,
            use_data_parallel=False,
            use_dp_attention_reduce=False,
            workspace_buffer=None,
        )
    impl = layer.qkv_backend
    names = [name for name, cls in QKV_BACKEND_IMPL.items() if type(impl) is cls]
    if not names:
        raise RuntimeError(f"SGLang built {type(impl).__name__}, which QKV_BACKEND_IMPL does not name")
    return names[0], impl, layer.softmax_scale


def kernel_call(name: str, inputs, cu_seqlens, seq_lens, max_seqlen: int, scale):
    """One call of the kernel the implementation named ``name`` runs, on the next copy's q, k, v."""
    import torch

    state = {"i": 0}

    def next_inputs():
        state["i"] = (state["i"] + 1) % len(inputs)
        return inputs[state["i"]]

    if name in ("fa3", "fa4"):
        from sglang.srt.layers.attention.vision import flash_attn_varlen_func

        def fa3() -> None:  # VisionFlash3Attention.forward (vision.py:459-474)
            q, k, v = next_inputs()
            flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens, max_seqlen_q=max_seqlen,
                                   max_seqlen_k=max_seqlen, softmax_scale=scale, window_size=(-1, -1))  # fmt: skip

        def fa4() -> None:  # VisionFlash4Attention.forward (vision.py:518-528)
            q, k, v = next_inputs()
            flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens, max_seqlen_q=max_seqlen,
                                   max_seqlen_k=max_seqlen, softmax_scale=scale, ver=4)  # fmt: skip

        return fa3 if name == "fa3" else fa4
    if name == "triton_attn":
        from sglang.srt.layers.attention.vision import context_attention_fwd

        def triton() -> None:  # VisionTritonAttention.forward (vision.py:389-407)
            q, k, v = next_inputs()
            output = torch.empty_like(q)
            context_attention_fwd(q, k, v, output, cu_seqlens, seq_lens, max_seqlen, is_causal=False, sm_scale=scale)

        return triton
    refuse(name)


def refuse(name: str) -> None:
    raise KernelLimit(f"SGLang chose the {name} vision attention; the runner times {', '.join(REFERENCE_NAMES)}")


def prepare(case, dispatch: str, device: str, copies: int) -> Prepared:
    check_case(case)
    name, _, scale = chosen_backend(case, device)
    if name not in REFERENCE_NAMES:
        refuse(name)
    import torch

    from opcollect.runtime.timing import random_tensor

    b, s, h, d = case.batch_size, case.isl, case.num_heads, case.head_dim
    with torch.device(device):
        # _get_cu_seqlens_for_shape (vision.py:126-138): one segment of s patches per image
        cu_seqlens = torch.arange(0, (b + 1) * s, step=s, dtype=torch.int32, device=device)
        seq_lens = cu_seqlens[1:] - cu_seqlens[:-1]
        shape = (b * s, h, d)
        inputs = [
            tuple(random_tensor(shape, torch.bfloat16, device, 3 * i + j) for j in range(3)) for i in range(copies)
        ]
    return Prepared(kernel_call(name, inputs, cu_seqlens, seq_lens, s, scale), REFERENCE_NAMES[name])
