"""Communication: NCCL collectives (nccl_perf) and a framework's own all-reduce (custom_allreduce_perf).

message_size counts ELEMENTS of the case's dtype, as the reference tables do (aiconfigurator's collector
stores nccl-tests' byte size // bytes per element): a half row of message_size N moves 2N bytes. For the
collectives it is the whole buffer as nccl-tests counts it: all_reduce's tensor, all_gather's output,
reduce_scatter's input and alltoall's send buffer (N / num_gpus elements to each peer).
"""

from __future__ import annotations

from typing import Mapping, NamedTuple

from opcollect.cases.grids import CommGrid, CustomAllreduceGrid
from opcollect.cases.profiles import ModelShapes
from opcollect.names import BACKENDS
from opcollect.plans.base import Group, OpPlan, make_groups
from opcollect.plans.work import Work
from opcollect.runtime.dtypes import message_bytes


class CommCase(NamedTuple):
    nccl_dtype: str
    op_name: str  # the collective: all_reduce, all_gather, reduce_scatter, alltoall
    num_gpus: int
    message_size: int  # elements of nccl_dtype


def link_bytes(collective: str, buffer_bytes: int, gpus: int) -> float:
    """Bytes each GPU must send one way for a collective over a buffer of nccl-tests' size S (comm module doc).

    all_reduce: every element's sum needs this GPU's value, so all S leave it once, even when a switch reduces
    (NVLink SHARP); nccl-tests' bus bandwidth 2(n-1)/n * S / t may thus reach 2(n-1)/n times the link's, as the
    H200's 8-GPU all_reduce does (about 470 GB/s over 450 GB/s links). all_gather, reduce_scatter, alltoall: the
    (n-1)/n of S that other GPUs hold or need crosses the link, so their bus bandwidth (n-1)/n * S / t stays
    within the link's."""
    if gpus <= 1:
        return 0.0
    return float(buffer_bytes) if collective == "all_reduce" else buffer_bytes * (gpus - 1) / gpus


def work(c: CommCase) -> Work:
    return Work({}, 0.0, link_bytes(c.op_name, message_bytes(c.nccl_dtype, c.message_size), c.num_gpus), c.num_gpus)


def expand(grid: CommGrid, shapes: Mapping[str, ModelShapes]) -> list[Group]:
    rows = {
        (dtype,): [
            (dtype, op_name, gpus, size)
            for op_name in grid.op_names
            for gpus in grid.num_gpus
            for size in grid.message_size[dtype]
        ]
        for dtype in grid.dtypes
    }
    return make_groups("comm", CommCase, ("nccl_dtype",), rows)


def _dispatch(sm: str, group: Group) -> str:
    return "gloo" if sm == "cpu" else "NCCL"  # the reference's kernel_source for nccl-tests


def _one_process_group(case: CommCase) -> str:
    # starting a process group costs seconds: one task times every collective and size of one group
    return f"comm:{case.nccl_dtype}:num_gpus={case.num_gpus}"


PLAN = OpPlan(
    name="comm",
    family="comm",
    table="nccl_perf",
    op_name=None,  # the case's collective
    case_type=CommCase,
    dtype_fields=("nccl_dtype",),
    expand=expand,
    tp_sizes=lambda grid: (),
    dispatch={backend: _dispatch for backend in BACKENDS},
    cost=lambda c: float(message_bytes(c.nccl_dtype, c.message_size)) * c.num_gpus,
    batch_key={backend: _one_process_group for backend in BACKENDS},
    work=work,
)


# Each framework's own all-reduce variants: the value of its table's backend (vLLM, SGLang) or implementation
# (TRT-LLM) column, and the kernel_source its reference rows carry, which the plan predicts as dispatch.
# vLLM and SGLang time each size both replayed from a CUDA graph and eagerly.
VARIANTS: dict[str, dict[str, str]] = {
    "vllm": {"vllm_graph": "vLLM_custom_graph", "vllm_eager": "vLLM_custom_eager"},
    "sglang": {"sglang_graph": "SGLang_CustomAllReduce_graph", "sglang_eager": "SGLang_CustomAllReduce_eager"},
    "trtllm": {"trtllm": "TRTLLM"},
}
# the dispatch of a variant this backend does not have (another framework's, or any for torch): skips.py drops it
NOT_THIS_FRAMEWORK = "not-this-framework"


class CustomAllreduceCase(NamedTuple):
    allreduce_dtype: str
    num_gpus: int
    message_size: int  # elements of allreduce_dtype
    backend: str  # the variant (VARIANTS); TRT-LLM's table names this column implementation


def work_custom(c: CustomAllreduceCase) -> Work:
    size = message_bytes(c.allreduce_dtype, c.message_size)
    return Work({}, 0.0, link_bytes("all_reduce", size, c.num_gpus), c.num_gpus)


def expand_custom(grid: CustomAllreduceGrid, shapes: Mapping[str, ModelShapes]) -> list[Group]:
    rows = {
        (dtype, variant): [(dtype, gpus, size, variant) for gpus in grid.num_gpus for size in grid.message_size]
        for dtype in grid.dtypes
        for variants in VARIANTS.values()
        for variant in variants
    }
    return make_groups("custom_allreduce", CustomAllreduceCase, ("allreduce_dtype", "backend"), rows)


def _custom_dispatch(backend: str):
    own = VARIANTS.get(backend, {})

    def dispatch(sm: str, group: Group) -> str:
        return own.get(str(group.constants["backend"]), NOT_THIS_FRAMEWORK)

    return dispatch


def _one_custom_process_group(case: CustomAllreduceCase) -> str:
    return f"custom_allreduce:{case.allreduce_dtype}:num_gpus={case.num_gpus},backend={case.backend}"


CUSTOM_ALLREDUCE = OpPlan(
    name="custom_allreduce",
    family="comm",
    table="custom_allreduce_perf",
    op_name="all_reduce",
    case_type=CustomAllreduceCase,
    dtype_fields=("allreduce_dtype", "backend"),
    expand=expand_custom,
    tp_sizes=lambda grid: (),
    dispatch={backend: _custom_dispatch(backend) for backend in BACKENDS},
    cost=lambda c: float(message_bytes(c.allreduce_dtype, c.message_size)) * c.num_gpus,
    batch_key={backend: _one_custom_process_group for backend in BACKENDS},
    after_latency=("backend",),
    columns={"trtllm": {"backend": "implementation"}},
    work=work_custom,
)
