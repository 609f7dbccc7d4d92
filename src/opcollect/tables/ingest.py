"""Read run directories into Arrow: the plan's cases per op, the latest record per case, runtimes, events.

Shards are parsed by Arrow's JSON reader (C++, both cores); a torn last line is cut off first, and a
shard with a corrupt line inside falls back to the line-by-line reader, which skips that line.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError

from opcollect.errors import InputError
from opcollect.inputs import MIB, NotJson, open_regular, read_json
from opcollect.inputs import read_lines as read_lines_of
from opcollect.plans.planfile import parse_plan, read_plan_json
from opcollect.runtime.rundir import read_identity
from opcollect.runtime.shards import MAX_SHARD_BYTES, SHARD_FIX, read_lines, shard_paths
from opcollect.tables.observed import joined
from opcollect.tables.schema import MEASURED, schema_for_op
from opcollect.tables.values import Timestamp, any_fault, record_faults, tally, untimed_case_ids
from opcollect.yamlio import describe_validation_error

MAX_EVENT_BYTES = 16 * MIB  # an event is one JSON object of a few hundred bytes
# the measured columns of every perf table, as a record's stats carry them, plus the SM clock
STATS = pa.struct([(name, kind) for name, kind in MEASURED if name != "case_id"] + [("sm_clock_mhz", pa.float64())])
RUNTIME_FIELDS = (
    "runtime_id",
    "framework",
    "version",
    "python",
    "torch",
    "cuda",
    "driver",
    "nccl_version",
    "device",
    "host",
    "worker_device",
)
# a CPU worker's own figures (runtime/hostprobe.py), for check R8; null on a GPU and in older runs
HOST_FIGURES = pa.struct(
    [
        ("dense_tflops", pa.struct([("float32", pa.float64()), ("bfloat16", pa.float64())])),
        ("bandwidth_bytes_per_s", pa.int64()),
        ("cache_bytes", pa.int64()),
        ("threads", pa.int64()),
        ("seconds", pa.float64()),
    ]
)
# both kinds of shard line in one schema: a runtime line leaves the case fields null, and the reverse.
# A record's plan_hash and collector_hash repeat run.json's; merge takes them from there, unparsed.
RECORD = pa.schema(
    [
        ("kind", pa.string()),
        *[(name, pa.string()) for name in RUNTIME_FIELDS if name != "runtime_id"],
        ("host_figures", HOST_FIGURES),
        ("case_id", pa.string()),
        ("op", pa.string()),
        ("status", pa.string()),
        ("kernel_source", pa.string()),
        ("dispatch", pa.string()),
        ("ran", pa.string()),
        ("expected_ran", pa.string()),
        ("kernels", pa.list_(pa.string())),  # what ran (runtime/observe.py); absent in older runs
        ("kernels_unread", pa.string()),
        ("error_class", pa.string()),
        ("message", pa.string()),
        ("attempt", pa.int64()),
        ("run_id", pa.string()),
        ("runtime_id", pa.string()),
        ("recorded_at", pa.string()),
        ("stats", STATS),
    ]
)
CASE_FIELDS = [
    name for name in RECORD.names if (name not in RUNTIME_FIELDS or name == "runtime_id") and name != "host_figures"
]


@dataclass(frozen=True)
class RunData:
    run_dir: Path
    backend: str
    plan_hash: str
    collector_hash: str
    plan_cases: dict[str, pa.Table]  # op -> case_id + key fields, planned
    records: pa.Table  # case records: CASE_FIELDS minus kind, with stats flattened to stats.<name>
    runtimes: dict[str, dict]  # runtime_id -> identity
    events: list[dict]
    garbage_lines: int  # complete shard lines that were no record, or a record that fails the value rules
    refused: tuple[tuple[str, int], ...] = ()  # (value rule, records that break it) among the garbage lines


def _parse_shard(path: Path) -> tuple[pa.Table, int]:
    """The shard's lines, and how many complete lines were garbage (not a JSON object). It is read by
    opcollect.inputs: a regular file of its run directory (a FIFO or link in shards/ is one line, exit 2)."""
    options = pajson.ParseOptions(explicit_schema=RECORD, unexpected_field_behavior="ignore")
    run_dir = path.parent.parent
    with open_regular(path, "shard", SHARD_FIX, limit=MAX_SHARD_BYTES, tree=run_dir) as handle:
        if os.fstat(handle.fileno()).st_size == 0:
            return RECORD.empty_table(), 0
        handle.seek(-1, os.SEEK_END)
        intact = handle.read(1) == b"\n"
        handle.seek(0)
        try:
            if intact:  # Arrow reads the file itself: no second copy in Python memory
                return pajson.read_json(handle, parse_options=options), 0
            data = handle.read()
            end = data.rfind(b"\n") + 1  # a torn tail is a record that was never written
            table = pajson.read_json(pa.py_buffer(data[:end]), parse_options=options) if end else RECORD.empty_table()
            return table, 0
        except pa.ArrowInvalid:
            pass
    rows = list(read_lines(path))
    complete = sum(
        1 for raw in read_lines_of(path, "shard", SHARD_FIX, limit=MAX_SHARD_BYTES, tree=run_dir) if raw.endswith(b"\n")
    )
    table = _records_of(rows)
    return table, complete - table.num_rows


def _records_of(rows: list[dict]) -> pa.Table:
    """The JSON objects that fit RECORD; one that does not (attempt 'x', stats.latency 'fast') is garbage."""
    picked = [{k: r.get(k) for k in RECORD.names} for r in rows]
    try:
        return pa.Table.from_pylist(picked, schema=RECORD)
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        pass
    fitting = []
    for row in picked:  # only a shard with a line of the wrong types gets here: one line at a time
        try:
            fitting.append(pa.Table.from_pylist([row], schema=RECORD))
        except (pa.ArrowException, OverflowError, TypeError, ValueError):
            continue
    return pa.concat_tables(fitting) if fitting else RECORD.empty_table()


def _plan_tables(plan_path: Path, data: dict) -> dict[str, pa.Table]:
    """Per op, the planned case IDs and their key fields; a value no table column can hold (k=10**400, m=inf; the
    plan reader's bounds refuse them first) refuses the plan in one line."""
    tables = {}
    for op, raw in data["ops"].items():
        schema = schema_for_op(op)
        columns = {"case_id": pa.array(raw["case_id"], pa.string())}
        for name, kind in schema.field_types():
            try:
                columns[name] = pa.array(raw["columns"][name], kind)
            except (pa.ArrowException, OverflowError, TypeError, ValueError) as exc:
                reason = str(exc).splitlines()[0][:120]
                raise InputError(
                    f"{plan_path}: field 'ops.{op}.columns.{name}': a value is no {kind} ({reason}); re-plan"
                ) from None
        tables[op] = pa.table(columns)  # parse_plan derived every case ID from these columns
    return tables


def load_run(run_dir: Path) -> RunData:
    run_dir = Path(run_dir)
    identity = read_identity(run_dir)
    plan_path = run_dir / "plan.json"
    plan = read_plan_json(plan_path, tree=run_dir)
    verified = parse_plan(plan_path, plan, typed=False)  # IDs re-derived, hashes recomputed
    held = (identity["content_hash"], identity["backend"], identity["collector_hash"])
    if held != (verified.content_hash, verified.backend, verified.collector_hash):
        raise InputError(f"{run_dir / 'run.json'}: does not describe its plan.json; the run directory was altered")
    plan_cases = _plan_tables(plan_path, plan)
    del plan, verified  # their Python lists are several times the size of the Arrow columns
    parts = [_parse_shard(p) for p in shard_paths(run_dir)]
    lines = pa.concat_tables([table for table, _ in parts]) if parts else RECORD.empty_table()
    garbage = sum(bad for _, bad in parts)
    del parts
    # a JSON object that is neither a case record nor a runtime line is garbage too
    garbage += lines.filter(pc.and_(pc.is_null(lines["case_id"]), pc.is_null(lines["kind"]))).num_rows
    # stats.latency, stats.samples, ...: flat columns, which joins can carry
    records = lines.filter(pc.is_valid(lines["case_id"])).select([c for c in CASE_FIELDS if c != "kind"]).flatten()
    # the observed kernels as one string per record: joins carry no list column (tables/observed.py)
    records = records.set_column(records.schema.get_field_index("kernels"), "kernels", joined(records["kernels"]))
    faults = record_faults(records, untimed_ids=untimed_case_ids(plan_cases))  # a 0 on a zero-latency case alone
    if faults:  # a record that fails the value rules is garbage too: merge admits none of it
        kept = records.filter(pc.invert(any_fault(faults, records.num_rows)))
        garbage += records.num_rows - kept.num_rows
        records = kept
    announced = lines.filter(pc.equal(lines["kind"], "runtime")).select([*RUNTIME_FIELDS, "host_figures"]).to_pylist()
    runtimes = {line["runtime_id"]: line for line in announced}
    events = [_read_event(p) for p in sorted((run_dir / "events").glob("*.json"))]
    return RunData(
        run_dir,
        identity["backend"],
        identity["plan_hash"],
        identity["collector_hash"],
        plan_cases,
        records,
        runtimes,
        events,
        garbage,
        tally(faults),
    )


def load_planned(plan_path: Path) -> RunData:
    """A plan file as a run that recorded nothing: its cases count as planned in the tables a merge writes, so a
    shard that never ran leaves them partial (`merge --plan`, the whole plan of a sharded collection)."""
    plan_path = Path(plan_path)
    plan = read_plan_json(plan_path)
    verified = parse_plan(plan_path, plan, typed=False)
    records = RECORD.empty_table().select([c for c in CASE_FIELDS if c != "kind"]).flatten()
    records = records.set_column(records.schema.get_field_index("kernels"), "kernels", joined(records["kernels"]))
    plan_cases = _plan_tables(plan_path, plan)
    return RunData(plan_path, verified.backend, verified.plan_hash, verified.collector_hash, plan_cases, records, {},
                   [], 0)  # fmt: skip


class RunEvent(BaseModel):
    """RUN_DIR/events/<run_id>.json as `run` writes it (runtime/run.py): the fields merge reads."""

    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)
    run_id: Annotated[str, StringConstraints(min_length=1)]
    collected_at: Timestamp
    finished_at: Timestamp | None  # null while the run has not finished
    host: str
    shard: str | None
    image: str | None = None
    image_digest: str | None = None


def _read_event(path: Path) -> dict:
    fix = "delete that event file or collect into a new --out"
    try:
        event = read_json(path, "run event", fix, limit=MAX_EVENT_BYTES, tree=path.parent.parent)
    except NotJson as exc:
        raise InputError(f"{path}: not valid JSON ({exc.reason}); {fix}") from None
    if not isinstance(event, dict):
        raise InputError(f"{path}: not a run event (a JSON object); delete it or re-collect")
    try:
        return RunEvent.model_validate(event).model_dump()
    except ValidationError as exc:
        raise InputError(describe_validation_error(str(path), exc) + "; delete that event file or re-collect") from None
