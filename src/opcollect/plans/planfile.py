"""The plan file that `opcollect run` executes: JSON, one column list per key field per op.

The runtime reads only this file (never the YAML), so it carries everything a run needs: the
identity (backend, SM, hashes, shard) and per op the table, the case columns, dispatch and batch rows.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from opcollect.errors import InputError
from opcollect.plans.ops import OPS
from opcollect.plans.planner import Plan, Row

FORMAT = "opcollect-plan"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class PlannedOp:
    """One op of a plan file: typed cases in run order, with IDs, dispatch and rows."""

    op: str
    table: str
    family: str
    op_name: str
    cases: list[NamedTuple]
    ids: list[str]
    dispatch: list[str]
    rows: list[Row]  # one per case when the backend declares no batch rows


@dataclass(frozen=True)
class PlanFile:
    backend: str
    sm: str
    collector_hash: str
    plan_hash: str
    shard: tuple[int, int] | None
    smoke: bool
    case_filter: str | None
    model_configs: tuple[str, ...]
    ops: dict[str, PlannedOp]

    @property
    def total_cases(self) -> int:
        return sum(len(p.ids) for p in self.ops.values())


def to_json(plan: Plan) -> dict:
    ops = {}
    for name, sel in plan.ops.items():
        fields = sel.op.fields
        ops[name] = {
            "table": sel.op.table,
            "family": sel.op.family,
            "op_name": sel.op.op_name,
            "fields": list(fields),
            "case_id": sel.ids,
            "dispatch": sel.dispatch,
            "columns": {f: [v[i] for v in sel.values] for i, f in enumerate(fields)},
            "rows": None
            if sel.rows is None
            else [{"row_id": r.row_id, "dispatch": r.dispatch, "case_ids": list(r.case_ids)} for r in sel.rows],
        }
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "backend": plan.backend,
        "sm": plan.sm,
        "collector_hash": plan.collector_hash,
        "plan_hash": plan.plan_hash,
        "shard": None
        if plan.options.shard is None
        else {"index": plan.options.shard[0], "count": plan.options.shard[1]},
        "selection": {
            "ops": list(plan.options.ops),
            "smoke": plan.options.smoke,
            "case_filter": plan.options.case_filter,
            "model_configs": list(plan.model_configs),
        },
        "ops": ops,
    }


def write_atomic(path: Path, text: str) -> None:
    """Write a file so that readers see the old content or the new, never a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_plan(plan: Plan, path: Path) -> None:
    write_atomic(path, json.dumps(to_json(plan), separators=(",", ":")))


def read_plan_json(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise InputError(f"{path}: cannot read plan ({exc.strerror}); write one with `opcollect plan -o`") from None
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{path}: not a plan file (invalid JSON at line {exc.lineno}); write one with `opcollect plan -o`"
        ) from None
    return data


def parse_plan(path: Path, data: dict) -> PlanFile:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InputError(f"{path}: not an opcollect plan file (field 'format' is not {FORMAT!r})")
    if data.get("format_version") != FORMAT_VERSION:
        found = data.get("format_version")
        raise InputError(f"{path}: plan format_version {found!r}; this opcollect reads {FORMAT_VERSION}; re-plan")
    ops = {}
    for name, raw in data["ops"].items():
        op = OPS.get(name)
        if op is None:
            raise InputError(f"{path}: field 'ops.{name}': unknown op; known: {', '.join(OPS)}")
        if list(raw["fields"]) != list(op.fields):
            raise InputError(
                f"{path}: field 'ops.{name}.fields' {raw['fields']} differs from {list(op.fields)}; re-plan"
            )
        columns = [raw["columns"][f] for f in op.fields]
        cases = [op.case_type._make(values) for values in zip(*columns)] if raw["case_id"] else []
        ids = list(raw["case_id"])
        dispatch = list(raw["dispatch"])
        if raw["rows"] is None:
            rows = [Row(case_id, d, (case_id,)) for case_id, d in zip(ids, dispatch)]
        else:
            rows = [Row(r["row_id"], r["dispatch"], tuple(r["case_ids"])) for r in raw["rows"]]
        ops[name] = PlannedOp(name, raw["table"], raw["family"], raw["op_name"], cases, ids, dispatch, rows)
    shard = data.get("shard")
    selection = data.get("selection", {})
    return PlanFile(
        backend=data["backend"],
        sm=data["sm"],
        collector_hash=data["collector_hash"],
        plan_hash=data["plan_hash"],
        shard=None if shard is None else (shard["index"], shard["count"]),
        smoke=bool(selection.get("smoke")),
        case_filter=selection.get("case_filter"),
        model_configs=tuple(selection.get("model_configs", ())),
        ops=ops,
    )


def read_plan(path: Path) -> PlanFile:
    return parse_plan(path, read_plan_json(path))
