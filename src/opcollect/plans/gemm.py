"""GEMM: out[m, n] = x[m, k] @ w[n, k]^T for the base (n, k) grid and every model's per-rank weights."""

from __future__ import annotations

from itertools import chain, product
from typing import Mapping, NamedTuple

from opcollect.cases.grids import GemmGrid
from opcollect.cases.profiles import ModelShapes
from opcollect.plans import selection_sglang
from opcollect.plans.base import Group, OpPlan, make_groups, refines, sm_at_least
from opcollect.plans.work import Work, format_of


class GemmCase(NamedTuple):
    gemm_dtype: str
    m: int
    n: int
    k: int


def work(c: GemmCase) -> Work:
    """2mnk FLOPs at the dtype's rate; x [m, k] and w [n, k] read once and out [m, n] written once (bf16, fp32 for
    a fp32 GEMM). The bytes count HBM traffic: an x that stays in a warm L2 between calls moves less, which is
    what a row under this bound shows (the harness keeps the L2 cold: runtime/timing.py)."""
    f = format_of(c.gemm_dtype)
    out = 4 if c.gemm_dtype == "float32" else 2
    return Work({f.peak: 2.0 * c.m * c.n * c.k}, c.m * c.k * f.act + c.n * c.k * f.weight + c.m * c.n * out)


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


@refines(("m", "n", "k"), ("fp8_block", "int4_wo"))
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


def _sglang_fp8(sm: str, dtype: str) -> str | None:
    """The fp8 linear kernel Fp8LinearMethod.__init__ picks on this SM (layers/quantization/fp8.py:341-362), as
    cases/selection/sglang-0.5.14.yaml records it from the pinned fp8_utils.py (scripts/selection_sglang_fp8.py):
    weight-only Marlin below SM89 (can_auto_enable_marlin_fp8, fp8_utils.py:1731-1737); block fp8 runs the
    function dispatch_w8a8_block_fp8_linear returns for --fp8-gemm-backend auto (fp8_utils.py:394-410, 489-507:
    DeepGEMM with its Triton fallback where JIT DeepGEMM is on, SM90 and SM100 with the image's deep_gemm; SM120
    is set to triton, :510-519); per-tensor fp8 runs apply_fp8_linear's CUTLASS branch when cutlass_fp8_supported
    (fp8_utils.py:162-171, 1621-1638), else torch._scaled_mm. The labels are backends/sglang/gemm.py
    kernel_name's; the dtype where the shape decides (_sglang_case). None where the file has no answer."""
    entry = selection_sglang.fp8_gemm(sm, dtype)
    if entry is None:
        return None
    if entry["fp8_marlin"]:
        return "sglang_fp8_marlin"
    if dtype == "fp8_block":
        chosen = entry["block_fp8_linear"]
        if chosen == "deepgemm_w8a8_block_fp8_linear_with_fallback":
            return "fp8_block"  # DeepGEMM or its Triton fallback by N and K: _sglang_case
        return "sglang_triton_w8a8_block_fp8" if chosen == "triton_w8a8_block_fp8_linear" else f"sglang_{chosen}"
    if not entry["cutlass_fp8_supported"]:
        return "sglang_torch_scaled_mm"
    return "sglang_triton_scaled_mm" if entry["triton_w8a8_fp8_kernel"] else "fp8"


def _sglang(sm: str, group: Group) -> str:
    """SGLang 0.5.14's linear kernel per dtype, named as the reference labels it (collector/sglang/
    collect_gemm.py:329-337); shape-dependent choices: _sglang_case. Paths are in the wheel's sglang/srt/."""
    if group.dtype in ("fp8", "fp8_block"):
        chosen = _sglang_fp8(sm, group.dtype)  # SGLang's own selection where the file covers the SM
        if chosen is not None:
            return chosen
    if group.dtype == "fp8":
        return "fp8"  # by shape: _sglang_case
    if group.dtype == "fp8_block":
        # dispatch_w8a8_block_fp8_linear (layers/quantization/fp8_utils.py:489-499): DeepGEMM with its fallback
        # when JIT DeepGEMM is on, which it is from SM90 except SM120 (layers/deep_gemm_wrapper/configurer.py:17-35);
        # SM120 and older run the Triton kernel (fp8_utils.py:510-519)
        return "fp8_block" if sm in ("90", "100", "103") else "sglang_triton_w8a8_block_fp8"
    if group.dtype == "int4_wo":
        # AWQ/GPTQ/compressed-tensors WNA16 are served by Marlin (layers/quantization/awq/awq.py:302-314,
        # gptq/gptq.py:384-390, marlin_utils.py:559-590); the wheel has no Machete path
        return "sglang_gptq_marlin_gemm"
    if group.dtype == "nvfp4":
        # initialize_fp4_gemm_config (layers/quantization/fp4_utils.py:149-162): CuTe DSL on SM100, CUTLASS on SM120
        return "sglang_flashinfer_cutedsl_nvfp4" if sm in ("100", "103") else "sglang_flashinfer_cutlass_nvfp4"
    return "sglang_torch_linear"  # UnquantizedLinearMethod.apply: F.linear (layers/quantization/unquant.py:139-162)


@refines(("n", "k"), ("fp8", "fp8_block"))
def _sglang_case(sm: str, dispatch: str, case: GemmCase) -> str:
    if dispatch == "fp8":
        # apply_fp8_linear: sgl_kernel.fp8_scaled_mm when both weight dims divide by 16, else the Triton
        # scaled_mm (layers/quantization/fp8_utils.py:1621-1638)
        fits = case.n % 16 == 0 and case.k % 16 == 0
        return "sglang_sgl_kernel_fp8_scaled_mm" if fits else "sglang_triton_scaled_mm"
    if dispatch == "fp8_block":
        # deepgemm_w8a8_block_fp8_linear_with_fallback: DeepGEMM when N % 64 == 0 and K % 128 == 0, else
        # triton_w8a8_block_fp8_linear (layers/quantization/fp8_utils.py:712-727, 873-894)
        aligned = case.n % 64 == 0 and case.k % 128 == 0
        return "sglang_deepgemm_gemm_nt_f8f8bf16" if aligned else "sglang_triton_w8a8_block_fp8"
    return dispatch


def _trtllm(sm: str, group: Group) -> str:
    # TensorRT-LLM's PyTorch-flow Linear, labelled as the reference collector labels it
    # (collector/trtllm/collect_gemm.py:254): torch_flow, and deepgemm for block fp8 on SM100/103
    return "deepgemm" if group.dtype == "fp8_block" and sm in ("100", "103") else "torch_flow"


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
    case_dispatch={"vllm": _vllm_case, "sglang": _sglang_case},
    work=work,
)
