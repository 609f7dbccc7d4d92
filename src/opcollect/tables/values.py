"""The value rules a row must pass to be in a table: merge admits only rows that pass them, check enforces them.

measured   latency finite and positive (finite and >= 0 for an op whose latency is a difference of two timings,
           OpPlan.latency_is_difference: compute_scale, and for a case the plan holds at 0, OpPlan.zero_latency:
           a top-k that keeps every entry); p25 and p75 finite, 0 <= p25 <= latency <= p75; samples >= 1; noise
           finite and >= 0; timing one the harness writes (runtime/harness.py Timing), "none" (not run: latency,
           p75 and samples 0) on a zero-latency case alone
keys       every key column holds the value its case ID names (``op:<dtype>:field=value,...``)
times      a timestamp parses as ISO 8601 with its UTC offset and is not in the future

Each rule gives a Fault: what is wrong and a boolean mask of the rows that break it (a null breaks it).
Merge (tables/ingest.py, tables/candidates.py) drops those rows and counts them as garbage; check
(tables/rules.py) names them under R3 (measured) and R6 (keys).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from functools import reduce
from typing import Annotated, Callable, Mapping, get_args

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import AfterValidator

from opcollect.plans.base import OpPlan
from opcollect.plans.ops import OPS
from opcollect.runtime.harness import Timing
from opcollect.tables.schema import TableSchema

TIMINGS = tuple(get_args(Timing))
# ops whose latency is a difference of two timings, clipped at 0 (runtime/harness.py difference()): 0 is a value
DIFFERENCE_OPS = tuple(sorted(name for name, op in OPS.items() if op.latency_is_difference))
# ops with cases the plan holds at latency 0, written without running (OpPlan.zero_latency, runtime/harness.py untimed)
UNTIMED_OPS = tuple(sorted(name for name, op in OPS.items() if op.zero_latency is not None))
# clocks of the hosts that collect and the one that merges may differ by a little; more than this is no clock skew
CLOCK_SKEW = timedelta(minutes=10)


@dataclass(frozen=True)
class Fault:
    rule: str  # the check rule that reports it: R3 (values) or R6 (identity)
    what: str  # e.g. "latency not finite and positive"
    mask: pa.ChunkedArray | pa.Array  # the rows that break it: boolean, no nulls

    @property
    def count(self) -> int:
        return pc.sum(self.mask).as_py() or 0


def _bad(ok) -> pa.ChunkedArray | pa.Array:
    """Rows where ``ok`` is not true (a null, from a null or NaN input, breaks the rule)."""
    return pc.invert(pc.fill_null(ok, False))


def _finite(values):
    return pc.is_finite(pc.cast(values, pa.float64()))


Mask = bool | pa.ChunkedArray | pa.Array  # a rule's rows: all (True), none (False) or a boolean mask


def _either(a: Mask, b: Mask) -> Mask:
    if isinstance(a, bool) and isinstance(b, bool):
        return a or b
    if isinstance(a, bool):
        return True if a else b
    if isinstance(b, bool):
        return True if b else a
    return pc.or_(pc.fill_null(a, False), pc.fill_null(b, False))


def untimed_rows(table: pa.Table, op: OpPlan, column_of: Callable[[str], str | None] = lambda field: field) -> Mask:
    """The rows whose case the plan holds at latency exactly 0 (OpPlan.zero_latency): False for an op without such
    cases or a table without its key columns. ``column_of``: a case field's column (None: the table has none, the
    case gets None there)."""
    if op.zero_latency is None:
        return False
    columns = [column_of(name) for name in op.fields]
    if any(c is not None and c not in table.column_names for c in columns):
        return False
    values = [table[c].to_pylist() if c is not None else [None] * table.num_rows for c in columns]
    return pa.array([bool(op.zero_latency(op.case_type(*row))) for row in zip(*values)], pa.bool_())


def schema_untimed(table: pa.Table, schema: TableSchema, by_field: bool = False) -> Mask:
    """untimed_rows of a stored table (columns as the schema's backend names them) or, ``by_field``, of candidates
    (columns named by field, those the table lacks absent)."""
    if by_field:
        return untimed_rows(table, schema.op, lambda f: f if schema.column(f) is not None else None)
    return untimed_rows(table, schema.op, schema.column)


def measured_faults(
    table: pa.Table, prefix: str = "", where=None, difference: Mask = False, untimed: Mask = False
) -> list[Fault]:
    """The measured columns' rules over ``table``'s ``<prefix>latency`` etc.; ``where`` (a boolean mask) limits
    them to the measured rows of a table that holds failures too. ``difference``: whether the rows' latency is a
    difference of two timings (OpPlan.latency_is_difference), which may be exactly 0; ``untimed``: whether the rows'
    case is one the plan holds at 0 (untimed_rows), which may be 0 and may be written without running (timing
    "none"); each a bool for a table of one op, a boolean mask for records of several. A table without the
    quantile columns (the legacy reference tables) is held to the latency rule alone."""
    names = set(table.column_names)

    def column(name: str):
        return table[prefix + name]

    difference = _either(difference, untimed)  # a latency of 0 is a value on either kind of row
    latency = column("latency")
    # (what, ok, the rows it applies to: None for all)
    rules = []
    if difference is not True:  # a timed kernel's latency
        timed = None if difference is False else pc.invert(pc.fill_null(difference, False))
        rules.append(("latency not finite and positive", pc.and_(_finite(latency), pc.greater(latency, 0)), timed))
    if difference is not False:  # a difference of two timings, clipped at 0 (runtime/harness.py difference())
        differences = None if difference is True else difference
        at_least_0 = pc.and_(_finite(latency), pc.greater_equal(latency, 0))
        rules.append(("latency not finite and >= 0", at_least_0, differences))
    if {prefix + n for n in ("latency_p25", "latency_p75", "samples", "noise", "timing")} <= names:
        p25, p75, noise = column("latency_p25"), column("latency_p75"), column("noise")
        in_order = pc.and_(pc.greater_equal(p25, 0), pc.and_(pc.less_equal(p25, latency), pc.less_equal(latency, p75)))
        samples, none = column("samples"), pc.fill_null(pc.equal(column("timing"), "none"), False)
        # a row written without running (runtime/harness.py untimed): no sample, 0 throughout, a zero-latency case
        not_run = pc.and_(none, pc.equal(samples, 0))
        rules += [
            ("0 <= p25 <= latency <= p75 broken", pc.and_(pc.and_(_finite(p25), _finite(p75)), in_order), None),
            ("samples below 1", pc.or_(pc.greater_equal(samples, 1), not_run), None),
            (
                "timing none with a latency",
                pc.or_(pc.invert(none), pc.and_(pc.equal(latency, 0), pc.equal(p75, 0))),
                None,
            ),
            ("noise not finite and >= 0", pc.and_(_finite(noise), pc.greater_equal(noise, 0)), None),
            (f"timing not one of {', '.join(TIMINGS)}", pc.is_in(column("timing"), value_set=pa.array(TIMINGS)), None),
        ]
        if untimed is not True:  # timing none on a case the plan times
            timed = None if untimed is False else pc.invert(pc.fill_null(untimed, False))
            rules.append(("timing none on a case the plan times", pc.invert(none), timed))
    faults = []
    for what, ok, scope in rules:
        bad = _bad(ok)
        for limit in (where, scope):
            if limit is not None:
                bad = pc.and_(bad, pc.fill_null(limit, False))
        faults.append(Fault("R3", what, bad))
    return [f for f in faults if f.count]


def untimed_case_ids(plan_cases: Mapping[str, pa.Table]) -> pa.Array:
    """The case IDs of a plan's zero-latency cases (untimed_rows over each op's planned cases: ingest.py's
    plan_cases, the case ID and every field by name)."""
    found = []
    for op, cases in plan_cases.items():
        mask = untimed_rows(cases, OPS[op])
        if mask is not False:
            found += cases["case_id"].filter(mask).to_pylist()
    return pa.array(found, pa.string())


def record_faults(records: pa.Table, now: datetime | None = None, untimed_ids: pa.Array | None = None) -> list[Fault]:
    """The rules over shard records (stats flattened to ``stats.<name>``): a status the runtime writes, an
    attempt >= 1 and a recorded_at that passes the time rule, and a measured record's stats the measured rules
    (a latency of 0 admitted where the record's op is one of DIFFERENCE_OPS or its case one of ``untimed_ids``,
    timing none on the latter alone; without them, on any record of UNTIMED_OPS)."""
    status = records["status"]
    faults = [
        Fault("R3", "status neither ok nor failed", _bad(pc.is_in(status, value_set=pa.array(["ok", "failed"])))),
        Fault("R3", "attempt below 1", _bad(pc.greater_equal(records["attempt"], 1))),
    ]
    late = time_fault(records["recorded_at"], "recorded_at unparsable or in the future", now)
    faults += [late] if late is not None else []
    differences = pc.is_in(records["op"], value_set=pa.array(DIFFERENCE_OPS, pa.string()))
    if untimed_ids is not None:  # the plan's zero-latency cases (untimed_case_ids)
        untimed = pc.is_in(records["case_id"], value_set=untimed_ids)
    else:  # no plan at hand: a record of an op with zero-latency cases may be one
        untimed = pc.is_in(records["op"], value_set=pa.array(UNTIMED_OPS, pa.string()))
    ok = pc.equal(status, "ok")
    faults += measured_faults(records, "stats.", where=ok, difference=differences, untimed=untimed)
    return [f for f in faults if f.count]


def key_faults(table: pa.Table, schema: TableSchema, column_of: Callable[[str], str] | None = None) -> list[Fault]:
    """Per key column, the rows whose value is not the one their case ID names. ``column_of``: a case field's
    column in ``table`` (the schema's backend naming by default; the field's own name in a plan or candidates)."""
    column_of = column_of or schema.column
    op, dtype_field = schema.op.name, schema.op.dtype_field
    ids = table["case_id"]
    faults = []
    for field in schema.key_fields:
        if field == dtype_field:  # the ID's prefix: op:<dtype>:
            pattern = rf"^{op}:(?P<v>[^:,]*):"
        else:
            pattern = rf"^{op}:[^:]*:(?:.*,)?{field}=(?P<v>[^,]*)(?:,|$)"
        named = pc.struct_field(pc.extract_regex(ids, pattern), "v")
        column = column_of(field)
        held = pc.cast(table[column], pa.string())
        bad = _bad(pc.equal(held, named))
        fault = Fault("R6", f"{column} is not the one its case ID names", bad)
        if fault.count:
            faults.append(fault)
    return faults


def bad_time(value: str | None, now: datetime | None = None) -> str | None:
    """What is wrong with a timestamp, or None when it parses (ISO 8601 with its UTC offset) and is not later
    than now (give or take CLOCK_SKEW)."""
    if not isinstance(value, str):
        return f"{value!r} is not an ISO 8601 time"
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return f"{value!r} is not an ISO 8601 time"
    if parsed.tzinfo is None:
        return f"{value!r} has no UTC offset"
    if parsed > (now or datetime.now(timezone.utc)) + CLOCK_SKEW:
        return f"{value!r} is in the future"
    return None


def _valid_time(value: str) -> str:
    problem = bad_time(value)
    if problem is not None:
        raise ValueError(problem)
    return value


# a str field holding a timestamp that passes the time rule (provenance events, run events)
Timestamp = Annotated[str, AfterValidator(_valid_time)]


def time_fault(values: pa.ChunkedArray | pa.Array, what: str, now: datetime | None = None) -> Fault | None:
    """Rows whose timestamp ``values`` break the time rule (each distinct value is parsed once)."""
    now = now or datetime.now(timezone.utc)
    distinct = pc.unique(values).to_pylist()
    broken = [v for v in distinct if v is not None and bad_time(v, now) is not None]
    bad = pc.fill_null(pc.is_in(values, value_set=pa.array(broken, pa.string())), False)
    if None in distinct:
        bad = pc.or_(bad, pc.is_null(values))
    fault = Fault("R3", what, bad)
    return fault if fault.count else None


def tally(faults: list[Fault]) -> tuple[tuple[str, int], ...]:
    """(rule, rows) with each row counted once, under the first rule it breaks (a record with no stats breaks
    every measured rule: it is one latency fault)."""
    counted = None
    tallied = []
    for fault in faults:
        mask = fault.mask if counted is None else pc.and_(fault.mask, pc.invert(counted))
        count = pc.sum(mask).as_py() or 0
        if count:
            tallied.append((fault.what, count))
        counted = fault.mask if counted is None else pc.or_(counted, fault.mask)
    return tuple(tallied)


def any_fault(faults: list[Fault], rows: int) -> pa.ChunkedArray | pa.Array:
    """The rows that break any of ``faults``."""
    return reduce(pc.or_, (f.mask for f in faults), pc.fill_null(pa.nulls(rows, pa.bool_()), False))
