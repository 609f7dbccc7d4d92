"""Columns and types of every table, derived from the op plans: a plan row and a table row join directly.

perf:     framework, version, device, op_name, kernel_source, <key fields>, latency, <after-latency fields>,
          latency_p25, latency_p75, samples, noise, timing, case_id
failures: framework, version, device, op_name, kernel_source, <key fields>, <after-latency fields>, case_id,
          error_class, message, attempts
The leading columns and their types are those of the aiconfigurator tables. An op whose cases carry op_name
(comm: the collective) fills that column from the case; the others from OpPlan.op_name. Fields after latency
(OpPlan.after_latency) follow the reference's order, and a backend may name a field's column otherwise
(OpPlan.columns: TRT-LLM's custom_allreduce `implementation` is vLLM's and SGLang's `backend`), so a table's
schema is the op's for one backend.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from opcollect.errors import InputError
from opcollect.inputs import open_regular
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
    "mla_context_module": "isl",
    "mla_generation_module": "batch_size",
    "compute_scale": "m",
    "scale_matrix": "m",
    "mla_bmm": "num_tokens",
    "encoder_attention": "isl",
    "dsv4_csa_context_module": "isl",
    "dsv4_csa_generation_module": "batch_size",
    "dsv4_hca_context_module": "isl",
    "dsv4_hca_generation_module": "batch_size",
    "dsv4_paged_mqa_logits_module": "step",
    "dsv4_hca_attn_module": "step",
    "dsv4_csa_topk_calib": "step",
    "mhc": "num_tokens",
    "dsa_context_module": "isl",
    "dsa_generation_module": "batch_size",
    "glm5_mqa_logits_module": "step",
    "glm5_topk_module": "step",
    "glm5_dsa_attn_module": "step",
    "msa_context_module": "isl",
    "msa_generation_module": "batch_size",
    "gdn": "seq_len",
    "mamba2": "seq_len",
    "comm": "message_size",
    "custom_allreduce": "message_size",
}
ARROW_TYPES = {str: pa.string(), int: pa.int64()}


@dataclass(frozen=True)
class TableSchema:
    op: OpPlan
    backend: str | None = None  # whose table: a backend may name a key column otherwise (OpPlan.columns)

    @property
    def name(self) -> str:
        return self.op.table

    @property
    def key_fields(self) -> tuple[str, ...]:
        """Every case field the table has a column for, named as the plan names it (op_name among them for comm):
        all of them but those this backend's table lacks (OpPlan.columns None)."""
        return tuple(f for f in self.op.fields if self.column(f) is not None)

    def column(self, field: str) -> str | None:
        """The table column of a case field, for this schema's backend; None where its table has none."""
        return self.op.columns.get(self.backend or "", {}).get(field, field)

    @property
    def field_columns(self) -> tuple[str, ...]:
        """The key columns after the leading ones, in table order (after-latency ones last)."""
        before, after = self._key_parts()
        return tuple(column for column, _ in before + after)

    @property
    def key_columns(self) -> tuple[str, ...]:
        return (*LEADING, *self.field_columns)

    @property
    def sweep_axis(self) -> str:
        return SWEEP_AXIS[self.op.name]

    def field_types(self) -> list[tuple[str, pa.DataType]]:
        """Every case field (named as the plan names it) with its Arrow type."""
        hints = typing.get_type_hints(self.op.case_type)
        return [(name, ARROW_TYPES[hints[name]]) for name in self.key_fields]

    def _key_parts(self) -> tuple[list[tuple[str, pa.DataType]], list[tuple[str, pa.DataType]]]:
        """(column, type) of the key fields that are no leading column: those before latency, those after it."""
        typed = [(f, self.column(f), t) for f, t in self.field_types() if f not in LEADING]
        before = [(c, t) for f, c, t in typed if f not in self.op.after_latency]
        after = [(c, t) for f, c, t in typed if f in self.op.after_latency]
        return before, after

    @property
    def perf(self) -> pa.Schema:
        before, after = self._key_parts()
        return pa.schema([(c, pa.string()) for c in LEADING] + before + list(MEASURED[:1]) + after + list(MEASURED[1:]))

    @property
    def failures(self) -> pa.Schema:
        before, after = self._key_parts()
        return pa.schema([(c, pa.string()) for c in LEADING] + before + after + list(FAILED))

    @property
    def plan(self) -> pa.Schema:
        return pa.schema([("case_id", pa.string()), ("plan_hash", pa.string())])

    def for_columns(self, names: list[str]) -> TableSchema:
        """The backend's variant of this schema whose key columns a file with these column names has."""
        for backend in (self.backend, None, *self.op.columns):
            variant = TableSchema(self.op, backend)
            if set(variant.key_columns) <= set(names):
                return variant
        return self


@cache
def schemas(backend: str | None = None) -> dict[str, TableSchema]:
    """Every table by name, e.g. 'gemm_perf', as ``backend`` names its columns."""
    return {op.table: TableSchema(op, backend) for op in OPS.values()}


def schema_for_op(op: str, backend: str | None = None) -> TableSchema:
    return TableSchema(OPS[op], backend)


# our extras beside the tables, in a dot-directory the consumer does not read (tables/consumer.py)
EXTRAS = ".opcollect"


def table_files(table: str) -> tuple[str, str, str]:
    """perf, failures and plan files of a table, relative to its version directory.

    gemm_perf -> gemm_perf.parquet, .opcollect/gemm_failures.parquet, .opcollect/gemm_plan.parquet
    """
    stem = table[: -len("_perf")] if table.endswith("_perf") else table
    return f"{table}.parquet", f"{EXTRAS}/{stem}_failures.parquet", f"{EXTRAS}/{stem}_plan.parquet"


MAX_TABLE = 64 * 2**30  # bytes of one table file: far above any table, a bound on what a planted file makes us read
_TABLE_FIX = "restore it from a backup, or merge the runs into a new TABLES"


def read_parquet(path: Path, columns: list[str] | None = None) -> pa.Table:
    """A stored table (``columns`` of it), read through the one reader (a regular file, never a FIFO); InputError
    naming the file when it is no readable parquet file."""
    return _parquet(path, lambda handle: pq.read_table(handle, columns=columns))


def read_parquet_schema(path: Path) -> pa.Schema:
    return _parquet(path, pq.read_schema)


def _parquet(path: Path, read):
    try:
        with open_regular(path, "parquet table", _TABLE_FIX, limit=MAX_TABLE) as handle:
            return read(handle)
    except (pa.ArrowException, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno is not None:
            raise  # the file system's error (missing, unreadable): the CLI names the path
        reason = str(exc).splitlines()[0][:200]
        raise InputError(f"{path}: not a readable parquet table ({reason}); {_TABLE_FIX}") from None
