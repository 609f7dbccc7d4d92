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
from opcollect.backends.trtllm import allreduce_preflight as preflight
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


def test_refusals_before_any_rank_starts(monkeypatch):
    monkeypatch.setattr(ar.preflight, "check_installed", lambda: None)  # the release's own check: tested below
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


# ---- the MPI-free start, proved against the release before any rank starts (issue 20 item 5)

# the parts of the four files the runner relies on, as read in the copies of docs/research/trtllm-1.3.0-runners.md
KEPT = {
    "_utils.py": 'import os\n\ndef mpi_disabled() -> bool:\n    return os.environ.get("TLLM_DISABLE_MPI") == "1"\n',
    "_torch/distributed/communicator.py": (
        "class Distributed:\n    pass\n\n"
        "class TorchDist(Distributed):\n"
        "    def __init__(self, mapping):\n"
        "        self.setup_local_comm()\n"
        "        init_pg(torch.distributed.group.WORLD, self.local_comm, torch_pybind11_abi())\n\n"
        "    def setup_local_comm(self):\n"
        "        self.local_comm = None\n"
    ),
    "_torch/distributed/ops.py": (
        "class AllReduce(nn.Module):\n"
        "    def __init__(self, mapping, strategy=None, dtype=None):\n"
        "        self._disable_mpi = mpi_disabled()\n"
        "        op = torch.ops.trtllm\n"
        "        self.all_reduce_op = op.allreduce_pg if self._disable_mpi else op.allreduce\n"
    ),
}


def _release(tmp_path, **changes) -> Path:
    root = tmp_path / "tensorrt_llm"
    for rel, text in KEPT.items():
        for old, new in changes.get(rel.replace("/", "_").replace(".py", ""), ()):
            assert old in text
            text = text.replace(old, new)
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_preflight_accepts_a_release_that_keeps_the_assumptions(tmp_path):
    root = _release(tmp_path)
    assert preflight.problems(root) == []
    preflight.check_installed(root)


@pytest.mark.parametrize(
    "part, old, new, words",
    [
        ("_torch_distributed_communicator", "        self.setup_local_comm()\n", "", "TorchDist.__init__"),
        ("_torch_distributed_communicator", "def setup_local_comm(self)", "def setup_comm(self)", "no TorchDist.setup"),
        ("_utils", '"TLLM_DISABLE_MPI"', '"OTHER_SWITCH"', "mpi_disabled no longer uses TLLM_DISABLE_MPI"),
        (
            "_torch_distributed_ops",
            "op.allreduce_pg if",
            "op.allreduce if",
            "AllReduce.__init__ no longer uses allreduce_pg",
        ),
    ],
)
def test_preflight_refuses_a_release_that_breaks_one_with_one_line(tmp_path, part, old, new, words):
    root = _release(tmp_path, **{part: [(old, new)]})
    with pytest.raises(KernelLimit) as refused:
        preflight.check_installed(root)
    message = str(refused.value)
    assert words in message and "tensorrt_llm/" in message and "\n" not in message


def test_preflight_refuses_a_missing_file_or_package(tmp_path, monkeypatch):
    root = _release(tmp_path)
    (root / "_torch/distributed/ops.py").unlink()
    with pytest.raises(KernelLimit, match="ops.py: missing"):
        preflight.check_installed(root)
    monkeypatch.setattr(preflight, "installed_root", lambda: None)
    with pytest.raises(KernelLimit, match="not installed"):
        preflight.check_installed()


def test_measure_row_runs_the_preflight_before_any_rank(tmp_path, monkeypatch):
    broken = _release(tmp_path, _torch_distributed_communicator=[("        self.setup_local_comm()\n", "")])
    monkeypatch.setattr(preflight, "installed_root", lambda: broken)
    started = []
    monkeypatch.setattr(ar, "run_all_reduce_row", lambda *a, **k: started.append(a))
    with pytest.raises(KernelLimit, match="communicator.py"):
        ar.measure_row([case(1024)], "cuda:0", TimingConfig.for_device("cpu"))
    assert started == []


def test_a_ranks_kernel_limit_comes_back_as_one(monkeypatch):
    monkeypatch.setattr(preflight, "check_installed", lambda: None)

    def ranks(message):
        def run(*args, **kwargs):
            raise RuntimeError(message)

        return run

    config = TimingConfig.for_device("cpu")
    monkeypatch.setattr(ar, "run_all_reduce_row", ranks("KernelLimit: Mapping has no tp_group_pg"))
    with pytest.raises(KernelLimit, match="^Mapping has no tp_group_pg$"):
        ar.measure_row([case(1024)], "cuda:0", config)
    monkeypatch.setattr(ar, "run_all_reduce_row", ranks("ValueError: something else"))
    with pytest.raises(RuntimeError, match="ValueError"):
        ar.measure_row([case(1024)], "cuda:0", config)


def test_each_rank_checks_what_it_built():
    group = object()
    mapping = SimpleNamespace(tp_group_pg="pg")
    assert preflight.world_problems(True, SimpleNamespace(local_comm=group), group, mapping) == []
    found = preflight.world_problems(False, SimpleNamespace(local_comm="ray's"), group, SimpleNamespace())
    assert len(found) == 3
    assert "mpi_disabled() is False" in found[0] and "setup_local_comm" in found[1] and "tp_group_pg" in found[2]
    # the replacement never ran: no group was made
    assert preflight.world_problems(True, SimpleNamespace(local_comm=None), None, mapping) != []
    assert preflight.allreduce_problem(SimpleNamespace(_disable_mpi=True)) is None
    assert "built for MPI" in preflight.allreduce_problem(SimpleNamespace(_disable_mpi=False))


def test_the_replacement_records_the_group_it_made(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
    monkeypatch.setattr(torch.distributed, "new_group", lambda **kw: "group")
    monkeypatch.setitem(ar._WORLD, "local_comm", None)
    holder = SimpleNamespace()
    ar._one_node_local_comm(holder)
    assert ar._WORLD["local_comm"] == "group" == holder.local_comm


# ---- what AUTO ran, read from the kernels the dry run launched

ONESHOT = "void tensorrt_llm::kernels::ar_fusion::allreduce_fusion_kernel_oneshot_lamport<(AllReduceFusionPattern)0>"
TWOSHOT = "void tensorrt_llm::kernels::ar_fusion::allreduce_fusion_kernel_twoshot_sync<(AllReduceFusionPattern)0>"


def test_strategy_ran_names_the_kernels_strategy():
    assert ar.strategy_ran([ONESHOT]) == "ONESHOT"
    assert ar.strategy_ran([TWOSHOT]) == "TWOSHOT"
    # the ProcessGroup path clones the input, then NCCL reduces in place
    assert ar.strategy_ran(["Memcpy DtoD (Device -> Device)", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"]) == "NCCL"
    assert ar.strategy_ran([]) == "none"
    assert ar.strategy_ran(["some_new_kernel"]) == "unknown:some_new_kernel"


def test_describe_keeps_what_was_built_what_ran_and_why_eager():
    assert ar.describe("allreduce_pg:AUTO", "ONESHOT") == "allreduce_pg:AUTO->ONESHOT"
    eager = ar.describe("allreduce_pg:AUTO", "NCCL", "capture failed: RuntimeError: x")
    assert eager == "allreduce_pg:AUTO->NCCL; eager: capture failed: RuntimeError: x"


def test_the_dry_run_runs_once_even_without_a_profiler(monkeypatch):
    pytest.importorskip("torch")
    import torch
    import torch.profiler

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)

    def no_profiler(**kwargs):
        raise RuntimeError("CUPTI unavailable")

    monkeypatch.setattr(torch.profiler, "profile", no_profiler)
    calls = []
    launched = ar.observe(lambda: calls.append(1), "cuda:0")
    assert launched.kernels is None and "CUPTI unavailable" in launched.why
    assert calls == [1]


def _agree(monkeypatch, others_ok: bool, capture_fails: bool):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)

    def all_reduce(tensor, op=None, group=None):  # MIN over this rank and one other
        tensor.fill_(min(int(tensor.item()), 1 if others_ok else 0))

    monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)

    def capture(allreduce, x, calls):
        if capture_fails:
            raise RuntimeError("operation not permitted when stream is capturing\nmore")
        return "graph"

    monkeypatch.setattr(ar, "_capture", capture)
    return ar._agreed_capture("allreduce", "x", cpu_group=None)


def test_capture_is_timed_only_when_every_rank_captured(monkeypatch):
    capture, reason = _agree(monkeypatch, others_ok=True, capture_fails=False)
    assert reason == "" and capture(4) == "graph"
    capture, reason = _agree(monkeypatch, others_ok=True, capture_fails=True)
    assert (
        capture is None and reason == "capture failed: RuntimeError: operation not permitted when stream is capturing"
    )
    capture, reason = _agree(monkeypatch, others_ok=False, capture_fails=False)
    assert capture is None and reason == "capture failed on another rank"


def test_a_failed_capture_times_eager_calls_with_the_marker(monkeypatch):
    """time_all_reduce with the capture the ranks agreed on: None gives eager samples, timing 'eager'."""
    torch = pytest.importorskip("torch")
    capture, _ = _agree(monkeypatch, others_ok=True, capture_fails=True)
    monkeypatch.setattr(torch.distributed, "barrier", lambda group=None: None)
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda tensor, op=None, group=None: None)
    calls = []
    stats = torch_comm.time_all_reduce(lambda: calls.append(1), capture, None, TimingConfig.for_device("cpu"))
    assert stats.timing == "eager" and calls
