"""What ran: the kernels one call of an op launches, read by PyTorch's profiler. The one helper for it: the harness
observes every prepared case with it after the case's samples (runtime/timing.py measure_cases), and runners that
must know what a call ran (TensorRT-LLM's AUTO all-reduce, backends/trtllm/allreduce.py) ask it too.

On a GPU the names are those of the CUDA kernels the call launched: Kineto's events of activity "kernel" (memcpy and
memset activities are no kernels). On the CPU no kernel exists to name, so the names are ATen ops, at the top two levels
of the call's ATen tree: an op no other ATen op called (aten::linear, aten::scaled_dot_product_attention, aten::bmm),
and the ATen ops it called directly, which name the implementation it dispatched to
(aten::_scaled_dot_product_flash_attention_for_cpu or aten::_scaled_dot_product_attention_math under SDPA,
aten::matmul under linear), less the allocation and view bookkeeping among them (BOOKKEEPING); deeper levels are
the implementation's own steps.
Either list is deduplicated and kept in the order the kernels or ops started, at most MAX_NAMES names of at most
MAX_NAME characters (a CUTLASS kernel's demangled name runs to kilobytes; what tells kernels apart comes first).

The call runs exactly once whether or not the profiler starts (it may be a collective every rank must make): when
the profiler cannot start or stop, the result says why and names nothing, and that is no failure of the case.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

MAX_NAMES = 64
MAX_NAME = 400
ATEN = "aten::"
# ATen ops that allocate or view, launching no computation: left out below the top level of the tree
BOOKKEEPING = frozenset(
    "aten::" + name
    for name in ("as_strided", "empty", "empty_strided", "empty_like", "resolve_conj", "resolve_neg", "view",
                 "_reshape_alias", "_unsafe_view", "alias", "detach", "lift_fresh")
)  # fmt: skip
NOT_KERNELS = ("Memcpy", "Memset")  # Kineto's names of copy and fill activities, on a torch without activity_type


@dataclass(frozen=True)
class Observed:
    """The names one call launched (None: not read, ``why`` says why)."""

    kernels: tuple[str, ...] | None
    why: str = ""

    def record(self) -> dict:
        """The shard record's fields: ``kernels`` (a list of names), or ``kernels_unread`` (why none were read)."""
        if self.kernels is None:
            return {"kernels_unread": self.why or "not read"}
        return {"kernels": list(self.kernels)}


def _brief(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:200]


def observe(call: Callable[[], object], device: str) -> Observed:
    """Run ``call()`` once under torch's profiler and name what it launched on ``device`` (cuda[:i] or cpu)."""
    import torch

    cuda = device.startswith("cuda")
    if cuda:  # earlier work must not land inside the window
        torch.cuda.synchronize()
    try:
        from torch.profiler import ProfilerActivity, profile

        prof = profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU])
        prof.start()
    except Exception as exc:  # CUPTI missing or busy, another profiler running
        prof, why = None, f"the profiler did not start: {_brief(exc)}"
    call()
    if cuda:
        torch.cuda.synchronize()
    if prof is None:
        return Observed(None, why)
    try:
        prof.stop()
        names = _kernel_names(prof) if cuda else _aten_names(prof)
    except Exception as exc:
        return Observed(None, f"the profiler did not stop: {_brief(exc)}")
    return Observed(bounded(names))


def bounded(names) -> tuple[str, ...]:
    """Names deduplicated in their order, each on one line and cut to MAX_NAME, at most MAX_NAMES of them."""
    kept: dict[str, None] = {}
    for name in names:
        kept.setdefault(" ".join(str(name).split())[:MAX_NAME], None)
        if len(kept) >= MAX_NAMES:
            break
    return tuple(kept)


def _kernel_names(prof) -> list[str]:
    """The CUDA kernels of the window, in the order they started."""
    import torch

    events = prof.profiler.kineto_results.events()
    kernels = []
    for e in events:
        kind = e.activity_type() if hasattr(e, "activity_type") else None
        if kind == "kernel" or (
            kind is None and e.device_type() == torch.autograd.DeviceType.CUDA and not e.name().startswith(NOT_KERNELS)
        ):
            kernels.append((e.start_ns(), e.name()))
    return [name for _, name in sorted(kernels, key=lambda k: k[0])]


def _aten_depth(event) -> int:
    depth, parent = 0, event.cpu_parent
    while parent is not None:
        depth += parent.name.startswith(ATEN)
        parent = parent.cpu_parent
    return depth


def _aten_names(prof) -> list[str]:
    """The ATen ops of the top two levels of the window's call tree, in the order they started; at the second level
    without BOOKKEEPING (an op called directly keeps its name whatever it is)."""
    ops = [
        e
        for e in prof.events()
        if e.name.startswith(ATEN) and (_aten_depth(e) == 0 or (_aten_depth(e) == 1 and e.name not in BOOKKEEPING))
    ]
    return [e.name for e in sorted(ops, key=lambda e: e.time_range.start)]
