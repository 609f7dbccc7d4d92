"""`opcollect compare OLD NEW`: join two tables on their key columns, report NEW/OLD, and say which rows moved.

OLD and NEW are perf parquet files, or directories holding them (a table directory, or a TABLES tree
with one table of the op). Rows join on op_name and the table's key fields, so tables of different
frameworks, versions or kernels compare: ours against the reference tables, or two runs of ours.
Each shared key is classified same, faster, slower or ambiguous from the two rows' p25-p75 intervals and
sample counts (tables/noise.py, after nvbench's robust compare); rows without quartiles by their ratio.
"""

from __future__ import annotations

import io
import math
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from opcollect.errors import InputError
from opcollect.files import write_atomic
from opcollect.tables.noise import (
    AMBIGUOUS,
    DEFAULT_THRESHOLDS,
    FASTER,
    MOVED,
    SAME,
    SLOWER,
    VERDICTS,
    Measured,
    Thresholds,
    classify,
)
from opcollect.tables.schema import TableSchema, read_parquet, read_parquet_schema, schemas
from opcollect.tables.values import measured_faults, schema_untimed

STEP_TOLERANCE = 0.05  # a latency that drops by more than this along the sweep axis is non-monotonic
QUARTILES = ("latency_p25", "latency_p75", "samples")  # absent from the reference tables: those compare by ratio
SHOWN = 10  # rows printed per list


class RowVerdict(NamedTuple):
    key: str  # op_name=...,<field>=... of the shared key
    axis: float  # its value on the table's sweep axis
    old: Measured
    new: Measured
    verdict: str  # one of noise.VERDICTS
    reason: str

    @property
    def ratio(self) -> float:
        return self.new.latency / self.old.latency


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
    rows: list[RowVerdict] = field(default_factory=list)  # every shared key with its verdict, in key order
    thresholds: Thresholds = DEFAULT_THRESHOLDS
    old_file: Path | None = None
    new_file: Path | None = None

    @property
    def counts(self) -> dict[str, int]:
        counted = Counter(r.verdict for r in self.rows)
        return {v: counted[v] for v in VERDICTS}

    @property
    def changes(self) -> list[RowVerdict]:
        """The rows that really moved (faster or slower), the largest change first."""
        moved = [r for r in self.rows if r.verdict in MOVED]
        return sorted(moved, key=lambda r: -abs(math.log(r.ratio)))

    @property
    def by_ratio(self) -> int:
        """Rows judged by their ratio alone: one of the two has no quartiles (a reference table's)."""
        return sum(1 for r in self.rows if not (r.old.has_interval and r.new.has_interval))


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


def _measured(path: Path, table: pa.Table, schema: TableSchema) -> tuple[pa.Table, list[str]]:
    """The rows a ratio is taken of, and a line per reason naming those left out: latency must pass the value rule
    (finite and positive; >= 0 for an op whose latency is a difference of two timings), and a difference of 0 is a
    value but no ratio."""
    left = []
    untimed = schema_untimed(table, schema)  # zero-latency cases (OpPlan.zero_latency)
    faults = measured_faults(table.select(["latency"]), difference=schema.op.latency_is_difference, untimed=untimed)
    [fault] = faults or [None]
    if fault is not None:
        table = table.filter(pc.invert(fault.mask))
        left.append(f"{path}: left out {fault.count} rows: {fault.what}")
    zero = pc.equal(table["latency"], 0)
    zeros = pc.sum(zero).as_py() or 0
    if zeros:
        table = table.filter(pc.invert(zero))
        why = "a difference of two timings" if schema.op.latency_is_difference else "a case the plan holds at 0"
        left.append(f"{path}: left out {zeros} rows: latency 0 ({why}), no ratio")
    return table, left


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


def _fastest(table: pa.Table, keys: list[str]) -> dict[tuple, Measured]:
    """Per key, the fastest row's timing: several kernels per key (old reference tables) compare by the fastest,
    which a simulator would pick. Quartiles come with it where the table has them."""
    quartiles = all(c in table.column_names for c in QUARTILES)
    table = table.select([*keys, "latency", *(QUARTILES if quartiles else ())])
    fastest: dict[tuple, Measured] = {}
    for r in table.sort_by([("latency", "ascending")]).to_pylist():
        key = tuple(r[k] for k in keys)
        if key not in fastest:
            extra = [r[c] for c in QUARTILES] if quartiles else []
            fastest[key] = Measured(r["latency"], *extra)
    return fastest


def compare_tables(
    old_path: Path, new_path: Path, op: str | None = None, thresholds: Thresholds = DEFAULT_THRESHOLDS
) -> Comparison:
    old_file, schema = _resolve(old_path, op)
    new_file, new_schema = _resolve(new_path, op or schema.op.name, like=None if op else old_file)
    if new_schema.name != schema.name:
        raise InputError(f"{old_file.name} and {new_file.name} are different tables; pick one with --op")
    keys = _key(schema)
    wanted = [*keys, "latency", *(c for c in QUARTILES if c in read_parquet_schema(old_file).names)]
    old_rows, old_left = _measured(old_file, read_parquet(old_file, columns=wanted), schema)
    new_full, new_left = _measured(new_file, read_parquet(new_file), new_schema)
    old, new = _fastest(old_rows, keys), _fastest(new_full, keys)
    shared = sorted(old.keys() & new.keys())
    if not shared:
        raise InputError(f"{old_file} and {new_file} share no key; are they the same op and grid?")
    axis = schema.sweep_axis
    at = keys.index(axis)
    rows = [
        RowVerdict(",".join(f"{k}={v}" for k, v in zip(keys, key)), float(key[at]), old[key], new[key], *verdict)
        for key in shared
        for verdict in [classify(old[key], new[key], thresholds)]
    ]
    ratio = [r.ratio for r in rows]
    ranked = sorted(rows, key=lambda r: -abs(math.log(r.ratio)))
    deciles = statistics.quantiles(ratio, n=10, method="inclusive") if len(ratio) > 1 else ratio * 9
    return Comparison(
        table=schema.name,
        shared=len(rows),
        median=statistics.median(ratio),
        p10=deciles[0],
        p90=deciles[-1],
        largest=[(r.key, r.old.latency, r.new.latency, r.ratio) for r in ranked[:SHOWN]],
        non_monotonic=non_monotonic_steps(new_full, schema),
        axis=axis,
        points=[(r.axis, r.ratio) for r in rows],
        left_out=old_left + new_left,
        rows=rows,
        thresholds=thresholds,
        old_file=old_file,
        new_file=new_file,
    )


def version_pairs(old_tables: Path, new_tables: Path, backend: str, old: str, new: str) -> list[tuple[Path, Path]]:
    """Each perf table of ``backend`` at ``old`` under OLD_TABLES with its counterpart at ``new`` under NEW_TABLES
    (<system>/<family>/<backend>/<version>/<table>_perf.parquet, tables/consumer.py); the same tree may be both."""
    pairs = []
    for before in sorted(Path(old_tables).glob(f"*/*/{backend}/{old}/*_perf.parquet")):
        if before.stem not in schemas():
            continue  # no table opcollect writes: nothing to join it on
        system, family = before.parts[-5:-3]
        after = Path(new_tables) / system / family / backend / new / before.name
        if after.is_file():
            pairs.append((before, after))
    return pairs


def _timing(m: Measured) -> str:
    if not m.has_interval:
        return f"{m.latency:.6g} ms"
    return f"{m.latency:.6g} ms [{m.p25:.6g}-{m.p75:.6g}, {m.samples} samples]"


def describe_change(r: RowVerdict) -> str:
    return f"{r.verdict} x{r.ratio:.3f}: old {_timing(r.old)}, new {_timing(r.new)}; {r.reason}"


def render_change(r: RowVerdict) -> str:
    return f"{r.key}: {describe_change(r)}"


def render_counts(c: Comparison) -> str:
    counts = c.counts
    line = ", ".join(f"{counts[v]} {v}" for v in (SAME, FASTER, SLOWER, AMBIGUOUS))
    legacy = f" ({c.by_ratio} of them by ratio: no quartiles)" if c.by_ratio else ""
    return line + legacy


def render(c: Comparison) -> str:
    lines = [
        f"{c.table}: {c.shared} shared keys; NEW/OLD median {c.median:.3f}, p10 {c.p10:.3f}, p90 {c.p90:.3f}",
        f"verdicts: {render_counts(c)}",
        f"rule: {c.thresholds.describe()}",
        f"largest real changes ({len(c.changes)} rows faster or slower beyond both rows' noise):",
    ]
    lines += [f"  {render_change(r)}" for r in c.changes[:SHOWN]]
    lines.append("largest deviations:")
    lines += [f"  {key}: old {old:.6g} ms, new {new:.6g} ms, ratio {q:.3f}" for key, old, new, q in c.largest]
    lines.append(f"non-monotonic steps along {c.axis} in NEW (drop > {STEP_TOLERANCE:.0%}): {len(c.non_monotonic)}")
    lines += [f"  {key}: {a:.6g} -> {b:.6g} ms" for key, a, b in c.non_monotonic[:SHOWN]]
    lines += [f"warning: {line}" for line in c.left_out]
    return "\n".join(lines) + "\n"


COLORS = {SAME: "tab:gray", AMBIGUOUS: "tab:orange", FASTER: "tab:green", SLOWER: "tab:red"}


def plot(c: Comparison, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("--plot needs matplotlib: pip install 'opcollect[plot]'") from None
    fig, ax = plt.subplots(figsize=(8, 5))
    counts = c.counts
    for verdict in (SAME, AMBIGUOUS, FASTER, SLOWER):  # the moved rows last, drawn on top
        points = [(r.axis, r.ratio) for r in c.rows if r.verdict == verdict]
        if points:
            xs, ys = zip(*points)
            moved = verdict in MOVED
            ax.scatter(xs, ys, s=14 if moved else 5, alpha=0.9 if moved else 0.4, color=COLORS[verdict],
                       label=f"{verdict} ({counts[verdict]})")  # fmt: skip
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(c.axis)
    ax.set_ylabel("latency NEW / OLD")
    ax.set_title(f"{c.table}: {c.shared} keys, median {c.median:.3f}")
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=120)
    plt.close(fig)
    write_atomic(path, image.getvalue())  # the one writer: a link planted at --plot is replaced, not followed
