"""What the TensorRT-LLM MoE runner builds for a case, without TensorRT-LLM or torch: the backend create_moe is
told to use, one rank's share of the experts, the tensors the quant method registers (and, for MXFP4, the
checkpoint tensors load_weights reads), the refusals, and the kernel_source label of the module TRT-LLM built.

Sources (commits of the copies read: docs/research/trtllm-1.3.0-runners.md, "MoE"): AIC = aiconfigurator
collector/trtllm/collect_moe.py at the mirror's HEAD (its __compat__ is trtllm>=1.3.0rc20 and the same file
collected both pins: collector/framework_manifest.yaml pins the moe family to 1.3.0rc23); TRT-LLM paths are
relative to tensorrt_llm/_torch/.
"""

from __future__ import annotations

from dataclasses import dataclass

from opcollect.runtime.contract import KernelLimit
from opcollect.runtime.dtypes import ceil_div, tensor_bytes

BLOCK = 128  # fp8_block weight blocks (128 x 128)
MXFP4_BLOCK = 32  # one e8m0 scale per 32 fp4 values
NVFP4_BLOCK = 16  # one e4m3 scale per 16 fp4 values
E4M3_ONE = 0x38  # 1.0 in fp8 e4m3: the NVFP4 block scales' fill byte
E8M0_ONE = 127  # 2**0 in e8m0: the MXFP4 block scales' fill byte
GPT_OSS = (2880, 2880)  # (hidden, inter) of gpt-oss-20b/120b, the only models AIC names as gpt-oss (:66-72)
GPT_OSS_SWIGLU = (1.702, 1.0, 7.0)  # swiglu alpha, beta, limit per local expert (AIC :428-433)
# NemotronH's non-gated Relu2 experts (hidden, inter, experts, topk): the shapes the planner marks
# moe_torch_flow_nongated (plans/moe.py _NEMOTRON_H, which a backend may not import; the tests hold them equal).
# AIC gives ActivationType.Relu2 to every "Nemotron-3" model (:39-42, :364-377).
NEMOTRON_H = {(2688, 1856, 128, 6), (2048, 5120, 512, 22), (8192, 5120, 512, 22)}
MXFP4 = ("w4a16_mxfp4", "w4a8_mxfp4_mxfp8")
WEIGHT_BITS = {"bfloat16": 16, "fp8": 8, "fp8_block": 8, "int4_wo": 4, "nvfp4": 4, "w4a16_mxfp4": 4,
               "w4a8_mxfp4_mxfp8": 4}  # fmt: skip
# the SM range each format runs in on TRT-LLM, as AIC's moe_trtllm quantization_modes declare it
# (collector/cases/base_ops/moe.yaml:189-225): fp8 above SM86, block fp8 from SM90, NVFP4 and the MXFP8 path from
# SM100; W4A16 MXFP4 only on 90 <= SM < 120 (CutlassFusedMoE's WFP4A16 method is SM90-only and TRTLLMGenFusedMoE
# refuses SM120, quantization.py WFP4A16FusedMoEMethod.create_weights)
SM_RANGE = {"fp8": (87, None), "fp8_block": (90, None), "nvfp4": (100, None), "w4a16_mxfp4": (90, 120),
            "w4a8_mxfp4_mxfp8": (100, None)}  # fmt: skip
# padded MXFP4 sizes, for the footprint only (TRT-LLM pads while loading): TRTLLMGen rounds to its weight alignment
# (quantization.py MXFP4WeightFusedMoEMethod.create_weights, at most 256), CUTLASS WFP4A16 to 128
# (fused_moe_cutlass.py CutlassFusedMoE.__init__), Triton estimated as CUTLASS
MXFP4_ALIGN = {"TRTLLM": 256, "CUTLASS": 128, "TRITON": 128}
FP8 = "float8_e4m3fn"


@dataclass(frozen=True)
class MoeLayout:
    backend: str  # ModelConfig.moe_backend: CUTLASS, TRITON, TRTLLM or DEEPGEMM (what create_moe is asked for)
    gated: bool  # SwiGLU (w3 and w1 fused) or Relu2 (w1 only)
    gpt_oss: bool  # gpt-oss's swiglu alpha / beta / limit
    local_experts: int
    local_inter: int
    hidden: int
    tokens: int
    topk: int
    params: tuple[tuple[str, tuple[int, ...], str], ...]  # what the quant method registers: name, shape, dtype
    checkpoint: tuple[tuple[str, tuple[int, ...], str], ...]  # MXFP4 only: per-expert tensors load_weights reads
    scale_byte: int  # fill byte of integer-packed block scales


def is_sm_100f(sm: int) -> bool:
    """TRT-LLM's is_sm_100f (tensorrt_llm/_utils.py): the SM100 family, SM 100 and 103."""
    return sm in (100, 103)


def is_gpt_oss(case) -> bool:
    return (case.hidden_size, case.inter_size) == GPT_OSS


def is_gated(case) -> bool:
    return (case.hidden_size, case.inter_size, case.num_experts, case.topk) not in NEMOTRON_H


def split(case) -> tuple[int, int]:
    """(experts, inter size) rank 0 holds: MoE.__init__ keeps num_experts // moe_ep_size experts
    (expert_size_per_partition, slots [0, E / ep) on ep_rank 0) of intermediate_size // moe_tp_size each
    (modules/fused_moe/interface.py MoE.__init__)."""
    return case.num_experts // case.moe_ep_size, case.inter_size // case.moe_tp_size


def check_case(case) -> None:
    """Refuse, before anything is built, what TRT-LLM's MoE does not run."""
    dtype, inter = case.moe_dtype, case.inter_size // case.moe_tp_size
    if dtype == "int4_wo":
        # CutlassFusedMoE._get_quant_method sends every int4 per-group config (W4A16_AWQ has the quant mode of
        # W4A8_AWQ) to WInt4AFP8FusedMoEMethod, which quantizes activations to fp8 and whose create_weights raises
        # NotImplementedError outside SM89/SM90; per-channel W4A16 has no MoE method (ValueError "Unsupported
        # quantization mode"); TRTLLMGenFusedMoE takes no int4 (create_moe.py get_moe_cls). AIC keeps the rows
        # to fail in TRT-LLM (:181-184) and its tables hold none.
        raise KernelLimit("TensorRT-LLM's MoE has no int4 weight-only (bf16 activation) path: CUTLASS runs int4 "
                          "groups as W4A8 on SM89/90 only (quantization.py WInt4AFP8FusedMoEMethod)")  # fmt: skip
    if dtype not in WEIGHT_BITS:
        raise KernelLimit(f"the TensorRT-LLM MoE runner has no {dtype} path")
    if dtype == "fp8_block" and (case.hidden_size % BLOCK or inter % BLOCK):
        # 128 x 128 weight-scale blocks (AIC :381-398; DeepGEMM layout.hpp:78 on SM100, the CUTLASS block-scale
        # runner on SM90)
        raise KernelLimit(f"block fp8 experts need hidden and per-rank inter % {BLOCK} == 0 "
                          f"({case.hidden_size}, {inter})")  # fmt: skip
    step = 256 // WEIGHT_BITS[dtype]
    if inter % step:
        # the fused-MoE kernels' weight-layout check, inter % (256 / weight bits) == 0 (AIC :407-426); the
        # reference tables hold no row that breaks it
        raise KernelLimit(f"TRT-LLM fused MoE needs the per-rank inter size % {step} == 0 for {dtype} (got {inter})")


def check_sm(case, sm: int) -> None:
    low, high = SM_RANGE.get(case.moe_dtype, (None, None))
    if (low is not None and sm < low) or (high is not None and sm >= high):
        raise KernelLimit(f"TensorRT-LLM runs {case.moe_dtype} experts on SM [{low}, {high or 'any'}), not SM{sm}")


def choose_backend(case, sm: int) -> str:
    """ModelConfig.moe_backend as AIC sets it (:428-479), which is serving's AUTO resolution
    (ModelConfig.resolve_moe_backend in model_config.py: GptOssForCausalLM -> TRTLLM on 100 <= SM < 120, TRITON on
    90 <= SM < 100, else CUTLASS; DeepSeek-V4 -> TRTLLM on SM100-119; everything else CUTLASS) except for block
    fp8 on the SM100 family, where serving resolves TRTLLM and AIC (and so the plan's label deepgemm) runs
    DeepGEMM. MXFP4 of other models runs TRTLLMGen on SM100-119, as serving's DeepSeek-V4 branch does (AIC :459-465).
    Upper case as the serving config spells it (llmapi MoeConfig.backend); AIC writes it lower case.
    verified_on: trtllm==1.3.0rc23"""
    if is_gpt_oss(case):  # AIC keys this on the model name, whatever the format
        if 100 <= sm < 120:
            return "TRTLLM"
        return "TRITON" if 90 <= sm < 100 else "CUTLASS"
    if case.moe_dtype in MXFP4 and 100 <= sm < 120:
        return "TRTLLM"
    if case.moe_dtype == "fp8_block" and is_sm_100f(sm):
        return "DEEPGEMM"
    return "CUTLASS"


def _round_up(value: int, step: int) -> int:
    return ceil_div(value, step) * step


def _params(dtype: str, backend: str, experts: int, inter: int, hidden: int, gated: bool):
    """create_weights of each quant method (modules/fused_moe/quantization.py): w3_w1 holds 2 x inter rows for a
    gated activation, inter for Relu2 (MoE.expand_intermediate_size_per_partition)."""
    fc1 = (2 if gated else 1) * inter
    if dtype == "bfloat16":  # UnquantizedFusedMoEMethod
        return (
            ("w3_w1_weight", (experts, fc1, hidden), "bfloat16"),
            ("w2_weight", (experts, hidden, inter), "bfloat16"),
        )
    if dtype == "fp8":  # FP8QDQFusedMoEMethod: per-tensor scales
        return (
            ("w3_w1_weight", (experts, fc1, hidden), FP8),
            ("w2_weight", (experts, hidden, inter), FP8),
            ("fc31_dequant", (experts,), "float32"),
            ("fc2_dequant", (experts,), "float32"),
            ("fc2_quant", (), "float32"),
            ("fc31_input_dequant", (), "float32"),
        )
    if dtype == "fp8_block":  # DeepSeekFP8BlockScalesFusedMoEMethod (and its DeepGemm subclass): 2 x inter rows
        return (
            ("w3_w1_weight", (experts, 2 * inter, hidden), FP8),
            ("w2_weight", (experts, hidden, inter), FP8),
            ("w3_w1_weight_scaling_factor", (experts, 2 * ceil_div(inter, BLOCK), ceil_div(hidden, BLOCK)), "float32"),
            ("w2_weight_scaling_factor", (experts, ceil_div(hidden, BLOCK), ceil_div(inter, BLOCK)), "float32"),
        )
    if dtype == "nvfp4":  # NVFP4CutlassFusedMoEMethod: 16 fp4 values per int64, 4 e4m3 block scales per int32
        return (
            ("w3_w1_weight", (experts, fc1, hidden // 16), "int64"),
            ("w2_weight", (experts, hidden, inter // 16), "int64"),
            ("w3_w1_weight_scale", (experts, fc1, hidden // NVFP4_BLOCK // 4), "int32"),
            ("w2_weight_scale", (experts, hidden, inter // NVFP4_BLOCK // 4), "int32"),
            ("fc31_input_scale", (), "float32"),
            ("fc2_input_scale", (), "float32"),
            ("fc31_alpha", (experts,), "float32"),
            ("fc2_alpha", (experts,), "float32"),
        )
    # MXFP4 (WFP4A16 on CUTLASS, MXFP4WeightTRTLLMGenFusedMoEMethod, the Triton MXFP4 method): two fp4 per byte,
    # one e8m0 scale per 32; sizes padded as estimated above (TRT-LLM pads while loading)
    align = MXFP4_ALIGN[backend]
    inter_p, hidden_p = _round_up(inter, align), _round_up(hidden, align)
    return (
        ("w3_w1_weight", (experts, 2 * inter_p, hidden_p // 2), "uint8"),
        ("w2_weight", (experts, hidden_p, inter_p // 2), "uint8"),
        ("w3_w1_weight_scale", (experts, 2 * inter_p, hidden_p // MXFP4_BLOCK), "uint8"),
        ("w2_weight_scale", (experts, hidden_p, inter_p // MXFP4_BLOCK), "uint8"),
    )


def _checkpoint(dtype: str, backend: str, inter: int, hidden: int):
    """One expert's MXFP4 checkpoint as load_weights reads it (MoEWeightLoadingMode.VANILLA, AIC :566-613): w1/w3
    [inter, hidden / 2] and w2 [hidden, inter / 2] bytes with their e8m0 scales, at the model's full inter size
    (load_weight_shard takes rank 0's 1 / tp). The CUTLASS WFP4A16 method reads its scales as weight_scale_inv
    (quantization.py WFP4A16FusedMoEMethod.load_quant_scales), TRTLLMGen and Triton as weight_scale."""
    if dtype not in MXFP4:
        return ()
    scale = "weight_scale_inv" if backend == "CUTLASS" else "weight_scale"
    return (
        ("w1.weight", (inter, hidden // 2), "uint8"),
        ("w3.weight", (inter, hidden // 2), "uint8"),
        ("w2.weight", (hidden, inter // 2), "uint8"),
        (f"w1.{scale}", (inter, hidden // MXFP4_BLOCK), "uint8"),
        (f"w3.{scale}", (inter, hidden // MXFP4_BLOCK), "uint8"),
        (f"w2.{scale}", (hidden, inter // MXFP4_BLOCK), "uint8"),
    )


def moe_layout(case, backend: str) -> MoeLayout:
    check_case(case)
    experts, inter = split(case)
    dtype, hidden, gated = case.moe_dtype, case.hidden_size, is_gated(case)
    return MoeLayout(
        backend=backend,
        gated=gated,
        gpt_oss=is_gpt_oss(case),
        local_experts=experts,
        local_inter=inter,
        hidden=hidden,
        tokens=case.num_tokens,
        topk=case.topk,
        params=_params(dtype, backend, experts, inter, hidden, gated),
        checkpoint=_checkpoint(dtype, backend, case.inter_size, hidden),
        scale_byte=E4M3_ONE if dtype == "nvfp4" else E8M0_ONE,
    )


def layout_bytes(layout: MoeLayout, num_experts: int) -> int:
    """Weights, the MXFP4 checkpoint tensors (one set shared by every expert), hidden states, router logits,
    output, and per routed pair the fc1 output and activation (the fused kernels' workspace, bf16)."""
    weights = tensor_bytes(layout.params)
    checkpoint = tensor_bytes(layout.checkpoint)
    routed = layout.tokens * layout.topk
    activations = (2 * layout.tokens * layout.hidden + routed * (layout.hidden + 3 * layout.local_inter)) * 2
    return weights + checkpoint + activations + layout.tokens * num_experts * 2


def footprint(case) -> int:
    """Bytes of one copy, SM-independent: the backend with the largest layout the case can get (MXFP4 padded as
    TRTLLMGen pads it, everything else as CUTLASS and DeepGEMM hold it)."""
    backend = "TRTLLM" if case.moe_dtype in MXFP4 else "CUTLASS"
    return layout_bytes(moe_layout(case, backend), case.num_experts)


# the labels AIC records (:761-788), per backend class TRT-LLM built; any other class gets its own name so a
# fallback shows in the tables
LABELS = {
    "CutlassFusedMoE": "moe_torch_flow_cutlass",
    "TritonFusedMoE": "moe_torch_flow",
    "TRTLLMGenFusedMoE": "moe_torch_flow",
    "DeepGemmFusedMoE": "deepgemm",
}


def kernel_label(backend_class: str, gated: bool, moe_dtype: str, sm: int) -> str:
    """The kernel_source of the built module, in AIC's first-match order (:761-788): DeepGEMM (fp8_block on the
    SM100 family, AIC's only DeepGEMM choice) -> deepgemm; block fp8 on CUTLASS at SM120 runs the Triton block-scale
    kernel (fused_moe_cutlass.py run_moe) -> moe_torch_flow_triton_fp8_block; a non-gated activation ->
    moe_torch_flow_nongated whatever the backend; CUTLASS -> moe_torch_flow_cutlass; Triton and TRTLLMGen ->
    moe_torch_flow. ``backend_class`` is the class of ConfigurableMoE.backend, or of the module itself when
    create_moe returned a bare backend."""
    if backend_class == "DeepGemmFusedMoE":
        return LABELS[backend_class]
    if backend_class == "CutlassFusedMoE" and moe_dtype == "fp8_block" and sm == 120:
        return "moe_torch_flow_triton_fp8_block"
    if not gated:
        return "moe_torch_flow_nongated"
    return LABELS.get(backend_class, f"moe_torch_flow_{backend_class.lower()}")
