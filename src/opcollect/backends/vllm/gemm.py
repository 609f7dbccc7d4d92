"""GEMM through vLLM 0.24.0's own linear layer: out[m, n] = x[m, k] @ W[n, k]^T, served as a
RowParallelLinear with tensor parallelism off, its quant method and linear kernel chosen by vLLM.

Per dtype (docs/research/vllm-0.24.0-gemm-moe.md §1-4; paths relative to the wheel's vllm/):
- bfloat16: quant_config None -> UnquantizedLinearMethod (model_executor/layers/linear.py:269-274).
- fp8: Fp8Config(serialized, dynamic) -> Fp8LinearMethod, per-token activations, its fp8_linear kernel
  (quantization/fp8.py:312-320, 387-396).
- fp8_block: Fp8Config(serialized, dynamic, [128, 128]) -> the block kernel chosen per shape (fp8.py:301-311).
- int4_wo: GPTQ int4 group 128 as vLLM serves a HF "gptq" checkpoint: AutoGPTQConfig (auto_gptq.py:218-237),
  MPLinear kernel at quant_method.kernel (auto_gptq.py:445).
- nvfp4: ModelOptNvFp4Config("NVFP4", serialized) -> ModelOptNvFp4LinearMethod, kernel at quant_method.kernel
  (modelopt.py:1011-1049, 1123).
The pure builders (gemm_layout, footprint) need no torch; vllm and torch are imported inside prepare.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from math import prod

from opcollect.runtime.contract import KernelLimit, Prepared
from opcollect.runtime.dtypes import ceil_div, tensor_bytes

BLOCK = 128  # fp8_block weight blocks (n, k)
INT4_GROUP = 128  # GPTQ group size along k
INT4_PACK = 8  # int4 values per int32
NVFP4_GROUP = 16  # one fp8 scale per 16 fp4 values along k
PREFIX = "model.layers.0.mlp.down_proj"  # a served layer's name: AutoGPTQConfig quantizes by name (below)
# qzeros: symmetric GPTQ stores the zero 8 as 7 in each nibble; fp8 block scales near a real checkpoint's
CONSTANTS = {
    "qzeros": 0x77777777,
    "weight_scale_inv": 1.0 / 448.0,
    "scales": 0.01,
    "weight_scale": 1.0,
    "input_scale": 1.0,
    "weight_scale_2": 1.0,
}


@dataclass(frozen=True)
class GemmLayout:
    """What one input set holds: the activation, the layer's checkpoint tensors as vLLM creates them (name,
    shape, dtype name) before process_weights_after_loading, and the quant config serving would build."""

    x_shape: tuple[int, int]
    out_shape: tuple[int, int]
    weight: tuple[str, tuple[int, ...], str]
    scales: tuple[tuple[str, tuple[int, ...], str], ...]
    block_size: tuple[int, int] | None
    config_class: str | None  # class name in vllm.model_executor.layers.quantization, None: unquantized
    config_args: tuple[tuple[str, object], ...]
    act_quant_bytes: int  # the quantized activation (and its scales) the kernel writes per call


def gemm_layout(case) -> GemmLayout:
    m, n, k = case.m, case.n, case.k
    dtype = case.gemm_dtype
    common = {"x_shape": (m, k), "out_shape": (m, n), "block_size": None}
    if dtype == "bfloat16":
        # UnquantizedLinearMethod.create_weights: weight [N, K] in params_dtype (linear.py:182-209)
        return GemmLayout(
            **common,
            weight=("weight", (n, k), "bfloat16"),
            scales=(),
            config_class=None,
            config_args=(),
            act_quant_bytes=0,
        )
    if dtype == "fp8":
        # weight fp8 [N, K], weight_scale [len(logical_widths)] fp32 (fp8_utils.py:1246-1305)
        return GemmLayout(
            **common,
            weight=("weight", (n, k), "float8_e4m3fn"),
            scales=(("weight_scale", (1,), "float32"),),
            config_class="Fp8Config",
            config_args=(("is_checkpoint_fp8_serialized", True), ("activation_scheme", "dynamic")),
            act_quant_bytes=m * k + m * 4,  # per-token fp8 activations and one fp32 scale per token
        )
    if dtype == "fp8_block":
        # weight fp8 [N, K], weight_scale_inv fp32 [ceil(N/128), ceil(K/128)] (fp8.py:340-379; fp8_utils.py:1286-1298)
        return GemmLayout(
            x_shape=(m, k),
            out_shape=(m, n),
            weight=("weight", (n, k), "float8_e4m3fn"),
            scales=(("weight_scale_inv", (ceil_div(n, BLOCK), ceil_div(k, BLOCK)), "float32"),),
            block_size=(BLOCK, BLOCK),
            config_class="Fp8Config",
            config_args=(
                ("is_checkpoint_fp8_serialized", True),
                ("activation_scheme", "dynamic"),
                ("weight_block_size", (BLOCK, BLOCK)),
            ),
            act_quant_bytes=m * k + m * ceil_div(k, BLOCK) * 4,  # groups of (1, 128) with fp32 scales
        )
    if dtype == "int4_wo":
        groups = k // INT4_GROUP
        # AutoGPTQLinearMethod.create_weights (auto_gptq.py:367-440): qweight int32 [K/8, N], g_idx int32 [K],
        # scales [K/group, N] in params_dtype, qzeros int32 [K/group, N/8]
        return GemmLayout(
            **common,
            weight=("qweight", (k // INT4_PACK, n), "int32"),
            scales=(
                ("g_idx", (k,), "int32"),
                ("scales", (groups, n), "bfloat16"),
                ("qzeros", (groups, n // INT4_PACK), "int32"),
            ),
            config_class="AutoGPTQConfig",
            config_args=(
                ("weight_bits", 4),
                ("group_size", INT4_GROUP),
                ("desc_act", False),
                ("is_sym", True),
                ("lm_head_quantized", False),
                ("modules_in_block_to_quantize", ("mlp.down_proj",)),
            ),
            act_quant_bytes=0,  # weight-only: bf16 activations go straight in
        )
    if dtype == "nvfp4":
        # ModelOptNvFp4LinearMethod.create_weights (modelopt.py:1139-1199): weight uint8 [N, K/2] (two fp4 a byte),
        # input_scale and weight_scale_2 fp32 [1], weight_scale fp8 [N, K/16]
        return GemmLayout(
            **common,
            weight=("weight", (n, k // 2), "uint8"),
            scales=(
                ("input_scale", (1,), "float32"),
                ("weight_scale_2", (1,), "float32"),
                ("weight_scale", (n, k // NVFP4_GROUP), "float8_e4m3fn"),
            ),
            config_class="ModelOptNvFp4Config",
            config_args=(
                ("quant_method", "NVFP4"),
                ("is_checkpoint_nvfp4_serialized", True),
                ("kv_cache_quant_algo", None),
                ("exclude_modules", ()),
                ("group_size", NVFP4_GROUP),
            ),
            act_quant_bytes=m * k // 2 + m * k // NVFP4_GROUP,  # fp4 activations and their fp8 block scales
        )
    raise KernelLimit(f"the vLLM GEMM runner has no {dtype} path")


def footprint(case) -> int:
    layout = gemm_layout(case)
    activations = (prod(layout.x_shape) + prod(layout.out_shape)) * 2 + layout.act_quant_bytes
    return activations + tensor_bytes((layout.weight, *layout.scales))


def check_shape(case) -> None:
    """Refuse, before allocating, the shapes the layout cannot hold or vLLM's create_weights raises on."""
    if case.gemm_dtype == "int4_wo" and (case.k % INT4_GROUP or case.n % INT4_PACK):
        raise KernelLimit(f"GPTQ int4 needs k % {INT4_GROUP} == 0 and n % {INT4_PACK} == 0 (n={case.n}, k={case.k})")
    if case.gemm_dtype == "nvfp4" and case.k % NVFP4_GROUP:
        # ModelOptNvFp4LinearMethod.create_weights raises for k % 16 (modelopt.py:1149-1152)
        raise KernelLimit(f"NVFP4 needs k % {NVFP4_GROUP} == 0 (k={case.k})")


def quant_config(layout: GemmLayout):
    """The vLLM quant config serving builds from the checkpoint, or None for bf16."""
    if layout.config_class is None:
        return None
    a = {key: list(v) if isinstance(v, tuple) else v for key, v in layout.config_args}
    if layout.config_class == "Fp8Config":
        from vllm.model_executor.layers.quantization.fp8 import Fp8Config

        return Fp8Config(
            is_checkpoint_fp8_serialized=a["is_checkpoint_fp8_serialized"],
            activation_scheme=a["activation_scheme"],
            weight_block_size=a.get("weight_block_size"),
        )
    if layout.config_class == "AutoGPTQConfig":
        from vllm.model_executor.layers.quantization.auto_gptq import AutoGPTQConfig

        return AutoGPTQConfig(
            weight_bits=a["weight_bits"],
            group_size=a["group_size"],
            desc_act=a["desc_act"],
            is_sym=a["is_sym"],
            lm_head_quantized=a["lm_head_quantized"],
            dynamic={},
            full_config={},
            modules_in_block_to_quantize=a["modules_in_block_to_quantize"],
        )
    from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config

    return ModelOptNvFp4Config(
        quant_method=a["quant_method"],
        is_checkpoint_nvfp4_serialized=a["is_checkpoint_nvfp4_serialized"],
        kv_cache_quant_algo=a["kv_cache_quant_algo"],
        exclude_modules=a["exclude_modules"],
        group_size=a["group_size"],
    )


@contextmanager
def _served(config):
    """bf16 as the default dtype, as the model loader sets it (Fp8LinearMethod takes its out_dtype from it,
    fp8.py:284, and DeepGEMM refuses a non-bf16 out), and ``config`` as the current vLLM config."""
    import torch
    from vllm.config import set_current_vllm_config

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with set_current_vllm_config(config, check_compile=False):
            yield
    finally:
        torch.set_default_dtype(previous)


def _fill(layer, layout: GemmLayout, device: str, seed: int) -> None:
    """Checkpoint-like values in the tensors vLLM created: random weights, unit scales."""
    import torch

    from opcollect.runtime.timing import random_tensor

    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, shape, dtype in (layout.weight, *layout.scales):
            param = getattr(layer, name)
            if tuple(param.shape) != shape:
                raise RuntimeError(f"vLLM made {name} {tuple(param.shape)}, the layout says {shape}")
            if dtype in ("int32", "uint8") and name not in ("g_idx", "qzeros"):
                hi = 2**31 - 1 if dtype == "int32" else 256
                param.copy_(torch.randint(0, hi, shape, dtype=param.dtype, device=device, generator=gen))
            elif name == "g_idx":
                param.copy_(torch.arange(shape[0], device=device) // INT4_GROUP)
            elif name in CONSTANTS:
                # copy_ casts, also into fp8 (NVFP4 block scales)
                kind = torch.int64 if name == "qzeros" else torch.float32
                param.copy_(torch.full(shape, CONSTANTS[name], dtype=kind, device=device))
            else:
                param.copy_(random_tensor(shape, param.dtype, device, seed))


def kernel_name(layer, dtype: str, m: int) -> str:
    """The kernel vLLM chose for this layer, read from the objects it built."""
    qm = layer.quant_method
    if dtype == "bfloat16":
        from vllm import envs
        from vllm.model_executor.layers.utils import default_unquantized_gemm, dispatch_unquantized_gemm

        if envs.VLLM_BATCH_INVARIANT:  # UnquantizedLinearMethod.apply (linear.py:223-225)
            return "linear_batch_invariant"
        gemm = dispatch_unquantized_gemm()  # layers/utils.py:332-338; F.linear at utils.py:92-98
        return "torch.nn.functional.linear" if gemm is default_unquantized_gemm else gemm.__name__
    if dtype in ("fp8", "fp8_block"):
        from vllm import envs
        from vllm.model_executor.kernels.linear.scaled_mm.flashinfer import (
            FlashInferFp8DeepGEMMDynamicBlockScaledKernel,
        )

        kernel = qm.fp8_linear
        if isinstance(kernel, FlashInferFp8DeepGEMMDynamicBlockScaledKernel):
            # the SM90 wrapper picks its leaf per call, inside one custom op: DeepGEMM under batch invariance or
            # for M >= 32, else FlashInfer's SM90 block-scale GEMM (kernels/linear/scaled_mm/flashinfer.py:301-316)
            leaf = kernel.fallback if envs.VLLM_BATCH_INVARIANT or m >= 32 else kernel.base
            return type(leaf).__name__
        return type(kernel).__name__
    return type(qm.kernel).__name__  # int4_wo (auto_gptq.py:445), nvfp4 (modelopt.py:1123)


def prepare(case, dispatch: str, device: str, copies: int) -> Prepared:
    check_shape(case)
    layout = gemm_layout(case)
    import torch
    from vllm.model_executor.layers.linear import RowParallelLinear, UnquantizedLinearMethod

    from opcollect.backends.vllm.context import vllm_context
    from opcollect.runtime.timing import random_tensor

    qc = quant_config(layout)
    # serving hands the quant config to VllmConfig, which turns on the CUDA fp8 group-quant op for block fp8
    # (config/vllm.py:1114-1131). The per-tensor QuantFP8 runs as torch.compile'd native code here (custom_ops
    # "none" under O2, config/vllm.py:1135-1155); in a served model inductor may fuse that quant into the
    # preceding op, so here the fp8 rows include a standalone activation-quant kernel: they err high.
    # verified_on: vllm==0.24.0
    with vllm_context(device, quant_config=qc) as config, _served(config), torch.device(device):
        layers = []
        for i in range(copies):
            try:
                layer = RowParallelLinear(
                    input_size=case.k,
                    output_size=case.n,
                    bias=False,
                    params_dtype=torch.bfloat16,
                    quant_config=qc,
                    # AutoGPTQConfig quantizes only layers named in modules_in_block_to_quantize, which serving
                    # reads from the checkpoint (auto_gptq.py maybe_update_config; utils/gptq_utils.py:72-146)
                    prefix=PREFIX,
                    return_bias=False,
                    disable_tp=True,  # one rank's weight is the whole [n, k]: no all-reduce (linear.py:1644-1647)
                )
            except ValueError as err:  # create_weights / kernel choice refuse the shape
                raise KernelLimit(f"vLLM refuses {case.gemm_dtype} n={case.n} k={case.k}: {err}") from err
            if qc is not None and isinstance(layer.quant_method, UnquantizedLinearMethod):
                raise RuntimeError(f"{layout.config_class} left the layer unquantized")
            layer.eval()
            _fill(layer, layout, device, 1000 + i)
            layer.quant_method.process_weights_after_loading(layer)
            layers.append(layer)
        xs = [random_tensor(layout.x_shape, torch.bfloat16, device, i) for i in range(copies)]
        source = kernel_name(layers[0], case.gemm_dtype, case.m)
    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        with _served(config), torch.no_grad():
            layers[i](xs[i])

    return Prepared(call, source)
