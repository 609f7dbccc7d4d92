"""The kernels each row ran, kept beside its table, and check rule R9 over them.

A shard record carries ``kernels`` (the names runtime/observe.py read after the case's samples) or ``kernels_unread``
(why none were read). Merge keeps them per case in the table's extras, ``.opcollect/<stem>_kernels.parquet``
(case_id, dispatch, kernel_source, kernels, kernels_unread: one row per measured case, sorted by case ID), never in
the consumer's columns. Runs and tables from before the field still merge: their rows have null kernels and dispatch.
Inside a merge the names travel as one string joined by SEP (Arrow joins cannot carry list columns); the file holds
them as a list.

R9 kernels  (a warning, a violation with --strict) rows whose observed kernels contradict their kernel_source label,
            and rows whose label contradicts the plan's dispatch (backends/kernels.py says when); a label the
            backend's table does not know, on rows that observed kernels, is a warning either way; the extras name
            only cases that are rows
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from opcollect.backends.kernels import contradicts_dispatch, contradicts_label, meaning
from opcollect.errors import InputError
from opcollect.tables.rules import MAX_KEYS, Finding
from opcollect.tables.schema import EXTRAS, TableSchema, read_parquet

SEP = "\n"  # runtime/observe.py keeps every name on one line
KERNELS = pa.schema(
    [
        ("case_id", pa.string()),
        ("dispatch", pa.string()),
        ("kernel_source", pa.string()),
        ("kernels", pa.list_(pa.string())),
        ("kernels_unread", pa.string()),
    ]
)


def kernels_file(table: str) -> str:
    """gemm_perf -> .opcollect/gemm_kernels.parquet, relative to the version directory."""
    stem = table[: -len("_perf")] if table.endswith("_perf") else table
    return f"{EXTRAS}/{stem}_kernels.parquet"


def joined(names: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """A list<string> column as one SEP-joined string per row (null stays null, an empty list is '')."""
    return pc.binary_join(names, SEP)


def _split(text: pa.ChunkedArray) -> pa.Array:
    values = [None if t is None else (t.split(SEP) if t else []) for t in text.to_pylist()]
    return pa.array(values, pa.list_(pa.string()))


def extras(chosen: pa.Table) -> pa.Table:
    """The kernels file of a merged table: the chosen measured candidates' observations, sorted by case ID."""
    ok = chosen.filter(chosen["ok"]).sort_by([("case_id", "ascending")])
    columns = {
        "case_id": ok["case_id"],
        "dispatch": ok["dispatch"],
        "kernel_source": ok["kernel_source"],
        "kernels": _split(ok["kernels"]),
        "kernels_unread": ok["kernels_unread"],
    }
    return pa.table(columns).cast(KERNELS)


def attach_stored(candidates: pa.Table, directory: Path, table: str) -> pa.Table:
    """Stored candidates of a table with the observations its kernels file holds (none before the file existed)."""
    path = Path(directory) / kernels_file(table)
    if not path.is_file():
        return candidates
    stored = read_parquet(path)
    if stored.schema != KERNELS:
        raise InputError(f"{path}: columns {stored.schema.names} are not {KERNELS.names}; re-merge into a new TABLES")
    stored = stored.set_column(stored.schema.get_field_index("kernels"), "kernels", joined(stored["kernels"]))
    by_case = {row["case_id"]: row for row in stored.to_pylist()}
    ids = candidates["case_id"].to_pylist()  # stored perf rows: every candidate is a measured one
    for name in ("dispatch", "kernels", "kernels_unread"):
        values = [by_case[c][name] if c in by_case else None for c in ids]
        candidates = candidates.set_column(candidates.schema.get_field_index(name), name, pa.array(values, pa.string()))
    return candidates


def r9(path: Path, perf: pa.Table, schema: TableSchema, backend: str, strict: bool) -> list[Finding]:
    """R9 over one table: its rows' labels against their observed kernels and their plan's dispatch."""
    kernels_path = path.parent / kernels_file(schema.name)
    if not kernels_path.is_file():
        return []  # merged before observed kernels were kept: nothing to hold the rows to
    try:
        stored = read_parquet(kernels_path)
    except InputError as exc:
        return [Finding("R9", str(kernels_path), str(exc).removeprefix(f"{kernels_path}: "))]
    if stored.schema != KERNELS:
        return [Finding("R9", str(kernels_path), f"columns {stored.schema.names} are not {KERNELS.names}")]
    labels = dict(zip(perf["case_id"].to_pylist(), perf["kernel_source"].to_pylist()))
    op = schema.op.name
    found: list[Finding] = []
    outside, lying, dispatched = [], [], []
    unknown: Counter[str] = Counter()
    for row in stored.to_pylist():
        case_id, names = row["case_id"], row["kernels"]
        if case_id not in labels:
            outside.append(case_id)
            continue
        label = labels[case_id]
        if contradicts_label(backend, label, names, op):
            lying.append(f"{case_id} ({label} ran {', '.join(n[:60] for n in names[:3])})")
        if contradicts_dispatch(backend, row["dispatch"], label, op):
            dispatched.append(f"{case_id} ({row['dispatch']} planned, {label} ran)")
        if names and meaning(backend, label, op) is None:
            unknown[label] += 1
    if outside:
        found.append(Finding("R9", str(kernels_path), "kernels of cases that are no row", tuple(outside[:MAX_KEYS])))
    for rows, what in (
        (lying, "rows ran kernels their kernel_source does not name"),
        (dispatched, "rows report another kernel_source than their plan's dispatch"),
    ):
        if rows:
            found.append(Finding("R9", str(path), f"{len(rows)} {what}", tuple(rows[:MAX_KEYS]), warning=not strict))
    if unknown:
        shown = tuple(f"{label} ({n} rows)" for label, n in unknown.most_common(MAX_KEYS))
        message = f"kernel_source labels the {backend} kernel table does not know (backends/{backend}/kernels.py)"
        found.append(Finding("R9", str(path), message, shown, warning=True))
    return found
