"""bench/gpu_check.py on a CPU-only machine: the dry run imports every module the GPU checks import with
pydantic unavailable (the device has none), lists the checks and the carried reference rows, exits 0."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.py"
REFERENCE = ROOT / "bench" / "data" / "vllm-0.24.0-h200-gemm-bf16.csv"
CHECKS = ("harness_vs_profiler", "two_kernel_gap", "eager_fallback", "illegal_address", "plan_e2e", "gemm_reference")
# stands in for the device: any import of pydantic raises, in this process and in every child it starts
BLOCKER = """\
import sys


class _NoPydantic:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "pydantic":
            raise ImportError("pydantic is not installed on the device")
        return None


sys.meta_path.insert(0, _NoPydantic())
"""


def _run(tmp_path: Path, *args: str, block: bool = True, **env_extra: str) -> subprocess.CompletedProcess:
    """``python ARGS`` in tmp_path; with ``block``, as on the device: pydantic cannot be imported."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | env_extra
    if block:
        blocker = tmp_path / "no_pydantic"
        blocker.mkdir(exist_ok=True)
        (blocker / "sitecustomize.py").write_text(BLOCKER)
        env["PYTHONPATH"] = str(blocker)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)


def _snapshot(tmp_path: Path) -> Path:
    """gpu_check.py of a copy of the checkout: its collector_hash holds still while others edit src/."""
    copy = tmp_path / "checkout"
    skip = shutil.ignore_patterns("__pycache__", "gpu_check_data", "*.egg-info")
    for name in ("src", "cases", "systems", "images", "bench"):
        shutil.copytree(ROOT / name, copy / name, ignore=skip)
    for name in ("pins.yaml", "pyproject.toml"):
        shutil.copy2(ROOT / name, copy / name)
    return copy / "bench" / "gpu_check.py"


def _checks(report: Path) -> dict[str, dict]:
    return {c["name"]: c for c in json.loads(report.read_text())["checks"]}


def _reference_count() -> int:
    with open(REFERENCE, newline="") as handle:
        return sum(1 for _ in csv.DictReader(line for line in handle if not line.startswith("#")))


def test_the_blocker_stands_in_for_the_device(tmp_path):
    done = _run(tmp_path, "-c", "import pydantic")
    assert done.returncode != 0 and "not installed on the device" in done.stderr


def test_dry_run_lists_checks_and_reference_rows_without_pydantic(tmp_path):
    done = _run(tmp_path, str(SCRIPT), "--dry-run")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "pydantic never imported" in done.stdout
    assert "IMPORT PROBLEM" not in done.stdout
    listed = [line.split()[0] for line in done.stdout.split("checks:\n")[1].splitlines() if line.startswith("  ")]
    assert tuple(listed[: len(CHECKS)]) == CHECKS
    rows = _reference_count()
    assert rows >= 100  # the carried slice: every m of the slice for every (n, k), bf16 only
    assert f"reference rows: {rows} bf16 GEMM rows of vLLM 0.24.0 on NVIDIA H200" in done.stdout
    assert "prepared plan sm" in done.stdout  # fresh, stale or missing: the dry run says which


def test_dry_run_fails_when_a_device_module_would_import_pydantic(tmp_path):
    # the planner imports pydantic (cases/): put it on the device path and the dry run must refuse
    code = (
        f"import sys; sys.argv = [{str(SCRIPT)!r}]; sys.path.insert(0, {str(SCRIPT.parent)!r}); import gpu_check; "
        "gpu_check.DEVICE_MODULES += ('opcollect.plans.planner',); raise SystemExit(gpu_check.dry_run())"
    )
    done = _run(tmp_path, "-c", code)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "IMPORT PROBLEM: opcollect.plans.planner" in done.stdout


def test_reference_slice_is_bf16_vllm_h200_with_its_license():
    with open(REFERENCE, newline="") as handle:
        rows = list(csv.DictReader(line for line in handle if not line.startswith("#")))
    assert {(r["framework"], r["version"], r["device"], r["gemm_dtype"]) for r in rows} == {
        ("VLLM", "0.24.0", "NVIDIA H200", "bfloat16")
    }
    assert len({(r["m"], r["n"], r["k"]) for r in rows}) == len(rows)
    assert "Apache License" in (REFERENCE.parent / "LICENSE").read_text()


@pytest.mark.runs_plan
def test_illegal_address_rehearsal_replaces_the_pool_worker(tmp_path):
    # on the CPU the fault is simulated (the same message torch raises): the pool's side of the check runs
    done = _run(tmp_path, str(SCRIPT), "--device", "cpu", "--only", "illegal_address", "--out", "out/r.json")
    assert done.returncode == 0, done.stdout + done.stderr
    check = _checks(tmp_path / "out" / "r.json")["illegal_address"]
    assert check["status"] == "skip" and check["summary"].startswith("CPU rehearsal")  # never a pass off the GPU
    figures = check["figures"]
    assert figures["wild"]["error_class"] == "unexpected" and figures["workers_started"] == 2
    assert figures["after"]["status"] == "ok" and figures["after"]["runtime_id"] == "w0.2"


@pytest.mark.runs_plan
def test_plan_e2e_rehearsal_defers_merge_to_the_host_and_host_finish_completes_it(tmp_path):
    script, data = str(_snapshot(tmp_path)), str(tmp_path / "prepared")
    prepared = _run(tmp_path, script, "--prepare", block=False, GPU_CHECK_DATA=data)
    assert prepared.returncode == 0, prepared.stdout + prepared.stderr
    assert (tmp_path / "prepared" / "torch-smcpu.plan.json").is_file()

    args = ("--device", "cpu", "--only", "plan_e2e", "--out", "out/gpu_check.json")
    done = _run(tmp_path, script, *args, GPU_CHECK_DATA=data)
    assert done.returncode == 0, done.stdout + done.stderr
    check = _checks(tmp_path / "out" / "gpu_check.json")["plan_e2e"]
    assert check["status"] == "deferred", check
    steps = check["figures"]["steps"]
    assert steps["run_killed"]["recorded_at_kill"] >= 1 and not steps["run_killed"]["finished_before_kill"]
    assert steps["run_killed"]["workers_left"] == 0
    assert steps["resume"]["rc"] == 0 and steps["resume"]["recorded"] == check["figures"]["planned"]
    assert steps["resume"]["run_ids"] == 2 and steps["resume"]["remeasured"] == []
    assert steps["merge"].startswith("deferred to the host")

    finished = _run(tmp_path, script, "--host-finish", "out", "--out", "host.json", block=False)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    check = _checks(tmp_path / "host.json")["plan_e2e"]
    assert check["status"] == "pass", check
    assert check["figures"]["steps"]["merge"]["rc"] == 0 and check["figures"]["steps"]["check"]["rc"] == 0
