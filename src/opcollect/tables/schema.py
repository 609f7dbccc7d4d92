"""Columns and types of every table, derived from the op plans: a plan row and a table row join directly.

perf:     framework, version, device, op_name, kernel_source, <key fields>, latency,
          latency_p25, latency_p75, samples, noise, timing, case_id
failures: framework, version, device, op_name, kernel_source, <key fields>, case_id, error_class,
          message, attempts
The leading columns and their types are those of the aiconfigurator tables.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from opcollect.errors import InputError
from opcollect.plans.base import OpPlan
from opcollect.plans.ops import OPS

LEADING = ("framework", "version", "device", "op_name", "kernel_source")
MEASURED = (
    ("latency", pa.float64()),
    ("latency_p25", pa.float64()),
    ("latency_p75", pa.float64()),
    ("samples", pa.int64()),
    ("noise", pa.float64()),
    ("timing", pa.string()),
    ("case_id", pa.string()),
)
FAILED = (("case_id", pa.string()), ("error_class", pa.string()), ("message", pa.string()), ("attempts", pa.int64()))
# the axis a sweep grows along, for monotonicity checks in compare
SWEEP_AXIS = {
    "gemm": "m",
    "attention_context": "isl",
    "attention_generation": "batch_size",
    "moe": "num_tokens",
    "mla_context": "isl",
    "mla_generation": "batch_size",
    "comm": "message_size",
}
ARROW_TYPES = {str: pa.string(), int: pa.int64()}


@dataclass(frozen=True)
class TableSchema:
    op: OpPlan

    @property
    def name(self) -> str:
        return self.op.table

    @property
    def key_fields(self) -> tuple[str, ...]:
        return self.op.fields

    @property
    def key_columns(self) -> tuple[str, ...]:
        return (*LEADING, *self.key_fields)

    @property
    def sweep_axis(self) -> str:
        return SWEEP_AXIS[self.op.name]

    def field_types(self) -> list[tuple[str, pa.DataType]]:
        hints = typing.get_type_hints(self.op.case_type)
        return [(name, ARROW_TYPES[hints[name]]) for name in self.key_fields]

    @property
    def perf(self) -> pa.Schema:
        return pa.schema([(c, pa.string()) for c in LEADING] + self.field_types() + list(MEASURED))

    @property
    def failures(self) -> pa.Schema:
        return pa.schema([(c, pa.string()) for c in LEADING] + self.field_types() + list(FAILED))

    @property
    def plan(self) -> pa.Schema:
        return pa.schema([("case_id", pa.string()), ("plan_hash", pa.string())])


@cache
def schemas() -> dict[str, TableSchema]:
    """Every table by name, e.g. 'gemm_perf'."""
    return {op.table: TableSchema(op) for op in OPS.values()}


def schema_for_op(op: str) -> TableSchema:
    return TableSchema(OPS[op])


def table_files(table: str) -> tuple[str, str, str]:
    """perf, failures and plan file names of a table: gemm_perf -> gemm_perf.parquet, ..."""
    stem = table[: -len("_perf")] if table.endswith("_perf") else table
    return f"{table}.parquet", f"{stem}_failures.parquet", f"{stem}_plan.parquet"


def read_parquet(path: Path, columns: list[str] | None = None) -> pa.Table:
    """A stored table (``columns`` of it); InputError naming the file when it is no readable parquet file."""
    try:
        return pq.read_table(path, columns=columns)
    except (pa.ArrowException, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno is not None:
            raise  # the file system's error (missing, unreadable): the CLI names the path
        reason = str(exc).splitlines()[0][:200]
        raise InputError(
            f"{path}: not a readable parquet table ({reason}); restore it from a backup, or merge the runs "
            "into a new TABLES"
        ) from None
