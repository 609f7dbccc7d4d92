"""Vision-tower attention through vLLM 0.24.0's MMEncoderAttention, the layer Qwen2.5-VL's and Qwen3-VL's vision blocks
call (model_executor/models/qwen2_5_vl.py:390-395, 443-450; Qwen3-VL's blocks use that attention, qwen3_vl.py:430-436),
with the ViT backend vLLM selects on the device.

The layer is built under the current VllmConfig with bf16 as torch's default dtype (the backend selector reads it,
model_executor/layers/attention/mm_encoder_attention.py:348-369) and serving's default MultiModalConfig (no backend
override, no fp8 attention: vision.py:99-125, mm_encoder_attention.py:389-395). A batch is served as Qwen3-VL's vision
tower serves it: all images in one sequence of batch_size * isl patches, cu_seqlens marking the images
(qwen3_vl.py:735-741), max_seqlen, sequence_lengths and the backend's cu_seqlens from MMEncoderAttention's own
class methods (qwen3_vl.py:765-789). q and k are the two halves of one rotated buffer, v a strided view of the fused
qkv projection (qwen2_5_vl.py:413-439), and each call runs layer(query, key, value, cu_seqlens, max_seqlen,
sequence_lengths) as the vision block does; the QKV projection, rope and output projection stay outside the time.

kernel_source is read from the layer vLLM built, named as the reference collector names it (collector/vllm/
collect_attn_encoder.py): FLASH_ATTN -> vllm_vit_flash_attn_fa{layer._fa_version} (mm_encoder_attention.py:359-368;
FA3 on Hopper, fa_utils.py:77-80), any other backend -> vllm_vit_<enum name, lower case> (e.g. vllm_vit_torch_sdpa).
"""

from __future__ import annotations

from opcollect.runtime.contract import KernelLimit, Prepared

BF16_BYTES = 2
PREFIX = "opcollect.visual.blocks.0.attn.attn"  # a vision block's attention name, as Qwen3-VL prefixes it
TP_SIZE = 1  # one rank: the whole vision hidden size is h * head_dim


def check_case(case) -> None:
    if case.attn_dtype != "bfloat16":
        raise KernelLimit(
            f"vLLM's vision attention runs in the model dtype; the runner serves bf16, not {case.attn_dtype}"
        )


def footprint(case) -> int:
    """The rotated q/k buffer (2 x), the fused qkv projection v is read from (3 x), the output (1 x), cu_seqlens."""
    tokens = case.batch_size * case.isl
    per_token = case.num_heads * case.head_dim * BF16_BYTES
    return tokens * per_token * (2 + 3 + 1) + (case.batch_size + 1) * 4


def kernel_source(layer) -> str:
    backend = layer.attn_backend
    if backend.name == "FLASH_ATTN" and layer._fa_version is not None:
        return f"vllm_vit_flash_attn_fa{layer._fa_version}"
    return f"vllm_vit_{backend.name.lower()}"


def cu_seqlens_of(batch_size: int, isl: int):
    """Qwen3-VL's cu_seqlens for batch_size images of isl patches each, one frame apiece (qwen3_vl.py:735-741)."""
    import numpy as np

    return np.arange(0, (batch_size + 1) * isl, isl, dtype=np.int32)


def prepare(case, dispatch: str, device: str, copies: int) -> Prepared:
    check_case(case)
    import torch
    from vllm.config import MultiModalConfig, set_current_vllm_config
    from vllm.model_executor.layers.attention.mm_encoder_attention import MMEncoderAttention

    from opcollect.backends.vllm.context import vllm_context
    from opcollect.runtime.timing import random_tensor

    dtype = torch.bfloat16
    b, s, h, d = case.batch_size, case.isl, case.num_heads, case.head_dim
    with vllm_context(device) as config:
        config.model_config.multimodal_config = MultiModalConfig()  # serving's defaults
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)  # the model loader's dtype, which the ViT backend selector reads
        try:
            with torch.device(device):
                layer = MMEncoderAttention(num_heads=h, head_size=d, scale=d**-0.5, prefix=PREFIX)
                layer.process_weights_after_loading(dtype)  # the loader's pass; a no-op without fp8 attention
        finally:
            torch.set_default_dtype(previous)
        backend = layer.attn_backend
        source = kernel_source(layer)
        cu = cu_seqlens_of(b, s)
        sequence_lengths = MMEncoderAttention.maybe_compute_seq_lens(backend, cu, torch.device(device))
        # kept on the CPU, as serving keeps it: the FA wrapper reads it with .item() (qwen3_vl.py:776-779)
        max_seqlen = torch.tensor(MMEncoderAttention.compute_max_seqlen(backend, cu), dtype=torch.int32)
        cu_seqlens = MMEncoderAttention.maybe_recompute_cu_seqlens(backend, cu, h * d, TP_SIZE, torch.device(device))
        tokens = b * s
        qks = [random_tensor((2, 1, tokens, h, d), dtype, device, i) for i in range(copies)]
        qkvs = [random_tensor((1, tokens, 3, h, d), dtype, device, 100 + i) for i in range(copies)]
    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        q, k = qks[i].unbind(dim=0)
        with set_current_vllm_config(config, check_compile=False):
            layer(
                query=q,
                key=k,
                value=qkvs[i][:, :, 2],
                cu_seqlens=cu_seqlens,
                max_seqlen=max_seqlen,
                sequence_lengths=sequence_lengths,
            )

    return Prepared(call, source)
