"""The vLLM all-reduce runner's pure builders, on the CPU, against values computed by hand; vllm is never imported."""

from __future__ import annotations

import ast
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from opcollect.backends.torch import comm as torch_comm
from opcollect.backends.vllm import allreduce as ar
from opcollect.plans.comm import VARIANTS, CustomAllreduceCase
from opcollect.runtime.contract import KernelLimit
from opcollect.runtime.harness import TimingConfig

MiB = 1 << 20


WHEELS = Path(__file__).resolve().parents[1] / ".cache" / "wheels"  # .ci/run's `nox -s contract-vllm` fills it


def case(size: int, gpus: int = 8, dtype: str = "bfloat16", variant: str = "vllm_graph") -> CustomAllreduceCase:
    return CustomAllreduceCase(allreduce_dtype=dtype, num_gpus=gpus, message_size=size, backend=variant)


def test_labels_are_the_plans_variants():
    assert ar.KERNEL_SOURCES == VARIANTS["vllm"]
    assert ar.KERNEL_SOURCES["vllm_graph"] == "vLLM_custom_graph"


def test_rank_devices():
    assert ar.rank_devices(1) == ["cuda:0"]
    assert ar.rank_devices(4) == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]


@pytest.mark.parametrize(
    "elements, shape",
    [(128, (1, 128)), (4096, (1, 4096)), (8192, (2, 4096)), (2**29, (131072, 4096)), (6000, (1, 6000))],
)
def test_all_reduce_input_is_message_size_ones_in_rows_of_4096(elements, shape):
    """The input every framework's all-reduce runner times (backends/torch/comm.py all_reduce_input)."""
    torch = pytest.importorskip("torch")
    assert torch_comm.tensor_shape(elements) == shape
    assert shape[0] * shape[1] == elements
    if elements <= 8192:  # allocated on the CPU: the shape, dtype and values the ranks get
        x = torch_comm.all_reduce_input({"allreduce_dtype": "bfloat16", "message_size": elements}, "cpu")
        assert tuple(x.shape) == shape and x.dtype == torch.bfloat16 and bool((x == 1).all())


def test_case_bytes_counts_elements_of_the_dtype():
    assert ar.case_bytes(case(1024)) == 2048
    assert ar.case_bytes(case(1024, dtype="half")) == 2048
    assert ar.case_bytes(case(2**29)) == 1 << 30


@pytest.mark.parametrize(
    "world, sm, symm, expected",
    [
        (2, "90", True, 8 * MiB),  # min(64 MiB, 8 MiB)
        (4, "90", True, 8 * MiB),  # min(32 MiB, 8 MiB)
        (6, "90", True, 512 * 1024),
        (8, "90", True, 256 * 1024),
        (8, "90", False, 8 * MiB),  # no symmetric memory: the default max_size
        (2, "100", True, 2 * MiB),
        (8, "100", True, 1 * MiB),
        (6, "103", True, 8 * MiB),
        (8, "80", True, 8 * MiB),  # an SM without a table entry keeps the default
    ],
)
def test_custom_ar_max_bytes(world, sm, symm, expected):
    assert ar.custom_ar_max_bytes(world, sm, symm) == expected


@pytest.mark.parametrize(
    "world, nbytes, sm, eligible",
    [
        (8, 128 * 1024, "90", True),
        (8, 256 * 1024, "90", False),  # strictly below max_size
        (8, 256 * 1024 - 16, "90", True),
        (8, 14, "90", False),  # 7 bf16 elements: not a multiple of 16 bytes
        (2, 8 * MiB, "90", False),
        (2, 8 * MiB - 16, "90", True),
        (3, 1024, "90", False),  # world sizes 2, 4, 6, 8 only
        (1, 1024, "90", False),
        (16, 1024, "90", False),
        (4, 4 * MiB, "100", False),  # 2 MiB on SM100
        (4, 1 * MiB, "100", True),
    ],
)
def test_custom_ar_eligible(world, nbytes, sm, eligible):
    assert ar.custom_ar_eligible(world, nbytes, sm) is eligible


@pytest.mark.parametrize(
    "world, dtype, nbytes, sm, expected",
    [
        (8, "bfloat16", 128 * 1024, "90", "custom_allreduce"),
        (8, "bfloat16", 256 * 1024, "90", "torch_symm_mem"),  # above custom AR's 256 KiB, within 64 MiB
        (8, "half", 256 * 1024, "90", "pynccl"),  # symm-mem takes bf16 only
        (8, "bfloat16", 64 * MiB, "90", "torch_symm_mem"),  # <= its max
        (8, "bfloat16", 64 * MiB + 16, "90", "pynccl"),
        (4, "bfloat16", 32 * MiB + 16, "90", "pynccl"),
        (2, "bfloat16", 4 * MiB, "90", "custom_allreduce"),
        (3, "bfloat16", 1024, "90", "pynccl"),
        (8, "bfloat16", 256 * 1024, "90", "torch_symm_mem"),
    ],
)
def test_expected_communicator(world, dtype, nbytes, sm, expected):
    assert ar.expected_communicator(world, dtype, nbytes, sm) == expected


def test_expected_communicator_without_symm_mem():
    assert ar.expected_communicator(8, "bfloat16", 256 * 1024, "90", symm_mem=False) == "custom_allreduce"
    assert ar.expected_communicator(8, "bfloat16", 8 * MiB, "90", symm_mem=False) == "pynccl"


def test_calls_per_sample():
    assert torch_comm.SAMPLE_SECONDS == 2e-3 and torch_comm.MAX_CALLS_PER_SAMPLE == 100
    assert torch_comm.calls_per_sample(1e-4) == 20  # 2 ms / 100 us
    assert torch_comm.calls_per_sample(3e-4) == 6  # int(6.67)
    assert torch_comm.calls_per_sample(1e-5) == 100  # 200, capped
    assert torch_comm.calls_per_sample(1e-2) == 1  # one call longer than the target
    assert torch_comm.calls_per_sample(0.0) == 100
    assert torch_comm.calls_per_sample(1e-3, target=1e-2, cap=5) == 5


def test_footprint_by_hand():
    buffers = 8 * MiB + 8 * MiB + 1 * MiB + 8 * MiB  # meta + signal, IPC copy-in buffer, allowance, rank_data
    assert ar.footprint(case(1024)) == 3 * 2048 + buffers + 128 * MiB  # TP8: symm-mem up to 128 MiB (SM100)
    assert ar.footprint(case(1024, gpus=2)) == 3 * 2048 + buffers + 64 * MiB  # TP2: 64 MiB (SM90)
    assert ar.footprint(case(2**29, gpus=4)) == 3 * (1 << 30) + buffers + 32 * MiB
    assert ar.footprint(case(1024, gpus=3)) == 3 * 2048  # no custom all-reduce, no symm-mem table entry


def comm(**parts):
    defaults = dict(pynccl_comm=SimpleNamespace(world_size=8, disabled=False), qr_comm=None, fi_ar_comm=None)
    defaults.update(ca_comm=None, symm_mem_comm=None)
    defaults.update(parts)
    return SimpleNamespace(**defaults)


def part(answer: bool, disabled: bool = False, asks: str = "should_custom_ar"):
    return SimpleNamespace(disabled=disabled, **{asks: lambda x: answer})


def no_nccl_symm(world, x):
    return False


def test_communicator_used_follows_vllms_order():
    x = object()
    symm = part(True, asks="should_use_symm_mem")
    assert ar.communicator_used(comm(ca_comm=part(True), symm_mem_comm=symm), x, no_nccl_symm) == "custom_allreduce"
    assert ar.communicator_used(comm(ca_comm=part(False), symm_mem_comm=symm), x, no_nccl_symm) == "torch_symm_mem"
    assert ar.communicator_used(comm(ca_comm=part(True, disabled=True)), x, no_nccl_symm) == "pynccl"
    assert ar.communicator_used(comm(ca_comm=part(True)), x, lambda w, t: w == 8) == "nccl_symm_mem"
    fi = part(True, asks="should_use_fi_ar")
    assert ar.communicator_used(comm(ca_comm=part(True), fi_ar_comm=fi), x, no_nccl_symm) == "flashinfer"
    assert ar.communicator_used(comm(pynccl_comm=None), x, no_nccl_symm) == "torch.distributed"
    assert ar.communicator_used(None, x, no_nccl_symm) == "none"


def test_measure_row_refuses_without_gpus():
    config = TimingConfig.for_device("cpu")
    with pytest.raises(KernelLimit):
        ar.measure_row([case(1024)], "cpu", config)
    import torch

    if torch.cuda.device_count() < 8:
        with pytest.raises(KernelLimit, match="8 visible GPUs"):
            ar.measure_row([case(1024), case(2048)], "cuda:0", config)
    with pytest.raises(KernelLimit):
        ar.measure_row([case(1024, variant="sglang_graph")], "cuda:0", config)
    with pytest.raises(ValueError):
        ar.measure_row([case(1024), case(2048, gpus=4)], "cuda:0", config)


def test_vllm_only_inside_functions():
    tree = ast.parse(Path(ar.__file__).read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = [a.name for n in top if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in top if isinstance(n, ast.ImportFrom)]
    assert not [n for n in names if n.split(".")[0] in ("vllm", "torch")]
    assert "vllm" not in sys.modules


def test_tables_match_the_release():
    wheels = sorted(WHEELS.glob("vllm-0.24.0-*.whl"))
    if not wheels:
        pytest.skip("no pinned vLLM wheel in .cache/wheels; `nox -s contract-vllm` downloads it (.ci/run does)")
    with zipfile.ZipFile(wheels[-1]) as wheel:
        source = wheel.read("vllm/distributed/device_communicators/all_reduce_utils.py").decode()
    tree = ast.parse(source)
    tables = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in ("CUSTOM_ALL_REDUCE_MAX_SIZES", "SYMM_MEM_ALL_REDUCE_MAX_SIZES"):
                tables[name] = eval(compile(ast.Expression(node.value), "t", "eval"), {"MiB": MiB, "KiB": 1024})
    assert tables["CUSTOM_ALL_REDUCE_MAX_SIZES"] == ar.CUSTOM_AR_SYMM_CAP
    assert tables["SYMM_MEM_ALL_REDUCE_MAX_SIZES"] == ar.SYMM_MEM_MAX
