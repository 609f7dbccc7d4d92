"""The TensorRT-LLM MLA runners' pure builders (kernel and whole-module), checked against values computed by hand,
their refusals before any framework import, the kernel_source mapping and the release of a case's cache pools.
No tensorrt_llm; torch only where a test says so."""

from __future__ import annotations

import gc
import math
import sys
from collections import Counter
from types import SimpleNamespace

import pytest
from conftest import cases_of

from opcollect.backends.trtllm import context as trtllm_context
from opcollect.backends.trtllm import mla, mla_inputs, mla_module
from opcollect.backends.trtllm.context import SERVED_VERSIONS
from opcollect.plans.mla import MlaCase
from opcollect.plans.mla_module import MlaModuleCase
from opcollect.runtime.contract import KernelLimit

V3 = ("deepseek-ai/DeepSeek-V3", "DeepseekV3ForCausalLM")


def kcase(batch=2, isl=100, heads=128, kv="bfloat16", step=0, mla_dtype="bfloat16", tp=1):
    return MlaCase(mla_dtype, kv, heads, batch, isl, tp, step)


def mcase(batch=2, isl=100, heads=128, kv="bfloat16", gemm="bfloat16", step=0, model=V3, mla_dtype="bfloat16"):
    return MlaModuleCase(*model, mla_dtype, kv, gemm, heads, batch, isl, 1, step)


def test_deepseek_v3_dimensions_and_q_scaling():
    assert (mla_inputs.QK_HEAD, mla_inputs.LATENT, mla_inputs.HIDDEN) == (192, 576, 7168)
    assert (mla_inputs.Q_LORA, mla_inputs.KV_LORA, mla_inputs.V_HEAD) == (1536, 512, 128)
    # yarn factor 40, mscale_all_dim 1: mscale = 0.1 ln 40 + 1 = 1.36889; q_scaling = 1 / mscale^2
    assert mla_inputs.q_scaling() == pytest.approx(1 / (0.1 * math.log(40) + 1) ** 2)
    assert mla_inputs.q_scaling() == pytest.approx(0.53366, abs=1e-5)
    fields = mla_inputs.config_fields(16)
    assert fields["num_attention_heads"] == fields["num_key_value_heads"] == 16
    assert fields["rope_scaling"]["type"] == "yarn" and fields["num_hidden_layers"] == 1
    fields["rope_scaling"]["factor"] = 1  # a copy: the model constants stay as they are
    assert mla_inputs.DEEPSEEK_V3["rope_scaling"]["factor"] == 40


def test_page_size_and_flash_mla_follow_the_device():
    assert mla_inputs.flash_mla((9, 0)) and mla_inputs.page_size((9, 0)) == 64
    assert not mla_inputs.flash_mla((9, 0), head_dim=512)  # FlashMLA only for the 576-wide latent head
    for capability in ((10, 0), (10, 3), (12, 0), (8, 9)):
        assert not mla_inputs.flash_mla(capability) and mla_inputs.page_size(capability) == 32
    with pytest.raises(KernelLimit):
        mla_inputs.check_capability((8, 9))
    mla_inputs.check_capability((9, 0))
    mla_inputs.check_capability((10, 0))


def test_context_layout():
    lay = mla_inputs.kv_layout(kcase(batch=2, isl=100), True, 64)
    assert (lay.query_len, lay.past_len, lay.seq_len, lay.max_seq_len) == (100, 0, 100, 101)
    assert (lay.blocks_per_seq, lay.num_blocks, lay.max_tokens, lay.num_tokens) == (2, 4, 256, 200)
    assert lay.token_nums() == [100, 100] and lay.prompt_lens(True) == [100, 100]
    assert lay.request_ids(0) == [0, 1]
    assert lay.cache_bytes("bfloat16") == 256 * 576 * 2 and lay.cache_bytes("fp8") == 256 * 576


def test_generation_layout_and_copies():
    lay = mla_inputs.kv_layout(kcase(batch=3, isl=1, step=127), False, 64, copies=2)
    # 127 cached tokens plus the new one; one token of headroom opens a third page of 64
    assert (lay.query_len, lay.past_len, lay.seq_len, lay.max_seq_len) == (1, 127, 128, 129)
    assert (lay.blocks_per_seq, lay.num_sequences, lay.num_blocks, lay.max_tokens) == (3, 6, 18, 18 * 64)
    assert lay.token_nums() == [128] * 6  # add_dummy_requests: past + input tokens
    assert lay.prompt_lens(False) == [127] * 3  # a decode step's prompt is the history
    assert lay.request_ids(0) == [0, 1, 2] and lay.request_ids(1) == [3, 4, 5]  # disjoint sequences per copy
    assert lay.num_tokens == 3
    small = mla_inputs.kv_layout(kcase(batch=1, isl=1, step=126), False, 32)
    assert (small.seq_len, small.blocks_per_seq, small.max_tokens) == (127, 4, 128)


def test_kernel_shapes():
    ctx = mla_inputs.kernel_shapes(kcase(batch=2, isl=10, heads=16), True)
    assert ctx == {
        "q": (20, 16 * 192),
        "kv": (20, 16 * 256),
        "k": (20, 16 * 192),
        "latent_cache": (20, 576),
        "output": (20, 16 * 128),
    }
    gen = mla_inputs.kernel_shapes(kcase(batch=4, isl=1, heads=8, step=63), False)
    assert gen == {
        "fused_q": (4, 8 * 576),
        "q_pe": (4, 8, 64),
        "latent_cache": (4, 576),
        "output": (4, 8 * 512),
        "cu_seqlens": (5,),
    }
    assert mla_inputs.ROPE_GENERATION_ARGS[0] == "cu_q_seqlens" and mla_inputs.ROPE_GENERATION_ARGS[-1] == (
        "quant_q_buffer"
    )


def test_kernel_footprint_by_hand():
    case = kcase(batch=2, isl=10, heads=16)
    elems = 20 * 16 * 192 * 2 + 20 * 16 * 256 + 20 * 576 + 20 * 16 * 128
    cache = 2 * 64 * 576 * 2  # one page of 64 per sequence (11 tokens), bf16
    assert mla.footprint(case, True) == 2 * elems + 2 * 4 * 3 + cache
    gen = kcase(batch=4, isl=1, heads=8, step=63, kv="fp8")
    gen_elems = 4 * 8 * 576 + 4 * 8 * 64 + 4 * 576 + 4 * 8 * 512
    gen_cache = 4 * 2 * 64 * 576  # 64 tokens + headroom: two pages each, one byte per value
    assert mla.footprint(gen, False) == 2 * gen_elems + 4 * 8 * 576 + 2 * 4 * 5 + gen_cache
    assert mla.footprint(gen._replace(step=8191), False) > mla.footprint(gen, False)
    assert mla.footprint(gen._replace(kv_cache_dtype="bfloat16"), False) > mla.footprint(gen, False)


def test_module_weights_and_footprint():
    shapes = mla_module.projection_shapes(128)
    assert shapes["kv_a_proj_with_mqa"] == (7168, 2112) and shapes["o_proj"] == (128 * 128, 7168)
    projections = 7168 * 2112 + 1536 * 128 * 192 + 512 * 128 * 256 + 128 * 128 * 7168  # 187,105,280
    absorb = 2 * 128 * 512 * 256  # k_b_proj_trans and v_b_proj in bf16
    assert mla_module.weight_bytes(128, "bfloat16") == 2 * projections + absorb + 2 * 2048
    # fp8 block: kv_b_proj stays bf16 (excluded), the rest one byte plus a float32 scale per 128 x 128 block
    fp8 = (projections - 512 * 128 * 256) * (1 + 4 / 16384) + 2 * 512 * 128 * 256
    assert mla_module.weight_bytes(128, "fp8_block") == math.ceil(fp8) + absorb + 2 * 2048
    assert mla_module.weight_bytes(128, "nvfp4") < mla_module.weight_bytes(128, "fp8_block")
    base = mla_module.module_footprint(mcase(heads=16), True)
    assert mla_module.module_footprint(mcase(heads=32), True) > base
    assert mla_module.module_footprint(mcase(heads=16, gemm="fp8_block"), True) < base
    assert mla_module.module_footprint(mcase(heads=16, isl=1, step=8192), False) > mla_module.module_footprint(
        mcase(heads=16, isl=1, step=8), False
    )
    assert base > mla_module.weight_bytes(16, "bfloat16") + 200 * 2 * 2 * 7168


def test_positions():
    ctx = mla_inputs.kv_layout(kcase(batch=2, isl=3), True, 64)
    assert ctx.positions() == [0, 1, 2, 0, 1, 2]
    gen = mla_inputs.kv_layout(kcase(batch=3, isl=1, step=40), False, 64)
    assert gen.positions() == [40, 40, 40]  # the new token follows 40 cached ones


def test_kernel_source_mapping():
    assert mla_inputs.kernel_source("TrtllmAttention", True) == "default"
    # another backend class is reported by name, so the row differs from the reference's label
    assert mla_inputs.kernel_source("FlashInferAttention", True) == "FlashInferAttention"
    assert mla_inputs.kernel_source("DSATrtllmAttention", True) == "DSATrtllmAttention"
    with pytest.raises(RuntimeError):
        mla_inputs.kernel_source("TrtllmAttention", False)

    class TrtllmAttention:
        def __init__(self, mla_params):
            self.mla_params = mla_params

    assert mla_inputs.backend_label(TrtllmAttention(SimpleNamespace(kv_lora_rank=512))) == "default"
    with pytest.raises(RuntimeError):
        mla_inputs.backend_label(TrtllmAttention(None))
    old = TrtllmAttention(None)
    old.is_mla_enable = True  # the flag older backends keep
    assert mla_inputs.backend_label(old) == "default"


def test_module_source_requires_an_mla_module():
    assert mla_module.module_source(["DeepseekV3Attention", "MLA", "Module"], "TrtllmAttention", True) == "default"
    with pytest.raises(RuntimeError):
        mla_module.module_source(["Attention", "Module"], "TrtllmAttention", True)

    class TrtllmAttention:
        mla_params = object()

    class VanillaAttention:
        mla_params = object()

    class MLA:
        def __init__(self, mha, mqa):
            self.mha, self.mqa = mha, mqa

    class DeepseekV3Attention(MLA):
        pass

    module = DeepseekV3Attention(TrtllmAttention(), VanillaAttention())
    assert mla_module.module_label(module, context=True) == "default"  # a prompt runs mha
    assert mla_module.module_label(module, context=False) == "VanillaAttention"  # decode runs mqa
    assert mla_module.module_label(DeepseekV3Attention(None, TrtllmAttention()), context=True) == "default"


def test_refusals_before_any_framework_import():
    with pytest.raises(KernelLimit, match="bfloat16"):
        mla.prepare(kcase(mla_dtype="fp8", kv="fp8"), "default", "cuda:0", 1, True)
    with pytest.raises(KernelLimit):
        mla.prepare(kcase(kv="int8"), "default", "cuda:0", 1, False)
    with pytest.raises(KernelLimit, match="DeepSeek-V3"):
        mla_module.module_prepare(mcase(model=("moonshotai/Kimi-K2", "DeepseekV3ForCausalLM")), "default", "x", 1, True)
    with pytest.raises(KernelLimit):
        mla_module.module_prepare(mcase(gemm="int4_wo"), "default", "cuda:0", 1, True)
    with pytest.raises(KernelLimit):
        mla_module.module_prepare(mcase(mla_dtype="fp8"), "default", "cuda:0", 1, False)
    assert "tensorrt_llm" not in sys.modules
    with pytest.raises(KernelLimit, match="SM100"):
        mla_module.check_gemm_capability("nvfp4", (9, 0))
    mla_module.check_gemm_capability("nvfp4", (10, 0))
    mla_module.check_gemm_capability("fp8_block", (9, 0))


def test_dummy_weight_ranges():
    assert mla_module.dummy_range("bfloat16") == (-1e-3, 1e-3)
    assert mla_module.dummy_range("float8_e4m3fn") == (-3.0, 3.0) == mla_module.dummy_range("int8")
    assert mla_module.dummy_range("uint8") == (0.0, 64.0)
    assert mla_module.dummy_range("int32") is None
    assert {"kv_scales", "inv_kv_scales", "input_scale"} <= mla_module.CALIBRATION


def test_fill_dummy_weights_keeps_calibration_scalars():
    torch = pytest.importorskip("torch")
    module = torch.nn.Module()
    module.proj = torch.nn.Linear(4, 8, bias=False, dtype=torch.bfloat16)
    module.proj.register_buffer("kv_scales", torch.ones(2))
    module.register_parameter("codes", torch.nn.Parameter(torch.zeros(64, dtype=torch.float8_e4m3fn), False))
    module.register_buffer("ids", torch.full((3,), 7, dtype=torch.int32))
    with torch.no_grad():
        mla_module.fill_dummy_weights(module)
    weight = module.proj.weight.float()
    assert weight.abs().max() <= 1e-3 and weight.abs().max() > 0
    assert torch.equal(module.proj.kv_scales, torch.ones(2))  # calibration: left as created
    codes = module.codes.float()
    assert codes.abs().max() <= 3 and codes.abs().max() > 0.5
    assert torch.equal(module.ids, torch.full((3,), 7, dtype=torch.int32))


def test_release_runs_once_when_the_call_is_dropped_or_at_the_next_case():
    released = []

    def call_a():
        pass

    def call_b():
        pass

    trtllm_context.release_pending()
    once = trtllm_context.hold_until_dropped(call_a, lambda: released.append("a"))
    trtllm_context.hold_until_dropped(call_b, lambda: released.append("b"))
    del call_a
    gc.collect()
    assert released == ["a"]  # dropping the case's call releases its pools
    once()
    assert released == ["a"]  # and only once
    assert trtllm_context.release_pending() == 2  # the next case releases what is still held
    assert released == ["a", "b"]
    del call_b
    gc.collect()
    assert released == ["a", "b"] and trtllm_context.release_pending() == 0


def test_runners_registered_for_both_pins():
    assert set(mla.RUNNERS) == {"mla_context", "mla_generation", "mla_context_module", "mla_generation_module"}
    for op, runners in mla.RUNNERS.items():
        assert len(runners) == 1 and runners[0].versions == SERVED_VERSIONS, op
        assert runners[0].prepare is not None and runners[0].measure_row is None
    case = kcase(batch=1, isl=16, heads=8)
    assert mla.RUNNERS["mla_context"][0].footprint(case) == mla.footprint(case, True)
    gen = mcase(isl=1, step=64)
    assert mla.RUNNERS["mla_generation_module"][0].footprint(gen) == mla_module.module_footprint(gen, False)
    assert mla.RUNNERS["mla_generation"][0].prepare.keywords == {"context": False}

    from opcollect.backends import trtllm

    for op in mla.RUNNERS:
        assert trtllm.RUNNERS.find(op, "default", "1.3.0rc20") is trtllm.RUNNERS.find(op, "default", "1.3.0rc23")


@pytest.mark.parametrize("sm", ["90", "100"])
def test_every_planned_case_passes_the_builders(planner, sm):
    plan = planner.plan("trtllm", sm)
    refused = Counter()
    capability = (9, 0) if sm == "90" else (10, 0)
    for op, context in (("mla_context", True), ("mla_generation", False)):
        selection = plan.ops[op]
        assert set(selection.dispatch) == {"default"}
        for case in cases_of(selection):
            try:
                mla_inputs.check_case(case)
            except KernelLimit:
                refused[op, case.mla_dtype, case.kv_cache_dtype] += 1
                continue
            layout = mla_inputs.kv_layout(case, context, mla_inputs.page_size(capability), copies=2)
            assert layout.num_tokens == case.batch_size * case.isl
            assert layout.seq_len == (case.isl if context else case.step + 1)
            assert layout.max_tokens >= 2 * case.batch_size * layout.max_seq_len
            assert mla_inputs.kernel_shapes(case, context)
            assert mla.footprint(case, context) > layout.cache_bytes(case.kv_cache_dtype) // 2
    for op, context in (("mla_context_module", True), ("mla_generation_module", False)):
        selection = plan.ops[op]
        assert selection.values and set(selection.dispatch) == {"default"}
        for case in cases_of(selection):
            mla_module.check_module_case(case)  # every module case is served: no refusal
            mla_module.check_gemm_capability(case.gemm_type, capability)
            layout = mla_inputs.kv_layout(case, context, mla_inputs.page_size(capability))
            assert len(layout.positions()) == layout.num_tokens
            assert mla_module.module_footprint(case, context) > mla_module.weight_bytes(case.num_heads, case.gemm_type)
    # fp8 MLA compute, which TensorRT-LLM does not have, is left out by skip trtllm-mla-bf16-compute: no refusal
    assert refused == Counter()


def test_backends_are_built_as_mla_builds_its_mha_and_mqa(monkeypatch):
    """build_backend's call into create_attention, against stand-ins for the three tensorrt_llm modules it imports."""
    calls = []
    fake = {
        "tensorrt_llm": SimpleNamespace(),
        "tensorrt_llm._torch.attention_backend.interface": SimpleNamespace(
            PositionalEmbeddingParams=lambda **kw: SimpleNamespace(**kw),
            PositionEmbeddingType=SimpleNamespace(yarn="yarn"),
            RopeParams=SimpleNamespace(from_config=lambda config: ("rope", config.rope_scaling["factor"])),
        ),
        "tensorrt_llm._torch.attention_backend.utils": SimpleNamespace(
            create_attention=lambda *args, **kw: calls.append((args, kw)) or "backend"
        ),
        "tensorrt_llm.models.modeling_utils": SimpleNamespace(
            QuantAlgo={"FP8": "FP8"}, QuantConfig=lambda **kw: SimpleNamespace(**kw)
        ),
    }
    for name, module in fake.items():
        monkeypatch.setitem(sys.modules, name, module)
    assert mla.build_backend(16, "fp8", context=True) == "backend"
    mla.build_backend(16, "bfloat16", context=False)
    (ctx_args, ctx), (gen_args, gen) = calls
    assert ctx_args == ("TRTLLM", 0, 16, 192) and gen_args == ("TRTLLM", 0, 16, 576)
    assert (ctx["num_kv_heads"], ctx["v_head_dim"], ctx["hidden_size"]) == (16, 128, None)
    assert (gen["num_kv_heads"], gen["v_head_dim"], gen["hidden_size"]) == (1, 512, 7168)
    for kw in (ctx, gen):
        assert kw["is_mla_enable"] and (kw["q_lora_rank"], kw["kv_lora_rank"]) == (1536, 512)
        assert (kw["qk_nope_head_dim"], kw["qk_rope_head_dim"]) == (128, 64)
        assert kw["q_scaling"] == pytest.approx(mla_inputs.q_scaling())
        assert kw["pos_embd_params"].type == "yarn" and kw["pos_embd_params"].rope == ("rope", 40)
        assert kw["pos_embd_params"].is_neox is False
    assert ctx["quant_config"].kv_cache_quant_algo == "FP8"  # only the cache is quantized
    assert not hasattr(ctx["quant_config"], "quant_algo")
    assert vars(gen["quant_config"]) == {}


def test_mla_metadata_is_synced_after_prepare(monkeypatch):
    """attention_metadata's prepare() is followed by a device sync (context.prepare_metadata: the cache manager stages
    block offsets in one shared pinned buffer), against stand-ins for the two tensorrt_llm modules it imports."""
    torch = pytest.importorskip("torch")
    events = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: events.append("sync"))

    class Metadata:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

        def prepare(self):
            events.append("prepare")

    record = lambda **kw: SimpleNamespace(**kw)  # noqa: E731
    for name, module in {
        "tensorrt_llm": SimpleNamespace(),
        "tensorrt_llm._torch.metadata": SimpleNamespace(KVCacheParams=record),
        "tensorrt_llm.mapping": SimpleNamespace(Mapping=record),
    }.items():
        monkeypatch.setitem(sys.modules, name, module)
    layout = mla_inputs.kv_layout(kcase(), context=True, tokens_per_block=64, copies=2)
    backend = SimpleNamespace(Metadata=Metadata)
    first = mla_inputs.attention_metadata(backend, "manager", layout, 0, True, False)
    mla_inputs.attention_metadata(backend, "manager", layout, 1, True, False)
    assert events == ["prepare", "sync", "prepare", "sync"]
    assert isinstance(first, Metadata) and first.kwargs["kv_cache_manager"] == "manager"


def test_a_module_without_its_decode_backend_fails_before_any_kv_cache_exists(monkeypatch):
    import torch

    created = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    built = SimpleNamespace(mha=object()), SimpleNamespace(enable_flash_mla=True, extra_attrs={})
    monkeypatch.setattr(mla_module, "build_module", lambda case, device, layout: built)
    monkeypatch.setattr(mla_module, "module_label", lambda module, context: "VanillaAttention")
    monkeypatch.setattr(mla_inputs, "kv_cache", lambda layout, dtype: created.append(dtype))
    with pytest.raises(AttributeError, match="mqa"):
        mla_module.module_prepare(mcase(), "default", "cpu", 1, True)
    assert created == []  # nothing was left for layer_call to shut down
