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
MSA_OPS = ("msa_context_module", "msa_generation_module")
ROW_RUNNER = "a row runner: it times the op on every rank at once (or two ops for one row) and observes no kernels"

KERNELS = {
    "torch_flow": (Meaning((GEMMS,), ops=("gemm",)), Meaning((ATTENTION,), ops=ATTENTION_OPS)),
    "torch_flow_flashinfer": Meaning((r"flashinfer|BatchPrefill|BatchDecode",)),
    "deepgemm": Meaning((r"deep_gemm|fp8_gemm_kernel",)),
    "default": (
        # the DSA module (dsa.py): FlashMLA's sparse MLA on SM90 (sparse_attn_fwd_kernel, the fp8 sparse decode),
        # trtllm-gen's on SM100 (fmha), the indexer's DeepGEMM fp8 MQA logits and TensorRT-LLM's top-k
        Meaning((r"sparse|mqa_logits|topk|fmha",), ops=("dsa_context_module", "dsa_generation_module")),
        # the MSA module's Triton route (msa.py, MiniMax-M3 at rc23 off SM100/103): the Triton kernels of
        # sparse/minimax_m3/triton_backend.py, named after their @triton.jit functions (_block_max_score_kernel of
        # triton_block_max_score, triton_sparse_softmax's) and its sparse decode (triton_sparse_decode.py)
        Meaning((r"block_max_score|sparse_softmax|sparse_decode|minimax",), ops=MSA_OPS),
        Meaning((ATTENTION + r"|flash_fwd_splitkv_mla",)),  # MLA and the MLA module
    ),
    # the MSA module's fmha_sm100 route (SM100/103, sparse/minimax_m3/msa_backend.py): the CuTe DSL sparse attention
    # (SparseAttentionForwardSm100) and its CSR builder (SparseK2qCsrBuilderSm100), collect_msa_module.py:603-616
    "msa_fmha_sm100": Meaning((r"fmha_sm100|SparseAttentionForward|SparseK2q|Sm100",)),
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
    # gdn and mamba2 (linear_attention.py): the layers' conv (causal_conv1d.py's torch.ops.trtllm.causal_conv1d_fwd
    # and causal_conv1d_update CUDA kernels), the GDN prefill (vendored FLA's Triton chunk kernels, or FlashInfer's
    # GDN prefill) and decode (fused_sigmoid_gating_delta_rule_update_kernel, or FlashInfer's bf16-state GDN decode),
    # the SSD scan (ssd_*.py Triton kernels _chunk_cumsum/_chunk_state/_state_passing/_chunk_scan/_bmm_chunk) and the
    # selective state update (TensorRT-LLM's Triton one or FlashInfer's)
    "causal_conv1d_fn": Meaning((r"causal_conv1d",)),
    "causal_conv1d_update": Meaning((r"causal_conv1d",)),
    "chunk_gated_delta_rule": Meaning((r"chunk|gated_delta|gdn|solve_tril|recompute_w_u|l2norm",)),
    "fused_recurrent_gated_delta_rule": Meaning((r"fused_sigmoid_gating|fused_recurrent|gated_delta|gdn",)),
    "mamba_chunk_scan_combined": Meaning((r"chunk_scan|chunk_state|state_passing|bmm_chunk|chunk_cumsum|ssd",)),
    "selective_state_update": Meaning((r"selective_state_update|selective_scan|ssu",)),
    "NCCL": Meaning(unobservable=ROW_RUNNER),
    "TRTLLM": Meaning((r"allreduce|oneshot|twoshot|lowprecision|mnnvl|nccl",)),
}
