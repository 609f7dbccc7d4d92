"""FP8 activation quantization through vLLM 0.24.0's own op, vllm._custom_ops.scaled_fp8_quant, called with the
arguments serving's QuantFP8 passes it (model_executor/layers/quantization/input_quant_fp8.py:124-134, its
forward_cuda; the FP8 linear kernels call it on the activation before the GEMM: kernels/linear/scaled_mm/
ScaledMMLinearKernel.py:115-119, 159-161; CUTLASS pads no tokens, ScaledMMLinearKernel.py:186-187).

scale_matrix: a static per-tensor quantization with a checkpoint's input scale (QuantFP8(static=True,
PER_TENSOR)): scaled_fp8_quant takes its static branch, torch.ops._C.static_scaled_fp8_quant (_custom_ops.py:1948-1949).

compute_scale: what computing the scale costs, as the reference collector defines it (collector/vllm/
collect_computescale.py): the median of a dynamic per-token quantization (QuantFP8(static=False, PER_TOKEN):
torch.ops._C.dynamic_per_token_scaled_fp8_quant, _custom_ops.py:1939-1944) minus the median of the static one above,
on the same input shape. vLLM has no kernel that only computes the scales, so the quantity is a difference of two
timings. Both are measured in the same row, one after the other, each by the harness (graphs, cold L2, the stopping
rule), and the row's fields are derived from both by runtime/harness.py difference(): latency max(0, the
difference of the medians), the reference's quantity, so a dynamic quant no slower than the static one gives a row of
latency 0, as the reference's does; p25/p75 the widest difference their interquartile ranges allow, noise relative to
the dynamic quant's median.

kernel_source is read from what ran: scaled_fp8_quant returns the scale it was given on its static branch, an
(m, 1) tensor on the per-token branch and a (1,) tensor on the dynamic per-tensor one (_custom_ops.py:1939-1951).
"""

from __future__ import annotations

from opcollect.runtime import timing
from opcollect.runtime.contract import KernelLimit, Measured, Prepared, Runner
from opcollect.runtime.harness import TimingConfig, difference

ACTIVATION_BYTES = 2  # bf16 activations, as serving's FP8 linear layers receive them and the reference draws them
FP8_BYTES = 1
SCALE_BYTES = 4  # float32 scales (_custom_ops.py:1941, 1946)
STATIC_INPUT_SCALE = 1.0  # the reference's static scale; any positive scale runs the same kernel
STATIC = "static_scaled_fp8_quant"
DYNAMIC_PER_TOKEN = "dynamic_per_token_scaled_fp8_quant"
DYNAMIC_PER_TENSOR = "dynamic_scaled_fp8_quant"


def _require_fp8(case) -> None:
    if case.quant_dtype != "fp8":
        raise KernelLimit(f"vLLM's scaled_fp8_quant quantizes to fp8 only, not {case.quant_dtype}")


def static_footprint(case) -> int:
    """x, the fp8 output and the one-element scale."""
    return case.m * case.k * (ACTIVATION_BYTES + FP8_BYTES) + SCALE_BYTES


def dynamic_footprint(case) -> int:
    """x, the fp8 output and one float32 scale per token."""
    return case.m * case.k * (ACTIVATION_BYTES + FP8_BYTES) + case.m * SCALE_BYTES


def compute_scale_footprint(case) -> int:
    """The larger of the two measurements: they are prepared and freed one after the other."""
    return max(static_footprint(case), dynamic_footprint(case))


def kernel_ran(returned_scale, given_scale, m: int) -> str:
    """The branch of scaled_fp8_quant that ran, from the scale it returned (_custom_ops.py:1939-1951)."""
    if given_scale is not None and returned_scale is given_scale:
        return STATIC
    if tuple(returned_scale.shape) == (m, 1):
        return DYNAMIC_PER_TOKEN
    if tuple(returned_scale.shape) == (1,):
        return DYNAMIC_PER_TENSOR
    raise RuntimeError(f"scaled_fp8_quant returned a scale of shape {tuple(returned_scale.shape)} for {m} tokens")


def _prepare(case, device: str, copies: int, static: bool) -> Prepared:
    _require_fp8(case)
    import torch
    from vllm._custom_ops import scaled_fp8_quant
    from vllm.model_executor.layers.quantization.utils.quant_utils import GroupShape

    from opcollect.runtime.timing import random_tensor

    xs = [random_tensor((case.m, case.k), torch.bfloat16, device, i) for i in range(copies)]
    # QuantFP8.forward_cuda's arguments (input_quant_fp8.py:124-134): a static quantization passes its scale and its
    # group shape, per tensor (-1, -1) (quant_utils.py:68); a dynamic per-token one no scale, no group shape and
    # use_per_token_if_dynamic (QuantFP8.__init__: group_shape == PER_TOKEN, input_quant_fp8.py:64)
    scale = torch.full((1,), STATIC_INPUT_SCALE, dtype=torch.float32, device=device) if static else None
    group_shape = (GroupShape.PER_TENSOR.row, GroupShape.PER_TENSOR.col) if static else None

    def quantize(x):
        return scaled_fp8_quant(
            x,
            scale,
            num_token_padding=None,
            scale_ub=None,
            use_per_token_if_dynamic=not static,
            group_shape=group_shape,
        )

    output, returned = quantize(xs[0])  # outside the timed region: which branch vLLM took
    if tuple(output.shape) != (case.m, case.k):
        raise RuntimeError(f"scaled_fp8_quant wrote {tuple(output.shape)} for an input of {(case.m, case.k)}")
    source = kernel_ran(returned, scale, case.m)
    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        quantize(xs[i])  # the output is allocated per call, as QuantFP8 leaves it to scaled_fp8_quant

    return Prepared(call, source)


def prepare_static(case, dispatch: str, device: str, copies: int) -> Prepared:
    return _prepare(case, device, copies, static=True)


def prepare_dynamic(case, dispatch: str, device: str, copies: int) -> Prepared:
    return _prepare(case, device, copies, static=False)


STATIC_RUNNER = Runner(static_footprint, prepare_static)
DYNAMIC_RUNNER = Runner(dynamic_footprint, prepare_dynamic)


def measure_compute_scale(cases: list, device: str, config: TimingConfig) -> list[Measured]:
    """Per case: the dynamic per-token quantization, then the static one, each timed by the harness as any prepared
    case is; the row reports their difference."""
    results = []
    for case in cases:
        _require_fp8(case)
        (dynamic,) = timing.measure_cases(DYNAMIC_RUNNER, DYNAMIC_PER_TOKEN, [case], device, config)
        (static,) = timing.measure_cases(STATIC_RUNNER, STATIC, [case], device, config)
        stats = difference(dynamic.stats, static.stats)
        results.append(Measured(stats, f"{dynamic.kernel_source}_minus_{static.kernel_source}"))
    return results
