"""The cost model (plans/cost.py) applied: a plan's predicted device-seconds per op, and after a run, predicted
against measured per op.

A plan is costed on the system of its SM (cost.system_for_sm); a run on the system of the device that ran it. The
measured seconds of a case are its share of its row's wall time, from the task's send to its answer (the records'
wall_seconds: set-up, warm-up, samples, the profiler's call and the round trip). A worker's start (spawn, imports,
probe) is before any task and outside them; its first case's one-time costs are inside the first task, so a run's
first op is predicted with them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, NamedTuple

from opcollect.errors import InputError
from opcollect.plans.cost import CaseCost, Costing, ranked, system_for_sm
from opcollect.plans.ops import OPS
from opcollect.runtime.harness import TimingConfig


@dataclass(frozen=True)
class PlanCost:
    system: str
    ops: dict[str, float]  # device-seconds per op
    worker_start_seconds: float  # once per worker: its start and its first case's one-time costs

    @property
    def total(self) -> float:
        return sum(self.ops.values()) + self.worker_start_seconds


def costing_for(backend: str, sm: str, systems_dir: Path, config: TimingConfig | None = None) -> Costing | None:
    """The cost model of ``backend`` on the system of ``sm``; None when no system has the SM."""
    from opcollect.cases.systems import load_systems

    system = system_for_sm(load_systems(systems_dir), sm)
    return None if system is None else Costing.of(backend, system, config)


def plan_units(plan, costing: Costing) -> dict[str, list[tuple[str, CaseCost]]]:
    """Per op of a planner Plan, its units (cases, or batch rows) and their costs."""
    return {name: costing.units(sel.op, sel.values, sel.ids, sel.rows) for name, sel in plan.ops.items()}


def plan_cost(plan, costing: Costing) -> PlanCost:
    """The predicted device-seconds of a planner Plan per op, and of one worker's start."""
    ops = {name: costing.op_device_seconds(sel.op, sel.values, sel.ids, sel.rows) for name, sel in plan.ops.items()}
    h = costing.harness
    start = h.worker_start_seconds + h.first_case_seconds if any(ops.values()) else 0.0
    return PlanCost(costing.figures.system, ops, start)


def hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 360 else f"{seconds:.1f} s"


class OpCompare(NamedTuple):
    op: str
    cases: int
    predicted: float  # device-seconds
    measured: float

    @property
    def ratio(self) -> float:
        """measured / predicted: over 1, the run took longer than predicted."""
        return self.measured / self.predicted if self.predicted > 0 else math.inf


def compare_run(plan, spent: Mapping[str, Mapping[str, float]], costing: Costing, workers: int = 1) -> list[OpCompare]:
    """Per op of a runtime PlanFile, in plan order: the predicted device-seconds of the cases ``spent`` names (op ->
    case ID -> measured wall seconds) against the measured ones. A batch row is predicted whole and shared by its
    cases; the first single-device op measured carries the first case's one-time costs of ``workers`` workers."""
    found = []
    first = True
    for name, planned in plan.ops.items():
        measured = spent.get(name)
        if not measured:
            continue
        op = OPS[name]
        members = {r.row_id: r.case_ids for r in planned.rows}
        predicted = 0.0
        devices: dict[str, int] = {}
        for unit, cost in costing.units(op, planned.cases, planned.ids, planned.rows):
            ids = members.get(unit, (unit,))
            predicted += cost.device_seconds * sum(1 for c in ids if c in measured) / len(ids)
            devices.update(dict.fromkeys(ids, cost.devices))
        if first and not ranked(op):  # the pool hands collectives out last
            predicted += workers * costing.harness.first_case_seconds
            first = False
        actual = sum(seconds * devices.get(case_id, 1) for case_id, seconds in measured.items())
        found.append(OpCompare(name, len(measured), predicted, actual))
    return found


def describe_compare(compared: Iterable[OpCompare], system: str) -> str:
    rows = list(compared)
    if not rows:
        return ""
    parts = [f"{r.op} {r.predicted:.1f}/{r.measured:.1f} s (x{r.ratio:.2f})" for r in rows]
    predicted, measured = sum(r.predicted for r in rows), sum(r.measured for r in rows)
    ratio = measured / predicted if predicted else math.inf
    return (
        f"cost on {system}, predicted/measured device-seconds (x measured/predicted): {', '.join(parts)}; "
        f"total {predicted:.1f}/{measured:.1f} s (x{ratio:.2f})"
    )


def run_cost(
    plan, spent: Mapping[str, Mapping[str, float]], config: TimingConfig, device: str | None, workers: int = 1
) -> str:
    """A run summary's line: predicted against measured device-seconds per op of the cases it timed, on the system
    of the device that ran (else the plan's SM's), under the run's TimingConfig; "" when no system is known."""
    from opcollect.cases.systems import load_systems, system_for_device
    from opcollect.project import find_project

    try:
        systems = load_systems(find_project().systems)
    except InputError:
        return ""
    system = (system_for_device(systems, device) if device else None) or system_for_sm(systems, plan.sm)
    if system is None:
        return ""
    costing = Costing.of(plan.backend, system, config)
    return describe_compare(compare_run(plan, spent, costing, workers), system.name)
