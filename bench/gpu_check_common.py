"""What the gpu_check modules share: paths, the check context and result, the report (JSON and table),
the carried reference rows and the prepared plans. Imports only the standard library and pydantic-free
opcollect modules, lazily."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

ROOT = Path(__file__).resolve().parents[1]
# a committed slice of the reference table (Apache-2.0, see bench/data/README.md)
REFERENCE = ROOT / "bench" / "data" / "vllm-0.24.0-h200-gemm-bf16.csv"
# git-ignored: made by `gpu_check.py --prepare` where the project is installed, carried to the device
# (GPU_CHECK_DATA names another folder, for tests)
PREPARED = Path(os.environ.get("GPU_CHECK_DATA") or ROOT / "bench" / "gpu_check_data")
E2E_OPS = ("gemm", "attention_context", "attention_generation", "moe", "mla_context", "mla_generation")

Status = Literal["pass", "fail", "deferred", "skip"]


@dataclass(frozen=True)
class Context:
    device: str  # cuda:0, or cpu for a rehearsal of plan_e2e
    workdir: Path  # run directories and logs; under the --out folder so they come back with it
    out_dir: Path

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: Status
    summary: str  # one line
    figures: dict = field(default_factory=dict)
    seconds: float = 0.0


@dataclass(frozen=True)
class Report:
    environment: dict
    results: list[CheckResult]
    total_seconds: float
    budget_seconds: float

    @property
    def exit_code(self) -> int:
        failed = any(r.status == "fail" for r in self.results)
        return 1 if failed or self.total_seconds > self.budget_seconds else 0


def first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""


def rel(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def guarded(name: str, function: Callable[[Context], CheckResult], ctx: Context) -> CheckResult:
    """Run one check; an exception is a failed check with its last frames, and the next check still runs."""
    started = time.perf_counter()
    try:
        result = function(ctx)
    except Exception as exc:  # a check that raises failed; the others still run
        tail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-4:])
        result = CheckResult(name, "fail", f"{type(exc).__name__}: {first_line(str(exc))}", {"traceback": tail})
    return dataclasses.replace(result, name=name, seconds=round(time.perf_counter() - started, 2))


def needs_cuda(name: str, ctx: Context) -> CheckResult | None:
    """A skip for a check that times a GPU, when the caller asked for a CPU rehearsal."""
    return None if ctx.cuda else CheckResult(name, "skip", f"needs a CUDA device, asked for {ctx.device}")


def within(measured: float, expected: float, tolerance: float) -> bool:
    return expected > 0 and abs(measured / expected - 1) <= tolerance


def median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


# -- data ------------------------------------------------------------------------------------------
def reference_rows(path: Path = REFERENCE) -> list[dict]:
    """The carried bf16 GEMM rows: m, n, k as int, latency (ms) as float, the other columns as text."""
    if not path.is_file():
        return []
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(line for line in handle if not line.startswith("#")))
    for row in rows:
        row.update(m=int(row["m"]), n=int(row["n"]), k=int(row["k"]), latency=float(row["latency"]))
    return rows


def plan_path(sm: str) -> Path:
    return PREPARED / f"torch-sm{sm}.plan.json"


def plan_state(sm: str) -> tuple[bool, str]:
    """(usable, what the prepared plan for ``sm`` is): missing, stale (other collector source) or fresh."""
    from opcollect.errors import InputError
    from opcollect.plans.hashes import collector_hash
    from opcollect.runtime.planfile import read_plan

    path = plan_path(sm)
    if not path.is_file():
        return False, f"missing ({rel(path)}): run `python bench/gpu_check.py --prepare` where the project is installed"
    try:
        plan = read_plan(path)
    except InputError as exc:
        return False, f"unreadable: {exc}"
    here = collector_hash(ROOT)
    if plan.collector_hash != here:
        return False, (
            f"stale: planned by collector {plan.collector_hash[:12]}, this checkout is {here[:12]}; "
            "re-run --prepare and carry bench/gpu_check_data again"
        )
    return True, f"fresh, {plan.total_cases} cases ({', '.join(plan.ops)}), {rel(path)}"


def prepared_plans() -> dict[str, str]:
    """What --prepare left, per SM; the SM90 state (missing) when it left nothing."""
    from opcollect.names import SMS

    return {sm: plan_state(sm)[1] for sm in SMS if plan_path(sm).is_file()} or {"90": plan_state("90")[1]}


# -- the report ------------------------------------------------------------------------------------
def environment(device: str) -> dict:
    env = {"python": platform.python_version(), "device": device, "argv": sys.argv[1:]}
    try:
        import torch

        env["torch"] = torch.__version__
        env["cuda"] = torch.version.cuda
        if device.startswith("cuda") and torch.cuda.is_available():
            env["device_name"] = torch.cuda.get_device_name(torch.device(device))
            props = torch.cuda.get_device_properties(torch.device(device))
            env["sm"] = f"{props.major}{props.minor}"
            env["l2_bytes"] = int(getattr(props, "L2_cache_size", 0) or 0)
    except ImportError:
        env["torch"] = None
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    return env


def write_report(report: Report, out: Path | None) -> None:
    if out is None:
        return
    data = {
        "environment": report.environment,
        "total_seconds": round(report.total_seconds, 1),
        "budget_seconds": report.budget_seconds,
        "exit_code": report.exit_code,
        "checks": [dataclasses.asdict(r) for r in report.results],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2, default=str) + "\n")


def read_report(path: Path) -> Report:
    data = json.loads(Path(path).read_text())
    results = [CheckResult(**r) for r in data["checks"]]
    return Report(data["environment"], results, data["total_seconds"], data["budget_seconds"])


def render_row(result: CheckResult) -> str:
    return f"{result.name:20} {result.status.upper():8} {result.seconds:7.1f} s  {result.summary}"


def render_table(report: Report) -> str:
    lines = [f"{'check':20} {'status':8} {'time':>9}  summary"]
    lines += [render_row(r) for r in report.results]
    over = report.total_seconds > report.budget_seconds
    lines.append(
        f"total {report.total_seconds:.0f} s of {report.budget_seconds:.0f} s"
        + (" (OVER BUDGET: fails)" if over else "")
        + f"; exit {report.exit_code}"
    )
    return "\n".join(lines)
