"""The vLLM DSA module runner (backends/vllm/dsa.py) against a stand-in vllm up to the kernel call: the stand-in module,
layers, backends and metadata builders read and register what vLLM 0.24.0's do at the cited lines and record what
the runner hands them. Checked: the config carries the model's DSA keys (held to the config.json files the consumer
ships, tests/data/sparse_configs), the module built is DeepseekV2MLAAttention as serving builds layer 0, the caches,
batch and inputs have vLLM's shapes and byte layouts, and the label is the backend vLLM chose (FLASHMLA_SPARSE at
SM90). Where the pinned wheel is at hand (.cache/wheels), the config keys vLLM's module reads are read from it."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import ROOT
from fake_frameworks import VllmWorld

from opcollect.backends import kernels as kt
from opcollect.backends.vllm import dsa
from opcollect.backends.vllm import dsa_inputs as inputs
from opcollect.plans.dsa import DIMS, DsaModuleCase
from opcollect.plans.planner import PlanOptions
from opcollect.runtime.contract import KernelLimit

torch = pytest.importorskip("torch")

CONFIGS = Path(__file__).parent / "data" / "sparse_configs"
WHEELS = ROOT / ".cache" / "wheels"
V32, GLM = "DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM"
MODEL = {V32: "deepseek-ai/DeepSeek-V3.2", GLM: "zai-org/GLM-5"}


def case(arch=V32, heads=32, batch=2, isl=100, step=128, kv="bfloat16", gemm="bfloat16", op="dsa_context_module"):
    return DsaModuleCase(op, MODEL[arch], arch, "bfloat16", kv, gemm, heads, batch, isl, 1, step)


class Backend:
    """An MLA backend's class methods the runner calls (v1/attention/backend.py:175-202)."""

    def __init__(self, name, sizes, shape, builder):
        self.name, self.sizes, self.shape, self.builder = name, sizes, shape, builder

    def get_name(self):
        return self.name

    def supports_block_size(self, block_size):
        return block_size in self.sizes

    def get_kv_cache_shape(self, num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        assert num_kv_heads == 1
        return self.shape(num_blocks, block_size, head_size, cache_dtype_str)

    def get_builder_cls(self):
        return self.builder


class FakeVllm(VllmWorld):
    def __init__(self, capability=90):
        self.capability = capability
        super().__init__(use_prefill_query_quantization=False, mla_prefill_backend=None)
        self.events: list = []  # workspace resets and inits, module constructions, in order
        self.manager = None
        self.modules: list = []
        self.builders: list = []  # (backend name, spec, layer names, what the builder read)
        self.calls: list = []

    # --- the sparse MLA backends (platforms/cuda.py:93-142) and the indexer's (mla/indexer.py) ---
    def backend(self, kv_cache_dtype, num_heads):
        fp8 = kv_cache_dtype.startswith("fp8")
        if self.capability // 10 == 10 and (fp8 or num_heads <= 16):
            return Backend("FLASHINFER_MLA_SPARSE", (32, 64), lambda n, b, h, d: (n, b, h), self.builder("FI"))
        # flashmla_sparse.py:99-101, 133-145
        shape = lambda n, b, h, d: (n, b, 656) if d == "fp8_ds_mla" else (n, b, h)  # noqa: E731
        return Backend("FLASHMLA_SPARSE", (64,), shape, self.builder("FLASHMLA_SPARSE"))

    def builder(self, kind):
        fake = self

        class Builder:
            def __init__(self, spec, names, config, device):
                model = config.model_config
                # FlashMLASparseMetadataBuilder.__init__ (flashmla_sparse.py:253-263, 273, 296-300) and
                # DeepseekV32IndexerMetadataBuilder.__init__ (indexer.py:252-322) read these
                self.read = dict(
                    heads=model.get_num_attention_heads(config.parallel_config),
                    topk=model.hf_config.index_topk,
                    fp8=config.cache_config.cache_dtype == "fp8_ds_mla",
                    max_model_len=model.max_model_len,
                    max_tokens=config.scheduler_config.max_num_batched_tokens,
                    device=device,
                )
                fake.builders.append((kind, spec, names, self.read))

            def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
                return SimpleNamespace(kind=kind, common=common_attn_metadata, prefix_len=common_prefix_len)

        return Builder

    def install(self, monkeypatch) -> None:
        fake = self

        class MLAAttention(torch.nn.Module):
            def __init__(self, num_heads, cache_config, prefix, use_sparse):
                super().__init__()
                dtype = torch.get_default_dtype()  # mla_attention.py:396: the selector takes bf16 only
                assert dtype == torch.bfloat16 and use_sparse
                self.attn_backend = fake.backend(cache_config.cache_dtype, num_heads)
                # mla_attention.py:323-336, 413-423: FLASHMLA_SPARSE's fp8 cache is fp8_ds_mla, written back
                if self.attn_backend.name == "FLASHMLA_SPARSE" and cache_config.cache_dtype.startswith("fp8"):
                    cache_config.cache_dtype = "fp8_ds_mla"
                self.kv_cache_dtype, self.processed, self.kv_cache = cache_config.cache_dtype, None, torch.tensor([])
                assert fake.manager is not None  # FlashMLASparseImpl.__init__ takes workspace (:584-608)
                fake.current.compilation_config.static_forward_context[prefix] = self  # mla_attention.py:505-509

            def process_weights_after_loading(self, act_dtype):
                self.processed = act_dtype

            def get_kv_cache_spec(self, config):  # mla_attention.py:1000-1010
                fp8 = self.kv_cache_dtype.startswith("fp8")
                return SimpleNamespace(block_size=config.cache_config.block_size, head_size=576,
                                       dtype=torch.uint8 if fp8 else config.model_config.dtype,
                                       cache_dtype_str=config.cache_config.cache_dtype)  # fmt: skip

        indexer_backend = Backend("DEEPSEEK_V32_INDEXER", (64,), lambda n, b, h, d: (n, b, h), self.builder("IDX"))

        class IndexerCache:  # DeepseekV32IndexerCache (deepseek_v2.py:574-600)
            def __init__(self, head_dim, cache_config, prefix):
                self.head_dim, self.cache_config, self.kv_cache = head_dim, cache_config, torch.tensor([])
                fake.current.compilation_config.static_forward_context[prefix] = self

            def get_kv_cache_spec(self, config):
                return SimpleNamespace(block_size=self.cache_config.block_size, head_size=self.head_dim,
                                       dtype=torch.uint8, cache_dtype_str=None)  # fmt: skip

            def get_attn_backend(self):
                return indexer_backend

        class DeepseekV2MLAAttention(torch.nn.Module):  # deepseek_v2.py:887-1093
            def __init__(self, vllm_config, config, hidden_size, num_heads, qk_nope_head_dim, qk_rope_head_dim,
                         v_head_dim, q_lora_rank, kv_lora_rank, max_position_embeddings=8192, cache_config=None,
                         quant_config=None, prefix="", topk_indices_buffer=None, input_size=None):  # fmt: skip
                super().__init__()
                self.args = dict(locals())
                self.default_dtype = torch.get_default_dtype()
                fake.events.append("module")
                self.kv_a_layernorm = torch.nn.Module()
                self.kv_a_layernorm.weight = torch.nn.Parameter(torch.empty(kv_lora_rank), requires_grad=False)
                if config.rope_parameters["rope_type"] != "default":  # :976-981
                    config.rope_parameters["rope_type"] = "deepseek_yarn"
                layer = int(prefix.split(".")[2])  # extract_layer_index
                offset, freq = getattr(config, "index_skip_topk_offset", 2), getattr(config, "index_topk_freq", 1)
                skip = max(layer - offset + 1, 0) % freq != 0  # :1003-1015
                self.indexer = None
                if hasattr(config, "index_topk") and not skip:  # :999, :1029-1046; Indexer :603-676
                    self.indexer = SimpleNamespace(
                        topk=config.index_topk, heads=config.index_n_heads, dim=config.index_head_dim,
                        rope_dim=config.qk_rope_head_dim, neox=not getattr(config, "indexer_rope_interleave", False),
                        buffer=topk_indices_buffer, max_model_len=vllm_config.model_config.max_model_len,
                        cache=IndexerCache(config.index_head_dim + config.index_head_dim // 128 * 4, cache_config,
                                           f"{prefix}.indexer.k_cache"),
                    )  # fmt: skip
                self.mla_attn = MLAAttention(num_heads, cache_config, f"{prefix}.attn", hasattr(config, "index_topk"))
                fake.modules.append(self)

            def forward(self, positions, hidden_states, llama_4_scaling):
                fake.calls.append(dict(positions=positions, hidden=hidden_states, forward=fake.forward,
                                       config=fake.current, kv=self.mla_attn.kv_cache,
                                       index_kv=self.indexer.cache.kv_cache, scaling=llama_4_scaling))  # fmt: skip
                return hidden_states.new_empty(hidden_states.shape[0], self.args["hidden_size"])

        def init_manager(device, num_ubatches=None):
            fake.manager = device
            fake.events.append(("init", device))

        def reset_manager():
            fake.manager = None
            fake.events.append("reset")

        self.install_world(
            monkeypatch,
            {
                "vllm.v1.worker.workspace": {
                    "init_workspace_manager": init_manager,
                    "reset_workspace_manager": reset_manager,
                },
                "vllm.model_executor.models.deepseek_v2": {"DeepseekV2MLAAttention": DeepseekV2MLAAttention},
                "vllm.model_executor.layers.attention": {"MLAAttention": MLAAttention},
                "vllm.model_executor.layers.attention.mla_attention": {
                    "backend_supports_prefill_query_quantization": SimpleNamespace(cache_clear=lambda: None)
                },
                "vllm.model_executor.layers.quantization.base_config": {
                    "QuantizeMethodBase": type("QuantizeMethodBase", (), {})
                },
                "vllm.model_executor.layers.quantization.fp8": {"Fp8Config": lambda **kw: SimpleNamespace(**kw)},
                "vllm.platforms": {"current_platform": SimpleNamespace(fp8_dtype=lambda: torch.float8_e4m3fn)},
            },
        )


@pytest.fixture
def fake(monkeypatch):
    vllm = FakeVllm()
    vllm.install(monkeypatch)
    return vllm


def config_json(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}_config.json").read_text())


def test_the_config_keys_are_the_checkpoints():
    """DeepSeek-V3.2's keys are its config.json's (rope_scaling as vLLM reads it); GLM-5's attention keys are GLM-5.2's
    (the shipped file here) but for max_position_embeddings (GLM-5's profile) and rope_theta (1e6 in GLM-5's file)."""
    common = ("hidden_size", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
              "rms_norm_eps", "index_topk", "index_n_heads", "index_head_dim", "model_type",
              "num_hidden_layers")  # fmt: skip
    v32, glm = config_json("deepseek-ai--DeepSeek-V3.2"), config_json("zai-org--GLM-5.2-FP8")
    for arch, source in ((V32, v32), (GLM, glm)):
        keys = inputs.MODELS[arch]
        assert {k: keys[k] for k in common} == {k: source[k] for k in common}
        assert keys.get("indexer_rope_interleave", False) == source.get("indexer_rope_interleave", False)
        d = DIMS[arch]  # the planner's dimensions agree
        assert (d.hidden, d.q_lora, d.qk_nope, d.qk_rope, d.v_head) == tuple(
            keys[k] for k in ("hidden_size", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
        )
        assert (d.index_heads, d.index_dim, d.index_topk) == (
            keys["index_n_heads"], keys["index_head_dim"], keys["index_topk"]
        )  # fmt: skip
    rope = {("rope_type" if k == "type" else k): v for k, v in v32["rope_scaling"].items()}
    assert inputs.MODELS[V32]["rope_parameters"] == {**rope, "rope_theta": v32["rope_theta"]}
    assert inputs.MODELS[V32]["max_position_embeddings"] == v32["max_position_embeddings"]
    assert inputs.MODELS[GLM]["rope_parameters"]["rope_type"] == glm["rope_parameters"]["rope_type"] == "default"
    profile = yaml.safe_load((ROOT / "cases" / "models" / f"{GLM}.yaml").read_text())
    [glm5] = [m for m in profile["models"] if m["name"] == "GLM-5"]
    assert inputs.MODELS[GLM]["max_position_embeddings"] == glm5["config"]["max_position_embeddings"]
    assert inputs.model_keys(V32)["rope_parameters"] is not inputs.MODELS[V32]["rope_parameters"]  # a fresh copy


@pytest.mark.parametrize("arch", [V32, GLM])
def test_builds_layer_0_as_serving_does_with_the_models_dsa_keys(fake, arch):
    prepared = dsa.prepare(case(arch, heads=16), "FLASHMLA_SPARSE", "cpu", 1, context=True)
    assert prepared.kernel_source == "FLASHMLA_SPARSE"  # what vLLM chose at SM90 (platforms/cuda.py:135-142)
    (module,) = fake.modules
    args, keys, hf = module.args, inputs.MODELS[arch], module.args["config"]
    assert fake.events == ["reset", ("init", torch.device("cpu")), "module"]  # a fresh workspace before the impl
    assert args["prefix"] == "model.layers.0.self_attn" and args["num_heads"] == 16 and args["quant_config"] is None
    for k in ("hidden_size", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "q_lora_rank", "kv_lora_rank"):
        assert args[k] == keys[k]
    assert args["max_position_embeddings"] == keys["max_position_embeddings"]
    assert args["cache_config"] is args["vllm_config"].cache_config and module.default_dtype == torch.bfloat16
    assert torch.get_default_dtype() == torch.float32  # restored
    # the config the module and the builders read: the model's DSA keys, the rank's heads
    config = args["vllm_config"]
    assert config.model_config.hf_config is hf is config.model_config.hf_text_config
    assert (hf.index_topk, hf.index_n_heads, hf.index_head_dim) == (2048, keys["index_n_heads"], 128)
    assert hf.architectures == [arch] and hf.num_attention_heads == 16 and hf.model_type == keys["model_type"]
    assert config.model_config.max_model_len == keys["max_position_embeddings"]  # serving's, not the case's
    # the Indexer built (layer 0 runs it) with the shared top-k buffer DeepseekV2Model sizes
    idx = module.indexer
    assert (idx.topk, idx.heads, idx.dim, idx.rope_dim) == (2048, keys["index_n_heads"], 128, 64)
    assert idx.neox == (arch == V32)  # GLM-5 interleaves its indexer's rope (indexer_rope_interleave)
    tokens = config.scheduler_config.max_num_batched_tokens
    assert tokens == 8192 and tuple(idx.buffer.shape) == (tokens, 2048) and idx.buffer.dtype == torch.int32
    assert module.mla_attn.processed == torch.bfloat16  # weights post-processed as the loader does
    assert module.kv_a_layernorm.weight.abs().sum() > 0 and torch.isfinite(module.kv_a_layernorm.weight).all()


def test_a_context_batch_has_vllms_caches_metadata_and_inputs(fake):
    c = case(heads=32, batch=2, isl=100, step=128, kv="fp8", gemm="fp8_block")
    prepared = dsa.prepare(c, "FLASHMLA_SPARSE", "cpu", 2, context=True)
    assert prepared.kernel_source == "FLASHMLA_SPARSE"
    (module,) = fake.modules
    assert module.args["quant_config"].weight_block_size == [128, 128]  # DeepSeek-V3.2's block-fp8 checkpoint
    config = module.args["vllm_config"]
    assert config.cache_config.cache_dtype == "fp8_ds_mla" and config.cache_config.block_size == 64
    (k1, spec, names, read), (k2, ispec, inames, iread) = fake.builders
    assert (k1, names, k2, inames) == ("FLASHMLA_SPARSE", [dsa.ATTN], "IDX", [dsa.INDEX_CACHE])
    assert (spec.cache_dtype_str, spec.dtype, ispec.head_size, ispec.dtype) == (
        "fp8_ds_mla",
        torch.uint8,
        132,
        torch.uint8,
    )
    assert read["fp8"] and read["heads"] == 32 and read["topk"] == 2048 and iread["max_model_len"] == 163840
    prepared.call()
    prepared.call()
    first, second = fake.calls
    assert first["kv"] is not second["kv"] and first["hidden"] is not second["hidden"]  # two input sets rotate
    # 228 tokens a sequence: 4 pages each after the null block; serving's table width 2560 for 163840 tokens
    md = first["forward"].attn_metadata
    assert set(md) == {dsa.ATTN, dsa.INDEX_CACHE} and md[dsa.ATTN].common is md[dsa.INDEX_CACHE].common
    cm = md[dsa.ATTN].common
    assert md[dsa.ATTN].prefix_len == 0
    assert (cm.num_reqs, cm.num_actual_tokens, cm.max_query_len, cm.max_seq_len) == (2, 200, 100, 228)
    assert cm.query_start_loc.tolist() == [0, 100, 200] and cm.seq_lens.tolist() == [228, 228]
    table = cm.block_table_tensor
    assert tuple(table.shape) == (2, 2560) and table.dtype == torch.int32
    assert table[:, :4].tolist() == [[1, 2, 3, 4], [5, 6, 7, 8]] and not table[:, 4:].any()
    want = [(1 + 4 * s) * 64 + p for s in range(2) for p in range(128, 228)]
    assert cm.slot_mapping.tolist() == want and cm.slot_mapping.dtype == torch.int64
    assert first["forward"].slot_mapping == {dsa.ATTN: cm.slot_mapping, dsa.INDEX_CACHE: cm.slot_mapping}
    assert first["forward"].num_tokens == 200 and first["scaling"] is None
    assert first["positions"].tolist() == list(range(128, 228)) * 2 and first["positions"].dtype == torch.int64
    assert tuple(first["hidden"].shape) == (200, 7168) and first["hidden"].dtype == torch.bfloat16
    # fp8_ds_mla: 656 bytes a token, fp8 values, four fp32 scales, 64 bf16 rope values (flashmla_sparse.py:65-73)
    kv = first["kv"]
    assert tuple(kv.shape) == (9, 64, 656) and kv.dtype == torch.uint8
    values = kv[..., :512].contiguous().view(torch.float8_e4m3fn).float()
    assert torch.isfinite(values).all() and values.min() >= 0.125 and values.max() <= 1.875
    assert (kv[..., 512:528].contiguous().view(torch.float32) == 1.0).all()
    rope = kv[..., 528:].contiguous().view(torch.bfloat16)
    assert rope.shape[-1] == 64 and rope.abs().max() <= 1 and rope.abs().sum() > 0
    # the indexer's pages: 64 x 128 fp8 key values, then 64 fp32 power-of-two scales (deepseek_v2.py:654-658)
    index = first["index_kv"]
    assert tuple(index.shape) == (9, 64, 132) and index.dtype == torch.uint8
    pages = index.view(9, -1)
    assert torch.isfinite(pages[:, : 64 * 128].contiguous().view(torch.float8_e4m3fn).float()).all()
    assert (pages[:, 64 * 128 :].contiguous().view(torch.float32) == 2.0**-6).all()


def test_a_decode_step_counts_its_token_in_step(fake):
    c = case(GLM, heads=64, batch=3, isl=1, step=100, op="dsa_generation_module")
    dsa.prepare(c, "FLASHMLA_SPARSE", "cpu", 1, False).call()
    (module,) = fake.modules
    config = module.args["vllm_config"]
    assert config.cache_config.cache_dtype == "auto" and config.model_config.max_model_len == 202752
    (call,) = fake.calls
    cm = call["forward"].attn_metadata[dsa.ATTN].common
    assert cm.seq_lens.tolist() == [100] * 3 and cm.query_start_loc.tolist() == [0, 1, 2, 3]
    assert call["positions"].tolist() == [99] * 3  # the new token is the 100th
    assert cm.slot_mapping.tolist() == [(1 + 2 * s) * 64 + 99 for s in range(3)]
    assert tuple(cm.block_table_tensor.shape) == (3, 3168)  # cdiv(202752, 64), already even
    assert tuple(call["kv"].shape) == (7, 64, 576) and call["kv"].dtype == torch.bfloat16  # a bf16 latent
    assert tuple(call["hidden"].shape) == (3, 6144)


@pytest.mark.parametrize(("capability", "kv", "heads", "label"), [
    (90, "fp8", 8, "FLASHMLA_SPARSE"),
    (90, "bfloat16", 128, "FLASHMLA_SPARSE"),
    (100, "fp8", 64, "FLASHINFER_MLA_SPARSE"),
    (100, "bfloat16", 16, "FLASHINFER_MLA_SPARSE"),
    (100, "bfloat16", 32, "FLASHMLA_SPARSE"),
])  # fmt: skip
def test_the_label_is_the_backend_vllm_chose(monkeypatch, capability, kv, heads, label):
    fake = FakeVllm(capability)
    fake.install(monkeypatch)
    prepared = dsa.prepare(case(heads=heads, kv=kv), label, "cpu", 1, True)
    assert prepared.kernel_source == label
    prepared.call()
    latent = fake.calls[0]["kv"]
    # FlashInfer keeps the plain fp8 layout, 576 fp8 values a token; FlashMLA its 656-byte fp8_ds_mla
    width = 656 if (kv, label) == ("fp8", "FLASHMLA_SPARSE") else 576
    assert latent.shape[-1] == width and latent.dtype == (torch.uint8 if kv == "fp8" else torch.bfloat16)


def test_refusals_come_before_any_framework_import():
    for bad in (
        case(op="dsa_context_module_skip_indexer"),  # SGLang's indexer-skipping layers
        case()._replace(mla_dtype="fp8"),
        case(kv="int8"),
        case(gemm="int4_wo"),
        case()._replace(architecture="DeepseekV3ForCausalLM"),
    ):
        with pytest.raises(KernelLimit):
            dsa.prepare(bad, "FLASHMLA_SPARSE", "cpu", 1, True)
    assert "vllm" not in sys.modules


def test_footprint_grows_with_the_case():
    base = dsa.footprint(case(heads=16, batch=2, isl=1024), True)
    assert dsa.footprint(case(heads=64, batch=2, isl=1024), True) > base
    assert dsa.footprint(case(heads=16, batch=8, isl=1024), True) > base
    assert dsa.footprint(case(heads=16, batch=2, isl=1024, gemm="fp8_block"), True) < base
    gen = case(heads=16, batch=64, isl=1, op="dsa_generation_module")
    assert dsa.footprint(gen._replace(step=65536), False) > dsa.footprint(gen._replace(step=1024), False)
    # the caches alone: 9 pages of 64 tokens, 576 bf16 or 656 fp8_ds_mla bytes plus the indexer's 132 a token
    small = case(batch=2, isl=100, step=128)
    assert inputs.dsa_layout(small, True).num_blocks == 9
    assert dsa.footprint(small, True) - dsa.footprint(small._replace(kv_cache_dtype="fp8"), True) < 9 * 64 * 1152
    assert dsa.footprint(case()._replace(architecture="DeepseekV3ForCausalLM"), True) == 0  # prepare refuses it


def test_the_flashmla_sparse_label_names_its_kernels():
    sparse = "void sm90::fwd::sparse_attn_fwd_kernel<sm90::fwd::KernelTemplate<576, false>, TmaParams<..>>"
    fp8 = "void sm90::decode::sparse_fp8::flash_fwd_splitkv_mla_fp8_sparse_kernel<cutlass::bfloat16_t, 64>"
    dense = "void sm90::flash_fwd_splitkv_mla_kernel<Traits<cutlass::bfloat16_t>>"  # the dense FLASHMLA decode
    for op in ("dsa_context_module", "dsa_generation_module"):
        assert not kt.contradicts_label("vllm", "FLASHMLA_SPARSE", ["deep_gemm::fp8_gemm", sparse], op)
        assert not kt.contradicts_label("vllm", "FLASHMLA_SPARSE", [fp8], op)
        assert kt.contradicts_label("vllm", "FLASHMLA_SPARSE", [dense, "nvjet_tst_128x64"], op)


def test_vllms_dsa_ops_are_planned_and_the_other_frameworks_still_wait(planner):
    ops = ("dsa_context_module", "dsa_generation_module")
    for backend in ("vllm", "trtllm"):  # SGLang's labels per case: tests/test_sglang_dsa.py
        plan = planner.plan(backend, "90", PlanOptions(ops=ops))
        held = {op: set(plan.ops[op].dispatch) for op in ops if op in plan.ops and plan.ops[op].values}
        labels = {"vllm": "FLASHMLA_SPARSE", "trtllm": "default"}  # TensorRT-LLM's runner: backends/trtllm/dsa.py
        assert held == ({op: {labels[backend]} for op in ops} if backend in labels else {}), backend


def test_the_contract_check_covers_every_vllm_symbol_the_runner_imports():
    """`opcollect contract vllm` and the run's preflight read the runner's imports (backends/symbols.py): every one
    dsa.py makes is among them, with DeepseekV2MLAAttention's keywords, and resolves in the pinned wheel."""
    from opcollect.backends.symbols import Release, check, runner_uses

    backends = ROOT / "src" / "opcollect" / "backends"
    uses = [u for u in runner_uses(backends / "vllm", ("vllm",), ROOT) if "/vllm/dsa" in u.where]
    assert {u.label for u in uses} == {
        "vllm.config.set_current_vllm_config",
        "vllm.forward_context.set_forward_context",
        "vllm.v1.worker.workspace.init_workspace_manager",
        "vllm.v1.worker.workspace.reset_workspace_manager",
        "vllm.v1.attention.backend.CommonAttentionMetadata",
        "vllm.model_executor.models.deepseek_v2.DeepseekV2MLAAttention",
    }
    keywords = {kw for u in uses if u.label.endswith("DeepseekV2MLAAttention") for kw in u.keywords}
    assert {"vllm_config", "config", "topk_indices_buffer", "prefix", "quant_config"} <= keywords
    found = sorted(WHEELS.glob("vllm-0.24.0-*.whl"))
    if found:
        assert check(uses, Release(found[-1])) == []


def _reads(tree: ast.Module, cls: str, method: str = "__init__", name: str = "config") -> tuple[set, set]:
    """(attributes read off ``name``, names ``getattr(name, "x", default)`` asks) in ``cls.method``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            [func] = [f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == method]
            direct = {n.attr for n in ast.walk(func) if isinstance(n, ast.Attribute)
                      and isinstance(n.value, ast.Name) and n.value.id == name}  # fmt: skip
            asked = {n.args[1].value for n in ast.walk(func) if isinstance(n, ast.Call)
                     and getattr(n.func, "id", "") in ("getattr", "hasattr") and len(n.args) > 1
                     and getattr(n.args[0], "id", "") == name}  # fmt: skip
            return direct, asked
    raise AssertionError(f"{cls}.{method} is gone")


def test_the_pinned_wheels_dsa_module_reads_only_keys_the_config_holds():
    found = sorted(WHEELS.glob("vllm-0.24.0-*.whl"))
    if not found:
        pytest.skip("no pinned vLLM wheel in .cache/wheels; `nox -s contract-vllm` downloads it (.ci/run does)")
    from opcollect.backends.symbols import Release

    release = Release(found[-1])
    tree = ast.parse(release.files["vllm/model_executor/models/deepseek_v2.py"])
    for arch in (V32, GLM):
        held = set(vars(dsa.hf_config(inputs.model_keys(arch), 8)))
        for cls in ("DeepseekV2MLAAttention", "Indexer"):
            direct, asked = _reads(tree, cls)
            assert direct <= held, (cls, direct - held)
            # the keys read with a default: those DSA configs may leave out (skip pattern, MTP, rope interleave)
            assert asked - held <= {"index_topk_freq", "index_topk_pattern", "index_skip_topk_offset",
                                    "indexer_rope_interleave", "q_lora_rank"}, asked - held  # fmt: skip
            if cls == "DeepseekV2MLAAttention":
                assert "index_topk" in asked  # is_v32 (deepseek_v2.py:999)
    sparse = release.files["vllm/v1/attention/backends/mla/flashmla_sparse.py"]
    assert "vllm_config.model_config.hf_config.index_topk" in sparse  # the builder's top-k (flashmla_sparse.py:263)
    idx = release.files["vllm/v1/attention/backends/mla/indexer.py"]
    assert "return [1, 64] if current_platform.is_rocm() else [64]" in idx  # the indexer's only CUDA page size
