"""What the torch backend's kernel_source labels mean in kernel names (backends/kernels.py): CUDA kernel names on a
GPU, ATen ops on the CPU (runtime/observe.py keeps the top two levels of the ATen tree).

The ATen names are torch's own op names (torch/_C/_VariableFunctions.pyi; the CPU ones were read from a profile of
this torch 2.13 on the CPU: aten::linear > aten::matmul, aten::scaled_dot_product_attention >
aten::_scaled_dot_product_flash_attention_for_cpu or aten::_scaled_dot_product_attention_math, aten::bmm,
aten::_weight_int4pack_mm_for_cpu). The CUDA names are those of the libraries torch calls, as their kernels are
named: cuBLAS/cuBLASLt GEMMs (sm90_xmma_gemm_*, nvjet_*, cutlass_*, *gemv*, splitKreduce_kernel), torch's vendored
FlashAttention-2 (pytorch_flash::flash_fwd_kernel, flash_fwd_splitkv_kernel; aten/src/ATen/native/transformers/
cuda/flash_attn), memory-efficient attention (fmha_cutlassF_*, PyTorchMemEffAttention::AttentionKernel;
.../cuda/mem_eff_attention), cuDNN's SDPA (cudnn_generated_fort_native_sdpa_*), tinygemm int4 (at::native::
tinygemm_m16n8k16_chunk_kernel, aten/src/ATen/native/cuda/int4mm.cu) and _grouped_mm's CUTLASS grouped GEMM
(aten/src/ATen/native/cuda/GroupMM.cu).
"""

from __future__ import annotations

from opcollect.backends.kernels import Meaning

CUBLAS = r"gemm|gemv|nvjet|xmma|cutlass|splitKreduce"
SDPA = "torch.nn.functional.scaled_dot_product_attention"
ROW_RUNNER = "comm's row runner times the collective on every rank at once and observes no kernels"

KERNELS = {
    "torch.nn.functional.linear": Meaning((CUBLAS, r"^aten::(linear|addmm|mm|matmul)$")),
    "torch._scaled_mm": Meaning((CUBLAS, r"^aten::_scaled_mm$")),
    "torch._weight_int4pack_mm": Meaning((r"tinygemm", r"^aten::_weight_int4pack_mm$")),
    "torch._weight_int4pack_mm_for_cpu": Meaning((r"^aten::_weight_int4pack_mm_for_cpu$",)),
    # the quantize chains: abs/amax/div/clamp and the fp8 copy, elementwise and reduction kernels of ATen
    "torch_ops": Meaning((r"elementwise_kernel|reduce_kernel", r"^aten::(abs|amax|max|div|clamp|clamp_|copy_|to)$")),
    # the API as the plan names it: whichever SDPA backend ran
    SDPA: Meaning((r"flash_fwd|fmha|cudnn|sdpa|softmax", r"^aten::_?scaled_dot_product")),
    "sdpa.flash_attention": Meaning(
        (r"flash_fwd", r"^aten::_scaled_dot_product_flash_attention(_for_cpu)?$"), serves=(SDPA,)
    ),
    "sdpa.efficient_attention": Meaning(
        (r"fmha_cutlass|AttentionKernel", r"^aten::_scaled_dot_product_efficient_attention$"), serves=(SDPA,)
    ),
    "sdpa.cudnn_attention": Meaning((r"cudnn|sdpa", r"^aten::_scaled_dot_product_cudnn_attention$"), serves=(SDPA,)),
    "sdpa.math": Meaning((r"softmax", r"^aten::_scaled_dot_product_attention_math$"), serves=(SDPA,)),
    # the experts' GEMMs: one CUTLASS grouped GEMM per projection, or a linear per active expert
    "torch._grouped_mm": Meaning((r"cutlass|grouped_mm|GroupProblemShape", r"^aten::_grouped_mm$")),
    "per_expert_loop": Meaning((CUBLAS, r"^aten::(linear|addmm|mm|matmul)$")),
    "torch.mla_absorbed": Meaning((CUBLAS, r"^aten::bmm$")),
    "torch.bmm": Meaning((CUBLAS, r"^aten::bmm$")),
    # the DeepSeek-V4 and mHC references (backends/torch/dsv4.py, dsv4_kernels.py, mhc.py): their GEMMs and bmm's
    "torch_dsv4_attention": Meaning((CUBLAS, r"^aten::(matmul|mm|bmm|einsum)$")),
    "torch_paged_mqa_logits": Meaning((CUBLAS, r"^aten::(bmm|einsum)$")),
    "torch_sparse_mla": Meaning((CUBLAS, r"^aten::(bmm|einsum)$")),
    "torch.topk": Meaning((r"topk|sort|radix", r"^aten::topk$")),
    "torch_mhc_pre": Meaning((CUBLAS, r"^aten::(matmul|mm)$")),
    "torch_mhc_post": Meaning((CUBLAS, r"^aten::(bmm|einsum)$")),
    # the DSA and MSA references (backends/torch/dsa.py, msa.py): their GEMMs, einsums and bmm's
    "torch.dsa_reference": Meaning((CUBLAS, r"^aten::(matmul|mm|bmm|einsum)$")),
    "torch.msa_reference": Meaning((CUBLAS, r"^aten::(matmul|mm|bmm|einsum)$")),
    "torch.mqa_logits": Meaning((CUBLAS, r"^aten::(bmm|einsum)$")),
    "torch.sparse_mla": Meaning((CUBLAS, r"^aten::(bmm|einsum)$")),
    # the linear-attention references (backends/torch/linear_attention.py): the conv, its decode update as
    # elementwise ops, the chunked scans' products and the recurrent steps' einsums
    "torch_causal_conv1d": Meaning((r"conv|cudnn", r"^aten::(conv1d|convolution|_convolution)$")),
    "torch_causal_conv1d_update": Meaning((r"elementwise_kernel|reduce_kernel", r"^aten::(cat|mul|sum|silu|copy_)$")),
    "torch_gdn_chunked_scan": Meaning((CUBLAS, r"^aten::(matmul|bmm|linalg_solve_triangular)$")),
    "torch_gdn_recurrent_step": Meaning((CUBLAS, r"^aten::(einsum|bmm)$")),
    "torch_ssd_chunked_scan": Meaning((CUBLAS, r"^aten::(matmul|bmm)$")),
    "torch_selective_state_update": Meaning((CUBLAS, r"^aten::(einsum|bmm)$")),
    "NCCL": Meaning(unobservable=ROW_RUNNER),
    "gloo": Meaning(unobservable=ROW_RUNNER),
}
