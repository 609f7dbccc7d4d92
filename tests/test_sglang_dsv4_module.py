"""SGLang's DeepSeek-V4 attention-module runner (backends/sglang/dsv4.py) against stand-ins for SGLang 0.5.14 up to the
layer's call.

The stand-ins record what the runner builds and hands on: MQALayer (models/deepseek_v4.py:269-476: the config it
reads, the attention TP it sees at construction, the quant config), the dummy loader's steps (initialize_dummy_weights,
DeepseekV4ForCausalLM.post_load_weights with the module's _FP8_WO_A_GEMM, process_weights_after_loading), the pools
(ReqToTokenPool, DeepSeekV4TokenToKVPool and its full-to-SWA map), DeepseekV4AttnBackend reading its model runner as
deepseek_v4_backend.py:476-512 does and planning the batch, and the layer's forward reading the forward context, the
hook's flags and the TP override at call time. So the tests check the batch's pages and maps, what each build and call
runs under, the refusals and the registration. Where .cache/wheels holds SGLang's pinned wheel, the facts the runner
relies on are read from it."""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import pytest
from conftest import install_fakes
from fake_sglang import Field, pinned_problems, sglang_source, sglang_uses

from opcollect.backends import kernels as kt
from opcollect.backends.sglang import RUNNERS, dsv4
from opcollect.backends.sglang import context as context_module
from opcollect.backends.sglang import dsv4_inputs as inputs
from opcollect.plans.dsv4 import Dsv4ModuleCase
from opcollect.plans.planner import PlanOptions
from opcollect.runtime.contract import KernelLimit

torch = pytest.importorskip("torch")

FLASH, PRO = "sgl-project/DeepSeek-V4-Flash-FP8", "sgl-project/DeepSeek-V4-Pro-FP8"
ARCH = "DeepseekV4ForCausalLM"


def case(batch=2, isl=5, step=300, tp=2, ratio=4, gemm="fp8_block", model=FLASH, labels=("bfloat16", "fp8_e4m3")):
    native = inputs.MODELS[model]["num_attention_heads"] if model in inputs.MODELS else 64
    return Dsv4ModuleCase(model, ARCH, *labels, gemm, native // tp, batch, isl, tp, step, ratio)


class FakeSgl:
    """Stand-ins for what the DeepSeek-V4 module runner imports (each cites the SGLang source it models)."""

    def __init__(self):
        self.events: list = []
        self.sm120 = self.hip = False
        self.topology: dict = {}  # get_parallel().override's fields now in force (runtime_context.py:86-100)
        self.context = None  # the ForwardContext now set (forward_context.py:46-84)
        self.capturing = False
        self.envs = SimpleNamespace(  # environ.py defaults
            SGLANG_OPT_FP8_WO_A_GEMM=Field(True),
            SGLANG_OPT_USE_TOPK_V2=Field(True),
            SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=Field(False),
        )
        self.module = SimpleNamespace(_FP8_WO_A_GEMM=True)  # models/deepseek_v4.py:141, read at import
        fake = self

        class MQALayer:  # models/deepseek_v4.py:269-476
            def __init__(self, config, layer_id, quant_config=None, prefix="", alt_streams=None):
                self.tp_size = fake.topology.get("attn_tp_size", 1)
                self.n_local_heads = config.num_attention_heads // self.tp_size
                self.compress_ratio = config.compress_ratios[layer_id]
                self.config, self.quant, self.prefix, self.alt_streams = config, quant_config, prefix, alt_streams
                fake.events.append(("build", self))

            def named_modules(self):
                return [("", self), ("wq_b", SimpleNamespace(quant_method=fake.method("wq_b")))]

            def eval(self):
                return self

            def __call__(self, x, positions, forward_batch):  # MQALayer.forward (:916-1088)
                backend = fake.context.attn_backend  # get_attn_backend(), :925
                fake.events.append(("forward", dict(x=x, positions=positions, batch=forward_batch, backend=backend,
                                                    tp=fake.topology.get("attn_tp_size"), capturing=fake.capturing,
                                                    wo_a=fake.module._FP8_WO_A_GEMM,
                                                    topk_v2=fake.envs.SGLANG_OPT_USE_TOPK_V2.get())))  # fmt: skip
                return x

        class DeepseekV4ForCausalLM:  # models/deepseek_v4.py:1979-2024
            def _setup_fp8_wo_a_scales(self, is_nextn):
                fake.events.append(("wo_a_scales", self.model.layers[0].self_attn))

            def post_load_weights(self, is_nextn=False, weight_names=None):
                if fake.module._FP8_WO_A_GEMM:
                    self._setup_fp8_wo_a_scales(is_nextn)
                layer = self.model.layers[0]
                fake.events.append(("ape_hotfix", layer.self_attn))
                layer.refresh_mhc_norm_weight_cache()

        class ReqToTokenPool:  # mem_cache/memory_pool.py:229-260: size + 1 rows
            def __init__(self, size, max_context_len, device, enable_memory_saver):
                self.req_to_token = torch.zeros(size + 1, max_context_len, dtype=torch.int32)

        class DeepSeekV4TokenToKVPool:  # mem_cache/deepseek_v4_memory_pool.py:438-640
            def __init__(self, **kwargs):
                self.kwargs, self.full_to_swa_index_mapping = kwargs, None
                fake.events.append(("pool", self))

            def register_mapping(self, mapping):  # :600-601
                self.full_to_swa_index_mapping = mapping

        class DeepseekV4AttnBackend:  # deepseek_v4_backend.py:467-518, its reads of the model runner
            def __init__(self, model_runner):
                mr = model_runner
                assert mr.model_config.head_dim == 512 and mr.page_size == 256
                self.req_to_token = mr.req_to_token_pool.req_to_token
                self.token_to_kv_pool, self.hisparse_coordinator = mr.token_to_kv_pool, mr.hisparse_coordinator
                self.c4_topk = getattr(mr.model_config.hf_text_config, "index_topk", 512)
                self.head_dim_v = mr.model_config.v_head_dim
                self.fp4_indexer = mr.server_args.enable_deepseek_v4_fp4_indexer
                assert (mr.server_args.speculative_eagle_topk or 0) == 0
                self.num_draft = mr.server_args.speculative_num_draft_tokens
                self.metadata = None

            def init_forward_metadata(self, forward_batch):  # :1078-1087
                assert fake.context is not None and fake.context.attn_backend is self
                self.metadata = forward_batch

        @contextmanager
        def forward_context(ctx):
            previous, fake.context = fake.context, ctx
            try:
                yield
            finally:
                fake.context = previous

        @contextmanager
        def model_capture_mode():
            previous, fake.capturing = fake.capturing, True
            try:
                yield
            finally:
                fake.capturing = previous

        class ForwardMode:
            EXTEND, DECODE = "extend", "decode"

        self.classes = SimpleNamespace(MQALayer=MQALayer, DeepseekV4ForCausalLM=DeepseekV4ForCausalLM)
        self.modules = {
            "sglang.srt.environ": {"envs": self.envs},
            "sglang.srt.utils.common": {"is_hip": lambda: fake.hip, "is_sm120_supported": lambda: fake.sm120},
            "sglang.srt.models.deepseek_v4": {"MQALayer": MQALayer, "DeepseekV4ForCausalLM": DeepseekV4ForCausalLM},
            "sglang.srt.model_loader.weight_utils": {
                "initialize_dummy_weights": lambda m: fake.events.append(("dummy", m))},
            "sglang.srt.layers.quantization.fp8": {"Fp8Config": SimpleNamespace(
                from_config=lambda c: SimpleNamespace(block=c["weight_block_size"], scale_fmt=c["scale_fmt"]))},
            "sglang.srt.mem_cache.memory_pool": {"ReqToTokenPool": ReqToTokenPool},
            "sglang.srt.mem_cache.deepseek_v4_memory_pool": {
                "DeepSeekV4TokenToKVPool": DeepSeekV4TokenToKVPool,
                "get_compress_state_ring_size": lambda r, spec=False: 8 if r == 4 else 128},
            "sglang.srt.model_executor.model_runner_kv_cache_mixin": {
                "_get_dsv4_compress_state_dtypes": lambda: (torch.float32, torch.float32)},
            "sglang.srt.layers.attention.deepseek_v4_backend": {"DeepseekV4AttnBackend": DeepseekV4AttnBackend},
            "sglang.srt.model_executor.forward_context": {
                "ForwardContext": lambda attn_backend: SimpleNamespace(attn_backend=attn_backend),
                "forward_context": forward_context},
            "sglang.srt.model_executor.runner": {"model_capture_mode": model_capture_mode},
            "sglang.srt.model_executor.forward_batch_info": {
                "ForwardBatch": lambda **kw: SimpleNamespace(**kw), "ForwardMode": ForwardMode},
        }  # fmt: skip

    def method(self, name):
        return SimpleNamespace(process_weights_after_loading=lambda m: self.events.append(("process", name)))

    def install(self, monkeypatch):
        fake = self
        install_fakes(monkeypatch, self.modules)
        import sys

        module = sys.modules["sglang.srt.models.deepseek_v4"]
        module._FP8_WO_A_GEMM = True
        self.module = module

        @contextmanager
        def sglang_context(device, **server_args):
            fake.events.append(("server_args", server_args))
            yield SimpleNamespace(enable_deepseek_v4_fp4_indexer=False, speculative_eagle_topk=None,
                                  speculative_num_draft_tokens=None, **server_args)  # fmt: skip

        @contextmanager
        def rank_topology(**fields):
            previous = dict(fake.topology)
            fake.topology.update(fields)
            try:
                yield
            finally:
                fake.topology = previous

        monkeypatch.setattr(context_module, "sglang_context", sglang_context)
        monkeypatch.setattr(context_module, "rank_topology", rank_topology)
        monkeypatch.setattr(dsv4, "device_info", lambda device: (fake.sm120, fake.hip, 141 * 1024))
        monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: ("stream", device))
        dsv4._built.clear()

    def of(self, kind):
        return [e[1] for e in self.events if e[0] == kind]


@pytest.fixture
def sgl(monkeypatch):
    fake = FakeSgl()
    fake.install(monkeypatch)
    yield fake
    dsv4._built.clear()


# --- the batch in SGLang's pools ---


def test_a_prefill_keeps_each_requests_pages_and_its_window_in_the_swa_pool():
    lay = inputs.layout(case(batch=2, isl=5, step=300), context=True)
    assert (lay.query_len, lay.seq_len, lay.pages) == (5, 305, 2)
    # the window reaches back to position 300 - 128 = 172: its page, from position 0, is kept
    assert (lay.swa_first, lay.swa_pages) == (0, 2) and lay.context_len == 2**20 + 4
    t = inputs.batch_tensors(lay, "cpu")
    assert t.req_to_token[:, 0].tolist() == [256, 256 + 512]  # page 0 is the allocator's padding
    assert t.out_cache_loc.tolist() == [556, 557, 558, 559, 560, 1068, 1069, 1070, 1071, 1072]
    assert t.positions.tolist() == [300, 301, 302, 303, 304] * 2 and t.seq_lens.tolist() == [305, 305]
    assert t.full_to_swa[-1].item() == -1 and t.full_to_swa.numel() == lay.full_size + 256 + 1
    assert t.full_to_swa[t.out_cache_loc].tolist() == t.out_cache_loc.tolist()  # same pages in both pools here


def test_a_long_prefix_keeps_only_its_window_in_the_swa_pool():
    lay = inputs.layout(case(batch=2, isl=1, step=1000), context=False)
    assert (lay.query_len, lay.seq_len, lay.pages) == (1, 1001, 4)
    assert (lay.swa_first, lay.swa_pages) == (768, 1)  # position 1000 - 128 = 872 lies on page 3
    t = inputs.batch_tensors(lay, "cpu")
    second = t.req_to_token[1].long()
    kept = t.full_to_swa[second[768:]]
    assert kept.tolist() == list(range(512, 512 + 233))  # request 1's one SWA page, after the padding and request 0's
    assert bool((t.full_to_swa[second[:768]] == 0).all())  # evicted positions map to the dummy slot 0
    assert lay.state_size(4) == 2 * 256 // 128 * 8 and lay.state_size(128) == 2 * 256 // 128 * 128


def test_footprints_grow_with_the_case():
    small = dsv4.footprint(case(step=300), True)
    assert 0 < small < dsv4.footprint(case(step=300_000), True) and small < dsv4.footprint(case(batch=64), True)
    # a decode's indexer rows are as wide as the request rows: a million positions of logits per row
    assert dsv4.footprint(case(batch=64, isl=1, step=10), False) > 64 * 2**18 * 4
    assert dsv4.footprint(case(model="someone/else"), True) == 0


@pytest.mark.parametrize(("bad", "why"), [
    (case(labels=("fp8_e4m3", "fp8_e4m3")), "take"),
    (case(labels=("bfloat16", "fp8")), "take"),
    (case(gemm="nvfp4"), "no nvfp4"),
    (case(ratio=0), "ratio 4 or 128"),
    (case(tp=3), "heads"),
    (case(model="someone/DeepSeek-V4-Tiny"), "no config"),
    (case(isl=0), "new tokens"),
    (case(step=2**20), "positions"),
])  # fmt: skip
def test_what_sglang_does_not_serve_is_refused_before_any_import(bad, why):
    with pytest.raises(KernelLimit, match=why):
        dsv4.prepare(bad, "compressed_flashmla", "cpu", 1, context=True)  # no fakes: refused before sglang


# --- the build and the call ---


def test_a_csa_prefill_builds_the_layer_at_the_ranks_tp_and_calls_it_under_its_backend(sgl):
    prepared = dsv4.prepare(case(batch=2, isl=5, step=300, tp=2), "compressed_flashmla", "cpu", 2, context=True)
    assert prepared.kernel_source == "compressed_flashmla" and prepared.graph_safe
    (layer,) = sgl.of("build")
    # the checkpoint's native heads in the config, the rank's 32 from attention TP 2 seen at construction
    assert layer.config.num_attention_heads == 64 and layer.tp_size == 2 and layer.n_local_heads == 32
    assert layer.config.compress_ratios == [4] and layer.config.rope_parameters["rope_theta"] == 10000
    assert layer.quant.block == [128, 128] and layer.quant.scale_fmt == "ue8m0"  # the checkpoint's quant config
    assert layer.prefix == "model.layers.0.self_attn" and len(layer.alt_streams) == 5
    # the dummy loader's order: random weights, the model's post-load (fp8 wo_a scales, ape), then quant methods
    steps = [e[0] for e in sgl.events if e[0] in ("dummy", "wo_a_scales", "ape_hotfix", "process")]
    assert steps == ["dummy", "wo_a_scales", "ape_hotfix", "process"]
    (pool,) = sgl.of("pool")
    kw = pool.kwargs
    assert (kw["page_size"], kw["swa_page_size"], kw["dtype"], kw["compression_ratios"]) == (
        256, 256, torch.float8_e4m3fn, [4])  # fmt: skip
    assert (kw["swa_size"], kw["c4_size"], kw["c128_size"]) == (1024, 256, 8)
    assert (kw["c4_state_pool_size"], kw["c128_state_pool_size"], kw["num_req_slots"]) == (64, 1024, 3)
    assert (kw["qk_nope_head_dim"], kw["qk_rope_head_dim"], kw["indexer_head_dim"]) == (448, 64, 128)
    assert pool.full_to_swa_index_mapping is not None
    server = sgl.of("server_args")[0]
    assert server == dict(attention_backend="dsv4", page_size=256, kv_cache_dtype="fp8_e4m3", quantization="fp8")
    prepared.call()
    prepared.call()
    (_, first), (_, second) = [e for e in sgl.events if e[0] == "forward"]
    backend = first["backend"]
    assert backend.token_to_kv_pool is pool and backend.c4_topk == 512 and backend.head_dim_v == 512
    assert backend.req_to_token[1:3, :305].tolist() == inputs.batch_tensors(
        inputs.layout(case(), True), "cpu").req_to_token.tolist()  # fmt: skip
    batch = backend.metadata  # the batch the backend planned is the one the layer runs
    assert first["batch"] is batch and batch.forward_mode == "extend" and batch.extend_num_tokens == 10
    assert batch.extend_prefix_lens_cpu == [300, 300] and batch.seq_lens.tolist() == [305, 305]
    assert tuple(first["x"].shape) == (10, 4096) and first["x"].dtype == torch.bfloat16
    assert first["x"] is not second["x"] and first["positions"].tolist() == [300, 301, 302, 303, 304] * 2
    # each call at the rank's TP, with the fp8 wo_a GEMM and serving's indexer flags, outside capture mode
    assert first["tp"] == 2 and first["wo_a"] is True and first["topk_v2"] is True and first["capturing"] is False
    assert sgl.topology == {} and sgl.module._FP8_WO_A_GEMM is True and sgl.context is None  # all restored


def test_a_small_decode_runs_in_capture_mode_and_a_bf16_layer_has_no_fp8_wo_a(sgl):
    c = case(batch=4, isl=1, step=4000, tp=1, ratio=128, gemm="bfloat16", model=PRO)
    prepared = dsv4.prepare(c, "compressed_flashmla", "cpu", 1, context=False)
    (layer,) = sgl.of("build")
    assert layer.quant is None and layer.n_local_heads == 128 and layer.config.compress_ratios == [128]
    assert "wo_a_scales" not in [e[0] for e in sgl.events]  # _FP8_WO_A_GEMM off while it was built
    assert sgl.of("server_args")[0]["quantization"] is None
    prepared.call()
    (call,) = sgl.of("forward")
    assert call["capturing"] is True and call["wo_a"] is False and call["batch"].forward_mode == "decode"
    assert tuple(call["x"].shape) == (4, 7168) and call["positions"].tolist() == [4000] * 4
    assert call["backend"].c4_topk == 1024 and sgl.module._FP8_WO_A_GEMM is True


def test_on_sm120_the_hooks_flags_hold_for_build_and_call(sgl):
    sgl.sm120 = True  # the hook turns the fp8 wo_a GEMM and top-k v2 off (server_args.py:3795-3796)
    dsv4.prepare(case(isl=1, step=100, tp=1), "compressed_flashmla", "cpu", 1, context=False).call()
    (call,) = sgl.of("forward")
    assert call["wo_a"] is False and call["topk_v2"] is False and sgl.envs.SGLANG_OPT_USE_TOPK_V2.get() is True
    sgl.sm120, sgl.hip = False, True
    with pytest.raises(KernelLimit, match="ROCm"):
        dsv4.prepare(case(), "compressed_flashmla", "cpu", 1, context=True)


def test_a_worker_builds_a_layer_once_for_cases_of_one_shape(sgl):
    dsv4.prepare(case(batch=1, step=10), "x", "cpu", 1, context=True)
    dsv4.prepare(case(batch=8, step=4000), "x", "cpu", 1, context=True)
    assert len(sgl.of("build")) == 1 and len(sgl.of("pool")) == 2  # pools are the batch's, the layer is shared
    dsv4.prepare(case(batch=1, step=10, tp=4), "x", "cpu", 1, context=True)
    assert len(sgl.of("build")) == 2 and sgl.of("build")[1].n_local_heads == 16


# --- registration, plan and labels ---


def test_the_ops_are_registered_planned_and_their_label_names_flashmla():
    ops = ("dsv4_csa_context_module", "dsv4_csa_generation_module", "dsv4_hca_context_module",
           "dsv4_hca_generation_module")  # fmt: skip
    for op in ops:
        runner = RUNNERS.find(op, "compressed_flashmla")
        assert runner.prepare.func is dsv4.prepare and runner.prepare.keywords["context"] == ("context" in op)
    assert not kt.contradicts_label("sglang", "compressed_flashmla",
                                    ["void flash::sm90::decode::sparse_fp8::flash_fwd_splitkv_mla_fp8_sparse_kernel"],
                                    None)  # fmt: skip
    assert kt.contradicts_label("sglang", "compressed_flashmla", ["void flash::FlashAttnFwdSm90<>"], None)


def test_sglangs_dsv4_module_ops_leave_runner_pending(planner):
    ops = ("dsv4_csa_context_module", "dsv4_hca_generation_module")
    plan = planner.plan("sglang", "90", PlanOptions(ops=ops))
    for op in ops:
        assert op in plan.ops and plan.ops[op].values, op
        assert set(plan.ops[op].dispatch) == {"compressed_flashmla"}


# --- the pinned wheel ---


def test_the_pinned_wheels_facts_are_what_the_runner_models():
    model = sglang_source("sglang/srt/models/deepseek_v4.py")
    assert "_FP8_WO_A_GEMM = envs.SGLANG_OPT_FP8_WO_A_GEMM.get()" in model
    assert "self.tp_size = attn_tp_size = get_parallel().attn_tp_size" in model
    assert "padded_num_heads = 64 if self.n_local_heads <= 64 else self.n_heads" in model
    assert "num_alt_streams = 5 if _is_cuda else 2" in model
    assert "and x.shape[0] <= self._multi_stream_bs_limit" in model and "get_is_capture_mode()" in model
    backend = sglang_source("sglang/srt/layers/attention/deepseek_v4_backend.py")
    assert 'assert self.page_size == 256, "the system hardcodes page_size=256"' in backend
    assert "self.MAX_SEQ_LEN_FOR_CAPTURE = self.req_to_token.shape[1]" in backend
    for read in ("model_runner.model_config.head_dim", "model_runner.model_config.v_head_dim",
                 "model_runner.hisparse_coordinator", "model_runner.model_config.hf_text_config",
                 "model_runner.server_args.enable_deepseek_v4_fp4_indexer",
                 "model_runner.server_args.speculative_eagle_topk",
                 "model_runner.server_args.speculative_num_draft_tokens"):  # fmt: skip
        assert read in backend  # every read of the model runner the stand-in answers
    assert backend.count("model_runner.") == 14  # and no other read (with the listed ones, 14 in all)
    allocator = sglang_source("sglang/srt/mem_cache/allocator/swa.py")
    assert "self._kvcache.register_mapping(self.full_to_swa_index_mapping)" in allocator
    memory = sglang_source("sglang/srt/mem_cache/deepseek_v4_memory_pool.py")
    assert "return 8 if compress_ratio == 4 else 128" in memory
    configurator = sglang_source("sglang/srt/model_executor/pool_configurator.py")
    assert "c4_state_pool_size=swa_tokens // self.swa_page_size * self.c4_ring_size" in configurator
    common = sglang_source("sglang/srt/mem_cache/common.py")
    assert "extra = 4 + (server_args.max_speculative_num_draft_tokens or 0)" in common


def test_the_contract_check_covers_every_sglang_symbol_the_runner_imports():
    uses = sglang_uses("dsv4.py")
    labels = {u.label for u in uses}
    assert {
        "sglang.srt.models.deepseek_v4.MQALayer",
        "sglang.srt.models.deepseek_v4.DeepseekV4ForCausalLM",
        "sglang.srt.models.deepseek_v4._FP8_WO_A_GEMM",
        "sglang.srt.mem_cache.deepseek_v4_memory_pool.DeepSeekV4TokenToKVPool",
        "sglang.srt.layers.attention.deepseek_v4_backend.DeepseekV4AttnBackend",
        "sglang.srt.model_executor.model_runner_kv_cache_mixin._get_dsv4_compress_state_dtypes",
        "sglang.srt.model_executor.forward_context.forward_context",
        "sglang.srt.model_executor.runner.model_capture_mode",
    } <= labels
    assert pinned_problems(uses) == []
