"""The registry of op plans, in the order plans list and run them."""

from __future__ import annotations

from opcollect.plans import (
    attention,
    comm,
    dsa,
    dsa_kernels,
    dsv4,
    dsv4_kernels,
    encoder_attention,
    gemm,
    linear_attention,
    mhc,
    mla,
    mla_bmm,
    mla_module,
    moe,
    msa,
    quantize,
)
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
        dsa.CONTEXT,
        dsa.GENERATION,
        dsa_kernels.MQA_LOGITS,
        dsa_kernels.TOPK,
        dsa_kernels.DSA_ATTN,
        msa.CONTEXT,
        msa.GENERATION,
        *dsv4.MODULES,
        *dsv4_kernels.KERNELS,
        mhc.PLAN,
        linear_attention.GDN,
        linear_attention.MAMBA2,
        comm.PLAN,
        comm.CUSTOM_ALLREDUCE,
    )
}
