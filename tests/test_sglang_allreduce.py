"""The SGLang all-reduce runner's pure builders, on the CPU, against values computed by hand; sglang is never
imported."""

from __future__ import annotations

import ast
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from opcollect.backends.sglang import allreduce as ar
from opcollect.plans.comm import VARIANTS, CustomAllreduceCase
from opcollect.runtime.contract import KernelLimit
from opcollect.runtime.harness import TimingConfig

KiB, MiB = 1 << 10, 1 << 20
WHEELS = Path(__file__).resolve().parents[1] / ".cache" / "wheels"  # .ci/run's `nox -s contract-sglang` fills it


def case(size: int, gpus: int = 8, dtype: str = "bfloat16", variant: str = "sglang_graph") -> CustomAllreduceCase:
    return CustomAllreduceCase(allreduce_dtype=dtype, num_gpus=gpus, message_size=size, backend=variant)


def test_labels_are_the_plans_variants():
    assert ar.KERNEL_SOURCES == VARIANTS["sglang"]
    assert ar.KERNEL_SOURCES["sglang_graph"] == "SGLang_CustomAllReduce_graph"
    assert ar.KERNEL_SOURCES["sglang_eager"] == "SGLang_CustomAllReduce_eager"


def test_case_bytes_counts_elements_of_the_dtype():
    assert ar.case_bytes(case(1024)) == 2048
    assert ar.case_bytes(case(1024, dtype="half")) == 2048


@pytest.mark.parametrize("sm, table", [("90", "other"), ("100", "sm100"), ("103", "sm100"), ("120", "other")])
def test_family(sm, table):
    assert ar.family(sm) == table


@pytest.mark.parametrize(
    "world, nvlink, version",
    [(2, True, "v2"), (3, True, "v2"), (8, True, "v2"), (2, False, "v1"), (4, False, None), (1, True, None)],
)
def test_custom_ar_version(world, nvlink, version):
    assert ar.custom_ar_version(world, nvlink) == version
    assert ar.custom_ar_version(16) is None


@pytest.mark.parametrize(
    "world, sm, nvlink, expected",
    [(8, "90", True, 16 * MiB), (2, "100", True, 16 * MiB), (5, "90", True, 16 * MiB), (2, "90", False, 8 * MiB)],
)
def test_custom_ar_max_bytes(world, sm, nvlink, expected):
    assert ar.custom_ar_max_bytes(world, sm, nvlink) == expected
    assert ar.custom_ar_max_bytes(9, sm, nvlink) == 0
    assert ar.custom_ar_max_bytes(4, sm, nvlink=False) == 0


@pytest.mark.parametrize(
    "world, nbytes, nvlink, eligible",
    [
        (8, 16 * MiB, True, True),  # inclusive: inp_size <= max_size
        (8, 16 * MiB + 16, True, False),
        (8, 14, True, False),  # 7 bf16 elements: not a multiple of 16 bytes
        (8, 16, True, True),
        (3, 1024, True, True),  # V2 serves 2 to 8 GPUs, odd counts too
        (1, 1024, True, False),
        (16, 1024, True, False),
        (2, 8 * MiB, False, True),  # legacy, two GPUs without NVLink: 8 MiB inclusive
        (2, 8 * MiB + 16, False, False),
        (4, 1024, False, False),  # more than two GPUs need NVLink
    ],
)
def test_custom_ar_eligible(world, nbytes, nvlink, eligible):
    assert ar.custom_ar_eligible(world, nbytes, "90", nvlink) is eligible


@pytest.mark.parametrize(
    "world, nbytes, sm, algo",
    [
        (8, 160 * KiB, "90", "one_shot_push"),
        (8, 160 * KiB + 16, "90", "two_shot_pull"),  # H200 TP8: push and pull thresholds equal
        (4, 384 * KiB, "90", "one_shot_push"),
        (4, 384 * KiB + 16, "90", "two_shot_pull"),  # above the 256 KiB pull threshold
        (2, 2 * MiB + 16, "90", "one_shot_pull"),  # INF pull threshold clipped to the 16 MiB buffer
        (2, 16 * MiB, "90", "one_shot_pull"),
        (2, 4 * MiB, "100", "one_shot_push"),
        (8, 720 * KiB, "100", "one_shot_push"),
        (8, 1 * MiB, "100", "two_shot_pull"),
        (3, 600 * KiB, "100", "one_shot_push"),
        (3, 600 * KiB, "90", "two_shot_pull"),
    ],
)
def test_v2_algorithm(world, nbytes, sm, algo):
    assert ar.v2_algorithm(world, nbytes, sm) == algo


@pytest.mark.parametrize(
    "world, nbytes, graphed, nvlink, expected",
    [
        (8, 1 * MiB, True, True, "custom_allreduce_v2"),
        (8, 1 * MiB, False, True, "custom_allreduce_v2"),
        (8, 32 * MiB, True, True, "pynccl"),  # past max_size: pynccl, on only inside graph_capture
        (8, 32 * MiB, False, True, "torch.distributed"),
        (2, 4 * MiB, True, False, "custom_allreduce"),  # the legacy one
        (2, 12 * MiB, False, False, "torch.distributed"),
        (4, 1024, True, False, "pynccl"),
        (8, 14, False, True, "torch.distributed"),
    ],
)
def test_expected_communicator(world, nbytes, graphed, nvlink, expected):
    assert ar.expected_communicator(world, nbytes, "90", graphed, nvlink) == expected


def test_footprint_by_hand():
    fixed = MiB + 64 * 131073 + 16 * MiB  # signals, graph parameters, pull buffer
    assert ar.footprint(case(1024)) == 3 * 2048 + fixed + 2 * 8 * 720 * KiB  # TP8: SM100's 720 KiB push size
    assert ar.footprint(case(1024, gpus=2)) == 3 * 2048 + fixed + 2 * 2 * 4 * MiB
    assert ar.footprint(case(2**29, gpus=4)) == 3 * (1 << 30) + fixed + 2 * 4 * 2 * MiB
    assert ar.footprint(case(1024, gpus=16)) == 3 * 2048  # no custom all-reduce


def comp(disabled: bool = False, asks: str = "should_custom_ar", answer: bool = True, name: str = "CustomAllReduceV2"):
    return type(name, (), {"disabled": disabled, asks: lambda self, x: answer})()


def group(**parts):
    fields = dict(world_size=8, pynccl_comm=SimpleNamespace(disabled=True), pymscclpp_comm=None, ca_comm=None)
    fields.update(qr_comm=None, torch_symm_mem_comm=None, is_symmetric_memory_enabled=lambda: False)
    fields.update(parts)
    return SimpleNamespace(**fields)


def test_communicator_used_follows_sglangs_order():
    x = object()
    assert ar.communicator_used(group(ca_comm=comp()), x, False) == "custom_allreduce_v2"
    assert ar.communicator_used(group(ca_comm=comp(name="CustomAllreduce")), x, False) == "custom_allreduce"
    assert ar.communicator_used(group(ca_comm=comp(answer=False)), x, True) == "pynccl"
    assert ar.communicator_used(group(ca_comm=comp(answer=False)), x, False) == "torch.distributed"
    assert ar.communicator_used(group(ca_comm=comp(disabled=True)), x, False) == "torch.distributed"
    symm = group(ca_comm=comp(), is_symmetric_memory_enabled=lambda: True)
    assert ar.communicator_used(symm, x, False) == "pynccl_symm_mem"
    mscclpp = comp(asks="should_mscclpp_allreduce")
    assert ar.communicator_used(group(ca_comm=comp(), pymscclpp_comm=mscclpp), x, False) == "pymscclpp"
    qr = comp(asks="should_quick_allreduce")
    assert ar.communicator_used(group(ca_comm=comp(answer=False), qr_comm=qr), x, False) == "quick_allreduce"
    tsm = comp(asks="should_torch_symm_mem_allreduce")
    assert ar.communicator_used(group(torch_symm_mem_comm=tsm), x, True) == "torch_symm_mem"
    enabled = group(pynccl_comm=SimpleNamespace(disabled=False))
    assert ar.communicator_used(enabled, x, False) == "pynccl"
    assert ar.communicator_used(group(pynccl_comm=None), x, True) == "torch.distributed"
    assert ar.communicator_used(group(world_size=1), x, True) == "none"
    assert ar.communicator_used(None, x, True) == "none"


def test_measure_row_refuses_before_sglang():
    config = TimingConfig.for_device("cpu")
    with pytest.raises(KernelLimit):
        ar.measure_row([case(1024)], "cpu", config)
    import torch

    if torch.cuda.device_count() < 8:
        with pytest.raises(KernelLimit, match="8 visible GPUs"):
            ar.measure_row([case(1024), case(2048)], "cuda:0", config)
    with pytest.raises(KernelLimit, match="no all-reduce variant"):
        ar.measure_row([case(1024, variant="vllm_graph")], "cuda:0", config)
    with pytest.raises(ValueError):
        ar.measure_row([case(1024), case(2048, gpus=4)], "cuda:0", config)
    with pytest.raises(ValueError):
        ar.measure_row([case(1024), case(2048, variant="sglang_eager")], "cuda:0", config)
    assert "sglang" not in sys.modules


def test_sglang_only_inside_functions():
    tree = ast.parse(Path(ar.__file__).read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = [a.name for n in top if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in top if isinstance(n, ast.ImportFrom)]
    assert not [n for n in names if n.split(".")[0] in ("sglang", "sgl_kernel", "torch")]
    assert "sglang" not in sys.modules


def release_tables(wheel: Path) -> dict:
    """THRESHOLD_2_SHOT_MAP's two tables (SM100 first), max_pull_size's default and the legacy sizes, read from
    the release's source without importing it."""
    with zipfile.ZipFile(wheel) as whl:
        v2 = whl.read("sglang/srt/distributed/device_communicators/custom_all_reduce_v2.py").decode()
        v1 = whl.read("sglang/srt/distributed/device_communicators/custom_all_reduce.py").decode()
    names = {"ModeConfig": lambda push, pull: (push, pull), "KB": KiB, "MB": MiB, "INF": 1 << 60}
    tables = []
    for node in ast.walk(ast.parse(v2)):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "THRESHOLD_2_SHOT_MAP":
            tables.append(eval(compile(ast.Expression(node.value), "t", "eval"), names))
    legacy = {}
    for node in ast.walk(ast.parse(v1)):
        if isinstance(node, ast.ClassDef) and node.name == "CustomAllreduce":
            for stmt in node.body:  # the class body's CUDA values (the ROCm and MUSA ones sit under `if`)
                if isinstance(stmt, ast.Assign):
                    legacy[stmt.targets[0].id] = eval(compile(ast.Expression(stmt.value), "t", "eval"))
    return {
        "sm100": tables[0],
        "other": tables[1],
        "pull": "max_pull_size = 16 * 1024 * 1024" in v2,
        "legacy": legacy,
    }


def test_tables_match_the_release():
    wheels = sorted(WHEELS.glob("sglang-0.5.14-*.whl"))
    if not wheels:
        pytest.skip("no pinned SGLang wheel in .cache/wheels; `nox -s contract-sglang` downloads it (.ci/run does)")
    found = release_tables(wheels[-1])
    assert found["sm100"] == ar.V2_THRESHOLDS["sm100"]
    assert found["other"] == ar.V2_THRESHOLDS["other"]
    assert found["pull"] and ar.V2_PULL_BYTES == 16 * MiB
    assert found["legacy"] == {"_SUPPORTED_WORLD_SIZES": list(ar.V1_WORLD_SIZES), "_MAX_CAR_SIZE": ar.V1_MAX}
