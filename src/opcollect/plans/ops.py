"""The registry of op plans, in the order plans list and run them."""

from __future__ import annotations

from opcollect.plans import attention, comm, gemm, mla, mla_module, moe
from opcollect.plans.base import OpPlan

OPS: dict[str, OpPlan] = {
    p.name: p
    for p in (
        gemm.PLAN,
        attention.CONTEXT,
        attention.GENERATION,
        moe.PLAN,
        mla.CONTEXT,
        mla.GENERATION,
        mla_module.CONTEXT,
        mla_module.GENERATION,
        comm.PLAN,
        comm.CUSTOM_ALLREDUCE,
    )
}
