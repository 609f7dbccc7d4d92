"""Expanding the sparse-attention grids (cases/grids_sparse.py) into groups: each sweep's models, heads and shapes,
and groups that remember which backends plan them.

A group's constants hold its dtype fields and, under BACKENDS_KEY, the backends of the sweep it came from; a
backend's dispatch answers NOT_THIS_FRAMEWORK for any other sweep's group, which plans/skips.py drops
(sparse-module-sweep-of-another-framework). plans/dsa.py and plans/msa.py use these.
"""

from __future__ import annotations

from typing import Callable, Mapping, NamedTuple

from opcollect.cases.grids_sparse import ContextSweep, GenerationSweep, LongCap, ModuleSweep
from opcollect.cases.profiles import ModelShapes
from opcollect.cases.sparse import Dsa, Msa
from opcollect.errors import InputError
from opcollect.plans.base import Group

BACKENDS_KEY = "backends"  # the group constant naming the backends of its sweep
NOT_THIS_FRAMEWORK = "not-this-framework"  # as plans/comm.py's: skips.py drops it


class SweepModel(NamedTuple):
    label: str  # the model column
    attention: Dsa | Msa
    skip_indexer: bool  # SGLang's indexer-skipping layers of the model (DSA only)


def sweep_models(op: str, sweep: ModuleSweep, shapes: Mapping[str, ModelShapes], kind: type) -> list[SweepModel]:
    """The sweep's named models, then (more_models) every other model of this attention the plan reads, each once
    per op_name: under its own name, or where heads are swept directly (tp_sizes None) only an architecture the
    sweep does not have yet (the collector times one model per architecture there, case_generator.py:786-812)."""
    found: list[SweepModel] = []
    for entries, skip in ((sweep.models, False), (sweep.skip_indexer_models, True)):
        for entry in entries:
            spec = shapes.get(entry.profile)
            if spec is None or not isinstance(spec.sparse, kind):
                what = "no such model" if spec is None else f"no {kind.__name__} keys"
                raise InputError(
                    f"cases/base_ops/{op}.yaml: model {entry.model!r} names profile {entry.profile!r}: {what}; name "
                    f"a profile of cases/models whose config has them (known: {', '.join(sorted(shapes))})"
                )
            found.append(SweepModel(entry.model, spec.sparse, skip))
    if not sweep.more_models:
        return found
    listed = {entry.profile for entry in (*sweep.models, *sweep.skip_indexer_models)} | set(sweep.leaves_out)
    labels = {(m.label, m.skip_indexer) for m in found}
    architectures = {m.attention.architecture for m in found}
    for name in sorted(shapes):
        attention = shapes[name].sparse
        if name in listed or not isinstance(attention, kind):
            continue
        if sweep.tp_sizes is None:
            if attention.architecture in architectures:
                continue
            architectures.add(attention.architecture)
        skips = (False, True) if sweep.skip_indexer_models and getattr(attention, "topk_freq", 1) > 1 else (False,)
        for skip in skips:
            if (name, skip) not in labels:
                labels.add((name, skip))
                found.append(SweepModel(name, attention, skip))
    return found


def rank_heads(sweep: ModuleSweep, attention: Dsa | Msa) -> list[tuple[int, int]]:
    """(heads on the rank, tp_size), most heads first: each num_heads at tp 1, or the model's heads / tp."""
    if sweep.tp_sizes is None:
        return [(heads, 1) for heads in sorted(sweep.num_heads, reverse=True)]
    found = [
        (attention.heads // tp, tp)
        for tp in sweep.tp_sizes
        if attention.heads % tp == 0 and attention.heads // tp in sweep.num_heads
    ]
    return sorted(found, reverse=True)


def _capped(long: LongCap | None, batch: int, length: int) -> bool:
    return long is not None and length >= long.from_length and batch > long.max_batch


def context_shapes(
    sweep: ContextSweep, max_positions: int | None, isl: list[int] | None = None
) -> list[tuple[int, int, int]]:
    """(batch_size, isl, prefix) of a context sweep for a model of max_positions tokens, by batch then prefix."""
    base = [
        (b, s)
        for b in sweep.batch_size
        for s in (isl or sweep.isl)
        if b * s <= sweep.max_tokens and not _capped(sweep.long, b, s)
    ]
    return prefill_shapes(base, sweep.prefix, sweep.prefix_ceilings, max_positions, sweep.max_kv_tokens)


def prefill_shapes(
    base: list[tuple[int, int]],
    prefixes: list[int],
    ceilings: list[int],
    max_positions: int | None,
    max_kv_tokens: int | None,
) -> list[tuple[int, int, int]]:
    """Every (batch, isl) of ``base`` after every prefix, and after C - isl for each ceiling C not among the
    prefixes (collector/sglang/collect_mla_module.py:2376-2414), within the model's context and the KV cap."""

    def valid(b: int, s: int, p: int) -> bool:
        within = max_positions is None or p + s <= max_positions
        return p >= 0 and within and (max_kv_tokens is None or b * (s + p) <= max_kv_tokens)

    shapes = {(b, s, p) for p in prefixes for b, s in base if valid(b, s, p)}
    listed = set(prefixes)
    shapes |= {(b, s, c - s) for c in ceilings for b, s in base if c - s not in listed and valid(b, s, c - s)}
    return sorted(shapes, key=lambda shape: (shape[0], shape[2], shape[1]))


def generation_shapes(sweep: GenerationSweep, max_positions: int | None) -> list[tuple[int, int]]:
    """(batch_size, step) of a generation sweep: the capped grid, then batch 1 at the extra steps, every step
    below the model's context."""
    new = 1 if sweep.cap_counts_new_token else 0
    fits = (lambda step: True) if max_positions is None else (lambda step: step < max_positions)
    shapes = [
        (b, step)
        for b in sweep.batch_size
        for step in sweep.step
        if b * (step + new) <= sweep.max_tokens and not _capped(sweep.long, b, step) and fits(step)
    ]
    have = set(shapes)
    extra = sorted(set(sweep.batch_one_steps) | {c - 1 for c in sweep.step_ceilings})
    shapes += [(1, step) for step in extra if step > 0 and fits(step) and (1, step) not in have]
    return sorted(shapes)


def sweep_groups(op: str, case_type: type, dtype_fields: tuple[str, ...], rows: Mapping[tuple, list]) -> list[Group]:
    """Groups from value tuples keyed by (the sweep's backends, dtype values): one group per key, its constants the
    dtype fields and BACKENDS_KEY."""
    return [
        Group(
            op=op,
            label="/".join(str(v) for v in key),
            constants={**dict(zip(dtype_fields, key)), BACKENDS_KEY: backends},
            case_type=case_type,
            values=values,
        )
        for (backends, key), values in rows.items()
        if values
    ]


def sm_major(sm: str) -> int:
    """The compute capability's major number (9 for SM90, 10 for SM100/103); 0 for the CPU."""
    return int(sm) // 10 if sm.isdigit() else 0


def by_sweep(backend: str, rule: Callable[[str, Group], str]) -> Callable[[str, Group], str]:
    """``rule`` for the groups of this backend's sweep, NOT_THIS_FRAMEWORK for the others'."""

    def dispatch(sm: str, group: Group) -> str:
        return rule(sm, group) if backend in group.constants[BACKENDS_KEY] else NOT_THIS_FRAMEWORK

    return dispatch
