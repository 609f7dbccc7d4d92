"""What ran beneath a row's label (an all-reduce's communicator or strategy) is kept from the runner's Measured
through the shard record, the run summary and the table's provenance; one the framework's selection did not
predict counts as a dispatch mismatch."""

from __future__ import annotations

from types import SimpleNamespace

from conftest import fake_run

from opcollect.plans.comm import CustomAllreduceCase
from opcollect.project import find_project
from opcollect.runtime.contract import Measured
from opcollect.runtime.harness import Stats, TimingConfig
from opcollect.runtime.run import describe_run_dir
from opcollect.runtime.worker import run_task
from opcollect.tables.merge import merge
from opcollect.tables.provenance import PROVENANCE, read_provenance

SIZES = (1024, 65536, 4194304)
CASES = [CustomAllreduceCase("bfloat16", 8, size, "vllm_graph") for size in SIZES]
STATS = Stats(1.0, 0.9, 1.1, 5, 0.02, "graph", 8, 0.01, 0.0)


def _ran(case) -> tuple[str, str]:
    # the largest message ran NCCL where vLLM's selection predicted its custom all-reduce
    return ("pynccl" if case.message_size == SIZES[-1] else "custom_allreduce", "custom_allreduce")


def test_the_worker_records_what_ran_and_what_was_expected():
    backend = SimpleNamespace(
        footprint=lambda op, case: 0,
        free_memory=lambda device: 2**40,
        measure=lambda op, dispatch, cases, device, config: [
            Measured(STATS, "vLLM_custom_graph", ran=_ran(c)[0], expected=_ran(c)[1]) for c in cases
        ],
    )
    task = {
        "row_id": "r",
        "op": "custom_allreduce",
        "dispatch": "vLLM_custom_graph",
        "case_ids": [f"c{i}" for i in range(len(CASES))],
        "cases": [c._asdict() for c in CASES],
    }
    answer = run_task(backend, task, "cuda:0", TimingConfig())
    assert [(r["ran"], r["expected_ran"]) for r in answer["results"]] == [_ran(c) for c in CASES]


def test_the_summary_and_the_provenance_keep_what_ran(tmp_path):
    run = fake_run(
        tmp_path / "run",
        CASES,
        op="custom_allreduce",
        kernel_source="vLLM_custom_graph",
        ran_of=_ran,
    )
    summary = describe_run_dir(run, len(CASES))
    assert "1 rows ran another kernel than the plan named: custom_allreduce ran pynccl (1)" in summary
    tables = tmp_path / "tables"
    [written] = merge([run], tables, find_project())
    record = read_provenance(tables / written.path.rsplit("/", 1)[0] / PROVENANCE)
    [event] = record.tables["custom_allreduce_perf"].events
    assert event.ran == {"custom_allreduce": 2, "pynccl": 1}
    assert event.unexpected_ran == 1


def test_a_run_without_what_ran_keeps_empty_counts(tmp_path):
    run = fake_run(tmp_path / "run", CASES, op="custom_allreduce", kernel_source="vLLM_custom_graph")
    assert "every row ran the kernel its plan named" in describe_run_dir(run, len(CASES))
    tables = tmp_path / "tables"
    [written] = merge([run], tables, find_project())
    [event] = (
        read_provenance(tables / written.path.rsplit("/", 1)[0] / PROVENANCE).tables["custom_allreduce_perf"].events
    )
    assert event.ran == {} and event.unexpected_ran == 0
