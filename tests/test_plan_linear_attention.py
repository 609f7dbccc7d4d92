"""Linear-attention plans (gdn_perf, mamba2_perf): the reference's columns and keys at SM90, each row's kernel_source
from the frameworks' rules at SM90, SM100, SM89 and SM120, the collector's grid rules, the linear-attention keys of
a model config and the refused ones, a hybrid model's attention and linear-attention shapes side by side, and the
speed-of-light bound against the reference's latencies.

Fixtures: slices of the H200 (SM90) reference and of the consumer wheel's B200, L40S and RTX PRO 6000 tables
(tests/data/reference/linear_slices/README.md), and config.json files the wheel ships (tests/data/linear_configs).
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import run_cli

from opcollect.cases import linear
from opcollect.cases.profiles import derive_shapes, parse_config, read_hf_config
from opcollect.cases.sources import load_grids
from opcollect.cases.systems import load_systems
from opcollect.errors import InputError
from opcollect.names import GPU_SMS
from opcollect.plans.bound import bound, datasheet
from opcollect.plans.coverage import table_coverage
from opcollect.plans.ops import OPS
from opcollect.plans.planner import Planner, PlanOptions
from opcollect.tables.schema import schema_for_op

pytestmark = pytest.mark.usefixtures("pending_runners_lifted")  # conftest.py: plans as the runners will have them

DATA = Path(__file__).parent / "data"
SLICES = DATA / "reference" / "linear_slices"
CONFIGS = DATA / "linear_configs"
OPS_HERE = ("gdn", "mamba2")
SYSTEMS = {"90": "h200_sxm", "100": "b200_sxm", "89": "l40s", "120": "rtx_pro_6000_server"}
# (sm, backend, op, slice) for every slice file: its op is its table's
FIXTURES = [
    (sm, path.parts[-3], path.stem[: -len("_perf")], path)
    for sm, system in SYSTEMS.items()
    for path in sorted((SLICES / system).glob("*/*/*/*.parquet"))
]
IDS = [f"sm{sm}-{backend}-{op}" for sm, backend, op, _ in FIXTURES]
CONV = ("causal_conv1d_fn", "causal_conv1d_update")
VERSION = {"vllm": "0.24.0", "sglang": "0.5.14", "trtllm": "1.3.0rc20"}
PHASES = ("context", "generation")


@pytest.fixture(scope="module")
def plans(planner):
    """One plan of the linear-attention ops per (backend, SM) the fixtures need."""
    return {(b, sm): planner.plan(b, sm, PlanOptions(ops=OPS_HERE)) for sm, b, _, _ in FIXTURES}


def _rows(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def _pairs(op: str, values, dispatch) -> set[tuple]:
    """(key columns of the reference without kernel_source, kernel_source) of planned cases."""
    plan_op = OPS[op]
    key = [f for f in plan_op.fields if f != "stage"]
    return {(tuple(v[plan_op.fields.index(f)] for f in key), d) for v, d in zip(values, dispatch)}


def test_every_table_and_framework_has_a_slice():
    held = {(sm, backend, op) for sm, backend, op, _ in FIXTURES}
    for sm in ("90", "100"):
        assert {(b, op) for s, b, op in held if s == sm} == {
            ("vllm", "gdn"),
            ("sglang", "gdn"),
            ("trtllm", "gdn"),
            ("trtllm", "mamba2"),
        }


@pytest.mark.parametrize(("sm", "backend", "op", "path"), FIXTURES, ids=IDS)
def test_columns_are_the_references_in_order(sm, backend, op, path):
    reference = pq.read_schema(path).names
    perf = schema_for_op(op, backend).perf.names
    assert reference == perf[: len(reference)]  # framework ... model_name, latency; stage and ours follow


@pytest.mark.parametrize(("sm", "backend", "op", "path"), FIXTURES, ids=IDS)
def test_plan_holds_every_row_and_names_its_kernel_source(plans, sm, backend, op, path):
    """Every row of the slice is a planned case, the plan's dispatch there its kernel_source: each (key,
    kernel_source) pair of the reference is a planned (case, dispatch) pair. At SM90 from the H200 reference, at
    SM100, SM89 and SM120 from the wheel's B200, L40S and RTX PRO 6000 tables (the frameworks' rules there)."""
    selection = plans[(backend, sm)].ops[op]
    found = table_coverage(OPS[op], selection.values, path, backend, selection.dispatch)
    rows = _rows(path)
    assert found["keys"] == len({tuple(r[c] for c in found["key_columns"]) for r in rows}) >= 50
    assert found["percent"] == 100.0 and found["missing"] == 0, found["patterns"]
    assert found["dispatch"]["rows"] == len(rows) and found["dispatch"]["percent"] == 100.0, found["dispatch"]
    key = [f for f in OPS[op].fields if f != "stage"]
    held = {(tuple(r[f] for f in key), r["kernel_source"]) for r in rows}
    assert held <= _pairs(op, selection.values, selection.dispatch)


def test_the_h200_shapes_are_the_collectors(plans):
    """vLLM's and SGLang's slices hold every shape the collector times (the full tables miss rows only where a kernel
    refused): the plan has exactly those shapes, each named by the first model that brings it, at every TP size of
    the collector's list; TensorRT-LLM's older table holds the tp 1 shapes."""
    for backend in ("vllm", "sglang", "trtllm"):
        rows = _rows(SLICES / f"h200_sxm/linear_attention/{backend}/{VERSION[backend]}/gdn_perf.parquet")
        fields = ("d_model", "d_conv", "num_k_heads", "head_k_dim", "num_v_heads", "head_v_dim", "model_name")
        held = {tuple(r[f] for f in fields) for r in rows}
        index = [OPS["gdn"].fields.index(f) for f in fields]
        planned = {tuple(v[i] for i in index) for v in plans[(backend, "90")].ops["gdn"].values}
        if backend == "trtllm":
            assert held == {s for s in planned if s[2] == 16}  # tp 1: all 16 key heads
        else:
            assert held == planned and len(planned) == 37
    mamba = _rows(SLICES / "h200_sxm/linear_attention/trtllm/1.3.0rc20/mamba2_perf.parquet")
    fields = OPS["mamba2"].fields[5:]
    planned = {v[5:] for v in plans[("trtllm", "90")].ops["mamba2"].values}
    assert {tuple(r[f] for f in fields) for r in mamba} == planned


def test_each_phase_sweeps_the_collectors_grid(plans, project):
    """Context: every batch x seq_len of the grid, num_tokens their product; generation: seq_len 1, num_tokens the
    batch; two kernels (stages) per point."""
    grid = load_grids(project.cases)["gdn"].grid
    values = plans[("vllm", "90")].ops["gdn"].values
    shapes = {v[5:] for v in values}
    for stage in ("conv", "core"):
        context = {(v[2], v[3]) for v in values if v[0] == stage and v[1] == "context"}
        assert context == {(b, s) for b in grid.context_batch_size for s in grid.context_seq_len}
        generation = [v for v in values if v[0] == stage and v[1] == "generation"]
        assert {v[2] for v in generation} == set(grid.generation_batch_size)
        assert all(v[3] == 1 and v[4] == v[2] for v in generation)
    assert all(v[4] == v[2] * v[3] for v in values)
    per_shape = 2 * (len(grid.context_batch_size) * len(grid.context_seq_len) + len(grid.generation_batch_size))
    assert len(values) == per_shape * len(shapes)


def test_vllm_prefill_backend_follows_the_sm_and_head_k_dim(project, tmp_path):
    """vLLM's chunked prefill: FlashInfer on SM90, on the SM100 family for head_k_dim 128 only, Triton elsewhere;
    the other kernels and frameworks do not change by SM."""
    config = tmp_path / "gdn-hk64" / "config.json"
    config.parent.mkdir()
    data = json.loads((CONFIGS / "Qwen--Qwen3.5-27B_config.json").read_text())
    data["text_config"].update(linear_key_head_dim=64, hidden_size=4000)
    config.write_text(json.dumps(data))
    planner = Planner(project, (config,))
    for sm in GPU_SMS:
        selection = planner.plan("vllm", sm, PlanOptions(ops=("gdn",))).ops["gdn"]
        found = {}
        for v, d in zip(selection.values, selection.dispatch):
            found.setdefault((v[0], v[1], v[8]), set()).add(d)
        expect = "_flashinfer" if sm in ("90", "100", "103") else "_triton"
        assert found[("core", "context", 128)] == {f"chunk_gated_delta_rule{expect}"}
        hk64 = "_flashinfer" if sm == "90" else "_triton"
        assert found[("core", "context", 64)] == {f"chunk_gated_delta_rule{hk64}"}
        assert found[("core", "generation", 64)] == {"fused_recurrent_gated_delta_rule_packed_decode"}
        assert found[("conv", "context", 128)] == {"causal_conv1d_fn"}
        for backend, core in (("sglang", "chunk_gated_delta_rule"), ("trtllm", "chunk_gated_delta_rule")):
            other = planner.plan(backend, sm, PlanOptions(ops=("gdn",))).ops["gdn"]
            assert {d for v, d in zip(other.values, other.dispatch) if v[:2] == ("core", "context")} == {core}


def test_mamba2_is_trtllms_and_torch_plans_the_cpu_only(planner):
    for backend in ("vllm", "sglang"):
        selection = planner.plan(backend, "90", PlanOptions(ops=("mamba2",))).ops["mamba2"]
        assert not selection.values and set(selection.skipped) == {"mamba2-trtllm-only"}
    for sm in GPU_SMS:
        plan = planner.plan("torch", sm, PlanOptions(ops=OPS_HERE))
        assert plan.total_cases == 0 and set(plan.ops["gdn"].skipped) == {"torch-linear-attention-cpu-only"}
    cpu = planner.plan("torch", "cpu", PlanOptions(ops=OPS_HERE))
    for op in OPS_HERE:
        selection = cpu.ops[op]
        assert 0 < len(selection.values) <= 16
        assert {(v[0], v[1]) for v in selection.values} == {(s, p) for s in ("conv", "core") for p in PHASES}
        assert all(d.startswith("torch_") for d in selection.dispatch)


@pytest.mark.parametrize(("sm", "backend", "op", "path"), FIXTURES, ids=IDS)
def test_no_reference_row_beats_the_speed_of_light_bound(project, sm, backend, op, path):
    """The work of a row (its stage read from its kernel_source: the reference has no stage column) is a lower
    bound of its latency on its system, but where its bytes fit the L2 (a warm L2 beats memory: plans/bound.py; the
    L40S's 96 MiB holds some whole conv prompts). On the H200 no row is under the bound."""
    figures = datasheet(load_systems(project.systems)[SYSTEMS[sm].removesuffix("_server")])  # systems/*.yaml
    plan_op = OPS[op]
    rows = _rows(path)
    warm = 0
    for r in rows:
        stage = "conv" if r["kernel_source"] in CONV else "core"
        work = plan_op.work(plan_op.case_type(stage, *(r[f] for f in plan_op.fields[1:])))
        if bound(work, figures).seconds > r["latency"] * 1e-3:
            assert work.bytes <= figures.cache_bytes and sm != "90", r
            warm += 1
    assert len(rows) >= 50 and warm <= len(rows) // 20


# ---- model configs


def test_configs_read_as_the_profiles(planner):
    """A shipped config.json reads to its profile's linear attention (cases/models), layers counted per kind."""
    profiles = {s.name: s for s in planner.sources.models}
    for file, profile, layers, attention in (
        ("Qwen--Qwen3.5-27B_config.json", "Qwen3.5-27B", 48, 16),
        ("nvidia--Nemotron-H-56B-Base-8K_config.json", "Nemotron-H-56B-Base-8K", 54, 10),
        (
            "nvidia--NVIDIA-Nemotron-3-Ultra-550B-A55B-NVFP4_config.json",
            "NVIDIA-Nemotron-3-Ultra-550B-A55B-NVFP4",
            48,
            12,
        ),
    ):
        spec = read_hf_config(CONFIGS / file)
        assert spec.linear == profiles[profile].linear and spec.architecture == profiles[profile].architecture
        assert (spec.linear.layers, spec.linear.attention_layers) == (layers, attention)
    assert profiles["Qwen3.5-27B"].linear == linear.Gdn(
        "Qwen3_5ForConditionalGeneration", 5120, 4, 16, 128, 48, 128, 48, 16
    )
    assert profiles["Nemotron-H-56B-Base-8K"].linear == linear.Mamba2(
        "NemotronHForCausalLM", 8192, 256, 4, 256, 64, 8, 128, 54, 10, 54
    )


def test_qwen35_output_gate_doubles_the_query_width_of_qkv(planner, tmp_path):
    """attn_output_gate: q_proj projects each head's query and its gate, so qkv is (2 q + 2 kv) x head_dim wide on a
    rank (Qwen3.5-27B at tp 8: 3 query heads, 1 kv head of 256: 2048, which its GDN layers' qkv projection is too);
    false, the standard (q + 2 kv) x head_dim, 1280."""
    data = json.loads((CONFIGS / QWEN).read_text())
    (tmp_path / "config.json").write_text(json.dumps(data))
    gemms = {tuple(g) for g in derive_shapes(read_hf_config(tmp_path / "config.json"), [8]).gemm}
    assert (2048, 5120) in gemms and (1280, 5120) not in gemms
    data["text_config"]["attn_output_gate"] = False
    (tmp_path / "config.json").write_text(json.dumps(data))
    gemms = {tuple(g) for g in derive_shapes(read_hf_config(tmp_path / "config.json"), [8]).gemm}
    assert (1280, 5120) in gemms
    del data["text_config"]["attn_output_gate"]  # absent: the family's default, gated (vLLM's qwen3_next.py)
    (tmp_path / "config.json").write_text(json.dumps(data))
    assert (1280, 5120) not in {tuple(g) for g in derive_shapes(read_hf_config(tmp_path / "config.json"), [8]).gemm}
    profile = next(s for s in planner.sources.models if s.name == "Qwen3.5-27B")
    assert (1280, 5120) not in {tuple(g) for g in derive_shapes(profile, [8]).gemm}


def test_nemotron_h_mlp_blocks_plan_an_ungated_up_and_down(planner, tmp_path):
    """Nemotron-H's "-" blocks are up_proj, relu2, down_proj (no gate): intermediate_size / tp wide at each TP that
    divides it; Nemotron-3's pattern has none (its E blocks' experts are not planned), so neither GEMM."""
    spec = read_hf_config(CONFIGS / NEMOTRON)
    profile = next(s for s in planner.sources.models if s.name == "Nemotron-H-56B-Base-8K")
    shapes = derive_shapes(spec, [1, 2, 4, 8])
    assert shapes == derive_shapes(profile, [1, 2, 4, 8])
    for tp in (1, 2, 4, 8):
        assert {(32768 // tp, 8192), (8192, 32768 // tp)} <= {tuple(g) for g in shapes.gemm}
    # a gate would make up 2 x 32768 / tp wide: at tp 8 alone, (8192, 8192) is no other projection's
    assert (2 * 32768 // 8, 8192) not in {tuple(g) for g in derive_shapes(spec, [8]).gemm}
    ultra = read_hf_config(CONFIGS / "nvidia--NVIDIA-Nemotron-3-Ultra-550B-A55B-NVFP4_config.json")
    assert ultra.linear.mlp_layers == 0 and ultra.layout.dense is None
    data = json.loads((CONFIGS / NEMOTRON).read_text())
    del data["intermediate_size"]
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match="missing key 'intermediate_size'.*MLP blocks"):
        read_hf_config(tmp_path / "config.json")


def test_a_hybrid_model_plans_its_attention_and_its_linear_attention(planner):
    """Qwen3.5's full-attention layers and Nemotron-H's attention blocks plan attention shapes from the same model
    whose GDN or Mamba2 layers plan gdn or mamba2 rows; their projections plan GEMM shapes."""
    for backend, op, model, label, heads in (
        ("vllm", "gdn", "Qwen3.5-27B", "Qwen/Qwen3.5-27B", (24, 4, 256, 0)),
        ("trtllm", "mamba2", "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
         (32, 2, 128, 0)),
    ):  # fmt: skip
        plan = planner.plan(backend, "90", PlanOptions(ops=("attention_context", op, "gemm")))
        grid = planner.sources.grids["attention_context"].grid_for("90")
        mine = planner.sources.shapes(OPS["attention_context"].tp_sizes(grid))[model]
        assert heads in mine.attention  # its attention layers' heads at tp 1
        planned = {(v[2], v[3], v[4], v[9]) for v in plan.ops["attention_context"].values}
        assert set(mine.attention) <= planned
        assert label in {v[-1] for v in plan.ops[op].values}
        layer = mine.linear
        gemms = {(v[2], v[3]) for v in plan.ops["gemm"].values}
        assert all((n, k) in gemms for n, k in linear.rank_gemms(layer, 1).shapes)


def test_a_model_of_linear_attention_alone_plans_no_attention():
    """Layers all linear_attention (or a pattern without *): no attention or qkv/o shapes, its linear ones only."""
    keys = {"hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128}
    keys |= {"intermediate_size": 4096, "num_hidden_layers": 4, "layer_types": ["linear_attention"] * 4}
    keys |= {"linear_num_key_heads": 4, "linear_key_head_dim": 64, "linear_num_value_heads": 8}
    keys |= {"linear_value_head_dim": 64, "linear_conv_kernel_dim": 4}
    spec = parse_config("c.json", "Qwen3NextForCausalLM", "all-linear", keys)
    shapes = derive_shapes(spec, [1, 2])
    assert spec.linear.attention_layers == 0 and not shapes.attention
    assert (2 * (4 * 64 + 8 * 64), 1024) in shapes.gemm and (8 * 64 // 2, 1024) not in shapes.gemm
    hybrid = parse_config("c.json", "Qwen3NextForCausalLM", "hybrid", {**keys, "layer_types": None})
    assert (hybrid.linear.layers, hybrid.linear.attention_layers) == (3, 1)  # full_attention_interval 4
    assert derive_shapes(hybrid, [1]).attention


def _parse(data: dict, architecture: str | None = None):
    text = data.get("text_config", data)
    keys = {k: v for k, v in text.items() if k in linear.KEYS and v is not None}
    for key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "num_hidden_layers"):
        if text.get(key) is not None:
            keys[key] = text[key]
    if "layer_types" in text:
        keys["layer_types"] = text["layer_types"]
    keys["intermediate_size"] = 1024
    return parse_config("config.json", architecture or data["architectures"][0], "m", keys)


QWEN = "Qwen--Qwen3.5-27B_config.json"
NEMOTRON = "nvidia--Nemotron-H-56B-Base-8K_config.json"


@pytest.mark.parametrize(
    ("file", "change", "needle"),
    [
        (QWEN, {"linear_num_value_heads": 40}, "field 'linear_num_value_heads': 40 is not a multiple of"),
        (QWEN, {"linear_conv_kernel_dim": None}, "missing key 'linear_conv_kernel_dim'"),
        (QWEN, {"num_hidden_layers": 63}, "field 'layer_types': 64 entries for num_hidden_layers 63"),
        (QWEN, {"linear_key_head_dim": 0}, "field 'linear_key_head_dim'"),
        (NEMOTRON, {"mamba_num_heads": 250}, "field 'mamba_num_heads': 250 is not a multiple of n_groups 8"),
        (NEMOTRON, {"num_hidden_layers": 117}, "field 'hybrid_override_pattern': 118 blocks for num_hidden_layers"),
        (NEMOTRON, {"hybrid_override_pattern": "MX" * 59}, "'X' at layer 1 is no Nemotron-H block"),
        (NEMOTRON, {"ssm_state_size": None}, "missing key 'ssm_state_size'"),
        (NEMOTRON, {"hybrid_override_pattern": None}, "missing key 'hybrid_override_pattern'"),
        (NEMOTRON, {"hybrid_override_pattern": None, "layers_block_type": ["mamba", "conv"]}, "'conv' at layer 1"),
    ],
)
def test_inconsistent_linear_keys_are_refused_on_one_line(file, change, needle):
    data = json.loads((CONFIGS / file).read_text())
    target = data.get("text_config", data)
    for key, value in change.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = value
    with pytest.raises(InputError) as refused:
        _parse(data)
    assert needle in str(refused.value) and "\n" not in str(refused.value)
    assert str(refused.value).startswith("config.json: ")


def test_a_model_config_adds_its_shapes_at_the_tp_sizes_that_split_it(project, tmp_path):
    """--model-config: a GDN model the grid does not list plans its own rank shapes under its own name at each of
    model_tp_sizes that splits its heads; a TP size that does not is a plan note."""
    config = tmp_path / "Qwen3.5-dev" / "config.json"
    config.parent.mkdir()
    data = json.loads((CONFIGS / QWEN).read_text())
    data["text_config"].update(hidden_size=3000, linear_num_key_heads=12, linear_num_value_heads=24)
    config.write_text(json.dumps(data))
    planner = Planner(project, (config,))
    plan = planner.plan("sglang", "90", PlanOptions(ops=("gdn",)))
    mine = {(v[7], v[9]) for v in plan.ops["gdn"].values if v[-1] == "Qwen3.5-dev"}
    assert mine == {(12 // tp, 24 // tp) for tp in (1, 2, 4)}
    assert any("Qwen3.5-dev: tp 8 does not divide both 12 key and 24 value heads" in n for n in plan.notes)


def test_a_shape_several_models_bring_is_named_by_the_first(project, tmp_path):
    """--model-config of a model whose GDN layer is Qwen3.5-9B's: every rank shape it brings is already the grid's,
    named by the first model that brings it (the grid's), so the plan is the plan without it."""
    config = tmp_path / "Qwen3.5-twin" / "config.json"
    config.parent.mkdir()
    data = json.loads((CONFIGS / QWEN).read_text())
    data["text_config"].update(
        hidden_size=4096, linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_conv_kernel_dim=4,
    )  # fmt: skip
    config.write_text(json.dumps(data))
    alone = Planner(project).plan("sglang", "90", PlanOptions(ops=("gdn",))).ops["gdn"]
    both = Planner(project, (config,)).plan("sglang", "90", PlanOptions(ops=("gdn",))).ops["gdn"]
    assert both.ids == alone.ids and "Qwen3.5-twin" not in {v[-1] for v in both.values}  # an ID names model_name


def test_cli_plans_the_cpu_grid_of_both_ops():
    done = run_cli("plan", "--backend", "torch", "--sm", "cpu", "--ops", ",".join(OPS_HERE), "--json")
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)["ops"]
    assert set(found) == set(OPS_HERE) and all(found[op]["cases"] > 0 for op in OPS_HERE), found
