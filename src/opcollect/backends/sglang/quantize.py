"""FP8 activation quantization as SGLang 0.5.14 serves a statically quantized FP8 checkpoint, to computescale_perf
(compute_scale) and scale_matrix_perf (scale_matrix). Paths are relative to the wheel's sglang/srt/.

The consumer derives a static-FP8 GEMM from the dynamic FP8 GEMM rows (gemm_perf) and these two overheads
(aiconfigurator sdk/task_v2.py:2144-2147): compute_scale is what a dynamic per-token quant costs beyond a quant with
a given scale, and scale_matrix is the quant with a given scale. The reference collector times the two quants one
after the other and writes max(0, dynamic - static) and static (collector/sglang/collect_computescale.py); here both
are SGLang's own kernels as serving launches them:
- dynamic: an FP8 GEMM with no input scale quantizes per token, sglang_per_token_quant_fp8 on CUDA
  (layers/quantization/fp8_utils.py:1602-1605; fp8_kernel.py:741-757, sgl_kernel.sgl_per_token_quant_fp8), as the
  fp8 GEMM runner (gemm.py) serves it.
- static: a ModelOpt FP8 checkpoint (Llama-3.1-70B-Instruct-FP8, Qwen3-32B-FP8-Static-PerTensor: quant_algo FP8)
  runs ModelOptFp8LinearMethod (quantization/modelopt_quant.py:499-606) with input_scale the per-tensor maximum, a
  0-dim tensor (modelopt_quant.py:582). Its apply quantizes with static_quant_fp8 (fp8_kernel.py:817-873, Triton):
  through apply_fp8_linear with repeat_scale = cutlass_fp8_supported (fp8_utils.py:1594-1601), or, where
  enable_flashinfer_bmm (SM100 with flashinfer, modelopt_quant.py:517, 591-598), through
  apply_fp8_linear_bmm_flashinfer with repeat_scale False (fp8_utils.py:1527). The runner reads both flags from the
  ModelOptFp8LinearMethod SGLang builds on this device.
The reference's static quant is a chain of torch ops rather than SGLang's fused kernel, slower than the dynamic
kernel at most shapes, so its compute_scale is 0.0 in all but 6 of 1628 H200 rows; timed with SGLang's fused static
kernel, these rows may differ from the reference's. kernel_source is the reference's label, "sglang", for SGLang's
CUDA quant kernels; ModelOpt FP8 needs SM 89 (ModelOptFp8Config.get_min_capability, modelopt_quant.py:431-432) and a
CUDA device.
"""

from __future__ import annotations

from functools import partial

from opcollect.runtime import timing
from opcollect.runtime.contract import KernelLimit, Measured, Prepared, Runner
from opcollect.runtime.devices import device_sm
from opcollect.runtime.harness import TimingConfig, difference

SOURCE = "sglang"
QUANT_DTYPES = ("fp8",)


def check_case(case) -> None:
    if case.quant_dtype not in QUANT_DTYPES:
        raise KernelLimit(f"SGLang's static per-tensor activation quant is fp8 only, not {case.quant_dtype}")


def footprint(case) -> int:
    """x (bf16), the fp8 output, the per-token fp32 scales (the dynamic quant's, or the static quant's repeated
    scale) and the input scale."""
    m, k = case.m, case.k
    return m * k * 2 + m * k + m * 4 + 4


def static_repeat_scale(device: str) -> bool:
    """repeat_scale of the static_quant_fp8 call ModelOptFp8LinearMethod.apply makes on this device; KernelLimit
    where SGLang serves no ModelOpt FP8 (below its minimum capability, or off CUDA)."""
    from sglang.srt.layers.quantization.modelopt_quant import ModelOptFp8Config, ModelOptFp8LinearMethod

    sm = device_sm(device)
    config = ModelOptFp8Config(is_checkpoint_fp8_serialized=True)
    if not sm.isdigit() or int(sm) < config.get_min_capability():
        raise KernelLimit(f"SGLang serves ModelOpt FP8 on CUDA SM >= {config.get_min_capability()}, not on {sm}")
    method = ModelOptFp8LinearMethod(config)
    if method.enable_flashinfer_bmm:  # apply_fp8_linear_bmm_flashinfer (fp8_utils.py:1527)
        return False
    return bool(method.cutlass_fp8_supported)  # apply_fp8_linear's static branch (fp8_utils.py:1596-1601)


def prepare(case, dispatch: str, device: str, copies: int, dynamic: bool) -> Prepared:
    """One quant per call on the next copy's activations: dynamic per token, or static with a given scale."""
    check_case(case)
    import torch
    from sglang.srt.layers.quantization.fp8_kernel import sglang_per_token_quant_fp8, static_quant_fp8

    from opcollect.backends.sglang.context import sglang_context
    from opcollect.runtime.timing import random_tensor

    with sglang_context(device), torch.device(device):
        repeat = static_repeat_scale(device)
        # the activations a linear layer receives, viewed 2-D (input.view(-1, K), fp8_utils.py:1558)
        xs = [random_tensor((case.m, case.k), torch.bfloat16, device, i) for i in range(copies)]
        input_scale = torch.ones((), dtype=torch.float32, device=device)  # 0-dim, as modelopt_quant.py:582 leaves it
    state = {"i": 0}

    def quant_dynamic() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        sglang_per_token_quant_fp8(xs[i])

    def quant_static() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        static_quant_fp8(xs[i], input_scale, repeat_scale=repeat)

    return Prepared(quant_dynamic if dynamic else quant_static, SOURCE)


def measure_compute_scale(cases: list, device: str, config: TimingConfig) -> list[Measured]:
    """Per case: the dynamic quant timed, then the static one (the reference's order), each as a prepared case of its
    own (rotation, graph, cold L2), and their difference (runtime/harness.py difference(): max(0, dynamic - static),
    the reference's quantity, so a dynamic quant no slower than the static one gives a row of latency 0)."""
    dynamic = Runner(footprint, partial(prepare, dynamic=True))
    static = Runner(footprint, partial(prepare, dynamic=False))
    results = []
    for case in cases:
        check_case(case)
        (with_scale,) = timing.measure_cases(dynamic, SOURCE, [case], device, config)
        (given_scale,) = timing.measure_cases(static, SOURCE, [case], device, config)
        results.append(Measured(difference(with_scale.stats, given_scale.stats), with_scale.kernel_source))
    return results
