"""The TensorRT-LLM DSA module runner (backends/trtllm/dsa.py, dsa_inputs.py) against a stand-in tensorrt_llm up to
the kernel call: the stand-in ModelConfig, decoder layer, DSA attention, cache manager and metadata record what the
runner hands them, with the behaviour the reference collector relies on at rc20 (the decoder layer builds the DSA
attention for model_type deepseek_v32, the sparse config picks the cache manager, the metadata takes the lowered
sparse_metadata_params and the indexer). Checked: the config fields are the checkpoints', the module, cache, batch and
inputs are what serving builds for layer 0, the label is the reference's static default, the refusals come before any
import, the source assumptions are read from the installed package, and TensorRT-LLM's DSA ops are planned."""

from __future__ import annotations

import gc
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import ROOT, cases_of
from fake_trtllm import WORLD_SYMBOLS, Linear, TrtllmWorld, fake_fixture, installed, package_tree

from opcollect.backends import kernels as kt
from opcollect.backends.trtllm import dsa, mla_inputs, torch_ops
from opcollect.backends.trtllm import dsa_inputs as inputs
from opcollect.backends.trtllm.context import SERVED_VERSIONS, release_pending
from opcollect.plans.dsa import DIMS, DsaModuleCase
from opcollect.plans.planner import PlanOptions
from opcollect.runtime.contract import KernelLimit

torch = pytest.importorskip("torch")

CONFIGS = Path(__file__).parent / "data" / "sparse_configs"
TREE = Path(__file__).parent / "data" / "trtllm-release"
V32, GLM = "DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM"
MODEL = {V32: "deepseek-ai/DeepSeek-V3.2", GLM: "zai-org/GLM-5"}
OPS = ("dsa_context_module", "dsa_generation_module")


def case(arch=V32, heads=32, batch=2, isl=100, step=128, kv="bfloat16", gemm="bfloat16", op="dsa_context_module"):
    return DsaModuleCase(op, MODEL[arch], arch, "bfloat16", kv, gemm, heads, batch, isl, 1, step)


def gen(arch=V32, heads=32, batch=3, step=4096, **kw):
    return case(arch, heads, batch, 1, step, op="dsa_generation_module", **kw)


class FakeTrtllm(TrtllmWorld):
    """tensorrt_llm's DeepSeek modules the runner imports, recording what it hands them."""

    def __init__(self, capability=(9, 0), new_signature=True, sparse_fields=("indexer_rope_interleave",)):
        super().__init__(capability)
        self.new_signature, self.sparse_fields = new_signature, sparse_fields
        self.dense = False  # build the dense DeepseekV3Attention whatever the model type

    def install(self, monkeypatch) -> None:
        fake = self

        class SparseConfig:
            model_fields = dict.fromkeys(("index_n_heads", "index_head_dim", "index_topk", *fake.sparse_fields))

            def __init__(self, **kw):
                self.kw = kw

            def to_sparse_metadata_params(self, pretrained_config=None):
                return SimpleNamespace(config=self, pretrained=pretrained_config)

        class ModelConfig(self.model_config_class()):
            @property
            def enable_flash_mla(self):  # model_config.py: TRTLLM, a 576-wide latent, SM90
                p = self.pretrained_config
                return p.kv_lora_rank + p.qk_rope_head_dim == 576 and fake.capability == (9, 0)

        class Metadata:
            def __init__(self, **kw):
                self.kw, self.indexer = kw, None
                fake.metadata.append(self)

            def prepare(self):
                fake.events.append(("prepare", self.indexer))

        class TrtllmAttention(torch.nn.Module):
            pass

        class DSATrtllmAttention(TrtllmAttention):  # sparse/dsa.py: the DSA backend holds the Indexer
            def __init__(self):
                super().__init__()
                self.indexer = Indexer()

        DSATrtllmAttention.Metadata = TrtllmAttention.Metadata = Metadata

        class Indexer(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.weights_proj = torch.nn.Parameter(torch.zeros(4, 8), requires_grad=False)

        class MLA(torch.nn.Module):
            def __init__(self, config, sparse):
                super().__init__()
                p, quant = config.pretrained_config, config.quant_config
                h = p.num_attention_heads
                self.kv_b_proj = Linear(h * (p.qk_nope_head_dim + p.v_head_dim), p.kv_lora_rank, quant)
                self.o_proj = Linear(p.hidden_size, h * p.v_head_dim, quant)
                self.mqa = DSATrtllmAttention() if sparse else TrtllmAttention()
                config.extra_attrs.setdefault("mla_layers", {})[0] = self

            def post_load_weights(self):
                fake.events.append(("post_load", float(self.kv_b_proj.weight.float().abs().sum())))

            def forward(self, position_ids, hidden_states, attn_metadata):
                fake.forward(position_ids, hidden_states, attn_metadata)

        class DeepseekV32Attention(MLA):
            def __init__(self, config):
                super().__init__(config, sparse=True)
                self.indexer = self.mqa.indexer

        class DeepseekV3Attention(MLA):
            def __init__(self, config):
                super().__init__(config, sparse=False)

        class DeepseekV3DecoderLayer(torch.nn.Module):
            def __init__(self, model_config, layer_idx, aux_stream_dict):
                super().__init__()
                v32 = model_config.pretrained_config.model_type == "deepseek_v32" and not fake.dense
                self.self_attn = (DeepseekV32Attention if v32 else DeepseekV3Attention)(model_config)
                fake.built(layer_idx, aux_stream_dict, self.self_attn)

        class Manager(self.manager_class()):
            def add_dummy_requests(self, ids, token_nums=None):
                return self.added(ids, token_nums)

        manager_cls = self.manager_cls_of(Manager)
        if not self.new_signature:

            def manager_cls(model_config):
                fake.events.append(("manager_cls", model_config, None))
                return Manager

        self.install_world(monkeypatch, {
            "tensorrt_llm._torch.model_config": {"ModelConfig": ModelConfig,
                                                 "DeepSeekSparseAttentionConfig": SparseConfig},
            "tensorrt_llm._torch.models.modeling_deepseekv3": {"DeepseekV3DecoderLayer": DeepseekV3DecoderLayer},
        }, manager_cls, "SELFKONLY", ("FP8", "BF16"))  # fmt: skip


fake = fake_fixture(FakeTrtllm)


def config_json(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}_config.json").read_text())


def test_the_config_fields_are_the_checkpoints():
    """DeepSeek-V3.2's fields are its config.json's; GLM-5's are GLM-5.2-FP8's (the shipped file here: the same
    attention, indexer and dense-layer geometry) but for max_position_embeddings (GLM-5's profile) and rope_theta
    (GLM-5's 1e6, aiconfigurator_core/model_configs/zai-org--GLM-5_config.json)."""
    v32, glm = config_json("deepseek-ai--DeepSeek-V3.2"), config_json("zai-org--GLM-5.2-FP8")
    for arch, source in ((V32, v32), (GLM, glm)):
        keys = inputs.MODELS[arch]
        shared = set(keys) - {"max_position_embeddings", "rope_theta", "rope_scaling"}
        assert {k: keys[k] for k in shared} == {k: source[k] for k in shared}, arch
        d = DIMS[arch]  # the planner's dimensions agree
        assert d == (keys["hidden_size"], keys["q_lora_rank"], keys["qk_nope_head_dim"], keys["qk_rope_head_dim"],
                     keys["v_head_dim"], keys["index_n_heads"], keys["index_head_dim"], keys["index_topk"])  # fmt: skip
    assert {k: inputs.MODELS[V32][k] for k in ("max_position_embeddings", "rope_theta", "rope_scaling")} == {
        k: v32[k] for k in ("max_position_embeddings", "rope_theta", "rope_scaling")
    }
    assert glm["rope_parameters"]["rope_type"] == "default" and inputs.MODELS[GLM]["rope_scaling"] is None
    profile = yaml.safe_load((ROOT / "cases" / "models" / f"{GLM}.yaml").read_text())
    [glm5] = [m for m in profile["models"] if m["name"] == "GLM-5"]
    assert inputs.MODELS[GLM]["max_position_embeddings"] == glm5["config"]["max_position_embeddings"]
    assert inputs.model_keys(V32)["rope_scaling"] is not inputs.MODELS[V32]["rope_scaling"]  # a fresh copy


@pytest.mark.parametrize("arch", [V32, GLM])
def test_builds_layer_0s_dsa_attention_as_the_collector_does(fake, arch):
    prepared = dsa.prepare(case(arch, heads=16), "default", "cpu", 1, context=True)
    assert prepared.kernel_source == "default"  # the reference's static label (AIC collect_mla_module.py:974)
    assert ("checked", "dsa_context_module") in fake.events  # the source assumptions, before any import
    (config,) = fake.model_configs
    keys, p = inputs.MODELS[arch], config.pretrained_config
    # every architecture as the served DSA type, one layer, the rank's heads, bf16 (AIC :534-541)
    assert (p.model_type, p.architectures, p.num_hidden_layers) == ("deepseek_v32", ["DeepseekV32ForCausalLM"], 1)
    assert (p.num_attention_heads, p.num_key_value_heads, p.torch_dtype) == (16, 16, torch.bfloat16)
    for k in ("hidden_size", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "v_head_dim", "first_k_dense_replace"):
        assert getattr(p, k) == keys[k]
    assert not hasattr(p, "indexer_rope_interleave")  # the sparse config's, not the pretrained one's
    sparse = config.sparse_attention_config.kw
    assert (sparse["index_n_heads"], sparse["index_head_dim"], sparse["index_topk"]) == (
        keys["index_n_heads"], 128, 2048
    )  # fmt: skip
    assert sparse.get("indexer_rope_interleave", False) == (arch == GLM)
    assert (config.attn_backend, config.skip_create_weights_in_init) == ("TRTLLM", True)
    assert config.max_seq_len == keys["max_position_embeddings"]  # serving's, not the case's
    assert config.max_num_tokens == 131072 and config.quant_config.quant_algo is None
    (layer,) = fake.layers
    assert layer.layer_idx == 0 and set(layer.streams) == {"attention", "moe_shared", "moe_chunking"}
    module = layer.module
    assert type(module).__name__ == "DeepseekV32Attention" and module.indexer is module.mqa.indexer
    # weights created, drawn as the dummy loader draws them, then post-processed
    [(kind, filled)] = [e for e in fake.events if e[0] == "post_load"]
    assert filled > 0 and module.kv_b_proj.weight.abs().max() <= 1.1e-3


def test_an_older_sparse_config_is_given_only_the_fields_it_has(monkeypatch):
    older = installed(FakeTrtllm, monkeypatch, sparse_fields=())
    dsa.prepare(case(GLM), "default", "cpu", 1, context=True)
    assert "indexer_rope_interleave" not in older.model_configs[0].sparse_attention_config.kw
    release_pending()


def test_fp8_block_leaves_kv_b_proj_unquantized_before_its_weights_exist(fake):
    dsa.prepare(case(gemm="fp8_block"), "default", "cpu", 1, context=True)
    (config,) = fake.model_configs
    assert config.quant_config.quant_algo == "FP8_BLOCK_SCALES"
    assert config.quant_config.exclude_modules == ["*kv_b_proj*", "*k_b_proj*", "*eh_proj"]
    module = fake.layers[0].module
    assert module.kv_b_proj.quant_config.quant_algo is None  # only the KV cache algorithm (AIC :558-582)
    assert module.kv_b_proj.weight.dtype == torch.bfloat16 and module.o_proj.weight.dtype == torch.float8_e4m3fn


def test_a_prefill_after_a_cached_prefix_has_the_collectors_cache_and_metadata(fake):
    c = case(heads=32, batch=2, isl=100, step=128)
    prepared = dsa.prepare(c, "default", "cpu", 2, context=True)
    (manager,) = fake.managers
    (_, config, cache_config) = next(e for e in fake.events if e[0] == "manager_cls")
    assert config is fake.model_configs[0] and cache_config is manager.cache_config
    kv = inputs.layout(c, 64, copies=2)  # pages of 64 where FlashMLA runs (SM90)
    assert vars(manager.cache_config) == {"max_tokens": kv.max_tokens, "enable_block_reuse": False}
    assert manager.cache_type == "SELFKONLY"
    kw = manager.kw
    assert (kw["num_layers"], kw["num_kv_heads"], kw["head_dim"], kw["tokens_per_block"]) == (1, 1, 576, 64)
    assert (kw["max_batch_size"], kw["dtype"], kw["layer_mask"]) == (4, "BF16", [True])
    assert kw["max_seq_len"] == 163840 and kw["model_config"] is config
    assert kw["sparse_attention_config"] is config.sparse_attention_config
    assert kw["pretrained_config"] is config.pretrained_config
    assert manager.requests == ([0, 1, 2, 3], [228] * 4)  # every sequence's prefix and new tokens
    first, second = fake.metadata
    m = first.kw
    assert (m["max_num_requests"], m["max_num_tokens"], m["num_contexts"]) == (2, 200, 2)
    assert m["seq_lens"].tolist() == [100, 100] and m["prompt_lens"] == [100, 100]  # the new tokens only
    assert m["kv_cache_params"].num_cached_tokens_per_seq == [128, 128] and m["kv_cache_params"].use_cache
    assert m["enable_context_mla_with_cached_kv"] and m["runtime_features"].cache_reuse
    assert not m["runtime_features"].chunked_prefill and m["enable_flash_mla"]
    assert m["sparse_metadata_params"].config is config.sparse_attention_config
    assert m["sparse_metadata_params"].pretrained is config.pretrained_config
    assert m["kv_cache_manager"] is manager and (m["request_ids"], second.kw["request_ids"]) == ([0, 1], [2, 3])
    indexer = fake.layers[0].module.indexer
    assert [e for e in fake.events if e == "sync" or e[0] == "prepare"] == [("prepare", indexer), "sync"] * 2
    prepared.call()
    prepared.call()
    (pos1, hidden1, md1, reg1), (pos2, hidden2, md2, reg2) = fake.forwards
    assert (md1, reg1, md2, reg2) == (second, second, first, first)  # copies rotate, each registered
    assert pos1.tolist() == list(range(128, 228)) * 2 and pos1.dtype == torch.long
    assert tuple(hidden1.shape) == (200, 7168) and hidden1.dtype == torch.bfloat16 and not torch.equal(hidden1, hidden2)
    assert "shutdown" not in fake.events
    del prepared
    gc.collect()
    assert fake.events.count("shutdown") == 1  # the pools go with the case


def test_a_decode_step_appends_one_token_to_step_cached_ones(fake):
    fake.capability = (10, 0)
    c = gen(GLM, heads=8, batch=3, step=4096, kv="fp8", gemm="nvfp4")
    dsa.prepare(c, "default", "cpu", 1, context=False)
    (manager,) = fake.managers
    assert manager.kw["tokens_per_block"] == 32 and manager.kw["dtype"] == "FP8"  # trtllm-gen's pages off SM90
    assert manager.kw["max_seq_len"] == 202752 and manager.requests == ([0, 1, 2], [4097] * 3)
    (m,) = [md.kw for md in fake.metadata]
    assert (m["num_contexts"], m["seq_lens"].tolist(), m["prompt_lens"]) == (0, [1, 1, 1], [4096] * 3)
    assert m["kv_cache_params"].num_cached_tokens_per_seq == [4096] * 3
    assert not m["enable_context_mla_with_cached_kv"] and not m["runtime_features"].cache_reuse
    assert not m["enable_flash_mla"]


def test_a_prefill_without_a_prefix_takes_no_cache_reuse(fake):
    dsa.prepare(case(step=0), "default", "cpu", 1, context=True)
    (m,) = [md.kw for md in fake.metadata]
    assert not m["enable_context_mla_with_cached_kv"] and not m["runtime_features"].cache_reuse


def test_the_older_manager_lookup_takes_the_model_config_alone(monkeypatch):
    older = installed(FakeTrtllm, monkeypatch, new_signature=False)
    dsa.prepare(case(), "default", "cpu", 1, context=True)
    assert [e[2] for e in older.events if e[0] == "manager_cls"] == [None] and len(older.managers) == 1
    release_pending()


def test_a_full_pool_or_a_failed_metadata_shuts_the_manager_down(fake, monkeypatch):
    fake.events.append("full")
    with pytest.raises(RuntimeError, match="took none"):
        dsa.prepare(case(), "default", "cpu", 1, context=True)
    assert fake.events.count("shutdown") == 1
    monkeypatch.setattr(dsa, "attention_metadata", lambda *a: 1 / 0)
    fake.events.remove("full")
    with pytest.raises(ZeroDivisionError):
        dsa.prepare(case(), "default", "cpu", 1, context=True)
    assert fake.events.count("shutdown") == 2


def test_a_module_without_an_indexer_is_no_dsa_row(fake):
    fake.dense = True
    with pytest.raises(RuntimeError, match="not an MLA with a DSA indexer"):
        dsa.prepare(case(), "default", "cpu", 1, context=True)
    assert inputs.module_label(["DeepseekV32Attention", "MLA"], ["DSATrtllmAttention", "TrtllmAttention"], True) == (
        "default"
    )
    assert inputs.module_label(["X", "MLA"], ["FlashInferDSA", "AttentionBackend"], True) == "FlashInferDSA"


def test_refusals_come_before_any_framework_import():
    import sys

    for bad in (
        case(op="dsa_context_module_skip_indexer"),  # SGLang's indexer-skipping layers
        case()._replace(mla_dtype="fp8"),
        case(kv="int8"),
        case(gemm="int4_wo"),
        case()._replace(architecture="DeepseekV3ForCausalLM"),
    ):
        with pytest.raises(KernelLimit):
            dsa.prepare(bad, "default", "cpu", 1, True)
    assert not any(name.split(".")[0] == "tensorrt_llm" for name in sys.modules)


@pytest.mark.parametrize(
    ("capability", "c", "refused"),
    [
        ((8, 9), case(), "below SM90"),
        ((12, 0), case(), "SM120"),
        ((9, 0), case(kv="fp8"), "fp8 cache from SM100"),
        ((9, 0), gen(gemm="nvfp4"), "nvfp4"),
        ((10, 0), case(kv="fp8", gemm="nvfp4"), None),
        ((10, 3), gen(heads=1), None),  # trtllm-gen's h < 8 failure is recorded, not refused (AIC :19-48)
    ],
)
def test_device_refusals(capability, c, refused):
    if refused is None:
        inputs.check_capability(c, capability)
    else:
        with pytest.raises(KernelLimit, match=refused):
            inputs.check_capability(c, capability)


def test_footprint_by_hand():
    keys = inputs.MODELS[V32]
    fused = 7168 * (1536 + 576 + 128)
    projections = fused + 1536 * 16 * 192 + 512 * 16 * 256 + 16 * 128 * 7168 + 1536 * 64 * 128
    fp32, absorb = 2 * 4 * 7168 * (128 + 64), 2 * 16 * 512 * 256
    assert inputs.weight_bytes(keys, 16, "bfloat16") == 2 * projections + fp32 + absorb
    fp8 = (projections - 512 * 16 * 256) * (1 + 4 / 128**2) + 2 * 512 * 16 * 256  # kv_b_proj stays bf16
    assert inputs.weight_bytes(keys, 16, "fp8_block") == math.ceil(fp8) + fp32 + absorb
    assert inputs.cache_bytes_per_token(keys, "bfloat16") == 2 * 576 + 132
    assert inputs.cache_bytes_per_token(keys, "fp8") == 576 + 132
    # a short prefill skips the indexer; a long one's logits are a chunk of 32768 queries by its requests' keys
    assert inputs.logits_bytes(case(batch=4, isl=1024, step=0), True, 0) == 0
    assert inputs.logits_bytes(case(batch=64, isl=2048, step=128), True, 0) == 32768 * 16 * 2176 * 4
    assert inputs.logits_bytes(case(batch=1, isl=32768, step=128), True, 0) == 32768 * 32896 * 4
    assert inputs.logits_bytes(gen(batch=8), False, 163840) == 8 * 163840 * 4  # serving's max_seq_len wide
    base = inputs.footprint(case(heads=16, batch=2, isl=1024), True)
    assert inputs.footprint(case(heads=64, batch=2, isl=1024), True) > base
    assert inputs.footprint(case(heads=16, batch=8, isl=1024), True) > base
    assert inputs.footprint(case(heads=16, batch=2, isl=1024, gemm="fp8_block"), True) < base
    assert inputs.footprint(gen(step=65536), False) > inputs.footprint(gen(step=1024), False)
    assert inputs.footprint(case()._replace(architecture="DeepseekV3ForCausalLM"), True) == 0  # refused later


LAYER = "class DeepseekV3DecoderLayer:\n    def __init__(self, c):\n        if c.model_type == 'deepseek_v32': pass\n"
UTIL = (
    "def get_kv_cache_manager_cls(model_config, kv_cache_config):\n"
    "    if model_config.sparse_attention_config is not None:\n"
    "        return get_sparse_attn_kv_cache_manager(model_config.sparse_attention_config)\n"
)
MANAGER = (
    "class DSACacheManager:\n"
    "    def __init__(self, c, *, sparse_attention_config=None, pretrained_config=None):\n"
    "        pass\n"
)
METADATA = "class DSAtrtllmAttentionMetadata:\n    sparse_metadata_params = None\n    indexer = None\n"


@pytest.mark.parametrize("split", [False, True])  # one sparse/dsa.py (rc20's reading), or the later package
def test_the_source_assumptions_hold_in_either_layout_and_name_what_broke(tmp_path, split):
    sparse = "_torch/attention_backend/sparse/"
    dsa_files = (
        {sparse + "dsa/cache_manager.py": MANAGER, sparse + "dsa/metadata.py": METADATA}
        if split
        else {sparse + "dsa.py": MANAGER + METADATA}
    )
    good = {"_torch/models/modeling_deepseekv3.py": LAYER, "_torch/pyexecutor/_util.py": UTIL, **dsa_files}
    root = package_tree(tmp_path / "good", good)
    for op in OPS:
        assert torch_ops.problems(root, op) == []
        torch_ops.check_installed(op, root)
    renamed = {**good, **{k: v.replace("sparse_attention_config=None", "sparse_attn_config=None")
                          for k, v in dsa_files.items()}}  # fmt: skip
    (line,) = torch_ops.problems(package_tree(tmp_path / "renamed", renamed), "dsa_generation_module")
    assert "DSACacheManager.__init__ no longer uses sparse_attention_config" in line
    dense = {**good, "_torch/models/modeling_deepseekv3.py": LAYER.replace("deepseek_v32", "deepseek_v3")}
    with pytest.raises(KernelLimit, match="DeepseekV3DecoderLayer no longer uses deepseek_v32"):
        torch_ops.check_installed("dsa_context_module", package_tree(tmp_path / "dense", dense))


def test_registered_for_both_pins_with_the_footprint_of_the_phase():
    from opcollect.backends import trtllm

    assert set(dsa.RUNNERS) == set(OPS)
    for version in SERVED_VERSIONS:
        for op, context in zip(OPS, (True, False)):
            runner = trtllm.RUNNERS.find(op, "default", version)
            c = case() if context else gen()
            assert runner.footprint(c) == inputs.footprint(c, context)


def test_the_label_names_the_dsa_kernels():
    sparse = "void sm90::fwd::sparse_attn_fwd_kernel<sm90::fwd::KernelTemplate<576, false>, TmaParams<..>>"
    logits = "void deep_gemm::sm90_fp8_mqa_logits<128u, 64u, 4u>"
    for op in OPS:
        assert not kt.contradicts_label("trtllm", "default", ["nvjet_tst_128x64", sparse], op)
        assert not kt.contradicts_label("trtllm", "default", [logits], op)
        assert kt.contradicts_label("trtllm", "default", ["nvjet_tst_128x64", "fp8_blockscale_gemm"], op)
    # the MLA ops keep their meaning: FlashMLA's dense decode, not the sparse kernel
    assert not kt.contradicts_label("trtllm", "default", ["sm90::flash_fwd_splitkv_mla_kernel"], "mla_generation")
    assert kt.contradicts_label("trtllm", "default", [sparse], "mla_generation_module")


@pytest.mark.parametrize("sm", ["90", "100"])
def test_trtllms_dsa_ops_are_planned_and_every_case_passes_the_builders(planner, sm):
    plan = planner.plan("trtllm", sm, PlanOptions(ops=OPS))
    capability = (9, 0) if sm == "90" else (10, 0)
    for op, context in zip(OPS, (True, False)):
        selection = plan.ops[op]
        assert selection.values and set(selection.dispatch) == {"default"}
        seen = set()
        for c in cases_of(selection):
            inputs.check_case(c)
            inputs.check_capability(c, capability)
            kv = inputs.layout(c, mla_inputs.page_size(capability))
            assert kv.num_tokens == c.batch_size * c.isl and inputs.max_seq_len(c, kv) >= kv.max_seq_len
            assert inputs.footprint(c, context) > kv.max_tokens * inputs.cache_bytes_per_token(
                inputs.MODELS[c.architecture], c.kv_cache_dtype
            )
            seen.add((c.architecture, c.kv_cache_dtype, c.gemm_type))
        kvs = {"bfloat16"} if sm == "90" else {"bfloat16", "fp8"}
        gemms = {"bfloat16", "fp8_block"} | ({"nvfp4"} if sm == "100" else set())
        assert seen == {(a, k, g) for a in (V32, GLM) for k in kvs for g in gemms}


def test_the_contract_check_covers_every_symbol_the_runner_imports():
    """`opcollect contract trtllm` and the run's preflight read the runner's imports (backends/symbols.py): every one
    dsa.py makes, and the module-build helpers it calls in mla_module.py, is among them, with the keywords of the
    calls the check can follow, and resolves in the tree."""
    from opcollect.backends.symbols import Release, check, runner_uses

    found = runner_uses(ROOT / "src" / "opcollect" / "backends" / "trtllm", ("tensorrt_llm",), ROOT)
    uses = [u for u in found if "/dsa.py" in u.where or "/mla_module.py" in u.where]
    assert {u.label for u in uses if not u.attribute} >= {
        "tensorrt_llm._torch.model_config.ModelConfig",
        "tensorrt_llm._torch.model_config.DeepSeekSparseAttentionConfig",
        "tensorrt_llm._torch.models.modeling_deepseekv3.DeepseekV3DecoderLayer",
    } | WORLD_SYMBOLS
    keywords = {kw for u in uses if u.label.endswith("ModelConfig") for kw in u.keywords}
    assert {"pretrained_config", "sparse_attention_config", "skip_create_weights_in_init", "max_seq_len"} <= keywords
    assert check(uses, Release(TREE)) == []
