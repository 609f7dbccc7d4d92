"""The TensorRT-LLM MSA module runner (backends/trtllm/msa.py, msa_inputs.py) against a stand-in tensorrt_llm up to the
kernel call: the stand-in config class, decoder layer, MiniMax-M3 attention, its two backends (Triton and the rc23
fmha_sm100 MSA one), cache manager and metadata record what the runner hands them, with the behaviour the reference
collector relies on at rc23 (collect_msa_module.py: the implementation field, the route's page size, the metadata
contracts). Checked: the config fields are the checkpoint's, the layer, cache, batch and inputs are what the collector
builds, the route and its label follow the SM and what was built, the refusals come before any import, a version
without the route is refused naming it, the source assumptions are read from the installed package, and TensorRT-LLM's
MSA ops are planned."""

from __future__ import annotations

import dataclasses
import gc
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import ROOT, cases_of
from fake_trtllm import WORLD_SYMBOLS, Linear, TrtllmWorld, fake_fixture, installed, package_tree

from opcollect.backends import kernels as kt
from opcollect.backends.trtllm import msa, torch_ops
from opcollect.backends.trtllm import msa_inputs as inputs
from opcollect.backends.trtllm.context import release_pending
from opcollect.plans.mla_module import MlaModuleCase
from opcollect.plans.planner import PlanOptions
from opcollect.runtime.contract import KernelLimit

torch = pytest.importorskip("torch")

CONFIGS = Path(__file__).parent / "data" / "sparse_configs"
TREE = Path(__file__).parent / "data" / "trtllm-release"
M3, MODEL = "MiniMaxM3ForCausalLM", "MiniMaxAI/MiniMax-M3"
OPS = ("msa_context_module", "msa_generation_module")


def case(heads=16, batch=2, isl=100, step=128, kv="bfloat16", gemm="bfloat16"):
    return MlaModuleCase(MODEL, M3, "bfloat16", kv, gemm, heads, batch, isl, 1, step)


def gen(heads=16, batch=3, step=4095, **kw):
    return case(heads, batch, 1, step, **kw)


class FakeTrtllm(TrtllmWorld):
    """tensorrt_llm's MiniMax-M3 modules the runner imports, recording what it hands them."""

    def __init__(self, capability=(9, 0), implementation=True):
        super().__init__(capability)
        self.implementation = implementation
        self.swap_backend = False  # build the other route's backend than the config asks
        self.no_attachment = False

    def install(self, monkeypatch) -> None:
        fake = self

        class SparseConfig:
            model_fields = dict.fromkeys(
                ("sparse_num_index_heads", "sparse_index_dim", "sparse_block_size", "sparse_topk_blocks",
                 "sparse_init_blocks", "sparse_local_blocks", "sparse_disable_index_value")
                + (("implementation",) if fake.implementation else ())
            )  # fmt: skip

            def __init__(self, **kw):
                self.kw = kw
                self.__dict__.update(kw)

            def to_sparse_metadata_params(self, pretrained_config=None):
                return SimpleNamespace(config=self, pretrained=pretrained_config)

        @dataclasses.dataclass
        class TritonMetadata:  # triton_metadata.py: prepare() attaches attn_metadata.minimax_m3
            max_num_requests: int = 0
            max_num_tokens: int = 0
            kv_cache_manager: object = None
            mapping: object = None
            seq_lens: object = None
            position_ids: object = None
            num_contexts: int = 0
            kv_cache_params: object = None
            cross: object = None
            request_ids: object = None
            prompt_lens: object = None
            runtime_features: object = None
            all_rank_num_tokens: object = None
            max_num_sequences: object = None
            num_heads_per_kv: object = None

            def __post_init__(self):
                fake.metadata.append(self)

            def prepare(self):
                fake.events.append("prepare")
                self.minimax_m3 = None if fake.no_attachment else {"runtime": True}

        @dataclasses.dataclass
        class MiniMaxM3MsaSparseAttentionMetadata(TritonMetadata):  # msa_backend.py: flat buffers, decode plans
            sparse_metadata_params: object = None

            def prepare(self):
                fake.events.append("prepare")
                self._msa_fields_ready = True
                decode = self.num_contexts == 0 and self.sparse_metadata_params is not None
                self.msa_decode_proxy_plan = "plan" if decode and not fake.no_attachment else None

        class MiniMaxM3SparseRuntimeBackend:
            Metadata = TritonMetadata

        class MiniMaxM3MsaSparseAttention:
            Metadata = MiniMaxM3MsaSparseAttentionMetadata

        class MiniMaxM3Attention(torch.nn.Module):
            def __init__(self, config, sparse):
                super().__init__()
                p = config.pretrained_config
                h, kv, d = p.num_attention_heads, p.num_key_value_heads, p.head_dim
                self.is_sparse_attention_layer = sparse
                self.qkv_proj = Linear((h + 2 * kv) * d, p.hidden_size, config.quant_config)
                self.index_qk_proj = Linear(5 * 128, p.hidden_size, None)  # never quantized
                msa_route = getattr(config.sparse_attention_config, "implementation", "triton") == "msa"
                if fake.swap_backend:
                    msa_route = not msa_route
                self.attn = MiniMaxM3MsaSparseAttention() if msa_route else MiniMaxM3SparseRuntimeBackend()

            def post_load_weights(self):
                fake.events.append(("post_load", float(self.qkv_proj.weight.float().abs().sum())))

            def forward(self, position_ids, hidden_states, attn_metadata):
                fake.forward(position_ids, hidden_states, attn_metadata)

        class MiniMaxM3DecoderLayer(torch.nn.Module):
            def __init__(self, model_config, layer_idx, aux_stream_dict):
                super().__init__()
                p = model_config.pretrained_config
                sparse = p.sparse_attention_config["sparse_attention_freq"][layer_idx] == 1
                self.self_attn = MiniMaxM3Attention(model_config, sparse)
                fake.built(layer_idx, aux_stream_dict, self.self_attn)

        class Manager(self.manager_class()):
            def add_dummy_requests(self, token_nums=None, request_ids=None, is_gen=False):
                return self.added(request_ids, token_nums, is_gen)

        class PretrainedConfig:  # transformers' base config: attributes set one by one
            pass

        self.install_world(monkeypatch, {
            "transformers": {"PretrainedConfig": PretrainedConfig},
            "tensorrt_llm.llmapi.llm_args": {"MiniMaxM3SparseAttentionConfig": SparseConfig},
            "tensorrt_llm._torch.model_config": {"ModelConfig": self.model_config_class()},
            "tensorrt_llm._torch.models.modeling_minimaxm3": {"MiniMaxM3DecoderLayer": MiniMaxM3DecoderLayer},
            "tensorrt_llm.version": {"__version__": "1.3.0rc20" if not fake.implementation else "1.3.0rc23"},
        }, self.manager_cls_of(Manager), "SELF", ("BF16",))  # fmt: skip


fake = fake_fixture(FakeTrtllm)


def test_the_config_fields_are_the_checkpoints():
    source = json.loads((CONFIGS / "MiniMaxAI--MiniMax-M3_config.json").read_text())
    # every key, the sparse dict and its per-layer lists included; the bf16 dtype is set typed (msa.model_config)
    assert source.pop("torch_dtype") == "bfloat16" and inputs.MODELS[M3] == source
    keys = inputs.model_keys(M3)
    assert keys == source and keys["sparse_attention_config"] is not inputs.MODELS[M3]["sparse_attention_config"]
    assert keys["moe_layer_freq"] is not inputs.MODELS[M3]["moe_layer_freq"]  # a fresh copy
    assert [inputs.rank_kv_heads(keys, h) for h in (1, 8, 16, 32, 64, 128)] == [1, 1, 1, 2, 4, 8]


def test_the_triton_route_builds_the_collectors_layer_cache_and_metadata(fake):
    c = case(heads=32, batch=2, isl=100, step=128, gemm="fp8_block")
    prepared = msa.prepare(c, "default", "cpu", 2, context=True)
    assert prepared.kernel_source == "default" and prepared.graph_safe  # SM90: Triton, replayed from a graph
    assert ("checked", "msa_context_module") in fake.events  # the source assumptions, before any build
    (config,) = fake.model_configs
    p = config.pretrained_config
    # one sparse layer at the rank's heads, the checkpoint's keys otherwise (collect_msa_module.py:414-449)
    assert (p.num_hidden_layers, p.num_attention_heads, p.num_key_value_heads) == (1, 32, 2)
    assert p.sparse_attention_config["sparse_attention_freq"] == [1] and p.moe_layer_freq == [0]
    assert p.sparse_attention_config["sparse_disable_index_value"] == [1]
    assert (p.hidden_size, p.head_dim, p.rotary_dim, p.model_type) == (6144, 128, 64, "minimax_m3")
    assert p.torch_dtype == torch.bfloat16
    assert config.sparse_attention_config.kw == {
        "sparse_num_index_heads": 4, "sparse_index_dim": 128, "sparse_block_size": 128, "sparse_topk_blocks": 16,
        "sparse_init_blocks": 0, "sparse_local_blocks": 1, "sparse_disable_index_value": True,
        "implementation": "triton",
    }  # fmt: skip
    assert (config.attn_backend, config.skip_create_weights_in_init) == ("TRTLLM", True)
    assert (config.max_num_tokens, config.max_seq_len) == (131072, 163840)
    assert config.quant_config.quant_algo == "FP8_BLOCK_SCALES" and config.quant_config.kv_cache_quant_algo is None
    (layer,) = fake.layers
    assert layer.layer_idx == 0 and set(layer.streams) == {"attention", "moe_shared", "moe_chunking"}
    module = layer.module
    assert module.qkv_proj.weight.dtype == torch.float8_e4m3fn and module.index_qk_proj.weight.dtype == torch.bfloat16
    [(_, filled)] = [e for e in fake.events if e[0] == "post_load"]
    assert filled > 0  # drawn as the dummy loader draws, then post-processed
    (manager,) = fake.managers
    kv = inputs.layout(c, True, 32, copies=2)
    assert vars(manager.cache_config) == {"max_tokens": kv.max_tokens, "enable_block_reuse": False}
    assert kv.max_tokens == 2 * 4 * (256 + 64)  # 2 x sequences x (round_up(229, 32) + 2 pages)
    k = manager.kw
    assert manager.cache_type == "SELF" and (k["num_layers"], k["num_kv_heads"], k["head_dim"]) == (1, [2], 128)
    assert (k["tokens_per_block"], k["max_seq_len"], k["max_batch_size"], k["dtype"]) == (32, 229, 4, "BF16")
    assert (k["sparse_layer_ids"], k["disable_index_value_layer_ids"], k["sparse_index_dim"]) == ([0], [0], 128)
    assert k["sparse_attention_config"] is config.sparse_attention_config and k["pretrained_config"] is p
    assert manager.requests == ([0, 1, 2, 3], [228] * 4, False)
    first, second = fake.metadata
    assert (first.max_num_requests, first.max_num_tokens, first.num_contexts) == (2, 200, 2)
    assert first.seq_lens.tolist() == [100, 100] and first.prompt_lens == [100, 100]
    assert first.kv_cache_params.num_cached_tokens_per_seq == [128, 128] and first.runtime_features.cache_reuse
    assert (first.max_num_sequences, first.num_heads_per_kv) == (2, 16)
    assert not hasattr(first, "sparse_metadata_params")  # the Triton metadata has no such field
    assert (first.request_ids, second.request_ids) == ([0, 1], [2, 3]) and first.kv_cache_manager is manager
    prepared.call()
    prepared.call()
    (pos1, hidden1, md1, reg1), (_, hidden2, md2, reg2) = fake.forwards
    assert (md1, reg1, md2, reg2) == (second, second, first, first)  # copies rotate, each registered
    assert pos1.tolist() == list(range(128, 228)) * 2 and tuple(hidden1.shape) == (200, 6144)
    assert not torch.equal(hidden1, hidden2) and "shutdown" not in fake.events
    del prepared
    gc.collect()
    assert fake.events.count("shutdown") == 1  # the pools go with the case


def test_the_msa_route_on_sm100(monkeypatch):
    fake = installed(FakeTrtllm, monkeypatch, capability=(10, 0))
    prefill = msa.prepare(case(heads=64, step=0), "msa_fmha_sm100", "cpu", 1, context=True)
    assert prefill.kernel_source == "msa_fmha_sm100" and not prefill.graph_safe  # serving prefills it eagerly
    assert fake.model_configs[0].sparse_attention_config.kw["implementation"] == "msa"
    assert fake.managers[0].kw["tokens_per_block"] == 128 and not fake.metadata[0].runtime_features.cache_reuse
    decode = msa.prepare(gen(heads=64, batch=3, step=4095), "msa_fmha_sm100", "cpu", 1, context=False)
    assert decode.graph_safe
    manager, metadata = fake.managers[-1], fake.metadata[-1]
    assert manager.requests == ([0, 1, 2], [4096] * 3, True) and manager.kw["max_seq_len"] == 4097
    assert metadata.num_contexts == 0 and metadata.prompt_lens == [4095] * 3 and metadata.msa_decode_proxy_plan
    assert metadata.sparse_metadata_params.config is fake.model_configs[-1].sparse_attention_config
    assert metadata.kv_cache_params.num_cached_tokens_per_seq == [4095] * 3
    fake.no_attachment = True  # a decode batch whose plans were not built is no serving decode
    with pytest.raises(RuntimeError, match="no decode plans"):
        msa.prepare(gen(), "msa_fmha_sm100", "cpu", 1, context=False)
    assert fake.events.count("shutdown") >= 1
    release_pending()


def test_a_backend_of_the_other_route_or_a_missing_attachment_is_refused(fake):
    fake.swap_backend = True
    with pytest.raises(RuntimeError, match="MiniMaxM3MsaSparseAttention .* for the 'triton'"):
        msa.prepare(case(), "default", "cpu", 1, context=True)
    fake.swap_backend, fake.no_attachment = False, True
    with pytest.raises(RuntimeError, match="minimax_m3 attachment"):
        msa.prepare(case(), "default", "cpu", 1, context=True)
    assert fake.events.count("shutdown") == 1  # the manager goes with the failed case


def test_a_full_pool_shuts_the_manager_down(fake):
    fake.events.append("full")
    with pytest.raises(RuntimeError, match="took none"):
        msa.prepare(gen(), "default", "cpu", 1, context=False)
    assert fake.events.count("shutdown") == 1


def test_a_version_without_the_route_is_refused_naming_it(monkeypatch):
    from opcollect.backends import trtllm

    installed(FakeTrtllm, monkeypatch, implementation=False)
    with pytest.raises(KernelLimit, match=r"TensorRT-LLM 1\.3\.0rc20's MiniMaxM3SparseAttentionConfig has no impl"):
        msa.prepare(case(), "default", "cpu", 1, context=True)
    release_pending()
    for op, context in zip(OPS, (True, False)):
        runner = trtllm.RUNNERS.find(op, "default", "1.3.0rc23")
        c = case() if context else gen()
        assert runner.footprint(c) == inputs.footprint(c, context)
        with pytest.raises(KernelLimit, match=rf"no runner for {op} .* at 1\.3\.0rc20"):
            trtllm.RUNNERS.find(op, "default", "1.3.0rc20")


def test_refusals_come_before_any_framework_import():
    import sys

    for bad in (
        case(heads=128),  # 8 KV heads do not divide the 4 index heads (the reference's 856 failures)
        case(kv="fp8"),
        case()._replace(mla_dtype="fp8"),
        case(gemm="int4_wo"),
        case()._replace(architecture="MiniMaxM2ForCausalLM"),
        case(isl=0),
    ):
        with pytest.raises(KernelLimit):
            msa.prepare(bad, "default", "cpu", 1, True)
    assert not any(name.split(".")[0] == "tensorrt_llm" for name in sys.modules)


@pytest.mark.parametrize(
    ("capability", "c", "refused"),
    [
        ((9, 0), case(gemm="nvfp4"), "nvfp4"),
        ((8, 6), case(gemm="fp8_block"), "SM89"),
        ((10, 3), case(gemm="nvfp4"), None),
    ],
)
def test_device_refusals_and_routes(capability, c, refused):
    if refused is None:
        inputs.check_capability(c, capability)
    else:
        with pytest.raises(KernelLimit, match=refused):
            inputs.check_capability(c, capability)
    routes = {cap: inputs.implementation(cap) for cap in ((9, 0), (10, 0), (10, 3), (12, 0), (8, 9))}
    assert routes == {(9, 0): "triton", (10, 0): "msa", (10, 3): "msa", (12, 0): "triton", (8, 9): "triton"}


def test_footprint_by_hand():
    keys = inputs.MODELS[M3]
    qkv_o = 6144 * (16 + 2) * 128 + 16 * 128 * 6144
    assert inputs.weight_bytes(keys, 16, "bfloat16") == 2 * qkv_o + 2 * 6144 * 5 * 128
    assert inputs.weight_bytes(keys, 16, "fp8_block") == int(qkv_o * (1 + 4 / 128**2)) + 2 * 6144 * 5 * 128
    assert inputs.cache_bytes_per_token(keys, 64) == 2 * (2 * 4 * 128 + 128)
    base = inputs.footprint(case(heads=16, batch=2, isl=1024), True)
    assert inputs.footprint(case(heads=64, batch=2, isl=1024), True) > base
    assert inputs.footprint(case(heads=16, batch=8, isl=1024), True) > base
    assert inputs.footprint(case(heads=16, batch=2, isl=1024, gemm="fp8_block"), True) < base
    assert inputs.footprint(gen(step=65535), False) > inputs.footprint(gen(step=1023), False)
    # the Triton index scores of a long prefill: fp32 [tokens, 4 heads, keys], twice
    big = case(heads=16, batch=4, isl=32768, step=128)
    assert inputs.footprint(big, True) > 2 * 4 * 32768 * 4 * (32768 + 128) * 4
    assert inputs.footprint(case()._replace(architecture="X"), True) == 0  # refused later


LAYER = (
    "class MiniMaxM3DecoderLayer:\n    def __init__(self, c, i, s):\n        _, ids = get_sparse_layer_ids(c)\n"
    "        self.self_attn = MiniMaxM3Attention(c, is_sparse_attention_layer=i in ids)\n"
)
ARGS = "class MiniMaxM3SparseAttentionConfig:\n    sparse_topk_blocks: int = 16\n    implementation: str = 'triton'\n"
UTIL = (
    "def get_kv_cache_manager_cls(model_config, kv_cache_config):\n"
    "    if model_config.sparse_attention_config is not None:\n"
    "        return get_sparse_attn_kv_cache_manager(model_config.sparse_attention_config)\n"
)


def test_the_source_assumptions_name_what_broke(tmp_path):
    good = {
        "_torch/models/modeling_minimaxm3.py": LAYER,
        "llmapi/llm_args.py": ARGS,
        "_torch/pyexecutor/_util.py": UTIL,
    }
    root = package_tree(tmp_path / "good", good)
    for op in OPS:
        assert torch_ops.problems(root, op) == []
        torch_ops.check_installed(op, root)
    rc20 = {**good, "llmapi/llm_args.py": ARGS.replace("    implementation: str = 'triton'\n", "")}
    (line,) = torch_ops.problems(package_tree(tmp_path / "rc20", rc20), "msa_generation_module")
    assert "llm_args.py: MiniMaxM3SparseAttentionConfig no longer uses implementation" in line
    dense = {**good, "_torch/models/modeling_minimaxm3.py": LAYER.replace("is_sparse_attention_layer=", "dense=")}
    with pytest.raises(KernelLimit, match="MiniMaxM3DecoderLayer no longer uses is_sparse_attention_layer="):
        torch_ops.check_installed("msa_context_module", package_tree(tmp_path / "dense", dense))


def test_the_labels_name_the_routes_kernels():
    triton = ["nvjet_tst_128x64", "_block_max_score_kernel", "elementwise_kernel"]
    for op in OPS:
        assert not kt.contradicts_label("trtllm", "default", triton, op)
        assert kt.contradicts_label("trtllm", "default", ["nvjet_tst_128x64", "fmha_v2_flash_attention"], op)
        assert not kt.contradicts_label("trtllm", "msa_fmha_sm100", ["SparseAttentionForwardSm100_kernel"], op)
    # the DSA and MLA ops keep their meanings
    assert not kt.contradicts_label("trtllm", "default", ["sm90::flash_fwd_splitkv_mla_kernel"], "mla_generation")
    assert kt.contradicts_label("trtllm", "default", ["_block_max_score_kernel"], "dsa_context_module")


@pytest.mark.parametrize("sm", ["90", "100"])
def test_trtllms_msa_ops_are_planned_and_every_case_passes_the_builders(planner, sm):
    plan = planner.plan("trtllm", sm, PlanOptions(ops=OPS))
    capability = (9, 0) if sm == "90" else (10, 0)
    label = "default" if sm == "90" else "msa_fmha_sm100"
    for op in OPS:
        selection = plan.ops[op]
        assert selection.values and set(selection.dispatch) == {label}
        seen = set()
        for c in cases_of(selection):
            inputs.check_case(c)
            inputs.check_capability(c, capability)
            seen.add((c.kv_cache_dtype, c.gemm_type, c.num_heads))
        gemms = {"bfloat16", "fp8_block"} | ({"nvfp4"} if sm == "100" else set())
        assert seen == {("bfloat16", g, h) for g in gemms for h in (1, 2, 4, 8, 16, 32, 64)}


def test_the_contract_check_covers_every_symbol_the_runner_imports():
    """`opcollect contract trtllm` and the run's preflight read the runner's imports (backends/symbols.py): every one
    msa.py makes, and the module-build helpers it calls in mla_module.py, is among them and resolves in the tree, and
    none is rc23-only (the preflight checks the whole backend, rc20's image included): the route's own classes are
    read off the built objects."""
    from opcollect.backends.symbols import Release, check, runner_uses

    found = runner_uses(ROOT / "src" / "opcollect" / "backends" / "trtllm", ("tensorrt_llm",), ROOT)
    uses = [u for u in found if "/msa.py" in u.where or "/mla_module.py" in u.where]
    labels = {u.label for u in uses if not u.attribute}
    assert (
        labels
        >= {
            "tensorrt_llm._torch.model_config.ModelConfig",
            "tensorrt_llm.llmapi.llm_args.MiniMaxM3SparseAttentionConfig",
            "tensorrt_llm._torch.models.modeling_minimaxm3.MiniMaxM3DecoderLayer",
        }
        | WORLD_SYMBOLS
    )
    assert not any("msa_backend" in label or "minimax_m3" in label for label in labels)
    keywords = {kw for u in uses if u.label.endswith("ModelConfig") for kw in u.keywords}
    assert {"pretrained_config", "sparse_attention_config", "skip_create_weights_in_init", "max_seq_len"} <= keywords
    assert check(uses, Release(TREE)) == []
