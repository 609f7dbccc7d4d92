"""The SGLang and vLLM runners' refusals of what their frameworks do not serve: each calls the real check with a case
from the plans holding the refused value and asserts the KernelLimit (or RuntimeError) and its message; where cheap,
the nearest accepted case gets past that check (to the framework import, absent here, or to a stand-in). No framework
is installed and no GPU is used; the few calls that reach a framework import meet the stand-ins of conftest's
install_fakes."""

from __future__ import annotations

import re
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
from conftest import install_fakes

from opcollect.backends.sglang import attention as sg_attn
from opcollect.backends.sglang import context as sg_context
from opcollect.backends.sglang import dsa as sg_dsa
from opcollect.backends.sglang import dsa_inputs as sg_dsa_inputs
from opcollect.backends.sglang import dsa_kernels as sg_dk
from opcollect.backends.sglang import dsv4 as sg_dsv4
from opcollect.backends.sglang import dsv4_inputs as sg_dsv4_inputs
from opcollect.backends.sglang import dsv4_kernels as sg_d4k
from opcollect.backends.sglang import encoder_attention as sg_enc
from opcollect.backends.sglang import gdn as sg_gdn
from opcollect.backends.sglang import gemm as sg_gemm
from opcollect.backends.sglang import mla as sg_mla
from opcollect.backends.sglang import mla_bmm as sg_bmm
from opcollect.backends.sglang import moe as sg_moe
from opcollect.backends.sglang import quantize as sg_quant
from opcollect.backends.vllm import attention as vl_attn
from opcollect.backends.vllm import dsa as vl_dsa
from opcollect.backends.vllm import dsa_inputs as vl_dsa_inputs
from opcollect.backends.vllm import dsv4 as vl_dsv4
from opcollect.backends.vllm import dsv4_inputs as vl_dsv4_inputs
from opcollect.backends.vllm import encoder_attention as vl_enc
from opcollect.backends.vllm import gemm as vl_gemm
from opcollect.backends.vllm import mla as vl_mla
from opcollect.backends.vllm import mla_bmm as vl_bmm
from opcollect.backends.vllm import moe as vl_moe
from opcollect.backends.vllm import msa as vl_msa
from opcollect.backends.vllm import msa_inputs as vl_msa_inputs
from opcollect.backends.vllm import quantize as vl_quant
from opcollect.plans.attention import AttentionCase
from opcollect.plans.dsa import DsaModuleCase
from opcollect.plans.dsa_kernels import Glm5Case, Glm5TopkCase
from opcollect.plans.dsv4 import Dsv4ModuleCase
from opcollect.plans.dsv4_kernels import Dsv4KernelCase, Dsv4TopkCase
from opcollect.plans.gemm import GemmCase
from opcollect.plans.linear_attention import GdnCase
from opcollect.plans.mla import MlaCase
from opcollect.plans.mla_bmm import MlaBmmCase
from opcollect.plans.mla_module import MlaModuleCase
from opcollect.plans.moe import MoeCase
from opcollect.plans.quantize import QuantizeCase
from opcollect.runtime.contract import KernelLimit

torch = pytest.importorskip("torch")  # the runners import it right after their checks; the stand-ins build tensors


class Reached(Exception):
    """Raised by a stand-in: the call got past the checks under test."""


def not_refused(fragment: str, fn, *args) -> None:
    """``fn(*args)`` is not refused with a message matching ``fragment``: it returns, or stops later (at the absent
    framework's import, a stand-in, or another check)."""
    try:
        fn(*args)
    except KernelLimit as err:
        assert not re.search(fragment, str(err)), f"refused the accepted input: {err}"
    except Exception:  # noqa: BLE001 - got past the check
        pass


# --- cases ------------------------------------------------------------------------------------------------------------

GLM, V32 = "GlmMoeDsaForCausalLM", "DeepseekV32ForCausalLM"
FLASH, V4 = "sgl-project/DeepSeek-V4-Flash-FP8", "DeepseekV4ForCausalLM"
M3 = "MiniMaxM3ForCausalLM"
FP8_LABELS = ("fp8_e4m3", "fp8_e4m3", "fp8_block")


def acase(attn="bfloat16", kv="bfloat16", beam=1, isl=20, step=0, head_dim=64):
    return AttentionCase(2, isl, 4, 4, head_dim, beam, attn, kv, step, 0)


def mcase(mla="bfloat16", kv="bfloat16"):
    return MlaCase(mla, kv, 16, 2, 100, 1, 0)


def dsa_case(arch=V32, mla="bfloat16", kv="bfloat16", gemm="bfloat16", batch=2, isl=100, step=128, model=None):
    model = model or {V32: "deepseek-ai/DeepSeek-V3.2", GLM: "zai-org/GLM-5"}[arch]
    return DsaModuleCase("dsa_context_module", model, arch, mla, kv, gemm, 32, batch, isl, 1, step)


def glm_case(labels=FP8_LABELS, batch=2, isl=3, step=5, ratio=1, heads=64):
    return Glm5Case("zai-org/GLM-5", GLM, *labels, heads, batch, isl, 1, step, ratio)


def glm_topk(batch=2, isl=3, step=2100, mode="top_last"):
    return Glm5TopkCase("zai-org/GLM-5", GLM, *FP8_LABELS, 64, batch, isl, 1, step, 1, mode)


def v4_module(labels=("bfloat16", "fp8_e4m3"), gemm="fp8_block", batch=2, isl=5, step=300, ratio=4, tp=1):
    return Dsv4ModuleCase(FLASH, V4, *labels, gemm, 64 // tp, batch, isl, tp, step, ratio)


def v4_kernel(labels=FP8_LABELS, batch=2, isl=3, step=300, ratio=4):
    return Dsv4KernelCase(FLASH, V4, *labels, 64, 64, batch, isl, 1, step, ratio)


def v4_topk(step=2100, isl=3, mode="v1_top_last"):
    return Dsv4TopkCase(FLASH, V4, *FP8_LABELS, 64, 2, isl, 1, step, 4, mode)


def moe_case(dtype="bfloat16", hidden=256, inter=512, experts=8, tp=1, ep=1):
    return MoeCase(dtype, 16, hidden, inter, 2, experts, tp, ep, "balanced")


def gdn_case(phase="context", tokens=5):
    return GdnCase("conv", phase, 1, tokens, tokens, 1024, 4, 1, 128, 1, 128, "Qwen/Qwen3.5-27B")


def vl_mla_case(mla="bfloat16", kv="bfloat16", gemm="bfloat16"):
    return MlaModuleCase("deepseek-ai/DeepSeek-V3", "DeepseekV3ForCausalLM", mla, kv, gemm, 128, 2, 100, 1, 0)


def vl_dsv4_case(mla="bfloat16", kv="fp8", gemm="fp8_block", ratio=4, heads=64):
    return Dsv4ModuleCase(FLASH, V4, mla, kv, gemm, heads, 2, 100, 1, 128, ratio)


def vl_v4_kernel(mla="fp8_e4m3", ratio=128):
    return Dsv4KernelCase(FLASH, V4, mla, "fp8", "fp8_block", 64, 64, 2, 16, 1, 300, ratio)


def msa_case(mla="bfloat16", kv="bfloat16", isl=100, step=128):
    return MlaModuleCase("MiniMaxAI/MiniMax-M3", M3, mla, kv, "bfloat16", 64, 2, isl, 1, step)


def encoder_case(dtype):
    return SimpleNamespace(batch_size=2, isl=5, num_heads=3, head_dim=16, attn_dtype=dtype)


# --- SGLang attention and MLA -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case, context, message",
    [
        (acase(attn="float32"), True, r"SGLang serves attention in the model dtype \(bf16\), not float32"),
        (acase(attn="fp8"), True, r"SGLang computes attention in fp8 only in prefill, over an fp8 KV cache"),
        (acase(attn="fp8", kv="fp8", isl=1, step=5), False, r"fp8 only in prefill, over an fp8 KV cache"),
        (acase(beam=2), True, r"SGLang serves no beam search; beam_width must be 1"),
    ],
)
def test_sglang_attention_refuses_before_the_import(case, context, message):
    with pytest.raises(KernelLimit, match=message):
        sg_attn.prepare(case, "x", "cpu", 1, context)


@pytest.mark.parametrize(
    "case, context, fragment",
    [
        (acase(attn="bfloat16"), True, "model dtype"),
        (acase(attn="fp8", kv="fp8"), True, "fp8 only in prefill"),
        (acase(beam=1), True, "beam search"),
    ],
)
def test_sglang_attention_accepts_the_nearest_cases(case, context, fragment):
    not_refused(fragment, sg_attn.prepare, case, "x", "cpu", 1, context)


@pytest.mark.parametrize("module", [sg_attn, sg_mla])
def test_sglang_attention_and_mla_build_no_unknown_backend(module):
    what = "attention" if module is sg_attn else "MLA"
    with pytest.raises(KernelLimit, match=rf"the SGLang {what} runner does not build the flex backend"):
        getattr(module, "backend_class" if module is sg_attn else "mla_backend_class")("flex")


@contextmanager
def _no_server_args(device, **args):
    yield SimpleNamespace(**args)


def _pool(*args, **kw):
    raise Reached


def _sglang_attention_world(monkeypatch):
    install_fakes(
        monkeypatch,
        {
            "sglang.srt.configs.model_config": {"AttentionArch": SimpleNamespace(MHA="MHA", MLA="MLA")},
            "sglang.srt.layers.radix_attention": {"RadixAttention": object},
            "sglang.srt.mem_cache.memory_pool": {"MHATokenToKVPool": _pool, "MLATokenToKVPool": _pool},
            "sglang.srt.model_executor.forward_context": {"ForwardContext": object, "forward_context": None},
            "sglang.srt.speculative.spec_info": {"SpeculativeAlgorithm": SimpleNamespace(NONE=0)},
        },
    )
    monkeypatch.setattr(sg_context, "sglang_context", _no_server_args)


@pytest.mark.parametrize(
    "backend, case, wanted",
    [
        ("fa3", acase(attn="bfloat16", kv="fp8"), "fp8"),  # fa3 quantizes q to the fp8 cache's dtype
        ("trtllm_mha", acase(attn="bfloat16", kv="fp8"), "fp8"),
        ("triton", acase(attn="fp8", kv="fp8"), "bf16"),  # triton reads an fp8 cache with bf16 queries
        ("fa3", acase(attn="fp8", kv="fp8", head_dim=512), "bf16"),  # fa3 past head_dim 256 does not quantize q
    ],
)
def test_sglang_attention_refuses_a_prefill_its_backend_computes_otherwise(monkeypatch, backend, case, wanted):
    _sglang_attention_world(monkeypatch)
    monkeypatch.setattr(sg_attn, "select_mha_backend", lambda case, args: backend)
    with pytest.raises(KernelLimit, match=rf"SGLang's {backend} computes this prefill in {wanted}"):
        sg_attn.prepare(case, "x", "cpu", 1, True)


@pytest.mark.parametrize(
    "backend, case",
    [
        ("fa3", acase(attn="fp8", kv="fp8", head_dim=256)),
        ("fa3", acase(attn="bfloat16", kv="fp8", head_dim=512)),
        ("triton", acase(attn="bfloat16", kv="fp8")),
        ("fa3", acase()),
    ],
)
def test_sglang_attention_builds_the_prefill_its_backend_computes(monkeypatch, backend, case):
    _sglang_attention_world(monkeypatch)
    monkeypatch.setattr(sg_attn, "select_mha_backend", lambda case, args: backend)
    with pytest.raises(Reached):  # on to the KV pool
        sg_attn.prepare(case, "x", "cpu", 1, True)


@pytest.mark.parametrize("field", ["mla_dtype", "kv_cache_dtype"])
def test_sglang_mla_refuses_an_unknown_dtype(field):
    case = mcase()._replace(**{field: "float32"})
    with pytest.raises(KernelLimit, match=rf"SGLang's MLA runs no float32 {field}"):
        sg_mla.prepare(case, "x", "cpu", 1, True)


@pytest.mark.parametrize("case", [mcase(mla="fp8"), mcase(kv="fp8")])
def test_sglang_triton_mla_refuses_an_fp8_cache(monkeypatch, case):
    _sglang_attention_world(monkeypatch)
    monkeypatch.setattr(sg_mla, "select_mla_backend", lambda args: "triton")
    with pytest.raises(KernelLimit, match=r"SGLang's triton MLA is collected with a bf16 latent cache only"):
        sg_mla.prepare(case, "x", "cpu", 1, True)
    not_refused("bf16 latent cache", sg_mla.prepare, mcase(), "x", "cpu", 1, True)
    monkeypatch.setattr(sg_mla, "select_mla_backend", lambda args: "fa3")
    not_refused("bf16 latent cache", sg_mla.prepare, case, "x", "cpu", 1, True)


# --- SGLang DSA -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case, message",
    [
        (dsa_case(mla="fp8"), r"SGLang's DSA runs bf16 queries, not fp8"),
        (dsa_case(kv="int8"), r"SGLang's DSA has no int8 cache \(bf16 or fp8_e4m3\)"),
        (dsa_case(model="deepseek-ai/DeepSeek-V4", arch="DeepseekV4ForCausalLM"), r"knows no config of"),
        (dsa_case(arch=GLM, model="deepseek-ai/DeepSeek-V3.2"), r"the SGLang DSA runner knows no config of"),
        (dsa_case(batch=0), r"a DSA prefill needs requests with new tokens:"),
        (dsa_case(isl=0), r"a DSA prefill needs requests with new tokens:"),
    ],
)
def test_sglang_dsa_module_refuses_before_the_import(case, message):
    with pytest.raises(KernelLimit, match=message):
        sg_dsa.check_case(case, True)


def test_sglang_dsa_decode_with_a_negative_step_is_refused_and_step_zero_accepted():
    with pytest.raises(KernelLimit, match=r"a DSA decode needs requests with new tokens:"):
        sg_dsa_inputs.layout(dsa_case(isl=1, step=-1), False)
    assert sg_dsa_inputs.layout(dsa_case(isl=1, step=0, batch=1), False).batch_size == 1
    assert sg_dsa.check_case(dsa_case(), True)[1].seq_len == 228  # the accepted case: 128 cached + 100 new


@pytest.mark.parametrize(
    "case, op, message",
    [
        (glm_case(labels=("bfloat16", "fp8_e4m3", "fp8_block")), "glm5_mqa_logits_module",
         r"glm5_mqa_logits_module runs fixed dtypes under the reference's labels"),
        (glm_case(), "glm5_dsa_attn_module", r"glm5_dsa_attn_module runs fixed dtypes under the reference's labels"),
        (glm_case(ratio=4), "glm5_mqa_logits_module", r"GLM-5's DSA compresses nothing: compress_ratio 1, not 4"),
        (glm_case(batch=0), "glm5_mqa_logits_module", r"glm5_mqa_logits_module needs requests with new tokens:"),
        (glm_case(isl=0), "glm5_mqa_logits_module", r"needs requests with new tokens:"),
        (glm_case(step=-1), "glm5_mqa_logits_module", r"needs requests with new tokens:"),
    ],
)  # fmt: skip
def test_sglang_glm5_kernels_check_refuses(case, op, message):
    with pytest.raises(KernelLimit, match=message):
        sg_dk.check(case, op)


def test_sglang_glm5_kernels_check_accepts_the_nearest_case():
    sg_dk.check(glm_case(batch=1, isl=1, step=0), "glm5_mqa_logits_module")
    sg_dk.check(glm_case(labels=("bfloat16", "fp8_e4m3", "fp8_block")), "glm5_dsa_attn_module")


def test_sglang_glm5_kernels_know_no_dimensions_of_another_architecture():
    with pytest.raises(KernelLimit, match=r"the SGLang GLM-5 kernel runner knows no dimensions of Foo"):
        sg_dk.dims(glm_case()._replace(architecture="Foo"))


def test_sglang_glm5_mqa_logits_refuses_without_deepgemm(monkeypatch):
    install_fakes(
        monkeypatch, {"sglang.srt.layers.attention.dsa.dsa_indexer": {"deep_gemm": ImportError("no deep_gemm")}}
    )
    with pytest.raises(KernelLimit, match=r"SGLang's indexer has no DeepGEMM here: no deep_gemm"):
        sg_dk.prepare_mqa(glm_case(), "x", "cpu", 1)


def test_sglang_glm5_topk_refuses_an_unknown_score_mode_and_a_trivial_case():
    with pytest.raises(KernelLimit, match=r"SGLang's top-k is timed on score modes .*, not 'random'"):
        sg_dk.prepare_topk(glm_topk(mode="random"), "x", "cpu", 1)
    message = r"a request within index_topk selects every token: the plan holds it at 0, untimed"
    with pytest.raises(KernelLimit, match=message):
        sg_dk.prepare_topk(glm_topk(step=2045, isl=3), "x", "cpu", 1)  # 2048 keys: index_topk takes them all
    for mode in ("flat", "top_last"):
        not_refused("score modes|index_topk", sg_dk.prepare_topk, glm_topk(step=2046, isl=3, mode=mode), "x", "cpu", 1)


@pytest.mark.parametrize("heads, sm, padded", [(64, 9, 64), (32, 9, 64), (128, 10, 128), (64, 10, 128), (16, 10, 128)])
def test_sglang_sparse_mla_pads_heads_that_divide_the_tile(heads, sm, padded):
    assert sg_dk.padded_heads(heads, sm) == padded


@pytest.mark.parametrize("heads, sm, required", [(48, 9, 64), (96, 10, 128), (24, 10, 128)])
def test_sglang_sparse_mla_refuses_heads_that_do_not_divide_the_tile(heads, sm, required):
    with pytest.raises(KernelLimit, match=rf"{heads} heads cannot be padded to {required}"):
        sg_dk.padded_heads(heads, sm)


# --- SGLang DeepSeek-V4 -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ratio", [0, 1, 8, 64])
def test_sglang_dsv4_module_refuses_an_unknown_compress_ratio(ratio):
    with pytest.raises(KernelLimit, match=rf"DeepSeek-V4's compressed layers have ratio 4 or 128, not {ratio}"):
        sg_dsv4.check_case(v4_module(ratio=ratio), True)


@pytest.mark.parametrize("ratio", [4, 128])
def test_sglang_dsv4_module_accepts_its_ratios(ratio):
    sg_dsv4.check_case(v4_module(ratio=ratio), True)


@pytest.mark.parametrize(
    "case, context, message",
    [
        (v4_module(batch=0), True, r"a DeepSeek-V4 prefill needs requests with new tokens:"),
        (v4_module(isl=0), True, r"a DeepSeek-V4 prefill needs requests with new tokens:"),
        (v4_module(isl=1, step=-1), False, r"a DeepSeek-V4 decode needs requests with new tokens:"),
        (v4_module(isl=1, step=1048576), False, rf"1048577 tokens exceed {FLASH}'s 1048576 positions"),
        (v4_module(isl=1048577, step=0), True, rf"1048577 tokens exceed {FLASH}'s 1048576 positions"),
    ],
)
def test_sglang_dsv4_layout_refuses(case, context, message):
    with pytest.raises(KernelLimit, match=message):
        sg_dsv4_inputs.layout(case, context)


def test_sglang_dsv4_layout_accepts_the_longest_sequence_and_the_first_step():
    assert sg_dsv4_inputs.layout(v4_module(isl=1, step=1048575), False) is not None  # 1048576 tokens: the limit
    assert sg_dsv4_inputs.layout(v4_module(batch=1, isl=1, step=0), False) is not None


@pytest.mark.parametrize(
    "case, message",
    [
        (v4_kernel(labels=("bfloat16", "fp8_e4m3", "fp8_block")),
         r"dsv4_csa_indexer runs fp8 queries and an fp8 indexer cache under the labels"),
        (v4_kernel(ratio=128), r"the CSA indexer compresses by 4, not 128"),
        (v4_kernel(batch=0), r"dsv4_csa_indexer needs requests with new tokens:"),
        (v4_kernel(isl=0), r"needs requests with new tokens:"),
        (v4_kernel(step=-1), r"needs requests with new tokens:"),
    ],
)  # fmt: skip
def test_sglang_dsv4_kernels_check_refuses(case, message):
    with pytest.raises(KernelLimit, match=message):
        sg_d4k.check(case, "dsv4_csa_indexer")


def test_sglang_dsv4_kernels_check_accepts_the_nearest_case():
    sg_d4k.check(v4_kernel(batch=1, isl=1, step=0), "dsv4_csa_indexer")


def test_sglang_dsv4_topk_refuses_a_trivial_case():
    message = r"every row keeps all its entries: the plan holds the case at 0, untimed"
    with pytest.raises(KernelLimit, match=message):
        sg_d4k.prepare_topk(v4_topk(step=2048, isl=3), "x", "cpu", 1)  # 2051 // 4 = 512 = index_topk
    not_refused("keeps all its entries", sg_d4k.prepare_topk, v4_topk(step=2049, isl=3), "x", "cpu", 1)


@pytest.mark.parametrize("flag", [sg_d4k.TILELANG, sg_d4k.AITER])
def test_sglang_dsv4_refuses_an_indexer_it_does_not_model(flag):
    with pytest.raises(KernelLimit, match=rf"{flag} picks an indexer the SGLang DeepSeek-V4 runner does not model"):
        sg_d4k.logits_choice(lambda name: name == flag, False)
    assert isinstance(sg_d4k.logits_choice(lambda name: False, False), str)


# --- SGLang encoder attention, GDN, GEMM, MoE, absorb BMM, quantize ---------------------------------------------------


def test_sglang_encoder_attention_refuses_other_dtypes_and_backends():
    with pytest.raises(KernelLimit, match=r"SGLang's vision attention runs bfloat16, not float16"):
        sg_enc.check_case(encoder_case("float16"))
    sg_enc.check_case(encoder_case("bfloat16"))
    with pytest.raises(KernelLimit, match=r"SGLang chose the sdpa vision attention; the runner times "):
        sg_enc.refuse("sdpa")


def test_sglang_gdn_prefill_refuses_int32_offsets_at_two_to_the_31():
    per_token = sg_gdn.conv_dim(gdn_case())
    below = sg_gdn.INT32_OFFSETS // per_token  # the most tokens under 2^31 elements
    over = -(-sg_gdn.INT32_OFFSETS // per_token)
    sg_gdn.check_case(gdn_case(tokens=below))
    with pytest.raises(KernelLimit, match=r"SGLang's prefill causal_conv1d computes int32 token offsets: num_tokens"):
        sg_gdn.check_case(gdn_case(tokens=over))
    sg_gdn.check_case(gdn_case(phase="generation", tokens=over)._replace(batch_size=over, seq_len=1))


@pytest.mark.parametrize(
    "case, message",
    [
        (GemmCase("float32", 4, 64, 64), r"the SGLang GEMM runner has no float32 path"),
        (GemmCase("int4_wo", 4, 96, 256), r"GPTQ Marlin int4 needs n % 64 == 0 and k % 128 == 0 \(n=96, k=256\)"),
        (GemmCase("int4_wo", 4, 64, 192), r"GPTQ Marlin int4 needs n % 64 == 0 and k % 128 == 0 \(n=64, k=192\)"),
        (GemmCase("nvfp4", 4, 64, 8), r"NVFP4 needs k % 16 == 0 \(k=8\)"),
        (GemmCase("nvfp4", 4, 64, 24), r"NVFP4 needs k % 16 == 0 \(k=24\)"),
    ],
)
def test_sglang_gemm_refuses_shapes_before_the_import(case, message):
    with pytest.raises(KernelLimit, match=message):
        sg_gemm.check_shape(case)


@pytest.mark.parametrize("case", [GemmCase("int4_wo", 4, 64, 128), GemmCase("nvfp4", 4, 64, 16)])
def test_sglang_gemm_accepts_the_smallest_whole_shapes(case):
    sg_gemm.check_shape(case)


DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float8_e4m3fn": torch.float8_e4m3fn,
          "int32": torch.int32, "uint8": torch.uint8}  # fmt: skip


def module_of(specs):
    layer = torch.nn.Module()
    for name, shape, dtype in specs:
        layer.register_parameter(name, torch.nn.Parameter(torch.empty(shape, dtype=DTYPES[dtype]), requires_grad=False))
    return layer


@pytest.mark.parametrize("module, who", [(sg_gemm, "SGLang"), (vl_gemm, "vLLM")])
def test_gemm_fill_refuses_a_layer_shaped_otherwise(module, who):
    layout = module.gemm_layout(GemmCase("fp8_block", 3, 256, 256))
    wrong = module_of((("weight", (64, 64), "float8_e4m3fn"), *layout.scales))
    with pytest.raises(RuntimeError, match=rf"{who} made weight \(64, 64\), the layout says \(256, 256\)"):
        module._fill(wrong, layout, "cpu", 0)
    module._fill(module_of((layout.weight, *layout.scales)), layout, "cpu", 0)


@pytest.mark.parametrize(
    "case, message",
    [
        (moe_case("float32"), r"the SGLang MoE runner has no float32 path"),
        (
            moe_case("fp8_block", inter=384, tp=2),
            r"block fp8 experts need the per-rank inter size % 128 == 0 \(got 192",
        ),
        (moe_case("int4_wo", hidden=240), r"int4_wo experts need hidden and per-rank inter % 32 == 0 \(240, 512\)"),
        (moe_case("nvfp4", inter=528), r"nvfp4 experts need hidden and per-rank inter % 32 == 0 \(256, 528\)"),
        (moe_case("w4a16_mxfp4", inter=512, tp=32), r"w4a16_mxfp4 experts need hidden and per-rank inter % 32 =="),
    ],
)
def test_sglang_moe_layout_refuses(case, message):
    with pytest.raises(KernelLimit, match=message):
        sg_moe.moe_layout(case)


@pytest.mark.parametrize(
    "case",
    [moe_case("fp8_block", inter=256, tp=2), moe_case("int4_wo", hidden=224), moe_case("nvfp4", inter=544),
     moe_case("w4a16_mxfp4", inter=512, tp=16)],
)  # fmt: skip
def test_sglang_moe_layout_accepts_the_nearest_whole_sizes(case):
    sg_moe.moe_layout(case)


@pytest.mark.parametrize(
    "case, message",
    [
        (MlaBmmCase("mla_gen_mid", "bfloat16", 3, 4), r"SGLang's MLA has no absorb BMM 'mla_gen_mid'"),
        (MlaBmmCase("mla_gen_pre", "float16", 3, 4), r"SGLang's absorb BMM runs bfloat16 or fp8 weights, not float16"),
    ],
)
def test_sglang_absorb_bmm_refuses_unknown_ops_and_dtypes(case, message):
    with pytest.raises(KernelLimit, match=message):
        sg_bmm.dims(case)


@pytest.mark.parametrize("sm", ["80", "86", "cpu"])
def test_sglang_fp8_absorb_bmm_needs_sm89(monkeypatch, sm):
    monkeypatch.setattr(sg_bmm, "device_sm", lambda device: sm)
    with pytest.raises(KernelLimit, match=rf"sgl_kernel's bmm_fp8 \(cuBLASLt fp8\) needs CUDA SM >= 89, not {sm}"):
        sg_bmm.prepare(MlaBmmCase("mla_gen_post", "fp8", 3, 4), "x", "cpu", 1)


@pytest.mark.parametrize("sm", ["89", "90"])
def test_sglang_fp8_absorb_bmm_accepts_sm89_and_later(monkeypatch, sm):
    monkeypatch.setattr(sg_bmm, "device_sm", lambda device: sm)
    not_refused("bmm_fp8", sg_bmm.prepare, MlaBmmCase("mla_gen_post", "fp8", 3, 4), "x", "cpu", 1)


def test_sglang_static_quant_is_fp8_only():
    with pytest.raises(KernelLimit, match=r"SGLang's static per-tensor activation quant is fp8 only, not int8"):
        sg_quant.check_case(QuantizeCase(16, 256, "int8"))
    sg_quant.check_case(QuantizeCase(16, 256, "fp8"))


class _ModelOptFp8Config:
    def __init__(self, is_checkpoint_fp8_serialized):
        pass

    @staticmethod
    def get_min_capability():
        return 89


def _method(config):
    raise Reached


@pytest.mark.parametrize("sm, refused", [("80", True), ("88", True), ("cpu", True), ("89", False), ("100", False)])
def test_sglang_modelopt_fp8_needs_its_minimum_capability(monkeypatch, sm, refused):
    install_fakes(
        monkeypatch,
        {
            "sglang.srt.layers.quantization.modelopt_quant": {
                "ModelOptFp8Config": _ModelOptFp8Config,
                "ModelOptFp8LinearMethod": _method,
            }
        },
    )
    monkeypatch.setattr(sg_quant, "device_sm", lambda device: sm)
    if refused:
        with pytest.raises(KernelLimit, match=rf"SGLang serves ModelOpt FP8 on CUDA SM >= 89, not on {sm}"):
            sg_quant.static_repeat_scale("cpu")
    else:
        with pytest.raises(Reached):
            sg_quant.static_repeat_scale("cpu")


# --- vLLM attention, MLA, absorb BMM ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case, message",
    [
        (acase(attn="float32"), r"vLLM's attention backends take bf16/fp16 activations, not float32"),
        (acase(attn="fp8", kv="fp8"), r"vLLM's attention backends take bf16/fp16 activations, not fp8"),
        (acase(kv="int8"), r"vLLM has no int8 KV cache"),
        (acase(beam=2), r"vLLM serves no beam search in its attention kernels; beam_width must be 1"),
    ],
)
def test_vllm_attention_refuses_before_the_import(case, message):
    with pytest.raises(KernelLimit, match=message):
        vl_attn.prepare(case, "x", "cpu", 1, True)


@pytest.mark.parametrize("case", [acase(attn="float16"), acase(kv="fp8"), acase()])
def test_vllm_attention_accepts_the_nearest_cases(case):
    not_refused("activations|KV cache|beam", vl_attn.prepare, case, "x", "cpu", 1, True)


@pytest.mark.parametrize(
    "case, context, message",
    [
        (vl_mla_case(mla="float32"), True, r"vLLM has no float32 MLA query"),
        (
            vl_mla_case(mla="fp8", kv="bfloat16"),
            True,
            r"vLLM quantizes the MLA query to fp8 only for prefill over an fp8",
        ),
        (vl_mla_case(mla="fp8", kv="fp8"), False, r"vLLM quantizes the MLA query to fp8 only for prefill over an fp8"),
        (vl_mla_case(kv="int8"), True, r"vLLM has no int8 MLA cache"),
    ],
)
def test_vllm_mla_check_dtypes_refuses(case, context, message):
    with pytest.raises(KernelLimit, match=message):
        vl_mla.check_dtypes(case, context)


def test_vllm_mla_check_dtypes_accepts_the_fp8_prefill_over_an_fp8_cache():
    vl_mla.check_dtypes(vl_mla_case(mla="fp8", kv="fp8"), True)
    vl_mla.check_dtypes(vl_mla_case(kv="fp8"), False)


@pytest.mark.parametrize(
    "case, message",
    [
        (MlaBmmCase("mla_gen_mid", "bfloat16", 3, 4), r"mla_bmm has no op_name 'mla_gen_mid'; vLLM's MLA runs"),
        (
            MlaBmmCase("mla_gen_pre", "fp8", 3, 4),
            r"vLLM on CUDA runs the MLA absorb BMMs in bf16 torch.bmm only, not fp8",
        ),
    ],
)
def test_vllm_absorb_bmm_check_refuses(case, message):
    with pytest.raises(KernelLimit, match=message):
        vl_bmm.check_case(case)
    vl_bmm.check_case(MlaBmmCase("mla_gen_post", "bfloat16", 3, 4))


@pytest.mark.parametrize("fp8, fp4, refused", [(True, False, True), (False, True, True), (False, False, False)])
def test_vllm_absorb_bmm_refuses_aiter(monkeypatch, fp8, fp4, refused):
    aiter = SimpleNamespace(is_fp8bmm_enabled=lambda: fp8, is_fp4bmm_enabled=lambda: fp4)
    install_fakes(
        monkeypatch,
        {
            "vllm._aiter_ops": {"rocm_aiter_ops": aiter},
            "vllm.model_executor.layers.attention": {"MLAAttention": object},
            "vllm.model_executor.layers.linear": {"ColumnParallelLinear": object},
        },
    )
    case = MlaBmmCase("mla_gen_pre", "bfloat16", 3, 4)
    if refused:
        with pytest.raises(KernelLimit, match=r"vLLM runs the MLA absorb BMMs with AITER here, not torch.bmm"):
            vl_bmm.prepare(case, "x", "cpu", 1)
    else:
        not_refused("AITER", vl_bmm.prepare, case, "x", "cpu", 1)


# --- vLLM DSA, DeepSeek-V4, MSA ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case, message",
    [
        (dsa_case(mla="fp8"), r"vLLM's sparse MLA takes a bf16 query, not fp8"),
        (dsa_case(kv="int8"), r"vLLM has no int8 sparse MLA cache"),
    ],
)
def test_vllm_dsa_check_refuses(case, message):
    with pytest.raises(KernelLimit, match=message):
        vl_dsa.check_case(case)
    vl_dsa.check_case(dsa_case(kv="fp8"))


def test_vllm_dsa_inputs_refuse():
    with pytest.raises(KernelLimit, match=r"the vLLM DSA runner knows no config of Foo"):
        vl_dsa_inputs.model_keys("Foo")
    assert vl_dsa_inputs.model_keys(V32)
    with pytest.raises(KernelLimit, match=r"a DSA prefill needs its new tokens in the sequence:"):
        vl_dsa_inputs.dsa_layout(dsa_case(isl=0), True)
    with pytest.raises(KernelLimit, match=r"a DSA decode needs its new tokens in the sequence:"):
        vl_dsa_inputs.dsa_layout(dsa_case(isl=1, step=-1), False)
    vl_dsa_inputs.dsa_layout(dsa_case(isl=1), True)
    with pytest.raises(KernelLimit, match=r"a DSA decode needs its new tokens in the sequence:"):
        vl_dsa_inputs.dsa_layout(dsa_case(isl=1, step=0), False)  # a decode's step counts its own token
    vl_dsa_inputs.dsa_layout(dsa_case(isl=1, step=1), False)


@pytest.mark.parametrize(
    "case, message",
    [
        (vl_dsv4_case(mla="fp8"), r"vLLM's DeepSeek-V4 rows take a bfloat16 query, not fp8"),
        (vl_dsv4_case(kv="fp8_e4m3"), r"vLLM labels DeepSeek-V4's e4m3 cache fp8; no fp8_e4m3 cache here"),
        (vl_dsv4_case(kv="bfloat16"), r"no bfloat16 cache here"),
        (vl_dsv4_case(gemm="bfloat16"), r"DeepSeek-V4's checkpoints serve block-fp8 projections only, not bfloat16"),
        (vl_dsv4_case(ratio=8), r"DeepSeek-V4's compressed layers have ratio 4 or 128, not 8"),
        (vl_dsv4_case()._replace(model="deepseek-ai/DeepSeek-V4"),
         r"the vLLM DeepSeek-V4 runner knows no config of deepseek-ai/DeepSeek-V4"),
    ],
)  # fmt: skip
def test_vllm_dsv4_check_refuses(case, message):
    with pytest.raises(KernelLimit, match=message):
        vl_dsv4.check_case(case)


@pytest.mark.parametrize("ratio", [4, 128])
def test_vllm_dsv4_check_accepts_its_ratios(ratio):
    vl_dsv4.check_case(vl_dsv4_case(ratio=ratio))


def test_vllm_dsv4_paged_logits_score_the_ratio_4_indexer_only():
    with pytest.raises(KernelLimit, match=r"paged MQA logits score the CSA indexer \(ratio 4\), not ratio 128"):
        vl_dsv4.prepare_paged(vl_v4_kernel(ratio=128), "x", "cpu", 1)
    not_refused("paged MQA logits", vl_dsv4.prepare_paged, vl_v4_kernel(ratio=4), "x", "cpu", 1)


@pytest.mark.parametrize(
    "batch, isl, step, context",
    [(0, 100, 128, True), (2, 0, 128, True), (2, 1, -1, False)],
)
def test_vllm_dsv4_batch_refuses_requests_without_new_tokens(batch, isl, step, context):
    phase = "prefill" if context else "decode"
    case = vl_dsv4_case()._replace(batch_size=batch, isl=isl, step=step)
    with pytest.raises(KernelLimit, match=rf"a DeepSeek-V4 {phase} needs new tokens:"):
        vl_dsv4_inputs.batch(case, context)
    vl_dsv4_inputs.batch(vl_dsv4_case()._replace(batch_size=1, isl=1, step=0), context)


def test_vllm_msa_refuses():
    with pytest.raises(KernelLimit, match=r"vLLM's MiniMax-M3 attention computes in the model's bf16, not fp8"):
        vl_msa.check_case(msa_case(mla="fp8"))
    with pytest.raises(KernelLimit, match=r"the vLLM MSA runner has no int8 KV cache \(bf16 or fp8\)"):
        vl_msa.check_case(msa_case(kv="int8"))
    vl_msa.check_case(msa_case(kv="fp8"))
    with pytest.raises(KernelLimit, match=r"the vLLM MSA runner knows no config of Foo"):
        vl_msa_inputs.model_keys("Foo")
    assert vl_msa_inputs.model_keys(M3)
    with pytest.raises(KernelLimit, match=r"an MSA prefill needs new tokens and no negative step:"):
        vl_msa_inputs.msa_layout(msa_case(isl=0), True)
    with pytest.raises(KernelLimit, match=r"an MSA decode needs new tokens and no negative step:"):
        vl_msa_inputs.msa_layout(msa_case(isl=1, step=-1), False)
    vl_msa_inputs.msa_layout(msa_case(isl=1, step=0), False)


# --- vLLM encoder attention, GEMM, MoE, quantize ----------------------------------------------------------------------


def test_vllm_encoder_attention_serves_bf16_only():
    message = r"vLLM's vision attention runs in the model dtype; the runner serves bf16, not float16"
    with pytest.raises(KernelLimit, match=message):
        vl_enc.check_case(encoder_case("float16"))
    vl_enc.check_case(encoder_case("bfloat16"))


@pytest.mark.parametrize(
    "case, message",
    [
        (GemmCase("int4_wo", 4, 64, 192), r"GPTQ int4 needs k % 128 == 0 and n % 8 == 0 \(n=64, k=192\)"),
        (GemmCase("int4_wo", 4, 60, 256), r"GPTQ int4 needs k % 128 == 0 and n % 8 == 0 \(n=60, k=256\)"),
        (GemmCase("nvfp4", 4, 64, 24), r"NVFP4 needs k % 16 == 0 \(k=24\)"),
    ],
)
def test_vllm_gemm_check_shape_refuses(case, message):
    with pytest.raises(KernelLimit, match=message):
        vl_gemm.check_shape(case)


def test_vllm_gemm_accepts_the_smallest_whole_shapes_and_refuses_an_unknown_dtype():
    vl_gemm.check_shape(GemmCase("int4_wo", 4, 8, 128))
    vl_gemm.check_shape(GemmCase("nvfp4", 4, 64, 16))
    with pytest.raises(KernelLimit, match=r"the vLLM GEMM runner has no float32 path"):
        vl_gemm.gemm_layout(GemmCase("float32", 4, 64, 64))


@pytest.mark.parametrize(
    "case, message",
    [
        (moe_case("float32"), r"the vLLM MoE runner has no float32 path"),
        (moe_case(tp=2, ep=2), r"vLLM MoE does not combine TP and EP \(tp=2, ep=2\)"),
        (moe_case("fp8_block", inter=384, tp=2), r"block fp8 experts need the per-rank inter size % 128 == 0 \(got"),
        (moe_case("int4_wo", hidden=192), r"int4 experts need hidden and per-rank inter % 128 == 0 \(192, 512\)"),
        (moe_case("int4_wo", inter=512, tp=8), r"int4 experts need hidden and per-rank inter % 128 == 0 \(256, 64\)"),
        (moe_case("w4a16_mxfp4", hidden=2880, inter=2816),
         r"vLLM w4a16_mxfp4 experts are collected for gpt-oss shapes \(hidden = inter = 2880\) only"),
    ],
)  # fmt: skip
def test_vllm_moe_layout_refuses(case, message):
    with pytest.raises(KernelLimit, match=message):
        vl_moe.moe_layout(case)


@pytest.mark.parametrize(
    "case",
    [moe_case(tp=2), moe_case(ep=2), moe_case("fp8_block", inter=256, tp=2), moe_case("int4_wo", inter=512, tp=4),
     moe_case("w4a16_mxfp4", hidden=2880, inter=2880)],
)  # fmt: skip
def test_vllm_moe_layout_accepts_the_nearest_cases(case):
    vl_moe.moe_layout(case)


def test_vllm_quant_is_fp8_only():
    with pytest.raises(KernelLimit, match=r"vLLM's scaled_fp8_quant quantizes to fp8 only, not int8"):
        vl_quant._require_fp8(QuantizeCase(16, 256, "int8"))
    vl_quant._require_fp8(QuantizeCase(16, 256, "fp8"))


def test_vllm_quant_names_the_branch_from_the_scale_and_refuses_another_shape():
    given = torch.ones(1)
    assert vl_quant.kernel_ran(given, given, 4) == vl_quant.STATIC
    assert vl_quant.kernel_ran(torch.ones(4, 1), None, 4) == vl_quant.DYNAMIC_PER_TOKEN
    assert vl_quant.kernel_ran(torch.ones(1), None, 4) == vl_quant.DYNAMIC_PER_TENSOR
    with pytest.raises(RuntimeError, match=r"scaled_fp8_quant returned a scale of shape \(3, 1\) for 4 tokens"):
        vl_quant.kernel_ran(torch.ones(3, 1), None, 4)
