"""What the TensorRT-LLM backend's kernel_source labels mean in CUDA kernel names (backends/kernels.py).

TensorRT-LLM labels its rows coarsely, as the reference collector does: torch_flow is every GEMM of the PyTorch flow
and its attention too, so the meaning of that label is given per op. Kernel names, from TensorRT-LLM's sources (no
wheel of the pinned release candidate is on this machine; the names below were matched in TensorRT-LLM's and
FlashInfer's public sources):
- context attention: the fmha_v2 cubins, fmha_v2_flash_attention_<dtype>_<tiles>_S_q_paged_kv_<head>_..._sm90_kernel
  (cpp/kernels/fmha_v2 generated launchers, run_fmha_v2_flash_attention_bf16_64_128_S_q_paged_kv_*_tma_ws_sm90);
- generation attention: XQA's kernel_mha (cpp/kernels/xqa/mha.cu, mha_sm90.cu), else masked_multihead_attention_kernel
  (decoderMaskedMultiheadAttention);
- MLA: the same fmha_v2 (context) and XQA or FlashMLA's flash_fwd_splitkv_mla_kernel (generation);
- GEMMs: cuBLAS/cuBLASLt (sm90_xmma_gemm_*, nvjet_*) for bf16 and per-tensor fp8, TensorRT-LLM's block fp8 GEMM in
  namespace tensorrt_llm::kernels::fp8_blockscale_gemm (also its fp8 block-scaling BMM), CUTLASS mixed-dtype
  (fpA_intB) GEMMs for weight-only int4;
- MoE: the CUTLASS MoE GEMMs with expandInputRowsKernel/finalizeMoeRoutingKernel (CutlassFusedMoE), triton_kernels'
  _matmul_ogs (TritonFusedMoE);
- quantize: tensorrt_llm::common::scaleMatrix and computeFP8QuantizeScale (cpp/tensorrt_llm/common/cudaFp8Utils.cu);
- its own all-reduce: the ar_fusion allreduce_fusion_kernel_oneshot_lamport/_twoshot_sync kernels, or NCCL's
  ncclDevKernel_AllReduce_* (allreduce.py RAN_KERNELS; the runner hands its dry run's kernels in as observed).
"""

from __future__ import annotations

from opcollect.backends.kernels import Meaning

GEMMS = r"gemm|gemv|nvjet|xmma|cutlass|fp8_blockscale|fpA_intB|splitKreduce"
ATTENTION = r"fmha|kernel_mha|xqa|masked_multihead_attention|mmha"
ATTENTION_OPS = ("attention_context", "attention_generation", "encoder_attention")
CUTLASS_MOE = r"cutlass|moe_gemm|expandInputRows|finalizeMoeRouting"
ROW_RUNNER = "a row runner: it times the op on every rank at once (or two ops for one row) and observes no kernels"

KERNELS = {
    "torch_flow": (Meaning((GEMMS,), ops=("gemm",)), Meaning((ATTENTION,), ops=ATTENTION_OPS)),
    "torch_flow_flashinfer": Meaning((r"flashinfer|BatchPrefill|BatchDecode",)),
    "deepgemm": Meaning((r"deep_gemm|fp8_gemm_kernel",)),
    "default": (
        # the DSA module (dsa.py): FlashMLA's sparse MLA on SM90 (sparse_attn_fwd_kernel, the fp8 sparse decode),
        # trtllm-gen's on SM100 (fmha), the indexer's DeepGEMM fp8 MQA logits and TensorRT-LLM's top-k
        Meaning((r"sparse|mqa_logits|topk|fmha",), ops=("dsa_context_module", "dsa_generation_module")),
        Meaning((ATTENTION + r"|flash_fwd_splitkv_mla",)),  # MLA and the MLA module
    ),
    "moe_torch_flow": Meaning((r"matmul_ogs|fused_moe|" + CUTLASS_MOE + r"|bmm_",)),  # Triton, or TRTLLMGen's bmm_
    "moe_torch_flow_cutlass": Meaning((CUTLASS_MOE,)),
    "moe_torch_flow_nongated": Meaning((r"matmul_ogs|" + CUTLASS_MOE,)),
    "moe_torch_flow_triton_fp8_block": Meaning((r"fused_moe_kernel|matmul_ogs",)),
    "trtllm_bmm_out": Meaning((r"gemm|gemv|nvjet|xmma|cutlass|splitKreduce",)),
    "trtllm_fp8_block_scaling_bmm_out": Meaning((r"fp8_blockscale|block_scaling",)),
    "trtllm_bmm_out_dequant_bf16": Meaning((r"gemm|gemv|nvjet|xmma|cutlass|splitKreduce",)),
    # compute_scale's row times two ops and observes nothing; scale_matrix (prepared) runs the static quant
    "torch_ops": Meaning((r"scaleMatrix|computeFP8QuantizeScale|quantize",)),
    # mHC (cpp/tensorrt_llm/kernels/mhcKernels/mhcKernels.cu): pre's GEMM + square sum is mhcGemmSqrsumFmaKernel (fma)
    # or DeepGEMM's tf32_hc_prenorm_gemm (dg_*), then mhcBigFuseKernel; post is mhcPostMappingKernel alone
    "trtllm_mhc_pre_fma": Meaning((r"mhcGemmSqrsumFma",)),
    "trtllm_mhc_pre_dg_splitk": Meaning((r"hc_prenorm_gemm",)),
    "trtllm_mhc_pre_dg_nosplit": Meaning((r"hc_prenorm_gemm",)),
    "trtllm_mhc_post_mapping": Meaning((r"mhcPostMapping",)),
    "NCCL": Meaning(unobservable=ROW_RUNNER),
    "TRTLLM": Meaning((r"allreduce|oneshot|twoshot|lowprecision|mnnvl|nccl",)),
}
