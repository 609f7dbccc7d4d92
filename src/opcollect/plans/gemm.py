"""GEMM: out[m, n] = x[m, k] @ w[n, k]^T for the base (n, k) grid and every model's per-rank weights."""

from __future__ import annotations

from itertools import chain, product
from typing import Mapping, NamedTuple

from opcollect.cases.grids import GemmGrid
from opcollect.cases.profiles import ModelShapes
from opcollect.plans.base import Group, OpPlan, make_groups, sm_at_least


class GemmCase(NamedTuple):
    gemm_dtype: str
    m: int
    n: int
    k: int


def model_origins(grid_keys: set, shapes: Mapping[str, ModelShapes], attr: str) -> dict[tuple, frozenset[str]]:
    """Shapes the models add beyond ``grid_keys``, each with the models that need it."""
    found: dict[tuple, set[str]] = {}
    for model, model_shapes in shapes.items():
        for shape in getattr(model_shapes, attr):
            if tuple(shape) not in grid_keys:
                found.setdefault(tuple(shape), set()).add(model)
    return {key: frozenset(models) for key, models in found.items()}


def expand(grid: GemmGrid, shapes: Mapping[str, ModelShapes]) -> list[Group]:
    excluded = {(e.n, e.k) for e in grid.exclude_nk}
    base = {(n, k) for n in grid.n for k in grid.k if (n, k) not in excluded}
    origins = model_origins(base, shapes, "gemm")
    pairs = sorted(base | origins.keys())
    # run order: one weight at a time, m ascending, so a runner can reuse its buffers
    rows = {
        (dtype,): list(chain.from_iterable(product((dtype,), grid.m, (n,), (k,)) for n, k in pairs))
        for dtype in grid.dtypes
    }
    return make_groups("gemm", GemmCase, ("gemm_dtype",), rows, origins, ("n", "k"))


def _torch(sm: str, group: Group) -> str:
    if group.dtype == "int4_wo":
        return "torch._weight_int4pack_mm_for_cpu" if sm == "cpu" else "torch._weight_int4pack_mm"
    return "torch._scaled_mm" if group.dtype == "fp8" else "torch.nn.functional.linear"


def _vllm(sm: str, group: Group) -> str:
    # vLLM 0.24.0 model_executor/kernels/linear/__init__.py picks the linear kernel per layer: the first
    # of its list whose is_supported(cc) and can_implement(config) pass. Shape-dependent choices: _vllm_case.
    return {
        # per-tensor fp8 (Fp8Config, dynamic per-token activations): :292-299, Marlin is refused from
        # cc 8.9 (scaled_mm/marlin.py:46-55) and FlashInfer needs per-tensor activation scales
        # (scaled_mm/flashinfer.py:50-63), so CUTLASS on SM89 and up
        "fp8": "CutlassFP8ScaledMMLinearKernel",
        "fp8_block": "fp8_block",  # by shape: _vllm_case
        "int4_wo": "int4_wo",  # by shape: _vllm_case
        # NVFP4 (ModelOpt/compressed-tensors): init_nvfp4_linear_kernel's CUDA order (:407-420) starts with
        # the FlashInfer CuTe DSL kernel on the SM100 family (nvfp4/flashinfer.py:35-46)
        "nvfp4": "FlashInferCuteDslNvFp4LinearKernel",
    }.get(group.dtype, "torch.nn.functional.linear")  # UnquantizedLinearMethod: F.linear (layers/utils.py:92-98)


def _vllm_case(sm: str, dispatch: str, case: GemmCase) -> str:
    if dispatch == "fp8_block":
        # _POSSIBLE_FP8_BLOCK_KERNELS (kernels/linear/__init__.py:323-329): FlashInfer+DeepGEMM on exactly
        # SM 9.0 (utils/flashinfer.py:914-929), DeepGEMM on SM90 and the 100/120 families (utils/deep_gemm.py:94-100),
        # both only when N % 64 == 0 and K % 128 == 0 (utils/deep_gemm.py:700-717); then CUTLASS block (SM90 and
        # up, utils/w8a8_utils.py:21-42), then Triton. The SM90 wrapper picks per call: FlashInfer's SM90
        # block-scale GEMM for M < 32, DeepGEMM otherwise (scaled_mm/flashinfer.py:301-316).
        aligned = case.n % 64 == 0 and case.k % 128 == 0
        if aligned and sm == "90":
            return "FlashInferFp8BlockScaledMMKernel" if case.m < 32 else "DeepGemmFp8BlockScaledMMKernel"
        if aligned and sm in ("100", "103", "120"):
            return "DeepGemmFp8BlockScaledMMKernel"
        return "CutlassFp8BlockScaledMMKernel" if sm_at_least(sm, 90) else "TritonFp8BlockScaledMMKernel"
    if dispatch == "int4_wo":
        # GPTQ int4 (group 128): choose_mp_linear_kernel (kernels/linear/__init__.py:648-718, order :359-369) takes
        # Machete on exactly SM 9.0 when K % 64 == 0 and N % 128 == 0 (mixed_precision/machete.py:24-63), else Marlin
        if sm == "90" and case.k % 64 == 0 and case.n % 128 == 0:
            return "MacheteLinearKernel"
        return "MarlinLinearKernel"
    return dispatch


def _sglang(sm: str, group: Group) -> str:
    if group.dtype == "fp8_block":
        return "deep_gemm" if sm_at_least(sm, 90) else "triton_w8a8_block_fp8"
    return {"fp8": "sgl_kernel.fp8_scaled_mm", "nvfp4": "sgl_kernel.cutlass_scaled_fp4_mm"}.get(
        group.dtype, "torch.nn.functional.linear"
    )


def _trtllm(sm: str, group: Group) -> str:
    return {
        "fp8": "trtllm.cublas_scaled_mm",
        "fp8_block": "trtllm.fp8_block_scaling_gemm",
        "nvfp4": "trtllm.nvfp4_gemm",
        "int4_wo": "trtllm.weight_only_quant_gemm",
    }.get(group.dtype, "torch.nn.functional.linear")


PLAN = OpPlan(
    name="gemm",
    family="gemm",
    table="gemm_perf",
    op_name="gemm",
    case_type=GemmCase,
    dtype_fields=("gemm_dtype",),
    expand=expand,
    tp_sizes=lambda grid: tuple(grid.model_tp_sizes),
    dispatch={"torch": _torch, "vllm": _vllm, "sglang": _sglang, "trtllm": _trtllm},
    cost=lambda c: 2.0 * c.m * c.n * c.k + 2.0 * c.n * c.k,
    case_dispatch={"vllm": _vllm_case},
)
