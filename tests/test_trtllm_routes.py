"""TensorRT-LLM's version routes: both pins of pins.yaml find a runner for every (op, dispatch) their plans emit,
an unpinned version finds none of TensorRT-LLM's own, and the backend looks runners up by the version it finds
installed (the one thing faked here: no tensorrt_llm can be installed on this machine)."""

from __future__ import annotations

import pytest
from conftest import ROOT

import opcollect.backends.trtllm as trtllm
from opcollect.backends.trtllm.context import SERVED_VERSIONS
from opcollect.images.pins import load_pins
from opcollect.plans.gemm import GemmCase
from opcollect.runtime.contract import ANY_DISPATCH, KernelLimit

PINNED = sorted(load_pins(ROOT / "pins.yaml").backends["trtllm"].versions)


def test_the_served_versions_are_the_pins():
    assert sorted(SERVED_VERSIONS) == PINNED == ["1.3.0rc20", "1.3.0rc23"]


# ops whose runner exists at some pins only: the MSA modules' route is 1.3.0rc23's (backends/trtllm/msa.py), and
# their reference table too; at another pin each row is refused with one line naming the version
LATER_ROUTES = {"msa_context_module": ["1.3.0rc23"], "msa_generation_module": ["1.3.0rc23"]}


@pytest.mark.parametrize("version", PINNED)
@pytest.mark.parametrize("sm", ["90", "100"])
def test_each_pin_has_a_runner_for_every_planned_op_and_dispatch(planner, version, sm):
    plan = planner.plan("trtllm", sm)
    pairs = {(name, d) for name, selection in plan.ops.items() for d in set(selection.dispatch)}
    assert len(pairs) >= 10
    assert set(LATER_ROUTES) <= {name for name, _ in pairs}
    for name, dispatch in sorted(pairs):
        if version not in LATER_ROUTES.get(name, PINNED):
            with pytest.raises(KernelLimit, match=f"no runner for {name} dispatch '{dispatch}' at {version}$"):
                trtllm.RUNNERS.find(name, dispatch, version)
            continue
        runner = trtllm.RUNNERS.find(name, dispatch, version)
        assert runner.versions is None or version in runner.versions


def test_an_unpinned_version_finds_no_tensorrt_llm_runner():
    for op in sorted(trtllm.RUNNERS.ops() - {"comm"}):
        with pytest.raises(KernelLimit, match=f"no runner for {op} .* at 1.3.0rc24"):
            trtllm.RUNNERS.find(op, ANY_DISPATCH, "1.3.0rc24")
    assert trtllm.RUNNERS.find("comm", "NCCL", "1.3.0rc24")  # NCCL as torch times it: every version


def test_the_backend_routes_by_the_installed_version(monkeypatch):
    case = GemmCase("bfloat16", 8, 256, 512)
    for version in PINNED:
        monkeypatch.setattr(trtllm, "installed_version", lambda v=version: v)
        assert trtllm.footprint("gemm", case) >= (8 * 512 + 8 * 256 + 256 * 512) * 2
    monkeypatch.setattr(trtllm, "installed_version", lambda: "1.2.0")
    with pytest.raises(KernelLimit, match="at 1.2.0"):
        trtllm.footprint("gemm", case)


def test_without_tensorrt_llm_identity_names_the_framework_missing():
    from opcollect.errors import FrameworkMissing

    with pytest.raises(FrameworkMissing, match="TensorRT-LLM is not installed here"):
        trtllm.identity("cpu")
