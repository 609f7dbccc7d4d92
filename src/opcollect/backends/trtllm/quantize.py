"""FP8 per-tensor activation quantization through TensorRT-LLM's own ops, as its FP8 linear calls them.

Serving's FP8 linear (FP8QDQLinearMethod.apply, _torch/modules/linear.py:619-627 @00bbf71e) quantizes its bf16
activation with torch.ops.tensorrt_llm.static_quantize_e4m3_per_tensor(input, module.input_scale) when the checkpoint
carries an input scale (a float32 scalar, load_weight_scales reshapes it to [], :686-717), and with
torch.ops.tensorrt_llm.quantize_e4m3_per_tensor(input) when it does not. The ops (cpp/tensorrt_llm/thop/fp8Op.cpp,
index id 33308791) allocate the fp8 output per call; the dynamic one computes the one per-tensor scale first
(invokeComputeScalesAndQuantizeMatrix, a scale of shape [1, 1] in the input's dtype), the static one applies the given
float32 scale (invokeQuantizeMatrix; CHECK_TYPE float32).

scale_matrix: the static op with a given scale, the part a statically quantized checkpoint pays per GEMM.
compute_scale: what computing the scale costs, as the reference collector defines it (ai-dynamo/aiconfigurator
collector/trtllm/collect_computescale.py): the time of the dynamic op minus that of the static one on the same
input. TensorRT-LLM has no op that only computes the scale, so the quantity is a difference of two timings. Both are
timed in the same row, one after the other, each by the harness (graphs, cold L2, the stopping rule); the row's
fields come from both by runtime/harness.py difference(): latency max(0, the difference of the medians), the
collector's quantity (a dynamic op no slower than the static one gives a row of latency 0, as the reference's do),
p25/p75 the widest difference their interquartile ranges allow, noise relative to the dynamic op's median.
kernel_source "torch_ops" for both tables, the label
the reference records (collect_computescale.py), once the dry run shows which op ran: the static op hands back the
scale it was given, the dynamic one a fresh [1, 1] scale.

Before a case is built, torch_ops.check_installed proves that the installed FP8QDQLinearMethod.apply still calls
these two ops. The pure parts (footprint, kernel_ran) need no torch.
"""

from __future__ import annotations

from opcollect.backends.trtllm import torch_ops
from opcollect.backends.trtllm.context import SERVED_VERSIONS
from opcollect.runtime import timing
from opcollect.runtime.contract import KernelLimit, Measured, Prepared, Runner
from opcollect.runtime.harness import TimingConfig, difference

KERNEL_SOURCE = "torch_ops"  # the reference's label for both tables (collect_computescale.py)
NAMESPACE = "tensorrt_llm"  # TORCH_LIBRARY_FRAGMENT(tensorrt_llm, m) in fp8Op.cpp
STATIC_OP = "static_quantize_e4m3_per_tensor"
DYNAMIC_OP = "quantize_e4m3_per_tensor"
ACTIVATION_BYTES = 2  # bf16 activations, as serving's linear receives them and the reference draws them
FP8_BYTES = 1
STATIC_SCALE_BYTES = 4  # the checkpoint's float32 input_scale
DYNAMIC_SCALE_BYTES = 2  # the [1, 1] scale the dynamic op returns in the input's dtype
INPUT_SCALE = 1.0  # the reference's static scale (collect_computescale.py); any positive scale runs the same kernel


def check_case(case) -> None:
    if case.quant_dtype != "fp8":
        raise KernelLimit(f"TensorRT-LLM's per-tensor quantize ops quantize to fp8 only, not {case.quant_dtype}")
    if case.m < 1 or case.k < 1:
        # e4m3_quantize_helper: TORCH_CHECK(input.numel() != 0) (fp8Op.cpp)
        raise KernelLimit(f"TensorRT-LLM's quantize ops refuse an empty input (m={case.m}, k={case.k})")


def footprint(case) -> int:
    """Bytes of one input set: x, the fp8 output each call allocates and the larger of the two scales (the two
    measurements of a compute_scale row are prepared and freed one after the other)."""
    return case.m * case.k * (ACTIVATION_BYTES + FP8_BYTES) + max(STATIC_SCALE_BYTES, DYNAMIC_SCALE_BYTES)


def kernel_ran(output, returned_scale, given_scale, shape: tuple[int, int], dynamic: bool) -> str:
    """The label of what the dry run shows ran: an fp8 output of the input's shape, and the scale the static op hands
    back (the one it was given) or the [1, 1] one the dynamic op computed (e4m3_quantize_helper, fp8Op.cpp)."""
    if tuple(output.shape) != tuple(shape) or "float8_e4m3fn" not in str(output.dtype):
        raise RuntimeError(
            f"TensorRT-LLM's quantize wrote {output.dtype} {tuple(output.shape)} for an input of {shape}"
        )
    if dynamic:
        if tuple(returned_scale.shape) != (1, 1):
            raise RuntimeError(f"{DYNAMIC_OP} returned a scale of shape {tuple(returned_scale.shape)}, not (1, 1)")
    elif returned_scale.data_ptr() != given_scale.data_ptr():
        raise RuntimeError(f"{STATIC_OP} did not return the scale it was given: it did not apply that scale")
    return KERNEL_SOURCE


def _prepare(case, device: str, copies: int, dynamic: bool) -> Prepared:
    check_case(case)
    torch_ops.check_installed("compute_scale" if dynamic else "scale_matrix")
    import torch

    from opcollect.runtime.timing import random_tensor

    op = torch_ops.torch_op(NAMESPACE, DYNAMIC_OP if dynamic else STATIC_OP)
    xs = [random_tensor((case.m, case.k), torch.bfloat16, device, i) for i in range(copies)]
    # the checkpoint's input_scale as FP8QDQLinearMethod holds it: a float32 scalar on the device (linear.py:586-587)
    scale = torch.tensor(INPUT_SCALE, dtype=torch.float32, device=device)
    args = () if dynamic else (scale,)
    output, returned = op(xs[0], *args)  # the dry run, outside the timed region
    source = kernel_ran(output, returned, scale, (case.m, case.k), dynamic)
    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        op(xs[i], *args)

    return Prepared(call, source)


def prepare_static(case, dispatch: str, device: str, copies: int) -> Prepared:
    return _prepare(case, device, copies, dynamic=False)


def prepare_dynamic(case, dispatch: str, device: str, copies: int) -> Prepared:
    return _prepare(case, device, copies, dynamic=True)


STATIC_RUNNER = Runner(footprint, prepare_static, versions=SERVED_VERSIONS)
DYNAMIC_RUNNER = Runner(footprint, prepare_dynamic, versions=SERVED_VERSIONS)


def measure_compute_scale(cases: list, device: str, config: TimingConfig) -> list[Measured]:
    """Per case: the dynamic op, then the static one, each timed by the harness as any prepared case is; the row
    reports their difference."""
    results = []
    for case in cases:
        check_case(case)
        (dynamic,) = timing.measure_cases(DYNAMIC_RUNNER, KERNEL_SOURCE, [case], device, config)
        (static,) = timing.measure_cases(STATIC_RUNNER, KERNEL_SOURCE, [case], device, config)
        stats = difference(dynamic.stats, static.stats)
        if dynamic.kernel_source != static.kernel_source:
            raise RuntimeError(f"compute_scale: the two ops ran {dynamic.kernel_source} and {static.kernel_source}")
        results.append(Measured(stats, dynamic.kernel_source))
    return results


RUNNERS = {
    "compute_scale": (Runner(footprint, measure_row=measure_compute_scale, versions=SERVED_VERSIONS),),
    "scale_matrix": (STATIC_RUNNER,),
}
