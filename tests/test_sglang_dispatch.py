"""The SGLang and TensorRT-LLM plans' dispatch follows each framework's selection per SM, dtype, shape and model
(its agreement with the reference tables: tests/test_dispatch_vs_reference.py)."""

from __future__ import annotations

from opcollect.plans import attention, gemm, mla, moe
from opcollect.plans.attention import AttentionCase
from opcollect.plans.gemm import GemmCase
from opcollect.plans.moe import MoeCase


def test_gemm_by_dtype_and_shape():
    rule = gemm._sglang_case
    assert gemm._sglang("90", _group("bfloat16")) == "sglang_torch_linear"
    assert rule("90", "fp8_block", GemmCase("fp8_block", 8, 4096, 7168)) == "sglang_deepgemm_gemm_nt_f8f8bf16"
    # N % 64 or K % 128 not zero: SGLang's own fallback, Triton
    assert rule("90", "fp8_block", GemmCase("fp8_block", 8, 4096, 7200)) == "sglang_triton_w8a8_block_fp8"
    assert rule("90", "fp8_block", GemmCase("fp8_block", 8, 4128, 7168)) == "sglang_triton_w8a8_block_fp8"
    assert gemm._sglang("120", _group("fp8_block")) == "sglang_triton_w8a8_block_fp8"  # no JIT DeepGEMM on SM120
    assert rule("90", "fp8", GemmCase("fp8", 8, 4096, 7168)) == "sglang_sgl_kernel_fp8_scaled_mm"
    assert rule("90", "fp8", GemmCase("fp8", 8, 4100, 7168)) == "sglang_triton_scaled_mm"
    assert gemm._sglang("100", _group("nvfp4")) == "sglang_flashinfer_cutedsl_nvfp4"


def _group(dtype: str):
    return type("G", (), {"dtype": dtype, "constants": {}})()


def test_gemma4_heads_run_on_triton_below_sm100():
    rule = attention._sglang_context_case
    swa = AttentionCase(1, 1024, 16, 8, 256, 1, "bfloat16", "bfloat16", 0, 1024)
    plain = AttentionCase(1, 1024, 16, 8, 256, 1, "bfloat16", "bfloat16", 0, 0)
    assert rule("90", "fa3", swa) == "triton" and rule("90", "fa3", plain) == "fa3"
    assert rule("100", "trtllm_mha", swa) == "trtllm_mha"
    assert attention._sglang("120", None) == "flashinfer" and attention._sglang("103", None) == "trtllm_mha"
    assert mla._sglang("90", None) == "flash_attention" and mla._sglang("100", None) == "trtllm_mla"


def test_attention_backend_of_one_models_heads_is_its_server_args_choice():
    """At SM100 ServerArgs gives Qwen3.5 triton and Step-3.5 fa4 (cases/selection/sglang-0.5.14.yaml); generic
    heads, which several models share, keep trtllm_mha. SM90 stays fa3 (Gemma-4 triton), as the reference."""
    qwen35 = AttentionCase(1, 1024, 6, 1, 256, 1, "bfloat16", "bfloat16", 0, 0)  # Qwen3.5-27B at TP 4
    step = AttentionCase(1, 1024, 12, 1, 128, 1, "bfloat16", "fp8", 0, 512)  # Step-3.7-Flash sliding at TP 8
    gemma4 = AttentionCase(1, 1024, 16, 2, 512, 1, "bfloat16", "bfloat16", 0, 0)
    generic = AttentionCase(1, 1024, 32, 8, 128, 1, "bfloat16", "bfloat16", 0, 0)
    for rule in (attention._sglang_context_case, attention._sglang_generation_case):
        assert rule("100", "trtllm_mha", qwen35) == "triton" and rule("103", "trtllm_mha", qwen35) == "triton"
        assert rule("100", "trtllm_mha", step) == "fa4"
        assert rule("100", "trtllm_mha", gemma4) == "trtllm_mha" and rule("100", "trtllm_mha", generic) == "trtllm_mha"
        assert [rule("90", "fa3", c) for c in (qwen35, step, gemma4, generic)] == ["fa3", "fa3", "triton", "fa3"]
        assert rule("120", "flashinfer", qwen35) == "flashinfer"  # no file answer for SM120: the hand rule
        assert rule("120", "flashinfer", gemma4) == "triton"
    assert attention.CONTEXT.case_dispatch["sglang"] is attention._sglang_context_case
    assert attention.GENERATION.case_dispatch["sglang"] is attention._sglang_generation_case


def test_moe_by_model():
    rule = moe._sglang_case
    nemotron = MoeCase("bfloat16", 64, 2688, 1856, 6, 128, 1, 1, "balanced")
    llama4 = MoeCase("bfloat16", 64, 5120, 8192, 1, 16, 1, 1, "balanced")
    deepseek = MoeCase("fp8_block", 64, 7168, 2048, 8, 256, 1, 8, "balanced")
    kimi_k3 = MoeCase("w4a16_mxfp4", 64, 3584, 3072, 16, 896, 1, 1, "balanced")
    gpt_oss = MoeCase("w4a16_mxfp4", 64, 2880, 2880, 4, 128, 1, 1, "balanced")
    assert rule("90", "bfloat16", nemotron) == "sglang_flashinfer_cutlass_moe"
    assert rule("100", "bfloat16", nemotron) == "sglang_flashinfer_trtllm_moe"
    assert rule("90", "bfloat16", llama4) == "sglang_fused_moe_triton"
    assert rule("90", "fp8_block", deepseek) == "sglang_fused_moe_triton"
    assert rule("100", "fp8_block", deepseek) == "sglang_flashinfer_trtllm_moe"
    assert rule("90", "w4a16_mxfp4", kimi_k3) == "sglang_marlin_moe_situ_as_silu"
    assert rule("90", "w4a16_mxfp4", gpt_oss) == "sglang_fused_moe_triton"


def test_trtllm_labels_as_its_reference_collector():
    from opcollect.plans import attention as a
    from opcollect.plans import gemm as g
    from opcollect.plans import moe as m

    assert g._trtllm("90", _group("fp8_block")) == "torch_flow" and g._trtllm("100", _group("fp8_block")) == "deepgemm"
    gemma4 = AttentionCase(1, 1024, 16, 8, 256, 1, "bfloat16", "bfloat16", 0, 1024)
    assert a._trtllm_case("90", "torch_flow", gemma4) == "torch_flow"
    assert a._trtllm_case("100", "torch_flow", gemma4) == "torch_flow_flashinfer"
    nemotron = MoeCase("bfloat16", 64, 2688, 1856, 6, 128, 1, 1, "balanced")
    topk6 = MoeCase("bfloat16", 64, 4096, 2048, 6, 256, 1, 1, "balanced")  # gated, though its topk is 6
    assert m._trtllm_case("90", "moe_torch_flow_cutlass", nemotron) == "moe_torch_flow_nongated"
    assert m._trtllm_case("90", "moe_torch_flow_cutlass", topk6) == "moe_torch_flow_cutlass"
    assert m._trtllm("90", _group("w4a16_mxfp4")) == "moe_torch_flow"
