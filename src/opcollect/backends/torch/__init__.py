"""The plain-PyTorch backend: PyTorch's own kernels, on a GPU or the CPU. The embedded default."""

from __future__ import annotations

from functools import partial

from opcollect.backends.torch import (
    attention,
    comm,
    dsa,
    dsv4,
    dsv4_kernels,
    encoder_attention,
    gemm,
    linear_runners,
    mhc,
    mla,
    mla_bmm,
    moe,
    msa,
    quantize,
)
from opcollect.runtime import devices as hardware
from opcollect.runtime import timing
from opcollect.runtime.contract import ANY_DISPATCH, Measured, Registry, Runner
from opcollect.runtime.harness import TimingConfig

FRAMEWORK = "torch"
devices = hardware.devices
device_sm = hardware.device_sm
free_memory = hardware.free_memory
setup_worker = hardware.setup_worker


def identity(device: str) -> dict:
    import torch

    return {"framework": FRAMEWORK, "version": torch.__version__.split("+")[0], **hardware.probe(device)}


RUNNERS = Registry(FRAMEWORK)
# one runner per op serves every dispatch a torch plan emits: each runner reads the dispatch itself
RUNNERS.add("gemm", Runner(gemm.footprint, gemm.prepare))
for _context, _suffix in ((True, "context"), (False, "generation")):
    RUNNERS.add(
        f"attention_{_suffix}",
        Runner(partial(attention.footprint, context=_context), partial(attention.prepare, context=_context)),
    )
    RUNNERS.add(
        f"mla_{_suffix}", Runner(partial(mla.footprint, context=_context), partial(mla.prepare, context=_context))
    )
RUNNERS.add("moe", Runner(moe.footprint, moe.prepare))
RUNNERS.add("compute_scale", Runner(quantize.compute_scale_footprint, quantize.prepare_compute_scale))
RUNNERS.add("scale_matrix", Runner(quantize.scale_matrix_footprint, quantize.prepare_scale_matrix))
RUNNERS.add("mla_bmm", Runner(mla_bmm.footprint, mla_bmm.prepare))
RUNNERS.add("encoder_attention", Runner(encoder_attention.footprint, encoder_attention.prepare))
for _kind in ("csa", "hca"):  # one reference module: the case's compress_ratio and isl tell its kind and phase
    for _suffix in ("context", "generation"):
        RUNNERS.add(f"dsv4_{_kind}_{_suffix}_module", Runner(dsv4.footprint, dsv4.prepare))
RUNNERS.add("dsv4_paged_mqa_logits_module", Runner(dsv4_kernels.paged_footprint, dsv4_kernels.prepare_paged))
RUNNERS.add("dsv4_hca_attn_module", Runner(dsv4_kernels.hca_footprint, dsv4_kernels.prepare_hca))
RUNNERS.add(
    "dsv4_csa_topk_calib",
    Runner(dsv4_kernels.topk_footprint, dsv4_kernels.prepare_topk, untimed=dsv4_kernels.trivial),
)
RUNNERS.add("mhc", Runner(mhc.footprint, mhc.prepare))
for _phase in ("context", "generation"):  # one module each: the case's isl is its phase, op_name its indexer
    RUNNERS.add(f"dsa_{_phase}_module", Runner(dsa.module_footprint, dsa.prepare_module))
    RUNNERS.add(f"msa_{_phase}_module", Runner(msa.footprint, msa.prepare))
RUNNERS.add("glm5_mqa_logits_module", Runner(dsa.mqa_footprint, dsa.prepare_mqa))
RUNNERS.add("glm5_topk_module", Runner(dsa.topk_footprint, dsa.prepare_topk, untimed=dsa.trivial_topk))
RUNNERS.add("glm5_dsa_attn_module", Runner(dsa.attn_footprint, dsa.prepare_attn))
# one runner per op: the case's stage and phase tell its kernel (conv or the recurrence, prompt or decode)
RUNNERS.add("gdn", Runner(linear_runners.gdn_footprint, linear_runners.prepare_gdn))
RUNNERS.add("mamba2", Runner(linear_runners.mamba2_footprint, linear_runners.prepare_mamba2))
RUNNERS.add("comm", Runner(comm.footprint, measure_row=comm.measure_row))  # one process group times a whole row


def footprint(op: str, case) -> int:
    return RUNNERS.find(op, ANY_DISPATCH).footprint(case)


def measure(op: str, dispatch: str, cases: list, device: str, config: TimingConfig) -> list[Measured]:
    return timing.measure_cases(RUNNERS.find(op, dispatch), dispatch, cases, device, config)
