"""The TensorRT-LLM all-reduce runner's pure parts on the CPU, against values computed by hand; tensorrt_llm is
never imported (rows that cannot run here are refused before any rank starts)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import cases_of

from opcollect.backends.torch import comm as torch_comm
from opcollect.backends.trtllm import allreduce as ar
from opcollect.plans.comm import VARIANTS, CustomAllreduceCase
from opcollect.runtime.contract import KernelLimit
from opcollect.runtime.harness import TimingConfig

MiB = 1 << 20


def case(size: int, gpus: int = 8, dtype: str = "bfloat16", variant: str = "trtllm") -> CustomAllreduceCase:
    return CustomAllreduceCase(allreduce_dtype=dtype, num_gpus=gpus, message_size=size, backend=variant)


def test_labels_are_the_plans_variant():
    assert ar.KERNEL_SOURCES == VARIANTS["trtllm"] == {"trtllm": "TRTLLM"}


@pytest.mark.parametrize(
    "elements, shape", [(128, (1, 128)), (4096, (1, 4096)), (8192, (2, 4096)), (2**29, (131072, 4096))]
)
def test_buffer_shapes_are_the_references(elements, shape):
    # collect_all_reduce.py:69-75: one row up to 4096 elements, rows of 4096 above
    assert torch_comm.tensor_shape(elements) == shape


def test_workspace_by_hand():
    # 64 MiB per rank and peer: IPC buffers of size * tp, 256 bytes * tp of barriers, 3 Lamport buffers of size * tp,
    # each cudaMalloc rounded up to 2 MiB
    assert ar.workspace_bytes(2) == 128 * MiB + 2 * MiB + 384 * MiB
    assert ar.workspace_bytes(8) == 512 * MiB + 2 * MiB + 1536 * MiB
    assert ar.workspace_bytes(4, size=8_000_000) == 32 * MiB + 2 * MiB + 92 * MiB  # 32e6 -> 32 MiB, 96e6 -> 92 MiB
    assert ar.workspace_bytes(1) == 0  # AllReduce allocates nothing for one rank


def test_footprint_by_hand():
    assert ar.footprint(case(1024)) == 3 * 2048 + ar.workspace_bytes(8)
    assert ar.footprint(case(2**29, gpus=2)) == 3 * (1 << 30) + ar.workspace_bytes(2)
    assert ar.footprint(case(1024, gpus=4)) < ar.footprint(case(1024, gpus=8))


def test_kernel_label_reads_the_built_strategy():
    assert ar.kernel_label("AUTO", 8, 8) == "TRTLLM"
    assert ar.kernel_label("NCCL", 4, 4) == "TRTLLM_NCCL"  # not AUTO: the row shows it
    with pytest.raises(RuntimeError, match="spans 4 ranks"):
        ar.kernel_label("AUTO", 4, 8)


def test_communicator_used_follows_the_forward_order():
    strategy = SimpleNamespace(name="AUTO")
    built = dict(symm_mem_allreduce=None, mnnvl_allreduce=None, flashinfer_allreduce=None, strategy=strategy)
    assert ar.communicator_used(SimpleNamespace(**built, _disable_mpi=True)) == "allreduce_pg:AUTO"
    assert ar.communicator_used(SimpleNamespace(**built, _disable_mpi=False)) == "allreduce:AUTO"
    assert ar.communicator_used(SimpleNamespace(**{**built, "mnnvl_allreduce": object()})) == "mnnvl"
    both = {**built, "symm_mem_allreduce": object(), "flashinfer_allreduce": object()}
    assert ar.communicator_used(SimpleNamespace(**both)) == "symm_mem"


def test_refusals_before_any_rank_starts():
    config = TimingConfig.for_device("cpu")
    with pytest.raises(KernelLimit, match="CUDA"):
        ar.measure_row([case(1024)], "cpu", config)
    with pytest.raises(KernelLimit, match="no all-reduce variant"):
        ar.measure_row([case(1024, variant="vllm_graph")], "cuda:0", config)
    with pytest.raises(ValueError, match="mixes"):
        ar.measure_row([case(1024), case(2048, gpus=4)], "cuda:0", config)
    with pytest.raises(ValueError, match="mixes"):
        ar.measure_row([case(1024), case(2048, dtype="half")], "cuda:0", config)
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() < 8:
        with pytest.raises(KernelLimit, match="8 visible GPUs"):
            ar.measure_row([case(1024), case(2048)], "cuda:0", config)
    assert "tensorrt_llm" not in sys.modules


@pytest.mark.parametrize("sm", ["90", "100"])
def test_every_planned_case_is_served(planner, sm):
    selection = planner.plan("trtllm", sm).ops["custom_allreduce"]
    cases = cases_of(selection)
    assert cases and {c.backend for c in cases} == {"trtllm"} and set(selection.dispatch) == {"TRTLLM"}
    for item in cases:
        assert item.num_gpus > 1
        assert ar.kernel_label("AUTO", item.num_gpus, item.num_gpus) == ar.KERNEL_SOURCES[item.backend]
        shape = torch_comm.tensor_shape(item.message_size)
        assert shape[0] * shape[1] == item.message_size
        assert ar.footprint(item) == 3 * torch_comm.case_bytes(item) + ar.workspace_bytes(item.num_gpus)
    rows = selection.rows or []
    assert rows and all(row.dispatch == "TRTLLM" for row in rows)


def test_runner_registration_and_no_framework_at_module_level():
    (runner,) = ar.RUNNERS["custom_allreduce"]
    assert runner.measure_row is ar.measure_row and runner.prepare is None
    assert runner.footprint is ar.footprint and runner.versions == frozenset({"1.3.0rc20", "1.3.0rc23"})
    tree = ast.parse(Path(ar.__file__).read_text())
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            assert not any(n.split(".")[0] in ("torch", "tensorrt_llm", "cuda") for n in names), names


def test_the_one_node_local_group_spans_every_rank(monkeypatch):
    torch = pytest.importorskip("torch")
    calls = []
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 4)
    monkeypatch.setattr(torch.distributed, "new_group", lambda **kw: calls.append(kw) or "group")
    holder = SimpleNamespace()
    ar._one_node_local_comm(holder)
    assert holder.local_comm == "group"
    assert calls == [{"ranks": [0, 1, 2, 3], "backend": "cuda:nccl,cpu:gloo"}]  # setup_local_comm's backends
