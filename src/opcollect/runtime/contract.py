"""What the runtime asks of a backend (Backend), how a backend finds its runners (Registry), and what
a backend hands back (Prepared, Measured).

A backend is a module (``opcollect.backends.<name>``) that satisfies Backend; framework imports stay inside
its functions. Its runners are keyed by (op, dispatch): every pair a plan of that backend emits must have
one (tests/test_backend_contract.py), and where a pinned version changes an API the runner is routed by
version.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from opcollect.runtime.harness import Stats
from opcollect.runtime.observe import Observed


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
    # what ran beneath the label where the framework picks per call (an all-reduce's communicator or strategy),
    # read from the objects it built, and what the framework's selection, as the runner models it, predicted
    ran: str | None = None
    expected: str | None = None
    # the kernels (ATen ops on the CPU) one more call launched after the samples (runtime/observe.py); None: a row
    # runner that does not observe
    observed: Observed | None = None


class Backend(Protocol):
    """The module interface of a backend, as the runtime calls it."""

    FRAMEWORK: str

    def identity(self, device: str) -> dict:
        """framework, version, python, torch, cuda, driver, nccl_version, device name."""

    def devices(self, requested: str, workers: int | None) -> list[str]:
        """The devices to start one worker on each (requested: auto, cpu or cuda)."""

    def device_sm(self, device: str) -> str:
        """The SM of a device as plans name it ('90', 'cpu')."""

    def free_memory(self, device: str) -> int:
        """Bytes a case may still allocate."""

    def setup_worker(self, device: str, threads: int | None) -> None:
        """Select the device, set thread counts: once per worker, before the first case."""

    def footprint(self, op: str, case: Any) -> int:
        """Bytes one measurement of the case allocates with one input set."""

    def measure(self, op: str, dispatch: str, cases: list, device: str, config: Any) -> list[Measured]:
        """One Measured per case, in order."""


ANY_DISPATCH = "*"


@dataclass(frozen=True)
class Runner:
    """How a backend times one op: per case (prepare) or a whole row of cases at once (measure_row)."""

    footprint: Callable[[Any], int]
    prepare: Callable[..., Prepared] | None = None  # (case, dispatch, device, copies) -> Prepared
    measure_row: Callable[..., list[Measured]] | None = None  # (cases, device, config) -> list[Measured]
    versions: frozenset[str] | None = None  # the framework versions it serves; None: every version
    # the cases the plan holds at latency exactly 0 (OpPlan.zero_latency, which the runtime does not import): the
    # harness writes them without running them (runtime/timing.py measure_cases, timing "none")
    untimed: Callable[[Any], bool] | None = None


class Registry:
    """A backend's runners keyed by (op, dispatch), each routed by framework version."""

    def __init__(self, backend: str):
        self.backend = backend
        self._runners: dict[tuple[str, str], list[Runner]] = {}

    def add(self, op: str, runner: Runner, dispatches: tuple[str, ...] = (ANY_DISPATCH,)) -> None:
        if (runner.prepare is None) == (runner.measure_row is None):
            raise ValueError(f"{self.backend} {op}: a runner has exactly one of prepare and measure_row")
        for dispatch in dispatches:
            self._runners.setdefault((op, dispatch), []).append(runner)

    def find(self, op: str, dispatch: str, version: str | None = None) -> Runner:
        """The runner of (op, dispatch) serving ``version``; KernelLimit when the backend has none."""
        for key in ((op, dispatch), (op, ANY_DISPATCH)):
            for runner in self._runners.get(key, ()):
                if runner.versions is None or version in runner.versions:
                    return runner
        raise KernelLimit(f"the {self.backend} backend has no runner for {op} dispatch {dispatch!r} at {version}")

    def ops(self) -> set[str]:
        return {op for op, _ in self._runners}
