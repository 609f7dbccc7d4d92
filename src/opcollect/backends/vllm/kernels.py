"""What the vLLM backend's kernel_source labels mean in CUDA kernel names (backends/kernels.py).

Names as the kernels are called in vLLM 0.24.0's wheel (vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl, read from
the __device_stub__ symbols of its libraries, demangled) and in its Triton sources (the kernel is named after the
@triton.jit function):
- vllm_flash_attn/_vllm_fa3_C.abi3.so: cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<..>>>;
  _vllm_fa2_C.abi3.so: flash::flash_fwd_kernel<..>, flash::flash_fwd_splitkv_kernel<..> (FA2, the non-Hopper path).
- FA4 is CuTe DSL, compiled at run time: its kernels carry their class name, FlashAttentionForwardSm90/Sm100
  (vllm_flash_attn/cute/flash_fwd_sm90.py:51, flash_fwd_sm100.py:113).
- _flashmla_C.abi3.so / _flashmla_extension_C.abi3.so: sm90::flash_fwd_splitkv_mla_kernel, flash::
  flash_fwd_splitkv_mla_kernel (FlashMLA decode); sm90::fwd::sparse_attn_fwd_kernel,
  sm90::decode::sparse_fp8::flash_fwd_splitkv_mla_fp8_sparse_kernel (FlashMLA sparse).
- _C_stable_libtorch.abi3.so: cutlass::device_kernel<vllm::cutlass_3x_gemm_sm90_fp8<..>> (per-tensor fp8),
  cutlass::device_kernel<vllm::cutlass_3x_gemm_fp8_blockwise<..>> (block fp8), cutlass::device_kernel<..machete::
  MacheteCollectiveMma..> (Machete), marlin::Marlin<..> (Marlin), vllm::scaled_fp8_quant_kernel_strided_group_shape
  (static fp8 quant), vllm::dynamic_per_token_scaled_fp8_quant_kernel_strided, vllm::reshape_and_cache_flash_kernel.
- _moe_C_stable_libtorch.abi3.so: marlin_moe_wna16::Marlin<..>; expandInputRowsKernel, finalizeMoeRoutingKernel.
- third_party/deep_gemm/include/deep_gemm/impls/sm90_fp8_gemm_1d2d.cuh:48 deep_gemm::sm90_fp8_gemm_1d2d_impl (JIT).
- FlashInfer's block fp8 GEMM on SM90 is TensorRT-LLM's, namespace tensorrt_llm::kernels::fp8_blockscale_gemm
  (flashinfer.gemm.fp8_blockscale_gemm_sm90, vllm/utils/flashinfer.py:910); its CUTLASS fused MoE is TensorRT-LLM's
  cutlass MoE (CUTLASS grouped GEMMs, expandInputRowsKernel, finalizeMoeRoutingKernel).
- Triton: fused_moe_kernel (model_executor/layers/fused_moe/fused_moe.py:293), kernel_unified_attention
  (v1/attention/ops/triton_unified_attention.py:179), _matmul_ogs/_p_matmul_ogs (third_party/triton_kernels/
  matmul_ogs_details/_matmul_ogs.py:33, _p_matmul_ogs.py:81).
- cuBLAS (torch.nn.functional.linear, torch.bmm): sm90_xmma_gemm_*, nvjet_*, cutlass_*, *gemv*.
"""

from __future__ import annotations

from opcollect.backends.kernels import Meaning

CUBLAS = r"gemm|gemv|nvjet|xmma|cutlass|splitKreduce"
FA3 = r"FlashAttnFwdSm90"
ROW_RUNNER = "a row runner: it times the op on every rank at once (or two ops for one row) and observes no kernels"

KERNELS = {
    # gemm
    "torch.nn.functional.linear": Meaning((CUBLAS,)),
    "CutlassFP8ScaledMMLinearKernel": Meaning((r"cutlass_3x_gemm(_sm\d+)?_fp8\b|cutlass_3x_gemm<",)),
    "CutlassFp8BlockScaledMMKernel": Meaning((r"cutlass_3x_gemm_fp8_blockwise",)),
    "DeepGemmFp8BlockScaledMMKernel": Meaning((r"deep_gemm|fp8_gemm_kernel",)),
    "FlashInferFp8BlockScaledMMKernel": Meaning((r"fp8_blockscale|flashinfer",)),
    "MacheteLinearKernel": Meaning((r"machete",)),
    "MarlinLinearKernel": Meaning((r"marlin",)),
    # quantize: compute_scale's row runner times two ops per row; scale_matrix is the static quant alone
    "dynamic_per_token_scaled_fp8_quant_minus_static_scaled_fp8_quant": Meaning(unobservable=ROW_RUNNER),
    "static_scaled_fp8_quant": Meaning((r"scaled_fp8_quant_kernel_strided_group_shape",)),
    # attention
    "vllm_flash_attn_fa3": Meaning((FA3,)),
    "vllm_flash_attn_fa4": Meaning((r"FlashAttentionForwardSm\d+",)),
    "vllm_flash_attn_fa2": Meaning((r"flash::flash_fwd_(splitkv_)?kernel",)),
    "vllm_triton_attn": Meaning((r"kernel_unified_attention",)),
    "vllm_vit_flash_attn_fa3": Meaning((FA3,)),
    # the MLA module: the backend of its attention (the prefill backend when the batch has a prefill part)
    "FLASHMLA": Meaning((r"flash_fwd_splitkv_mla",)),
    "FLASH_ATTN_MLA": Meaning((FA3,)),
    "FLASH_ATTN": Meaning((FA3, r"flash::flash_fwd_(splitkv_)?kernel")),
    # the DSA module: its sparse backend's FlashMLA kernels (_flashmla_C.abi3.so), sm90::fwd::sparse_attn_fwd_kernel
    # (a bf16 cache, prefill and decode; an fp8 prefill from 32 heads, over its bf16 upconversion) and
    # sm90::decode::sparse_fp8::flash_fwd_splitkv_mla_fp8_sparse_kernel (fp8_ds_mla decodes, and prefills below 32
    # heads), v1/attention/backends/mla/flashmla_sparse.py:515-520, 610-855; sm100:: namesakes on Blackwell
    "FLASHMLA_SPARSE": Meaning((r"sparse_attn_fwd", r"mla_fp8_sparse")),
    # the MSA module (MiniMax-M3): the attend impl vLLM built (models/minimax_m3/common/sparse_attention.py:391-422).
    # Triton's kernels are named after their @triton.jit functions, _gqa_sparse_fwd_kernel (prefill) and
    # _gqa_sparse_decode_kernel (decode), common/ops/sparse_attn.py:76, :233; the MSA impl prefills with fmha_sm100's
    # CuTe DSL SparseAttentionForwardSm100 (third_party/fmha_sm100/cute/src/sm100/fwd/atten_fwd.py:56) and decodes
    # with the Triton kernel (nvidia/sparse_attention_msa.py:52-66)
    "MiniMaxM3SparseTritonImpl": Meaning((r"_gqa_sparse_(fwd|decode)_kernel",)),
    "MiniMaxM3SparseMSAImpl": Meaning((r"SparseAttentionForward", r"fmha_sm100", r"_gqa_sparse_decode_kernel")),
    # DeepSeek-V4's attention (models/deepseek_v4/nvidia/flashmla.py): FlashMLA's sparse prefill (flash_mla_sparse_fwd)
    # and fp8 sparse decode (flash_mla_with_kvcache), the kernels FLASHMLA_SPARSE names; the HCA row times them alone
    "FLASHMLA_SPARSE_DSV4": Meaning((r"sparse_attn_fwd", r"mla_fp8_sparse", r"sparse_fp8")),
    # DeepGEMM's paged MQA logits (vllm/utils/deep_gemm.py:565 -> deep_gemm.fp8_fp4_paged_mqa_logits, JIT-compiled
    # deep_gemm::sm90_fp8_paged_mqa_logits / sm100_fp8_fp4_paged_mqa_logits)
    "vllm.utils.deep_gemm.fp8_fp4_paged_mqa_logits": Meaning((r"paged_mqa_logits",)),
    "vllm_torch_bmm": Meaning((CUBLAS,)),
    # moe
    "vllm_unquantizedfusedmoe_triton_tritonexperts": Meaning((r"fused_moe_kernel",)),
    "vllm_fp8moe_triton_tritonexperts": Meaning((r"fused_moe_kernel",)),
    "vllm_fp8moe_flashinfer_cutlass_flashinferexperts": Meaning((r"cutlass|expandInputRows|finalizeMoeRouting",)),
    "vllm_modeloptfp8moe_flashinfer_cutlass_flashinferexperts": Meaning(
        (r"cutlass|expandInputRows|finalizeMoeRouting",)
    ),
    "vllm_compressedtensorswna16marlinmoe_marlin_marlinexperts": Meaning((r"marlin",)),
    "vllm_compressedtensorsw4a4mxfp4moe_marlin_marlinexperts_situ_as_silu": Meaning((r"marlin",)),
    "vllm_gptossmxfp4moe_triton_oaitritonmxfp4expertsmonolithic": Meaning((r"matmul_ogs",)),
    # mhc (model_executor/kernels/mhc/tilelang.py): TileLang names a kernel after its function, + _kernel
    # (mhc_pre_big_fuse_tilelang_kernel, mhc_post_tilelang_kernel); pre's product is DeepGEMM's
    # deep_gemm::sm90_tf32_hc_prenorm_gemm_impl, or TileLang's hc_prenorm_gemm_tilelang without DeepGEMM
    "vllm.model_executor.kernels.mhc.tilelang.mhc_pre_tilelang": Meaning((r"mhc_pre_big_fuse",)),
    "vllm.model_executor.kernels.mhc.tilelang.mhc_post_tilelang": Meaning((r"mhc_post_tilelang",)),
    # Gated DeltaNet (gdn.py): the Triton kernels named after their @triton.jit functions, _causal_conv1d_fwd_kernel and
    # _causal_conv1d_update_kernel (model_executor/layers/mamba/ops/causal_conv1d.py:16, :749),
    # fused_recurrent_gated_delta_rule_packed_decode_kernel (fla/ops/fused_recurrent.py:256) and FLA's chunk kernels
    # (fla/ops/chunk_delta_h.py:43, chunk_o.py:42, wy_fast.py:29, chunk_scaled_dot_kkt.py:36); FlashInfer's SM90 GDN
    # prefill is its CUTLASS kernel of namespace flat (csrc/flat/hopper/kernel/
    # flat_kernel_tma_warpspecialized_delta_rule.hpp), behind ChunkGatedDeltaRule.forward_cuda (gdn/
    # qwen_gdn_linear_attn.py:241-343)
    "causal_conv1d_fn": Meaning((r"_causal_conv1d_fwd_kernel",)),
    "causal_conv1d_update": Meaning((r"_causal_conv1d_update_kernel",)),
    "chunk_gated_delta_rule_triton": Meaning(
        (r"chunk_gated_delta_rule_fwd_kernel|chunk_fwd_kernel_o|recompute_w_u_fwd",)
    ),
    "chunk_gated_delta_rule_flashinfer": Meaning((r"flat::|DeltaRule",)),
    "fused_recurrent_gated_delta_rule_packed_decode": Meaning((r"fused_recurrent_gated_delta_rule_packed_decode",)),
    # communication
    "NCCL": Meaning(unobservable=ROW_RUNNER),
    "vLLM_custom_eager": Meaning(unobservable=ROW_RUNNER),
    "vLLM_custom_graph": Meaning(unobservable=ROW_RUNNER),
}
