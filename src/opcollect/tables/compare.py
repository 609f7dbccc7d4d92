"""`opcollect compare OLD NEW`: join two tables on their key columns and report NEW/OLD.

OLD and NEW are perf parquet files, or directories holding them (a table directory, or a TABLES tree
with one table of the op). Rows join on op_name and the table's key fields, so tables of different
frameworks, versions or kernels compare: ours against the reference tables, or two runs of ours.
"""

from __future__ import annotations

import io
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from opcollect.errors import InputError
from opcollect.files import write_atomic
from opcollect.tables.schema import TableSchema, read_parquet, read_parquet_schema, schemas
from opcollect.tables.values import measured_faults

STEP_TOLERANCE = 0.05  # a latency that drops by more than this along the sweep axis is non-monotonic


@dataclass(frozen=True)
class Comparison:
    table: str
    shared: int
    median: float
    p10: float
    p90: float
    largest: list[tuple[str, float, float, float]]  # key, old, new, ratio
    non_monotonic: list[tuple[str, float, float]]  # key at the step, latency before, latency after
    axis: str
    points: list[tuple[float, float]]  # (sweep axis value, ratio)
    left_out: list[str] = field(default_factory=list)  # per table, the rows no ratio is taken of, and why


def _resolve(path: Path, op: str | None, like: Path | None = None) -> tuple[Path, TableSchema]:
    """The one perf table of ``op`` at ``path``; ``like``: OLD's table, whose op ``op`` is (NEW must hold it)."""
    path = Path(path)
    if path.is_file():
        candidates = [path]
    elif path.is_dir():
        candidates = sorted(path.rglob("*_perf.parquet"))
    else:
        raise InputError(f"{path}: no such table or directory")
    wanted = {s.name: s for s in schemas().values() if op is None or s.op.name == op or s.name == op}
    matches = [(p, wanted[p.stem]) for p in candidates if p.stem in wanted]
    if len(matches) != 1:
        names = sorted({p.stem for p, _ in matches}) or sorted({p.stem for p in candidates})
        found = ", ".join(names) or "none"
        if like is not None and not matches:  # --op cannot help: NEW holds no table of OLD's op
            raise InputError(
                f"{path}: no {like.stem} table to compare with OLD's {like} (found: {found}); give two tables of one op"
            )
        raise InputError(f"{path}: {len(matches)} tables match; pick one with --op (found: {found})")
    found, schema = matches[0]
    names = read_parquet_schema(found).names
    return found, schema.for_columns(names)  # e.g. TRT-LLM's own column names


def _measured(path: Path, table: pa.Table) -> tuple[pa.Table, str | None]:
    """The rows whose latency passes the value rule (finite and positive), and a line naming those left out."""
    [fault] = measured_faults(table.select(["latency"])) or [None]
    if fault is None:
        return table, None
    return table.filter(pc.invert(fault.mask)), f"{path}: left out {fault.count} rows: {fault.what}"


def _key(schema: TableSchema) -> list[str]:
    return ["op_name", *schema.field_columns]


def non_monotonic_steps(table: pa.Table, schema: TableSchema) -> list[tuple[str, float, float]]:
    """Steps along the sweep axis where latency drops by more than STEP_TOLERANCE, other keys fixed."""
    axis = schema.sweep_axis
    others = [k for k in _key(schema) if k != axis] + ["kernel_source"]
    rows = table.select([*others, axis, "latency"]).sort_by([(c, "ascending") for c in [*others, axis]]).to_pylist()
    steps = []
    for before, after in zip(rows, rows[1:]):
        same_series = all(before[c] == after[c] for c in others)
        if same_series and after["latency"] < before["latency"] * (1 - STEP_TOLERANCE):
            label = ",".join(f"{k}={after[k]}" for k in _key(schema))
            steps.append((label, before["latency"], after["latency"]))
    return steps


def compare_tables(old_path: Path, new_path: Path, op: str | None = None) -> Comparison:
    old_file, schema = _resolve(old_path, op)
    new_file, new_schema = _resolve(new_path, op or schema.op.name, like=None if op else old_file)
    if new_schema.name != schema.name:
        raise InputError(f"{old_file.name} and {new_file.name} are different tables; pick one with --op")
    keys = _key(schema)
    old, old_left = _measured(old_file, read_parquet(old_file, columns=[*keys, "latency"]))
    old = old.rename_columns([*keys, "old"])
    new_full, new_left = _measured(new_file, read_parquet(new_file))
    new = new_full.select([*keys, "latency"]).rename_columns([*keys, "new"])
    # several kernels per key (old reference tables): compare the fastest, which a simulator would pick
    old = old.group_by(keys).aggregate([("old", "min")]).rename_columns([*keys, "old"])
    new = new.group_by(keys).aggregate([("new", "min")]).rename_columns([*keys, "new"])
    joined = old.join(new, keys, join_type="inner").sort_by([(k, "ascending") for k in keys])
    if joined.num_rows == 0:
        raise InputError(f"{old_file} and {new_file} share no key; are they the same op and grid?")
    ratio = pc.divide(joined["new"], joined["old"]).to_pylist()
    rows = joined.to_pylist()
    ranked = sorted(zip(rows, ratio), key=lambda item: -abs(math.log(item[1])) if item[1] > 0 else -math.inf)
    largest = [(",".join(f"{k}={r[k]}" for k in keys), r["old"], r["new"], q) for r, q in ranked[:10]]
    axis = schema.sweep_axis
    deciles = statistics.quantiles(ratio, n=10, method="inclusive") if len(ratio) > 1 else ratio * 9
    return Comparison(
        table=schema.name,
        shared=joined.num_rows,
        median=statistics.median(ratio),
        p10=deciles[0],
        p90=deciles[-1],
        largest=largest,
        non_monotonic=non_monotonic_steps(new_full, schema),
        axis=axis,
        points=[(float(r[axis]), q) for r, q in zip(rows, ratio)],
        left_out=[line for line in (old_left, new_left) if line is not None],
    )


def render(c: Comparison) -> str:
    lines = [
        f"{c.table}: {c.shared} shared keys; NEW/OLD median {c.median:.3f}, p10 {c.p10:.3f}, p90 {c.p90:.3f}",
        "largest deviations:",
    ]
    lines += [f"  {key}: old {old:.6g} ms, new {new:.6g} ms, ratio {q:.3f}" for key, old, new, q in c.largest]
    lines.append(f"non-monotonic steps along {c.axis} in NEW (drop > {STEP_TOLERANCE:.0%}): {len(c.non_monotonic)}")
    lines += [f"  {key}: {a:.6g} -> {b:.6g} ms" for key, a, b in c.non_monotonic[:10]]
    lines += [f"warning: {line}" for line in c.left_out]
    return "\n".join(lines) + "\n"


def plot(c: Comparison, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("--plot needs matplotlib: pip install 'opcollect[plot]'") from None
    fig, ax = plt.subplots(figsize=(8, 5))
    xs, ys = zip(*c.points)
    ax.scatter(xs, ys, s=4, alpha=0.4)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(c.axis)
    ax.set_ylabel("latency NEW / OLD")
    ax.set_title(f"{c.table}: {c.shared} keys, median {c.median:.3f}")
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=120)
    plt.close(fig)
    write_atomic(path, image.getvalue())  # the one writer: a link planted at --plot is replaced, not followed
