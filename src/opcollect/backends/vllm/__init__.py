"""The vLLM backend: vLLM 0.24.0's own layers and kernels, as vLLM selects them on the device.

Each runner builds the vLLM layer serving would (linear methods, FusedMoE, Attention with its backend's
metadata builder and paged KV cache, DeepseekV2MLAAttention, the custom all-reduce, MLAAttention's absorb weights,
MMEncoderAttention) or calls vLLM's own op (scaled_fp8_quant) inside one worker's vLLM context (context.py) and
reads the kernel vLLM chose from the objects it built or the op's result. vllm is imported only
inside the functions that run on the GPU; NCCL collectives are timed as the torch backend times them.
"""

from __future__ import annotations

from functools import partial

from opcollect.backends.torch import comm
from opcollect.backends.vllm import (
    allreduce,
    attention,
    dsa,
    dsv4,
    encoder_attention,
    gdn,
    gemm,
    mhc,
    mla,
    mla_bmm,
    moe,
    msa,
    quantize,
)
from opcollect.errors import FrameworkMissing
from opcollect.runtime import devices as hardware
from opcollect.runtime import timing
from opcollect.runtime.contract import ANY_DISPATCH, Measured, Registry, Runner
from opcollect.runtime.harness import TimingConfig

FRAMEWORK = "vllm"
devices = hardware.devices
device_sm = hardware.device_sm
free_memory = hardware.free_memory
setup_worker = hardware.setup_worker


def identity(device: str) -> dict:
    try:
        import vllm
    except ImportError:
        raise FrameworkMissing(
            FRAMEWORK, "vLLM is not installed here: run vLLM plans in the backend's pinned image"
        ) from None
    return {"framework": FRAMEWORK, "version": vllm.__version__, **hardware.probe(device)}


RUNNERS = Registry(FRAMEWORK)
# one runner per op: each reads from vLLM which kernel it chose, whatever the plan predicted
RUNNERS.add("gemm", Runner(gemm.footprint, gemm.prepare))
RUNNERS.add("moe", Runner(moe.footprint, moe.prepare))
for _context, _suffix in ((True, "context"), (False, "generation")):
    RUNNERS.add(
        f"attention_{_suffix}",
        Runner(partial(attention.footprint, context=_context), partial(attention.prepare, context=_context)),
    )
    RUNNERS.add(
        f"mla_{_suffix}_module",
        Runner(partial(mla.footprint, context=_context), partial(mla.prepare, context=_context)),
    )
    RUNNERS.add(
        f"dsa_{_suffix}_module",
        Runner(partial(dsa.footprint, context=_context), partial(dsa.prepare, context=_context)),
    )
    RUNNERS.add(
        f"msa_{_suffix}_module",
        Runner(partial(msa.footprint, context=_context), partial(msa.prepare, context=_context)),
    )
    for _kind in ("csa", "hca"):  # DeepSeek-V4's attention modules (dsv4.py)
        RUNNERS.add(
            f"dsv4_{_kind}_{_suffix}_module",
            Runner(partial(dsv4.footprint, context=_context), partial(dsv4.prepare, context=_context)),
        )
RUNNERS.add("scale_matrix", Runner(quantize.static_footprint, quantize.prepare_static))
# the dynamic per-token quantization minus the static one, both timed in the row (quantize.py)
RUNNERS.add("compute_scale", Runner(quantize.compute_scale_footprint, measure_row=quantize.measure_compute_scale))
RUNNERS.add("mla_bmm", Runner(mla_bmm.footprint, mla_bmm.prepare))
RUNNERS.add("encoder_attention", Runner(encoder_attention.footprint, encoder_attention.prepare))
RUNNERS.add("mhc", Runner(mhc.footprint, mhc.prepare))
RUNNERS.add("gdn", Runner(gdn.footprint, gdn.prepare))  # Gated DeltaNet's conv and core kernels, one a row
RUNNERS.add("dsv4_hca_attn_module", Runner(dsv4.hca_footprint, dsv4.prepare_hca))
RUNNERS.add("dsv4_paged_mqa_logits_module", Runner(dsv4.paged_footprint, dsv4.prepare_paged))
RUNNERS.add("comm", Runner(comm.footprint, measure_row=comm.measure_row))  # NCCL, as nccl-tests times it
RUNNERS.add("custom_allreduce", Runner(allreduce.footprint, measure_row=allreduce.measure_row))


def footprint(op: str, case) -> int:
    return RUNNERS.find(op, ANY_DISPATCH).footprint(case)


def measure(op: str, dispatch: str, cases: list, device: str, config: TimingConfig) -> list[Measured]:
    return timing.measure_cases(RUNNERS.find(op, dispatch), dispatch, cases, device, config)
