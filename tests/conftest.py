from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import types
from pathlib import Path
from typing import Any, Callable

import pytest

from opcollect.plans.planner import Planner
from opcollect.project import ProjectTree, find_project

ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    # Tests send SIGINT as a user's Ctrl-C. A suite started in the background by a non-interactive shell (`cmd &`)
    # inherits SIGINT ignored, and so would every opcollect it starts: give it Python's own handler back here,
    # which the children then start with too (an ignored signal stays ignored across exec; a handled one does not).
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_addoption(parser):
    parser.addoption(
        "--require-docker",
        action="store_true",
        help="fail, instead of skipping, the tests that need a Docker engine when none answers",
    )
    parser.addoption(
        "--require-slurm",
        action="store_true",
        help="fail, instead of skipping, the tests that need a Slurm cluster when none answers",
    )


@pytest.fixture(scope="session")
def docker_client(request):
    """A real Docker engine with the local base image; CI passes --require-docker so these never skip there."""
    try:
        import docker

        client = docker.from_env()
        client.ping()
        client.images.get("opcollect-local/torch-cpu:latest")
        return client
    except Exception as exc:  # no engine, or no local base image
        if request.config.getoption("--require-docker"):
            pytest.fail(f"a Docker engine with opcollect-local/torch-cpu:latest is required: {exc}")
        pytest.skip(f"no Docker engine with the local base image: {exc}")


@pytest.fixture(scope="session")
def project() -> ProjectTree:
    return find_project()


@pytest.fixture(scope="session")
def planner(project) -> Planner:
    """One planner for the session: expansion is shared by every test that plans from the checkout."""
    return Planner(project)


@contextlib.contextmanager
def runner_pending_lifted():
    """Plans without skip runner-pending (plans/skips.py): the grids and dispatch the frameworks get once their
    runners land, held to the reference tables now."""
    from opcollect.plans.skips import SKIPS

    [entry] = [e for e in SKIPS if e.name == "runner-pending"]
    SKIPS.remove(entry)
    try:
        yield
    finally:
        SKIPS.append(entry)


@pytest.fixture(scope="module")
def pending_runners_lifted():
    """runner_pending_lifted for a whole test module (its module-scoped plans included)."""
    with runner_pending_lifted():
        yield


def cases_of(selection) -> list:
    """The typed cases a plan keeps for one op, in run order."""
    return list(map(selection.op.case_type._make, selection.values))


@pytest.fixture
def tree_copy(tmp_path) -> Path:
    """A writable copy of the project's declared inputs (cases, systems, pins, package source)."""
    root = tmp_path / "tree"
    for name in ("cases", "systems", "images"):
        shutil.copytree(ROOT / name, root / name)
    shutil.copytree(
        ROOT / "src" / "opcollect", root / "src" / "opcollect", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("pins.yaml", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, root / name)
    return root


def made_release(root: Path, files: dict[str, str]) -> Path:
    """A made-up framework release under ``root``: {relative path: source}."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def randn(*shape, seed: int = 0):
    """A standard-normal CPU tensor from its own seeded generator: the same values in every run."""
    import torch

    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def made_runner(tmp_path: Path, backend: str, text: str, name: str = "gemm.py") -> Path:
    """A backends tree holding one runner module of ``backend`` with ``text``; returns the backends folder."""
    runners = tmp_path / "src" / "opcollect" / "backends" / backend
    runners.mkdir(parents=True)
    (runners / name).write_text(text)
    return runners.parent


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
# a slice of the aiconfigurator H200 reference tables, so a fresh clone tests without ../shared
REFERENCE = TESTS / "data" / "reference" / "aiconfigurator-h200"


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


def fake_run(
    run_dir: Path,
    cases: list,
    *,
    status: dict | None = None,
    latency: float = 1.0,
    run_id: str = "r1",
    recorded_at: str = "2026-11-30T00:00:00.000+00:00",
    device: str = "NVIDIA H200",
    version: str = "0.24.0",
    backend: str = "vllm",
    sm: str = "90",
    digest: str | None = None,
    op: str = "gemm",
    nccl_version: str | None = "2.26.2",
    latency_of: Callable[[Any], float] | None = None,
    kernel_source: str = "cutlass",
    ran_of: Callable[[Any], tuple[str, str]] | None = None,
) -> Path:
    """A run directory written the way `run` writes one, with chosen outcomes instead of measurements;
    ``ran_of(case)``: the (ran, expected_ran) of a measured case, when its runner reports what ran beneath the
    label."""
    from opcollect.plans.hashes import collector_hash
    from opcollect.plans.planfile import read_plan, write_plan
    from opcollect.plans.planner import plan_of_cases
    from opcollect.runtime.rundir import prepare_run_dir
    from opcollect.runtime.shards import ShardWriter

    plan_path = run_dir.parent / f"{run_dir.name}-plan.json"
    write_plan(plan_of_cases(backend, sm, op, cases, kernel_source, digest or collector_hash(ROOT)), plan_path)
    plan = read_plan(plan_path)
    prepare_run_dir(run_dir, plan_path, plan, resume=(run_dir / "run.json").exists())
    writer = ShardWriter(run_dir / "shards" / f"{run_id}-w0.jsonl")
    writer.append_runtime(
        {
            "runtime_id": f"{run_id}.w0.1",
            "worker": 0,
            "worker_device": "cuda:0",
            "framework": backend,
            "version": version,
            "python": "3.12.3",
            "torch": "2.8.0",
            "cuda": "12.8",
            "driver": "570.1",
            "nccl_version": nccl_version,
            "device": device,
            "host": "node1",
        }
    )
    outcomes = status or {}
    for case_id, case in zip(plan.ops[op].ids, plan.ops[op].cases):
        record = {
            "case_id": case_id,
            "op": op,
            "dispatch": kernel_source,
            "attempt": 1,
            "plan_hash": plan.plan_hash,
            "collector_hash": plan.collector_hash,
            "run_id": run_id,
            "worker": 0,
            "runtime_id": f"{run_id}.w0.1",
            "recorded_at": recorded_at,
        }
        outcome = outcomes.get(case_id, "ok")
        if outcome == "ok":
            value = latency_of(case) if latency_of is not None else latency
            record.update(
                status="ok",
                kernel_source=kernel_source,
                **(dict(zip(("ran", "expected_ran"), ran_of(case))) if ran_of is not None else {}),
                stats={
                    "latency": value,
                    "latency_p25": value * 0.99,
                    "latency_p75": value * 1.01,
                    "samples": 10,
                    "noise": 0.02,
                    "timing": "graph",
                    "sm_clock_mhz": 1980.0,
                },
            )
        elif outcome != "missing":
            record.update(status="failed", error_class=outcome, message=f"{outcome} here")
        if outcome != "missing":
            writer.append(record)
    writer.close()
    (run_dir / "events" / f"{run_id}.json").write_text(
        json.dumps(
            {
                "run_id": run_id,
                "collected_at": recorded_at,
                "finished_at": recorded_at,
                "host": "node1",
                "shard": None,
                "rows": 0,
                "failures": 0,
                "image_digest": None,
                "devices": ["cuda:0"],
            }
        )
    )
    return run_dir


def slurm_says(tmp_path: Path, monkeypatch, sacct: str, squeue: str = "") -> None:
    """Stand-in sacct and squeue first on PATH, each printing the given text as Slurm's own prints its states
    (``JOBID_TASK|STATE`` lines): for the states a real one-node cluster cannot be made to show (REQUEUED, FAILED)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for command, out in (("sacct", sacct), ("squeue", squeue)):
        script = bin_dir / command
        script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{out}EOF\n")
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def llama_config(tmp_path: Path, **config):
    """A small Llama config.json (hidden 1024, 8 heads, intermediate 4096) with ``config``'s keys over it, read."""
    from opcollect.cases.profiles import read_hf_config

    base = {"architectures": ["LlamaForCausalLM"], "hidden_size": 1024, "num_attention_heads": 8}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**base, "intermediate_size": 4096, **config}))
    return read_hf_config(path)


def install_fakes(monkeypatch, modules: dict[str, dict]) -> None:
    """Fake modules (and their parent packages) in sys.modules for the test's length, with the given attributes."""
    for name, attrs in modules.items():
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            pkg = ".".join(parts[:i])
            if not getattr(sys.modules.get(pkg), "_fake", False):
                module = types.ModuleType(pkg)
                module._fake, module.__path__ = True, []
                monkeypatch.setitem(sys.modules, pkg, module)
                if i > 1:
                    setattr(sys.modules[".".join(parts[: i - 1])], parts[i - 1], module)
        for key, value in attrs.items():
            setattr(sys.modules[name], key, value)
