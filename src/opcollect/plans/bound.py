"""The speed of light of a case: the least time its work (plans/work.py) can take on a system's figures.

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

No pyarrow here: the planner's cost model (plans/cost.py) draws on it; check R8 (tables/physics.py) too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, NamedTuple

from opcollect.cases.systems import System
from opcollect.plans.work import Work

if TYPE_CHECKING:
    from opcollect.tables.provenance import HostFigures

CPU_HEADROOM = 4.0  # probed CPU figures x this: contention and clocks on a shared host move a probe about 2x


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
