"""All-reduce across num_gpus ranks: NCCL on GPUs, gloo between processes on the CPU."""

from __future__ import annotations

from typing import Mapping, NamedTuple

from opcollect.cases.grids import CommGrid
from opcollect.cases.profiles import ModelShapes
from opcollect.names import BACKENDS
from opcollect.plans.base import Group, OpPlan, make_groups


class CommCase(NamedTuple):
    nccl_dtype: str
    num_gpus: int
    message_size: int  # bytes


def expand(grid: CommGrid, shapes: Mapping[str, ModelShapes]) -> list[Group]:
    rows = {
        (dtype,): [(dtype, gpus, size) for gpus in grid.num_gpus for size in grid.message_size] for dtype in grid.dtypes
    }
    return make_groups("comm", CommCase, ("nccl_dtype",), rows)


def _dispatch(sm: str, group: Group) -> str:
    return "gloo" if sm == "cpu" else "nccl"


def _one_process_group(case: CommCase) -> str:
    # starting a process group costs seconds: one task times every message size of one group
    return f"comm:{case.nccl_dtype}:num_gpus={case.num_gpus}"


PLAN = OpPlan(
    name="comm",
    family="comm",
    table="nccl_perf",
    op_name="all_reduce",
    case_type=CommCase,
    dtype_fields=("nccl_dtype",),
    expand=expand,
    tp_sizes=lambda grid: (),
    dispatch={backend: _dispatch for backend in BACKENDS},
    cost=lambda c: float(c.message_size) * c.num_gpus,
    batch_key={backend: _one_process_group for backend in BACKENDS},
)
