"""The plan file that `opcollect run` executes: JSON, one column list per key field per op.

The runtime reads only this file (never the YAML), so it carries everything a run needs: the
identity (backend, SM, hashes, shard) and per op the table, the case columns, dispatch and batch rows.
Reading a plan re-derives every case ID from its columns and recomputes content_hash (and, for an
unsharded plan, plan_hash) from what the file holds, so an edited plan is refused, never trusted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from opcollect.errors import InputError
from opcollect.files import write_atomic
from opcollect.names import BACKENDS, SMS
from opcollect.plans.base import id_template
from opcollect.plans.hashes import canonical_lines, content_hash, plan_hash, plan_header
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
    plan_hash: str  # of the whole selection, shared by its shards
    content_hash: str  # of this file: plan_hash, shard, selection and its own cases
    shard: tuple[int, int] | None
    selection: dict  # ops, smoke, case_filter, model_configs
    ops: dict[str, PlannedOp]

    @property
    def total_cases(self) -> int:
        return sum(len(p.ids) for p in self.ops.values())

    @property
    def shard_label(self) -> str | None:
        return None if self.shard is None else f"{self.shard[0]}/{self.shard[1]}"


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


def read_plan_json(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_bytes())
    except OSError as exc:
        raise InputError(f"{path}: cannot read plan ({exc.strerror}); write one with `opcollect plan -o`") from None
    except ValueError as exc:  # invalid JSON or not UTF-8
        where = f" (invalid JSON at line {exc.lineno})" if isinstance(exc, json.JSONDecodeError) else ""
        raise InputError(f"{path}: not a plan file{where}; write one with `opcollect plan -o`") from None
    return data


class _Broken(Exception):
    """A field of a plan file that is missing or of the wrong kind: (field path, what is wrong)."""


def _field(data: dict, key: str, kind: type | tuple, where: str = ""):
    value = data.get(key) if isinstance(data, dict) else None
    if not isinstance(value, kind):
        raise _Broken(f"{where}{key}", "missing" if value is None else f"not a {getattr(kind, '__name__', kind)}")
    return value


def _parse_op(name: str, raw: dict, typed: bool) -> tuple[PlannedOp, list[str]]:
    """One op of the file, with its canonical lines; every case ID is re-derived from its columns."""
    op = OPS.get(name)
    if op is None:
        raise _Broken(f"ops.{name}", f"unknown op; known: {', '.join(OPS)}")
    where = f"ops.{name}."
    if list(_field(raw, "fields", list, where)) != list(op.fields):
        raise _Broken(f"{where}fields", f"{raw['fields']} differs from {list(op.fields)}")
    ids = _field(raw, "case_id", list, where)
    dispatch = _field(raw, "dispatch", list, where)
    raw_columns = _field(raw, "columns", dict, where)
    columns = [_field(raw_columns, f, list, f"{where}columns.") for f in op.fields]
    if any(len(c) != len(ids) for c in columns) or len(dispatch) != len(ids):
        raise _Broken(f"{where}columns", f"column lengths differ from the {len(ids)} case IDs")
    values = list(zip(*columns)) if ids else []
    dtypes = columns[op.fields.index(op.dtype_field)]
    templates = {d: id_template(name, op.fields, op.dtype_field, d) for d in set(dtypes)}
    if len(templates) == 1:
        derived = list(map(next(iter(templates.values())).__mod__, values))
    else:
        derived = [templates[d] % v for d, v in zip(dtypes, values)]
    if derived != ids:
        at = next(i for i, (a, b) in enumerate(zip(derived, ids)) if a != b)
        raise _Broken(f"{where}columns", f"case {ids[at]} holds {derived[at]}")
    raw_rows = raw.get("rows")
    batched = (
        None
        if raw_rows is None
        else [Row(str(r["row_id"]), str(r["dispatch"]), tuple(r["case_ids"])) for r in raw_rows]
    )
    lines = canonical_lines(ids, dispatch, batched)
    if not typed:  # verification only: the runtime's typed cases and one-case rows are not needed
        return PlannedOp(name, op.table, op.family, op.op_name, [], ids, dispatch, batched or []), lines
    rows = batched if batched is not None else [Row(case_id, d, (case_id,)) for case_id, d in zip(ids, dispatch)]
    cases = list(map(op.case_type._make, values))
    planned = PlannedOp(name, op.table, op.family, op.op_name, cases, ids, dispatch, rows)
    return planned, lines


def parse_plan(path: Path, data: dict, typed: bool = True) -> PlanFile:
    """The plan ``data`` read from ``path``, verified; ``typed=False`` only verifies: PlannedOp.cases is
    empty and so are the rows of unbatched ops."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InputError(f"{path}: not an opcollect plan file (field 'format' is not {FORMAT!r})")
    if data.get("format_version") != FORMAT_VERSION:
        found = data.get("format_version")
        raise InputError(f"{path}: plan format_version {found!r}; this opcollect reads {FORMAT_VERSION}; re-plan")
    try:
        backend = _field(data, "backend", str)
        sm = _field(data, "sm", str)
        if backend not in BACKENDS and not backend.replace("_", "").replace(".", "").isalnum():
            raise _Broken("backend", f"{backend!r} is neither a backend ({', '.join(BACKENDS)}) nor a module path")
        if sm not in SMS:
            raise _Broken("sm", f"{sm!r} is not one of {', '.join(SMS)}")
        shard_raw = data.get("shard")
        shard = None if shard_raw is None else (int(shard_raw["index"]), int(shard_raw["count"]))
        selection = _field(data, "selection", dict)
        ops: dict[str, PlannedOp] = {}
        lines: list[str] = []
        for name, raw in _field(data, "ops", dict).items():
            ops[name], op_lines = _parse_op(name, raw, typed)
            lines.extend(op_lines)
        whole = _field(data, "plan_hash", str)
        lines.sort()
        if shard is None and plan_hash(plan_header(backend, sm), lines, presorted=True) != whole:
            raise _Broken("plan_hash", "differs from the hash of the cases the file holds")
        stated = _field(data, "content_hash", str)
        if content_hash(backend, sm, whole, shard, selection, lines, presorted=True) != stated:
            raise _Broken("content_hash", "differs from the hash of what the file holds")
        collector = _field(data, "collector_hash", str)
    except _Broken as exc:
        field, problem = exc.args
        raise InputError(f"{path}: field '{field}': {problem}; the plan was edited or is damaged, re-plan") from None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InputError(
            f"{path}: malformed plan ({type(exc).__name__}: {exc}); re-plan with `opcollect plan -o`"
        ) from None
    return PlanFile(backend, sm, collector, whole, data["content_hash"], shard, selection, ops)


def read_plan(path: Path) -> PlanFile:
    return parse_plan(path, read_plan_json(path))
