"""What the consumer-estimate tests share: a TABLES tree of our kinds merged from fake runs, the consumer's CLI
estimate and its per-op answers over it.

The tree is merged by our own merge from run directories written as `run` writes them (conftest.fake_run), with
framework identities (vLLM 0.24.0, SGLang 0.5.14, TensorRT-LLM 1.3.0rc20 on an H200) and a latency formula per op.
Each op's cases are the ones our planner plans for that backend at SM 90, narrowed to a compact grid by a
predicate per op. Used by test_consumer_estimates.py (issues 22 and 23), test_consumer_estimates_sparse.py (issue 24)
and test_consumer_estimates_linear.py (issue 25).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path
from typing import Callable, Mapping, NamedTuple

import pyarrow.parquet as pq
from conftest import ROOT, cases_of, fake_run
from test_consumer import DRIVER, SYSTEM

from opcollect.plans.hashes import collector_hash
from opcollect.plans.planner import PlanOptions
from opcollect.project import find_project
from opcollect.tables.merge import merge

VERSIONS = {"vllm": "0.24.0", "sglang": "0.5.14", "trtllm": "1.3.0rc20"}


def build_tables(
    base: Path,
    planner,
    ops: Mapping[str, tuple[str, ...]],
    keep: Mapping[str, Callable],
    latency: Mapping[str, Callable] | Callable[[str], Mapping[str, Callable]],
    version_of: Callable[[str, str], str] = lambda backend, op: VERSIONS[backend],
) -> Path:
    """One run directory per (backend, op, dispatch) of the compact grid, merged into one TABLES tree;
    ``latency``: each op's latency of a case, or a backend's such mapping; ``version_of(backend, op)``: the framework
    version its runs report (the tree's version directory)."""
    runs = []
    digest = collector_hash(ROOT)  # once: every run of one tree carries the same collector (merge requires it)
    for backend, backend_ops in ops.items():
        plan = planner.plan(backend, "90", PlanOptions(ops=backend_ops))
        latency_of = latency(backend) if callable(latency) else latency
        for op, selection in plan.ops.items():
            by_dispatch: dict[str, list] = {}
            for case, dispatch in zip(cases_of(selection), selection.dispatch):
                if keep[op](case):
                    by_dispatch.setdefault(dispatch, []).append(case)
            assert by_dispatch, f"{backend} {op}: the compact grid keeps none of the planned cases"
            for n, (dispatch, cases) in enumerate(sorted(by_dispatch.items())):
                name = f"{backend}_{op}_{n}"
                runs.append(
                    fake_run(
                        base / name,
                        cases,
                        op=op,
                        backend=backend,
                        version=version_of(backend, op),
                        latency_of=latency_of[op],
                        kernel_source=dispatch,
                        run_id=name,
                        digest=digest,
                    )
                )
    tables = base / "TABLES"
    merge(runs, tables, find_project(), say=lambda _: None)
    return tables


def rows(tables: Path, family: str, backend: str, table: str, version: str | None = None) -> list[dict]:
    version = version or VERSIONS[backend]
    return pq.read_table(tables / SYSTEM / family / backend / version / f"{table}.parquet").to_pylist()


def ask(
    python: Path, root: Path, backend: str, queries: list[dict], tmp: Path, version: str | None = None
) -> list[dict]:
    """test_consumer.ask for any backend at its version here (or at ``version``)."""
    version = version or VERSIONS[backend]
    request, answer = tmp / f"request-{backend}-{version}.json", tmp / f"answer-{backend}-{version}.json"
    request.write_text(
        json.dumps({"root": str(root), "system": SYSTEM, "backend": backend, "version": version, "queries": queries})
    )
    done = subprocess.run([str(python), str(DRIVER), str(request), str(answer)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(answer.read_text())
    assert "error" not in result, result["error"]
    return result["answers"]


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


class Estimate(NamedTuple):
    model: str  # its config ships inside the consumer: no download
    backend: str
    args: tuple[str, ...]
    op: str  # an op of the estimate's breakdown, and the source the consumer gives it
    source: str
    version: str | None = None  # the framework version estimated at: VERSIONS[backend] unless named


def estimate(python: Path, root: Path, e: Estimate, batch_size: int = 8) -> tuple[int, str]:
    """`aiconfigurator cli estimate` of ``e`` from the tree at ``root`` alone: rc and output."""
    done = subprocess.run(
        [
            str(python.parent / "aiconfigurator"),
            "cli",
            "estimate",
            "--model-path",
            e.model,
            "--system",
            SYSTEM,
            "--backend",
            e.backend,
            "--perf-db-version",
            e.version or VERSIONS[e.backend],
            "--systems-paths",
            str(root),  # this tree alone: not 'default', the consumer's built-in systems
            "--estimate-mode",
            "static",
            "--isl",
            "1024",
            "--osl",
            "128",
            "--batch-size",
            str(batch_size),
            "--tp-size",
            "8",
            *e.args,
            "--detail",
            "time,source",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={"PATH": str(python.parent), "AIC_STRICT_PROVENANCE": "1", "HOME": str(root.parent)},
    )
    return done.returncode, done.stdout + done.stderr


def metrics(output: str) -> dict[str, float]:
    """TTFT and TPOT (ms) of an estimate's summary."""
    found = {m: re.search(rf"{m}:\s*([0-9]+\.[0-9]+)", output) for m in ("TTFT", "TPOT")}
    return {m: float(f.group(1)) for m, f in found.items() if f}


def sources(output: str) -> dict[str, str]:
    """Every op of the estimate and its source, from the 'Data Source Breakdown (per-op)' section."""
    section = output.split("Data Source Breakdown", 1)[-1] if "Data Source Breakdown" in output else ""
    return dict(re.findall(r"^\s+((?:context|generation)_\w+)\s+(\w+)\s*$", section, re.MULTILINE))


def breakdown(output: str) -> dict[str, str]:
    """Each op line of the phase tables (latency, SOL, share and source as printed): for comparing two estimates."""
    return dict(re.findall(r"^\s+((?:context|generation)_\w+)\s+([0-9].*\])\s*$", output, re.MULTILINE))
