"""The vLLM DeepSeek-V4 runners (backends/vllm/dsv4.py) against a stand-in vllm up to the kernel call: the stand-in
attention class, its cache layers, backends, metadata builders, breakable capture and DeepGEMM wrapper read and
register what vLLM 0.24.0's do at the cited lines and record what the runner hands them. Checked: the config carries
the checkpoint's keys (held to the config.json the consumer ships, tests/data/dsv4_configs) with the rank's heads and
groups, the layer is the class vLLM selects, built as DeepseekV4DecoderLayer builds it with breakable CUDA graphs on,
every cache layer gets its backend's metadata and a cache at its own page size and padded page stride, each batch
runs as serving's dispatcher runs it, the HCA and paged-logits rows call what the reference times, and the labels are
what vLLM chose. Where the pinned wheel is at hand (.cache/wheels), the runner's symbols are resolved in it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import ROOT
from fake_frameworks import CUDAGraphMode, VllmWorld

from opcollect.backends import kernels as kt
from opcollect.backends.vllm import dsv4, msa
from opcollect.backends.vllm import dsv4_inputs as inputs
from opcollect.plans.dsv4 import DIMS, Dsv4ModuleCase
from opcollect.plans.dsv4_kernels import Dsv4KernelCase
from opcollect.plans.planner import PlanOptions
from opcollect.runtime.contract import KernelLimit

torch = pytest.importorskip("torch")

CONFIG = Path(__file__).parent / "data" / "dsv4_configs" / "sgl-project--DeepSeek-V4-Flash-FP8_config.json"
WHEELS = ROOT / ".cache" / "wheels"
FLASH, PRO = "sgl-project/DeepSeek-V4-Flash-FP8", "sgl-project/DeepSeek-V4-Pro-FP8"
ARCH = "DeepseekV4ForCausalLM"
LABEL = "FLASHMLA_SPARSE_DSV4"


def case(model=FLASH, heads=64, batch=2, isl=100, step=128, tp=1, ratio=4):
    return Dsv4ModuleCase(model, ARCH, "bfloat16", "fp8", "fp8_block", heads, batch, isl, tp, step, ratio)


def kernel_case(mla="bfloat16", batch=2, isl=16, step=300, ratio=128):
    return Dsv4KernelCase(FLASH, ARCH, mla, "fp8", "fp8_block", 64, 64, batch, isl, 1, step, ratio)


def round_up(n, to):
    return -(-n // to) * to


def mla_spec(block, ratio, head, dtype, dtype_str=None, align=None):
    """MLAAttentionSpec / SlidingWindowMLASpec's fields the runner reads (v1/kv_cache_interface.py:331-394)."""
    storage = block // ratio
    real = storage * (584 if dtype_str == "fp8_ds_mla" else head * torch.empty((), dtype=dtype).element_size())
    padded = round_up(real, align) if align and round_up(real, align) != real else None
    return SimpleNamespace(block_size=block, storage_block_size=storage, num_kv_heads=1, head_size=head,
                           dtype=dtype, cache_dtype_str=dtype_str, page_size_padded=padded,
                           page_size_bytes=padded or real)  # fmt: skip


class Backend:
    def __init__(self, fake, name, sizes=(256,)):
        self.fake, self.name, self.sizes = fake, name, sizes

    def get_name(self):
        return self.name

    def get_supported_kernel_block_sizes(self):
        return list(self.sizes)

    def get_kv_cache_shape(self, num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        assert num_kv_heads == 1
        return (num_blocks, block_size, 584 if cache_dtype_str == "fp8_ds_mla" else head_size)

    def get_builder_cls(self):
        fake, kind = self.fake, self.name

        class Builder:
            def __init__(self, spec, names, config, device):
                fake.builders.append(dict(kind=kind, spec=spec, names=names, device=device,
                                          max_model_len=config.model_config.max_model_len,
                                          topk=config.model_config.hf_config.index_topk))  # fmt: skip

            def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
                return SimpleNamespace(kind=kind, common=common_attn_metadata, prefix_len=common_prefix_len)

        return Builder


class Layer:  # DeepseekV4SWACache, DeepseekV4IndexerCache, CompressorStateCache: registered by prefix
    def __init__(self, fake, prefix, spec, backend):
        self.prefix, self.spec, self.backend, self.kv_cache = prefix, spec, backend, torch.tensor([])
        fake.current.compilation_config.static_forward_context[prefix] = self

    def get_kv_cache_spec(self, config):
        return self.spec

    def get_attn_backend(self):
        return self.backend


class FakeVllm(VllmWorld):
    def __init__(self, capability=90):
        self.capability = capability
        super().__init__(backend=None, use_fp4_indexer_cache=False)
        self.imported: list = []
        self.modules: list = []
        self.builders: list = []
        self.calls: list = []
        self.attends: list = []
        self.logits: list = []

    def install(self, monkeypatch) -> None:
        fake = self
        flashmla = Backend(self, LABEL)
        swa, indexer_backend = Backend(self, "DEEPSEEK_SPARSE_SWA", (64,)), Backend(self, "DEEPSEEK_V4_INDEXER")
        compressor_backend = Backend(self, "COMPRESSOR", (4, 8))

        # the attention breaks a capture when imported with the env the runner sets
        Capture, eager_break_during_capture = self.breakable_capture(lambda: os.environ.get(msa.BREAKABLE) == "1")

        def compressor(ratio, dim, prefix):  # DeepseekCompressor's state cache (compressor.py:121-175, :240-245)
            coff = 2 if ratio == 4 else 1
            spec = mla_spec(4 if ratio == 4 else 8, 1, 2 * coff * dim, torch.float32, align=576)
            return SimpleNamespace(state_cache=Layer(fake, f"{prefix}.state_cache", spec, compressor_backend))

        def attention_class():  # a class built per import, its method decorated as the env stands then
            class DeepseekV4FlashMLAAttention(torch.nn.Module):  # attention.py:97-318, nvidia/flashmla.py:33-66
                backend_cls = flashmla

                def __init__(self, vllm_config, prefix, topk_indices_buffer=None, aux_stream_list=None):
                    super().__init__()
                    self.args = dict(prefix=prefix, topk=topk_indices_buffer, streams=aux_stream_list)
                    hf = vllm_config.model_config.hf_config
                    self.hf, self.default_dtype = hf, torch.get_default_dtype()
                    self.n_local_heads, self.n_local_groups = hf.num_attention_heads, hf.o_groups
                    self.padded_heads = 64 if self.n_local_heads <= 64 else 128
                    self.head_dim, self.prefix = hf.head_dim, prefix
                    self.compress_ratio = max(1, hf.compress_ratios[0])
                    cache = vllm_config.cache_config
                    if cache.cache_dtype.startswith("fp8"):  # _resolve_dsv4_kv_cache_dtype (:64-91)
                        cache.cache_dtype = "fp8_ds_mla"
                    self.kv_cache_dtype, self.kv_cache = cache.cache_dtype, torch.tensor([])
                    self.wq_b = torch.nn.Linear(hf.q_lora_rank, 8, bias=False)
                    swa_spec = mla_spec(64, 1, 512, torch.uint8, cache.cache_dtype, 576)
                    self.swa_cache_layer = Layer(fake, f"{prefix}.swa_cache", swa_spec, swa)
                    vllm_config.compilation_config.static_forward_context[prefix] = self
                    self.compressor = compressor(self.compress_ratio, self.head_dim, f"{prefix}.compressor")
                    self.indexer = None
                    if self.compress_ratio == 4:  # :249-265, DeepseekV4Indexer :663-742
                        k_spec = mla_spec(cache.block_size, 4, 132, torch.uint8, align=576)
                        self.indexer = SimpleNamespace(
                            k_cache=Layer(fake, f"{prefix}.indexer.k_cache", k_spec, indexer_backend),
                            compressor=compressor(4, hf.index_head_dim, f"{prefix}.indexer.compressor"),
                        )
                    self.block_size = cache.block_size
                    fake.modules.append(self)

                def get_attn_backend(self):
                    return flashmla

                def get_kv_cache_spec(self, config):  # :598-620
                    return mla_spec(self.block_size, self.compress_ratio, 512, torch.uint8, "fp8_ds_mla", 576)

                def forward(self, positions, hidden_states, llama_4_scaling=None):
                    fake.calls.append(dict(positions=positions, hidden=hidden_states, forward=fake.forward,
                                           inference=torch.is_inference_mode_enabled()))  # fmt: skip
                    self.attention_impl(hidden_states, positions)
                    return hidden_states

                @eager_break_during_capture
                def attention_impl(self, hidden_states, positions):  # reads the bound caches when it runs
                    fake.attends.append((self.kv_cache, self.swa_cache_layer.kv_cache))

                def forward_mqa(self, q, kv, positions, output):
                    fake.attends.append(dict(q=q, kv=kv, positions=positions, out=output, forward=fake.forward,
                                             cache=self.kv_cache))  # fmt: skip

            return DeepseekV4FlashMLAAttention

        def model_getattr(name):  # PEP 562: the class is made when the runner imports the selector
            if name != "_select_dsv4_attn_cls":
                raise AttributeError(name)
            fake.imported.append(os.environ.get(msa.BREAKABLE))
            cls = attention_class()
            return lambda config: cls  # nvidia/model.py:738-769: FlashMLA's class on SM90

        class DeepseekV4Config(SimpleNamespace):  # transformers_utils/configs/deepseek_v4.py
            model_type = "deepseek_v4"

            def __init__(self, rope_scaling=None, **kw):
                super().__init__(rope_scaling=rope_scaling, rope_parameters=rope_scaling, **kw)

        def paged_logits(q, kv_cache, weights, context_lens, block_tables, schedule, max_model_len, clean_logits):
            fake.logits.append(dict(q=q, kv=kv_cache, weights=weights, lens=context_lens, table=block_tables,
                                    schedule=schedule, max_model_len=max_model_len, clean=clean_logits))  # fmt: skip

        self.install_world(
            monkeypatch,
            {
                "vllm.v1.worker.workspace": {
                    "init_workspace_manager": lambda device: None,
                    "reset_workspace_manager": lambda: None,
                },
                "vllm.models.deepseek_v4.nvidia.model": {"__getattr__": model_getattr},
                "vllm.models.deepseek_v4.quant_config": {
                    "DeepseekV4FP8Config": SimpleNamespace(from_config=lambda cfg: SimpleNamespace(source=cfg))
                },
                "vllm.transformers_utils.configs.deepseek_v4": {"DeepseekV4Config": DeepseekV4Config},
                "vllm.compilation.breakable_cudagraph": {"BreakableCUDAGraphCapture": Capture},
                "vllm.model_executor.layers.attention": {"MLAAttention": type("MLAAttention", (), {})},
                "vllm.model_executor.layers.quantization.base_config": {
                    "QuantizeMethodBase": type("QuantizeMethodBase", (), {})
                },
                "vllm.utils.deep_gemm": {
                    "fp8_fp4_paged_mqa_logits": paged_logits,
                    "get_paged_mqa_logits_metadata": lambda lens, block, sms: ("schedule", block, sms),
                },
                "vllm.utils.platform_utils": {"num_compute_units": lambda device_id=0: 132},
            },
        )
        monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: SimpleNamespace(device=device))  # no GPU


@pytest.fixture
def fake(monkeypatch):
    return FakeVllm.installed(monkeypatch)


def test_the_config_keys_are_the_checkpoints():
    source = json.loads(CONFIG.read_text())
    keys = inputs.model_keys(FLASH)
    renamed = {"rope_scaling", "rms_norm_eps"}  # rope_type as vLLM names it; the eps the FP8 files leave out
    assert {k: v for k, v in keys.items() if k not in renamed} == {
        k: v for k, v in source.items() if k not in ("compress_ratios", "model_type", "rope_scaling")
    }
    legacy = dict(source["rope_scaling"])
    assert keys["rope_scaling"] == {**{k: v for k, v in legacy.items() if k != "type"}, "rope_type": legacy["type"]}
    assert keys["rms_norm_eps"] == 1e-6 and keys["rope_scaling"] is not inputs.MODELS[FLASH]["rope_scaling"]
    for model, d in DIMS.items():  # the planner's dimensions agree (plans/dsv4.py)
        k = inputs.model_keys(model)
        assert (k["hidden_size"], k["q_lora_rank"], k["o_lora_rank"], k["o_groups"], k["head_dim"],
                k["sliding_window"], k["index_n_heads"], k["index_head_dim"], k["index_topk"]) == tuple(d)  # fmt: skip


def test_builds_the_layer_vllm_selects_as_serving_does(fake):
    c = case(model=PRO, heads=32, tp=4, batch=2, isl=100, step=128)
    prepared = dsv4.prepare(c, LABEL, "cpu", 1, context=True)
    assert prepared.kernel_source == LABEL and not prepared.graph_safe  # a short prefill: breakable pieces
    assert set(fake.imported) == {"1"} and msa.BREAKABLE not in os.environ  # on for the import alone
    (module,) = fake.modules
    hf = module.hf
    assert (hf.num_attention_heads, hf.o_groups, hf.compress_ratios, hf.num_hidden_layers) == (32, 4, [4], 1)
    assert hf.rope_scaling["factor"] == 16 and hf.compress_rope_theta == 160000 and hf.rms_norm_eps == 1e-6
    assert inputs.MODELS[PRO]["num_attention_heads"] == 128  # the profile untouched
    assert module.args["prefix"] == "model.layers.0.attn" and len(module.args["streams"]) == 3
    assert tuple(module.args["topk"].shape) == (8192, 1024) and module.args["topk"].dtype == torch.int32
    assert module.default_dtype == torch.bfloat16 and torch.get_default_dtype() == torch.float32  # restored
    assert module.wq_b.weight.abs().sum() > 0  # filled
    config = fake.calls[-1]["forward"].config
    assert config.quant_config.source["weight_block_size"] == [128, 128]
    assert config.cache_config.block_size == 256 and config.cache_config.cache_dtype == "fp8_ds_mla"
    # every cache layer's backend built its metadata at its own page size, over the reference's max_model_len
    kinds = [(b["kind"], b["names"][0].split("attn")[-1], b["spec"].block_size) for b in fake.builders]
    assert kinds == [(LABEL, "", 256), ("DEEPSEEK_SPARSE_SWA", ".swa_cache", 64),
                     ("DEEPSEEK_V4_INDEXER", ".indexer.k_cache", 256), ("COMPRESSOR", ".compressor.state_cache", 4),
                     ("COMPRESSOR", ".indexer.compressor.state_cache", 4)]  # fmt: skip
    assert {b["max_model_len"] for b in fake.builders} == {4096}


def test_caches_and_metadata_have_vllms_layouts(fake):
    c = case(batch=2, isl=100, step=300)  # 400 tokens a sequence
    prepared = dsv4.prepare(c, LABEL, "cpu", 1, context=True)
    prepared.call()
    layers = fake.calls[-1]["forward"].config.compilation_config.static_forward_context
    forward = fake.calls[-1]["forward"]
    main, swa = layers["model.layers.0.attn"], layers["model.layers.0.attn.swa_cache"]
    # 2 pages of 256 tokens per sequence after the null block, 64 compressed entries of 584 bytes a page, padded
    assert tuple(main.kv_cache.shape) == (5, 64, 584) and main.kv_cache.stride()[:2] == (37440, 584)
    assert tuple(swa.kv_cache.shape) == (1 + 2 * 7, 64, 584)
    state = layers["model.layers.0.attn.compressor.state_cache"]
    assert tuple(state.kv_cache.shape) == (1 + 2 * 100, 4, 2048) and state.kv_cache.dtype == torch.float32
    assert torch.isfinite(state.kv_cache).all() and main.kv_cache.max() < 0x40  # the finite fill
    common = forward.attn_metadata["model.layers.0.attn.swa_cache"].common
    assert common.seq_lens.tolist() == [400, 400] and common.max_query_len == 100 and common.num_actual_tokens == 200
    assert common.block_table_tensor[1, 0].item() == 8  # 7 pages of 64 tokens a sequence after the null block
    assert common.slot_mapping[0].item() == (1 + 300 // 64) * 64 + 300 % 64
    assert common.positions.tolist()[:2] == [300, 301] and common.positions.dtype == torch.int64
    assert forward.slot_mapping["model.layers.0.attn.swa_cache"] is common.slot_mapping
    assert fake.calls[-1]["hidden"].shape == (200, 4096) and fake.calls[-1]["inference"]


def test_batches_run_as_serving_runs_them(fake):
    decode = dsv4.prepare(case(batch=64, isl=1, step=1000, ratio=128), LABEL, "cpu", 2, context=False)
    assert decode.graph_safe  # a FULL graph: the harness captures the whole forward
    decode.call()
    assert fake.calls[-1]["forward"].mode == CUDAGraphMode.FULL
    common = fake.calls[-1]["forward"].attn_metadata["model.layers.0.attn"].common
    assert common.seq_lens.tolist() == [1001] * 64 and common.positions.tolist()[0] == 1000  # step cached tokens
    prefill = dsv4.prepare(case(batch=2, isl=100), LABEL, "cpu", 2, context=True)
    captures = fake.captures[-2:]
    assert [c.kinds for c in captures] == [["graph", "eager", "graph"]] * 2  # attention_impl breaks each capture
    before = len(fake.attends)
    prefill.call()
    assert len(fake.attends) == before + 1 and fake.calls[-1]["forward"].mode == CUDAGraphMode.PIECEWISE
    large = dsv4.prepare(case(batch=8, isl=1024), LABEL, "cpu", 1, context=True)
    assert not large.graph_safe and inputs.graph_mode(case(batch=8, isl=1024), True) == inputs.EAGER
    large.call()
    assert fake.calls[-1]["forward"].mode == CUDAGraphMode.NONE


def test_the_hca_row_times_forward_mqa_alone(fake):
    prepared = dsv4.prepare_hca(kernel_case(batch=2, isl=16, step=300), LABEL, "cpu", 2)
    assert prepared.kernel_source == LABEL and prepared.graph_safe
    prepared.call()
    (module,) = fake.modules
    assert module.hf.compress_ratios == [128] and module.indexer is None
    run = fake.attends[-1]
    assert run["q"].shape == (32, 64, 512) and run["q"].dtype == torch.bfloat16 and run["out"].shape == (32, 64, 512)
    assert run["positions"].tolist()[:2] == [300, 301] and run["cache"] is module.kv_cache
    assert run["forward"].attn_metadata["model.layers.0.attn"].common.seq_lens.tolist() == [316, 316]
    assert not fake.calls  # no projections


def test_the_paged_logits_row_calls_deepgemm_on_the_references_inputs(fake):
    c = kernel_case(mla="fp8_e4m3", batch=2, isl=8, step=100, ratio=4)
    prepared = dsv4.prepare_paged(c, dsv4.PAGED_LABEL, "cpu", 1)
    assert prepared.kernel_source == "vllm.utils.deep_gemm.fp8_fp4_paged_mqa_logits" and prepared.graph_safe
    prepared.call()
    (call,) = fake.logits
    q, weights = call["q"]
    assert weights is None and q.shape == (16, 1, 64, 128) and q.dtype == torch.float8_e4m3fn
    assert call["kv"].shape == (1, 64, 1, 132) and call["weights"].shape == (16, 64)
    # causal lengths run on across the 16 packed rows (collector :628-634)
    assert call["lens"].view(-1).tolist() == [(100 + j) // 4 for j in range(1, 17)]
    assert call["table"].shape == (16, 1) and call["max_model_len"] == 29 and call["clean"] is False
    assert call["kv"].view(1, -1)[:, 64 * 128 :].view(torch.float32).eq(2.0**-6).all()


def test_refusals_come_before_any_framework_import():
    for bad in (
        case()._replace(mla_dtype="fp8"),
        case()._replace(kv_cache_dtype="fp8_e4m3"),
        case()._replace(gemm_type="bfloat16"),
        case(model="deepseek-ai/DeepSeek-V4-Flash"),
        case(heads=64, tp=2),  # not the rank's heads at TP 2
        case(ratio=8),
    ):
        with pytest.raises(KernelLimit):
            dsv4.prepare(bad, LABEL, "cpu", 1, True)
    with pytest.raises(KernelLimit):
        dsv4.prepare_hca(kernel_case(ratio=4), LABEL, "cpu", 1)
    with pytest.raises(KernelLimit):
        dsv4.prepare_paged(kernel_case(mla="bfloat16", ratio=4), dsv4.PAGED_LABEL, "cpu", 1)
    assert "vllm" not in sys.modules


def test_footprint_grows_with_the_case():
    base = dsv4.footprint(case(batch=2, isl=1024), True)
    assert dsv4.footprint(case(batch=8, isl=1024), True) > base
    assert dsv4.footprint(case(batch=2, isl=1024, step=65536), True) > base
    assert dsv4.footprint(case(model=PRO, heads=128, batch=2, isl=1024), True) > base
    assert dsv4.footprint(case(batch=64, isl=1, step=65536), False) > dsv4.footprint(case(batch=64, isl=1), False)
    assert dsv4.hca_footprint(kernel_case(step=300)) < dsv4.footprint(case(isl=16, step=300, ratio=128), True)
    assert dsv4.paged_footprint(kernel_case(step=65536, ratio=4)) > dsv4.paged_footprint(kernel_case(ratio=4))
    assert dsv4.footprint(case(model="nobody/else"), True) == 0  # prepare refuses it


def test_the_labels_name_their_kernels():
    sparse = "void sm90::fwd::sparse_attn_fwd_kernel<sm90::fwd::KernelTemplate<512, false>, TmaParams<..>>"
    decode = "void sm90::decode::sparse_fp8::flash_fwd_splitkv_mla_fp8_sparse_kernel<cutlass::bfloat16_t, 64>"
    dense = "void sm90::flash_fwd_splitkv_mla_kernel<Traits<cutlass::bfloat16_t>>"
    for op in ("dsv4_csa_context_module", "dsv4_hca_generation_module", "dsv4_hca_attn_module"):
        assert not kt.contradicts_label("vllm", LABEL, ["deep_gemm::fp8_gemm", sparse], op)
        assert not kt.contradicts_label("vllm", LABEL, [decode], op)
        assert kt.contradicts_label("vllm", LABEL, [dense, "nvjet_tst_128x64"], op)
    logits = "void deep_gemm::sm90_fp8_paged_mqa_logits<128u, 64u, 1u>"
    assert not kt.contradicts_label("vllm", dsv4.PAGED_LABEL, [logits], "dsv4_paged_mqa_logits_module")
    assert kt.contradicts_label("vllm", dsv4.PAGED_LABEL, ["void deep_gemm::sm90_fp8_mqa_logits<>"], "x")


def test_vllms_dsv4_ops_are_planned_at_sm90(planner):
    ops = ("dsv4_csa_context_module", "dsv4_hca_generation_module", "dsv4_paged_mqa_logits_module",
           "dsv4_hca_attn_module", "dsv4_csa_topk_calib")  # fmt: skip
    plan = planner.plan("vllm", "90", PlanOptions(ops=ops))
    held = {op: set(plan.ops[op].dispatch) for op in ops if op in plan.ops and plan.ops[op].values}
    assert held == {
        "dsv4_csa_context_module": {LABEL},
        "dsv4_hca_generation_module": {LABEL},
        "dsv4_paged_mqa_logits_module": {dsv4.PAGED_LABEL},
        "dsv4_hca_attn_module": {LABEL},
    }  # the top-k calibration is SGLang's table alone


def test_the_contract_check_covers_every_vllm_symbol_the_runner_imports():
    from opcollect.backends.symbols import Release, check, runner_uses

    backends = ROOT / "src" / "opcollect" / "backends"
    # with dsa.common_metadata's CommonAttentionMetadata, which the runner calls
    uses = [
        u
        for u in runner_uses(backends / "vllm", ("vllm",), ROOT)
        if "/vllm/dsv4" in u.where or ("/vllm/dsa.py" in u.where and u.label.endswith("CommonAttentionMetadata"))
    ]
    assert {
        "vllm.models.deepseek_v4.nvidia.model._select_dsv4_attn_cls",
        "vllm.models.deepseek_v4.quant_config.DeepseekV4FP8Config",
        "vllm.transformers_utils.configs.deepseek_v4.DeepseekV4Config",
        "vllm.utils.deep_gemm.fp8_fp4_paged_mqa_logits",
        "vllm.utils.deep_gemm.get_paged_mqa_logits_metadata",
        "vllm.utils.platform_utils.num_compute_units",
        "vllm.v1.attention.backend.CommonAttentionMetadata",
        "vllm.forward_context.set_forward_context",
    } <= {u.label for u in uses}
    found = sorted(WHEELS.glob("vllm-0.24.0-*.whl"))
    if found:
        assert check(uses, Release(found[-1])) == []
