"""Cost-model benchmark on the CPU: predicted against measured device-seconds per op of a CPU collection.

Runs two plans through the real `run` path (worker subprocess, pipes, shards), RUNS times each, and compares the
model's prediction (plans/cost.py, on systems/cpu.yaml under the run's TimingConfig) with the records' wall_seconds
(each case's share of its row's wall time, task sent to answer):
  - the CPU smoke plan (`plan --backend torch --sm cpu --smoke`: every op torch times on a CPU, up to 4 cases each)
  - a GEMM ladder whose cases outlast the CPU time cap (fp32, m up to 512 at n = k = 4096), where the kernel's
    predicted time, not the cap, sets the cost
Prints per op the medians of predicted and measured seconds and of their ratio (goal: within 1.5x per op), then the
figures the model's CPU tables come from: the median fraction of speed of light of each op's rows against cpu.yaml's
nominal figures (CPU_EFFICIENCY), and each op's measured seconds per case beyond warm-up and sampling.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from opcollect.plans.bound import bound
from opcollect.plans.cost import Costing
from opcollect.plans.gemm import GemmCase
from opcollect.plans.hashes import installed_collector_hash
from opcollect.plans.ops import OPS
from opcollect.plans.planfile import read_plan, write_plan
from opcollect.plans.planner import Planner, PlanOptions, plan_of_cases
from opcollect.plans.predict import compare_run
from opcollect.project import find_project
from opcollect.runtime.harness import TimingConfig
from opcollect.runtime.run import RunOptions, run_plan
from opcollect.runtime.rundir import read_records
from opcollect.tables.physics import project_systems

RUNS = 3
GOAL = 1.5
LADDER = [GemmCase("float32", m, 4096, 4096) for m in (1, 16, 128, 512)]


def _plans(tmp: Path) -> dict[str, Path]:
    paths = {"smoke": tmp / "smoke.json", "ladder": tmp / "ladder.json"}
    write_plan(Planner(find_project()).plan("torch", "cpu", PlanOptions(smoke=True)), paths["smoke"])
    ladder = plan_of_cases("torch", "cpu", "gemm", LADDER, "torch.nn.functional.linear", installed_collector_hash())
    write_plan(ladder, paths["ladder"])
    return paths


def _one_run(plan_path: Path, run_dir: Path, costing: Costing) -> tuple[dict, list[dict]]:
    run_plan(plan_path, run_dir, RunOptions(device="cpu"))
    records = [r for r in read_records(run_dir) if "wall_seconds" in r]
    spent: dict[str, dict[str, float]] = {}
    for r in records:
        spent.setdefault(r["op"], {})[r["case_id"]] = r["wall_seconds"]
    compared = {c.op: c for c in compare_run(read_plan(plan_path), spent, costing)}
    return compared, records


def _calibration(records: list[dict], plan, costing: Costing) -> dict[str, tuple[int, float | None, float]]:
    """Per op: rows with a bound, their median fraction of speed of light on cpu.yaml, median seconds beyond
    warm-up and sampling."""
    figures = costing.figures
    by_op: dict[str, list[tuple[float | None, float]]] = {}
    cases = {cid: case for op in plan.ops.values() for cid, case in zip(op.ids, op.cases)}
    for r in records:
        if r["status"] != "ok" or r["case_id"] not in cases:
            continue
        op, case, stats = OPS[r["op"]], cases[r["case_id"]], r["stats"]
        work = op.work(case) if op.work is not None else None
        latency = stats["latency"] / 1e3
        b = bound(work, figures).seconds if work is not None else 0.0
        fraction = b / latency if b > 0 and latency > 0 else None
        beyond = r["wall_seconds"] - stats["sampled_seconds"] - stats["warmup_seconds"]
        by_op.setdefault(r["op"], []).append((fraction, beyond))
    found = {}
    for name, rows in by_op.items():
        fractions = [f for f, _ in rows if f is not None]
        median = statistics.median(fractions) if fractions else None
        found[name] = (len(fractions), median, statistics.median(b for _, b in rows))
    return found


def main() -> None:
    system = project_systems()["cpu"]
    costing = Costing.of("torch", system, TimingConfig.for_device("cpu"))
    results: dict[str, list] = {}
    calibration: dict[str, list] = {}
    with tempfile.TemporaryDirectory() as tmp:
        paths = _plans(Path(tmp))
        for run in range(RUNS):
            for name, path in paths.items():
                compared, records = _one_run(path, Path(tmp) / f"{name}-{run}", costing)
                for op, c in compared.items():
                    results.setdefault(f"{name}:{op}", []).append(c)
                for op, row in _calibration(records, read_plan(path), costing).items():
                    calibration.setdefault(f"{name}:{op}", []).append(row)
    print(f"opcollect cost benchmark (CPU, torch, systems/cpu.yaml, median of {RUNS} runs)")
    print(f"  {'plan:op':36s} {'cases':>5s} {'predicted':>10s} {'measured':>10s} {'ratio':>6s}")
    within = 0
    for key, rows in results.items():
        predicted = statistics.median(c.predicted for c in rows)
        measured = statistics.median(c.measured for c in rows)
        ratio = statistics.median(c.ratio for c in rows)
        ok = 1 / GOAL <= ratio <= GOAL
        within += ok
        mark = "" if ok else f"  [outside {GOAL}x]"
        print(f"  {key:36s} {rows[0].cases:5d} {predicted:9.2f}s {measured:9.2f}s {ratio:6.2f}{mark}")
    print(f"  {within} of {len(results)} ops within {GOAL}x (ratio = measured / predicted)")
    print("  calibration (CPU_EFFICIENCY, HARNESS['cpu']): rows with a bound, their median fraction of speed of light")
    print("  on cpu.yaml; seconds per case beyond warm-up and sampling (set-up, calls_for, the profiler's call, the")
    print("  round trip; a collective's: its share of the ranks' start)")
    for key, rows in calibration.items():
        fractions = [f for _, f, _ in rows if f is not None]
        fraction = f"{statistics.median(fractions):.4f}" if fractions else "-"
        beyond = statistics.median(b for _, _, b in rows)
        print(f"    {key:36s} rows {rows[0][0]:2d}  fraction {fraction:>7s}  beyond {beyond * 1e3:7.1f} ms")


if __name__ == "__main__":
    main()
