"""DSA (DeepSeek-V3.2, GLM-5.x), GLM-5's DSA kernels and MiniMax-M3's MSA plans: the reference's columns and keys
at SM90 and SM100, each framework's dispatch from its selection rule, the sweeps each backend plans (and the ones
it skips), the collector's grid rules, the sparse-attention keys of a model config and the refused ones, and the
speed-of-light bound against the reference's latencies.

Fixtures: slices of the H200 (SM90) reference and of the consumer wheel's B200 (SM100) tables
(tests/data/reference/sparse_slices/README.md), and config.json files the wheel ships (tests/data/sparse_configs).
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import run_cli

from opcollect.cases import sparse
from opcollect.cases.profiles import derive_shapes, parse_config, read_hf_config
from opcollect.cases.sources import load_grids
from opcollect.cases.systems import load_systems
from opcollect.errors import InputError
from opcollect.names import GPU_SMS
from opcollect.plans.bound import bound, datasheet
from opcollect.plans.coverage import table_coverage
from opcollect.plans.ops import OPS
from opcollect.plans.planner import PlanOptions
from opcollect.tables.consumer import known_values
from opcollect.tables.schema import schema_for_op

pytestmark = pytest.mark.usefixtures("pending_runners_lifted")  # conftest.py: plans as the runners will have them

DATA = Path(__file__).parent / "data"
SLICES = DATA / "reference" / "sparse_slices"
CONFIGS = DATA / "sparse_configs"
DSA = ("dsa_context_module", "dsa_generation_module")
GLM5 = ("glm5_mqa_logits_module", "glm5_topk_module", "glm5_dsa_attn_module")
MSA = ("msa_context_module", "msa_generation_module")
SPARSE = (*DSA, *GLM5, *MSA)
SYSTEMS = {"90": "h200_sxm", "100": "b200_sxm"}
# (sm, backend, op, slice) for every slice file: its op is its table's
FIXTURES = [
    (sm, path.parts[-3], path.stem[: -len("_perf")], path)
    for sm, system in SYSTEMS.items()
    for path in sorted((SLICES / system).glob("*/*/*/*.parquet"))
]
IDS = [f"sm{sm}-{backend}-{op}" for sm, backend, op, _ in FIXTURES]


@pytest.fixture(scope="module")
def plans(planner):
    """One plan of the sparse ops per (backend, SM) the fixtures need."""
    return {
        (backend, sm): planner.plan(backend, sm, PlanOptions(ops=SPARSE))
        for sm in SYSTEMS
        for backend in ("vllm", "sglang", "trtllm")
    }


def _rows(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def test_every_table_and_framework_has_a_slice():
    held = {(sm, backend, op) for sm, backend, op, _ in FIXTURES}
    for sm in SYSTEMS:
        assert {op for s, b, op in held if s == sm and b == "sglang"} == {*DSA, *GLM5}
        assert {op for s, b, op in held if s == sm and b in ("vllm", "trtllm")} == {*DSA, *MSA}


@pytest.mark.parametrize(("sm", "backend", "op", "path"), FIXTURES, ids=IDS)
def test_columns_are_the_references_in_order(sm, backend, op, path):
    reference = pq.read_schema(path).names
    perf = schema_for_op(op, backend).perf.names
    assert reference == perf[: len(reference)]  # framework ... latency (score_mode after it); ours follow


@pytest.mark.parametrize(("sm", "backend", "op", "path"), FIXTURES, ids=IDS)
def test_plan_holds_every_key_and_names_its_kernel_source(plans, sm, backend, op, path):
    """Every key row of the slice is a planned case, and the plan's dispatch there is the row's kernel_source: at
    SM90 from the H200 reference, at SM100 from the B200 tables (the frameworks' SM100 rules)."""
    selection = plans[(backend, sm)].ops[op]
    found = table_coverage(OPS[op], selection.values, path, backend, selection.dispatch)
    rows = _rows(path)
    assert found["keys"] == len({tuple(r[c] for c in found["key_columns"]) for r in rows}) > 100
    assert found["percent"] == 100.0 and found["missing"] == 0, found["patterns"]
    assert found["dispatch"]["rows"] == len(rows) and found["dispatch"]["percent"] == 100.0, found["dispatch"]


def test_dispatch_follows_each_frameworks_rule_per_sm(planner):
    """vLLM's sparse MLA backend by SM, KV dtype and heads; SGLang's DSA impls and its dense prefill; the MSA
    implementation of the SM100 family; the GLM-5 kernels the same everywhere."""
    for sm in GPU_SMS:
        vllm = planner.plan("vllm", sm, PlanOptions(ops=(*DSA, *MSA)))
        for op in DSA:
            selection = vllm.ops[op]
            for case, name in zip(selection.values, selection.dispatch):
                kv, heads = case[4], case[6]
                if sm in ("100", "103"):
                    assert name == ("FLASHINFER_MLA_SPARSE" if kv == "fp8" or heads <= 16 else "FLASHMLA_SPARSE")
                else:
                    assert name == "FLASHMLA_SPARSE" and sm == "90"  # DSA runs on SM90 and SM100/103 only
        msa = {"100": "MiniMaxM3SparseMSAImpl", "103": "MiniMaxM3SparseMSAImpl"}.get(sm, "MiniMaxM3SparseTritonImpl")
        assert set(vllm.ops["msa_context_module"].dispatch) == {msa}
        trtllm = planner.plan("trtllm", sm, PlanOptions(ops=MSA))
        assert set(trtllm.ops["msa_generation_module"].dispatch) == {
            "msa_fmha_sm100" if sm in ("100", "103") else "default"
        }
    for sm, dense in (("90", "fa3"), ("100", "trtllm_ragged")):
        selection = planner.plan("sglang", sm, PlanOptions(ops=DSA)).ops["dsa_context_module"]
        for case, name in zip(selection.values, selection.dispatch):
            op_name, kv, b, isl, step = case[0], case[4], case[7], case[8], case[10]
            if step + isl <= 2048 and b * (step + isl) <= 131072:
                assert name == f"sglang_dsa_dense_mha_{dense}"
            else:
                impl = {"fp8": "flashmla_kv" if sm == "90" else "trtllm"}.get(kv, "flashmla_sparse")
                kind = "skip_indexer" if op_name.endswith("_skip_indexer") else "indexer"
                assert name == f"sglang_dsa_{kind}_{impl}"
    for sm in ("90", "100", "103"):
        plan = planner.plan("sglang", sm, PlanOptions(ops=GLM5))
        assert [set(s.dispatch) for s in plan.ops.values()] == [
            {"deep_gemm.fp8_mqa_logits"},
            {"fast_topk_transform_fused"},
            {"flash_mla_sparse_fwd"},
        ]


def test_each_backend_plans_its_own_sweep_and_skips_the_others(planner):
    """A backend plans only the sweeps that name it: no GLM-5 kernels for vLLM or TensorRT-LLM, no MSA for SGLang,
    the torch references on the CPU only; DSA nowhere off SM90 and the SM100 family."""
    vllm = planner.plan("vllm", "90", PlanOptions(ops=SPARSE))
    assert all(not vllm.ops[op].values for op in GLM5)
    assert vllm.ops["glm5_topk_module"].skipped == {"sparse-module-sweep-of-another-framework": 6050}
    assert {v[9] for v in vllm.ops["dsa_context_module"].values} == {1}  # tp_size: heads swept directly
    sglang = planner.plan("sglang", "90", PlanOptions(ops=SPARSE))
    assert all(not sglang.ops[op].values for op in MSA)
    assert {v[9] for v in sglang.ops["dsa_generation_module"].values} == {1, 2, 4, 8}
    for sm in GPU_SMS:
        assert planner.plan("torch", sm, PlanOptions(ops=SPARSE)).total_cases == 0
    cpu = planner.plan("torch", "cpu", PlanOptions(ops=SPARSE))
    assert all(0 < len(cpu.ops[op].values) <= 24 for op in SPARSE)
    for sm in ("80", "86", "89", "120"):
        for backend in ("vllm", "sglang", "trtllm"):
            plan = planner.plan(backend, sm, PlanOptions(ops=(*DSA, *GLM5)))
            assert plan.total_cases == 0, (backend, sm)
    assert planner.plan("vllm", "120", PlanOptions(ops=MSA)).total_cases > 0  # MSA's Triton path runs there


def test_skip_indexer_rows_are_sglangs_for_models_that_skip_the_indexer(planner, project):
    """Only SGLang writes op_name <op>_skip_indexer, for models whose index_topk_freq > 1 (GLM-5.2)."""
    freq = {s.name: s.sparse.topk_freq for s in planner.sources.models if isinstance(s.sparse, sparse.Dsa)}
    grid = load_grids(project.cases)["dsa_context_module"].grid
    [sglang] = [sw for sw in grid.sweeps if sw.backends == ["sglang"]]
    for op in DSA:
        skipped = [v for v in planner.plan("sglang", "90", PlanOptions(ops=(op,))).ops[op].values]
        names = {v[1] for v in skipped if v[0] == f"{op}_skip_indexer"}
        assert names == {m.model for m in sglang.skip_indexer_models}
        assert all(freq[m.profile] > 1 for m in sglang.skip_indexer_models)
        for backend in ("vllm", "trtllm"):
            assert {v[0] for v in planner.plan(backend, "90", PlanOptions(ops=(op,))).ops[op].values} == {op}


def test_sglang_context_sweep_keeps_the_collectors_caps(planner, project):
    """Every SGLang prefill case is a valid module input: isl > 1, batch x isl within chunked_prefill_size, the
    request within max_position_embeddings, batch x (prefix + isl) within 2^25; each ceiling C - isl is planned."""
    grid = load_grids(project.cases)["dsa_context_module"]
    [sweep] = [sw for sw in grid.grid.sweeps if sw.backends == ["sglang"]]
    max_positions = {s.name: s.sparse.max_positions for s in planner.sources.models if isinstance(s.sparse, sparse.Dsa)}
    profile = {m.model: m.profile for m in (*sweep.models, *sweep.skip_indexer_models)}
    values = planner.plan("sglang", "90", PlanOptions(ops=("dsa_context_module",))).ops["dsa_context_module"].values
    for _, model, _, _, _, _, heads, b, isl, tp, step in values:
        assert isl > 1 and b * isl <= sweep.max_tokens and b * (isl + step) <= sweep.max_kv_tokens
        assert step + isl <= max_positions[profile[model]] and heads * tp in (64, 128)
    shapes = {(v[1], v[7], v[8], v[10]) for v in values}
    assert ("zai-org/GLM-5.2", 1, 4, 1048576 - 4) in shapes  # a ceiling prefix
    assert ("zai-org/GLM-5", 1, 4, 202752 - 4) in shapes and ("zai-org/GLM-5", 1, 4, 1048576 - 4) not in shapes


def test_vllm_msa_decode_steps_count_the_cached_tokens(planner, project):
    """MSA decode rows hold step = cached tokens (2^k - 1) and batch x (step + 1) within the cap."""
    grid = load_grids(project.cases)["msa_generation_module"].grid
    values = planner.plan("vllm", "90", PlanOptions(ops=MSA)).ops["msa_generation_module"].values
    assert {v[9] + 1 for v in values} == {2**k for k in range(1, 18)}
    assert all(v[6] * (v[9] + 1) <= grid.sweeps[0].max_tokens for v in values)


def test_topk_zero_latency_is_the_select_all_rows():
    """The reference writes 0 exactly where a request's tokens all fit in index_topk; zero_latency admits those."""
    path = SLICES / "h200_sxm/sparse_attention/sglang/0.5.14/glm5_topk_module_perf.parquet"
    op = OPS["glm5_topk_module"]
    rows = _rows(path)
    assert any(r["latency"] == 0 for r in rows) and any(r["latency"] > 0 for r in rows)
    for r in rows:
        assert (r["latency"] == 0) == op.zero_latency(op.case_type(*(r[f] for f in op.fields)))


def test_the_glm5_labels_pass_r6_in_their_tables_only():
    """The GLM-5 kernel tables keep the reference's fp8_e4m3 labels, which their loader never reads; in a DSA module
    table, whose loader builds quant modes from them, fp8_e4m3 stays unknown."""
    for op in GLM5:
        known = known_values(f"{op}_perf")
        for r in _rows(SLICES / f"h200_sxm/sparse_attention/sglang/0.5.14/{op}_perf.parquet"):
            assert all(r[column] in known[column] for column in ("mla_dtype", "kv_cache_dtype", "gemm_type")), r
    assert "fp8_e4m3" not in known_values("dsa_context_module_perf")["kv_cache_dtype"]


@pytest.mark.parametrize(("sm", "backend", "op", "path"), FIXTURES, ids=IDS)
def test_no_reference_row_beats_the_speed_of_light_bound(project, sm, backend, op, path):
    figures = datasheet(load_systems(project.systems)[SYSTEMS[sm]])
    plan_op = OPS[op]
    checked = 0
    for r in _rows(path):
        work = plan_op.work(plan_op.case_type(*(r[f] for f in plan_op.fields)))
        if r["latency"] > 0:
            assert work is not None and bound(work, figures).seconds <= r["latency"] * 1e-3, r
            checked += 1
    assert checked > 50


def _config(name: str) -> dict:
    return json.loads((CONFIGS / name).read_text())


def test_configs_read_as_the_profiles(planner, tmp_path):
    """A shipped config.json reads to its profile's sparse attention (cases/models)."""
    profiles = {s.name: s for s in planner.sources.models}
    for file, profile in (
        ("deepseek-ai--DeepSeek-V3.2_config.json", "DeepSeek-V3.2"),
        ("zai-org--GLM-5.2-FP8_config.json", "GLM-5.2-FP8"),
    ):
        spec = read_hf_config(CONFIGS / file)
        assert spec.sparse == profiles[profile].sparse and spec.architecture == profiles[profile].architecture
    assert profiles["GLM-5.2-FP8"].sparse.topk_freq == 4 and profiles["GLM-5.2-FP8"].sparse.gemm_type == "fp8_block"
    assert profiles["GLM-5"].sparse.gemm_type == "bfloat16" and profiles["DeepSeek-V3.2"].sparse.index_heads == 64
    # MiniMax-M3's config keeps moe_layer_freq as one 0/1 flag per layer and its dense MLP width under
    # dense_intermediate_size: the whole file reads to the profile's shapes
    spec = read_hf_config(CONFIGS / "MiniMaxAI--MiniMax-M3_config.json")
    assert spec.sparse == profiles["MiniMax-M3"].sparse == sparse.Msa("MiniMaxM3ForCausalLM", 64, 4, 128, 128, 16)
    assert derive_shapes(spec, [1, 4, 8]) == derive_shapes(profiles["MiniMax-M3"], [1, 4, 8])
    dense, experts = spec.layout.dense, spec.layout.experts
    assert (dense.inter, dense.key, experts.mlp.inter, experts.count) == (12288, "dense_intermediate_size", 3072, 128)
    for flags, dense_width in (([1] * 60, None), ([0, 0, 0] + [1] * 57, 12288)):
        data = {**_config("MiniMaxAI--MiniMax-M3_config.json"), "moe_layer_freq": flags, "first_k_dense_replace": 0}
        path = tmp_path / "m3.json"
        path.write_text(json.dumps(data))
        layout = read_hf_config(path).layout
        assert (layout.dense.inter if layout.dense else None) == dense_width, flags
    data = {**_config("MiniMaxAI--MiniMax-M3_config.json"), "moe_layer_freq": [0, 2]}
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match="moe_layer_freq"):
        read_hf_config(tmp_path / "bad.json")


def _parse(data: dict):
    keys = {k: v for k, v in data.items() if k in ("hidden_size", "num_attention_heads") or k in sparse.KEYS}
    for key in ("num_key_value_heads", "head_dim", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim"):
        if key in data:
            keys[key] = data[key]
    keys.update({k: data[k] for k in ("v_head_dim", "q_lora_rank", "intermediate_size") if k in data})
    return parse_config("config.json", data["architectures"][0], "m", keys)


@pytest.mark.parametrize(
    ("file", "change", "needle"),
    [
        (
            "zai-org--GLM-5.2-FP8_config.json",
            {"index_skip_topk_offset": 0},
            "field 'index_skip_topk_offset': 0 makes layer 0 reuse a top-k no earlier layer made",
        ),
        ("deepseek-ai--DeepSeek-V3.2_config.json", {"index_n_heads": None}, "missing key 'index_n_heads'"),
        ("deepseek-ai--DeepSeek-V3.2_config.json", {"kv_lora_rank": None}, "DSA indexes an MLA cache"),
        (
            "MiniMaxAI--MiniMax-M3_config.json",
            {"sparse_attention_config": {"sparse_num_index_heads": 8}},
            "field 'sparse_attention_config.sparse_num_index_heads': 8 is not num_key_value_heads 4",
        ),
        (
            "MiniMaxAI--MiniMax-M3_config.json",
            {"sparse_attention_config": None},
            "missing key 'sparse_attention_config'",
        ),
        ("MiniMaxAI--MiniMax-M3_config.json", {"sparse_attention_config": [4]}, "is a list; it is a JSON object"),
    ],
)
def test_inconsistent_sparse_keys_are_refused_on_one_line(file, change, needle):
    data = _config(file)
    for key, value in change.items():
        if value is None:
            data.pop(key)
        elif isinstance(value, dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    with pytest.raises(InputError) as refused:
        _parse(data)
    assert needle in str(refused.value) and "\n" not in str(refused.value)
    assert str(refused.value).startswith("config.json: ")


def test_a_model_config_adds_its_model_where_its_framework_plans_whole_models(project, tmp_path):
    """--model-config: SGLang's sweep plans the config's own model (its heads at each TP), vLLM's adds nothing
    (its architecture is planned already: one model per architecture)."""
    config = tmp_path / "GLM-5.2-dev" / "config.json"
    config.parent.mkdir()
    config.write_text((CONFIGS / "zai-org--GLM-5.2-FP8_config.json").read_text())
    from opcollect.plans.planner import Planner

    planner = Planner(project, (config,))
    ops = PlanOptions(ops=("dsa_generation_module",))
    sglang = planner.plan("sglang", "90", ops).ops["dsa_generation_module"].values
    mine = {(v[0], v[5], v[6], v[9]) for v in sglang if v[1] == "GLM-5.2-dev"}
    assert mine == {
        (op, "fp8_block", 64 // tp, tp)
        for op in ("dsa_generation_module", "dsa_generation_module_skip_indexer")
        for tp in (1, 2, 4, 8)
    }
    vllm = planner.plan("vllm", "90", ops).ops["dsa_generation_module"].values
    assert "GLM-5.2-dev" not in {v[1] for v in vllm}


def test_cli_plans_the_cpu_grid_of_every_sparse_op(tmp_path):
    done = run_cli("plan", "--backend", "torch", "--sm", "cpu", "--ops", ",".join(SPARSE), "--json")
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)["ops"]
    assert set(found) == set(SPARSE) and all(found[op]["cases"] > 0 for op in SPARSE), found
