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

    # DeepGEMM on the SM100 family alone (is_sm_100f): SM120's block fp8 is torch_flow, as SM90's
    labels = {sm: g._trtllm(sm, _group("fp8_block")) for sm in ("90", "100", "103", "120")}
    assert labels == {"90": "torch_flow", "100": "deepgemm", "103": "deepgemm", "120": "torch_flow"}
    assert g._trtllm("100", _group("fp8")) == "torch_flow"
    gemma4 = AttentionCase(1, 1024, 16, 8, 256, 1, "bfloat16", "bfloat16", 0, 1024)
    assert a._trtllm_case("90", "torch_flow", gemma4) == "torch_flow"
    assert a._trtllm_case("100", "torch_flow", gemma4) == "torch_flow_flashinfer"
    nemotron = MoeCase("bfloat16", 64, 2688, 1856, 6, 128, 1, 1, "balanced")
    topk6 = MoeCase("bfloat16", 64, 4096, 2048, 6, 256, 1, 1, "balanced")  # gated, though its topk is 6
    assert m._trtllm_case("90", "moe_torch_flow_cutlass", nemotron) == "moe_torch_flow_nongated"
    assert m._trtllm_case("90", "moe_torch_flow_cutlass", topk6) == "moe_torch_flow_cutlass"
    assert m._trtllm("90", _group("w4a16_mxfp4")) == "moe_torch_flow"


def test_moe_auto_labels_follow_the_quant_methods():
    """What "auto" resolves to in SGLang 0.5.14's quant methods, for models ServerArgs sets no runner for."""
    rule = moe._sglang_case

    def label(sm: str, case: MoeCase) -> str:
        return rule(sm, moe._sglang(sm, _group(case.moe_dtype)), case)

    qwen3 = {"hidden_size": 4096, "inter_size": 1536, "topk": 8, "num_experts": 128}
    nvfp4 = MoeCase("nvfp4", 64, **qwen3, moe_tp_size=1, moe_ep_size=1, distribution="balanced")
    # ModelOptNvFp4FusedMoEMethod.create_moe_runner: Marlin on SM 8.0-9.x (modelopt_quant.py:2317-2320), else TRT-LLM
    assert label("90", nvfp4) == "sglang_marlin_moe"
    assert moe._sglang_auto("89", "nvfp4") == "sglang_marlin_moe"
    assert label("100", nvfp4) == "sglang_flashinfer_trtllm_moe"
    assert moe._sglang_auto("120", "nvfp4") == "sglang_flashinfer_cutlass_moe"  # server_args.py:5096-5104
    # generic compressed-tensors int4 experts: CompressedTensorsWNA16MoE, Marlin (compressed_tensors.py:689-697) ...
    int4 = nvfp4._replace(moe_dtype="int4_wo")
    assert label("100", int4) == "sglang_marlin_moe" and label("103", int4) == "sglang_marlin_moe"
    assert moe._sglang_auto("100", "int4_wo") == "sglang_marlin_moe"
    # ... Kimi-K2.5's group-32 recipe gets flashinfer_trtllm from ServerArgs on SM100 (server_args.py:3683-3737)
    kimi_k25 = int4._replace(hidden_size=7168, inter_size=2048, topk=8, num_experts=384)
    assert label("100", kimi_k25) == "sglang_flashinfer_trtllm_moe" and label("90", kimi_k25) == "sglang_marlin_moe"
    # Kimi-K3 (no architecture in 0.5.14): the reference's Marlin with SiLU on every SM
    kimi_k3 = MoeCase("w4a16_mxfp4", 64, 3584, 3072, 16, 896, 1, 1, "balanced")
    for sm in ("90", "100", "103", "120"):
        assert label(sm, kimi_k3) == "sglang_marlin_moe_situ_as_silu", sm
    gpt_oss = kimi_k3._replace(hidden_size=2880, inter_size=2880, topk=4, num_experts=128)
    assert label("100", gpt_oss) == "sglang_flashinfer_trtllm_moe"  # flashinfer_mxfp4 (server_args.py:3876-3881)


def _mla_group(mla_dtype: str, kv: str):
    return type("G", (), {"dtype": mla_dtype, "constants": {"mla_dtype": mla_dtype, "kv_cache_dtype": kv}})()


def test_mla_backend_is_server_args_choice_per_phase_and_kv_dtype(monkeypatch):
    """DeepSeek's MLA backend comes from ServerArgs (cases/selection/sglang-0.5.14.yaml): fa3 (labelled
    flash_attention) at SM90, trtllm_mla at SM100, prefill and decode each from their own field."""
    for kv in (("bfloat16", "bfloat16"), ("bfloat16", "fp8"), ("fp8", "fp8")):
        assert mla.CONTEXT.dispatch["sglang"]("90", _mla_group(*kv)) == "flash_attention"
        assert mla.GENERATION.dispatch["sglang"]("90", _mla_group(*kv)) == "flash_attention"
        assert mla.CONTEXT.dispatch["sglang"]("100", _mla_group(*kv)) == "trtllm_mla"
        assert mla.GENERATION.dispatch["sglang"]("103", _mla_group(*kv)) == "trtllm_mla"
    assert mla._sglang("120", _mla_group("bfloat16", "bfloat16")) == "triton"  # no file answer: the hand rule
    asked = []

    def answer(sm, kv, phase):
        asked.append((sm, kv, phase))
        return {"prefill": "flashinfer", "decode": "fa3"}[phase]

    monkeypatch.setattr(mla.selection_sglang, "mla_backend", answer)
    assert mla.CONTEXT.dispatch["sglang"]("100", _mla_group("fp8", "fp8")) == "flashinfer"
    assert mla.GENERATION.dispatch["sglang"]("100", _mla_group("bfloat16", "fp8")) == "flash_attention"
    assert mla.GENERATION.dispatch["sglang"]("100", _mla_group("bfloat16", "bfloat16")) == "flash_attention"
    # the fp8 switch sits in either dtype field (the reference's mla_dtype; backends/sglang/mla.py fp8_cache)
    assert asked == [("100", "fp8", "prefill"), ("100", "fp8", "decode"), ("100", "bfloat16", "decode")]


def test_fp8_gemm_follows_sglang_fp8_linear_selection(monkeypatch):
    """Block and per-tensor fp8 at SM90/SM100 from Fp8LinearMethod's own selection (the file's gemm rows):
    DeepGEMM with its Triton fallback (per shape) and CUTLASS fp8_scaled_mm (per shape)."""
    rule = gemm._sglang_case
    for sm in ("90", "100", "103"):
        assert gemm._sglang(sm, _group("fp8_block")) == "fp8_block"
        assert gemm._sglang(sm, _group("fp8")) == "fp8"
        assert rule(sm, "fp8_block", GemmCase("fp8_block", 8, 4096, 7168)) == "sglang_deepgemm_gemm_nt_f8f8bf16"
        assert rule(sm, "fp8_block", GemmCase("fp8_block", 8, 4128, 7168)) == "sglang_triton_w8a8_block_fp8"
    entry = {"fp8_marlin": False, "block_fp8_linear": "flashinfer_gemm_w8a8_block_fp8_linear_with_fallback",
             "cutlass_fp8_supported": False, "triton_w8a8_fp8_kernel": False}  # fmt: skip
    monkeypatch.setattr(gemm.selection_sglang, "fp8_gemm", lambda sm, dtype: entry)
    assert gemm._sglang("100", _group("fp8_block")) == "sglang_flashinfer_gemm_w8a8_block_fp8_linear_with_fallback"
    assert gemm._sglang("100", _group("fp8")) == "sglang_torch_scaled_mm"
    entry |= {"block_fp8_linear": "triton_w8a8_block_fp8_linear", "cutlass_fp8_supported": True}
    assert gemm._sglang("100", _group("fp8_block")) == "sglang_triton_w8a8_block_fp8"
    assert gemm._sglang("100", _group("fp8")) == "fp8"
    entry |= {"fp8_marlin": True}
    assert gemm._sglang("100", _group("fp8")) == "sglang_fp8_marlin"
    monkeypatch.setattr(gemm.selection_sglang, "fp8_gemm", lambda sm, dtype: None)  # no file answer: hand rules
    assert gemm._sglang("100", _group("fp8_block")) == "fp8_block"
