"""Refusals of the TensorRT-LLM runners (backends/trtllm/), each reached by calling the real function: the checks
before any framework import with a plan's case NamedTuple, and the ones behind the framework's imports with the
smallest stand-in modules (conftest.install_fakes) that reach them. Each test checks the exception's type and its
message, and where cheap that the nearest accepted input passes the same check."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from conftest import install_fakes

from opcollect.backends.trtllm import allreduce as ar
from opcollect.backends.trtllm import allreduce_preflight as preflight
from opcollect.backends.trtllm import (
    dsa_inputs,
    gemm,
    linear_attention,
    linear_inputs,
    mla_bmm,
    mla_inputs,
    mla_module,
    moe,
    moe_inputs,
    msa_inputs,
    quantize,
    torch_ops,
)
from opcollect.backends.trtllm import encoder_attention as enc
from opcollect.plans.dsa import DsaModuleCase
from opcollect.plans.encoder_attention import EncoderAttentionCase
from opcollect.plans.gemm import GemmCase
from opcollect.plans.linear_attention import GdnCase, Mamba2Case
from opcollect.plans.mla import MlaCase
from opcollect.plans.mla_bmm import MlaBmmCase
from opcollect.plans.mla_module import MlaModuleCase
from opcollect.plans.moe import MoeCase
from opcollect.plans.quantize import QuantizeCase
from opcollect.runtime.contract import KernelLimit, Measured
from opcollect.runtime.harness import Stats

V32, GLM, M3 = "DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM", "MiniMaxM3ForCausalLM"
V3 = ("deepseek-ai/DeepSeek-V3", "DeepseekV3ForCausalLM")


def refused(exc, pattern: str, call, *args, **kwargs):
    with pytest.raises(exc, match=pattern):
        call(*args, **kwargs)


# ---- DSA (dsa_inputs.py)


def dsa(arch=V32, heads=32, batch=2, isl=100, step=128, kv="bfloat16", gemm_type="bfloat16", mla="bfloat16"):
    return DsaModuleCase("dsa_context_module", "m", arch, mla, kv, gemm_type, heads, batch, isl, 1, step)


def test_dsa_an_unknown_architecture_is_refused_naming_the_two_it_builds():
    pattern = rf"^the TensorRT-LLM DSA runner builds {V32}, {GLM}, not DeepseekV3ForCausalLM \(dsa_inputs\.MODELS\)$"
    refused(KernelLimit, pattern, dsa_inputs.check_case, dsa(arch="DeepseekV3ForCausalLM"))
    assert dsa_inputs.check_case(dsa(arch=GLM))["index_topk"] > 0


@pytest.mark.parametrize(
    "field, bad, good",
    [("isl", 0, 1), ("step", -1, 0), ("batch_size", 0, 1), ("num_heads", 0, 1)],
)
def test_dsa_an_empty_case_is_refused_at_the_boundary(field, bad, good):
    with pytest.raises(KernelLimit, match=r"^a DSA case needs new tokens, a batch and heads: DsaModuleCase\("):
        dsa_inputs.check_case(dsa()._replace(**{field: bad}))
    dsa_inputs.check_case(dsa()._replace(**{field: good}))


@pytest.mark.parametrize(
    "capability, c, pattern",
    [
        ((12, 0), dsa(), r"^TensorRT-LLM's DSA indexer \(DeepGEMM MQA logits\) has no SM120 kernel$"),
        ((12, 1), dsa(), r"no SM121 kernel$"),
        ((9, 0), dsa(kv="fp8"), r"^TensorRT-LLM's DSA takes an fp8 cache from SM100 only \(SM90\)$"),
        ((9, 0), dsa(gemm_type="nvfp4"), r"^nvfp4 projections need SM100 or newer \(SM90\)$"),
    ],
)
def test_dsa_device_refusals_name_the_sm(capability, c, pattern):
    refused(KernelLimit, pattern, dsa_inputs.check_capability, c, capability)


def test_dsa_device_boundaries_pass():
    dsa_inputs.check_capability(dsa(kv="fp8", gemm_type="nvfp4"), (10, 0))
    dsa_inputs.check_capability(dsa(kv="fp8", gemm_type="nvfp4"), (11, 0))  # the indexer refuses from SM120 on


def test_dsa_a_module_without_an_indexer_or_mla_is_no_dsa_row():
    pattern = r"^TensorRT-LLM built Dense, not an MLA with a DSA indexer, for a DSA case$"
    refused(RuntimeError, pattern, dsa_inputs.module_label, ["Dense", "Module"], ["TrtllmAttention"], True)
    refused(RuntimeError, "built X, not an MLA", dsa_inputs.module_label, ["X", "MLA"], ["TrtllmAttention"], False)
    assert dsa_inputs.module_label(["X", "MLA"], ["TrtllmAttention"], True) == "default"


# ---- encoder attention (encoder_attention.py)


def enc_case(batch=2, isl=100, heads=16, head_dim=64, dtype="bfloat16"):
    return EncoderAttentionCase(batch, isl, heads, head_dim, dtype)


@pytest.mark.parametrize(
    "c, pattern",
    [
        (enc_case(dtype="fp8"), r"^TensorRT-LLM's encoder attention runs bfloat16 only, not fp8$"),
        (enc_case(dtype="float16"), r"runs bfloat16 only, not float16$"),
        (enc_case(batch=0), r"^an empty encoder attention case: \(0, 100, 16, 64, 'bfloat16'\)$"),
        (enc_case(isl=0), r"^an empty encoder attention case"),
        (enc_case(heads=0), r"^an empty encoder attention case"),
        (enc_case(head_dim=0), r"^an empty encoder attention case"),
        (enc_case(head_dim=257), r"^TrtllmAttention aborts on head_dim 257 > 256$"),
        # 4 * 131072 tokens * 16 heads * 128 * 2 bytes == 2^31
        (
            enc_case(batch=1, isl=131072, heads=16, head_dim=128),
            r"^QKV and output of 131072 tokens x 16 heads x 128 reach",
        ),
    ],
)
def test_encoder_attention_refusals(c, pattern):
    refused(KernelLimit, pattern, enc.check_case, c)


def test_encoder_attention_boundaries_pass():
    enc.check_case(enc_case(batch=1, isl=1, heads=1, head_dim=1))
    enc.check_case(enc_case(head_dim=256))
    enc.check_case(enc_case(batch=1, isl=131071, heads=16, head_dim=128))  # one token below 2^31 bytes


# ---- GEMM (gemm.py)


def test_gemm_a_dtype_without_a_quant_method_is_refused():
    refused(
        KernelLimit,
        r"^the TensorRT-LLM GEMM runner has no int8_wo path$",
        gemm.gemm_layout,
        GemmCase("int8_wo", 4, 64, 256),
    )
    for dtype in gemm.QUANT_METHODS:
        assert gemm.gemm_layout(GemmCase(dtype, 4, 64, 256)).quant_method == gemm.QUANT_METHODS[dtype]


@pytest.mark.parametrize(
    "c, pattern",
    [
        (GemmCase("int4_wo", 4, 64, 192), r"^W4A16 AWQ needs k % 128 == 0 and an even n \(n=64, k=192\)$"),
        (GemmCase("int4_wo", 4, 63, 256), r"^W4A16 AWQ needs k % 128 == 0 and an even n \(n=63, k=256\)$"),
        (GemmCase("nvfp4", 4, 64, 264), r"^NVFP4 needs k % 16 == 0 \(k=264\)$"),
        (GemmCase("bfloat16", 2**16, 2**15, 64), r"^m\*n or m\*k reaches 2\^31 elements \(m=65536, n=32768, k=64\)"),
        (GemmCase("bfloat16", 2**16, 64, 2**15), r"^m\*n or m\*k reaches 2\^31 elements \(m=65536, n=64, k=32768\)"),
        (GemmCase("fp8_block", 4, 2**16, 2**15), r"^a block-fp8 weight of n\*k >= 2\^31 elements \(n=65536, k=32768\)"),
    ],
)
def test_gemm_shape_refusals(c, pattern):
    refused(KernelLimit, pattern, gemm.check_shape, c)


@pytest.mark.parametrize(
    "c",
    [
        GemmCase("int4_wo", 4, 64, 256),
        GemmCase("nvfp4", 4, 64, 272),
        GemmCase("bfloat16", 2**16, 2**15 - 1, 2**15 - 1),  # m*n and m*k one row below 2^31
        GemmCase("bfloat16", 4, 2**16, 2**15),  # the weight's n*k bounds block fp8 only
        GemmCase("fp8_block", 4, 2**16, 2**15 - 128),
    ],
)
def test_gemm_shape_boundaries_pass(c):
    gemm.check_shape(c)


def test_gemm_a_quant_method_other_than_the_dtypes_is_an_error():
    pattern = r"^TensorRT-LLM built UnquantizedLinearMethod for a fp8 GEMM, not FP8QDQLinearMethod$"
    refused(RuntimeError, pattern, gemm.kernel_label, "fp8", "UnquantizedLinearMethod", False, False)
    assert gemm.kernel_label("fp8", "FP8QDQLinearMethod", False, False) == "torch_flow"


def test_gemm_a_linear_that_refuses_the_shape_is_a_kernel_limit(monkeypatch):
    pytest.importorskip("torch")
    built = []

    def linear(**kwargs):
        built.append(kwargs)
        raise ValueError("in_features must be divisible")

    install_fakes(
        monkeypatch,
        {
            "tensorrt_llm._torch.modules.linear": {"Linear": linear},
            "tensorrt_llm._utils": {"get_sm_version": lambda: 90, "is_sm_100f": lambda: False},
            "tensorrt_llm.models.modeling_utils": {
                "QuantAlgo": {"FP8": "FP8"},
                "QuantConfig": lambda **kw: SimpleNamespace(**kw),
            },
        },
    )
    pattern = r"^TensorRT-LLM refuses fp8 n=64 k=256: in_features must be divisible$"
    refused(KernelLimit, pattern, gemm.prepare, GemmCase("fp8", 4, 64, 256), "torch_flow", "cpu", 1)
    assert len(built) == 1


# ---- linear attention (linear_inputs.py, linear_attention.py)


def gdn(stage="core", phase="context", b=2, s=5, d_conv=4):
    return GdnCase(stage, phase, b, s, b * s, 1024, d_conv, 2, 8, 4, 8, "m")


@pytest.mark.parametrize(
    "op, c, pattern",
    [
        ("kda", gdn(), r"^TensorRT-LLM's linear-attention runners have no op 'kda' \(gdn, mamba2\)$"),
        ("gdn", gdn(stage="gate"), r"^gdn: no kernel for stage 'gate' in phase 'context'$"),
        ("gdn", gdn(phase="mixed"), r"^gdn: no kernel for stage 'core' in phase 'mixed'$"),
        ("gdn", gdn(b=0), r"^gdn: 0 requests of 5 tokens do not make num_tokens 0$"),
        ("gdn", gdn(s=0), r"^gdn: 2 requests of 0 tokens do not make num_tokens 0$"),
        ("gdn", gdn()._replace(num_tokens=11), r"^gdn: 2 requests of 5 tokens do not make num_tokens 11$"),
        ("gdn", gdn(phase="generation", s=2), r"^gdn: a decode step is one token per request, not 2$"),
        ("gdn", gdn(d_conv=1), r"^gdn: d_conv 1: the conv state keeps d_conv - 1 >= 1 inputs$"),
    ],
)
def test_linear_attention_case_refusals(op, c, pattern):
    refused(KernelLimit, pattern, linear_inputs.check_case, op, c)


def test_linear_attention_boundaries_pass():
    linear_inputs.check_case("gdn", gdn(b=1, s=1, d_conv=2))
    linear_inputs.check_case("gdn", gdn(phase="generation", s=1))
    linear_inputs.check_case("mamba2", Mamba2Case("conv", "context", 2, 5, 10, 1024, 16, 4, 4, 8, 2, 8, "m"))


def test_the_gdn_state_form_needs_an_installed_release(monkeypatch, tmp_path):
    linear_attention.state_form.cache_clear()
    try:
        monkeypatch.setattr(torch_ops, "installed_root", lambda: None)
        refused(KernelLimit, r"^TensorRT-LLM's gdn runner: tensorrt_llm is not installed$", linear_attention.state_form)
        linear_attention.state_form.cache_clear()
        monkeypatch.setattr(torch_ops, "installed_root", lambda: tmp_path)  # a package without gdn_mixer.py
        refused(KernelLimit, r"^TensorRT-LLM's gdn runner: .*gdn_mixer\.py", linear_attention.state_form)
    finally:
        linear_attention.state_form.cache_clear()


# ---- MLA BMM (mla_bmm.py)


@pytest.mark.parametrize(
    "c, pattern",
    [
        (
            MlaBmmCase("mla_gen_pre", "nvfp4", 4, 16),
            r"^TensorRT-LLM's MLA BMMs run bfloat16 or fp8 block weights, not nvfp4$",
        ),
        (MlaBmmCase("mla_gen_pre", "bfloat16", 0, 16), r"^an MLA BMM needs tokens and heads \(t=0, h=16\)$"),
        (MlaBmmCase("mla_gen_post", "fp8", 4, 0), r"^an MLA BMM needs tokens and heads \(t=4, h=0\)$"),
        (
            MlaBmmCase("mla_gen_mid", "bfloat16", 4, 16),
            r"^MLA has no absorb BMM 'mla_gen_mid' \(mla_gen_pre, mla_gen_post\)$",
        ),
    ],
)
def test_mla_bmm_layout_refusals(c, pattern):
    refused(KernelLimit, pattern, mla_bmm.bmm_layout, c)


def test_mla_bmm_boundaries_pass():
    assert mla_bmm.bmm_layout(MlaBmmCase("mla_gen_pre", "fp8", 1, 1)).op_name == "mla_gen_pre"
    assert mla_bmm.bmm_layout(MlaBmmCase("mla_gen_post", "bfloat16", 1, 1)).op_name == "mla_gen_post"


@pytest.mark.parametrize("sm", [80, 86, 100, 121])
def test_the_fp8_mla_bmm_has_no_path_off_its_sms(sm):
    refused(KernelLimit, rf"^TensorRT-LLM's fp8 MLA BMM has no path on SM{sm} \(fp8_block_scaling_bmm_out raises\)$",
            mla_bmm.fp8_path, sm, False)  # fmt: skip


def test_the_fp8_mla_bmm_paths():
    assert mla_bmm.fp8_path(89, False) == mla_bmm.fp8_path(90, False) == "quantize_1x128"
    assert mla_bmm.fp8_path(120, False) == "per_token_transform"
    assert mla_bmm.fp8_path(100, True) == "dequant"


# ---- MLA (mla_inputs.py, mla_module.py)


def mla_case(mla_dtype="bfloat16", kv="bfloat16"):
    return MlaCase(mla_dtype, kv, 16, 2, 100, 1, 0)


def mla_module_case(model=V3, gemm_type="bfloat16", mla_dtype="bfloat16", kv="bfloat16"):
    return MlaModuleCase(*model, mla_dtype, kv, gemm_type, 16, 2, 100, 1, 0)


def test_mla_computes_in_bfloat16_only():
    refused(
        KernelLimit, r"^TensorRT-LLM's MLA computes in bfloat16 only, not fp8$", mla_inputs.check_case, mla_case("fp8")
    )
    mla_inputs.check_case(mla_case(kv="fp8"))


@pytest.mark.parametrize("capability, name", [((8, 9), "SM89"), ((8, 0), "SM80"), ((7, 5), "SM75")])
def test_mla_has_no_fmha_below_sm90(capability, name):
    refused(KernelLimit, rf"^TensorRT-LLM's MLA has no FMHA kernel below SM90 \({name}\)$",
            mla_inputs.check_capability, capability)  # fmt: skip
    mla_inputs.check_capability((9, 0))


def test_mla_a_backend_without_mla_parameters_is_an_error():
    pattern = r"^TensorRT-LLM built TrtllmAttention without MLA parameters for an MLA case$"
    refused(RuntimeError, pattern, mla_inputs.kernel_source, "TrtllmAttention", False)
    assert mla_inputs.kernel_source("TrtllmAttention", True) == "default"


def test_mla_module_refusals():
    pattern = r"^the TensorRT-LLM MLA module runner builds DeepSeek-V3 only, not deepseek-ai/DeepSeek-V3\.2$"
    refused(KernelLimit, pattern, mla_module.check_module_case, mla_module_case(("deepseek-ai/DeepSeek-V3.2", V3[1])))
    refused(KernelLimit, "builds DeepSeek-V3 only", mla_module.check_module_case, mla_module_case(("m", V32)))
    mla_module.check_module_case(mla_module_case())
    refused(
        KernelLimit,
        r"^nvfp4 projections need SM100 or newer \(SM90\)$",
        mla_module.check_gemm_capability,
        "nvfp4",
        (9, 0),
    )
    mla_module.check_gemm_capability("nvfp4", (10, 0))
    mla_module.check_gemm_capability("fp8_block", (9, 0))
    pattern = r"^TensorRT-LLM built Attention, not an MLA module, for DeepSeek-V3$"
    refused(RuntimeError, pattern, mla_module.module_source, ["Attention", "Module"], "TrtllmAttention", True)
    assert mla_module.module_source(["DeepseekV3Attention", "MLA"], "TrtllmAttention", True) == "default"


def _cache_release(monkeypatch, full: bool) -> list:
    """The resource manager's classes mla_inputs.kv_cache builds: a pool that takes the requests unless ``full``."""
    events: list = []

    class KVCacheManager:
        def __init__(self, *args, **kwargs):
            events.append("built")

        def add_dummy_requests(self, ids, token_nums=None):
            return None if full else []

        def shutdown(self):
            events.append("shutdown")

    install_fakes(
        monkeypatch,
        {
            "tensorrt_llm._torch.pyexecutor.resource_manager": {
                "CacheTypeCpp": SimpleNamespace(SELFKONLY="selfkonly"),
                "DataType": SimpleNamespace(FP8="fp8", BF16="bf16"),
                "KvCacheConfig": lambda **kw: SimpleNamespace(**kw),
                "KVCacheManager": KVCacheManager,
            },
            "tensorrt_llm.mapping": {"Mapping": lambda **kw: SimpleNamespace(**kw)},
        },
    )
    return events


def test_mla_a_cache_that_takes_no_sequence_is_shut_down_and_an_error(monkeypatch):
    layout = mla_inputs.KvLayout(3, 1, 1, 100, 32)
    events = _cache_release(monkeypatch, full=True)
    pattern = rf"^the MLA cache of {layout.num_blocks} blocks took none of 3 sequences$"
    refused(RuntimeError, pattern, mla_inputs.kv_cache, layout, "bfloat16")
    assert events == ["built", "shutdown"]
    events = _cache_release(monkeypatch, full=False)
    assert mla_inputs.kv_cache(layout, "bfloat16") is not None and events == ["built"]


# ---- MoE (moe_inputs.py, moe.py)


def moe_case(dtype="bfloat16", hidden=256, inter=512, tp=1):
    return MoeCase(dtype, 16, hidden, inter, 2, 8, tp, 1, "balanced")


@pytest.mark.parametrize(
    "c, pattern",
    [
        (
            moe_case("int4_wo"),
            r"^TensorRT-LLM's MoE has no int4 weight-only \(bf16 activation\) path: CUTLASS runs int4 groups",
        ),
        (moe_case("int8_wo"), r"^the TensorRT-LLM MoE runner has no int8_wo path$"),
        (
            moe_case("fp8_block", hidden=192),
            r"^block fp8 experts need hidden and per-rank inter % 128 == 0 \(192, 512\)$",
        ),
        (
            moe_case("fp8_block", inter=512, tp=8),
            r"^block fp8 experts need hidden and per-rank inter % 128 == 0 \(256, 64\)$",
        ),
        (
            moe_case("bfloat16", inter=8),
            r"^TRT-LLM fused MoE needs the per-rank inter size % 16 == 0 for bfloat16 \(got 8\)$",
        ),
        (
            moe_case("nvfp4", inter=256, tp=8),
            r"^TRT-LLM fused MoE needs the per-rank inter size % 64 == 0 for nvfp4 \(got 32\)$",
        ),
    ],
)
def test_moe_case_refusals(c, pattern):
    refused(KernelLimit, pattern, moe_inputs.check_case, c)


@pytest.mark.parametrize(
    "c", [moe_case("fp8_block", hidden=128, inter=128), moe_case("bfloat16", inter=16), moe_case("nvfp4", inter=64)]
)
def test_moe_case_boundaries_pass(c):
    moe_inputs.check_case(c)


def test_moe_runs_on_cuda_devices_only():
    refused(
        KernelLimit, r"^TensorRT-LLM's MoE runs on CUDA devices only$", moe.prepare, moe_case(), "CUTLASS", "cpu", 1
    )


def test_moe_a_backend_that_refuses_the_experts_is_a_kernel_limit(monkeypatch):
    torch = pytest.importorskip("torch")

    def create_moe(**kwargs):
        raise NotImplementedError("WInt4AFP8FusedMoEMethod runs on SM89/90 only")

    record = lambda *a, **kw: SimpleNamespace(args=a, **kw)  # noqa: E731
    install_fakes(
        monkeypatch,
        {
            "tensorrt_llm._torch.model_config": {"ModelConfig": record},
            "tensorrt_llm._torch.modules.fused_moe.create_moe": {
                "ActivationType": SimpleNamespace(Swiglu="swiglu", Relu2="relu2"),
                "create_moe": create_moe,
            },
            "tensorrt_llm._torch.modules.fused_moe.routing": {"RenormalizeMoeRoutingMethod": record},
            "tensorrt_llm.models.modeling_utils": {"QuantAlgo": {}, "QuantConfig": record},
            "tensorrt_llm.mapping": {"Mapping": lambda **kw: SimpleNamespace(**kw)},
        },
    )
    c = moe_case()
    layout = moe_inputs.moe_layout(c, moe_inputs.choose_backend(c, 90))
    pattern = r"^TensorRT-LLM refuses bfloat16 experts for MoeCase\(.*\): WInt4AFP8FusedMoEMethod runs on SM89/90 only$"
    refused(KernelLimit, pattern, moe.build, c, layout, "cpu", 90, 0)
    assert torch.get_default_device() == torch.device("cpu")


# ---- MiniMax-M3 sparse attention (msa_inputs.py, msa.py)


def msa(heads=16, batch=2, isl=100, step=128, kv="bfloat16", gemm_type="bfloat16", mla="bfloat16", arch=M3):
    return MlaModuleCase("MiniMaxAI/MiniMax-M3", arch, mla, kv, gemm_type, heads, batch, isl, 1, step)


@pytest.mark.parametrize(
    "c, pattern",
    [
        (msa(mla="fp8"), r"^TensorRT-LLM's MiniMax-M3 sparse attention is bf16 only, not fp8 over bfloat16$"),
        (msa(kv="fp8"), r"^TensorRT-LLM's MiniMax-M3 sparse attention is bf16 only, not bfloat16 over fp8$"),
        (msa(gemm_type="int4_wo"), r"^the TensorRT-LLM MSA runner has no int4_wo projections$"),
        (msa(isl=0), r"^an MSA case needs new tokens, a batch, heads and no negative step: MlaModuleCase\("),
        (msa(step=-1), r"^an MSA case needs new tokens"),
        (msa(batch=0), r"^an MSA case needs new tokens"),
        (msa(heads=0), r"^an MSA case needs new tokens"),
        (msa(arch="MiniMaxM2ForCausalLM"), r"^the TensorRT-LLM MSA runner knows no config of MiniMaxM2ForCausalLM \("),
        # 64 query heads over 4 KV heads: 48 heads keep 3 KV heads, which do not divide the 4 index heads
        (msa(heads=48), r"^TensorRT-LLM's MiniMax-M3 sparse backend needs the KV heads to divide the index heads: 48 "),
    ],
)
def test_msa_case_refusals(c, pattern):
    refused(KernelLimit, pattern, msa_inputs.check_case, c)


@pytest.mark.parametrize("c", [msa(heads=1, batch=1, isl=1, step=0), msa(heads=32), msa(heads=64), msa(heads=16)])
def test_msa_case_boundaries_pass(c):
    msa_inputs.check_case(c)


def test_msa_device_refusals():
    refused(
        KernelLimit,
        r"^nvfp4 projections need SM100 or newer \(SM90\)$",
        msa_inputs.check_capability,
        msa(gemm_type="nvfp4"),
        (9, 0),
    )
    refused(
        KernelLimit,
        r"^fp8_block projections need SM89 or newer \(SM86\)$",
        msa_inputs.check_capability,
        msa(gemm_type="fp8_block"),
        (8, 6),
    )
    msa_inputs.check_capability(msa(gemm_type="nvfp4"), (10, 0))
    msa_inputs.check_capability(msa(gemm_type="fp8_block"), (8, 9))


def test_msa_a_sparse_config_without_its_geometry_is_refused():
    keys = msa_inputs.model_keys(M3)
    del keys["sparse_attention_config"]["sparse_init_block"]
    del keys["sparse_attention_config"]["sparse_topk_blocks"]
    pattern = r"^MiniMax-M3's sparse_attention_config lacks sparse_topk_blocks, sparse_init_block: no sparse geometry$"
    refused(KernelLimit, pattern, msa_inputs.sparse_fields, keys, "msa")
    assert "sparse_init_block" in msa_inputs.MODELS[M3]["sparse_attention_config"]  # a copy was changed
    assert msa_inputs.sparse_fields(msa_inputs.model_keys(M3), "msa")["implementation"] == "msa"


def test_msa_a_backend_of_the_other_route_is_an_error():
    attention, metadata = msa_inputs.MSA_ATTENTION, msa_inputs.MSA_METADATA
    pattern = rf"^TensorRT-LLM built TritonSparse with {metadata} for the 'msa' MiniMax-M3 route$"
    refused(RuntimeError, pattern, msa_inputs.module_label, "msa", ["TritonSparse"], [metadata])
    refused(
        RuntimeError, "for the 'triton' MiniMax-M3 route", msa_inputs.module_label, "triton", [attention], [metadata]
    )
    assert msa_inputs.module_label("msa", [attention], [metadata]) == "msa_fmha_sm100"
    assert msa_inputs.module_label("triton", ["TritonSparse"], ["TritonMetadata"]) == "default"


def test_msa_a_dense_layer_zero_is_an_error(monkeypatch):
    pytest.importorskip("torch")
    from opcollect.backends.trtllm import msa as msa_runner

    sparse = []

    class MiniMaxM3DecoderLayer:
        def __init__(self, model_config, layer_idx, aux_stream_dict):
            self.self_attn = SimpleNamespace(is_sparse_attention_layer=sparse[-1])

    install_fakes(
        monkeypatch, {"tensorrt_llm._torch.models.modeling_minimaxm3": {"MiniMaxM3DecoderLayer": MiniMaxM3DecoderLayer}}
    )
    monkeypatch.setattr(msa_runner, "aux_streams", lambda device: {})
    monkeypatch.setattr(msa_runner, "create_weights", lambda module: None)
    monkeypatch.setattr(msa_runner, "load_dummy_weights", lambda module, device: None)
    sparse.append(False)
    pattern = r"^TensorRT-LLM built a dense MiniMax-M3 attention for the one sparse layer \(T:492-494\)$"
    refused(RuntimeError, pattern, msa_runner.build_module, object(), "cpu")
    sparse.append(True)
    assert msa_runner.build_module(object(), "cpu").is_sparse_attention_layer


# ---- quantize (quantize.py)


@pytest.mark.parametrize(
    "c, pattern",
    [
        (QuantizeCase(4, 1024, "int8"), r"^TensorRT-LLM's per-tensor quantize ops quantize to fp8 only, not int8$"),
        (QuantizeCase(0, 1024, "fp8"), r"^TensorRT-LLM's quantize ops refuse an empty input \(m=0, k=1024\)$"),
        (QuantizeCase(4, 0, "fp8"), r"^TensorRT-LLM's quantize ops refuse an empty input \(m=4, k=0\)$"),
    ],
)
def test_quantize_case_refusals(c, pattern):
    refused(KernelLimit, pattern, quantize.check_case, c)
    quantize.check_case(QuantizeCase(1, 1, "fp8"))


def _tensor(shape, dtype="torch.float8_e4m3fn", ptr=1):
    return SimpleNamespace(shape=shape, dtype=dtype, data_ptr=lambda: ptr)


def test_quantize_what_the_op_did_not_do_is_an_error():
    given = _tensor((), "torch.float32", ptr=7)
    pattern = r"^TensorRT-LLM's quantize wrote torch\.bfloat16 \(2, 8\) for an input of \(2, 8\)$"
    refused(RuntimeError, pattern, quantize.kernel_ran, _tensor((2, 8), "torch.bfloat16"), given, given, (2, 8), False)
    refused(RuntimeError, r"wrote torch\.float8_e4m3fn \(2, 4\) for an input of \(2, 8\)$",
            quantize.kernel_ran, _tensor((2, 4)), given, given, (2, 8), False)  # fmt: skip
    pattern = r"^quantize_e4m3_per_tensor returned a scale of shape \(2, 1\), not \(1, 1\)$"
    refused(RuntimeError, pattern, quantize.kernel_ran, _tensor((2, 8)), _tensor((2, 1)), None, (2, 8), True)
    assert quantize.kernel_ran(_tensor((2, 8)), _tensor((1, 1)), None, (2, 8), True) == quantize.KERNEL_SOURCE
    assert quantize.kernel_ran(_tensor((2, 8)), given, given, (2, 8), False) == quantize.KERNEL_SOURCE


def test_compute_scale_refuses_two_ops_that_ran_different_kernels(monkeypatch):
    stats = Stats(0.002, 0.001, 0.003, 10, 1.0, "graph", 1, 0.1, 0.01, l2="flush", sm_clock_mhz=1980.0)
    sources = {"dynamic": "torch_ops", "static": "other_ops"}

    def measure_cases(runner, dispatch, cases, device, config):
        which = "dynamic" if runner is quantize.DYNAMIC_RUNNER else "static"
        return [Measured(stats, sources[which])]

    monkeypatch.setattr(quantize.timing, "measure_cases", measure_cases)
    pattern = r"^compute_scale: the two ops ran torch_ops and other_ops$"
    refused(RuntimeError, pattern, quantize.measure_compute_scale, [QuantizeCase(1, 768, "fp8")], "cpu", None)
    sources["static"] = "torch_ops"
    (row,) = quantize.measure_compute_scale([QuantizeCase(1, 768, "fp8")], "cpu", None)
    assert row.kernel_source == "torch_ops"


# ---- torch_ops.py


def test_the_fp8_mla_bmm_wrapper_needs_its_source(monkeypatch, tmp_path):
    refused(KernelLimit, r"^TensorRT-LLM's fp8 MLA BMM wrapper: .*attention\.py", torch_ops.fp8_bmm_wrapper, tmp_path)
    torch_ops.installed_fp8_bmm_wrapper.cache_clear()
    try:
        monkeypatch.setattr(torch_ops, "installed_root", lambda: None)
        pattern = r"^TensorRT-LLM's fp8 MLA BMM wrapper: tensorrt_llm is not installed$"
        refused(KernelLimit, pattern, torch_ops.installed_fp8_bmm_wrapper)
    finally:
        torch_ops.installed_fp8_bmm_wrapper.cache_clear()
    body = "def fp8_block_scaling_bmm_out(mat1, mat2_fp8, mat2_scale, out):\n    out.copy_(output)\n"
    (tmp_path / "_torch" / "modules").mkdir(parents=True)
    (tmp_path / "_torch" / "modules" / "attention.py").write_text(body)
    assert torch_ops.fp8_bmm_wrapper(tmp_path).copies_output


def test_torch_op_names_the_op_the_release_does_not_register(monkeypatch):
    torch = pytest.importorskip("torch")
    install_fakes(monkeypatch, {"tensorrt_llm._torch.custom_ops": {}})
    pattern = r"^the installed TensorRT-LLM registers no torch\.ops\.opcollect_absent\.no_such_op$"
    refused(KernelLimit, pattern, torch_ops.torch_op, "opcollect_absent", "no_such_op")
    assert torch_ops.torch_op("aten", "add") is torch.ops.aten.add


# ---- all-reduce (allreduce.py, allreduce_preflight.py)


def test_allreduce_label_refuses_a_group_smaller_than_the_case():
    refused(RuntimeError, r"^TensorRT-LLM's AllReduce spans 4 ranks, the case 8$", ar.kernel_label, "AUTO", 4, 8)
    assert ar.kernel_label("AUTO", 8, 8) == "TRTLLM"


def test_allreduce_preflight_refusals(monkeypatch, tmp_path):
    monkeypatch.setattr(preflight, "installed_root", lambda: None)
    refused(KernelLimit, r"^TensorRT-LLM's all-reduce: tensorrt_llm is not installed$", preflight.check_installed)
    found = preflight.problems(tmp_path)  # an empty package: every file missing
    assert len(found) > 1
    pattern = (
        r"^TensorRT-LLM's all-reduce cannot start its ranks without MPI here: "
        + re.escape(found[0])
        + rf" \(and {len(found) - 1} more\)$"
    )
    refused(KernelLimit, pattern, preflight.check_installed, tmp_path)


def _rank_world(monkeypatch, mpi_off: bool):
    """The stand-ins _init_world imports: cuda-python's runtime, torch.distributed's calls, TorchDist, Mapping."""
    torch = pytest.importorskip("torch")

    class TorchDist:
        def __init__(self, mapping):
            self.setup_local_comm()

    install_fakes(
        monkeypatch,
        {
            "cuda.bindings.runtime": {"cudaSetDevice": lambda rank: None},
            "tensorrt_llm._torch.distributed.communicator": {"TorchDist": TorchDist},
            "tensorrt_llm._utils": {"mpi_disabled": lambda: mpi_off},
            "tensorrt_llm.mapping": {"Mapping": lambda **kw: SimpleNamespace(tp_group_pg="pg", **kw)},
        },
    )
    for name in ("TLLM_DISABLE_MPI", "TLLM_DISABLE_ALLREDUCE_AUTOTUNE"):
        monkeypatch.setenv(name, "0")  # restored after the test; _init_world sets them
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda **kw: None)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
    monkeypatch.setattr(torch.distributed, "new_group", lambda **kw: SimpleNamespace(**kw))
    monkeypatch.setattr(ar, "_WORLD", {})


def test_a_rank_whose_world_still_uses_mpi_refuses(monkeypatch):
    _rank_world(monkeypatch, mpi_off=False)
    pattern = r"^TensorRT-LLM's all-reduce without MPI: mpi_disabled\(\) is False with TLLM_DISABLE_MPI=1"
    refused(KernelLimit, pattern, ar._init_world, 0, 2, 29500)
    _rank_world(monkeypatch, mpi_off=True)
    ar._init_world(0, 2, 29500)
    assert ar._WORLD["comm"].local_comm is ar._WORLD["local_comm"]


def test_an_allreduce_built_for_mpi_refuses(monkeypatch):
    pytest.importorskip("torch")
    built = SimpleNamespace(_disable_mpi=False)
    install_fakes(monkeypatch, {"tensorrt_llm._torch.distributed.ops": {"AllReduce": lambda mapping, dtype: built}})
    monkeypatch.setattr(ar, "_WORLD", {"mapping": SimpleNamespace(tp_size=1)})
    row = {"allreduce_dtype": "bfloat16", "message_size": 1024, "num_gpus": 2}
    problem = preflight.allreduce_problem(built)
    refused(KernelLimit, "^" + re.escape(f"TensorRT-LLM's all-reduce without MPI: {problem}") + "$",
            ar._time_one, row, "cpu", None, None)  # fmt: skip
    built._disable_mpi, built.strategy = True, SimpleNamespace(name="AUTO")
    # past the check: the next one compares the Mapping's group with the case
    refused(RuntimeError, "spans 1 ranks, the case 2", ar._time_one, row, "cpu", None, None)
