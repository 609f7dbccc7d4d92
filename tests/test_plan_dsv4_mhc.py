"""DeepSeek-V4 attention and mHC plans: the reference's columns and keys per framework, dispatch per backend and
SM, the skips, the grids' bounds, the top-k calibration's zero rows, and DeepSeek-V4 config reading.

The reference fixtures are slices of the H200 sparse_attention and mhc tables
(tests/data/reference/dsv4_mhc_slices/README.md); the config is the consumer's DeepSeek-V4-Flash config.json
(tests/data/dsv4_configs/README.md).
"""

from __future__ import annotations

import json
from itertools import product
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from opcollect.cases.dsv4 import Dsv4Attention
from opcollect.cases.profiles import derive_shapes, read_hf_config
from opcollect.cases.sources import load_grids
from opcollect.cases.systems import load_systems
from opcollect.errors import InputError
from opcollect.names import GPU_SMS
from opcollect.plans import dsv4, dsv4_kernels, mhc
from opcollect.plans.bound import datasheet
from opcollect.plans.coverage import table_coverage
from opcollect.plans.ops import OPS
from opcollect.plans.planner import Planner, PlanOptions
from opcollect.project import find_project
from opcollect.tables.physics import r8
from opcollect.tables.schema import schema_for_op

pytestmark = pytest.mark.usefixtures("pending_runners_lifted")  # conftest.py: plans as the runners will have them

DATA = Path(__file__).parent / "data"
SLICES = DATA / "reference" / "dsv4_mhc_slices"
FLASH_CONFIG = DATA / "dsv4_configs" / "sgl-project--DeepSeek-V4-Flash-FP8_config.json"
FLASH, PRO = "sgl-project/DeepSeek-V4-Flash-FP8", "sgl-project/DeepSeek-V4-Pro-FP8"
VERSIONS = {"vllm": "0.24.0", "sglang": "0.5.14", "trtllm": "1.3.0rc20"}
MODULES = [p.name for p in dsv4.MODULES]
# (backend, op) of every slice: the reference's tables per framework
SLICED = sorted(
    (backend, path.stem[: -len("_perf")] if path.stem != "mhc_module_perf" else "mhc", path)
    for backend, version in VERSIONS.items()
    for path in SLICES.glob(f"*/{backend}/{version}/*.parquet")
)


def _ids(rows):
    return [f"{b}-{op}" for b, op, _ in rows]


def test_every_table_of_the_reference_is_sliced():
    held = {(b, op) for b, op, _ in SLICED}
    dsv4_ops = {*MODULES, "dsv4_paged_mqa_logits_module"}
    assert held == (
        {("vllm", op) for op in (*dsv4_ops, "dsv4_hca_attn_module", "mhc")}
        | {("sglang", op) for op in (*dsv4_ops, "dsv4_csa_topk_calib", "mhc")}
        | {("trtllm", "mhc")}
    )


@pytest.mark.parametrize(("backend", "op", "path"), SLICED, ids=_ids(SLICED))
def test_columns_are_the_references_in_order(backend, op, path):
    """Our table for this backend starts with the reference's columns, in its order: SGLang's paged MQA logits has
    no local_num_heads, the top-k calibration's score_mode follows latency; our measured columns come after."""
    reference = pq.read_schema(path).names
    assert schema_for_op(op, backend).perf.names[: len(reference)] == reference


@pytest.fixture(scope="module")
def sm90(planner):
    ops = tuple(sorted({op for _, op, _ in SLICED}))
    return {b: planner.plan(b, "90", PlanOptions(ops=ops)) for b in VERSIONS}


@pytest.mark.parametrize(("backend", "op", "path"), SLICED, ids=_ids(SLICED))
def test_sm90_plan_holds_every_reference_key_and_names_its_kernel_source(sm90, backend, op, path):
    selection = sm90[backend].ops[op]
    found = table_coverage(OPS[op], selection.values, path, backend, selection.dispatch)
    rows = pq.read_metadata(path).num_rows
    assert found["keys"] == rows > 100  # every row is one key
    assert found["percent"] == 100.0 and found["missing"] == 0, found["patterns"]
    assert found["dispatch"]["rows"] == rows and found["dispatch"]["percent"] == 100.0, found["dispatch"]


def test_sglang_paged_table_keys_without_local_num_heads():
    """SGLang's schema leaves the column out (OpPlan.columns None) and keys on the rest; vLLM's keeps it."""
    sglang = schema_for_op("dsv4_paged_mqa_logits_module", "sglang")
    vllm = schema_for_op("dsv4_paged_mqa_logits_module", "vllm")
    assert "local_num_heads" not in sglang.key_fields and "local_num_heads" not in sglang.perf.names
    assert "local_num_heads" in vllm.key_fields and vllm.column("local_num_heads") == "local_num_heads"
    names = pq.read_schema(SLICES / "sparse_attention/sglang/0.5.14/dsv4_paged_mqa_logits_module_perf.parquet").names
    assert schema_for_op("dsv4_paged_mqa_logits_module").for_columns(names).backend == "sglang"


def test_speed_of_light_bound_reads_the_sglang_paged_table():
    """R8 builds every case of SGLang's paged table though it has no local_num_heads, and no row beats the H200."""
    path = SLICES / "sparse_attention/sglang/0.5.14/dsv4_paged_mqa_logits_module_perf.parquet"
    schema = schema_for_op("dsv4_paged_mqa_logits_module").for_columns(pq.read_schema(path).names)
    h200 = load_systems(find_project().systems)["h200_sxm"]
    found = r8(path, pq.read_table(path), schema, datasheet(h200), strict=True)
    assert [f.message for f in found if not f.warning] == []
    assert any("speed of light on h200_sxm" in f.message for f in found)


def test_topk_zero_rows_are_the_trivial_cases():
    """The reference writes 0.0 exactly where the compressed length is within index_topk (Flash 512, Pro 1024)."""
    path = SLICES / "sparse_attention/sglang/0.5.14/dsv4_csa_topk_calib_perf.parquet"
    rows = pq.read_table(path).to_pylist()
    op = OPS["dsv4_csa_topk_calib"]
    trivial = [op.zero_latency(op.case_type(*(r[f] for f in op.fields))) for r in rows]
    assert [r["latency"] == 0.0 for r in rows] == trivial
    assert 0 < sum(trivial) < len(rows) and {r["model"] for r in rows} == {FLASH, PRO}
    case = op.case_type(*(rows[0][f] for f in op.fields))
    assert not op.zero_latency(case._replace(model="someone/DeepSeek-V4-Other"))  # no dimensions: timed


def test_dims_are_the_profiles(planner):
    """plans/dsv4.py's per-model dimensions (for bounds and the zero rows) are the profiles' own."""
    shapes = planner.sources.shapes(())
    profiled = {name: dsv4.dims_of(a) for name, s in shapes.items() for a in s.dsv4}
    assert profiled == dsv4.DIMS


# ---- dispatch per SM from the frameworks' selection code ----


def _dispatch(planner, backend, sm, op):
    return planner.plan(backend, sm, PlanOptions(ops=(op,))).ops[op]


@pytest.mark.parametrize("sm", ["100", "103", "120"])
def test_vllm_module_backend_per_sm(planner, sm):
    want = "FLASHINFER_MLA_SPARSE_DSV4" if sm == "120" else "FLASHMLA_SPARSE_DSV4"  # _select_dsv4_attn_cls
    for op in (*MODULES, "dsv4_hca_attn_module"):
        assert set(_dispatch(planner, "vllm", sm, op).dispatch) == {want}, op
    paged = _dispatch(planner, "vllm", sm, "dsv4_paged_mqa_logits_module")
    assert set(paged.dispatch) == {"vllm.utils.deep_gemm.fp8_fp4_paged_mqa_logits"}


def test_sglang_per_sm(planner):
    for sm in ("100", "120"):
        for op in MODULES:
            assert set(_dispatch(planner, "sglang", sm, op).dispatch) == {"compressed_flashmla"}
    assert set(_dispatch(planner, "sglang", "100", "dsv4_paged_mqa_logits_module").dispatch) == {
        "deep_gemm.fp8_paged_mqa_logits"
    }
    assert set(_dispatch(planner, "sglang", "120", "dsv4_paged_mqa_logits_module").dispatch) == {
        "fp8_paged_mqa_logits_torch_sm120"  # the DeepSeek-V4 hook's SGLANG_FP8_PAGED_MQA_LOGITS_TORCH
    }
    topk100 = _dispatch(planner, "sglang", "100", "dsv4_csa_topk_calib")
    topk120 = _dispatch(planner, "sglang", "120", "dsv4_csa_topk_calib")
    assert set(topk100.dispatch) == {"topk_transform_v1", "topk_transform_v2"}
    assert set(topk120.dispatch) == {"topk_transform_v1"} and topk120.skipped["sglang-topk-v2-off-on-sm120"] > 0
    mhc120 = _dispatch(planner, "sglang", "120", "mhc")
    assert set(mhc120.dispatch) == {"sglang_torch_mhc_pre", "sglang_tilelang_mhc_post"}
    assert set(_dispatch(planner, "sglang", "100", "mhc").dispatch) == {
        "sglang_tilelang_mhc_pre",
        "sglang_tilelang_mhc_post",
    }


def test_trtllm_mhc_pre_tactic_space_per_sm(planner):
    """Where DeepGEMM runs (SM90, SM100 family) the pre tactic follows the tuner's measured boundaries, the same
    per case on SM100 as on SM90; elsewhere the space is FMA's alone. post has one kernel everywhere."""
    at90 = _dispatch(planner, "trtllm", "90", "mhc")
    by_case = dict(zip(at90.ids, at90.dispatch))
    for sm in ("100", "103"):
        found = _dispatch(planner, "trtllm", sm, "mhc")
        assert dict(zip(found.ids, found.dispatch)) == by_case, sm
    assert {d for d in by_case.values() if "pre" in d} == {
        "trtllm_mhc_pre_fma",
        "trtllm_mhc_pre_dg_splitk",
        "trtllm_mhc_pre_dg_nosplit",
    }
    for sm in ("80", "89", "120"):
        assert set(_dispatch(planner, "trtllm", sm, "mhc").dispatch) == {
            "trtllm_mhc_pre_fma",
            "trtllm_mhc_post_mapping",
        }, sm


def test_trtllm_pre_rule_moves_with_the_gemm_depth():
    """The rule reads num_tokens against hc_mult x hidden_size: a deeper product keeps DeepGEMM split longer and
    leaves FMA sooner; the boundaries sit where the H200 reference puts them."""
    c = mhc.MhcCase("pre", "DeepseekV4ForCausalLM", 1, 2, 4, 4096, 20)
    tactic = {
        (hidden, tokens): mhc._trtllm_pre("90", mhc.TUNED, c._replace(hidden_size=hidden, num_tokens=tokens))[15:]
        for hidden, tokens in product((4096, 7168), (64, 80, 128, 160, 2048, 3072, 4096))
    }
    assert [tactic[(4096, t)] for t in (128, 160, 2048, 3072)] == ["fma", "dg_splitk", "dg_splitk", "dg_nosplit"]
    assert [tactic[(7168, t)] for t in (64, 80, 3072, 4096)] == ["fma", "dg_splitk", "dg_splitk", "dg_nosplit"]
    assert mhc._trtllm_pre("90", "trtllm_mhc_post_mapping", c) == "trtllm_mhc_post_mapping"


def test_skips_keep_each_framework_to_its_tables(planner):
    trt = planner.plan("trtllm", "90")
    for op in (*MODULES, "dsv4_paged_mqa_logits_module", "dsv4_hca_attn_module", "dsv4_csa_topk_calib"):
        assert trt.ops[op].ids == [] and trt.ops[op].skipped == {
            "trtllm-no-dsv4-attention": sum(len(g.values) for g in planner.groups(op, "90"))
        }, op
    vllm, sglang = planner.plan("vllm", "90"), planner.plan("sglang", "90")
    assert vllm.ops["dsv4_csa_topk_calib"].ids == [] and sglang.ops["dsv4_hca_attn_module"].ids == []
    assert {c[3] for c in vllm.ops["dsv4_csa_context_module"].values} == {"fp8"}
    assert {c[3] for c in sglang.ops["dsv4_csa_context_module"].values} == {"fp8_e4m3"}
    for backend in ("vllm", "sglang"):
        for sm in ("80", "86", "89"):
            below = planner.plan(backend, sm, PlanOptions(ops=(*MODULES, "mhc")))
            assert all(s.ids == [] and "dsv4-needs-sm90" in s.skipped for s in below.ops.values()), sm


def test_torch_plans_a_small_cpu_grid_of_every_op(planner):
    """The torch backend's CPU plan has every DeepSeek-V4 op and mHC in fp32/bf16 only, a few cases each, and the
    top-k calibration both trivial and selecting cases; on a GPU the torch backend keeps mHC only."""
    ops = (*MODULES, "dsv4_paged_mqa_logits_module", "dsv4_hca_attn_module", "dsv4_csa_topk_calib", "mhc")
    cpu = planner.plan("torch", "cpu", PlanOptions(ops=ops))
    for op in ops:
        selection = cpu.ops[op]
        assert 0 < len(selection.ids) <= 32 and not selection.skipped, op
        assert all(label in ("pre", "post") or "fp8" not in label for label in selection.by_dtype), op
    topk = OPS["dsv4_csa_topk_calib"]
    trivial = {topk.zero_latency(topk.case_type._make(v)) for v in cpu.ops["dsv4_csa_topk_calib"].values}
    assert trivial == {True, False}
    gpu = planner.plan("torch", "90", PlanOptions(ops=ops))
    assert [op for op in ops if gpu.ops[op].ids] == ["mhc"]


# ---- the grids' bounds, against the collectors' rules restated ----


def _group_keys(planner, op, label, model=FLASH, tp=1):
    group = next(g for g in planner.groups(op, "90") if g.label == label)
    fields = group.case_type._fields
    at = {name: fields.index(name) for name in ("model", "tp_size", "batch_size", "isl", "step")}
    return [
        (v[at["batch_size"]], v[at["isl"]], v[at["step"]])
        for v in group.values
        if v[at["model"]] == model and v[at["tp_size"]] == tp
    ]


def test_vllm_context_sweep_is_the_collectors(planner, project):
    sweep = load_grids(project.cases)["dsv4_csa_context_module"].grid.sweeps[0].context
    expected = {
        (b, s, p)
        for b, s in product(sweep.batch_size, sweep.isl)
        for p in {0, 128, 2048, 4096, 65536 - s}
        if 0 <= p and p + s <= 65536 and b * s <= 262144 and b * (p + s) <= 2**20
    }
    found = _group_keys(planner, "dsv4_csa_context_module", "bfloat16/fp8/fp8_block")
    assert len(found) == len(set(found)) and set(found) == expected


def test_sglang_context_sweep_is_the_collectors(planner, project):
    sweep = load_grids(project.cases)["dsv4_hca_context_module"].grid.sweeps[1].context
    expected = {
        (b, s, p)
        for b, s, p in product(sweep.batch_size, sweep.isl, sweep.step)
        if b * s <= 8192 and p + s <= 1048576 and b * p <= 2**28
    }
    for label in ("bfloat16/fp8_e4m3/bfloat16", "bfloat16/fp8_e4m3/fp8_block"):
        found = _group_keys(planner, "dsv4_hca_context_module", label, PRO, 8)
        assert len(found) == len(set(found)) and set(found) == expected, label


def test_decode_sweeps_follow_the_batch_ladder(planner):
    ladder = [(524288, 1), (262144, 2), (131072, 4), (65536, 8), (32768, 16), (8192, 64)]

    def allowed(b, s):
        return b * s <= 2**20 and not any(s >= floor and b > most for floor, most in ladder)

    sglang = _group_keys(planner, "dsv4_csa_generation_module", "bfloat16/fp8_e4m3/fp8_block")
    vllm = _group_keys(planner, "dsv4_csa_generation_module", "bfloat16/fp8/fp8_block")
    assert sglang and all(isl == 1 and allowed(b, s) for b, isl, s in sglang)
    assert {(b, s) for b, _, s in vllm} == {(b, s) for b, _, s in sglang if s <= 65536}
    assert max(s for _, _, s in sglang) == 1048575 < 1048576  # below max_position_embeddings


# ---- DeepSeek-V4 config.json ----


def test_config_and_profile_give_the_same_dsv4_shapes(planner):
    from_config = read_hf_config(FLASH_CONFIG)
    from_profile = next(m for m in planner.sources.models if m.name == FLASH)
    assert from_config.name == "sgl-project--DeepSeek-V4-Flash-FP8_config" and not from_config.notes
    assert derive_shapes(from_config, [1, 2, 4, 8]) == derive_shapes(from_profile, [1, 2, 4, 8])
    [a] = derive_shapes(from_config, [1]).dsv4
    assert isinstance(a, Dsv4Attention) and a.ratios == (0, 4, 128) and a.has_csa and a.has_hca
    assert (a.num_heads, a.index_topk, a.hc_mult, a.hc_sinkhorn_iters) == (64, 512, 4, 20)


def test_dsv4_adds_no_attention_kernel_shapes_and_its_experts(planner):
    """Its projections and attention are timed inside the module tables: no attention heads, no qkv/o GEMM; its
    experts, shared expert, router and lm_head are planned as any MoE model's."""
    shapes = derive_shapes(read_hf_config(FLASH_CONFIG), [1, 8])
    assert not shapes.attention and not shapes.mla
    assert {(s.hidden_size, s.inter_size, s.topk, s.num_experts) for s in shapes.moe} == {(4096, 2048, 6, 256)}
    expert = {(2 * 2048 // tp, 4096) for tp in (1, 8)} | {(4096, 2048 // tp) for tp in (1, 8)}  # routed = shared
    assert {tuple(s) for s in shapes.gemm} == {(256, 4096), (129280, 4096), (129280 // 8, 4096)} | expert


def test_a_config_model_is_planned_beside_the_profiles(tmp_path):
    data = json.loads(FLASH_CONFIG.read_text())
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**data, "_name_or_path": "deepseek-ai/DeepSeek-V4-Flash"}))
    planner = Planner(find_project(), (config,))
    plan = planner.plan("sglang", "90", PlanOptions(ops=("dsv4_csa_generation_module", "mhc")))
    models = {c[0] for c in plan.ops["dsv4_csa_generation_module"].values}
    assert models == {FLASH, PRO, "deepseek-ai/DeepSeek-V4-Flash"}
    [group] = [g for g in planner.groups("mhc", "90") if g.label == "pre"]
    assert group.models_of(group.values[0]) == {FLASH, "deepseek-ai/DeepSeek-V4-Flash"}  # same hidden 4096


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"compress_ratios": [0, 8, 4]}, "field 'compress_ratios': 8 at layer 1 is no DeepSeek-V4 compression; use 0"),
        ({"o_groups": 7}, "field 'o_groups': 7 does not divide num_attention_heads 64; give a divisor"),
        ({"num_key_value_heads": 2}, "field 'num_key_value_heads': 2 is not 1: DeepSeek-V4 attends through one"),
        ({"qk_rope_head_dim": 512}, "field 'qk_rope_head_dim': 512 is not below head_dim 512"),
        ({"hc_mult": None}, "field 'hc_mult': missing required field; add it"),
        ({"index_topk": None}, "missing key 'index_topk' required for DeepseekV4ForCausalLM; add it to the config"),
        ({"compress_ratios": [4] * 40}, "field 'compress_ratios': '40 entries' cover fewer than num_hidden_layers 43"),
        ({"hc_sinkhorn_iters": 2.5}, "field 'hc_sinkhorn_iters': Input should be a valid integer"),
    ],
)
def test_an_inconsistent_dsv4_config_is_refused_in_one_line(tmp_path, change, message):
    data = {**json.loads(FLASH_CONFIG.read_text()), **change}
    config = tmp_path / "config.json"
    config.write_text(json.dumps({k: v for k, v in data.items() if v is not None}))
    with pytest.raises(InputError) as caught:
        read_hf_config(config)
    text = str(caught.value)
    assert text.startswith(str(config)) and message in text and "\n" not in text


def test_hca_only_model_plans_no_csa_table(tmp_path):
    """A model without ratio-4 layers needs no indexer keys and lands in the HCA tables only."""
    data = json.loads(FLASH_CONFIG.read_text())
    data["compress_ratios"] = [0 if r == 0 else 128 for r in data["compress_ratios"]]
    for key in ("index_topk", "index_n_heads", "index_head_dim"):
        del data[key]
    config = tmp_path / "hca-only.json"
    config.write_text(json.dumps({**data, "_name_or_path": "example/hca-only"}))
    plan = Planner(find_project(), (config,)).plan(
        "vllm", "90", PlanOptions(ops=("dsv4_csa_generation_module", "dsv4_hca_generation_module"))
    )
    assert "example/hca-only" not in {c[0] for c in plan.ops["dsv4_csa_generation_module"].values}
    assert "example/hca-only" in {c[0] for c in plan.ops["dsv4_hca_generation_module"].values}


@pytest.mark.parametrize("op", [*MODULES, "dsv4_paged_mqa_logits_module", "dsv4_hca_attn_module"])
def test_every_gpu_sm_plans_or_skips_with_a_reason(planner, op):
    for backend, sm in product(("vllm", "sglang"), GPU_SMS):
        selection = planner.plan(backend, sm, PlanOptions(ops=(op,))).ops[op]
        assert selection.ids or selection.skipped, (backend, sm)
    assert dsv4_kernels.c4_pairs(2, 4, 0) == 2 * (1 + 1 + 1 + 1)  # (0+j)//4 clamped to 1 for j = 1..4
