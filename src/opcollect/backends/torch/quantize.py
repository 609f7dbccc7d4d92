"""FP8 activation quantization with torch ops: the two parts the consumer adds to a statically quantized GEMM.

compute_scale: the dynamic FP8 scale of a bf16 activation x[m, k], one per token (row): amax(|x|) / 448.
The reference collectors time it as (dynamic quantization) - (static quantization); vLLM's and SGLang's
dynamic kernels there are per token (collector/{vllm,sglang}/collect_computescale.py: scaled_fp8_quant with
use_per_token_if_dynamic=True, sgl_per_token_quant_fp8). With torch ops the scale is its own kernels, so the
runner times them directly rather than as a difference of two noisy medians.

scale_matrix: x quantized with a given per-tensor scale to float8_e4m3fn, the torch form SGLang's collector
times: (x / scale).clamp(fp8 min, fp8 max) written into an fp8 buffer.
"""

from __future__ import annotations

from opcollect.runtime.contract import KernelLimit, Prepared
from opcollect.runtime.timing import random_tensor

KERNEL_SOURCE = "torch_ops"
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
MIN_SCALE = 1e-12  # an all-zero row would otherwise get scale 0 and divide by it
ACTIVATION_BYTES = 2  # the activation is bf16, as the reference collectors draw it


def _require_fp8(case) -> None:
    import torch

    if case.quant_dtype != "fp8":
        raise KernelLimit(f"the torch quantize runners quantize to fp8 only, not {case.quant_dtype}")
    if not hasattr(torch, "float8_e4m3fn"):
        raise KernelLimit(f"this torch {torch.__version__} has no float8_e4m3fn")


def per_token_scale(x):
    """One float32 scale per row of x: amax(|row|) / 448, at least MIN_SCALE."""
    import torch

    return x.abs().amax(dim=-1, keepdim=True).to(torch.float32).div_(FP8_MAX).clamp_(min=MIN_SCALE)


def quantize_into(out, x, scale) -> None:
    """out (float8_e4m3fn) = x / scale, clamped to the fp8 range."""
    out.copy_((x / scale).clamp_(-FP8_MAX, FP8_MAX))


def compute_scale_footprint(case) -> int:
    rows = case.m * case.k
    # x, its |x| temporary, and the (m, 1) amax and float32 scale
    return 2 * rows * ACTIVATION_BYTES + case.m * (ACTIVATION_BYTES + 4)


def scale_matrix_footprint(case) -> int:
    rows = case.m * case.k
    # x, the float32 quotient (bf16 / float32 promotes), the fp8 output, the scale
    return rows * (ACTIVATION_BYTES + 4 + 1) + 4


def prepare_compute_scale(case, dispatch: str, device: str, copies: int) -> Prepared:
    import torch

    _require_fp8(case)
    xs = [random_tensor((case.m, case.k), torch.bfloat16, device, i) for i in range(copies)]
    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        per_token_scale(xs[i])

    return Prepared(call, KERNEL_SOURCE)


def prepare_scale_matrix(case, dispatch: str, device: str, copies: int) -> Prepared:
    import torch

    _require_fp8(case)
    xs = [random_tensor((case.m, case.k), torch.bfloat16, device, i) for i in range(copies)]
    outs = [torch.empty((case.m, case.k), dtype=torch.float8_e4m3fn, device=device) for _ in range(copies)]
    # a static scale as a checkpoint stores it: one float32 for the tensor, here from the first input's range
    scale = (xs[0].abs().amax().to(torch.float32) / FP8_MAX).clamp(min=MIN_SCALE).reshape(1)
    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        quantize_into(outs[i], xs[i], scale)

    return Prepared(call, KERNEL_SOURCE)
