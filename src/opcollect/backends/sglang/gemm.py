"""GEMM through SGLang 0.5.14's own linear layer: out[m, n] = x[m, k] @ W[n, k]^T, served as a ReplicatedLinear
(one rank's whole [n, k], no all-reduce) with the quant method and kernel SGLang chooses.

Per dtype (docs/research/sglang-0.5.14-dispatch.md §1; paths relative to the wheel's sglang/srt/):
- bfloat16: quant_config None -> UnquantizedLinearMethod.apply -> F.linear (layers/quantization/unquant.py:139-162).
- fp8: Fp8Config(serialized, dynamic) -> Fp8LinearMethod; its per-tensor scale becomes per channel when CUTLASS
  fp8 is supported (quantization/fp8.py:712-721), activations are quantized per token and apply_fp8_linear runs
  sgl_kernel.fp8_scaled_mm, or triton_scaled_mm when n or k % 16 (quantization/fp8_utils.py:1604-1638).
- fp8_block: Fp8Config(serialized, dynamic, [128, 128]) -> the function dispatch_w8a8_block_fp8_linear returned
  (fp8.py:354-362, fp8_utils.py:489-499): DeepGEMM with its Triton fallback on SM90/SM100 (fp8_utils.py:712-727).
- int4_wo: GPTQMarlinConfig, as SGLang upgrades a GPTQ int4 checkpoint (gptq/gptq.py:384-390) -> GPTQMarlinLinear
  Kernel -> gptq_marlin_gemm (hardware_backend/gpu/quantization/gptq_kernels.py:229-270).
- nvfp4: ModelOptFp4Config -> ModelOptFp4LinearMethod, run by the FP4 GEMM backend initialize_fp4_gemm_config
  resolved (quantization/fp4_utils.py:149-162): flashinfer_cutedsl on SM100, flashinfer_cutlass on SM120.
The pure builders (gemm_layout, footprint, check_shape) need no torch; sglang and torch are imported in prepare.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from opcollect.runtime.contract import KernelLimit, Prepared
from opcollect.runtime.dtypes import ceil_div, tensor_bytes

BLOCK = 128  # fp8_block weight blocks (n, k)
INT4_GROUP = 128  # GPTQ group size along k
INT4_PACK = 8  # int4 values per int32
MARLIN_TILE = (64, 128)  # Marlin's minimum (n, k) tile: verify_marlin_supports_shape (quantization/marlin_utils.py)
NVFP4_GROUP = 16  # one fp8 scale per 16 fp4 values along k
PREFIX = "model.layers.0.mlp.down_proj"
# checkpoint-like constants: symmetric GPTQ stores the zero 8 as 7 per nibble; fp8 block scales near a real one's
CONSTANTS = {"qzeros": 0x77777777, "weight_scale_inv": 1.0 / 448.0, "scales": 0.01, "weight_scale": 1.0,
             "input_scale": 1.0, "weight_scale_2": 1.0}  # fmt: skip
QUANTIZATION = {"bfloat16": None, "fp8": "fp8", "fp8_block": "fp8", "int4_wo": "gptq_marlin", "nvfp4": "modelopt_fp4"}


@dataclass(frozen=True)
class GemmLayout:
    """One input set: the activation, the checkpoint tensors SGLang's create_weights registers (name, shape, dtype
    name) before process_weights_after_loading, and the quantization serving would name."""

    x_shape: tuple[int, int]
    out_shape: tuple[int, int]
    weight: tuple[str, tuple[int, ...], str]
    scales: tuple[tuple[str, tuple[int, ...], str], ...]
    block_size: tuple[int, int] | None
    quantization: str | None  # the --quantization SGLang would resolve for the checkpoint
    act_quant_bytes: int  # the quantized activation (and its scales) the kernel writes per call


def gemm_layout(case) -> GemmLayout:
    m, n, k, dtype = case.m, case.n, case.k, case.gemm_dtype
    if dtype not in QUANTIZATION:
        raise KernelLimit(f"the SGLang GEMM runner has no {dtype} path")
    common = {"x_shape": (m, k), "out_shape": (m, n), "quantization": QUANTIZATION[dtype], "block_size": None}
    if dtype == "bfloat16":  # UnquantizedLinearMethod.create_weights: weight [N, K] (unquant.py:113-133)
        return GemmLayout(**common, weight=("weight", (n, k), "bfloat16"), scales=(), act_quant_bytes=0)
    if dtype == "fp8":  # Fp8LinearMethod.create_weights: weight [N, K], weight_scale [1 shard] (fp8.py:438-485)
        scales = (("weight_scale", (1,), "float32"),)
        # per-token fp8 activations and one fp32 scale per token (fp8_utils.py:1604-1605)
        return GemmLayout(**common, weight=("weight", (n, k), "float8_e4m3fn"), scales=scales,
                          act_quant_bytes=m * k + m * 4)  # fmt: skip
    if dtype == "fp8_block":  # weight_scale_inv [ceil(N/128), ceil(K/128)] (fp8.py:462-480)
        common["block_size"] = (BLOCK, BLOCK)
        scales = (("weight_scale_inv", (ceil_div(n, BLOCK), ceil_div(k, BLOCK)), "float32"),)
        # activations in (1, 128) groups, one fp32 scale each (sglang_per_token_group_quant_fp8)
        return GemmLayout(**common, weight=("weight", (n, k), "float8_e4m3fn"), scales=scales,
                          act_quant_bytes=m * k + m * ceil_div(k, BLOCK) * 4)  # fmt: skip
    if dtype == "int4_wo":
        groups = k // INT4_GROUP
        # GPTQMarlinLinearScheme.create_weights (gptq/schemes/gptq_marlin.py:88-150): qweight int32 [K/8, N],
        # g_idx int32 [K], scales [K/group, N] in params_dtype, qzeros int32 [K/group, N/8]
        scales = (("g_idx", (k,), "int32"), ("scales", (groups, n), "bfloat16"),
                  ("qzeros", (groups, n // INT4_PACK), "int32"))  # fmt: skip
        return GemmLayout(**common, weight=("qweight", (k // INT4_PACK, n), "int32"), scales=scales, act_quant_bytes=0)
    # nvfp4: ModelOptFp4LinearMethod.create_weights (modelopt_quant.py:1415-1490): weight uint8 [N, K/2],
    # input_scale and weight_scale_2 fp32 [1], weight_scale fp8 [N, K/16]
    scales = (("input_scale", (1,), "float32"), ("weight_scale_2", (1,), "float32"),
              ("weight_scale", (n, k // NVFP4_GROUP), "float8_e4m3fn"))  # fmt: skip
    # fp4 activations and their fp8 block scales
    return GemmLayout(**common, weight=("weight", (n, k // 2), "uint8"), scales=scales,
                      act_quant_bytes=m * k // 2 + m * k // NVFP4_GROUP)  # fmt: skip


def footprint(case) -> int:
    layout = gemm_layout(case)
    activations = (prod(layout.x_shape) + prod(layout.out_shape)) * 2 + layout.act_quant_bytes
    return activations + tensor_bytes((layout.weight, *layout.scales))


def check_shape(case) -> None:
    """Refuse, before importing SGLang, the shapes its create_weights / Marlin checks raise on."""
    gemm_layout(case)  # unknown dtypes
    n, k = case.n, case.k
    if case.gemm_dtype == "int4_wo" and (k % INT4_GROUP or n % MARLIN_TILE[0] or k % MARLIN_TILE[1]):
        raise KernelLimit(f"GPTQ Marlin int4 needs n % 64 == 0 and k % 128 == 0 (n={n}, k={k})")
    if case.gemm_dtype == "nvfp4" and k % NVFP4_GROUP:  # ModelOptFp4LinearMethod.create_weights raises
        raise KernelLimit(f"NVFP4 needs k % {NVFP4_GROUP} == 0 (k={k})")


def quant_config(layout: GemmLayout):
    """The SGLang quant config serving builds from the checkpoint, or None for bf16."""
    if layout.quantization is None:
        return None
    if layout.quantization == "fp8":
        from sglang.srt.layers.quantization.fp8 import Fp8Config

        block = list(layout.block_size) if layout.block_size else None
        return Fp8Config(is_checkpoint_fp8_serialized=True, activation_scheme="dynamic", weight_block_size=block)
    if layout.quantization == "gptq_marlin":
        from sglang.srt.layers.quantization.gptq import GPTQMarlinConfig

        return GPTQMarlinConfig(weight_bits=4, group_size=INT4_GROUP, desc_act=False, is_sym=True,
                                lm_head_quantized=False, dynamic={}, full_config={})  # fmt: skip
    from sglang.srt.layers.quantization.modelopt_quant import ModelOptFp4Config

    return ModelOptFp4Config(is_checkpoint_nvfp4_serialized=True, group_size=NVFP4_GROUP, exclude_modules=[])


def _fill(layer, layout: GemmLayout, device: str, seed: int) -> None:
    """Checkpoint-like values in the tensors SGLang created (it leaves scales at float32 min): random weights and
    packed bits, constant scales."""
    import torch

    from opcollect.runtime.timing import random_tensor

    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, shape, dtype in (layout.weight, *layout.scales):
            param = getattr(layer, name)
            if tuple(param.shape) != shape:
                raise RuntimeError(f"SGLang made {name} {tuple(param.shape)}, the layout says {shape}")
            if dtype in ("int32", "uint8") and name not in ("g_idx", "qzeros"):
                hi = 2**31 - 1 if dtype == "int32" else 256
                param.copy_(torch.randint(0, hi, shape, dtype=param.dtype, device=device, generator=gen))
            elif name == "g_idx":
                param.copy_(torch.arange(shape[0], device=device) // INT4_GROUP)
            elif name in CONSTANTS:  # copy_ casts, also into fp8 (NVFP4 block scales)
                kind = torch.int64 if name == "qzeros" else torch.float32
                param.copy_(torch.full(shape, CONSTANTS[name], dtype=kind, device=device))
            else:
                param.copy_(random_tensor(shape, param.dtype, device, seed))


def kernel_name(layer, dtype: str) -> str:
    """The kernel SGLang runs for this layer, read from the method it built and the predicates its apply uses."""
    qm = layer.quant_method
    if dtype == "bfloat16":
        from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

        # F.linear unless the CPU AMX or ROCm aiter branch (unquant.py:145-162), which CUDA never takes
        return "sglang_torch_linear" if type(qm) is UnquantizedLinearMethod else f"sglang_{type(qm).__name__}"
    if dtype in ("fp8", "fp8_block"):
        from sglang.srt.layers.quantization import fp8_utils

        if qm.use_marlin:  # SM < 89 runs weight-only fp8 Marlin (fp8.py:343-349, 818-827)
            return "sglang_fp8_marlin"
        if dtype == "fp8":
            w, s = layer.weight, layer.weight_scale  # weight is [K, N] after loading (fp8.py:756)
            if qm.cutlass_fp8_supported and s.numel() == w.shape[1]:  # apply_fp8_linear (fp8_utils.py:1621-1638)
                fits = w.shape[0] % 16 == 0 and w.shape[1] % 16 == 0 and not fp8_utils.use_triton_w8a8_fp8_kernel
                return "sglang_sgl_kernel_fp8_scaled_mm" if fits else "sglang_triton_scaled_mm"
            return "sglang_torch_scaled_mm"
        fn = qm.w8a8_block_fp8_linear
        if fn is fp8_utils.deepgemm_w8a8_block_fp8_linear_with_fallback:
            # the shape predicate of the fallback itself (fp8_utils.py:712-727); weight is [N, K], output bf16
            w = layer.weight
            deepgemm = w.shape[0] % 64 == 0 and w.shape[1] % 128 == 0
            return "sglang_deepgemm_gemm_nt_f8f8bf16" if deepgemm else "sglang_triton_w8a8_block_fp8"
        if fn is fp8_utils.triton_w8a8_block_fp8_linear:
            return "sglang_triton_w8a8_block_fp8"
        return f"sglang_{fn.__name__}"
    if dtype == "int4_wo":
        kernel = type(layer.scheme.kernel).__name__  # GPTQMarlinLinearScheme.kernel (gptq_marlin.py:30-44)
        return "sglang_gptq_marlin_gemm" if kernel == "GPTQMarlinLinearKernel" else f"sglang_{kernel}"
    from sglang.srt.layers.quantization.fp4_utils import get_fp4_gemm_runner_backend

    # ModelOptFp4LinearMethod.apply reads the resolved FP4 GEMM backend per call (modelopt_quant.py:1660-1720)
    return f"sglang_{get_fp4_gemm_runner_backend().value}_nvfp4"


def prepare(case, dispatch: str, device: str, copies: int) -> Prepared:
    check_shape(case)
    layout = gemm_layout(case)
    import torch
    from sglang.srt.layers.linear import ReplicatedLinear
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

    from opcollect.backends.sglang.context import sglang_context
    from opcollect.runtime.timing import random_tensor

    args = {"quantization": layout.quantization}
    # the fp8 activation quant runs as its own kernel (sglang_per_token_quant_fp8 / per-token-group quant), as in
    # eager serving; under the piecewise inductor graph SGLang may fuse a static quant into the preceding op
    # (fp8_utils.py:1575-1590), so against such serving the fp8 rows here err high by one small kernel.
    # verified_on: sglang==0.5.14
    with sglang_context(device, **args), torch.device(device):
        qc = quant_config(layout)
        layers = []
        for i in range(copies):
            try:
                layer = ReplicatedLinear(input_size=case.k, output_size=case.n, bias=False,
                                         params_dtype=torch.bfloat16, quant_config=qc, prefix=PREFIX)  # fmt: skip
            except ValueError as err:  # create_weights / Marlin refuse the shape
                raise KernelLimit(f"SGLang refuses {case.gemm_dtype} n={case.n} k={case.k}: {err}") from err
            if qc is not None and isinstance(layer.quant_method, UnquantizedLinearMethod):
                raise RuntimeError(f"{layout.quantization} left the layer unquantized")
            layer.eval()
            _fill(layer, layout, device, 1000 + i)
            layer.quant_method.process_weights_after_loading(layer)
            layers.append(layer)
        xs = [random_tensor(layout.x_shape, torch.bfloat16, device, i) for i in range(copies)]
        source = kernel_name(layers[0], case.gemm_dtype)
    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        with sglang_context(device, **args), torch.no_grad():
            layers[i](xs[i])

    return Prepared(call, source)
