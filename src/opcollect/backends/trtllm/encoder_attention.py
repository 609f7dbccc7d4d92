"""A vision tower's (non-causal) attention through TensorRT-LLM's TRTLLM attention backend, as its vision encoders
run it: no KV cache, every patch sees every patch of its image, RoPE applied before the backend.

Serving: the Qwen vision towers' attention (Qwen2_5_VLVisionAttention, models/modeling_qwen2vl.py index id 1138550119,
which modeling_qwen3vl.py @002f3cc3 imports for Qwen3-VL) is an Attention built with pos_embd_params=None and
rope_fusion=False, so create_attention(config.attn_backend, layer, heads, head_dim, heads, pos_embd_params=None,
quant_config) builds the backend (modules/attention.py Attention.__init__; Qwen2VLModelBase asserts the TRTLLM
backend); the tower builds the backend's Metadata with kv_cache_manager=None, one context request per image (its
patches), max_seq_len the longest (Qwen2_5_VisionModel.prepare_attn_metadata), and each layer applies the vision RoPE
itself, fuses q, k, v (Attention.convert_qkv: TrtllmAttention takes fused QKV) and calls the backend's forward with
attention_mask=PredefinedAttentionMask.FULL through Attention.forward_impl.

What is timed is that backend forward, as the reference collector times it (ai-dynamo/aiconfigurator
collector/trtllm/collect_attn_encoder.py, written for 1.3.0rc20): create_attention("TRTLLM", 0, heads, head_dim,
num_kv_heads=heads, pos_embd_params=None, quant_config without quantization, is_mla_enable=False); a
TrtllmAttentionMetadata with kv_cache_manager=None, _max_seq_len_storage=isl (the no-cache max_seq_len),
KVCacheParams(use_cache=False), batch_size context requests of isl tokens each, prepare(); forward(qkv, None, None,
metadata, attention_mask=PredefinedAttentionMask.FULL) on a fused [b * isl, 3 * heads * head_dim] bf16 QKV. The
vision RoPE, the QKV concatenation and the projections are outside it, as in the reference.

Differences from the collector: ``copies`` input sets (each its own QKV) share one prepared metadata, cycled by call()
so the reads come from HBM; one forward per set runs before timing (the op grows the workspace at its first call,
which must not fall into the harness's graph capture), followed by a device sync.

kernel_source: torch_flow for the TrtllmAttention create_attention built (the reference's label,
collect_attn_encoder.py); another class shows as torch_flow_<its name> (attention_inputs.kernel_source).
"""

from __future__ import annotations

import os

from opcollect.backends.trtllm import torch_ops
from opcollect.backends.trtllm.attention_inputs import MAX_TRTLLM_HEAD_DIM, kernel_source
from opcollect.backends.trtllm.context import SERVED_VERSIONS, one_rank_mapping, prepare_metadata, quant_config
from opcollect.runtime.contract import KernelLimit, Prepared, Runner
from opcollect.runtime.timing import random_tensor

# the collector leaves out cases whose QKV, output and scratch reach 2^31 bytes ("32-bit indexing safety",
# collect_attn_encoder.py: 4 * b * s * n * head_dim * 2 >= 2**31)
INDEX_LIMIT_BYTES = 2**31
BYTES = 2  # bf16: TensorRT-LLM's encoder path has no fp8 (collect_attn_encoder.py module docstring)


def check_case(case) -> None:
    """Refusals before anything is built (no import)."""
    if case.attn_dtype != "bfloat16":
        raise KernelLimit(f"TensorRT-LLM's encoder attention runs bfloat16 only, not {case.attn_dtype}")
    if min(case.batch_size, case.isl, case.num_heads, case.head_dim) < 1:
        raise KernelLimit(f"an empty encoder attention case: {tuple(case)}")
    if case.head_dim > MAX_TRTLLM_HEAD_DIM:
        # AttentionOp::initialize aborts the process on a head size it has no kernel for (attention_inputs.refusal)
        raise KernelLimit(f"TrtllmAttention aborts on head_dim {case.head_dim} > {MAX_TRTLLM_HEAD_DIM}")
    if 4 * tokens(case) * case.num_heads * case.head_dim * BYTES >= INDEX_LIMIT_BYTES:
        raise KernelLimit(
            f"QKV and output of {tokens(case)} tokens x {case.num_heads} heads x {case.head_dim} reach 2^31 bytes "
            "(int32 offsets; the reference collector leaves these out)"
        )


def tokens(case) -> int:
    return case.batch_size * case.isl


def qkv_shape(case) -> tuple[int, int]:
    """Fused QKV of every patch of every image (TrtllmAttention.support_fused_qkv; MHA: as many KV heads as heads)."""
    return (tokens(case), 3 * case.num_heads * case.head_dim)


def footprint(case) -> int:
    """Bytes of one input set: the fused QKV, the output, a QKV-sized stand-in for the workspace the op sizes at its
    first call (context FMHA stages QKV there, as attention_inputs.footprint counts it) and the per-request lengths."""
    qkv = tokens(case) * 3 * case.num_heads * case.head_dim * BYTES
    out = tokens(case) * case.num_heads * case.head_dim * BYTES
    return 2 * qkv + out + case.batch_size * 4 * 4


def build_metadata(metadata_cls, case, device: str):
    """The no-cache metadata of a batch of batch_size images of isl patches each, prepared (collect_attn_encoder.py;
    Qwen2_5_VisionModel.prepare_attn_metadata)."""
    import torch
    from tensorrt_llm._torch.attention_backend.interface import AttentionRuntimeFeatures
    from tensorrt_llm._torch.metadata import KVCacheParams

    lens = [case.isl] * case.batch_size
    kwargs = {}
    if "workspace" in getattr(metadata_cls, "__dataclass_fields__", {}):
        kwargs["workspace"] = torch.empty(0, dtype=torch.int8, device=device)  # sized by the op at its first call
    metadata = metadata_cls(
        max_num_requests=case.batch_size,
        max_num_tokens=tokens(case),
        _max_seq_len_storage=case.isl,  # no KV cache manager to read max_seq_len from
        kv_cache_manager=None,
        mapping=one_rank_mapping(),
        enable_flash_mla=False,
        seq_lens=torch.tensor(lens, dtype=torch.int32, device="cpu"),
        num_contexts=case.batch_size,
        position_ids=None,
        kv_cache_params=KVCacheParams(use_cache=False),
        cross=None,
        request_ids=list(range(case.batch_size)),
        prompt_lens=lens,
        runtime_features=AttentionRuntimeFeatures(
            chunked_prefill=False, cache_reuse=False, has_speculative_draft_tokens=False
        ),
        all_rank_num_tokens=None,
        **kwargs,
    )
    return prepare_metadata(metadata)


def prepare(case, dispatch: str, device: str, copies: int) -> Prepared:
    check_case(case)
    torch_ops.check_installed("encoder_attention")
    import torch
    from tensorrt_llm._torch.attention_backend.interface import PredefinedAttentionMask
    from tensorrt_llm._torch.attention_backend.utils import create_attention

    # as the collector: XQA serves decode only, the encoder's one pass is a context FMHA
    os.environ["TRTLLM_ENABLE_XQA_JIT"] = "0"
    attn = create_attention(
        backend_name="TRTLLM",
        layer_idx=0,
        num_heads=case.num_heads,
        head_dim=case.head_dim,
        num_kv_heads=case.num_heads,
        pos_embd_params=None,  # the vision RoPE is applied before the backend
        quant_config=quant_config("bfloat16"),
        is_mla_enable=False,
    )
    metadata = build_metadata(type(attn).Metadata, case, device)
    mask = PredefinedAttentionMask.FULL
    qkvs = [random_tensor(qkv_shape(case), torch.bfloat16, device, i) for i in range(copies)]
    for qkv in qkvs:  # the op sizes its workspace at the first call: outside the harness's graph capture
        attn.forward(qkv, None, None, metadata, attention_mask=mask)
    if device.startswith("cuda"):
        torch.cuda.synchronize(torch.device(device))
    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        attn.forward(qkvs[i], None, None, metadata, attention_mask=mask)

    return Prepared(call, kernel_source(type(attn).__name__))


RUNNERS = {"encoder_attention": (Runner(footprint, prepare, versions=SERVED_VERSIONS),)}
