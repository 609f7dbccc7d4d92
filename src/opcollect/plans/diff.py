"""plan-diff: what changed between two plan files, or two --json summaries, per op, dtype and dispatch."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from opcollect.errors import InputError
from opcollect.plans.ops import OPS
from opcollect.plans.planfile import FORMAT, parse_plan, read_plan_json
from opcollect.yamlio import validate

Count = Annotated[int, Field(ge=0)]


class SummaryOp(BaseModel):
    """One op of a `plan --json` summary, as much of it as plan-diff reads."""

    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)
    cases: Count
    by_dtype: dict[str, Count]
    by_dispatch: dict[str, Count]


class Summary(BaseModel):
    """A `plan --json` summary: typed, so a crafted one is one line naming its field, not a traceback."""

    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)
    plan_hash: str
    ops: dict[Literal[tuple(OPS)], SummaryOp]  # type: ignore[valid-type]


@dataclass(frozen=True)
class OpView:
    """What one side knows of an op: counts always, case rows only when it is a plan file."""

    cases: int = 0
    by_dtype: dict[str, int] = field(default_factory=dict)
    by_dispatch: dict[str, int] = field(default_factory=dict)
    rows: dict[str, tuple[str, str]] | None = None  # case_id -> (dispatch, row_id)


@dataclass(frozen=True)
class OpDiff:
    op: str
    added: int
    removed: int
    changed: int  # same case ID, different dispatch or row
    by_dtype: dict[str, tuple[int, int]] = field(default_factory=dict)  # label -> (old, new) where they differ
    by_dispatch: dict[str, tuple[int, int]] = field(default_factory=dict)
    examples: tuple[str, ...] = ()

    @property
    def differs(self) -> bool:
        return bool(self.added or self.removed or self.changed or self.by_dtype or self.by_dispatch)


def _load(path: Path) -> dict[str, OpView]:
    data = read_plan_json(path)
    if isinstance(data, dict) and data.get("format") == FORMAT:
        views = {}
        for name, op in parse_plan(path, data).ops.items():
            views[name] = OpView(
                cases=len(op.ids),
                by_dtype=dict(Counter(OPS[name].label_of(case) for case in op.cases)),
                by_dispatch=dict(Counter(op.dispatch)),
                rows={case_id: (row.dispatch, row.row_id) for row in op.rows for case_id in row.case_ids},
            )
        return views
    if isinstance(data, dict) and "ops" in data and "plan_hash" in data:
        summary = validate(str(path), data, Summary)
        return {name: OpView(op.cases, op.by_dtype, op.by_dispatch) for name, op in summary.ops.items()}
    raise InputError(f"{path}: neither a plan file (`plan -o`) nor a one-pair summary (`plan --json`)")


def _count_changes(old: dict[str, int], new: dict[str, int]) -> dict[str, tuple[int, int]]:
    return {
        k: (old.get(k, 0), new.get(k, 0)) for k in sorted(old.keys() | new.keys()) if old.get(k, 0) != new.get(k, 0)
    }


def _diff_op(op: str, a: OpView, b: OpView) -> OpDiff:
    if a.rows is not None and b.rows is not None:
        added = sorted(b.rows.keys() - a.rows.keys())
        removed = sorted(a.rows.keys() - b.rows.keys())
        changed = sorted(c for c in a.rows.keys() & b.rows.keys() if a.rows[c] != b.rows[c])
        counts = (len(added), len(removed), len(changed))
        examples = tuple(added[:3] + removed[:3] + changed[:3])
    else:  # a summary carries counts only
        delta = b.cases - a.cases
        counts, examples = (max(delta, 0), max(-delta, 0), 0), ()
    return OpDiff(
        op,
        *counts,
        by_dtype=_count_changes(a.by_dtype, b.by_dtype),
        by_dispatch=_count_changes(a.by_dispatch, b.by_dispatch),
        examples=examples,
    )


def diff_plans(old_path: Path, new_path: Path) -> list[OpDiff]:
    old, new = _load(old_path), _load(new_path)
    old_rows = all(v.rows is not None for v in old.values())
    new_rows = all(v.rows is not None for v in new.values())
    diffs = []
    for op in dict.fromkeys([*old, *new]):
        a = old.get(op, OpView(rows={} if old_rows else None))
        b = new.get(op, OpView(rows={} if new_rows else None))
        diffs.append(_diff_op(op, a, b))
    return diffs


def render_diff(diffs: list[OpDiff]) -> str:
    lines = []
    for d in diffs:
        if not d.differs:
            lines.append(f"{d.op}: unchanged")
            continue
        lines.append(f"{d.op}: +{d.added} added, -{d.removed} removed, ~{d.changed} changed")
        lines += [f"  dtype {label}: {a} -> {b}" for label, (a, b) in d.by_dtype.items()]
        lines += [f"  dispatch {label}: {a} -> {b}" for label, (a, b) in d.by_dispatch.items()]
        lines += [f"  e.g. {example}" for example in d.examples]
    return "\n".join(lines) + "\n"
