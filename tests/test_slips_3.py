"""Behaviours the third blind round (scripts/blind_mutants_3.json: bugs planted by someone who had not read the
tests, run with scripts/mutants.py --map against every test that reaches their lines) found unguarded."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import fake_run

from opcollect.cases.grids import ContextAttentionGrid, MoeGrid
from opcollect.plans.attention import context_lengths
from opcollect.plans.gemm import GemmCase
from opcollect.plans.moe import MoeCase
from opcollect.plans.moe import expand as moe_expand
from opcollect.plans.planner import PlanOptions
from opcollect.project import find_project
from opcollect.tables.candidates import unique_planned
from opcollect.tables.merge import merge

CASES = [GemmCase("bfloat16", m, 64, 64) for m in (16, 128, 1024)]
FIRST = "gemm:bfloat16:m=16,n=64,k=64"


def _collection(tables) -> dict:
    [meta] = tables.rglob("collection_meta.yaml")
    [entry] = yaml.safe_load(meta.read_text())["tables"]["gemm_perf"]["collections"]
    return entry


def test_a_run_merged_again_after_its_resume_is_described_by_its_newest_event(tmp_path):
    """The second merge of run r1 (resumed: one more case measured) replaces r1's event, rows counted anew."""
    run, tables = tmp_path / "run", tmp_path / "TABLES"
    fake_run(run, CASES, status={FIRST: "missing"})
    merge([run], tables, find_project(), say=lambda _: None)
    assert _collection(tables)["rows"] == 2
    done = ("gemm:bfloat16:m=128,n=64,k=64", "gemm:bfloat16:m=1024,n=64,k=64")
    fake_run(run, CASES, status=dict.fromkeys(done, "missing"))  # the resume measures the one case left
    merge([run], tables, find_project(), say=lambda _: None)
    assert _collection(tables)["rows"] == 3


def test_planned_cases_come_out_once_each_sorted_whatever_order_they_come_in():
    planned = pa.table({"case_id": ["b", "a", "c", "b", "a"], "plan_hash": ["p1", "p1", "p1", "p2", "p2"]})
    found = unique_planned(planned)
    assert found["case_id"].to_pylist() == ["a", "b", "c"]
    assert found["plan_hash"].to_pylist() == ["p2", "p2", "p1"]  # the last plan listed keeps its hash


def test_merging_the_same_run_twice_keeps_the_plan_and_its_hash(tmp_path):
    """The stored plan (sorted) and the run's (in run order) hold the same cases: the table's plan is unchanged."""
    run, tables = tmp_path / "run", tmp_path / "TABLES"
    fake_run(run, CASES)
    merge([run], tables, find_project(), say=lambda _: None)
    first = _collection(tables)["case_plan_hash"]
    merge([run], tables, find_project(), say=lambda _: None)
    assert _collection(tables)["case_plan_hash"] == first
    [plan] = tables.rglob("gemm_plan.parquet")
    ids = pq.read_table(plan)["case_id"].to_pylist()
    assert ids == sorted(set(ids)) and len(ids) == len(CASES)


def test_context_attention_keeps_the_pairs_whose_tokens_equal_the_cap():
    grid = ContextAttentionGrid.model_validate(
        dict(
            precisions=[{"attn_dtype": "bfloat16", "kv_cache_dtype": "bfloat16"}],
            batch_size=[1, 2, 4],
            isl=[2, 4, 8],
            heads=[{"num_heads": [8], "kv_heads": [1, 8], "head_dim": [64]}],
            max_tokens_mha=8,
            max_tokens_gqa=16,
            model_tp_sizes=[1],
        )
    )
    assert context_lengths(grid, 8, 8, 64) == [(1, 2), (1, 4), (1, 8), (2, 2), (2, 4), (4, 2)]  # MHA: b*isl <= 8
    assert (2, 8) in context_lengths(grid, 8, 1, 64) and (4, 8) not in context_lengths(grid, 8, 1, 64)  # GQA: 16


@pytest.mark.parametrize("backend", ["vllm", "trtllm"])
def test_hopper_plans_no_nvfp4_case(planner, backend):
    """NVFP4 needs Blackwell's FP4 tensor cores: the grids list it, the skip keeps it off SM90."""
    plan = planner.plan(backend, "90", PlanOptions(ops=("gemm", "moe")))
    for name, selection in plan.ops.items():
        assert "nvfp4" not in selection.by_dtype, name
        assert "nvfp4" not in {v[selection.op.fields.index(selection.op.dtype_fields[0])] for v in selection.values}
    assert sum(selection.skipped.get("nvfp4-needs-sm100", 0) for selection in plan.ops.values()) > 0


def test_block_fp8_moe_keeps_only_the_splits_whose_rank_inter_size_is_whole_blocks():
    """fp8_block's 128-wide scale blocks must tile each rank's inter size: inter 768 splits over 2 ranks (384 = 3
    blocks), not over 4 (192) though 768 itself is 6 blocks."""
    grid = MoeGrid.model_validate(
        {
            "dtypes": ["fp8_block", "bfloat16"],
            "num_tokens": [1],
            "distributions": ["balanced"],
            "gpus": [1, 2, 4],
            "shapes": [{"hidden_size": 1024, "inter_size": 768, "topk": 2, "num_experts": 4}],
        }
    )
    groups = {g.constants["moe_dtype"]: g for g in moe_expand(grid, {})}
    tp_of = {d: {v[MoeCase._fields.index("moe_tp_size")] for v in g.values} for d, g in groups.items()}
    assert tp_of["bfloat16"] == {1, 2, 4}
    assert tp_of["fp8_block"] == {1, 2}


def test_a_plan_file_with_an_empty_name_is_refused_naming_the_column(tmp_path):
    from conftest import gemm_plan

    from opcollect.errors import InputError
    from opcollect.runtime.planfile import read_plan

    path = gemm_plan(tmp_path / "plan.json", [(1, 64, 64)])
    data = json.loads(path.read_text())
    data["ops"]["gemm"]["columns"]["gemm_dtype"] = [""]
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"columns\.gemm_dtype.*'' is not a name of 1 to 128 characters"):
        read_plan(path)


def test_a_slurm_resume_resubmits_every_shard_not_done_incomplete_ones_too(tmp_path, monkeypatch):
    """A shard Slurm says nothing about and whose run is unfinished ("incomplete") is resubmitted with the failed."""
    from opcollect.cluster import submit
    from opcollect.cluster.record import SlurmRecord, write_record
    from opcollect.cluster.scripts import SlurmOptions
    from opcollect.cluster.status import ShardStatus

    states = [
        ShardStatus(0, "done", 4, 0, 4, "COMPLETED"),
        ShardStatus(1, "incomplete", 1, 0, 4, None),
        ShardStatus(2, "failed", 0, 0, 4, "FAILED"),
    ]
    monkeypatch.setattr(submit, "shard_states", lambda root: states)
    asked = []
    monkeypatch.setattr(submit, "submit", lambda root, tables, options, checkout, tasks, *_, **__: asked.append(tasks))
    write_record(tmp_path, SlurmRecord(3, (), str(tmp_path / "TABLES")))
    submit.resubmit(tmp_path, None, SlurmOptions(shards=3), tmp_path)
    assert asked == [[1, 2]]
