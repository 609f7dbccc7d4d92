from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opcollect.plans.planner import Planner
from opcollect.project import ProjectTree, find_project

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def project() -> ProjectTree:
    return find_project()


@pytest.fixture(scope="session")
def planner(project) -> Planner:
    """One planner for the session: expansion is shared by every test that plans from the checkout."""
    return Planner(project)


@pytest.fixture
def tree_copy(tmp_path) -> Path:
    """A writable copy of the project's declared inputs (cases, systems, pins, package source)."""
    root = tmp_path / "tree"
    for name in ("cases", "systems", "images"):
        shutil.copytree(ROOT / name, root / name)
    shutil.copytree(ROOT / "src" / "opcollect", root / "src" / "opcollect",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pins.yaml", root / "pins.yaml")
    return root


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 300):
    """`python -m opcollect ARGS` in a real subprocess."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "opcollect", *args],
        cwd=cwd or ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


TESTS = Path(__file__).resolve().parent


def gemm_plan(path: Path, shapes: list[tuple[int, int, int]], backend: str = "torch", dtype: str = "float32") -> Path:
    """A plan file for the CPU with exactly these (m, n, k) GEMM cases, in this order."""
    from opcollect.plans.gemm import GemmCase
    from opcollect.plans.hashes import collector_hash
    from opcollect.plans.planfile import write_plan
    from opcollect.plans.planner import plan_of_cases

    cases = [GemmCase(dtype, m, n, k) for m, n, k in shapes]
    write_plan(plan_of_cases(backend, "cpu", "gemm", cases, "torch.nn.functional.linear", collector_hash(ROOT)), path)
    return path


def faulty_env() -> dict:
    """Environment for subprocesses that load the faulty backend from tests/."""
    return {"PYTHONPATH": str(TESTS) + os.pathsep + os.environ.get("PYTHONPATH", "")}
