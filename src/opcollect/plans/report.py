"""What a plan says to people and tools: the --json summary, per-op CSV tables, a terminal table."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from opcollect.files import write_atomic
from opcollect.names import sm_label
from opcollect.plans import skips
from opcollect.plans.planner import Plan
from opcollect.plans.predict import PlanCost, hours


def summary(plan: Plan, cost: PlanCost | None = None) -> dict:
    """The --json summary; with ``cost`` (plans/cost.py), the predicted device-seconds per op and in all (the ops
    and one worker start), on the system named by cost_system; null where the SM has no system to cost it on."""
    reasons = skips.reasons()
    found = {
        "backend": plan.backend,
        "sm": plan.sm,
        "collector_hash": plan.collector_hash,
        "plan_hash": plan.plan_hash,
        "shard": None if plan.options.shard is None else f"{plan.options.shard[0]}/{plan.options.shard[1]}",
        "cases": plan.total_cases,
        "ops": {
            name: {
                "cases": len(sel.ids),
                "by_dtype": dict(sorted(sel.by_dtype.items())),
                "by_dispatch": dict(sorted(sel.by_dispatch.items())),
                "skipped": {
                    entry: {"count": count, "reason": reasons.get(entry, "")}
                    for entry, count in sorted(sel.skipped.items())
                },
            }
            for name, sel in plan.ops.items()
        },
        "notes": list(plan.notes),
    }
    for name, info in found["ops"].items():
        info["device_seconds"] = None if cost is None else round(cost.ops[name], 3)
    found["device_seconds"] = None if cost is None else round(cost.total, 3)
    found["cost_system"] = None if cost is None else cost.system
    found["worker_start_seconds"] = None if cost is None else cost.worker_start_seconds
    return found


def write_tables(plan: Plan, directory: Path) -> list[Path]:
    """<op>.csv per op: case_id, dispatch and the key columns, one row per case in run order."""
    written = []
    for name, sel in plan.ops.items():
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["case_id", "dispatch", *sel.op.fields])
        writer.writerows(
            [case_id, dispatch, *values] for case_id, dispatch, values in zip(sel.ids, sel.dispatch, sel.values)
        )
        path = Path(directory) / f"{name}.csv"
        write_atomic(path, buffer.getvalue())
        written.append(path)
    return written


def _cost(s: dict) -> str:
    if s.get("device_seconds") is None:
        return "; no cost predicted (no systems/*.yaml has this SM)"
    return (
        f"; predicted {hours(s['device_seconds'])} on {s['cost_system']} "
        f"({hours(s['worker_start_seconds'])} of it a worker's start)"
    )


def render(summaries: list[dict], terminal: bool) -> str:
    """A rich table on a terminal; plain aligned text when piped."""
    rows = []
    for s in summaries:
        for op, info in s["ops"].items():
            skipped = sum(e["count"] for e in info["skipped"].values())
            dtypes = ", ".join(f"{k}:{v}" for k, v in info["by_dtype"].items())
            dispatch = ", ".join(info["by_dispatch"])
            seconds = info.get("device_seconds")
            cost = "-" if seconds is None else hours(seconds)
            rows.append((s["backend"], s["sm"], op, str(info["cases"]), str(skipped), cost, dtypes, dispatch))
    header = ("backend", "sm", "op", "cases", "skipped", "predicted", "by dtype", "dispatch")
    footer = [
        f"{sm_label(s['backend'], s['sm'])}: {s['cases']} cases, plan_hash {s['plan_hash'][:16]}{_cost(s)}"
        for s in summaries
    ]
    footer += list(dict.fromkeys(f"note: {note}" for s in summaries for note in s.get("notes", ())))
    if terminal:
        from rich.console import Console
        from rich.table import Table

        table = Table(*header, title="opcollect plan")
        for row in rows:
            table.add_row(*row)
        console = Console(record=True, width=160)
        with console.capture() as capture:
            console.print(table)
            for line in footer:
                console.print(line)
        return capture.get()
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in [header, *rows]]
    return "\n".join(lines + footer) + "\n"
