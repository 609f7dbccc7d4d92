"""compute_scale, scale_matrix and mla_bmm: the grids, the reference's columns, dispatch per SM, skips, the shapes
model configs add, and coverage of the reference tables (tests/data/reference/quant_bmm_tables, whole copies)."""

from __future__ import annotations

import json
from itertools import product
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import cases_of, run_cli

from opcollect.cases.profiles import derive_shapes, parse_config, read_hf_config
from opcollect.cases.quantization import QuantizeShape, static_fp8
from opcollect.cases.sources import load_grids
from opcollect.errors import InputError
from opcollect.names import GPU_SMS
from opcollect.plans import skips
from opcollect.plans.coverage import coverage
from opcollect.plans.planner import Planner, PlanOptions
from opcollect.plans.skips import decide, skip
from opcollect.runtime.planfile import read_plan
from opcollect.tables.schema import schema_for_op

DATA = Path(__file__).parent / "data"
REFERENCE = DATA / "reference" / "quant_bmm_tables"
CONFIGS = DATA / "quant_bmm_configs"
STATIC = CONFIGS / "Qwen3-32B-FP8-Static.json"
MLA40 = CONFIGS / "tiny-mla-40-heads.json"
VERSIONS = {"vllm": "0.24.0", "sglang": "0.5.14", "trtllm": "1.3.0rc20"}
TABLES = {
    "compute_scale": "quantize/{b}/{v}/computescale_perf.parquet",
    "scale_matrix": "quantize/{b}/{v}/scale_matrix_perf.parquet",
    "mla_bmm": "mla_bmm/{b}/{v}/mla_bmm_perf.parquet",
}
OPS = tuple(TABLES)
QUANTIZE = ("compute_scale", "scale_matrix")
FP8_SMS = [sm for sm in GPU_SMS if int(sm) >= 89]


def _table(backend: str, op: str) -> Path:
    return REFERENCE / TABLES[op].format(b=backend, v=VERSIONS[backend])


def _ks(selection) -> set[int]:
    return {c.k for c in cases_of(selection)}


def _heads(selection) -> set[int]:
    return {c.num_heads for c in cases_of(selection)}


# ---- grids and their expansion


@pytest.mark.parametrize("op", QUANTIZE)
def test_quantize_expands_every_m_with_every_k(project, planner, op):
    grid = load_grids(project.cases)[op].grid
    [group] = planner.groups(op, "90")
    assert group.constants == {"quant_dtype": "fp8"}
    base = set(product(grid.m, grid.k, ["fp8"]))
    assert len(base) == 74 * 22 and base <= set(group.values)
    assert {v[1] for v in group.values} - set(grid.k) == {k for (k,) in group.origins}  # only models add widths
    assert len(set(group.ids)) == len(group.ids)
    assert group.ids[group.values.index((1, 32, "fp8"))] == f"{op}:fp8:m=1,k=32"


def test_mla_bmm_expands_each_op_names_tokens_with_every_head_count(project, planner):
    grid = load_grids(project.cases)["mla_bmm"].grid
    assert len(grid.num_tokens["mla_gen_pre"]) == 25 and len(grid.num_tokens["mla_gen_post"]) == 28
    groups = {g.dtype: g for g in planner.groups("mla_bmm", "90")}
    assert set(groups) == {"bfloat16", "fp8"}
    for dtype, group in groups.items():
        base = {(op, dtype, t, h) for op, counts in grid.num_tokens.items() for t in counts for h in grid.num_heads}
        assert len(base) == 53 * 12 and base <= set(group.values)
        assert {v[3] for v in group.values} - set(grid.num_heads) == {h for (h,) in group.origins}
        assert {v[0] for v in group.values} == {"mla_gen_pre", "mla_gen_post"}
    case_id = groups["fp8"].ids[groups["fp8"].values.index(("mla_gen_post", "fp8", 20480, 128))]
    assert case_id == "mla_bmm:fp8:op_name=mla_gen_post,num_tokens=20480,num_heads=128"


def test_the_cpu_grids_are_a_handful_of_torch_cases(planner):
    torch = planner.plan("torch", "cpu", PlanOptions(ops=OPS))
    # mla_bmm: DeepSeek-V3's (and V3.2's) 16 heads and GLM-5's 8 at TP 8, 2 op_names x 2 dtypes x 2 token counts
    assert {op: len(s.ids) for op, s in torch.ops.items()} == {"compute_scale": 4, "scale_matrix": 4, "mla_bmm": 16}
    assert set(torch.ops["mla_bmm"].by_dtype) == {"float32", "bfloat16"}
    assert torch.ops["compute_scale"].by_dispatch == {"torch_ops": 4}
    for backend in VERSIONS:
        plan = planner.plan(backend, "cpu", PlanOptions(ops=OPS))
        assert plan.total_cases == 0 and all(set(s.skipped) == {"frameworks-need-a-gpu"} for s in plan.ops.values())


def test_a_written_plan_hands_runners_the_case_fields(tmp_path):
    out = tmp_path / "plan.json"
    done = run_cli("plan", "--backend", "torch", "--sm", "cpu", "--ops", ",".join(OPS), "-o", str(out))
    assert done.returncode == 0, done.stderr
    plan = read_plan(out)
    quantize = plan.ops["compute_scale"]
    assert (quantize.table, quantize.family, quantize.op_name) == ("computescale_perf", "quantize", "compute_scale")
    assert {(c.m, c.k, c.quant_dtype) for c in quantize.cases} == set(product([1, 64], [512, 4096], ["fp8"]))
    bmm = plan.ops["mla_bmm"]
    assert (bmm.table, bmm.family, bmm.op_name) == ("mla_bmm_perf", "mla_bmm", None)  # op_name: each case's
    assert {c.op_name for c in bmm.cases} == {"mla_gen_pre", "mla_gen_post"}
    assert {c.num_heads for c in bmm.cases} == {8, 16}  # GLM-5's 64 and DeepSeek-V3's 128 heads at TP 8


# ---- the reference tables: columns, keys, kernel_source


@pytest.mark.parametrize("backend", VERSIONS)
@pytest.mark.parametrize("op", OPS)
def test_columns_are_the_references_in_its_order(backend, op):
    reference = pq.read_schema(_table(backend, op))
    ours = schema_for_op(op, backend).perf
    assert reference.names[-1] == "latency"
    assert [(f.name, f.type) for f in ours][: len(reference)] == [(f.name, f.type) for f in reference]


@pytest.mark.parametrize("backend", VERSIONS)
def test_sm90_plans_cover_every_reference_key_with_its_kernel_source(planner, backend):
    plan = planner.plan(backend, "90", PlanOptions(ops=OPS))
    tables = {t["table"]: t for t in coverage(plan, REFERENCE)["tables"]}
    assert set(tables) == {"computescale_perf", "scale_matrix_perf", "mla_bmm_perf"}
    for name, found in tables.items():
        rows = pq.read_table(_table(backend, found["op"])).num_rows
        assert found["keys"] == found["covered"] == rows, (name, found["patterns"])  # one row per key
        assert found["dispatch"]["rows"] == found["dispatch"]["agreeing"] == rows, found["dispatch"]
    # vLLM's table is bf16 with 12 head counts; SGLang's and TensorRT-LLM's add fp8 but lack 12/24/48/96 heads
    assert tables["mla_bmm_perf"]["keys"] == (636 if backend == "vllm" else 848)
    assert tables["mla_bmm_perf"]["plan_keys"] == (636 if backend == "vllm" else 1272)


# ---- dispatch per SM and skips


QUANTIZE_LABELS = {
    "torch": ("torch_ops", "torch_ops"),
    "vllm": ("dynamic_per_token_scaled_fp8_quant_minus_static_scaled_fp8_quant", "static_scaled_fp8_quant"),
    "sglang": ("sglang", "sglang"),
    "trtllm": ("torch_ops", "torch_ops"),
}


def _bmm_labels(backend: str, sm: str) -> dict[str, str]:
    """The BMM each framework serves per dtype on ``sm`` (plans/mla_bmm.py cites the sources)."""
    if backend == "trtllm":
        fp8 = "trtllm_bmm_out_dequant_bf16" if sm in ("100", "103") else "trtllm_fp8_block_scaling_bmm_out"
        return {"bfloat16": "trtllm_bmm_out", "fp8": fp8}
    if backend == "sglang":
        return {"bfloat16": "sglang_torch_bmm", "fp8": "sglang_sgl_kernel_bmm_fp8"}
    return {"bfloat16": "vllm_torch_bmm" if backend == "vllm" else "torch.bmm"}  # vLLM and torch: bf16 only


@pytest.mark.parametrize("sm", FP8_SMS)
@pytest.mark.parametrize("backend", ["torch", *VERSIONS])
def test_dispatch_per_sm_from_sm89(planner, backend, sm):
    plan = planner.plan(backend, sm, PlanOptions(ops=OPS))
    for op, label in zip(QUANTIZE, QUANTIZE_LABELS[backend]):
        assert plan.ops[op].by_dispatch == {label: 1628}, (op, plan.ops[op].skipped)
    bmm = plan.ops["mla_bmm"]
    found = {bmm.op.label_of(c): d for c, d in zip(cases_of(bmm), bmm.dispatch)}
    assert found == _bmm_labels(backend, sm)
    assert bmm.by_dtype == {dtype: 636 for dtype in found}


@pytest.mark.parametrize("sm", ["80", "86"])
@pytest.mark.parametrize("backend", ["torch", *VERSIONS])
def test_below_sm89_no_quantization_and_bf16_bmm_only(planner, backend, sm):
    plan = planner.plan(backend, sm, PlanOptions(ops=OPS))
    for op in QUANTIZE:
        assert not plan.ops[op].ids and plan.ops[op].skipped == {"fp8-needs-sm89": 1628}
    bmm = plan.ops["mla_bmm"]
    assert bmm.by_dtype == {"bfloat16": 636} and bmm.skipped == {"fp8-needs-sm89": 636}
    assert set(bmm.by_dispatch) == {_bmm_labels(backend, sm)["bfloat16"]}


def test_fp8_bmm_skips_name_their_reasons(planner):
    vllm = planner.plan("vllm", "90", PlanOptions(ops=("mla_bmm",))).ops["mla_bmm"]
    assert vllm.skipped == {"vllm-mla-bmm-bf16-only": 636}
    assert "mla_attention.py" in skips.reasons()["vllm-mla-bmm-bf16-only"]
    torch = planner.plan("torch", "100", PlanOptions(ops=("mla_bmm",))).ops["mla_bmm"]
    assert torch.skipped == {"torch-no-fp8-bmm": 636} and "_scaled_mm" in skips.reasons()["torch-no-fp8-bmm"]


def test_fp8_needs_sm89_spares_the_torch_quantization_on_the_cpu(planner):
    [quantize] = planner.groups("compute_scale", "cpu")
    [gemm_fp8] = [g for g in planner.groups("gemm", "90") if g.dtype == "fp8"]
    assert decide("torch", "compute_scale", "cpu", "torch_ops", quantize, {}).kept is None
    assert decide("torch", "compute_scale", "86", "torch_ops", quantize, {}).skipped == {"fp8-needs-sm89": 4}
    assert decide("torch", "gemm", "cpu", "torch._scaled_mm", gemm_fp8, {}).kept == []  # a GEMM is still refused
    assert "compute_scale" in skips.reasons()["fp8-needs-sm89"]


def test_unless_exempts_only_groups_matching_all_its_keys(planner):
    [group] = planner.groups("compute_scale", "cpu")
    entries = [skip("x", dtype="fp8").unless(op="compute_scale", sm="cpu")]
    assert decide("torch", "compute_scale", "cpu", "d", group, {}, entries).kept is None
    assert decide("torch", "compute_scale", "90", "d", group, {}, entries).skipped == {"x": 4}
    assert decide("torch", "scale_matrix", "cpu", "d", group, {}, entries).skipped == {"x": 4}
    with pytest.raises(ValueError, match="group keys"):
        skip("y", dtype="fp8").unless(m=1)


# ---- model configs


def _variant(tmp_path: Path, quantization: object, name: str = "variant") -> Path:
    config = json.loads(STATIC.read_text())
    config["_name_or_path"] = f"test/{name}"
    config["quantization_config"] = quantization
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(config))
    return path


def test_a_static_fp8_config_adds_its_layer_widths_per_tp(project, planner):
    with_config = Planner(project, (STATIC,))
    grid_k = set(load_grids(project.cases)["compute_scale"].grid.k)
    # Qwen3-32B per rank at TP 1-8: hidden 5120, attention output 64 x 128 / tp, intermediate 25600 / tp
    widths = {5120} | {8192 // tp for tp in (1, 2, 4, 8)} | {25600 // tp for tp in (1, 2, 4, 8)}
    assert {k for (k,) in derive_shapes(read_hf_config(STATIC), [1, 2, 4, 8]).quantize} == widths
    for op in QUANTIZE:
        before = planner.plan("vllm", "90", PlanOptions(ops=(op,))).ops[op]
        after = with_config.plan("vllm", "90", PlanOptions(ops=(op,))).ops[op]
        assert _ks(before) == grid_k and _ks(after) == grid_k | widths
        assert widths - grid_k == {3200, 6400, 12800, 25600}
        assert len(after.ids) == len(before.ids) + 4 * 74  # every m at each new width
        [group] = with_config.groups(op, "90")
        assert group.origins == {(k,): frozenset({"test/Qwen3-32B-FP8-Static"}) for k in widths - grid_k}
    # the widths are its GEMMs' input widths: qkv, gate_up and lm_head 5120, o 1024 and down 3200 at TP 8
    at_tp8 = derive_shapes(read_hf_config(STATIC), [8])
    assert {k for (k,) in at_tp8.quantize} == {k for (_, k) in at_tp8.gemm} == {5120, 1024, 3200}


@pytest.mark.parametrize(
    ("quantization", "found"),
    [
        ({"quant_method": "fp8", "activation_scheme": "static"}, "fp8"),
        ({"quant_method": "FP8", "activation_scheme": "Static"}, "fp8"),
        ({"quant_method": "fp8", "activation_scheme": "dynamic"}, None),
        ({"quant_method": "fp8"}, None),  # Fp8Config's default: dynamic
        ({"quant_method": "modelopt", "quant_algo": "FP8"}, "modelopt"),
        ({"quant_method": "modelopt", "quantization": {"quant_algo": "fp8"}}, "modelopt"),
        ({"quant_method": "modelopt", "quant_algo": "FP8_PER_CHANNEL_PER_TOKEN"}, None),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, None),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "group_0": {
                        "targets": ["Linear"],
                        "weights": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False},
                        "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False},
                    }
                },
            },
            "compressed-tensors",
        ),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "group_0": {
                        "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                        "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True},
                    }
                },
            },
            None,
        ),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int"}, "input_activations": None}},
            },
            None,
        ),
        ({"quant_method": "awq", "bits": 4}, None),
        (None, None),
    ],
)
def test_static_fp8_formats(quantization, found):
    assert static_fp8("cfg", quantization) == found


def test_dynamic_and_static_formats_through_a_config(tmp_path):
    dynamic = read_hf_config(_variant(tmp_path, {"quant_method": "fp8", "activation_scheme": "dynamic"}, "dyn"))
    assert dynamic.static_fp8 is None and not derive_shapes(dynamic, [1, 8]).quantize
    modelopt = read_hf_config(_variant(tmp_path, {"quant_method": "modelopt", "quant_algo": "FP8"}, "mo"))
    assert modelopt.static_fp8 == "modelopt" and QuantizeShape(25600) in derive_shapes(modelopt, [1]).quantize


def test_a_profile_entry_and_a_text_config_carry_quantization_config(tmp_path):
    keys = {k: v for k, v in json.loads(STATIC.read_text()).items() if k not in ("architectures", "_name_or_path")}
    keys = {k: v for k, v in keys.items() if k not in ("model_type", "torch_dtype", "tie_word_embeddings")}
    spec = parse_config("models/Qwen3ForCausalLM.yaml: models[0].config", "Qwen3ForCausalLM", "q", keys)
    assert spec.static_fp8 == "fp8"
    nested = {"architectures": ["Gemma3ForConditionalGeneration"], "_name_or_path": "test/nested", "text_config": keys}
    path = tmp_path / "nested.json"
    path.write_text(json.dumps(nested))
    assert read_hf_config(path).static_fp8 == "fp8"


@pytest.mark.parametrize(
    ("quantization", "needle"),
    [
        ({"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]}, "weight_block_size"),
        (["fp8"], "field 'quantization_config' is a list"),
    ],
)
def test_bad_quantization_configs_exit_2_naming_file_and_field(tmp_path, quantization, needle):
    path = _variant(tmp_path, quantization, "bad")
    with pytest.raises(InputError, match=needle):
        read_hf_config(path)
    done = run_cli("plan", "--backend", "vllm", "--sm", "90", "--ops", "compute_scale", "--model-config", str(path))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and str(path) in lines[0] and needle in lines[0], done.stderr


def test_an_mla_config_adds_its_heads_per_tp(project, planner):
    with_config = Planner(project, (MLA40, STATIC))
    grid_heads = set(load_grids(project.cases)["mla_bmm"].grid.num_heads)
    before = planner.plan("sglang", "90", PlanOptions(ops=("mla_bmm",))).ops["mla_bmm"]
    after = with_config.plan("sglang", "90", PlanOptions(ops=("mla_bmm",))).ops["mla_bmm"]
    assert _heads(before) == grid_heads  # DeepSeek-V3's profile: 128 / tp, all on the grid already
    assert _heads(after) == grid_heads | {40, 20, 10, 5}  # the Qwen3 config is no MLA model: it adds none
    assert len(after.ids) == len(before.ids) + 4 * 53 * 2  # both BMMs' token counts, bf16 and fp8
    [group] = [g for g in with_config.groups("mla_bmm", "90") if g.dtype == "bfloat16"]
    assert group.origins == {(h,): frozenset({"test/tiny-mla-40-heads"}) for h in (40, 20, 10, 5)}
    new = [c for c in cases_of(after) if c.num_heads == 5]
    grid = load_grids(project.cases)["mla_bmm"].grid
    for op_name, counts in grid.num_tokens.items():
        assert sorted(c.num_tokens for c in new if (c.op_name, c.bmm_dtype) == (op_name, "fp8")) == counts
