"""What the runtime asks of a backend, and what a backend hands back.

A backend is a module (``opcollect.backends.<name>``) with:
  identity(device) -> dict          framework, version, python, torch, cuda, driver, nccl_version, device name
  setup_worker(device, threads)     select the device, set thread counts; called once per worker
  free_memory(device) -> int        bytes a case may still allocate
  footprint(op, case) -> int        bytes one measurement of the case allocates with one input set
  measure(op, dispatch, cases, device, config) -> list[Measured]   one per case, in order
Framework imports stay inside those functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from opcollect.runtime.harness import Stats


class KernelLimit(Exception):
    """The kernel, or a refusal before allocation, says no: the case cannot run on this device."""


@dataclass(frozen=True)
class Prepared:
    """One case ready to time: ``call`` runs it once, on the next input set when there are several."""

    call: Callable[[], None]
    kernel_source: str
    graph_safe: bool = True  # False when the op syncs with the host or cannot be captured


@dataclass(frozen=True)
class Measured:
    stats: Stats
    kernel_source: str
