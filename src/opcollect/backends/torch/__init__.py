"""The plain-PyTorch backend: PyTorch's own kernels, on a GPU or the CPU. The embedded default."""

from __future__ import annotations

from functools import partial

from opcollect.backends.torch import attention, comm, encoder_attention, gemm, mla, mla_bmm, moe, quantize
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
RUNNERS.add("comm", Runner(comm.footprint, measure_row=comm.measure_row))  # one process group times a whole row


def footprint(op: str, case) -> int:
    return RUNNERS.find(op, ANY_DISPATCH).footprint(case)


def measure(op: str, dispatch: str, cases: list, device: str, config: TimingConfig) -> list[Measured]:
    return timing.measure_cases(RUNNERS.find(op, dispatch), dispatch, cases, device, config)
