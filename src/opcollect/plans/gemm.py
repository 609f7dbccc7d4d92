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
    return {
        "fp8": "CutlassFP8ScaledMMLinearKernel",
        "fp8_block": "W8A8BlockFp8LinearOp",
        "nvfp4": "cutlass_scaled_fp4_mm",
        "int4_wo": "MarlinLinearKernel",
    }.get(group.dtype, "torch.nn.functional.linear")


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
)
