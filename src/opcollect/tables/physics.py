"""Rule R8 of `opcollect check`: rows faster than their system's speed of light (plans/bound.py), over our
tables and, with `check --against-physics`, over any aiconfigurator tree.

R8: rows under the bound are counted per table (a warning, a failure with --strict, as R7's noise); a warning
per table gives the fraction of speed of light (bound / latency: median and p10) and counts rows under 1% of it.
"""

from __future__ import annotations

import math
import statistics
from functools import cache
from pathlib import Path

import pyarrow as pa

from opcollect.cases.systems import System
from opcollect.plans.base import OpPlan
from opcollect.plans.bound import Bound, Figures, bound, datasheet, probed
from opcollect.tables.rules import MAX_KEYS, Finding
from opcollect.tables.schema import TableSchema

SLOW = 0.01  # rows under this fraction of speed of light are counted in the warning


def _mib(n: float) -> str:
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def r8(path: Path, perf: pa.Table, schema: TableSchema, figures: Figures, strict: bool) -> list[Finding]:
    """R8 over one table: rows faster than the system allows, and the table's fraction of speed of light."""
    op: OpPlan = schema.op
    if op.work is None:
        return []
    columns = [schema.column(name) for name in op.fields]  # None: a field this backend's table has no column for
    missing = [c for c in (*columns, "latency") if c is not None and c not in perf.column_names]
    if missing:
        return [Finding("R8", str(path), "no bound: key columns missing", tuple(missing), warning=True)]
    values = [perf[c].to_pylist() if c is not None else [None] * perf.num_rows for c in columns]
    latencies = perf["latency"].to_pylist()
    fast, fractions = [], []
    for row, (latency, *fields) in enumerate(zip(latencies, *values)):
        work = op.work(op.case_type(*fields))
        if work is None or latency is None or not 0 < latency < math.inf:  # R3 names the others
            continue
        b = bound(work, figures)
        if b.seconds <= 0:
            continue
        bound_ms = b.seconds * 1e3  # tables hold milliseconds; a subnormal latency in seconds would be 0
        fractions.append((bound_ms / latency, row))
        if latency < bound_ms:
            fast.append((row, latency, b))
    found = []
    if fast:
        keys = tuple(_row(columns, values, row, latency, b, figures) for row, latency, b in fast[:MAX_KEYS])
        message = f"{len(fast)} rows faster than the {figures.system} allows (latency < speed-of-light bound)"
        found.append(Finding("R8", str(path), message, keys, warning=not strict))
    if fractions:
        ordered = sorted(f for f, _ in fractions)
        p10 = ordered[int(0.1 * (len(ordered) - 1))]
        slow = [row for f, row in fractions if f < SLOW]
        message = (
            f"speed of light on {figures.system}: median {statistics.median(ordered):.1%}, p10 {p10:.1%} of "
            f"{len(ordered)} rows; {len(slow)} rows under {SLOW:.0%} of it"
        )
        shown = tuple(_key(columns, values, row) for row in slow[:MAX_KEYS])
        found.append(Finding("R8", str(path), message, shown, warning=True))
    return found


def _key(columns: list[str], values: list[list], row: int) -> str:
    return ",".join(f"{c}={v[row]}" for c, v in zip(columns, values) if c is not None)


def _row(columns, values, row: int, latency: float, b: Bound, f: Figures) -> str:
    text = f"{_key(columns, values, row)}: latency {latency:.5g} ms < bound {b.seconds * 1e3:.5g} ms ({b.limit}"
    if b.limit == "memory" and b.bytes <= f.cache_bytes:
        text += f"; its {_mib(b.bytes)} fit the {_mib(f.cache_bytes)} L2: timed warm"
    return text + ")"


# the consumer's system names where they differ from ours (systems/rtx_pro_6000.yaml: aiconfigurator-core's
# rtx_pro_6000_server.yaml)
ALIASES = {"rtx_pro_6000_server": "rtx_pro_6000"}


@cache
def project_systems() -> dict[str, System]:
    """systems/*.yaml of this package's checkout, read once per process."""
    from opcollect.cases.systems import load_systems
    from opcollect.project import find_project

    return load_systems(find_project().systems)


def figures_for(system: System, record_path: Path | None) -> Figures | None:
    """The system's figures: the datasheet's for a GPU; for the CPU the probe the provenance record at
    ``record_path`` holds (None: no probe recorded, no bound)."""
    if system.sm != "cpu":
        return datasheet(system)
    if record_path is None or not record_path.is_file():
        return None
    from opcollect.tables.provenance import read_provenance

    host = read_provenance(record_path).system.host_figures
    return probed(system, host) if host is not None else None


def r8_record(path: Path, perf: pa.Table, schema: TableSchema, record, strict: bool) -> list[Finding]:
    """R8 for one of our tables, its system named by its provenance record (check's hook)."""
    from opcollect.errors import InputError

    try:
        system = project_systems().get(record.system.name)
    except InputError as exc:
        return [Finding("R8", str(path), f"no bound: {exc}", warning=True)]
    if system is None:
        return [Finding("R8", str(path), f"no bound: no systems/{record.system.name}.yaml", warning=True)]
    if system.sm == "cpu":
        host = record.system.host_figures
        if host is None:
            return [Finding("R8", str(path), "no bound: its runs recorded no host figures", warning=True)]
        return r8(path, perf, schema, probed(system, host), strict)
    return r8(path, perf, schema, datasheet(system), strict)


def _system_of(name: str, systems: dict[str, System]) -> System | None:
    return systems.get(ALIASES.get(name, name))


def system_roots(root: Path, systems: dict[str, System], name: str | None) -> list[tuple[Path, System]]:
    """The directories of ``root`` whose tables one system measured: TABLES (<root>/<system>/<family>/...), or a
    tree of one system (<root>/<family>/<framework>/<version>/, with <system>.yaml at the root)."""
    from opcollect.errors import InputError

    if name is not None:
        chosen = _system_of(name, systems)
        if chosen is None:
            raise InputError(f"--system {name}: no such system; use one of {', '.join(sorted(systems))}")
    dirs = sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    per_system = [(d, _system_of(d.name, systems)) for d in dirs]
    if any(s is not None for _, s in per_system):
        return [(d, chosen if name is not None else s) for d, s in per_system if s is not None]
    if name is not None:
        return [(root, chosen)]
    specs = [s for p in sorted(root.glob("*.yaml")) if (s := _system_of(p.stem, systems)) is not None]
    if len(specs) != 1:
        found = "several system specs" if specs else "no <system>.yaml nor <system>/ directory"
        raise InputError(f"{root}: {found} at its root, so the system is unknown; pass --system NAME")
    return [(root, specs[0])]


def against_physics(root: Path, system: str | None = None, strict: bool = False) -> list[Finding]:
    """R8 over any aiconfigurator tree, legacy tables included: every parquet file named as one of our tables,
    its key columns as the reference names them."""
    from opcollect.errors import InputError
    from opcollect.tables.provenance import PROVENANCE
    from opcollect.tables.schema import read_parquet, read_parquet_schema, schemas

    root = Path(root)
    if not root.is_dir():
        raise InputError(f"--against-physics {root}: no such directory; give an aiconfigurator tree")
    systems = project_systems()
    tables = schemas()
    found: list[Finding] = []
    unbounded: set[str] = set()
    for directory, spec in system_roots(root, systems, system):
        for path in sorted(directory.rglob("*.parquet")):
            if any(part.startswith(".") for part in path.relative_to(root).parts):
                continue  # our extras (failures, plans) and other hidden files
            schema = tables.get(path.stem)
            if schema is None or schema.op.work is None:
                unbounded.add(path.stem)
                continue
            schema = schema.for_columns(read_parquet_schema(path).names)
            figures = figures_for(spec, path.parent / PROVENANCE)
            if figures is None:
                found.append(Finding("R8", str(path), "no bound: a CPU table without host figures", warning=True))
                continue
            found += r8(path, read_parquet(path), schema, figures, strict)
    if unbounded:  # tables of ops opcollect does not plan, and compute_scale (a difference of timings)
        found.append(Finding("R8", str(root), "no bound for these tables", tuple(sorted(unbounded)), warning=True))
    return found
