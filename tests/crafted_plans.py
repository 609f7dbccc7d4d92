"""Crafted plan files: a plan edited by hand, then given hashes that agree with what it holds.

A plan's hashes are plain sha256 over its own content, so anyone can recompute them: they catch damage, they
are no permission. Tests of what `run` refuses therefore craft plans this way, as an attacker would.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from opcollect.plans.hashes import canonical_lines, content_hash, plan_hash, plan_header
from opcollect.runtime.planfile import id_template


def reseal(data: dict) -> dict:
    """``data`` with every case ID re-derived from its columns and both hashes recomputed."""
    lines: list[str] = []
    for name, op in data["ops"].items():
        fields, columns = op["fields"], op["columns"]
        values = list(zip(*(columns[f] for f in fields)))
        at = fields.index(op["dtype_field"])
        op["case_id"] = [id_template(name, fields, op["dtype_field"], v[at]) % v for v in values]
        rows = op.get("rows")
        batched = None if rows is None else [(r["row_id"], r["dispatch"], r["case_ids"]) for r in rows]
        lines += canonical_lines(op["case_id"], op["dispatch"], batched)
    lines.sort()
    shard = data.get("shard")
    shard = None if shard is None else (shard["index"], shard["count"])
    data["plan_hash"] = plan_hash(plan_header(data["backend"], data["sm"]), lines, presorted=True)
    data["content_hash"] = content_hash(
        data["backend"], data["sm"], data["plan_hash"], shard, data["selection"], lines, presorted=True
    )
    return data


def craft(path: Path, change: Callable[[dict], object]) -> Path:
    """Edit the plan file at ``path`` with ``change`` (in place) and reseal it."""
    data = json.loads(Path(path).read_text())
    change(data)
    Path(path).write_text(json.dumps(reseal(data)))
    return Path(path)


def set_column(field: str, value: object, op: str = "gemm") -> Callable[[dict], None]:
    def change(data: dict) -> None:
        data["ops"][op]["columns"][field][0] = value

    return change


def rename_op(old: str, new: str) -> Callable[[dict], None]:
    def change(data: dict) -> None:
        data["ops"][new] = data["ops"].pop(old)

    return change


def set_key(key: str, value: object) -> Callable[[dict], None]:
    def change(data: dict) -> None:
        data[key] = value

    return change


def set_op_key(key: str, value: object, op: str = "gemm") -> Callable[[dict], None]:
    def change(data: dict) -> None:
        data["ops"][op][key] = value

    return change


def crafted(*changes: Callable[[dict], object]) -> Callable[[object], None]:
    """A bad-input row's setup: the row's {plan} (a CPU plan of one GEMM case) edited by ``changes``, resealed."""

    def setup(ctx) -> None:
        craft(ctx.plan, lambda data: [change(data) for change in changes])

    return setup
