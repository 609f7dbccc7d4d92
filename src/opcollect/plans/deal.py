"""--shard i/N by predicted time: the units of a whole plan dealt so that N array tasks end together.

A unit is what one worker task times: a batch row (every case of a multi-rank process group) or one case. Units
go, costliest first, each to the shard with the least predicted seconds so far (LPT: the longest shard is within
4/3 of the best possible). Ties break on the op's place in the plan, then the unit's ID, then the lower shard, so
the dealing is a function of the plan and the cost model alone: N disjoint shards whose union is the plan, the
same on every machine. An SM that no systems/*.yaml lists is dealt by case count (each case costs 1).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from opcollect.plans.cost import CaseCost
from opcollect.plans.predict import costing_for, plan_units


@dataclass(frozen=True)
class Dealt:
    count: int
    owner: dict[str, list[int]]  # per op: the shard of each unit, in the op's unit order (rows, or case IDs)
    seconds: tuple[float, ...]  # predicted seconds per shard (case counts where the SM has no system)

    @property
    def balance(self) -> float:
        """The longest shard over the mean: 1.0 when every task ends together."""
        mean = sum(self.seconds) / len(self.seconds)
        return max(self.seconds) / mean if mean > 0 else 1.0


def deal(units: Mapping[str, Sequence[tuple[str, CaseCost]]], count: int) -> Dealt:
    """LPT over every op's units: costliest first, each to the least loaded shard."""
    order = sorted(
        (-cost.seconds, place, unit_id, op, position)
        for place, (op, found) in enumerate(units.items())
        for position, (unit_id, cost) in enumerate(found)
    )
    owner = {op: [0] * len(found) for op, found in units.items()}
    loads = [(0.0, shard) for shard in range(count)]
    for negative, _, _, op, position in order:
        load, shard = heapq.heappop(loads)
        owner[op][position] = shard
        heapq.heappush(loads, (load - negative, shard))
    seconds = [0.0] * count
    for load, shard in loads:
        seconds[shard] = load
    return Dealt(count, owner, tuple(seconds))


def by_count(plan) -> dict[str, list[tuple[str, CaseCost]]]:
    """Units that cost their case count: the dealing of an SM without a system."""
    found = {}
    for name, sel in plan.ops.items():
        if sel.rows is None:
            found[name] = [(case_id, CaseCost(1.0, 1)) for case_id in sel.ids]
        else:
            found[name] = [(row.row_id, CaseCost(float(len(row.case_ids)), 1)) for row in sel.rows]
    return found


def deal_plan(plan, count: int, systems_dir: Path | None = None) -> Dealt:
    """The dealing of a whole planner Plan into ``count`` shards, costed on the system of its SM."""
    if systems_dir is None:
        from opcollect.project import find_project

        systems_dir = find_project().systems
    costing = costing_for(plan.backend, plan.sm, systems_dir)
    return deal(by_count(plan) if costing is None else plan_units(plan, costing), count)
