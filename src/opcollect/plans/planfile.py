"""The plan file that `opcollect run` executes, written here and read by runtime/planfile.py.

The runtime reads only this file (never the YAML, nor the planner), so it carries everything a run needs:
the identity (backend, SM, hashes, shard) and per op the table, fields, dtype field, case columns,
dispatch and batch rows. Where the planner is at hand, a read plan is also held to its ops (check_ops).
"""

from __future__ import annotations

import json
from pathlib import Path

from opcollect.errors import InputError
from opcollect.files import write_atomic
from opcollect.plans.hashes import content_hash
from opcollect.plans.ops import OPS
from opcollect.plans.planner import Plan
from opcollect.runtime import planfile as runtime_plan
from opcollect.runtime.planfile import FORMAT, FORMAT_VERSION, PlanFile, read_plan_json

__all__ = ["FORMAT", "PlanFile", "check_ops", "parse_plan", "read_plan", "read_plan_json", "to_json", "write_plan"]


def _selection(plan: Plan) -> dict:
    return {
        "ops": list(plan.options.ops),
        "smoke": plan.options.smoke,
        "case_filter": plan.options.case_filter,
        "model_configs": list(plan.model_configs),
    }


def to_json(plan: Plan) -> dict:
    ops = {}
    for name, sel in plan.ops.items():
        fields = sel.op.fields
        ops[name] = {
            "table": sel.op.table,
            "family": sel.op.family,
            "op_name": sel.op.op_name,
            "fields": list(fields),
            "dtype_field": sel.op.dtype_field,
            "case_id": sel.ids,
            "dispatch": sel.dispatch,
            "columns": {f: [v[i] for v in sel.values] for i, f in enumerate(fields)},
            "rows": None
            if sel.rows is None
            else [{"row_id": r.row_id, "dispatch": r.dispatch, "case_ids": list(r.case_ids)} for r in sel.rows],
        }
    selection = _selection(plan)
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "backend": plan.backend,
        "sm": plan.sm,
        "collector_hash": plan.collector_hash,
        "plan_hash": plan.plan_hash,
        "content_hash": content_hash(
            plan.backend, plan.sm, plan.plan_hash, plan.options.shard, selection, plan.canonical, presorted=True
        ),
        "shard": None
        if plan.options.shard is None
        else {"index": plan.options.shard[0], "count": plan.options.shard[1]},
        "selection": selection,
        "ops": ops,
    }


def write_plan(plan: Plan, path: Path) -> None:
    write_atomic(path, json.dumps(to_json(plan), separators=(",", ":")))


def check_ops(path: Path, plan: PlanFile) -> PlanFile:
    """``plan`` when every op is one the planner knows, with its fields; else InputError naming the op."""
    for name, planned in plan.ops.items():
        op = OPS.get(name)
        if op is None:
            raise InputError(f"{path}: field 'ops.{name}': unknown op; known: {', '.join(OPS)}; re-plan")
        if planned.fields != op.fields or (planned.table, planned.family) != (op.table, op.family):
            raise InputError(
                f"{path}: field 'ops.{name}.fields': {list(planned.fields)} in {planned.table} differs from "
                f"{list(op.fields)} in {op.table}; re-plan with this collector"
            )
    return plan


def parse_plan(path: Path, data: dict, typed: bool = True) -> PlanFile:
    return check_ops(path, runtime_plan.parse_plan(path, data, typed))


def read_plan(path: Path) -> PlanFile:
    return parse_plan(path, read_plan_json(path))
