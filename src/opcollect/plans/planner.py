"""plan(): the cases one backend times on one SM, after skips, filters, smoke and shard selection.

Expansion happens once per op and grid; every (backend, SM) only filters the shared groups, so planning
the whole matrix costs little more than planning one pair.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from opcollect.cases.sources import CaseSources, load_sources
from opcollect.errors import InputError
from opcollect.names import BACKENDS, SMS, sm_label
from opcollect.plans import skips
from opcollect.plans.base import Group, OpPlan
from opcollect.plans.hashes import canonical_lines, collector_hash, plan_hash, plan_header
from opcollect.plans.ops import OPS
from opcollect.project import ProjectTree
from opcollect.runtime.planfile import Row, id_template

if TYPE_CHECKING:
    from opcollect.plans.deal import Dealt

SMOKE_CASES = 4


@dataclass(frozen=True)
class PlanOptions:
    ops: tuple[str, ...] = tuple(OPS)
    smoke: bool = False
    case_filter: str | None = None
    shard: tuple[int, int] | None = None  # (index, count), index counted from 0

    def __post_init__(self) -> None:
        unknown = [op for op in self.ops if op not in OPS]
        if unknown:
            raise InputError(f"--ops: unknown op {unknown[0]!r}; known: {', '.join(OPS)}")
        if self.shard is not None:
            index, count = self.shard
            if count < 1 or not 0 <= index < count:
                raise InputError(f"--shard {index}/{count}: need 0 <= i < N (shards are counted from 0)")


@dataclass(frozen=True)
class OpSelection:
    op: OpPlan
    values: list[tuple]  # kept cases as raw tuples in field order, run order
    ids: list[str]
    dispatch: list[str]
    rows: list[Row] | None  # batch rows; None means one row per case
    skipped: dict[str, int]
    by_dtype: dict[str, int] = field(default_factory=dict)
    by_dispatch: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    backend: str
    sm: str
    collector_hash: str
    plan_hash: str  # of the whole selection, before --shard
    options: PlanOptions
    ops: dict[str, OpSelection]
    model_configs: tuple[str, ...] = ()
    # this plan's canonical lines (of its shard, when sharded), sorted: content_hash reuses them
    canonical: list[str] = field(default_factory=list, repr=False)
    # what the plan says about its models: unknown architectures, shapes a TP size could not split
    notes: tuple[str, ...] = ()

    @property
    def total_cases(self) -> int:
        return sum(len(s.ids) for s in self.ops.values())


def require_cases(plan: Plan, target: str) -> None:
    """Refuse a plan that selects no case: running it would do nothing and report success."""
    if plan.total_cases:
        return
    options = plan.options
    skipped: Counter[str] = Counter()
    for selection in plan.ops.values():
        skipped.update(selection.skipped)
    why = [f"{count} left out by skip {entry!r}" for entry, count in skipped.most_common(2)]
    if options.case_filter:
        why.append(f"--case-filter {options.case_filter!r}")
    if options.shard is not None:
        why.append(f"--shard {options.shard[0]}/{options.shard[1]}")
    raise InputError(
        f"{target}: {sm_label(plan.backend, plan.sm)} with --ops {','.join(options.ops)} selects 0 cases"
        + (f" ({'; '.join(why)})" if why else "")
        + "; nothing to run: widen --ops or --case-filter, use fewer shards, or choose another --sm or --backend"
    )


class _Picked(NamedTuple):
    group: Group
    dispatch: str
    positions: list[int]


class Planner:
    """Loads the case sources once and plans any number of (backend, SM) pairs from them."""

    def __init__(self, tree: ProjectTree, model_configs: tuple[Path, ...] = ()):
        self.tree = tree
        self.model_configs = tuple(str(p) for p in model_configs)
        self.sources: CaseSources = load_sources(tree.cases, tuple(model_configs))
        self.collector_hash = collector_hash(tree.root)
        self._groups: dict[tuple[str, str], list[Group]] = {}

    def groups(self, op: str, sm: str) -> list[Group]:
        op_file = self.sources.grids[op]
        grid_key = sm if sm in op_file.narrowed else "grid"
        found = self._groups.get((op, grid_key))
        if found is None:
            grid = op_file.grid_for(sm)
            shapes = self.sources.shapes(OPS[op].tp_sizes(grid))
            found = OPS[op].expand(grid, shapes)
            self._groups[(op, grid_key)] = found
        return found

    def plan(self, backend: str, sm: str, options: PlanOptions = PlanOptions()) -> Plan:
        if backend not in BACKENDS:
            raise InputError(f"--backend: unknown backend {backend!r}; known: {', '.join(BACKENDS)}, all")
        if sm not in SMS:
            raise InputError(f"--sm: unknown SM {sm!r}; known: {', '.join(SMS)}, all")
        selections: dict[str, OpSelection] = {}
        canonical: list[str] = []
        for op in options.ops:
            selection = self._select(OPS[op], backend, sm, options)
            selections[op] = selection
            canonical.extend(_canonical_lines(selection))
        canonical.sort()
        digest = plan_hash(plan_header(backend, sm), canonical, presorted=True)
        whole = Plan(
            backend,
            sm,
            self.collector_hash,
            digest,
            replace(options, shard=None),
            selections,
            self.model_configs,
            canonical,
            notes=self.notes(sm, options.ops),
        )
        if options.shard is None:
            return whole
        from opcollect.plans.deal import deal_plan

        return shard_of(whole, *options.shard, dealt=deal_plan(whole, options.shard[1], self.tree.systems))

    def notes(self, sm: str, ops: tuple[str, ...]) -> tuple[str, ...]:
        """The models' notes, then the shapes each planned op lacks because a TP size does not split them."""
        found = dict.fromkeys(note for spec in self.sources.models for note in spec.notes)
        for op in ops:
            family = OPS[op].family
            shapes = self.sources.shapes(OPS[op].tp_sizes(self.sources.grids[op].grid_for(sm)))
            for name in sorted(shapes):
                found.update(dict.fromkeys(shapes[name].notes_for(family)))
        return tuple(found)

    def _select(self, op: OpPlan, backend: str, sm: str, options: PlanOptions) -> OpSelection:
        picked: list[_Picked] = []
        skipped: Counter[str] = Counter()
        prefix = options.case_filter
        for group in self.groups(op.name, sm):
            dispatch = op.dispatch[backend](sm, group)
            decision = skips.decide(backend, op.name, sm, dispatch, group, self.sources.architecture_of)
            skipped.update(decision.skipped)
            if decision.kept == []:
                continue
            positions = range(len(group.values)) if decision.kept is None else decision.kept
            if prefix:
                positions = [i for i in positions if group.ids[i].startswith(prefix)]
            if positions:
                picked.append(_Picked(group, dispatch, list(positions)))
        if options.smoke:
            picked = _smoke(op, picked)
        values: list[tuple] = []
        ids: list[str] = []
        dispatches: list[str] = []
        by_dtype: dict[str, int] = {}
        by_dispatch: Counter[str] = Counter()
        refine = op.case_dispatch.get(backend)
        for p in picked:
            if len(p.positions) == len(p.group.values):
                values.extend(p.group.values)
                ids.extend(p.group.ids)
            else:
                values.extend(map(p.group.values.__getitem__, p.positions))
                ids.extend(p.group.ids_at(p.positions))
            if refine is None or (refine.dispatches is not None and p.dispatch not in refine.dispatches):
                dispatches.extend([p.dispatch] * len(p.positions))
                by_dispatch[p.dispatch] += len(p.positions)
            else:
                mine = _refined(op, refine, sm, p)
                dispatches.extend(mine)
                by_dispatch.update(mine)
            by_dtype[p.group.label] = by_dtype.get(p.group.label, 0) + len(p.positions)
        return OpSelection(
            op=op,
            values=values,
            ids=ids,
            dispatch=dispatches,
            rows=_batch_rows(op, backend, values, ids, dispatches),
            skipped=dict(skipped),
            by_dtype=by_dtype,
            by_dispatch=dict(by_dispatch),
        )


def plan_of_cases(
    backend: str, sm: str, op_name: str, cases: list[NamedTuple], dispatch: str, collector_hash: str
) -> Plan:
    """A plan of exactly these cases, in this order: to re-measure chosen cases, or to test a runtime."""
    op = OPS[op_name]
    values = [tuple(case) for case in cases]
    ids = [
        id_template(op_name, op.fields, op.dtype_field, getattr(c, op.dtype_field)) % v for c, v in zip(cases, values)
    ]
    dispatches = [dispatch] * len(cases)
    selection = OpSelection(
        op,
        values,
        ids,
        dispatches,
        _batch_rows(op, backend, values, ids, dispatches),
        {},
        dict(Counter(op.label_of(c) for c in cases)),
        dict(Counter(dispatches)),
    )
    canonical = sorted(_canonical_lines(selection))
    digest = plan_hash(plan_header(backend, sm), canonical, presorted=True)
    return Plan(backend, sm, collector_hash, digest, PlanOptions(ops=(op_name,)), {op_name: selection}, (), canonical)


def _smoke(op: OpPlan, picked: list[_Picked]) -> list[_Picked]:
    """At most SMOKE_CASES cases, spread evenly over the cheaper half of the kept cases by cost."""
    make = op.case_type._make
    ranked = sorted(
        (op.cost(make(p.group.values[i])), p.group.ids[i], n, i) for n, p in enumerate(picked) for i in p.positions
    )
    half = ranked[: (len(ranked) + 1) // 2]
    count = min(SMOKE_CASES, len(half))
    chosen = {half[(j * (len(half) - 1)) // max(1, count - 1)] for j in range(count)}
    keep: dict[int, set[int]] = {}
    for _, _, n, i in chosen:
        keep.setdefault(n, set()).add(i)
    return [
        _Picked(p.group, p.dispatch, [i for i in p.positions if i in keep[n]])
        for n, p in enumerate(picked)
        if n in keep
    ]


def _refined(op: OpPlan, refine, sm: str, picked: _Picked) -> list[str]:
    """Each picked case's dispatch, asking the rule once per distinct value of the fields it reads."""
    key_of = itemgetter(*(op.fields.index(name) for name in refine.reads))
    known: dict = {}
    found = []
    for i in picked.positions:
        values = picked.group.values[i]
        key = key_of(values)
        dispatch = known.get(key)
        if dispatch is None:
            dispatch = known[key] = refine(sm, picked.dispatch, op.case_type._make(values))
        found.append(dispatch)
    return found


def _batch_rows(op: OpPlan, backend: str, values: list, ids: list[str], dispatches: list[str]) -> list[Row] | None:
    key_of = op.batch_key.get(backend)
    if key_of is None:
        return None
    members: dict[tuple[str, str], list[str]] = {}
    for raw, case_id, dispatch in zip(values, ids, dispatches):
        members.setdefault((key_of(op.case_type._make(raw)), dispatch), []).append(case_id)
    rows = [Row(row_id, dispatch, tuple(case_ids)) for (row_id, dispatch), case_ids in members.items()]
    check_exactly_once(op.name, ids, rows)
    return rows


def check_exactly_once(op: str, ids: list[str], rows: list[Row]) -> None:
    """Every kept case is timed by exactly one row, and rows time nothing else."""
    timed = Counter(case_id for row in rows for case_id in row.case_ids)
    twice = [case_id for case_id, n in timed.items() if n > 1]
    missing = set(ids) - timed.keys()
    extra = timed.keys() - set(ids)
    if twice or missing or extra:
        example = (twice or sorted(missing) or sorted(extra))[0]
        raise AssertionError(
            f"{op}: batch rows time {len(twice)} cases twice, miss {len(missing)}, add {len(extra)} (e.g. {example})"
        )


def _canonical_lines(selection: OpSelection) -> list[str]:
    return canonical_lines(selection.ids, selection.dispatch, selection.rows)


def shard_of(plan: Plan, index: int, count: int, dealt: Dealt | None = None) -> Plan:
    """Shard ``index`` of ``count`` of a whole plan, dealt from its selections without planning again: the same
    plan_hash, its own cases and canonical lines (so its own content hash). ``dealt``: the dealing of the whole plan
    by predicted time (plans/deal.py), computed here on this checkout's systems/ when not given; a caller making
    every shard deals once."""
    if dealt is None or dealt.count != count:
        from opcollect.plans.deal import deal_plan

        dealt = deal_plan(plan, count)
    selections = {op: _shard(s, index, dealt.owner[op]) for op, s in plan.ops.items()}
    canonical = sorted(line for s in selections.values() for line in _canonical_lines(s))
    return replace(plan, options=replace(plan.options, shard=(index, count)), ops=selections, canonical=canonical)


def _shard(selection: OpSelection, index: int, owner: list[int]) -> OpSelection:
    """The rows (or cases) the dealing gave shard ``index``, in the plan's run order: disjoint, and together the
    whole op."""
    if selection.rows is None:
        mine = [i for i, shard in enumerate(owner) if shard == index]
        rows = None
    else:
        rows = [row for row, shard in zip(selection.rows, owner) if shard == index]
        wanted = {case_id for row in rows for case_id in row.case_ids}
        mine = [i for i, case_id in enumerate(selection.ids) if case_id in wanted]
    values = [selection.values[i] for i in mine]
    dispatch = [selection.dispatch[i] for i in mine]
    make = selection.op.case_type._make
    return OpSelection(
        op=selection.op,
        values=values,
        ids=[selection.ids[i] for i in mine],
        dispatch=dispatch,
        rows=rows,
        skipped=selection.skipped,
        by_dtype=dict(Counter(selection.op.label_of(make(v)) for v in values)),
        by_dispatch=dict(Counter(dispatch)),
    )
