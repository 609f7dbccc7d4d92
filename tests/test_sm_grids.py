"""Grids per SM: what each framework runs beyond SM90 is planned there, and SM90's plans stay as they were.

cases/base_ops/*.yaml `by_sm` entries add values to a grid on named SMs (cases/grids.py folds them into
narrowed grids); plans/skips.py keeps out what a framework cannot run there.
"""

from __future__ import annotations

import pytest
import yaml

from opcollect.cases.sources import load_grids
from opcollect.errors import InputError
from opcollect.plans import skips
from opcollect.plans.planner import Planner, PlanOptions
from opcollect.project import ProjectTree

FRAMEWORKS = ("vllm", "sglang", "trtllm")
MODULE_OPS = ("mla_context_module", "mla_generation_module")
GEMMA_MOE = (2816, 704, 8, 128)  # hidden, inter, topk, experts


def _edit(path, change) -> None:
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def _without_additions(root) -> None:
    """The tree as it planned before per-SM additions: no by_sm, no NVFP4 Gemma-4 experts."""
    for path in (root / "cases" / "base_ops").glob("*.yaml"):
        _edit(path, lambda data: data.pop("by_sm", None))

    def drop_gemma_nvfp4(data: dict) -> None:
        for shape in data["grid"]["shapes"]:
            key = (shape["hidden_size"], shape["inter_size"], shape["topk"], shape["num_experts"])
            if key == GEMMA_MOE:
                shape["dtypes"].remove("nvfp4")

    _edit(root / "cases" / "base_ops" / "moe.yaml", drop_gemma_nvfp4)


def _labels(planner: Planner, backend: str, sm: str, op: str) -> dict[str, int]:
    return planner.plan(backend, sm, PlanOptions(ops=(op,))).ops[op].by_dtype


def test_sm90_plans_unchanged_by_the_sm_additions(tree_copy, planner):
    _without_additions(tree_copy)
    before = Planner(ProjectTree(tree_copy))
    for backend in FRAMEWORKS:
        for sm in ("80", "89", "90"):
            assert planner.plan(backend, sm).plan_hash == before.plan(backend, sm).plan_hash, (backend, sm)
    # and the additions do change SM100's plans, so the comparison above can see a change
    assert planner.plan("vllm", "100").plan_hash != before.plan("vllm", "100").plan_hash


def test_every_addition_names_its_sms_and_reason(project):
    grids = load_grids(project.cases)
    found = {(op, sm): f.additions_for(sm) for op, f in grids.items() for sm in ("90", "100", "103", "120")}
    assert not any(found[(op, "90")] for op in grids), "no SM90 additions: SM90's grids are the base grids"
    for op in MODULE_OPS:
        assert found[(op, "100")], op
        for entry in found[(op, "100")]:
            assert len(entry.why) > 80 and ".py" in entry.why, entry.why  # it cites the framework source


def test_mla_module_nvfp4_projections_from_sm100(planner):
    for backend in ("vllm", "trtllm"):
        for op in MODULE_OPS:
            assert not any(label.endswith("/nvfp4") for label in _labels(planner, backend, "90", op))
            for sm in ("100", "103", "120"):
                labels = _labels(planner, backend, sm, op)
                assert {"bfloat16/bfloat16/nvfp4", "bfloat16/fp8/nvfp4"} <= set(labels), (backend, sm, op)


def test_vllm_fp8_prefill_query_on_the_sm100_family_only(planner):
    fp8 = {"fp8/fp8/bfloat16", "fp8/fp8/fp8_block", "fp8/fp8/nvfp4"}
    for sm in ("100", "103"):
        assert fp8 <= set(_labels(planner, "vllm", sm, "mla_context_module")), sm
        assert not fp8 & set(_labels(planner, "vllm", sm, "mla_generation_module")), sm
    for sm in ("89", "90", "120"):  # is_device_capability_family(100) only
        assert not fp8 & set(_labels(planner, "vllm", sm, "mla_context_module")), sm
    # 3 attention precisions x 3 projection types at SM100, as the reference collector's SM100 combos
    assert len(_labels(planner, "vllm", "100", "mla_context_module")) == 9
    assert len(_labels(planner, "vllm", "100", "mla_generation_module")) == 6


def test_trtllm_mla_module_keeps_bf16_compute(planner):
    selection = planner.plan("trtllm", "100", PlanOptions(ops=("mla_context_module",))).ops["mla_context_module"]
    assert not any(label.startswith("fp8/") for label in selection.by_dtype)
    assert selection.skipped.get("trtllm-mla-bf16-compute") == 3 * selection.by_dtype["bfloat16/bfloat16/bfloat16"]
    assert "compute_dtype bfloat16 only" in skips.reasons()["trtllm-mla-bf16-compute"]


def test_gemma4_nvfp4_experts_from_sm100(planner):
    def gemma_nvfp4(backend: str, sm: str) -> int:
        selection = planner.plan(backend, sm, PlanOptions(ops=("moe",))).ops["moe"]
        fields = selection.op.fields
        at = [fields.index(name) for name in ("hidden_size", "inter_size", "topk", "num_experts")]
        dtype = fields.index("moe_dtype")
        return sum(1 for v in selection.values if v[dtype] == "nvfp4" and tuple(v[i] for i in at) == GEMMA_MOE)

    for backend in ("vllm", "trtllm"):
        assert gemma_nvfp4(backend, "90") == 0
        assert gemma_nvfp4(backend, "100") > 0


def _write_mla(tree_copy, change) -> None:
    _edit(tree_copy / "cases" / "base_ops" / "mla_context_module.yaml", change)


@pytest.mark.parametrize(
    "change, needle",
    [
        (
            lambda d: d["by_sm"][0]["add"].update(max_tokens=[1]),
            "by_sm.0.add.max_tokens: the grid has no list field 'max_tokens'",
        ),
        (
            lambda d: d["by_sm"][0]["add"].update(gemm_types=["fp8_block"]),
            "by_sm.0.add.gemm_types: 'fp8_block' is in the grid already",
        ),
        (
            lambda d: d["by_sm"][1]["add"].update(gemm_types=["nvfp4"]),
            "by_sm.1.add.gemm_types: 'nvfp4' is added to SM 100 twice",
        ),
        (
            lambda d: d.update(narrowed={"100": d["grid"]}),
            "by_sm.0: SM 100 has a narrowed grid",
        ),
        (lambda d: d["by_sm"][0].update(why=""), "by_sm.0.why"),
        (lambda d: d["by_sm"][0].update(sms=["95"]), "by_sm.0.sms.0"),
        (lambda d: d["by_sm"][1]["add"].update(precisions=[{"mla_dtype": "fp4", "kv_cache_dtype": "fp8"}]), "fp4"),
    ],
)
def test_bad_by_sm_entries_name_file_and_field(tree_copy, change, needle):
    _write_mla(tree_copy, change)
    with pytest.raises(InputError) as err:
        load_grids(tree_copy / "cases")
    message = str(err.value)
    assert "mla_context_module.yaml" in message and needle in message, message
