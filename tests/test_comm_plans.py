"""Communication: NCCL collectives (nccl_perf) and a framework's own all-reduce (custom_allreduce_perf).

message_size counts elements of the dtype, as the reference; the four collectives and two dtypes are
planned with the reference's sizes; custom_allreduce carries its graph/eager variant in the key; the torch
CPU comm plan runs for real on gloo; gloo's one gap (fp8) is a skip; merge writes the reference's columns,
NCCL's table under comm/nccl/<NCCL version>/ (on the CPU gloo-<torch version>), as the consumer reads it.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import REFERENCE, TESTS, cases_of, fake_run, run_cli

from opcollect.backends.torch import comm as torch_comm
from opcollect.plans import comm, skips
from opcollect.plans.comm import CommCase, CustomAllreduceCase
from opcollect.plans.planner import PlanOptions
from opcollect.project import find_project
from opcollect.runtime.rundir import read_records
from opcollect.tables.compare import compare_tables
from opcollect.tables.merge import merge
from opcollect.tables.rules import check_tables
from opcollect.tables.schema import schema_for_op

FRAMEWORKS = ("vllm", "sglang", "trtllm")
COLLECTIVES = {"all_reduce", "all_gather", "reduce_scatter", "alltoall"}
NCCL_KEY = ("op_name", "nccl_dtype", "num_gpus", "message_size")
SLICE = yaml.safe_load((TESTS / "data" / "reference" / "custom_allreduce_slice.yaml").read_text())


class RecordingDist:
    """A torch.distributed stand-in that records the tensors each collective gets."""

    def __init__(self):
        self.calls: list[tuple[str, list]] = []

    def _record(self, name):
        return lambda *tensors: self.calls.append((name, list(tensors)))

    def __getattr__(self, name):
        if name in ("all_reduce", "all_gather_single", "reduce_scatter_single", "all_to_all_single"):
            return self._record(name)
        raise AttributeError(name)


@pytest.mark.parametrize("dtype, width", [("half", 2), ("int8", 1)])
@pytest.mark.parametrize("op_name", sorted(COLLECTIVES))
def test_message_size_counts_elements_of_the_dtype(dtype, width, op_name):
    import torch

    case = CommCase(dtype, op_name, 8, 1 << 20)
    dist = RecordingDist()
    call, moved = torch_comm.collective(case._asdict(), 8, "cpu", dist, torch)
    call()
    [(name, tensors)] = dist.calls
    sizes = sorted(t.numel() * t.element_size() for t in tensors)
    assert moved == sizes[-1] == width * case.message_size  # a half row of message_size N moves 2N bytes
    assert all(t.dtype == {"half": torch.float16, "int8": torch.int8}[dtype] for t in tensors)
    expected = {  # bytes of (input, output) per rank, as nccl-tests counts message sizes
        "all_reduce": ("all_reduce", [width << 20]),
        "all_gather": ("all_gather_single", [width << 20, width << 17]),  # (output, input)
        "reduce_scatter": ("reduce_scatter_single", [width << 17, width << 20]),
        "alltoall": ("all_to_all_single", [width << 20, width << 20]),
    }[op_name]
    assert (name, [t.numel() * t.element_size() for t in tensors]) == expected
    assert torch_comm.footprint(case) == sum(expected[1])
    assert comm.message_bytes(dtype, case.message_size) == width << 20


def test_a_size_that_does_not_split_over_the_ranks_is_a_kernel_limit():
    from opcollect.runtime.contract import KernelLimit

    assert torch_comm.buffer_elements("all_reduce", 6, 4) == (6, 0)
    with pytest.raises(KernelLimit, match="does not split evenly over 4 ranks"):
        torch_comm.buffer_elements("all_gather", 6, 4)


def _reference_nccl_keys() -> set[tuple]:
    table = pq.read_table(REFERENCE / "comm/nccl/2.29.2/nccl_perf.parquet", columns=list(NCCL_KEY))
    return set(zip(*(table[c].to_pylist() for c in NCCL_KEY)))


@pytest.mark.parametrize("backend", [*FRAMEWORKS, "torch"])
def test_collectives_and_dtypes_are_planned_with_the_reference_sizes(planner, backend):
    selection = planner.plan(backend, "90", PlanOptions(ops=("comm",))).ops["comm"]
    planned = {tuple(getattr(c, f) for f in NCCL_KEY) for c in cases_of(selection)}
    reference = _reference_nccl_keys()
    assert len(reference) == 504
    assert planned == reference  # 4 collectives x {half, int8} x {2, 4, 8} GPUs x 21 sizes: the same keys
    assert {k[0] for k in planned} == COLLECTIVES and {k[1] for k in planned} == {"half", "int8"}
    sizes = {d: sorted({k[3] for k in planned if k[1] == d}) for d in ("half", "int8")}
    assert (sizes["half"][0], sizes["half"][-1]) == (256, 268435456)  # elements: 512 B .. 512 MiB
    assert (sizes["int8"][0], sizes["int8"][-1]) == (512, 536870912)
    assert set(selection.by_dispatch) == {"NCCL"} and not selection.skipped
    assert "comm:half:op_name=all_gather,num_gpus=8,message_size=1024" in selection.ids
    # one process group per (dtype, num_gpus) times all of its collectives and sizes
    assert sorted(len(row.case_ids) for row in selection.rows) == [84] * 6
    assert "comm:int8:num_gpus=4" in {row.row_id for row in selection.rows}


def test_the_cpu_grid_is_tiny_and_uses_dtypes_gloo_runs(planner):
    selection = planner.plan("torch", "cpu", PlanOptions(ops=("comm",))).ops["comm"]
    cases = cases_of(selection)
    assert len(cases) == 24 and set(selection.by_dispatch) == {"gloo"}
    assert {c.op_name for c in cases} == COLLECTIVES and {c.nccl_dtype for c in cases} == {"half", "int8"}
    assert {c.num_gpus for c in cases} == {2} and len({c.message_size for c in cases}) == 3


def _custom_keys(selection) -> set[tuple]:
    return {(c.allreduce_dtype, c.num_gpus, c.message_size, c.backend) for c in cases_of(selection)}


@pytest.mark.parametrize("backend", FRAMEWORKS)
def test_custom_allreduce_is_planned_as_the_reference(planner, backend):
    reference = SLICE[backend]
    extra = reference["columns"][-1][0]  # backend (vLLM, SGLang) or implementation (TRT-LLM)
    assert extra == ("implementation" if backend == "trtllm" else "backend")
    selection = planner.plan(backend, "90", PlanOptions(ops=("custom_allreduce",))).ops["custom_allreduce"]
    planned = _custom_keys(selection)
    assert len(planned) == len(selection.ids) == reference["rows"]  # 69 keys per variant, one row each
    assert sorted({k[1] for k in planned}) == reference["num_gpus"]
    assert sorted({k[2] for k in planned}) == reference["message_size"]  # 128 .. 536,870,912 elements
    assert sorted({k[3] for k in planned}) == reference[extra]
    names = [name for name, _ in reference["columns"]]
    dispatch = dict(zip(selection.ids, selection.dispatch))
    for row in reference["slice"]:
        values = dict(zip(names, row))
        key = (values["allreduce_dtype"], values["num_gpus"], values["message_size"], values[extra])
        assert key in planned, key
        case_id = "custom_allreduce:{}:num_gpus={},message_size={},backend={}".format(*key)
        assert dispatch[case_id] == values["kernel_source"]  # the plan predicts the reference's kernel
    others = sum(len(v) for f, v in comm.VARIANTS.items() if f != backend) * 69
    assert selection.skipped == {"custom-allreduce-own-variants-only": others}


def test_custom_allreduce_is_not_planned_for_torch(planner):
    for sm in ("90", "cpu"):
        selection = planner.plan("torch", sm, PlanOptions(ops=("custom_allreduce",))).ops["custom_allreduce"]
        assert selection.ids == [] and selection.skipped == {"torch-no-custom-allreduce": 5 * 69}
    assert "no all-reduce of its own" in skips.reasons()["torch-no-custom-allreduce"]
    from opcollect.backends.torch import RUNNERS

    for sm in ("90", "cpu"):
        torch_ops = {op for op, selection in planner.plan("torch", sm).ops.items() if selection.ids}
        assert "comm" in torch_ops and torch_ops <= RUNNERS.ops()  # a runner for every op torch plans


def test_the_variant_is_part_of_the_custom_allreduce_key():
    vllm, trtllm = schema_for_op("custom_allreduce", "vllm"), schema_for_op("custom_allreduce", "trtllm")
    assert vllm.key_columns[-1] == "backend" and trtllm.key_columns[-1] == "implementation"
    for schema in (vllm, trtllm):
        columns = [(f.name, str(f.type)) for f in schema.perf]
        reference = [tuple(c) for c in SLICE[schema.backend]["columns"]]
        assert columns[: len(reference)] == reference  # after latency, as the reference
    nccl = schema_for_op("comm")
    assert nccl.key_columns == (
        "framework",
        "version",
        "device",
        "op_name",
        "kernel_source",
        "nccl_dtype",
        "num_gpus",
        "message_size",
    )
    reference = pq.read_schema(REFERENCE / "comm/nccl/2.29.2/nccl_perf.parquet")
    assert nccl.perf.names[: len(reference.names)] == reference.names


def test_gloo_skips_fp8_and_says_why(tmp_path):
    [group] = comm.expand(
        comm.CommGrid(op_names=["all_reduce"], dtypes=["fp8"], num_gpus=[2], message_size={"fp8": [1024]}), {}
    )
    decision = skips.decide("torch", "comm", "cpu", "gloo", group, {})
    assert decision.kept == [] and decision.skipped == {"gloo-no-fp8": 1}
    assert skips.decide("torch", "comm", "90", "NCCL", group, {}).skipped != {"gloo-no-fp8": 1}
    assert 'Invalid scalar type"' in skips.reasons()["gloo-no-fp8"]
    # the reason holds on this torch build: gloo refuses float8 for every collective, and runs half and int8
    code = f"""
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="file://{tmp_path / "rendezvous"}", rank=0, world_size=1)
from opcollect.backends.torch.comm import collective
for dtype in ("fp8", "half", "int8"):
    for op in ("all_reduce", "all_gather", "reduce_scatter", "alltoall"):
        call, _ = collective({{"nccl_dtype": dtype, "op_name": op, "message_size": 64}}, 1, "cpu", dist, torch)
        try:
            call()
            print(dtype, op, "ok")
        except RuntimeError as exc:
            print(dtype, op, exc)
dist.destroy_process_group()  # as the comm runner ends its group: gloo can abort at exit with one left open
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert [line.split(" ", 2)[2] for line in lines] == ["Invalid scalar type"] * 4 + ["ok"] * 8, lines


def test_the_torch_cpu_comm_plan_runs_for_real(tmp_path):
    """custom_allreduce is planned with no case for torch: its op is in the plan and gets no (empty) table."""
    plan, out = tmp_path / "p.json", tmp_path / "r"
    planned = run_cli("plan", "--backend", "torch", "--sm", "cpu", "--ops", "comm,custom_allreduce", "-o", str(plan))
    assert planned.returncode == 0, planned.stderr
    done = run_cli("run", "--plan", str(plan), "--out", str(out), "--device", "cpu", "--max-case-seconds", "0.05")
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_records(out)
    assert len(records) == 24 and all(r["status"] == "ok" for r in records), [r for r in records if r["status"] != "ok"]
    assert {r["kernel_source"] for r in records} == {"gloo"}
    assert Counter(r["case_id"].split(",")[0].split("=")[1] for r in records) == {op: 6 for op in COLLECTIVES}
    tables = tmp_path / "tables"
    merge([out], tables, find_project())
    import torch

    gloo = f"gloo-{torch.__version__.split('+')[0]}"  # the NCCL version the torch backend reports on the CPU
    assert [p.relative_to(tables).as_posix() for p in tables.rglob("nccl_perf.parquet")] == [
        f"cpu/comm/nccl/{gloo}/nccl_perf.parquet"
    ]
    perf = pq.read_table(tables / f"cpu/comm/nccl/{gloo}/nccl_perf.parquet")
    assert set(perf["op_name"].to_pylist()) == COLLECTIVES and set(perf["nccl_dtype"].to_pylist()) == {"half", "int8"}
    assert set(perf["version"].to_pylist()) == {gloo}
    assert yaml.safe_load((tables / "cpu.yaml").read_text())["misc"]["nccl_version"] == gloo
    assert not list(tables.glob("**/custom_allreduce_perf.parquet"))
    assert [f for f in check_tables(tables) if not f.warning] == []


def _custom_cases(variants: tuple[str, ...]) -> list[CustomAllreduceCase]:
    return [CustomAllreduceCase("bfloat16", g, s, v) for g in (2, 8) for s in (128, 1048576) for v in variants]


def _nccl_cases() -> list[CommCase]:
    return [CommCase(d, op, 8, s) for d, s in (("half", 256), ("int8", 512)) for op in sorted(COLLECTIVES)]


def test_merge_of_custom_allreduce_and_nccl_runs_writes_the_reference_columns(tmp_path):
    runs = [
        fake_run(tmp_path / "custom", _custom_cases(("vllm_graph", "vllm_eager")), op="custom_allreduce"),
        fake_run(tmp_path / "nccl", _nccl_cases(), op="comm", run_id="r2"),
        fake_run(
            tmp_path / "trt",
            _custom_cases(("trtllm",)),
            op="custom_allreduce",
            backend="trtllm",
            version="1.3.0rc20",
            run_id="r3",
        ),
    ]
    tables = tmp_path / "tables"
    written = {w.path: w.rows for w in merge(runs, tables, find_project())}
    assert written == {
        "h200_sxm/comm/vllm/0.24.0/custom_allreduce_perf.parquet": 8,
        "h200_sxm/comm/nccl/2.26.2/nccl_perf.parquet": 8,  # NCCL's, whoever collected it
        "h200_sxm/comm/trtllm/1.3.0rc20/custom_allreduce_perf.parquet": 4,
    }
    extras = ["latency_p25", "latency_p75", "samples", "noise", "timing", "case_id"]
    for backend, version in (("vllm", "0.24.0"), ("trtllm", "1.3.0rc20")):
        perf = pq.read_table(tables / f"h200_sxm/comm/{backend}/{version}/custom_allreduce_perf.parquet")
        reference = [tuple(c) for c in SLICE[backend]["columns"]]
        assert [(f.name, str(f.type)) for f in perf.schema][: len(reference)] == reference
        assert perf.schema.names[len(reference) :] == extras
        assert set(perf["op_name"].to_pylist()) == {"all_reduce"}
        extra = reference[-1][0]
        variants = {"vllm": {"vllm_graph", "vllm_eager"}, "trtllm": {"trtllm"}}[backend]
        assert set(perf[extra].to_pylist()) == variants
    assert not (tables / "h200_sxm/comm/vllm/0.24.0/nccl_perf.parquet").exists()
    nccl = pq.read_table(tables / "h200_sxm/comm/nccl/2.26.2/nccl_perf.parquet")
    reference = pq.read_schema(REFERENCE / "comm/nccl/2.29.2/nccl_perf.parquet")
    assert [(f.name, f.type) for f in nccl.schema][: len(reference)] == [(f.name, f.type) for f in reference]
    rows = nccl.to_pylist()
    assert {r["op_name"] for r in rows} == COLLECTIVES  # each row's op_name is its collective
    assert all(f"op_name={r['op_name']}," in r["case_id"] for r in rows)
    assert {(r["framework"], r["version"]) for r in rows} == {("VLLM", "2.26.2")}  # the version is NCCL's
    assert yaml.safe_load((tables / "h200_sxm.yaml").read_text())["misc"]["nccl_version"] == "2.26.2"
    # R1-R6 hold: the graph and eager rows of one size are distinct keys (R2), op_name matches the case (R6)
    assert [f for f in check_tables(tables) if not f.warning] == []
    # merging again over the stored tables reads TRT-LLM's implementation column back
    again = merge([runs[2]], tables, find_project())
    assert [(w.rows, w.failures) for w in again] == [(4, 0)]


def test_check_flags_an_op_name_other_than_the_case_s(tmp_path):
    run = fake_run(tmp_path / "nccl", _nccl_cases(), op="comm")
    tables = tmp_path / "tables"
    merge([run], tables, find_project())
    path = tables / "h200_sxm/comm/nccl/2.26.2/nccl_perf.parquet"
    perf = pq.read_table(path)
    names = perf["op_name"].to_pylist()
    swapped = pa.array(["all_reduce" if n == "all_gather" else n for n in names], pa.string())
    pq.write_table(perf.set_column(perf.schema.get_field_index("op_name"), "op_name", swapped), path)
    findings = [f.render() for f in check_tables(tables) if f.rule == "R6"]
    assert len(findings) == 1 and "op_name is not the one its case ID names" in findings[0]
    assert "comm:half:op_name=all_gather,num_gpus=8,message_size=256" in findings[0]


def test_compare_reads_trtllm_s_implementation_column(tmp_path):
    run = fake_run(
        tmp_path / "trt", _custom_cases(("trtllm",)), op="custom_allreduce", backend="trtllm", version="1.3.0rc20"
    )
    tables = tmp_path / "tables"
    merge([run], tables, find_project())
    names = [name for name, _ in SLICE["trtllm"]["columns"]]
    columns = list(zip(*SLICE["trtllm"]["slice"]))
    old = tmp_path / "custom_allreduce_perf.parquet"
    pq.write_table(pa.table({n: list(c) for n, c in zip(names, columns)}), old)
    result = compare_tables(old, tables / "h200_sxm/comm/trtllm/1.3.0rc20")
    assert result.table == "custom_allreduce_perf" and result.shared == 4  # num_gpus 2, 8 x sizes 128, 1048576


def test_readme_and_grid_say_elements():
    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    assert "elements" in readme and "custom_allreduce" in readme
    assert "ELEMENTS" in (root / "cases/base_ops/comm.yaml").read_text()
