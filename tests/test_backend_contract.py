"""The backend contract: every backend module is a Backend, every (op, dispatch) its plans emit has a runner,
runners route by framework version, and the runtime reads plans without the planner, cases or YAML."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import typing

import pytest
from conftest import ROOT

from opcollect.backends import load_backend
from opcollect.images.pins import load_pins
from opcollect.names import BACKENDS, SMS
from opcollect.runtime.contract import Backend, KernelLimit, Prepared, Registry, Runner

BUILT = [b for b in BACKENDS if importlib.util.find_spec(f"opcollect.backends.{b}") is not None]


@pytest.mark.parametrize("backend", BUILT)
def test_every_backend_module_is_a_backend(backend):
    module = load_backend(backend)
    members = [m for m in typing.get_type_hints(Backend)] + [
        name for name, value in vars(Backend).items() if callable(value) and not name.startswith("_")
    ]
    missing = [m for m in members if not hasattr(module, m)]
    assert not missing, f"{backend} lacks {missing}"
    assert isinstance(module.RUNNERS, Registry)


@pytest.mark.parametrize("backend", BUILT)
def test_every_planned_op_and_dispatch_has_a_runner(planner, backend):
    module = load_backend(backend)
    # a framework's runners serve its pinned version (version routes); torch's serve every version
    version = None if backend == "torch" else load_pins(ROOT / "pins.yaml").pin(backend)[0]
    missing = set()
    for sm in SMS:
        plan = planner.plan(backend, sm)
        for name, selection in plan.ops.items():
            for dispatch in set(selection.dispatch):
                try:
                    module.RUNNERS.find(name, dispatch, version)
                except KernelLimit:
                    missing.add((sm, name, dispatch))
    assert not missing, f"{backend}: no runner for {sorted(missing)[:10]}"


def _prepare(*args):
    return Prepared(lambda: None, "k")


def test_registry_routes_by_version_and_dispatch():
    registry = Registry("demo")
    old = Runner(lambda c: 1, _prepare, versions=frozenset({"1.3.0rc20"}))
    new = Runner(lambda c: 2, _prepare, versions=frozenset({"1.3.0rc23"}))
    block = Runner(lambda c: 3, _prepare)
    registry.add("gemm", old)
    registry.add("gemm", new)
    registry.add("gemm", block, dispatches=("fp8_block",))
    assert registry.find("gemm", "cutlass", "1.3.0rc20") is old
    assert registry.find("gemm", "cutlass", "1.3.0rc23") is new
    assert registry.find("gemm", "fp8_block", "1.3.0rc20") is block  # an exact dispatch wins over any
    with pytest.raises(KernelLimit, match="no runner for gemm dispatch 'cutlass' at 1.2.0"):
        registry.find("gemm", "cutlass", "1.2.0")
    with pytest.raises(KernelLimit, match="no runner for moe"):
        registry.find("moe", "triton", "1.3.0rc20")
    with pytest.raises(ValueError, match="exactly one of prepare and measure_row"):
        registry.add("comm", Runner(lambda c: 0))


def test_the_runtime_imports_no_planner_cases_or_yaml():
    code = (
        "import json, sys\n"
        "import opcollect.runtime.run, opcollect.runtime.worker, opcollect.runtime.planfile\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, check=True).stdout)
    banned = ("opcollect.plans.planner", "opcollect.plans.ops", "opcollect.cases", "opcollect.tables")
    banned += ("yaml", "pydantic")
    assert [m for m in loaded if m.startswith(banned)] == []
    assert "opcollect.runtime.planfile" in loaded


def test_the_runtime_reads_a_plan_as_typed_cases(tmp_path):
    from conftest import gemm_plan

    from opcollect.runtime.planfile import read_plan

    plan = read_plan(gemm_plan(tmp_path / "plan.json", [(1, 2, 3), (4, 5, 6)]))
    cases = plan.ops["gemm"].cases
    assert [(c.m, c.n, c.k) for c in cases] == [(1, 2, 3), (4, 5, 6)]
    assert plan.ops["gemm"].fields == ("gemm_dtype", "m", "n", "k")
    data = json.loads((tmp_path / "plan.json").read_text())
    data["ops"]["gemm"]["fields"] = ["gemm_dtype", "m", "n", "kk"]
    (tmp_path / "edited.json").write_text(json.dumps(data))
    with pytest.raises(Exception, match=r"field 'ops.gemm.fields': .*'kk'\] are not the fields"):
        read_plan(tmp_path / "edited.json")


def test_the_run_summary_counts_rows_that_ran_another_kernel(tmp_path):
    from conftest import fake_run

    from opcollect.plans.gemm import GemmCase
    from opcollect.runtime.run import _dispatch_misses, describe_run_dir

    cases = [GemmCase("fp8_block", m, 4096, 7168) for m in (1, 64)]
    run = fake_run(tmp_path / "run", cases, kernel_source="DeepGemmFp8BlockScaledMMKernel")
    assert describe_run_dir(run, 2).endswith("; every row ran the kernel its plan named")
    records = [
        {
            "status": "ok",
            "dispatch": "DeepGemmFp8BlockScaledMMKernel",
            "kernel_source": "CutlassFp8BlockScaledMMKernel",
        },
        {
            "status": "ok",
            "dispatch": "DeepGemmFp8BlockScaledMMKernel",
            "kernel_source": "DeepGemmFp8BlockScaledMMKernel",
        },
        {"status": "failed", "dispatch": "DeepGemmFp8BlockScaledMMKernel", "error_class": "oom"},
    ]
    assert _dispatch_misses(records) == (
        "; 1 rows ran another kernel than the plan named: "
        "DeepGemmFp8BlockScaledMMKernel ran CutlassFp8BlockScaledMMKernel (1)"
    )
