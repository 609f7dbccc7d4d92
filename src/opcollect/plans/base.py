"""The OpPlan contract and the expanded dtype groups that every backend and SM share.

An op expands once per grid into groups (one per dtype, or per dtype pair for attention and MLA):
the cases in run order and their stable IDs. Backends and SMs then only filter those groups.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Mapping, NamedTuple, Sequence

from opcollect.cases.profiles import ModelShapes
from opcollect.plans.work import Work
from opcollect.runtime.planfile import id_template


def sm_at_least(sm: str, minimum: int) -> bool:
    """True for a GPU SM at or above ``minimum``; the CPU has no SM."""
    return sm != "cpu" and int(sm) >= minimum


@dataclass(eq=False)
class Group:
    """Cases of one op that share their dtype fields, in run order.

    ``values`` are raw tuples in field order; the typed cases and the IDs are built on first use, so a
    group that a plan skips as a whole costs almost nothing.
    """

    op: str
    label: str  # e.g. "bfloat16" or "bfloat16/fp8" (attention dtype / KV-cache dtype)
    constants: Mapping[str, object]  # the dtype fields, one value across the group
    case_type: type
    values: list[tuple]
    # shape keys that only models bring -> model names, and the positions of a shape key in a case
    origins: Mapping[tuple, frozenset[str]] = field(default_factory=dict)
    shape_index: tuple[int, ...] = ()

    @cached_property
    def template(self) -> str:
        dtype_field = next(iter(self.constants))
        return id_template(self.op, self.case_type._fields, dtype_field, self.constants[dtype_field])

    @cached_property
    def ids(self) -> list[str]:
        return list(map(self.template.__mod__, self.values))

    def ids_at(self, positions: list[int]) -> list[str]:
        """IDs of the cases at ``positions``: from the cached list when it exists or most are wanted (other
        plans of the same grid reuse it), else formatted for these cases only."""
        if "ids" in self.__dict__ or 2 * len(positions) > len(self.values):
            return list(map(self.ids.__getitem__, positions))
        return [self.template % self.values[i] for i in positions]

    @property
    def dtype(self) -> str:
        return str(next(iter(self.constants.values())))

    def models_of(self, values: tuple) -> frozenset[str] | None:
        """Models a case comes from, or None when the base grid has it."""
        if not self.origins:
            return None
        return self.origins.get(tuple(values[i] for i in self.shape_index))


def make_groups(
    op: str,
    case_type: type,
    dtype_fields: Sequence[str],
    values_by_group: Mapping[tuple, list[tuple]],
    origins: Mapping[tuple, frozenset[str]] | None = None,
    shape_fields: Sequence[str] = (),
) -> list[Group]:
    """Groups from raw value tuples (in field order), keyed by their dtype-field values."""
    shape_index = tuple(case_type._fields.index(name) for name in shape_fields)
    return [
        Group(
            op=op,
            label="/".join(str(v) for v in key),
            constants=dict(zip(dtype_fields, key)),
            case_type=case_type,
            values=values,
            origins=origins or {},
            shape_index=shape_index,
        )
        for key, values in values_by_group.items()
    ]


Dispatch = Callable[[str, Group], str]  # (sm, group) -> kernel or runner name
# (sm, the group's dispatch, one case) -> that case's: where a framework picks its kernel by shape
CaseDispatch = Callable[[str, str, NamedTuple], str]


def refines(reads: tuple[str, ...], dispatches: tuple[str, ...] | None = None):
    """Mark a CaseDispatch with the case fields its answer depends on and the group dispatches it may change
    (None: any). The planner asks it once per distinct ``reads`` values in a group and not at all for other
    dispatches; tests/test_dispatch_vs_reference.py holds each rule to its marks."""

    def mark(rule):
        rule.reads = tuple(reads)
        rule.dispatches = None if dispatches is None else frozenset(dispatches)
        return rule

    return mark


@dataclass(frozen=True)
class OpPlan:
    """One op family's planning contract."""

    name: str  # op key in plans and cases/base_ops/<name>.yaml
    family: str  # tables directory: gemm, attention, moe, mla, comm
    table: str  # table stem, e.g. gemm_perf
    op_name: str | None  # the op_name column value; None: each case's op_name field (comm's collectives)
    case_type: type
    dtype_fields: tuple[str, ...]  # the first is the dtype; together they label a group
    expand: Callable[[object, Mapping[str, ModelShapes]], list[Group]]
    tp_sizes: Callable[[object], tuple[int, ...]]  # model TP sizes a grid asks for
    dispatch: Mapping[str, Dispatch]  # per backend
    cost: Callable[[NamedTuple], float]  # relative work, used to pick smoke cases
    # per backend: a key that groups cases timed by one task (batch_rows); absent = one row per case
    batch_key: Mapping[str, Callable[[NamedTuple], str]] = field(default_factory=dict)
    # case fields the table places after `latency`, as the reference does (custom_allreduce's backend)
    after_latency: tuple[str, ...] = ()
    # per backend: case fields whose table column that backend's reference names otherwise (field -> column), or
    # None for a field its table has no column for (SGLang's dsv4_paged_mqa_logits has no local_num_heads: a value
    # the other keys fix); the case ID still holds every field
    columns: Mapping[str, Mapping[str, str | None]] = field(default_factory=dict)
    # per backend: the dispatch of each case, refining its group's (skips decide on the group's)
    case_dispatch: Mapping[str, CaseDispatch] = field(default_factory=dict)
    # latency is a difference of two timings (compute_scale: dynamic less static quant, clipped at 0 as the reference
    # does): the value rules (tables/values.py) admit a latency of exactly 0 for it, a timed kernel's must be positive
    latency_is_difference: bool = False
    # the cases whose latency the reference holds as exactly 0 without timing them (dsv4_csa_topk_calib: a top-k that
    # keeps every token, plans/dsv4_kernels.py trivial_topk); the value rules must admit 0 for these cases only
    zero_latency: Callable[[NamedTuple], bool] | None = None
    # the least work of one case (plans/work.py), for the speed-of-light bound (tables/physics.py, check R8);
    # None, or None for a case: no bound (compute_scale's latency is a difference of two timings, which may be 0)
    work: Callable[[NamedTuple], Work | None] | None = None

    @property
    def fields(self) -> tuple[str, ...]:
        return self.case_type._fields

    @property
    def dtype_field(self) -> str:
        return self.dtype_fields[0]

    def label_of(self, case: NamedTuple) -> str:
        return "/".join(str(getattr(case, name)) for name in self.dtype_fields)
