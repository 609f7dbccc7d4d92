"""FP8 activation quantization of a bf16 x[m, k], the two parts the consumer adds to a statically quantized GEMM.

compute_scale (computescale_perf): what a dynamic per-token quantization costs beyond a static per-tensor one, i.e.
the scale computation; scale_matrix (scale_matrix_perf): the quantization with a given per-tensor scale. The
reference collector times both in one run per framework (collector/<framework>/collect_computescale.py) and labels
each framework's rows with one kernel_source on every SM it runs (from SM89; plans/skips.py fp8-needs-sm89).
"""

from __future__ import annotations

from itertools import chain, product
from typing import Mapping, NamedTuple

from opcollect.cases.grids import QuantizeGrid
from opcollect.cases.profiles import ModelShapes
from opcollect.plans.base import Group, OpPlan, make_groups
from opcollect.plans.gemm import model_origins
from opcollect.plans.work import Work, format_of


class QuantizeCase(NamedTuple):
    m: int  # tokens
    k: int  # the linear layer's input width
    quant_dtype: str


def _expand(op: str):
    def expand(grid: QuantizeGrid, shapes: Mapping[str, ModelShapes]) -> list[Group]:
        base = {(k,) for k in grid.k}
        origins = model_origins(base, shapes, "quantize")  # static-FP8 models' layer widths (cases/quantization.py)
        widths = sorted(k for (k,) in base | origins.keys())
        # run order: one width at a time, m ascending
        rows = {
            (dtype,): list(chain.from_iterable(product(grid.m, (k,), (dtype,)) for k in widths))
            for dtype in grid.dtypes
        }
        return make_groups(op, QuantizeCase, ("quant_dtype",), rows, origins, ("k",))

    return expand


# The labels each framework's reference rows carry, from the code the reference collector times (its
# collect_computescale.py) and the code serving runs for static per-tensor fp8 activations:
# - vLLM 0.24.0: _custom_ops.scaled_fp8_quant (_custom_ops.py:1885-1951) runs dynamic_per_token_scaled_fp8_quant
#   without a scale (:1939-1944) and static_scaled_fp8_quant with one (:1948-1949); serving's FP8 linear kernels
#   quantize their input through QuantFP8 (kernels/linear/scaled_mm/ScaledMMLinearKernel.py:115-119, :161), whose
#   forward_cuda calls scaled_fp8_quant on every CUDA SM (layers/quantization/input_quant_fp8.py:84-132).
# - SGLang 0.5.14: sgl_kernel's sgl_per_token_quant_fp8 for dynamic activations and static_quant_fp8 for a given
#   scale (srt/layers/quantization/fp8_utils.py:1594-1605, fp8_kernel.py:741-757 and :817-856), on every SM from 89
#   (below it Fp8LinearMethod serves weight-only Marlin, fp8_utils.py:1731-1737); labelled "sglang".
# - TensorRT-LLM 1.3.0rc20: torch.ops.tensorrt_llm.static_quantize_e4m3_per_tensor with the checkpoint's
#   input_scale, quantize_e4m3_per_tensor (a dynamic per-tensor scale) without one: FP8QDQLinearMethod.apply
#   (_torch/modules/linear.py, index copy 3478255898), labelled "torch_ops" (collect_computescale.py).
# - torch: the backend's own scale (amax / 448) and quantization with torch ops (backends/torch/quantize.py).
_COMPUTE_SCALE = {
    "torch": "torch_ops",
    "vllm": "dynamic_per_token_scaled_fp8_quant_minus_static_scaled_fp8_quant",
    "sglang": "sglang",
    "trtllm": "torch_ops",
}
_SCALE_MATRIX = {"torch": "torch_ops", "vllm": "static_scaled_fp8_quant", "sglang": "sglang", "trtllm": "torch_ops"}


def _fixed(name: str):
    def dispatch(sm: str, group: Group) -> str:
        return name

    return dispatch


def _plan(
    op: str, table: str, labels: Mapping[str, str], cost, latency_is_difference: bool = False, work=None
) -> OpPlan:
    return OpPlan(
        name=op,
        family="quantize",
        table=table,
        op_name=op,
        case_type=QuantizeCase,
        dtype_fields=("quant_dtype",),
        expand=_expand(op),
        tp_sizes=lambda grid: tuple(grid.model_tp_sizes),
        dispatch={backend: _fixed(label) for backend, label in labels.items()},
        cost=cost,
        latency_is_difference=latency_is_difference,
        work=work,
    )


# bytes moved: compute_scale reads x twice (the dynamic pass's amax and its quantization), scale_matrix once, and
# each writes an fp8 x. compute_scale's latency is the dynamic quant's median less the static one's, at least 0 (the
# reference's rows are 0.0 where the dynamic quant is no slower)
COMPUTE_SCALE = _plan(
    "compute_scale", "computescale_perf", _COMPUTE_SCALE, lambda c: 5.0 * c.m * c.k, latency_is_difference=True
)


def scale_matrix_work(c: QuantizeCase) -> Work:
    """x [m, k] read once in bf16 and written once at the quant dtype's width; no tensor-core work. compute_scale
    has no bound: its latency is a difference of two timings, and a fused dynamic quant may cost nothing more."""
    return Work({}, c.m * c.k * (2 + format_of(c.quant_dtype).act))


SCALE_MATRIX = _plan(
    "scale_matrix", "scale_matrix_perf", _SCALE_MATRIX, lambda c: 3.0 * c.m * c.k, work=scale_matrix_work
)
