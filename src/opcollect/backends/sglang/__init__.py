"""The SGLang backend: SGLang 0.5.14's own layers and kernels, as SGLang selects them on the device.

Each runner builds what serving would (the linear methods and their kernel dispatch, FusedMoE with the runner
backend SGLang resolves, RadixAttention over its token pools with the attention backend of the SM, the MLA
backend with the absorb BMMs, the custom all-reduce, the FP8 activation quant of a static checkpoint, the MLA absorb
BMMs on their own, the vision tower's attention) inside one worker's SGLang context (context.py: the
process-wide server args and parallel state, set in one place and restored) and reads what SGLang chose.
sglang is imported only inside the functions that run on the GPU; NCCL is timed as the torch backend times it.
"""

from __future__ import annotations

from functools import partial

from opcollect.backends.sglang import (
    allreduce,
    attention,
    dsa,
    dsa_kernels,
    dsv4,
    dsv4_kernels,
    encoder_attention,
    gdn,
    gemm,
    mhc,
    mla,
    mla_bmm,
    moe,
    quantize,
)
from opcollect.backends.torch import comm
from opcollect.errors import FrameworkMissing
from opcollect.runtime import devices as hardware
from opcollect.runtime import timing
from opcollect.runtime.contract import ANY_DISPATCH, Measured, Registry, Runner
from opcollect.runtime.harness import TimingConfig

FRAMEWORK = "sglang"
devices = hardware.devices
device_sm = hardware.device_sm
free_memory = hardware.free_memory
setup_worker = hardware.setup_worker


def identity(device: str) -> dict:
    try:
        import sglang
    except ImportError:
        raise FrameworkMissing(
            FRAMEWORK, "SGLang is not installed here: run SGLang plans in the backend's pinned image"
        ) from None
    return {"framework": FRAMEWORK, "version": sglang.__version__, **hardware.probe(device)}


RUNNERS = Registry(FRAMEWORK)
# one runner per op: each reads from SGLang which kernel it chose, whatever the plan predicted
RUNNERS.add("gemm", Runner(gemm.footprint, gemm.prepare))
RUNNERS.add("moe", Runner(moe.footprint, moe.prepare))
for _context, _suffix in ((True, "context"), (False, "generation")):
    RUNNERS.add(
        f"attention_{_suffix}",
        Runner(partial(attention.footprint, context=_context), partial(attention.prepare, context=_context)),
    )
    RUNNERS.add(
        f"mla_{_suffix}", Runner(partial(mla.footprint, context=_context), partial(mla.prepare, context=_context))
    )
RUNNERS.add("comm", Runner(comm.footprint, measure_row=comm.measure_row))  # NCCL, as nccl-tests times it
RUNNERS.add("custom_allreduce", Runner(allreduce.footprint, measure_row=allreduce.measure_row))
# compute_scale is a difference of two timings (dynamic less static quant), so it times its own row
RUNNERS.add("compute_scale", Runner(quantize.footprint, measure_row=quantize.measure_compute_scale))
RUNNERS.add("scale_matrix", Runner(quantize.footprint, partial(quantize.prepare, dynamic=False)))
RUNNERS.add("mla_bmm", Runner(mla_bmm.footprint, mla_bmm.prepare))
RUNNERS.add("encoder_attention", Runner(encoder_attention.footprint, encoder_attention.prepare))
RUNNERS.add("mhc", Runner(mhc.footprint, mhc.prepare))
RUNNERS.add("gdn", Runner(gdn.footprint, gdn.prepare))  # Gated DeltaNet's conv and core kernels, one a row
# GLM-5's DSA kernels alone; a top-k whose requests fit in index_topk is held at 0 by the plan, not run
RUNNERS.add("glm5_mqa_logits_module", Runner(dsa_kernels.mqa_footprint, dsa_kernels.prepare_mqa))
RUNNERS.add(
    "glm5_topk_module",
    Runner(dsa_kernels.topk_footprint, dsa_kernels.prepare_topk, untimed=dsa_kernels.trivial_topk),
)
RUNNERS.add("glm5_dsa_attn_module", Runner(dsa_kernels.attn_footprint, dsa_kernels.prepare_attn))
# DeepSeek-V4's CSA indexer kernels alone; a top-k whose rows keep every entry is held at 0 by the plan, not run
RUNNERS.add("dsv4_paged_mqa_logits_module", Runner(dsv4_kernels.paged_footprint, dsv4_kernels.prepare_paged))
RUNNERS.add(
    "dsv4_csa_topk_calib",
    Runner(dsv4_kernels.topk_footprint, dsv4_kernels.prepare_topk, untimed=dsv4_kernels.trivial_topk),
)
for _context, _phase in ((True, "context"), (False, "generation")):  # op_name tells an indexer-skipping layer
    RUNNERS.add(
        f"dsa_{_phase}_module",
        Runner(partial(dsa.footprint, context=_context), partial(dsa.prepare, context=_context)),
    )
    for _kind in ("csa", "hca"):  # DeepSeek-V4's attention module; the case's compress_ratio tells the layer
        RUNNERS.add(
            f"dsv4_{_kind}_{_phase}_module",
            Runner(partial(dsv4.footprint, context=_context), partial(dsv4.prepare, context=_context)),
        )


def footprint(op: str, case) -> int:
    return RUNNERS.find(op, ANY_DISPATCH).footprint(case)


def measure(op: str, dispatch: str, cases: list, device: str, config: TimingConfig) -> list[Measured]:
    return timing.measure_cases(RUNNERS.find(op, dispatch), dispatch, cases, device, config)
