"""The vLLM MSA module runner (backends/vllm/msa.py) against a stand-in vllm up to the kernel call: the stand-in module,
layers, backends, metadata builders and breakable capture read and register what vLLM 0.24.0's do at the cited lines
and record what the runner hands them. Checked: the config carries MiniMax-M3's keys (held to the config.json the
consumer ships, tests/data/sparse_configs) with the rank's heads, the module is MiniMaxM3SparseAttention as serving
builds its first sparse layer, imported with breakable CUDA graphs on, the caches, batch and inputs have vLLM's shapes
and layouts, each batch runs as serving's dispatcher runs it (one graph, graph pieces around the eager attention, or
none), and the label is the attend impl vLLM chose. Where the pinned wheel is at hand (.cache/wheels), the keys and
the behaviours the runner relies on are read from it."""

from __future__ import annotations

import ast
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import ROOT
from fake_frameworks import CUDAGraphMode, VllmWorld

from opcollect.backends import kernels as kt
from opcollect.backends.vllm import context, msa
from opcollect.backends.vllm import msa_inputs as inputs
from opcollect.plans import msa as plan
from opcollect.plans.mla_module import MlaModuleCase
from opcollect.plans.planner import PlanOptions
from opcollect.runtime.contract import KernelLimit

torch = pytest.importorskip("torch")

CONFIG = Path(__file__).parent / "data" / "sparse_configs" / "MiniMaxAI--MiniMax-M3_config.json"
WHEELS = ROOT / ".cache" / "wheels"
M3 = "MiniMaxM3ForCausalLM"
ATTN, INDEX = "model.layers.3.self_attn.attn", "model.layers.3.self_attn.attn.index_cache"
TRITON, MSA = "MiniMaxM3SparseTritonImpl", "MiniMaxM3SparseMSAImpl"


def case(heads=64, batch=2, isl=100, step=128, kv="bfloat16", gemm="bfloat16"):
    return MlaModuleCase("MiniMaxAI/MiniMax-M3", M3, "bfloat16", kv, gemm, heads, batch, isl, 1, step)


class Backend:
    """A backend's static methods the runner calls (common/sparse_attention.py:91-98, common/indexer.py:92-99)."""

    def __init__(self, name, shape, builder):
        self.name, self.shape, self.builder = name, shape, builder

    def get_kv_cache_shape(self, num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        return self.shape(num_blocks, block_size, num_kv_heads, head_size)

    def get_builder_cls(self):
        return self.builder


class FakeVllm(VllmWorld):
    def __init__(self, capability=90, breakable=True):
        self.capability, self.breakable = capability, breakable
        super().__init__(indexer_kv_dtype="bf16")
        self.imported: list = []  # BREAKABLE's value whenever the runner imported the module
        self.modules: list = []
        self.builders: list = []  # (kind, spec, layer names, what the builder read)
        self.calls: list = []  # each module forward
        self.attends: list = []  # each run of the indexer + attend: the caches it read

    def builder(self, kind):
        fake = self

        class Builder:
            def __init__(self, spec, names, config, device):
                hf = config.model_config.hf_config
                # MiniMaxM3IndexerMetadataBuilder.__init__ (common/indexer.py:229-249), the main one (:169-183)
                self.read = dict(index_heads=hf.sparse_attention_config["sparse_num_index_heads"],
                                 max_tokens=config.scheduler_config.max_num_batched_tokens, device=device)  # fmt: skip
                fake.builders.append((kind, spec, names, self.read))

            def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
                return SimpleNamespace(kind=kind, common=common_attn_metadata, prefix_len=common_prefix_len)

        return Builder

    def install(self, monkeypatch) -> None:
        fake = self
        main_backend = Backend("MINIMAX_M3_SPARSE", lambda n, b, h, d: (n, 2, b, h, d), self.builder("MAIN"))
        index_backend = Backend("MINIMAX_M3_SPARSE_INDEXER", lambda n, b, h, d: (n, b, d), self.builder("INDEX"))

        # the attention breaks a capture when imported with breakable graphs on
        Capture, eager_break_during_capture = self.breakable_capture(lambda: fake.breakable)

        class IndexCache:  # MiniMaxM3IndexerCache (common/indexer.py:111-162)
            def __init__(self, head_dim, prefix):
                self.head_dim, self.prefix, self.dtype = head_dim, prefix, torch.bfloat16
                self.kv_cache = torch.tensor([])
                fake.current.compilation_config.static_forward_context[prefix] = self

            def get_kv_cache_spec(self, config):
                return SimpleNamespace(block_size=config.cache_config.block_size, num_kv_heads=1,
                                       head_size=self.head_dim, dtype=self.dtype)  # fmt: skip

            def get_attn_backend(self):
                return index_backend

        class MiniMaxM3SparseAttention(torch.nn.Module):  # nvidia/model.py:382-632
            def __init__(self, config, layer_id, quant_config=None, prefix="", cache_config=None,
                         topk_indices_buffer=None):  # fmt: skip
                super().__init__()
                self.args = dict(locals())
                self.default_dtype = torch.get_default_dtype()
                sparse = config.sparse_attention_config
                self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
                assert sparse["sparse_num_index_heads"] == self.num_kv_heads  # linear.py:1341-1344
                d, hidden = config.head_dim, config.hidden_size
                width = (self.num_heads + 3 * self.num_kv_heads) * d + sparse["sparse_index_dim"]
                self.qkv_proj = torch.nn.Linear(hidden, width, bias=False)
                self.o_proj = torch.nn.Linear(self.num_heads * d, hidden, bias=False)
                self.q_norm = torch.nn.Module()
                self.q_norm.weight = torch.nn.Parameter(torch.zeros(d))
                self.layer_name = f"{prefix}.attn"
                self.kv_cache_dtype = cache_config.cache_dtype
                vllm_config = fake.current
                self.indexer_kv_dtype = vllm_config.attention_config.indexer_kv_dtype
                # select_main_impl_cls (common/sparse_attention.py:391-422)
                use_msa = fake.capability // 10 == 10 and sparse["sparse_topk_blocks"] in (4, 8, 16, 32)
                impl = type(MSA if use_msa else TRITON, (), {})()
                impl.use_fp8_kv = self.kv_cache_dtype.startswith("fp8")  # :298
                self.impl = impl
                self.indexer = SimpleNamespace(index_cache=IndexCache(sparse["sparse_index_dim"],
                                                                      f"{self.layer_name}.index_cache"))  # fmt: skip
                fake.current.compilation_config.static_forward_context[self.layer_name] = self
                self.kv_cache = torch.tensor([])
                self.cache_dtype = torch.uint8 if impl.use_fp8_kv else vllm_config.model_config.dtype
                fake.modules.append(self)

            def get_attn_backend(self):
                return main_backend

            def get_kv_cache_spec(self, vllm_config):  # :536-549
                return SimpleNamespace(block_size=vllm_config.cache_config.block_size, num_kv_heads=self.num_kv_heads,
                                       head_size=self.args["config"].head_dim, dtype=self.cache_dtype)  # fmt: skip

            def forward(self, positions, hidden_states):
                fake.calls.append(dict(positions=positions, hidden=hidden_states, forward=fake.forward,
                                       kv=self.kv_cache, index_kv=self.indexer.index_cache.kv_cache,
                                       inference=torch.is_inference_mode_enabled()))  # fmt: skip
                q = hidden_states.new_empty(hidden_states.shape[0], self.num_heads * self.args["config"].head_dim)
                self._run_attention(q, q, torch.empty_like(q))
                return hidden_states.new_empty(hidden_states.shape)

            @eager_break_during_capture
            def _run_attention(self, query, index_query, output):  # :615-631: reads the bound caches when it runs
                fake.attends.append((self.kv_cache, self.indexer.index_cache.kv_cache))
                return output

        class Model(SimpleNamespace):  # PEP 562: the name is looked up when the runner imports it
            pass

        def model_getattr(name):
            if name != "MiniMaxM3SparseAttention":
                raise AttributeError(name)
            fake.imported.append(os.environ.get(msa.BREAKABLE))
            return MiniMaxM3SparseAttention

        class MiniMaxM3TextConfig(SimpleNamespace):  # transformers_utils/configs/minimax_m3.py:8-105
            model_type = "minimax_m3_text"

        self.install_world(
            monkeypatch,
            {
                "vllm.models.minimax_m3.nvidia.model": {"__getattr__": model_getattr},
                "vllm.transformers_utils.configs.minimax_m3": {"MiniMaxM3TextConfig": MiniMaxM3TextConfig},
                "vllm.compilation.breakable_cudagraph": {"BreakableCUDAGraphCapture": Capture},
                "vllm.model_executor.layers.attention": {"MLAAttention": type("MLAAttention", (), {})},
                "vllm.model_executor.layers.quantization.base_config": {
                    "QuantizeMethodBase": type("QuantizeMethodBase", (), {})
                },
                "vllm.model_executor.layers.quantization.fp8": {"Fp8Config": lambda **kw: SimpleNamespace(**kw)},
            },
        )


@pytest.fixture
def fake(monkeypatch):
    return FakeVllm.installed(monkeypatch)


def test_the_config_keys_are_the_checkpoints():
    source = json.loads(CONFIG.read_text())
    keys = inputs.model_keys(M3)
    assert keys == {k: source[k] for k in keys}  # every key as the checkpoint holds it, the sparse config whole
    assert keys["sparse_attention_config"] is not inputs.MODELS[M3]["sparse_attention_config"]  # a fresh copy
    # the planner's geometry agrees (plans/msa.py)
    sparse = keys["sparse_attention_config"]
    assert (keys["hidden_size"], keys["head_dim"], sparse["sparse_index_dim"]) == (plan.HIDDEN, plan.HEAD_DIM,
                                                                                   plan.INDEX_DIM)  # fmt: skip
    assert keys["num_attention_heads"] // keys["num_key_value_heads"] == plan.GROUP
    assert sparse["sparse_topk_blocks"] * sparse["sparse_block_size"] == plan.TOPK_TOKENS
    assert [inputs.rank_kv_heads(keys, h) for h in (1, 8, 16, 32, 64, 128)] == [1, 1, 1, 2, 4, 8]
    assert inputs.first_sparse_layer(keys) == 3


def test_builds_the_first_sparse_layer_as_serving_does_with_breakable_graphs_on(fake):
    prepared = msa.prepare(case(heads=16, isl=1000), TRITON, "cpu", 1, context=True)
    assert prepared.kernel_source == TRITON  # what vLLM chose at SM90 (common/sparse_attention.py:403-422)
    assert set(fake.imported) == {"1"} and msa.BREAKABLE not in os.environ  # on for the import alone
    (module,) = fake.modules
    args, hf = module.args, module.args["config"]
    assert args["prefix"] == "model.layers.3.self_attn" and args["layer_id"] == 3 and args["quant_config"] is None
    prepared.call()
    config = fake.calls[-1]["forward"].config
    assert args["cache_config"] is config.cache_config
    layers = config.compilation_config.static_forward_context  # registered under serving's names
    assert layers[ATTN] is module and layers[INDEX] is module.indexer.index_cache
    # the checkpoint's keys at the rank: 16 query heads, 1 KV and 1 index head
    assert (hf.num_attention_heads, hf.num_key_value_heads, hf.sparse_attention_config["sparse_num_index_heads"]) == (
        16, 1, 1)  # fmt: skip
    assert hf.architectures == ["MiniMaxM3SparseForCausalLM"] and hf.rope_theta == 5000000
    assert hf.max_position_embeddings == 1048576 and hf.sparse_attention_config["sparse_topk_blocks"] == 16
    assert inputs.MODELS[M3]["sparse_attention_config"]["sparse_num_index_heads"] == 4  # the profile untouched
    assert module.default_dtype == torch.bfloat16 and torch.get_default_dtype() == torch.float32  # restored
    # MiniMaxM3Model's top-k buffer at serving's batched-token limit
    buffer = args["topk_indices_buffer"]
    assert tuple(buffer.shape) == (1, 8192, 16) and buffer.dtype == torch.int32
    assert module.q_norm.weight.abs().sum() > 0 and torch.isfinite(module.qkv_proj.weight).all()  # filled
    assert [(kind, names, read["index_heads"], read["max_tokens"]) for kind, _, names, read in fake.builders] == [
        ("MAIN", [ATTN], 1, 8192), ("INDEX", [INDEX], 1, 8192)]  # fmt: skip


def test_a_short_prefill_replays_a_breakable_capture_per_input_set(fake):
    c = case(heads=64, batch=2, isl=100, step=128, kv="fp8", gemm="fp8_block")
    prepared = msa.prepare(c, TRITON, "cpu", 2, context=True)
    assert prepared.kernel_source == TRITON and not prepared.graph_safe  # the attention runs eagerly
    (module,) = fake.modules
    assert module.args["quant_config"].weight_block_size == [128, 128]
    config = fake.calls[0]["forward"].config
    assert config.cache_config.cache_dtype == "fp8" and config.cache_config.block_size == 128
    # a warm-up forward, then one capture per input set: a graph, the eager indexer + attend, a graph
    assert len(fake.calls) == 3 and len(fake.captures) == 2
    assert all(cap.kinds == ["graph", "eager", "graph"] for cap in fake.captures)
    first = fake.calls[1]
    assert first["forward"].mode == CUDAGraphMode.PIECEWISE and first["inference"]
    # 228 tokens a sequence: 2 pages each after the null block; serving's table of cdiv(1048576, 128) pages
    md = first["forward"].attn_metadata
    assert set(md) == {ATTN, INDEX} and md[ATTN].common is md[INDEX].common and md[ATTN].prefix_len == 0
    cm = md[ATTN].common
    assert (cm.num_reqs, cm.num_actual_tokens, cm.max_query_len, cm.max_seq_len) == (2, 200, 100, 228)
    assert cm.query_start_loc.tolist() == [0, 100, 200] and cm.seq_lens.tolist() == [228, 228]
    assert tuple(cm.block_table_tensor.shape) == (2, 8192) and cm.block_table_tensor[:, :2].tolist() == [[1, 2], [3, 4]]
    assert not cm.block_table_tensor[:, 2:].any()
    assert cm.slot_mapping.tolist() == [(1 + 2 * s) * 128 + p for s in range(2) for p in range(128, 228)]
    assert first["forward"].slot_mapping == {ATTN: cm.slot_mapping, INDEX: cm.slot_mapping}
    assert first["positions"].tolist() == list(range(128, 228)) * 2 and first["positions"].dtype == torch.int64
    assert tuple(first["hidden"].shape) == (200, 6144) and first["hidden"].dtype == torch.bfloat16
    # the caches: 5 pages of (K, V) x 128 tokens x 4 KV heads x 128, fp8 bytes; the bf16 index keys
    kv, index = first["kv"], first["index_kv"]
    assert tuple(kv.shape) == (5, 2, 128, 4, 128) and kv.dtype == torch.uint8
    values = kv.view(torch.float8_e4m3fn).float()
    assert torch.isfinite(values).all() and values.min() >= 0.125 and values.max() <= 1.875
    assert tuple(index.shape) == (5, 128, 128) and index.dtype == torch.bfloat16 and index.abs().max() <= 1
    # each call replays the next set's capture, its eager attention reading that set's caches
    fake.attends.clear()
    prepared.call()
    prepared.call()
    sets = [fake.calls[2]["kv"], fake.calls[1]["kv"]]  # captured in order 0, 1; replayed 1, then 0
    assert [kv for kv, _ in fake.attends] == sets and sets[0] is not sets[1]
    assert len(fake.calls) == 3  # a replay runs no Python forward


def test_a_decode_step_counts_only_cached_tokens_and_replays_one_graph(fake):
    c = case(heads=16, batch=3, isl=1, step=100)
    prepared = msa.prepare(c, TRITON, "cpu", 1, context=False)
    assert prepared.graph_safe and not fake.captures and not fake.calls  # the harness captures the whole forward
    prepared.call()
    (call,) = fake.calls
    assert call["forward"].mode == CUDAGraphMode.FULL and len(fake.attends) == 1  # the attention inside the graph
    cm = call["forward"].attn_metadata[ATTN].common
    assert cm.seq_lens.tolist() == [101] * 3 and cm.query_start_loc.tolist() == [0, 1, 2, 3]
    assert call["positions"].tolist() == [100] * 3  # the new token follows the 100 cached ones
    assert cm.slot_mapping.tolist() == [(1 + s) * 128 + 100 for s in range(3)]
    assert cm.max_seq_len == 1048576  # as serving captures its decode graphs: max_model_len
    assert tuple(call["kv"].shape) == (4, 2, 128, 1, 128) and call["kv"].dtype == torch.bfloat16
    assert tuple(call["hidden"].shape) == (3, 6144)


@pytest.mark.parametrize(("c", "context"), [(case(batch=4, isl=256), True), (case(batch=1024, isl=1, step=7), False)])
def test_a_batch_above_the_largest_capture_size_runs_eagerly(fake, c, context):
    prepared = msa.prepare(c, TRITON, "cpu", 1, context=context)
    assert not prepared.graph_safe and not fake.captures
    prepared.call()
    (call,) = fake.calls
    assert call["forward"].mode == CUDAGraphMode.NONE and len(fake.attends) == 1
    cm = call["forward"].attn_metadata[ATTN].common
    assert cm.max_seq_len == inputs.lengths(c, context)[1]  # the batch's own


def test_serving_runs_each_grid_shape_as_its_dispatcher_does():
    def mode(batch, isl, context=True, step=0):
        return inputs.graph_mode(case(batch=batch, isl=isl, step=step), context)

    assert context.serving_capture_sizes()[-1] == 512
    assert mode(512, 1, context=False) == mode(2, 1) == inputs.FULL  # uniform decode: one new token each
    assert mode(1024, 1, context=False) == mode(4, 256) == inputs.EAGER  # above 512 tokens
    assert mode(32, 16) == mode(1, 512) == mode(2, 16, step=128) == inputs.PIECEWISE


@pytest.mark.parametrize(("capability", "label"), [(90, TRITON), (100, MSA)])
def test_the_label_is_the_impl_vllm_built(monkeypatch, capability, label):
    FakeVllm.installed(monkeypatch, capability=capability)
    assert msa.prepare(case(), label, "cpu", 1, True).kernel_source == label


def test_an_attention_imported_without_its_eager_break_or_a_lost_fp8_cache_is_an_error(monkeypatch):
    FakeVllm.installed(monkeypatch, breakable=False)  # nvidia/model.py imported earlier with breakable graphs off
    with pytest.raises(RuntimeError, match="imported in this worker"):
        msa.prepare(case(), TRITON, "cpu", 1, True)
    FakeVllm.installed(monkeypatch)
    real = msa.build_module

    def bf16_impl(*args):
        module = real(*args)
        module.impl.use_fp8_kv = False
        return module

    monkeypatch.setattr(msa, "build_module", bf16_impl)
    with pytest.raises(RuntimeError, match="KV precision mismatch"):
        msa.prepare(case(kv="fp8"), TRITON, "cpu", 1, True)


def test_refusals_come_before_any_framework_import():
    for bad in (
        case()._replace(mla_dtype="fp8"),
        case(kv="int8"),
        case(gemm="int4_wo"),
        case()._replace(architecture="DeepseekV32ForCausalLM"),
    ):
        with pytest.raises(KernelLimit):
            msa.prepare(bad, TRITON, "cpu", 1, True)
    assert "vllm" not in sys.modules


def test_footprint_grows_with_the_case():
    base = msa.footprint(case(heads=16, batch=2, isl=1024), True)
    assert msa.footprint(case(heads=64, batch=2, isl=1024), True) > base
    assert msa.footprint(case(heads=16, batch=8, isl=1024), True) > base
    assert msa.footprint(case(heads=16, batch=2, isl=1024, gemm="fp8_block"), True) < base
    assert msa.footprint(case(heads=16, batch=2, isl=1024, kv="fp8"), True) < base
    gen = case(heads=64, batch=64, isl=1)
    assert msa.footprint(gen._replace(step=65535), False) > msa.footprint(gen._replace(step=1023), False)
    # the caches alone: 1 + 2 x 2 pages of 128 tokens, 2 x 4 x 128 values of 2 or 1 bytes, 128 bf16 index keys
    small = case(batch=2, isl=100, step=128)
    assert inputs.msa_layout(small, True).num_blocks == 5
    assert msa.footprint(small, True) - msa.footprint(small._replace(kv_cache_dtype="fp8"), True) == 5 * 128 * 1024
    # the largest decode the grid plans at 128 heads does not fit an H200: refused at run time, not skipped
    assert msa.footprint(case(heads=128, batch=1024, isl=1, step=32767), False) > 0.9 * 141 * 10**9
    assert msa.footprint(case()._replace(architecture="DeepseekV32ForCausalLM"), True) == 0  # prepare refuses it


def test_the_msa_labels_name_their_kernels():
    prefill, decode = "_gqa_sparse_fwd_kernel", "_gqa_sparse_decode_kernel"
    cute = "kernel_cutlass_kernel_fmha_sm100cutesrcsm100fwdatten_fwdSparseAttentionForwardSm100_object_at_0x7f"
    for op in ("msa_context_module", "msa_generation_module"):
        assert not kt.contradicts_label("vllm", TRITON, ["nvjet_tst_128x64", "_index_block_score_kernel", prefill], op)
        assert not kt.contradicts_label("vllm", TRITON, [decode, "_merge_topk_attn_out_kernel"], op)
        assert kt.contradicts_label("vllm", TRITON, [cute, "nvjet_tst_128x64"], op)
        assert not kt.contradicts_label("vllm", MSA, [cute], op) and not kt.contradicts_label("vllm", MSA, [decode], op)
        assert kt.contradicts_label("vllm", MSA, [prefill, "_index_block_score_kernel"], op)


def test_msa_ops_are_planned_on_the_frameworks_that_have_them(planner):
    """vLLM's Triton MSA and TensorRT-LLM's (its Triton route off SM100/103, labelled "default" as the reference
    rows are: backends/trtllm/msa.py); SGLang has no MSA table and plans none."""
    ops = ("msa_context_module", "msa_generation_module")
    for backend, dispatch in (("vllm", TRITON), ("trtllm", "default"), ("sglang", None)):
        plan_ = planner.plan(backend, "90", PlanOptions(ops=ops))
        held = {op: set(plan_.ops[op].dispatch) for op in ops if op in plan_.ops and plan_.ops[op].values}
        assert held == ({op: {dispatch} for op in ops} if dispatch else {}), backend


def test_the_contract_check_covers_every_vllm_symbol_the_runner_imports():
    """`opcollect contract vllm` and the run's preflight read the runner's imports (backends/symbols.py): every one
    msa.py makes is among them, with MiniMaxM3SparseAttention's keywords, and resolves in the pinned wheel."""
    from opcollect.backends.symbols import Release, check, runner_uses

    backends = ROOT / "src" / "opcollect" / "backends"
    # with dsa.common_metadata's CommonAttentionMetadata, which the runner calls
    uses = [
        u
        for u in runner_uses(backends / "vllm", ("vllm",), ROOT)
        if "/vllm/msa" in u.where or ("/vllm/dsa.py" in u.where and u.label.endswith("CommonAttentionMetadata"))
    ]
    assert {u.label for u in uses} == {
        "vllm.config.CUDAGraphMode",
        "vllm.config.set_current_vllm_config",
        "vllm.forward_context.set_forward_context",
        "vllm.v1.attention.backend.CommonAttentionMetadata",
        "vllm.models.minimax_m3.nvidia.model.MiniMaxM3SparseAttention",
        "vllm.transformers_utils.configs.minimax_m3.MiniMaxM3TextConfig",
        "vllm.compilation.breakable_cudagraph.BreakableCUDAGraphCapture",
    }
    keywords = {kw for u in uses if u.label.endswith("MiniMaxM3SparseAttention") for kw in u.keywords}
    assert keywords == {"config", "layer_id", "quant_config", "prefix", "cache_config", "topk_indices_buffer"}
    forward = {kw for u in uses if u.label.endswith("set_forward_context") for kw in u.keywords}
    assert {"num_tokens", "cudagraph_runtime_mode", "slot_mapping"} <= forward
    found = sorted(WHEELS.glob("vllm-0.24.0-*.whl"))
    if found:
        assert check(uses, Release(found[-1])) == []


def _method(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef:
    [node] = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls]
    [func] = [f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == name]
    return func


def test_the_pinned_wheels_module_reads_only_keys_the_config_holds_and_breaks_its_graph():
    found = sorted(WHEELS.glob("vllm-0.24.0-*.whl"))
    if not found:
        pytest.skip("no pinned vLLM wheel in .cache/wheels; `nox -s contract-vllm` downloads it (.ci/run does)")
    from opcollect.backends.symbols import Release

    files = Release(found[-1]).files
    tree = ast.parse(files["vllm/models/minimax_m3/nvidia/model.py"])
    init = _method(tree, "MiniMaxM3SparseAttention", "__init__")
    keys = inputs.model_keys(M3)
    read = {n.attr for n in ast.walk(init) if isinstance(n, ast.Attribute) and getattr(n.value, "id", "") == "config"}
    assert read and read <= set(keys), read - set(keys)
    sparse = {n.slice.value for n in ast.walk(init) if isinstance(n, ast.Subscript)
              and getattr(n.value, "id", "") == "sparse_cfg" and isinstance(n.slice, ast.Constant)}  # fmt: skip
    sparse |= {n.args[0].value for n in ast.walk(init) if isinstance(n, ast.Call) and getattr(n.func, "attr", "")
               == "get" and getattr(n.func.value, "id", "") == "sparse_cfg"}  # fmt: skip
    assert sparse and sparse <= set(keys["sparse_attention_config"]), sparse
    # the indexer and attend end a breakable graph; vLLM turns breakable graphs on for this model
    attend = _method(tree, "MiniMaxM3SparseAttention", "_run_attention")
    assert [d.id for d in attend.decorator_list] == ["eager_break_during_capture"]
    auto = files["vllm/config/vllm.py"].split('os.environ["VLLM_USE_BREAKABLE_CUDAGRAPH"] = "1"')[0][-900:]
    assert '"MiniMaxM3SparseForCausalLM"' in auto
    breakable = files["vllm/compilation/breakable_cudagraph.py"]
    assert "if not is_breakable_cudagraph_enabled():\n        return fn" in breakable  # read at decoration
    assert "if mode == CUDAGraphMode.FULL:\n                return fn(*args, **kwargs)" in breakable
    # serving captures decode graphs with max_model_len, and runs above the largest capture size without one
    runner = files["vllm/v1/worker/gpu_model_runner.py"]
    assert "if for_cudagraph_capture:" in runner and "max_seq_len = self.max_model_len" in runner
    assert "or num_tokens > max_size" in files["vllm/v1/cudagraph_dispatcher.py"]
    assert "max_block = triton.cdiv(max_seq_len, SPARSE_BLOCK_SIZE)" in files[
        "vllm/models/minimax_m3/common/ops/index_topk.py"]  # fmt: skip
