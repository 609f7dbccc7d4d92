"""What a row's kernel_source label means in kernel names, and whether what ran agrees with it.

Each backend states, in ``opcollect.backends.<name>.kernels.KERNELS``, one Meaning per label: the regular
expressions (re.search, case-insensitive) of which at least one matches a name its row observed (runtime/observe.py:
CUDA kernel names on a GPU, ATen op names on the CPU), or why the label cannot be observed (a row runner that
observes nothing). A label the plan's dispatch does not name may still fulfil it (``serves``): torch's SDPA rows
report the SDPA backend that ran, sdpa.flash_attention, where the plan names the API.

Two disagreements are counted, by the run summary (runtime/run.py) and by `check` rule R9 (tables/observed.py):
- the observed names contradict the label: the label has patterns and none matches any name the row observed;
- the label contradicts the plan's dispatch: it is neither the dispatch nor a label that serves it.
This module imports no framework, no planner and no tables code: the runtime and the tables both use it.
"""

from __future__ import annotations

import importlib
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from opcollect.names import BACKENDS


@dataclass(frozen=True)
class Meaning:
    """One kernel_source label of a backend: the kernel-name patterns it means, or why it has none."""

    patterns: tuple[str, ...] = ()
    unobservable: str = ""  # why no pattern: what runs the label observes nothing
    serves: tuple[str, ...] = ()  # plan dispatches this finer label fulfils beside its own name
    ops: tuple[str, ...] = ()  # the ops the meaning holds for, where one label names different kernels per op

    def __post_init__(self) -> None:
        if bool(self.patterns) == bool(self.unobservable):
            raise ValueError(f"a label has patterns or a reason it is unobservable, not both or neither: {self}")
        for pattern in self.patterns:
            re.compile(pattern)


Table = Mapping[str, "Meaning | tuple[Meaning, ...]"]


@lru_cache(maxsize=None)
def _compiled(pattern: str) -> re.Pattern:
    return re.compile(pattern, re.IGNORECASE)


@lru_cache(maxsize=None)
def table_of(backend: str | None) -> Table:
    """The backend's label table; empty for a backend without one (a test backend, a name read from old data)."""
    if backend not in BACKENDS:
        return {}
    return importlib.import_module(f"opcollect.backends.{backend}.kernels").KERNELS


def meaning(backend: str | None, label: str | None, op: str | None = None) -> Meaning | None:
    """The Meaning of ``label`` for ``op`` in the backend's table; None when the table does not know the label."""
    found = table_of(backend).get(label or "")
    if found is None or isinstance(found, Meaning):
        return found
    return next((m for m in found if not m.ops or op in m.ops), None)


def names_match(patterns: Iterable[str], names: Sequence[str]) -> bool:
    return any(_compiled(p).search(name) for p in patterns for name in names)


def contradicts_label(backend: str | None, label: str | None, names: Sequence[str] | None, op: str | None) -> bool:
    """True when the row observed names and its label has patterns, none of which matches any of them."""
    if not names:
        return False
    found = meaning(backend, label, op)
    return found is not None and bool(found.patterns) and not names_match(found.patterns, names)


def contradicts_dispatch(backend: str | None, dispatch: str | None, label: str | None, op: str | None = None) -> bool:
    """True when the row's label is neither the plan's dispatch nor a label the table says serves it."""
    if dispatch is None or label == dispatch:
        return False
    found = meaning(backend, label, op)
    return found is None or dispatch not in found.serves


def describe_observed(backend: str | None, records: Iterable[dict]) -> str:
    """The run summary's sentence on observed kernels: how many measured rows observed them, and the rows whose
    observed names contradict their label, by (label, first name); empty when no row carries the fields."""
    measured = [r for r in records if r.get("status") == "ok"]
    observed = [r for r in measured if r.get("kernels") is not None]
    unread = Counter(r["kernels_unread"] for r in measured if r.get("kernels_unread"))
    if not observed and not unread:
        return ""
    text = f"; kernels observed on {len(observed)} of {len(measured)} rows"
    if unread:
        text += f" ({sum(unread.values())} unread: {unread.most_common(1)[0][0]})"
    wrong = Counter(
        (r.get("kernel_source"), r["kernels"][0])
        for r in observed
        if contradicts_label(backend, r.get("kernel_source"), r["kernels"], r.get("op"))
    )
    if not wrong:
        return text + ", each matching its label"
    shown = ", ".join(f"{label} ran {name[:80]} ({n})" for (label, name), n in wrong.most_common(3))
    more = f", {len(wrong) - 3} more pairs" if len(wrong) > 3 else ""
    return text + f"; {sum(wrong.values())} rows ran kernels their label does not name: {shown}{more}"
