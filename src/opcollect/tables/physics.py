"""Speed of light: the least time a row's case can take on its system, and rule R8 of `opcollect check`.

bound(work, figures) = max(compute, memory, link):
  compute  sum over rates of the op's FLOPs at that rate / the system's dense tensor-core peak at it (a rate the
           system does not list: float32 takes bfloat16's, which is above TF32's and FP32's; another takes the
           system's highest)
  memory   the bytes the op must move at least once / the memory bandwidth
  link     the bytes each GPU must send one way (plans/comm.py link_bytes) / the link the GPUs share: NVLink within
           its domain, else PCIe within a node; beyond them the larger of that and the node's share over its
           network (plans/work.py, the plan modules' work functions, say what each op must do)

What the bound assumes. Datasheet peaks and bandwidths (systems/*.yaml), never reached in practice, so a row at
the bound is already impossible. Every operand crosses memory once: the harness keeps the L2 cold (runtime/
timing.py flushes it or rotates inputs through 3x its size), as the consumer's tables are read to model serving.
A row under the bound whose bytes fit the L2 is what a warm L2 gives (the reference's H200 GEMM rows at m=32768,
n=32/64, k=512: x is 32 MiB, the L2 50 MiB); R8 names it all the same, and says its bytes fit the L2. On the CPU
the harness times one input set in place with warm caches, so the memory term counts only bytes beyond the last-
level cache, and the figures are the run's own probe (runtime/hostprobe.py) times CPU_HEADROOM, since a probe of
a few hundred ms on a shared host measures what torch reached then, not the silicon's peak.

R8: rows under the bound are counted per table (a warning, a failure with --strict, as R7's noise); a warning
per table gives the fraction of speed of light (bound / latency: median and p10) and counts rows under 1% of it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Mapping, NamedTuple

import pyarrow as pa

from opcollect.cases.systems import System
from opcollect.plans.base import OpPlan
from opcollect.plans.work import Work
from opcollect.tables.provenance import HostFigures
from opcollect.tables.rules import MAX_KEYS, Finding
from opcollect.tables.schema import TableSchema

CPU_HEADROOM = 4.0  # probed CPU figures x this: contention and clocks on a shared host move a probe about 2x
SLOW = 0.01  # rows under this fraction of speed of light are counted in the warning


@dataclass(frozen=True)
class Figures:
    """What the bound reads of one system: datasheet figures, or a CPU host's probe."""

    system: str
    rates: Mapping[str, float]  # FLOP/s by rate name (plans/work.py Peak)
    memory: float  # bytes/s
    cache_bytes: int  # the L2 (GPU) or last-level cache (CPU)
    warm: bool  # rows are timed with warm caches (the CPU): memory counts only bytes beyond cache_bytes
    nvlink: float | None  # bytes/s per GPU one way; None: no NVLink
    nvlink_gpus: int
    pcie: float
    network: float
    gpus_per_node: int

    def rate(self, peak: str | None) -> float:
        if peak in self.rates:
            return self.rates[peak]
        if peak == "float32" and "bfloat16" in self.rates:
            return self.rates["bfloat16"]
        return max(self.rates.values())


def datasheet(system: System) -> Figures:
    return Figures(
        system=system.name,
        rates=system.dense_tflops.rates(),
        memory=float(system.bandwidth_bytes_per_s),
        cache_bytes=system.l2_bytes,
        warm=False,
        nvlink=None if system.nvlink_bytes_per_s is None else float(system.nvlink_bytes_per_s),
        nvlink_gpus=system.nvlink_gpus,
        pcie=float(system.pcie_bytes_per_s),
        network=float(system.network_bytes_per_s),
        gpus_per_node=system.gpus_per_node,
    )


def probed(system: System, host: HostFigures) -> Figures:
    """A CPU system bounded by what its run measured (x CPU_HEADROOM); gloo's collectives are memory copies."""
    copy = host.bandwidth_bytes_per_s * CPU_HEADROOM
    return Figures(
        system=system.name,
        rates={name: value * 1e12 * CPU_HEADROOM for name, value in host.dense_tflops.items()},
        memory=copy,
        cache_bytes=host.cache_bytes or system.l2_bytes,
        warm=True,
        nvlink=None,
        nvlink_gpus=1,
        pcie=copy,
        network=copy,
        gpus_per_node=system.gpus_per_node,
    )


class Bound(NamedTuple):
    seconds: float
    limit: str  # compute, memory or link: the term that sets it
    bytes: float  # the memory bytes the work moves


def link_seconds(work: Work, f: Figures) -> float:
    if work.gpus <= 1 or not work.link_bytes:
        return 0.0
    if f.nvlink is not None and work.gpus <= f.nvlink_gpus:
        return work.link_bytes / f.nvlink
    inside = work.link_bytes / (f.nvlink if f.nvlink is not None else f.pcie)
    if work.gpus <= f.gpus_per_node:
        return inside
    # beyond a node (or an NVLink domain): of what each GPU sends, the share held by GPUs outside its node must
    # cross the node's NICs, which its g GPUs share: link_bytes x (n - g) / (n - 1) / g per NIC at least
    g = max(f.gpus_per_node, f.nvlink_gpus if f.nvlink is not None else 1)
    outside = work.link_bytes * (work.gpus - g) / (work.gpus - 1) / g / f.network
    return max(inside, outside)


def bound(work: Work, f: Figures) -> Bound:
    compute = sum(flops / f.rate(peak) for peak, flops in work.flops.items())
    memory = 0.0 if f.warm and work.bytes <= f.cache_bytes else work.bytes / f.memory
    link = link_seconds(work, f)
    seconds, limit = max((compute, "compute"), (memory, "memory"), (link, "link"))
    return Bound(seconds, limit, work.bytes)


def _mib(n: float) -> str:
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def r8(path: Path, perf: pa.Table, schema: TableSchema, figures: Figures, strict: bool) -> list[Finding]:
    """R8 over one table: rows faster than the system allows, and the table's fraction of speed of light."""
    op: OpPlan = schema.op
    if op.work is None:
        return []
    columns = [schema.column(name) for name in op.fields]
    missing = [c for c in (*columns, "latency") if c not in perf.column_names]
    if missing:
        return [Finding("R8", str(path), "no bound: key columns missing", tuple(missing), warning=True)]
    values = [perf[c].to_pylist() for c in columns]
    latencies = perf["latency"].to_pylist()
    fast, fractions = [], []
    for row, (latency, *fields) in enumerate(zip(latencies, *values)):
        work = op.work(op.case_type(*fields))
        if work is None or latency is None or latency <= 0:
            continue
        b = bound(work, figures)
        if b.seconds <= 0:
            continue
        seconds = latency / 1e3  # tables hold milliseconds
        fractions.append((b.seconds / seconds, row))
        if seconds < b.seconds:
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
    return ",".join(f"{c}={v[row]}" for c, v in zip(columns, values))


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
