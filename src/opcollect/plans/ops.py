"""The registry of op plans, in the order plans list and run them."""

from __future__ import annotations

from opcollect.plans import attention, comm, encoder_attention, gemm, mla, mla_bmm, mla_module, moe, quantize
from opcollect.plans.base import OpPlan

OPS: dict[str, OpPlan] = {
    p.name: p
    for p in (
        gemm.PLAN,
        quantize.COMPUTE_SCALE,
        quantize.SCALE_MATRIX,
        attention.CONTEXT,
        attention.GENERATION,
        moe.PLAN,
        mla.CONTEXT,
        mla.GENERATION,
        mla_module.CONTEXT,
        mla_module.GENERATION,
        mla_bmm.PLAN,
        encoder_attention.PLAN,
        comm.PLAN,
        comm.CUSTOM_ALLREDUCE,
    )
}
