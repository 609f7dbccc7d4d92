"""The plan file, read by the runtime: JSON in, typed values out, nothing of the planner imported.

The plan file is the contract between planner and runtime: identity (backend, SM, hashes, shard) and per
op its table, fields, dtype field, case columns, case IDs, dispatch and batch rows. Reading it re-derives
every case ID from its columns and recomputes content_hash (and, for an unsharded plan, plan_hash) from
what the file holds, so an edited plan is refused, never trusted. Cases are namedtuples of the file's
fields; plans/planfile.py writes the file and holds its ops to the planner's.
"""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import NamedTuple, Sequence

from opcollect.errors import InputError
from opcollect.inputs import MIB, NotJson, read_json
from opcollect.names import BACKENDS, SMS
from opcollect.plans.hashes import canonical_lines, content_hash, plan_hash, plan_header

FORMAT = "opcollect-plan"
FORMAT_VERSION = 2

# The ops the runtime runs, as plans/ops.py plans them: (table, family, case fields in order). A plan naming
# another op, or other fields, is refused before anything runs; tests hold this to the planner's OPS.
_ATTENTION = (
    "batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim", "beam_width", "attn_dtype",
    "kv_cache_dtype", "step", "window_size",
)  # fmt: skip
_MLA = ("mla_dtype", "kv_cache_dtype", "num_heads", "batch_size", "isl", "tp_size", "step")
_MLA_MODULE = ("model", "architecture", "mla_dtype", "kv_cache_dtype", "gemm_type", "num_heads", "batch_size")
_MLA_MODULE += ("isl", "tp_size", "step")
_ENCODER_ATTENTION = ("batch_size", "isl", "num_heads", "head_dim", "attn_dtype")
_DSV4 = ("model", "architecture", "mla_dtype", "kv_cache_dtype", "gemm_type", "num_heads")
_DSV4_MODULE = (*_DSV4, "batch_size", "isl", "tp_size", "step", "compress_ratio")
_DSV4_KERNEL = (*_DSV4, "local_num_heads", "batch_size", "isl", "tp_size", "step", "compress_ratio")
_MHC = ("op_name", "architecture", "num_tokens", "num_sites", "hc_mult", "hidden_size", "sinkhorn_iters")
_LINEAR = ("stage", "phase", "batch_size", "seq_len", "num_tokens", "d_model")
OP_FIELDS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "gemm": ("gemm_perf", "gemm", ("gemm_dtype", "m", "n", "k")),
    "attention_context": ("context_attention_perf", "attention", _ATTENTION),
    "attention_generation": ("generation_attention_perf", "attention", _ATTENTION),
    "moe": ("moe_perf", "moe", ("moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts",
                                "moe_tp_size", "moe_ep_size", "distribution")),
    "mla_context": ("context_mla_perf", "mla", _MLA),
    "mla_generation": ("generation_mla_perf", "mla", _MLA),
    "mla_context_module": ("mla_context_module_perf", "mla", _MLA_MODULE),
    "mla_generation_module": ("mla_generation_module_perf", "mla", _MLA_MODULE),
    "compute_scale": ("computescale_perf", "quantize", ("m", "k", "quant_dtype")),
    "scale_matrix": ("scale_matrix_perf", "quantize", ("m", "k", "quant_dtype")),
    "mla_bmm": ("mla_bmm_perf", "mla_bmm", ("op_name", "bmm_dtype", "num_tokens", "num_heads")),
    "encoder_attention": ("encoder_attention_perf", "encoder_attention", _ENCODER_ATTENTION),
    "dsv4_csa_context_module": ("dsv4_csa_context_module_perf", "sparse_attention", _DSV4_MODULE),
    "dsv4_csa_generation_module": ("dsv4_csa_generation_module_perf", "sparse_attention", _DSV4_MODULE),
    "dsv4_hca_context_module": ("dsv4_hca_context_module_perf", "sparse_attention", _DSV4_MODULE),
    "dsv4_hca_generation_module": ("dsv4_hca_generation_module_perf", "sparse_attention", _DSV4_MODULE),
    "dsv4_paged_mqa_logits_module": ("dsv4_paged_mqa_logits_module_perf", "sparse_attention", _DSV4_KERNEL),
    "dsv4_hca_attn_module": ("dsv4_hca_attn_module_perf", "sparse_attention", _DSV4_KERNEL),
    "dsv4_csa_topk_calib": ("dsv4_csa_topk_calib_perf", "sparse_attention", (*_DSV4_MODULE, "score_mode")),
    "mhc": ("mhc_module_perf", "mhc", _MHC),
    "gdn": ("gdn_perf", "linear_attention", (*_LINEAR, "d_conv", "num_k_heads", "head_k_dim", "num_v_heads",
                                             "head_v_dim", "model_name")),
    "mamba2": ("mamba2_perf", "linear_attention", (*_LINEAR, "d_state", "d_conv", "nheads", "head_dim", "n_groups",
                                                   "chunk_size", "model_name")),
    "dsa_context_module": ("dsa_context_module_perf", "sparse_attention", ("op_name", *_MLA_MODULE)),
    "dsa_generation_module": ("dsa_generation_module_perf", "sparse_attention", ("op_name", *_MLA_MODULE)),
    "glm5_mqa_logits_module": ("glm5_mqa_logits_module_perf", "sparse_attention", (*_MLA_MODULE, "compress_ratio")),
    "glm5_topk_module": ("glm5_topk_module_perf", "sparse_attention", (*_MLA_MODULE, "compress_ratio", "score_mode")),
    "glm5_dsa_attn_module": ("glm5_dsa_attn_module_perf", "sparse_attention", (*_MLA_MODULE, "compress_ratio")),
    "msa_context_module": ("msa_context_module_perf", "msa", _MLA_MODULE),
    "msa_generation_module": ("msa_generation_module_perf", "msa", _MLA_MODULE),
    "comm": ("nccl_perf", "comm", ("nccl_dtype", "op_name", "num_gpus", "message_size")),
    "custom_allreduce": ("custom_allreduce_perf", "comm", ("allreduce_dtype", "num_gpus", "message_size", "backend")),
}  # fmt: skip
# fields that hold names (dtypes, a distribution, a model); every other field is a count or a size
TEXT_FIELDS = frozenset(
    {"gemm_dtype", "attn_dtype", "kv_cache_dtype", "moe_dtype", "distribution", "mla_dtype", "model"}
    | {"architecture", "gemm_type", "nccl_dtype", "op_name", "allreduce_dtype", "backend"}
    | {"quant_dtype", "bmm_dtype"}
    | {"score_mode"}  # dsv4_csa_topk_calib, glm5_topk_module
    | {"stage", "phase", "model_name"}  # gdn, mamba2
)
# counts that may be 0: the first decode step, and window_size 0 for full attention
ZERO_FIELDS = frozenset({"step", "window_size"})
# the largest count or size a case (or a model config) may hold: far above any model, far below what overflows
MAX_DIM = 2**40
MAX_PLAN_BYTES = 1024 * MIB  # every op of every model on one SM plans a few MB
PLAN_FIX = "write one with `opcollect plan -o`"
MAX_TEXT = 128


def id_template(op: str, fields: Sequence[str], dtype_field: str, dtype: object) -> str:
    """A %-template for ``op:<dtype>:field=value,...`` over every field but the dtype field.

    The group's dtype is written into the prefix; its own slot in the value tuple prints nothing (%.0s),
    so a raw value tuple formats directly, which is twice as fast as str.format.
    """
    body = ""
    for name in fields:
        if name == dtype_field:
            body += "%.0s"
        else:
            body += ("," if "=" in body else "") + f"{name}=%s"
    return f"{op}:{dtype}:{body}"


@cache
def case_type(op: str, fields: tuple[str, ...]) -> type:
    """The case record of an op with these fields: a namedtuple, so runners read ``case.m``."""
    return namedtuple(f"{op}_case", fields)


class Row(NamedTuple):
    """One task of the runtime: a batch of cases timed together (batch_rows), or one case."""

    row_id: str
    dispatch: str
    case_ids: tuple[str, ...]


@dataclass(frozen=True)
class PlannedOp:
    """One op of a plan file: typed cases in run order, with IDs, dispatch and rows."""

    op: str
    table: str
    family: str
    op_name: str | None
    fields: tuple[str, ...]
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


def read_plan_json(path: Path, tree: Path | None = None) -> object:
    """The JSON of a plan file, read by opcollect.inputs (a regular file of at most MAX_PLAN_BYTES, of bounded
    nesting); ``tree`` is the run directory that holds it, if one does."""
    try:
        return read_json(path, "plan", PLAN_FIX, limit=MAX_PLAN_BYTES, tree=tree)
    except NotJson as exc:
        raise InputError(f"{path}: not a plan file ({exc.detail}); {PLAN_FIX}") from None


class Broken(Exception):
    """A field of a plan file that is missing or of the wrong kind: (field path, what is wrong)."""


def _field(data: dict, key: str, kind: type | tuple, where: str = ""):
    value = data.get(key) if isinstance(data, dict) else None
    if not isinstance(value, kind):
        raise Broken(f"{where}{key}", "missing" if value is None else f"not a {getattr(kind, '__name__', kind)}")
    return value


def _check_column(where: str, field: str, column: list) -> None:
    """Every value of a case column is of its field's kind and within bounds: a name is a short string, a count
    an int (never a bool, a float or Infinity) from 1 (0 where ZERO_FIELDS allows it) to MAX_DIM."""
    if field in TEXT_FIELDS:
        bad = next((v for v in column if type(v) is not str or not 0 < len(v) <= MAX_TEXT), None)
        if bad is not None:
            raise Broken(f"{where}columns.{field}", f"{bad!r} is not a name of 1 to {MAX_TEXT} characters")
        return
    low = 0 if field in ZERO_FIELDS else 1
    bad = next((v for v in column if type(v) is not int or not low <= v <= MAX_DIM), None)
    if bad is not None:
        shown = repr(bad) if type(bad) is not int or bad.bit_length() < 64 else f"an integer of {bad.bit_length()} bits"
        raise Broken(f"{where}columns.{field}", f"{shown} is not an integer from {low} to 2**40")


def _parse_rows(where: str, raw_rows: list, ids: list[str]) -> list[Row]:
    """Batch rows that cover every case of the op exactly once."""
    rows: list[Row] = []
    for r in raw_rows:
        case_ids = _field(r, "case_ids", list, f"{where}rows.")
        rows.append(Row(_field(r, "row_id", str, f"{where}rows."), _field(r, "dispatch", str, f"{where}rows."),
                        tuple(case_ids)))  # fmt: skip
    covered = [cid for row in rows for cid in row.case_ids]
    if sorted(covered, key=str) != sorted(ids):
        raise Broken(f"{where}rows", "do not hold every case ID exactly once")
    return rows


def _parse_op(name: str, raw: dict, typed: bool) -> tuple[PlannedOp, list[str]]:
    """One op of the file, with its canonical lines; every case ID is re-derived from its columns."""
    where = f"ops.{name}."
    known = OP_FIELDS.get(name)
    if known is None:
        raise Broken(f"ops.{name}", f"is not an op opcollect runs ({', '.join(OP_FIELDS)})")
    fields = tuple(_field(raw, "fields", list, where))
    dtype_field = _field(raw, "dtype_field", str, where)
    if fields != known[2] or dtype_field not in fields:
        raise Broken(f"{where}fields", f"{list(fields)} are not the fields of {name}: {list(known[2])}")
    ids = _field(raw, "case_id", list, where)
    dispatch = _field(raw, "dispatch", list, where)
    raw_columns = _field(raw, "columns", dict, where)
    columns = [_field(raw_columns, f, list, f"{where}columns.") for f in fields]
    if any(len(c) != len(ids) for c in columns) or len(dispatch) != len(ids):
        raise Broken(f"{where}columns", f"column or dispatch lengths differ from the {len(ids)} case IDs")
    if not all(type(d) is str for d in dispatch):
        raise Broken(f"{where}dispatch", "holds a value that is not a string")
    for field, column in zip(fields, columns):
        _check_column(where, field, column)
    values = list(zip(*columns)) if ids else []
    dtypes = columns[fields.index(dtype_field)]
    templates = {d: id_template(name, fields, dtype_field, d) for d in set(dtypes)}
    if len(templates) == 1:
        derived = list(map(next(iter(templates.values())).__mod__, values))
    else:
        derived = [templates[d] % v for d, v in zip(dtypes, values)]
    if derived != ids:
        at = next(i for i, (a, b) in enumerate(zip(derived, ids)) if a != b)
        raise Broken(f"{where}columns", f"case {ids[at]} holds {derived[at]}")
    raw_rows = raw.get("rows")
    batched = None if raw_rows is None else _parse_rows(where, _field(raw, "rows", list, where), ids)
    lines = canonical_lines(ids, dispatch, batched)
    table, family = _field(raw, "table", str, where), _field(raw, "family", str, where)
    if (table, family) != known[:2]:
        raise Broken(f"{where}table", f"{table} ({family}) is not {name}'s table {known[0]} ({known[1]})")
    op_name = raw.get("op_name")
    if op_name is not None and type(op_name) is not str:
        raise Broken(f"{where}op_name", "not a string")
    if not typed:  # verification only: the runtime's typed cases and one-case rows are not needed
        return PlannedOp(name, table, family, op_name, fields, [], ids, dispatch, batched or []), lines
    rows = batched if batched is not None else [Row(case_id, d, (case_id,)) for case_id, d in zip(ids, dispatch)]
    cases = list(map(case_type(name, fields)._make, values))
    return PlannedOp(name, table, family, op_name, fields, cases, ids, dispatch, rows), lines


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
        if backend not in BACKENDS:  # a plan names a backend, never a module: data chooses no code
            raise Broken("backend", f"{backend!r} is not one of {', '.join(BACKENDS)}")
        if sm not in SMS:
            raise Broken("sm", f"{sm!r} is not one of {', '.join(SMS)}")
        shard_raw = data.get("shard")
        shard = (
            None
            if shard_raw is None
            else (_field(shard_raw, "index", int, "shard."), _field(shard_raw, "count", int, "shard."))
        )
        if shard is not None and not 0 <= shard[0] < shard[1] <= MAX_DIM:
            raise Broken("shard", f"{shard[0]}/{shard[1]} is not the i-th of N shards (0 <= i < N)")
        selection = _field(data, "selection", dict)
        ops: dict[str, PlannedOp] = {}
        lines: list[str] = []
        for name, raw in _field(data, "ops", dict).items():
            if not name.isidentifier():
                raise Broken(f"ops.{name}", "is not an op name")
            ops[name], op_lines = _parse_op(name, raw, typed)
            lines.extend(op_lines)
        whole = _field(data, "plan_hash", str)
        lines.sort()
        if shard is None and plan_hash(plan_header(backend, sm), lines, presorted=True) != whole:
            raise Broken("plan_hash", "differs from the hash of the cases the file holds")
        stated = _field(data, "content_hash", str)
        if content_hash(backend, sm, whole, shard, selection, lines, presorted=True) != stated:
            raise Broken("content_hash", "differs from the hash of what the file holds")
        collector = _field(data, "collector_hash", str)
    except Broken as exc:
        field, problem = exc.args
        raise InputError(f"{path}: field '{field}': {problem}; the plan was edited or is damaged, re-plan") from None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InputError(
            f"{path}: malformed plan ({type(exc).__name__}: {exc}); re-plan with `opcollect plan -o`"
        ) from None
    return PlanFile(backend, sm, collector, whole, data["content_hash"], shard, selection, ops)


def read_plan(path: Path) -> PlanFile:
    """The plan `run --plan PATH` names; a file that cannot be read as one names the flag."""
    try:
        data = read_plan_json(path)
    except InputError as exc:
        raise InputError(f"--plan {exc}") from None
    return parse_plan(path, data)
