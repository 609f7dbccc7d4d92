"""Candidate rows of a table being merged: new records, what TABLES already holds, and the choice.

Every candidate has the case ID, the key fields and CANDIDATE_TYPES' columns, so records from shards
and rows from stored tables concatenate and the latest per case is chosen in Arrow.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from opcollect.tables.ingest import RunData
from opcollect.tables.observed import attach_stored
from opcollect.tables.schema import TableSchema, read_parquet, table_files
from opcollect.tables.values import Fault, any_fault, key_faults, measured_faults, schema_untimed

CANDIDATE_TYPES = {
    "ok": pa.bool_(),
    "recorded_at": pa.string(),
    "kernel_source": pa.string(),
    "ran": pa.string(),
    "expected_ran": pa.string(),
    "dispatch": pa.string(),
    "kernels": pa.string(),  # the observed names, joined (tables/observed.py)
    "kernels_unread": pa.string(),
    "latency": pa.float64(),
    "latency_p25": pa.float64(),
    "latency_p75": pa.float64(),
    "samples": pa.int64(),
    "noise": pa.float64(),
    "timing": pa.string(),
    "sm_clock_mhz": pa.float64(),
    "error_class": pa.string(),
    "message": pa.string(),
    "attempt": pa.int64(),
    "run_id": pa.string(),
}


def new_candidates(run: RunData, op: str, schema: TableSchema) -> pa.Table:
    records = run.records
    if pc.count_distinct(records["op"]).as_py() > 1:
        records = records.filter(pc.equal(records["op"], op))
    needed = [
        "case_id",
        "status",
        "recorded_at",
        "kernel_source",
        "dispatch",
        "ran",
        "expected_ran",
        "kernels",
        "kernels_unread",
        "error_class",
        "message",
        "attempt",
        "run_id",
        *(
            f"stats.{n}"
            for n in ("latency", "latency_p25", "latency_p75", "samples", "noise", "timing", "sm_clock_mhz")
        ),
    ]
    joined = records.select(needed).join(run.plan_cases[op], "case_id", join_type="inner")
    columns = {
        "case_id": joined["case_id"],
        **{f: joined[f] for f in schema.key_fields},
        "ok": pc.equal(joined["status"], "ok"),
        "recorded_at": joined["recorded_at"],
        "kernel_source": pc.coalesce(joined["kernel_source"], joined["dispatch"]),
        "ran": joined["ran"],
        "expected_ran": joined["expected_ran"],
        "dispatch": joined["dispatch"],
        "kernels": joined["kernels"],
        "kernels_unread": joined["kernels_unread"],
    }
    for name in ("latency", "latency_p25", "latency_p75", "samples", "noise", "timing", "sm_clock_mhz"):
        columns[name] = joined[f"stats.{name}"]
    columns.update(
        error_class=joined["error_class"], message=joined["message"], attempt=joined["attempt"], run_id=joined["run_id"]
    )
    return pa.table({k: v.cast(CANDIDATE_TYPES[k]) if k in CANDIDATE_TYPES else v for k, v in columns.items()})


def admitted(candidates: pa.Table, schema: TableSchema) -> tuple[pa.Table, list[Fault]]:
    """The candidates that pass the value rules (tables/values.py), and the faults of those that do not: a
    measured row's values, and every row's key columns against its case ID."""
    untimed = schema_untimed(candidates, schema, by_field=True)  # zero-latency cases (OpPlan.zero_latency)
    measured = measured_faults(
        candidates, where=candidates["ok"], difference=schema.op.latency_is_difference, untimed=untimed
    )
    faults = measured + key_faults(candidates, schema, column_of=str)
    if not faults:
        return candidates, []
    return candidates.filter(pc.invert(any_fault(faults, candidates.num_rows))), faults


def _candidates(table: pa.Table, schema: TableSchema, values: dict) -> pa.Table:
    """Candidate rows from a stored table: its keys, the given columns, nulls for the rest."""
    n = table.num_rows
    columns = {"case_id": table["case_id"], **{f: table[schema.column(f)] for f in schema.key_fields}}
    for name, kind in CANDIDATE_TYPES.items():
        value = values.get(name)
        if isinstance(value, str) and value in table.column_names:
            columns[name] = table[value].cast(kind)
        else:
            columns[name] = pa.array([value] * n, kind) if value is not None else pa.nulls(n, kind)
    return pa.table(columns)


def old_candidates(directory: Path, schema: TableSchema) -> pa.Table | None:
    """What TABLES holds for this table, as candidates older than any new record."""
    perf_name, failures_name, _ = table_files(schema.name)
    parts = []
    if (directory / perf_name).is_file():
        measured = ("kernel_source", "latency", "latency_p25", "latency_p75", "samples", "noise", "timing")
        stored = _candidates(
            read_parquet(directory / perf_name),
            schema,
            {"ok": True, "recorded_at": "", "attempt": 1, **{c: c for c in measured}},
        )
        parts.append(attach_stored(stored, directory, schema.name))  # the kernels its rows observed
    if (directory / failures_name).is_file():
        parts.append(
            _candidates(
                read_parquet(directory / failures_name),
                schema,
                {
                    "ok": False,
                    "recorded_at": "",
                    "kernel_source": "kernel_source",
                    "error_class": "error_class",
                    "message": "message",
                    "attempt": "attempts",
                },
            )
        )
    return pa.concat_tables(parts) if parts else None


def _last_per_case(ordered: pa.Table) -> pa.Table:
    """The last row of each run of equal case IDs in a table sorted by case ID."""
    ids = ordered["case_id"].combine_chunks()
    if len(ids) == 0:
        return ordered
    keep = pa.concat_arrays([pc.not_equal(ids.slice(0, len(ids) - 1), ids.slice(1)), pa.array([True])])
    return ordered.filter(keep)


def latest_per_case(candidates: pa.Table) -> pa.Table:
    """One candidate per case: measured beats failed, then the most recent wins."""
    if pc.count_distinct(candidates["case_id"]).as_py() == candidates.num_rows:
        return candidates  # every case once: nothing to choose
    ranked = candidates.append_column("rank", pc.cast(candidates["ok"], pa.int8()))
    ordered = ranked.sort_by([("case_id", "ascending"), ("rank", "ascending"), ("recorded_at", "ascending")])
    return _last_per_case(ordered).drop_columns(["rank"])


def unique_planned(planned: pa.Table) -> pa.Table:
    """Planned case IDs without repeats, sorted by case ID (the last plan listed keeps its hash)."""
    return _last_per_case(planned.sort_by([("case_id", "ascending")]))
