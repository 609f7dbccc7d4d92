"""Encoder (vision-tower) attention plans: the grid's expansion, the reference's columns and keys, dispatch per
backend and SM, the skips, and the vision tower of a VL config (vision_config beside text_config).

The reference fixtures are batch_size 4 slices of the H200 encoder_attention_perf tables
(tests/data/reference/encoder_attention_slices/README.md).
"""

from __future__ import annotations

import json
import shutil
from itertools import product
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import cases_of, run_cli

from opcollect.cases.profiles import derive_shapes, read_hf_config
from opcollect.cases.sources import load_grids
from opcollect.cases.vision import EncoderShape
from opcollect.errors import InputError
from opcollect.names import GPU_SMS
from opcollect.plans.coverage import table_coverage
from opcollect.plans.ops import OPS
from opcollect.plans.planfile import read_plan, write_plan
from opcollect.plans.planner import Planner, PlanOptions
from opcollect.project import ProjectTree
from opcollect.tables.schema import schema_for_op

OP = "encoder_attention"
DATA = Path(__file__).parent / "data"
SLICES = DATA / "reference" / "encoder_attention_slices"
VERSIONS = {"vllm": "0.24.0", "sglang": "0.5.14", "trtllm": "1.3.0rc20"}
VL = DATA / "configs" / "Qwen3-VL-8B-Instruct.json"
ONLY = PlanOptions(ops=(OP,))


def _slice(backend: str) -> Path:
    return SLICES / backend / VERSIONS[backend] / "encoder_attention_perf.parquet"


def _rows(backend: str) -> list[dict]:
    return pq.read_table(_slice(backend)).to_pylist()


def _key(row) -> tuple:
    return tuple(row[f] if isinstance(row, dict) else getattr(row, f) for f in OPS[OP].fields)


def test_expansion_is_the_grid_with_its_caps(project, planner):
    """Every head config (sweep, model_heads per TP, profile vision towers per TP) at every (batch, isl) within
    the token budget and the 32-bit bound; none twice."""
    grid = load_grids(project.cases)[OP].grid
    configs = {(n, d) for sweep in grid.heads for n, d in product(sweep.num_heads, sweep.head_dim)}
    configs |= {(m.num_heads // tp, m.head_dim) for m in grid.model_heads for tp in m.tp_sizes if m.num_heads % tp == 0}
    for spec in planner.sources.models:
        configs |= set(derive_shapes(spec, list(grid.model_tp_sizes)).encoder)
    expected = {
        (b, s, n, d, dtype)
        for (n, d), s, b, dtype in product(configs, grid.isl, grid.batch_size, grid.attn_dtypes)
        if b * s <= grid.max_tokens and 4 * b * s * n * d * 2 < 2**31  # the collector's bf16 q, k, v, o under 2 GiB
    }
    [group] = planner.groups(OP, "90")
    assert len(group.values) == len(set(group.values)) == len(expected)
    assert set(group.values) == expected
    # one head per rank comes only from the vision towers split 16 ways, and is labelled with them
    ones = {v for v in group.values if v[2] == 1}
    assert ones and all(group.models_of(v) for v in ones)
    assert group.models_of(next(v for v in group.values if (v[2], v[3]) == (8, 80))) is None  # the sweep's own


def test_run_order_is_head_config_then_isl_then_batch(planner):
    [group] = planner.groups(OP, "90")
    configs = list(dict.fromkeys((v[3], v[2]) for v in group.values))
    assert configs == sorted(configs)  # head_dim, then num_heads, each config in one block
    first = [(v[1], v[0]) for v in group.values if (v[3], v[2]) == configs[0]]
    assert first == sorted(first)


@pytest.mark.parametrize("backend", VERSIONS)
def test_columns_are_the_references_in_order(backend):
    reference = pq.read_schema(_slice(backend)).names
    perf = schema_for_op(OP, backend).perf.names
    assert reference == perf[: len(reference)]  # framework ... attn_dtype, latency; our measured columns follow
    assert schema_for_op(OP).key_columns[5:] == OPS[OP].fields == ("batch_size", "isl", "num_heads", "head_dim",
                                                                   "attn_dtype")  # fmt: skip


@pytest.mark.parametrize("backend", VERSIONS)
def test_sm90_plan_holds_every_reference_key_and_names_its_kernel_source(planner, backend):
    selection = planner.plan(backend, "90", ONLY).ops[OP]
    found = table_coverage(OPS[OP], selection.values, _slice(backend), backend, selection.dispatch)
    assert found["keys"] == len({_key(r) for r in _rows(backend)}) > 1000
    assert found["percent"] == 100.0 and found["missing"] == 0, found["patterns"]
    assert found["dispatch"]["rows"] == len(_rows(backend)) and found["dispatch"]["percent"] == 100.0


def test_dispatch_per_backend_and_sm(planner):
    """SM90 names the reference's kernel_source; elsewhere what each framework's selection code gives."""
    sm90 = {b: {r["kernel_source"] for r in _rows(b)} for b in VERSIONS}
    assert all(len(names) == 1 for names in sm90.values())
    expected = {
        "vllm": {
            "100": "vllm_vit_flash_attn_fa4",
            "103": "vllm_vit_flash_attn_fa4",
            "other": "vllm_vit_flash_attn_fa2",
        },
        "sglang": {"100": "flash_attention_v4", "other": "triton"},  # SM103 is not fa4 in vision.py
        "trtllm": {"other": "torch_flow"},
        "torch": {"other": "torch.nn.functional.scaled_dot_product_attention"},
    }
    for backend, rules in expected.items():
        for sm in GPU_SMS:
            plan = planner.plan(backend, sm, ONLY).ops[OP]
            want = next(iter(sm90[backend])) if sm == "90" and backend in sm90 else rules.get(sm, rules["other"])
            assert set(plan.dispatch) == {want}, (backend, sm)
            assert plan.by_dtype == {"bfloat16": len(plan.ids)} and plan.ids, (backend, sm)


def test_cpu_plans_torch_only_from_the_narrowed_grid(project, planner):
    narrowed = load_grids(project.cases)[OP].grid_for("cpu")
    torch_cpu = planner.plan("torch", "cpu", ONLY).ops[OP]
    assert set(torch_cpu.by_dtype) == set(narrowed.attn_dtypes) == {"float32", "bfloat16"}
    assert {c.isl for c in cases_of(torch_cpu)} == set(narrowed.isl)
    assert all(c.batch_size * c.isl <= narrowed.max_tokens for c in cases_of(torch_cpu))
    for backend in VERSIONS:
        selection = planner.plan(backend, "cpu", ONLY).ops[OP]
        assert not selection.ids and selection.skipped == {"frameworks-need-a-gpu": len(torch_cpu.ids)}


def test_float32_never_runs_on_a_gpu(tree_copy):
    """A GPU grid naming float32 keeps it out on every GPU SM (float32-only-on-cpu), for every backend."""
    path = tree_copy / "cases" / "base_ops" / f"{OP}.yaml"
    path.write_text(path.read_text().replace("  attn_dtypes: [bfloat16]\n", "  attn_dtypes: [float32, bfloat16]\n", 1))
    planner = Planner(ProjectTree(tree_copy))
    for backend in ("torch", *VERSIONS):
        selection = planner.plan(backend, "90", ONLY).ops[OP]
        assert set(selection.by_dtype) == {"bfloat16"}
        assert selection.skipped["float32-only-on-cpu"] == selection.by_dtype["bfloat16"]


def test_plan_file_round_trip(tmp_path, planner):
    plan = planner.plan("torch", "cpu", ONLY)
    write_plan(plan, tmp_path / "plan.json")
    found = read_plan(tmp_path / "plan.json").ops[OP]
    assert (found.table, found.family, found.op_name) == ("encoder_attention_perf", "encoder_attention", OP)
    assert found.fields == OPS[OP].fields and len(found.cases) == len(plan.ops[OP].ids)
    assert found.cases[0].head_dim == plan.ops[OP].values[0][3]  # runners read case.head_dim


def test_coverage_finds_the_family_directory(tmp_path):
    tree = tmp_path / "TABLES"
    target = tree / "encoder_attention" / "sglang" / VERSIONS["sglang"] / "encoder_attention_perf.parquet"
    target.parent.mkdir(parents=True)
    shutil.copy(_slice("sglang"), target)
    done = run_cli("plan", "--backend", "sglang", "--sm", "90", "--ops", OP, "--against", str(tree))
    assert done.returncode == 0, done.stderr
    keys = len({_key(r) for r in _rows("sglang")})
    assert f"encoder_attention_perf.parquet ({OP}): {keys:,} of {keys:,} keys covered (100.0%)" in done.stdout
    assert "(100.0%)" in done.stdout.split("dispatch names the table's kernel_source")[1].splitlines()[0]


# --- the vision tower of a VL config -------------------------------------------------------------------------


@pytest.mark.parametrize("tp", (1, 2, 4, 8, 16))
def test_vl_config_plans_its_language_model_as_before_and_its_vision_heads(tp):
    vl = derive_shapes(read_hf_config(VL), [tp])
    text = derive_shapes(read_hf_config(DATA / "configs" / "Qwen3-8B.json"), [tp])  # the same text_config keys
    assert (vl.gemm, vl.attention, vl.moe, vl.mla) == (text.gemm, text.attention, text.moe, text.mla)
    assert vl.encoder == {EncoderShape(16 // tp, 1152 // 16)}  # vision_config: hidden 1152, num_heads 16
    assert not text.encoder


def test_vl_config_note_and_uneven_split():
    spec = read_hf_config(VL)
    assert spec.notes == (
        "Qwen/Qwen3-VL-8B-Instruct: Qwen3VLForConditionalGeneration is planned from its text_config "
        "(the language model) and vision_config",
    )
    shapes = derive_shapes(spec, [3, 8])
    assert shapes.encoder == {EncoderShape(2, 72)}
    assert any("tp 3 does not divide 16 heads" in n and "vision-tower" in n for n in shapes.notes_for(OP))


def test_siglip_style_vision_config_reads_num_attention_heads():
    shapes = derive_shapes(read_hf_config(DATA / "configs" / "gemma-3-27b-it.json"), [1, 2])
    assert shapes.encoder == {EncoderShape(16, 72), EncoderShape(8, 72)}  # SigLIP: 1152 hidden, 16 heads


def _vl(tmp_path, vision) -> Path:
    data = json.loads(VL.read_text())
    data["vision_config"] = vision
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return path


def test_a_vision_config_with_both_head_keys_reads_num_heads(tmp_path):
    """Qwen-VL's modeling code reads num_heads; a config that also carries another num_attention_heads keeps it."""
    vision = {**json.loads(VL.read_text())["vision_config"], "num_heads": 16, "num_attention_heads": 8}
    assert derive_shapes(read_hf_config(_vl(tmp_path, vision)), [2]).encoder == {EncoderShape(8, 72)}


def test_vision_config_without_its_keys_plans_the_language_model_with_a_note(tmp_path):
    spec = read_hf_config(_vl(tmp_path, {"vt_hidden_size": 1152, "vt_num_attention_heads": 16}))
    shapes = derive_shapes(spec, [1])
    assert not shapes.encoder and shapes.gemm
    assert any("vision_config has no hidden_size and num_heads" in note for note in spec.notes)


def test_vision_hidden_size_the_heads_do_not_divide_is_refused(tmp_path):
    path = _vl(tmp_path, {"hidden_size": 1000, "num_heads": 16})
    with pytest.raises(InputError) as found:
        read_hf_config(path)
    message = str(found.value)
    assert str(path) in message and "1000" in message and "vision_config.head_dim" in message
    assert "\n" not in message


def test_model_config_flag_adds_vision_heads_to_the_plan(tmp_path, project):
    path = _vl(tmp_path, {"hidden_size": 1536, "num_heads": 12})  # head_dim 128: no sweep has it
    plan = Planner(project, (path,)).plan("vllm", "90", ONLY).ops[OP]
    added = {(c.num_heads, c.head_dim) for c in cases_of(plan) if c.head_dim == 128}
    assert added == {(12 // tp, 128) for tp in (1, 2, 4) if 12 % tp == 0}  # model_tp_sizes 8 and 16 leave 12 uneven


def test_embedded_vl_profile_brings_its_vision_tower(planner):
    spec = next(m for m in planner.sources.models if m.architecture == "Qwen3VLForConditionalGeneration")
    assert spec.layout.vision is not None and not any("unknown architecture" in n for n in spec.notes)
    planned = {(c.num_heads, c.head_dim) for c in cases_of(planner.plan("trtllm", "100", ONLY).ops[OP])}
    assert set(derive_shapes(spec, [1, 2, 4, 8, 16]).encoder) <= planned
