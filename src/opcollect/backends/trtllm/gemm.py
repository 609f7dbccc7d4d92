"""GEMM through TensorRT-LLM 1.3's own Linear: out[m, n] = x[m, k] @ W[n, k]^T, one rank's whole layer (no tensor
parallelism, no all-reduce), run by the quant method TensorRT-LLM picks for the checkpoint's QuantConfig.

Per dtype (tensorrt_llm/_torch/modules/linear.py @00bbf71e; get_quant_method at :2508-2539; the QuantConfig is
context.quant_config's, as the reference collector builds it, collector/trtllm/collect_gemm.py:163-174):
- bfloat16: no quantization -> UnquantizedLinearMethod: F.linear (:446, :472-485).
- fp8: QuantAlgo.FP8 -> FP8QDQLinearMethod: per-tensor fp8 activations, then cublas_scaled_mm (cuda_scaled_mm for
  m <= 8 on SM89/SM120 only, :636-658, :2655-2661). The checkpoint carries no input_scale, so the activation scale
  is computed per call (process_weights_after_loading_vanilla, :719-724; quantize_e4m3_per_tensor, :623-627), as
  the reference loads it (collect_gemm.py:198-201); a served checkpoint with a static input_scale skips that amax
  reduction, so fp8 rows err high by it. verified_on: trtllm==1.3.0rc23
- fp8_block: FP8_BLOCK_SCALES, 128 x 128 -> FP8BlockScalesLinearMethod: DeepGEMM fp8_swap_ab_gemm when
  is_sm_100f() and neither CuTe DSL nor disable_deep_gemm, fp8_quantize_1x128 + fp8_block_scaling_gemm elsewhere
  (:1084-1124); post_load_weights resmooths weight and scales to UE8M0 for DeepGEMM (:1233-1252).
- nvfp4: NVFP4 -> NVFP4LinearMethod: static per-tensor input scale, fp4_quantize, nvfp4_gemm over the allowed
  backends cutlass / cublaslt / cuda_core (:1255-1405, :2595-2603); post_load_weights pads the weight to rows of 32
  and columns of 16 bytes (:1620-1660).
- int4_wo: W4A16_AWQ, group 128 -> W4A16_AWQ_LinearMethod: x * pre_quant_scale, then
  finegrained_mixed_dtype_gemm (:2087-2131). Its vanilla load path reads pre_quant_scale unconditionally
  (:2163-2187), so these rows time the o_proj / down_proj layers that keep it; fused QKV / gate-up layers have it
  folded into the norm and skip one elementwise multiply (they err low by nothing, these err high by it there).
  Above FinegrainedMixedDtypeGemm.MAX_SUPPORTED_SM_VERSION, read from the installed class, the case is refused as
  a kernel limit before anything is built (check_mixed_gemm_sm). verified_on: trtllm==1.3.0rc23
Every linear is finished as serving's model loader finishes it: load_weights, whose vanilla path runs
process_weights_after_loading (:352-373), then post_load_weights on every module (pyexecutor/model_loader.py
@004b733e, ModelLoader.load). The reference collector runs no autotuner for its GEMMs, nor does this runner:
TensorRT-LLM's tunable ops (nvfp4_gemm, finegrained_mixed_dtype_gemm) take their default tactic, where serving's
warm-up would tune them. verified_on: trtllm==1.3.0rc23
The pure builders (gemm_layout, footprint, check_shape, kernel_label) need no torch; torch and tensorrt_llm are
imported inside prepare.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from opcollect.backends.trtllm.context import SERVED_VERSIONS
from opcollect.runtime.contract import KernelLimit, Prepared, Runner
from opcollect.runtime.dtypes import ceil_div, tensor_bytes

BLOCK = 128  # fp8_block weight blocks (n, k): FP8BlockScalesLinearMethod.create_weights (linear.py:1064-1065)
AWQ_GROUP = 128  # context.GROUP_SIZES["int4_wo"]: int4 scales per 128 values of k
NVFP4_GROUP = 16  # NVFP4LinearMethod: scaling_vector_size (linear.py:1265)
INT32_ELEMENTS = 2**31  # the first element count a kernel's int32 offsets cannot reach
# the quant method class TensorRT-LLM's get_quant_method returns for each dtype's QuantConfig (linear.py:2508-2539)
QUANT_METHODS = {
    "bfloat16": "UnquantizedLinearMethod",
    "fp8": "FP8QDQLinearMethod",
    "fp8_block": "FP8BlockScalesLinearMethod",
    "nvfp4": "NVFP4LinearMethod",
    "int4_wo": "W4A16_AWQ_LinearMethod",
}
# checkpoint-like constants: unit scales, block fp8 scales near a real one's (amax / 448), small AWQ group scales
CONSTANTS = {"weight_scale": 1.0, "input_scale": 1.0, "weight_scale_2": 1.0, "pre_quant_scale": 1.0}
BLOCK_SCALE = 1.0 / 448.0
AWQ_SCALE = 0.01

Spec = tuple[str, tuple[int, ...], str]  # (name, shape, dtype name)


def pad_up(x: int, to: int) -> int:
    return ceil_div(x, to) * to


@dataclass(frozen=True)
class GemmLayout:
    """One input set: the activation, the checkpoint tensors handed to Linear.load_weights (names, shapes and
    dtypes its quant method's load path reads) and the parameters the linear holds once loaded."""

    x_shape: tuple[int, int]
    out_shape: tuple[int, int]
    checkpoint: tuple[Spec, ...]
    params: tuple[Spec, ...]
    act_quant_bytes: int  # what the quant method writes per call besides the output: quantized x and its scales
    quant_method: str  # the class TensorRT-LLM must build for this dtype


def gemm_layout(case) -> GemmLayout:
    m, n, k = case.m, case.n, case.k
    dtype = case.gemm_dtype
    if dtype not in QUANT_METHODS:
        raise KernelLimit(f"the TensorRT-LLM GEMM runner has no {dtype} path")
    common = {"x_shape": (m, k), "out_shape": (m, n), "quant_method": QUANT_METHODS[dtype]}
    if dtype == "bfloat16":
        # UnquantizedLinearMethod.create_weights: weight [n, k] in the linear's dtype (linear.py:448-453)
        weight = ("weight", (n, k), "bfloat16")
        return GemmLayout(**common, checkpoint=(weight,), params=(weight,), act_quant_bytes=0)
    if dtype == "fp8":
        # FP8QDQLinearMethod.create_weights: fp8 weight [n, k], scalar fp32 scales, kv scales of 3 (:578-603);
        # load_weight_scales reshapes the checkpoint's weight_scale to a scalar (:686-717)
        weight = ("weight", (n, k), "float8_e4m3fn")
        scalars = tuple((name, (), "float32") for name in ("weight_scale", "input_scale", "inv_input_scale"))
        kv = (("kv_scales", (3,), "float32"), ("inv_kv_scales", (3,), "float32"))
        return GemmLayout(
            **common,
            checkpoint=(weight, ("weight_scale", (1,), "float32")),
            params=(weight, *scalars, *kv),
            act_quant_bytes=m * k + 4,  # fp8 activations and their one fp32 scale
        )
    if dtype == "fp8_block":
        # FP8BlockScalesLinearMethod.create_weights: fp8 weight [n, k], fp32 weight_scale [ceil(n/128), ceil(k/128)]
        # (:1057-1082); the load path reads weight_scale_inv or weight_scale (:1128-1152)
        weight = ("weight", (n, k), "float8_e4m3fn")
        scale = ("weight_scale", (ceil_div(n, BLOCK), ceil_div(k, BLOCK)), "float32")
        scalars = tuple((name, (), "float32") for name in ("input_scale", "inv_input_scale"))
        return GemmLayout(
            **common,
            checkpoint=(weight, scale),
            params=(weight, scale, *scalars),
            # fp8 activations in groups of (1, 128) with fp32 scales, rows padded to 4 (fp8_quantize_1x128)
            act_quant_bytes=m * k + pad_up(m, 4) * ceil_div(k, BLOCK) * 4,
        )
    if dtype == "nvfp4":
        # NVFP4LinearMethod.create_weights: weight [n, k/2] (two e2m1 a byte), swizzled fp8 block scales
        # [pad(n, 128) * pad(k/16, 4)], fp32 [1] input_scale / inv_input_scale / alpha / weight_scale_2, kv scales
        # (:1263-1312). post_load_weights pads the weight to (pad(n, 32), pad(k/2, 16)) and its scales to match
        # (:1620-1660): the params are counted at the padded size.
        rows, cols = pad_up(n, 32), pad_up(k // 2, 16)
        params = (
            ("weight", (rows, cols), "uint8"),
            ("weight_scale", (pad_up(rows, 128) * pad_up(cols * 2 // NVFP4_GROUP, 4),), "uint8"),
            *((name, (1,), "float32") for name in ("input_scale", "inv_input_scale", "alpha", "weight_scale_2")),
            ("kv_scales", (3,), "float32"),
            ("inv_kv_scales", (3,), "float32"),
        )
        # load_weight_scales asserts fp8 block scales; the reference hands them unswizzled at the padded size
        # block_scale_interleave takes (collect_gemm.py:80-96); input_scale / weight_scale_2 as amax ratios
        checkpoint = (
            ("weight", (n, k // 2), "uint8"),
            ("weight_scale", (pad_up(n, 128), pad_up(k // NVFP4_GROUP, 4)), "float8_e4m3fn"),
            ("weight_scale_2", (1,), "float32"),
            ("input_scale", (1,), "float32"),
        )
        sliced = m * n * 2 if rows != n else 0  # a padded output is sliced and copied (:1400-1401)
        act = m * k // 2 + pad_up(m, 128) * pad_up(k // NVFP4_GROUP, 4) + sliced  # fp4 x and its swizzled scales
        return GemmLayout(**common, checkpoint=checkpoint, params=params, act_quant_bytes=act)
    # int4_wo: W4A16_AWQ_LinearMethod.create_weights: int8 weight [k, n/2] (two int4 a byte), weight_scale
    # [k/128, n] in the linear's dtype (:2089-2116); load_weights_vanilla reads weight [n/2, k] (transposed and
    # preprocessed for the mixed GEMM on the CPU, load_weights_vanilla_helper :193-200), weight_scale [n, k/128]
    # (transposed, :2181-2187) and pre_quant_scale [k] (:2168-2178)
    groups = k // AWQ_GROUP
    pre = ("pre_quant_scale", (k,), "bfloat16")
    return GemmLayout(
        **common,
        checkpoint=(("weight", (n // 2, k), "int8"), ("weight_scale", (n, groups), "bfloat16"), pre),
        params=(("weight", (k, n // 2), "int8"), ("weight_scale", (groups, n), "bfloat16"), pre),
        act_quant_bytes=m * k * 2,  # x * pre_quant_scale (:2121-2122)
    )


def footprint(case) -> int:
    """Bytes of one input set: activation, output, the quant method's per-call buffers, the linear's parameters
    and the checkpoint tensors alive while they load."""
    layout = gemm_layout(case)
    activations = (prod(layout.x_shape) + prod(layout.out_shape)) * 2 + layout.act_quant_bytes
    return activations + tensor_bytes(layout.params) + tensor_bytes(layout.checkpoint)


def check_shape(case) -> None:
    """Refuse, before allocating, the shapes TensorRT-LLM's create_weights refuses."""
    if case.gemm_dtype == "int4_wo" and (case.k % AWQ_GROUP or case.n % 2):
        # W4A16_AWQ_LinearMethod.create_weights raises ValueError for k % group_size (linear.py:2099-2103); two
        # int4 values per byte along n
        raise KernelLimit(f"W4A16 AWQ needs k % {AWQ_GROUP} == 0 and an even n (n={case.n}, k={case.k})")
    if case.gemm_dtype == "nvfp4" and case.k % NVFP4_GROUP:
        # NVFP4LinearMethod.create_weights asserts in_features % 16 == 0 (linear.py:1265-1266)
        raise KernelLimit(f"NVFP4 needs k % {NVFP4_GROUP} == 0 (k={case.k})")
    # 32-bit element offsets: an activation or output of 2^31 elements and more, or a block-fp8 weight of that many,
    # overflows the kernels' int32 indexing into an illegal memory access that kills the worker; the reference
    # collector leaves these shapes out for TensorRT-LLM (collector/trtllm/collect_gemm.py:135-140)
    if case.m * case.n >= INT32_ELEMENTS or case.m * case.k >= INT32_ELEMENTS:
        raise KernelLimit(f"m*n or m*k reaches 2^31 elements (m={case.m}, n={case.n}, k={case.k}): int32 offsets")
    if case.gemm_dtype == "fp8_block" and case.n * case.k >= INT32_ELEMENTS:
        raise KernelLimit(f"a block-fp8 weight of n*k >= 2^31 elements (n={case.n}, k={case.k}): int32 offsets")


def check_mixed_gemm_sm(sm: int, max_sm: int) -> None:
    """Refuse int4_wo where TensorRT-LLM's W4A16 kernel refuses the SM: FinegrainedMixedDtypeGemm.forward raises
    ValueError when get_sm_version() > its MAX_SUPPORTED_SM_VERSION (_torch/custom_ops/torch_custom_ops.py, index id
    3493221792). The limit moved across the copies read (90 in some, 103 in others), so prepare reads it from the
    installed class at run time rather than from a table here."""
    if sm > max_sm:
        raise KernelLimit(
            f"TensorRT-LLM's W4A16 GEMM (FinegrainedMixedDtypeGemm) runs up to SM{max_sm}, this GPU is SM{sm}"
        )


def kernel_label(dtype: str, quant_method: str, sm_100f: bool, deep_gemm: bool) -> str:
    """The reference's kernel_source for what TensorRT-LLM built (collect_gemm.py:248-254): deepgemm where block fp8
    runs DeepGEMM (is_sm_100f() and DeepGEMM not turned off, linear.py:1096-1109), torch_flow for every other
    path. A quant method other than the one the dtype implies is an error, not a label."""
    expected = QUANT_METHODS[dtype]
    if quant_method != expected:
        raise RuntimeError(f"TensorRT-LLM built {quant_method} for a {dtype} GEMM, not {expected}")
    return "deepgemm" if dtype == "fp8_block" and sm_100f and deep_gemm else "torch_flow"


def _checkpoint(layout: GemmLayout, linear, device: str, seed: int) -> dict:
    """The checkpoint dict of one layer: random weights, checkpoint-like scales."""
    import torch

    from opcollect.runtime.timing import random_tensor

    gen = torch.Generator(device=device).manual_seed(seed)
    tensors = {}
    for name, shape, dtype in layout.checkpoint:
        kind = getattr(torch, dtype)
        if name == "weight" and dtype in ("uint8", "int8"):
            # packed e2m1 pairs (every byte is a valid pair) or int4 pairs; fp4 as the dtype the linear holds it in
            low, high = (0, 256) if dtype == "uint8" else (-128, 128)
            raw = torch.randint(low, high, shape, dtype=kind, device=device, generator=gen)
            tensors[name] = raw.view(linear.weight.dtype) if dtype == "uint8" else raw
        elif name == "weight":
            tensors[name] = random_tensor(shape, kind, device, seed)
        else:
            value = BLOCK_SCALE if layout.quant_method == "FP8BlockScalesLinearMethod" else CONSTANTS[name]
            if name == "weight_scale" and layout.quant_method == "W4A16_AWQ_LinearMethod":
                value = AWQ_SCALE
            # full in fp32, then cast: also into fp8 (the NVFP4 block scales)
            tensors[name] = torch.full(shape, value, dtype=torch.float32, device=device).to(kind)
    return tensors


def _deep_gemm(linear) -> bool:
    """Whether FP8BlockScalesLinearMethod may take DeepGEMM on this linear (linear.py:1097, :1235-1236)."""
    return not (getattr(linear, "use_cute_dsl_blockscaling_mm", False) or getattr(linear, "disable_deep_gemm", False))


def prepare(case, dispatch: str, device: str, copies: int) -> Prepared:
    check_shape(case)
    layout = gemm_layout(case)
    import torch
    from tensorrt_llm._torch.modules.linear import Linear
    from tensorrt_llm._utils import get_sm_version, is_sm_100f

    if case.gemm_dtype == "int4_wo":  # before any weight is built: the kernel's SM limit, read from the installed class
        from tensorrt_llm._torch.custom_ops.torch_custom_ops import FinegrainedMixedDtypeGemm

        check_mixed_gemm_sm(get_sm_version(), FinegrainedMixedDtypeGemm.MAX_SUPPORTED_SM_VERSION)

    from opcollect.backends.trtllm.context import quant_config
    from opcollect.runtime.timing import random_tensor

    qc = quant_config(case.gemm_dtype)
    linears = []
    for i in range(copies):
        try:
            # create_weights allocates on the default device (the reference sets it, collect_gemm.py:157); the load
            # paths place their tensors themselves (on "cuda", and on the CPU for the int4 preprocessing), as
            # serving loads outside any default-device scope
            with torch.device(device):
                linear = Linear(
                    in_features=case.k,
                    out_features=case.n,
                    bias=False,
                    dtype=torch.bfloat16,
                    quant_config=qc,
                    force_dynamic_quantization=False,  # serving's default (llm_args), as the reference passes it
                )
        except (ValueError, AssertionError) as err:  # create_weights refuses the shape
            raise KernelLimit(f"TensorRT-LLM refuses {case.gemm_dtype} n={case.n} k={case.k}: {err}") from err
        linear.load_weights([_checkpoint(layout, linear, device, 1000 + i)])
        linear.post_load_weights()
        linears.append(linear)
    xs = [random_tensor(layout.x_shape, torch.bfloat16, device, i) for i in range(copies)]
    method = type(linears[0].quant_method).__name__
    source = kernel_label(case.gemm_dtype, method, bool(is_sm_100f()), _deep_gemm(linears[0]))
    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        with torch.inference_mode():  # serving's forward runs under inference mode
            linears[i].forward(xs[i])

    return Prepared(call, source)


RUNNERS = {"gemm": (Runner(footprint, prepare, versions=SERVED_VERSIONS),)}
