"""What the SGLang backend's kernel_source labels mean in CUDA kernel names (backends/kernels.py).

Names as the kernels are called in SGLang 0.5.14 and sglang-kernel 0.4.4 (the wheels under .cache/wheels; the
libraries' symbols demangled, the Triton and JIT sources read; paths relative to the sglang wheel):
- sgl_kernel/flash_ops.abi3.so: cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<..>>>
  (FA3: the fa3 attention backend, the MLA backend, the vision tower's flash_attention_v3).
- sgl_kernel/sm90/common_ops.abi3.so: cutlass_3x_gemm_sm90_fp8<..> (fp8_scaled_mm), per_token_quant_fp8_kernel and
  per_token_quant_fp8_small_batch_kernel (sgl_per_token_quant_fp8), bmm_fp8 through cuBLASLt.
- Triton (srt/layers/): scaled_mm_kernel (quantization/fp8_kernel.py:2049), _w8a8_block_fp8_matmul (:876, :968),
  _static_quant_fp8 (:767), fused_moe_kernel (moe/moe_runner/triton_utils/fused_moe_triton_kernels.py:324), the
  triton attention backend's _fwd_kernel (attention/triton_ops/extend_attention.py:240) and _fwd_kernel_stage1/
  _fwd_grouped_kernel_stage1/_fwd_kernel_stage2 (decode_attention.py:45, :253, :523).
- JIT: device::marlin::Marlin (jit_kernel/csrc/gemm/marlin/marlin_template.h:54, gptq_marlin_gemm) and the MoE
  Marlin of jit_kernel/moe_wna16_marlin.py; DeepGEMM's deep_gemm::sm90_fp8_gemm_* (deep_gemm.gemm_nt_f8f8bf16).
- FlashInfer's CUTLASS fused MoE is TensorRT-LLM's cutlass MoE (CUTLASS grouped GEMMs, expandInputRowsKernel,
  finalizeMoeRoutingKernel).
- cuBLAS (torch linear and bmm): sm90_xmma_gemm_*, nvjet_*, cutlass_*, *gemv*.
"""

from __future__ import annotations

from opcollect.backends.kernels import Meaning

CUBLAS = r"gemm|gemv|nvjet|xmma|cutlass|splitKreduce"
FA3 = r"FlashAttnFwdSm90"
ROW_RUNNER = "a row runner: it times the op on every rank at once and observes no kernels"

KERNELS = {
    # gemm
    "sglang_torch_linear": Meaning((CUBLAS,)),
    "sglang_sgl_kernel_fp8_scaled_mm": Meaning((r"cutlass_3x_gemm",)),
    "sglang_triton_scaled_mm": Meaning((r"scaled_mm_kernel",)),
    "sglang_triton_w8a8_block_fp8": Meaning((r"_w8a8_block_fp8_matmul",)),
    "sglang_deepgemm_gemm_nt_f8f8bf16": Meaning((r"deep_gemm|fp8_gemm_kernel",)),
    "sglang_gptq_marlin_gemm": Meaning((r"marlin",)),
    # quantize: compute_scale's row observes nothing (two timed ops per row); scale_matrix runs the static Triton quant
    "sglang": Meaning((r"_static_quant_fp8|per_token_quant_fp8",)),
    # attention
    "fa3": Meaning((FA3,)),
    "triton": Meaning((r"(?<!flash)_fwd_(grouped_)?kernel",)),  # not FA2's flash_fwd_kernel
    "flash_attention": Meaning((FA3,)),
    "flash_attention_v3": Meaning((FA3,)),
    # moe
    "sglang_fused_moe_triton": Meaning((r"fused_moe_kernel",)),
    "sglang_marlin_moe": Meaning((r"marlin",)),
    "sglang_marlin_moe_situ_as_silu": Meaning((r"marlin",)),
    "sglang_flashinfer_cutlass_moe": Meaning((r"cutlass|expandInputRows|finalizeMoeRouting",)),
    # mla_bmm
    "sglang_torch_bmm": Meaning((CUBLAS,)),
    "sglang_sgl_kernel_bmm_fp8": Meaning((CUBLAS,)),
    # mhc (srt/layers/mhc.py; TileLang names a kernel after its function, + _kernel): the tilelang pre ends in
    # mhc_pre_big_fuse(_with_norm)_tilelang; the DeepGEMM or torch product feeds hc_split_sinkhorn_kernel_ instead
    "sglang_tilelang_mhc_pre": Meaning((r"mhc_pre_big_fuse",)),
    "sglang_deepgemm_mhc_pre": Meaning((r"hc_split_sinkhorn",)),
    "sglang_torch_mhc_pre": Meaning((r"hc_split_sinkhorn",)),
    "sglang_tilelang_mhc_post": Meaning((r"mhc_post_tilelang",)),
    # GLM-5's DSA kernels (backends/sglang/dsa_kernels.py): DeepGEMM's JIT sm90/sm100_fp8_mqa_logits (not its paged
    # twin); sgl_kernel's sm90/common_ops.abi3.so top-k, (anonymous namespace)::topk_transform_{prefill,decode}_kernel
    # (fused) and ::topk_kernel (fast_topk_v2); flashmla_ops.abi3.so's sm90::fwd / sm100::fwd sparse_attn_fwd_kernel
    "deep_gemm.fp8_mqa_logits": Meaning((r"(?<!paged_)fp8_mqa_logits",)),
    "fast_topk_transform_fused": Meaning((r"topk_transform_(prefill|decode)_kernel",)),
    "fast_topk_v2": Meaning((r"(?<![a-z_])topk_kernel",)),
    "flash_mla_sparse_fwd": Meaning((r"sparse_attn_fwd",)),
    # the DSA modules (backends/sglang/dsa.py) on SM90, named for the attention kernel beside the indexer's: the dense
    # prefill's and the bf16 decode's FA3 (dsa_backend.py _forward_standard_mha, _forward_fa3), FlashMLA's sparse
    # prefill (sm90::fwd::sparse_attn_fwd_kernel) and its fp8 sparse kernel of flashmla_kv
    # (sm90::decode::sparse_fp8::flash_fwd_splitkv_mla_fp8_sparse_kernel)
    "sglang_dsa_dense_mha_fa3": Meaning((FA3,)),
    **{
        f"sglang_dsa_{mode}_{impl}": Meaning((pattern,))
        for mode in ("indexer", "skip_indexer")
        for impl, pattern in (("fa3", FA3), ("flashmla_sparse", r"sparse_attn_fwd"), ("flashmla_kv", r"mla_fp8_sparse"))
    },
    # DeepSeek-V4's CSA indexer kernels (backends/sglang/dsv4_kernels.py): DeepGEMM's JIT
    # sm90/sm100_fp8_paged_mqa_logits, or the indexer's torch fallbacks (srt/layers/attention/dsv4/indexer.py:49-221:
    # gathers, a bmm or einsum, relu); the JIT top-k of jit_kernel/csrc/deepseek_v4/: v1's topk_transform_kernel
    # (topk_v1.cuh:231), v2's topk_short_transform, topk_combine_preprocess/_transform and topk_fused_transform
    # (topk_v2.cuh:230-322), and the torch fallback's aten topk (indexer.py:223-306)
    "deep_gemm.fp8_paged_mqa_logits": Meaning((r"fp8_paged_mqa_logits",)),
    "fp8_paged_mqa_logits_torch": Meaning((CUBLAS,)),
    "fp8_paged_mqa_logits_torch_sm120": Meaning((CUBLAS,)),
    "topk_transform": Meaning((r"(?<![a-z_])topk_transform_kernel|topk_(short|combine|fused)_transform",)),
    "topk_transform_v1": Meaning((r"(?<![a-z_])topk_transform_kernel",), serves=("topk_transform",)),
    "topk_transform_v2": Meaning(
        (r"topk_(short|combine|fused)_transform|topk_combine_preprocess",), serves=("topk_transform",)
    ),
    "topk_transform_512_pytorch_vectorized": Meaning((r"topk|sort",)),
    # DeepSeek-V4's attention modules (backends/sglang/dsv4.py), under the reference's label of the dsv4 backend:
    # FlashMLA's sparse prefill (flash_mla_sparse_fwd, deepseek_v4_backend.py:1476-1548: sparse_attn_fwd_kernel) and
    # fp8 sparse decode (flash_mla_with_kvcache, :1434-1436: flash_fwd_splitkv_mla_fp8_sparse_kernel)
    "compressed_flashmla": Meaning((r"sparse_attn_fwd", r"mla_fp8_sparse", r"sparse_fp8")),
    # Gated DeltaNet (gdn.py): the Triton kernels named after their @triton.jit functions, _causal_conv1d_fwd_kernel and
    # _causal_conv1d_update_kernel (srt/layers/attention/mamba/causal_conv1d_triton.py:19, :575), FLA's chunk kernels
    # (fla/chunk_delta_h.py:53, chunk_o.py:30) and fused_recurrent_gated_delta_rule_packed_decode_kernel
    # (fla/fused_recurrent.py:186)
    "causal_conv1d_fn": Meaning((r"_causal_conv1d_fwd_kernel",)),
    "causal_conv1d_update": Meaning((r"_causal_conv1d_update_kernel",)),
    "chunk_gated_delta_rule": Meaning((r"chunk_gated_delta_rule_fwd_kernel|chunk_fwd_kernel_o",)),
    "fused_recurrent_gated_delta_rule_packed_decode": Meaning((r"fused_recurrent_gated_delta_rule_packed_decode",)),
    # communication
    "NCCL": Meaning(unobservable=ROW_RUNNER),
    "SGLang_CustomAllReduce_eager": Meaning(unobservable=ROW_RUNNER),
    "SGLang_CustomAllReduce_graph": Meaning(unobservable=ROW_RUNNER),
}
