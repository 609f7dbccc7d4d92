"""The TensorRT-LLM attention runner's input builders, refusals and labels, checked against values computed by hand
and against every case the trtllm plans emit. No tensorrt_llm import."""

from __future__ import annotations

import sys
from collections import Counter

import pytest

from opcollect.backends.trtllm import attention
from opcollect.backends.trtllm import attention_inputs as inputs
from opcollect.backends.trtllm.context import SERVED_VERSIONS
from opcollect.plans.attention import AttentionCase
from opcollect.runtime.contract import KernelLimit


def case(batch=2, isl=100, heads=8, kv=2, head_dim=128, attn="bfloat16", kv_dtype="bfloat16", step=0, window=0, beam=1):
    return AttentionCase(batch, isl, heads, kv, head_dim, beam, attn, kv_dtype, step, window)


def test_context_layout():
    lay = inputs.attention_layout(case(), context=True)
    assert (lay.new_tokens, lay.cached_tokens, lay.kv_tokens, lay.num_tokens) == (100, 0, 100, 200)
    assert lay.tokens_per_block == 32
    assert (lay.blocks_per_seq, lay.max_seq_len, lay.max_blocks_per_seq) == (4, 101, 4)
    assert lay.qkv_shape == (200, (8 + 2 * 2) * 128)
    assert lay.q_shape == (200, 1024) and lay.kv_shape == (200, 256)
    assert lay.seq_lens == (100, 100) and lay.num_cached_tokens_per_seq == (0, 0)
    assert lay.prompt_lens == (100, 100) and lay.num_contexts == 2
    assert lay.window is None
    # the blocks the sequences hold, twice over (the collector's headroom)
    assert lay.pool_tokens() == 2 * (2 * 4) * 32
    assert lay.pool_tokens(3) == 3 * lay.pool_tokens()


def test_generation_layout_one_token_after_step_cached():
    lay = inputs.attention_layout(case(batch=3, isl=1, step=64), context=False)
    assert (lay.new_tokens, lay.cached_tokens, lay.kv_tokens, lay.num_tokens) == (1, 64, 65, 3)
    assert (lay.blocks_per_seq, lay.max_seq_len, lay.max_blocks_per_seq) == (3, 66, 3)
    assert lay.seq_lens == (1, 1, 1) and lay.num_cached_tokens_per_seq == (64, 64, 64)
    assert lay.prompt_lens == (64, 64, 64) and lay.num_contexts == 0
    assert lay.qkv_shape == (3, 12 * 128)
    # step 63: 64 tokens fill two blocks exactly
    assert inputs.attention_layout(case(isl=1, step=63), context=False).blocks_per_seq == 2


def test_window_reaches_max_seq_len_as_the_collector_sizes_it():
    # collector: max(step + 2, window + 2) for decode (collect_attn.py:267-269)
    short = inputs.attention_layout(case(isl=1, step=10, window=128), context=False)
    assert short.max_seq_len == 130 and short.window == 128
    assert short.blocks_per_seq == 1 and short.max_blocks_per_seq == 5
    # the pool holds one whole max_seq_len even where the sequences use less (KVCacheManager checks the window)
    assert short.pool_tokens() == 2 * 5 * 32
    assert inputs.attention_layout(case(batch=16, isl=1, step=10, window=128), False).pool_tokens() == 2 * 16 * 32
    long = inputs.attention_layout(case(isl=1, step=999, window=128), context=False)
    assert long.max_seq_len == 1001


def test_copies_own_disjoint_requests():
    lay = inputs.attention_layout(case(batch=4), context=True)
    assert lay.request_ids(0) == (0, 1, 2, 3) and lay.request_ids(2) == (8, 9, 10, 11)


def test_footprint_by_hand():
    c = case(batch=2, isl=100, heads=8, kv=2, head_dim=128)
    qkv = 200 * 12 * 128 * 2
    out = 200 * 8 * 128 * 2
    pool = 512 * 2 * 2 * 128 * 2  # tokens x (K, V) x kv heads x head_dim x bf16
    offsets = 2 * 2 * 4 * 4
    assert inputs.footprint(c, True) == qkv + out + pool + offsets + qkv
    assert attention.footprint(c, True) == inputs.footprint(c, True)
    fp8 = inputs.footprint(case(kv_dtype="fp8"), True)
    assert fp8 == qkv + out + pool // 2 + offsets + qkv
    gen = case(batch=2, isl=1, step=1000)
    assert inputs.footprint(gen, False) > inputs.footprint(case(batch=2, isl=1, step=10), False)


def test_labels_come_from_the_built_class():
    assert inputs.kernel_source("TrtllmAttention") == "torch_flow"
    assert inputs.kernel_source("FlashInferAttention") == "torch_flow_flashinfer"
    assert inputs.kernel_source("VanillaAttention") == "torch_flow_vanillaattention"  # a fallback shows
    assert inputs.backend_name("torch_flow") == "TRTLLM"
    assert inputs.backend_name("torch_flow_flashinfer") == "FLASHINFER"


def test_out_scale_and_sinks_as_the_collector_passes_them():
    assert inputs.uses_out_scale(case(attn="fp8", kv_dtype="fp8"), True)
    assert not inputs.uses_out_scale(case(kv_dtype="fp8"), True)  # bf16 model, fp8 cache, prefill
    assert inputs.uses_out_scale(case(kv_dtype="fp8", isl=1, step=5), False)
    assert not inputs.uses_out_scale(case(isl=1, step=5), False)
    assert inputs.uses_sinks(case(head_dim=64)) and not inputs.uses_sinks(case(head_dim=128))


@pytest.mark.parametrize(
    ("c", "context", "backend", "sm", "words"),
    [
        (case(beam=2), True, "TRTLLM", "90", "beam"),
        (case(kv_dtype="float32"), True, "TRTLLM", "90", "KV cache"),
        (case(attn="float16"), True, "TRTLLM", "90", "compute"),
        (case(attn="fp8"), True, "TRTLLM", "90", "fp8 KV cache"),
        (case(head_dim=256, window=1024), True, "FLASHINFER", "90", "SM100/103"),
        (case(head_dim=512), False, "FLASHINFER", "120", "SM100/103"),
        (case(head_dim=512, attn="fp8", kv_dtype="fp8"), True, "FLASHINFER", "100", "fp8 attention"),
        (case(head_dim=64), True, "FLASHINFER", "100", "sinks"),
        (case(head_dim=512), True, "TRTLLM", "90", "MMHA"),
        (case(head_dim=192), True, "TRTLLM", "100", "192"),
        (case(head_dim=192), False, "TRTLLM", "103", "192"),
    ],
)
def test_refusals(c, context, backend, sm, words):
    reason = inputs.refusal(c, context, backend, sm)
    assert reason is not None and words in reason


def test_what_runs():
    assert inputs.refusal(case(head_dim=192), True, "TRTLLM", "90") is None  # the H200 table has head_dim 192
    assert inputs.refusal(case(head_dim=192), True, "TRTLLM", "120") is None  # SM120 runs no trtllm-gen kernel
    assert inputs.refusal(case(head_dim=512, kv_dtype="fp8"), False, "FLASHINFER", "100") is None
    assert inputs.refusal(case(attn="fp8", kv_dtype="fp8"), True, "TRTLLM", "90") is None
    assert inputs.refusal(case(head_dim=64, window=128), True, "TRTLLM", "100") is None


def test_kernel_limits_before_any_framework_import():
    with pytest.raises(KernelLimit, match="beam"):
        attention.prepare(case(beam=4), "torch_flow", "cpu", 1, context=True)
    with pytest.raises(KernelLimit, match="SM100/103"):
        attention.prepare(case(head_dim=512), "torch_flow_flashinfer", "cpu", 1, context=False)
    with pytest.raises(KernelLimit, match="MMHA"):
        attention.prepare(case(head_dim=512), "torch_flow", "cpu", 1, context=True)
    assert "tensorrt_llm" not in sys.modules


def test_runners_per_op():
    assert set(attention.RUNNERS) == {"attention_context", "attention_generation"}
    for op, context in (("attention_context", True), ("attention_generation", False)):
        (runner,) = attention.RUNNERS[op]
        assert runner.versions == SERVED_VERSIONS and runner.measure_row is None
        assert runner.prepare.keywords == {"context": context}
        c = case(isl=1, step=500) if not context else case()
        assert runner.footprint(c) == inputs.footprint(c, context)


@pytest.fixture(scope="module")
def plans():
    from opcollect.plans.planner import Planner
    from opcollect.project import find_project

    planner = Planner(find_project(None))
    return {sm: planner.plan("trtllm", sm) for sm in ("90", "100")}


@pytest.mark.parametrize("sm", ["90", "100"])
@pytest.mark.parametrize("op", ["attention_context", "attention_generation"])
def test_every_planned_case_builds(plans, sm, op):
    selection = plans[sm].ops[op]
    context = op == "attention_context"
    make = selection.op.case_type
    refused, kept, fp8_flashinfer = Counter(), 0, 0
    for values, dispatch in zip(selection.values, selection.dispatch):
        c = make(*values)
        backend = inputs.backend_name(dispatch)
        fp8_flashinfer += backend == "FLASHINFER" and c.attn_dtype == "fp8"
        reason = inputs.refusal(c, context, backend, sm)
        if reason is not None:
            refused[(dispatch, c.head_dim if backend == "TRTLLM" else c.attn_dtype)] += 1
            continue
        lay = inputs.attention_layout(c, context)
        assert lay.kv_tokens < lay.max_seq_len <= lay.max_blocks_per_seq * lay.tokens_per_block
        assert lay.pool_tokens() >= lay.batch_size * lay.blocks_per_seq * lay.tokens_per_block
        assert lay.pool_tokens() >= lay.max_seq_len
        assert inputs.footprint(c, context) > 0
        kept += 1
    heads = Counter(make(*v).head_dim for v in selection.values)
    # what the runner refuses the plan leaves out (skips trtllm-attention-head-dim-over-256 on SM90,
    # trtllm-gen-no-head-dim-192 and trtllm-flashinfer-no-fp8-attention on SM100): nothing planned is refused
    assert refused == Counter() and fp8_flashinfer == 0
    if sm == "90":
        assert heads[512] == 0 and heads[192] > 0 and "torch_flow_flashinfer" not in selection.dispatch
    else:
        assert heads[192] == 0 and selection.dispatch.count("torch_flow_flashinfer") > 0
    assert kept == len(selection.values) - sum(refused.values()) > 0


# ---- serving's cache window and a synced prepare() (issue 20 item 14), against stand-ins for tensorrt_llm


def test_a_windowed_case_gives_the_cache_manager_its_window():
    windowed = inputs.attention_layout(case(isl=1, step=999, window=128), context=False)
    assert inputs.max_attention_window(windowed) == [128]
    assert inputs.max_attention_window(inputs.attention_layout(case(), context=True)) is None


def _fake_tensorrt_llm(monkeypatch, events: list, managers: list):
    from types import SimpleNamespace

    import torch

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: events.append("sync"))

    class Metadata:
        __dataclass_fields__ = {"workspace": None}

        def __init__(self, **kwargs):
            self.kwargs = kwargs

        def prepare(self):
            events.append(("prepare", tuple(self.kwargs["request_ids"])))

    class TrtllmAttention:
        pass

    TrtllmAttention.Metadata = Metadata
    TrtllmAttention.support_fused_qkv = staticmethod(lambda: True)
    TrtllmAttention.support_fused_rope = staticmethod(lambda: True)
    TrtllmAttention.forward = lambda self, *args, **kwargs: events.append("forward")

    class Manager:
        def __init__(self, config, cache_type, **kwargs):
            self.config, self.kwargs = config, kwargs
            managers.append(self)

        def add_dummy_requests(self, ids, tokens):
            events.append(("add", tuple(ids)))

        def shutdown(self):
            events.append("shutdown")

    record = lambda **kw: SimpleNamespace(**kw)  # noqa: E731
    fake = {
        "tensorrt_llm": SimpleNamespace(),
        "tensorrt_llm._torch.attention_backend.interface": SimpleNamespace(
            PositionalEmbeddingParams=record,
            PositionEmbeddingType=SimpleNamespace(rope_gpt_neox="rope_gpt_neox"),
            RopeParams=record,
            AttentionRuntimeFeatures=record,
        ),
        "tensorrt_llm._torch.attention_backend.utils": SimpleNamespace(
            create_attention=lambda **kw: TrtllmAttention(), get_attention_backend=lambda name: TrtllmAttention
        ),
        "tensorrt_llm._torch.pyexecutor.resource_manager": SimpleNamespace(
            CacheTypeCpp=SimpleNamespace(SELF="SELF"),
            DataType=SimpleNamespace(FP8="FP8", BF16="BF16"),
            KvCacheConfig=record,
            KVCacheManager=Manager,
        ),
        "tensorrt_llm._torch.metadata": SimpleNamespace(KVCacheParams=record),
        "tensorrt_llm.models.modeling_utils": SimpleNamespace(QuantAlgo={"FP8": "FP8"}, QuantConfig=record),
        "tensorrt_llm.mapping": SimpleNamespace(Mapping=record),
    }
    for name, module in fake.items():
        monkeypatch.setitem(sys.modules, name, module)


@pytest.mark.parametrize("window, expected", [(0, None), (128, [128])])
def test_prepare_syncs_after_each_metadata_and_passes_the_window(monkeypatch, window, expected):
    pytest.importorskip("torch")
    from opcollect.backends.trtllm import context

    monkeypatch.setenv("TRTLLM_ENABLE_XQA_JIT", "1")
    events, managers = [], []
    _fake_tensorrt_llm(monkeypatch, events, managers)
    c = case(batch=2, isl=1, step=300, window=window)
    prepared = attention.prepare(c, "torch_flow", "cpu", copies=2, context=False)
    (manager,) = managers
    lay = inputs.attention_layout(c, context=False)
    assert vars(manager.config) == {
        "max_tokens": lay.pool_tokens(2),
        "enable_block_reuse": False,
        "max_attention_window": expected,
    }
    # each input set's prepare() is followed by a device sync before the next set is staged
    prepares = [i for i, e in enumerate(events) if isinstance(e, tuple) and e[0] == "prepare"]
    assert [events[i] for i in prepares] == [("prepare", (0, 1)), ("prepare", (2, 3))]
    assert all(events[i + 1] == "sync" for i in prepares)
    assert prepared.kernel_source == "torch_flow"
    del prepared
    context.release_pending()
