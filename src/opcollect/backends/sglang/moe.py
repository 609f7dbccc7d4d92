"""A MoE layer's experts on one rank through SGLang 0.5.14's FusedMoE, with the runner backend SGLang selects per
quant mode and model (docs/research/sglang-0.5.14-dispatch.md §3; paths relative to the wheel's sglang/srt/).

Quant config per moe_dtype, as serving loads the checkpoint: bfloat16 None (UnquantizedFusedMoEMethod); fp8 and
fp8_block Fp8Config (quantization/fp8.py:147-200); int4_wo compressed-tensors pack-quantized int4, served by
CompressedTensorsWNA16MoE with MARLIN hard-coded (compressed_tensors/compressed_tensors.py:676-698,
schemes/compressed_tensors_wNa16_moe.py:412-416); w4a16_mxfp4 Mxfp4Config (quantization/mxfp4.py:243-249);
nvfp4 ModelOptFp4Config. The runner backend is the one the plan row's dispatch names, which the plan reads from
SGLang's own ServerArgs per model and SM (server_backend below; runner_backend's hand rules where the dispatch names
no runner), installed through sglang_context; the label comes from the backend the built layer's runner holds.
The layer is one real EP rank, as serving builds it: FusedMoE is given the global expert count and inter size and
reads moe_ep_size / moe_tp_size / rank 0 from get_parallel() (fused_moe_triton/layer.py:197-217), so it holds E/ep
experts at inter/tp, the standard dispatcher maps other ranks' experts to -1 (token_dispatcher/standard.py:168-208)
and the Triton runner filters them (moe_runner/triton.py:124-127). Routing: SGLang's TopK over router logits that
pick the case's distribution as the torch backend draws it (moe_routing.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from opcollect.names import SGLANG_MOE_LABELS
from opcollect.runtime.contract import KernelLimit, Prepared

BLOCK = 128
INT4_GROUP = 32  # Kimi-K2.5's int4 experts (the reference int4_wo shape) are group 32 (server_args.py:3683-3737)
MXFP4_BLOCK = 32
NVFP4_GROUP = 16
GPT_OSS = (2880, 2880)
KIMI_K3_EXPERTS = 896
DEEPSEEK_HIDDEN = 7168  # DeepSeek-V3 / Kimi-K2.5 experts: forced to flashinfer_trtllm on SM100
NEMOTRON_H = {(2688, 1856, 128, 6), (2048, 5120, 512, 22), (8192, 5120, 512, 22)}  # (hidden, inter, E, topk)
# bits per weight element and bytes of scale per element, per dtype (the packed layouts' storage)
STORAGE = {"bfloat16": (16, 0.0), "fp8": (8, 0.0), "fp8_block": (8, 4 / BLOCK**2), "int4_wo": (4, 2 / INT4_GROUP),
           "w4a16_mxfp4": (4, 1 / MXFP4_BLOCK), "nvfp4": (4, 1 / NVFP4_GROUP)}  # fmt: skip
LABELS = SGLANG_MOE_LABELS


@dataclass(frozen=True)
class MoeLayout:
    local_experts: int  # E / ep: rank 0's experts, linear placement
    local_inter: int  # inter / tp
    hidden: int
    tokens: int
    topk: int
    weight_bytes: int  # w13 [E, 2I, H] and w2 [E, H, I] with their scales, at the dtype's storage
    activation: str = "silu"
    is_gated: bool = True
    with_bias: bool = False
    gemm1_alpha: float | None = None
    gemm1_clamp_limit: float | None = None


def moe_layout(case) -> MoeLayout:
    dtype, tp, ep = case.moe_dtype, case.moe_tp_size, case.moe_ep_size
    if dtype not in STORAGE:
        raise KernelLimit(f"the SGLang MoE runner has no {dtype} path")
    if case.num_experts % ep or case.inter_size % tp:
        raise KernelLimit(f"E={case.num_experts} / ep={ep} or inter={case.inter_size} / tp={tp} is not whole")
    experts, inter, hidden = case.num_experts // ep, case.inter_size // tp, case.hidden_size
    if dtype == "fp8_block" and inter % BLOCK:  # Fp8MoEMethod.create_weights raises (fp8.py block branch)
        raise KernelLimit(f"block fp8 experts need the per-rank inter size % {BLOCK} == 0 (got {inter})")
    if dtype in ("int4_wo", "nvfp4", "w4a16_mxfp4") and (hidden % MXFP4_BLOCK or inter % MXFP4_BLOCK):
        raise KernelLimit(f"{dtype} experts need hidden and per-rank inter % 32 == 0 ({hidden}, {inter})")
    bits, scale = STORAGE[dtype]
    elements = experts * 3 * inter * hidden  # w13 (gate and up) and w2
    more = {}
    if _nemotron_h(case) and dtype == "bfloat16":  # NemotronH experts: ReLU2, not gated (nemotron_h.py)
        more, elements = {"activation": "relu2", "is_gated": False}, experts * 2 * inter * hidden
    if dtype == "w4a16_mxfp4" and (hidden, case.inter_size) == GPT_OSS:
        # gpt-oss experts: biases, clamped SwiGLU (models/gpt_oss.py:206-238)
        more = {"with_bias": True, "gemm1_alpha": 1.702, "gemm1_clamp_limit": 7.0}
    bias = experts * (2 * inter + hidden) * 2 if more.get("with_bias") else 0
    weight_bytes = int(elements * bits // 8 + elements * scale) + bias
    return MoeLayout(experts, inter, hidden, case.num_tokens, case.topk, weight_bytes, **more)


def _nemotron_h(case) -> bool:
    return (case.hidden_size, case.inter_size, case.num_experts, case.topk) in NEMOTRON_H


def footprint(case) -> int:
    layout = moe_layout(case)
    routed = layout.tokens * layout.topk
    # hidden states, output; per routed pair the gate_up and activation intermediates; top-k ids and weights
    activations = (2 * layout.tokens * layout.hidden + routed * (layout.hidden + 3 * layout.local_inter)) * 2
    return layout.weight_bytes + activations + routed * 8 + layout.tokens * case.num_experts * 4


def runner_backend(case, sm_major: int, triton_kernels: bool = False, quantization: str | None = None) -> str:
    """The --moe-runner-backend server_args would leave for this model (the runner reads it at layer build).
    ``quantization`` is the launch's --quantization: None for the checkpoints here, whose own quantization_config
    names the format (server_args.py:3914-3934 reads the flag, not the checkpoint)."""
    dtype, sm100 = case.moe_dtype, sm_major == 10
    if dtype in ("bfloat16", "nvfp4") and _nemotron_h(case):
        # apply_nemotron_h_defaults (arg_groups/nemotron_h_hook.py:36-58): unquantized or modelopt checkpoints;
        # NVFP4 takes Marlin on SM80-SM90
        if sm100:
            return "flashinfer_trtllm"
        return "marlin" if dtype == "nvfp4" and sm_major in (8, 9) else "flashinfer_cutlass"
    if sm100 and case.hidden_size == DEEPSEEK_HIDDEN and dtype != "w4a16_mxfp4":
        return "flashinfer_trtllm"  # DeepSeek-V3 / Kimi-K2.5 with no all-to-all (server_args.py:3683-3737)
    if dtype == "w4a16_mxfp4":
        if case.num_experts == KIMI_K3_EXPERTS:
            # Kimi-K3: stock 0.5.14 has no such model; the reference serves it with Marlin and SiLU in place of
            # SiTU (its KimiK3 cases yaml:46-72): this row times SiLU, as the reference's does
            return "marlin"
        if sm100:
            return "flashinfer_mxfp4"  # gpt-oss (server_args.py:3876-3881)
        if sm_major == 12:
            return "marlin"  # server_args.py:3882-3887
        if case.moe_ep_size == 1 and triton_kernels and quantization is None:
            return "triton_kernel"  # gpt-oss with triton_kernels available (server_args.py:3914-3934)
    return "auto"  # Triton for bf16 / fp8 (unquant.py:405-421, fp8.py:889-903); int4 Marlin; nvfp4 per SM


# --moe-runner-backend values (server_args.py:231-245) and what "auto" resolves to in the quant method at layer build
RUNNER_BACKENDS = ("deep_gemm", "triton", "triton_kernel", "flashinfer_trtllm", "experimental_sgl_trtllm",
                   "flashinfer_trtllm_routed", "flashinfer_cutlass", "flashinfer_mxfp4", "flashinfer_cutedsl",
                   "cutlass", "aiter", "marlin")  # fmt: skip
SITU_SUFFIX = "_situ_as_silu"


def label_backend(dispatch: str, dtype: str) -> str | None:
    """The --moe-runner-backend a plan row's dispatch label names (LABELS inverted), None where the dispatch is no
    runner label (a dtype, a plan without SGLang's selection). flashinfer_trtllm and flashinfer_mxfp4 share a label:
    MXFP4 experts take flashinfer_mxfp4 (gpt-oss, server_args.py:3876-3881)."""
    name = dispatch.removesuffix(SITU_SUFFIX)
    if name == LABELS["flashinfer_mxfp4"] and dtype == "w4a16_mxfp4":
        return "flashinfer_mxfp4"
    for value, label in LABELS.items():
        if label == name:
            return value
    value = name.removeprefix("sglang_").removesuffix("_moe")  # kernel_name's fallback label sglang_<value>_moe
    return value if name == f"sglang_{value}_moe" and value in RUNNER_BACKENDS else None


def auto_backend(dtype: str, sm_major: int) -> str:
    """What the quant method makes of --moe-runner-backend auto on CUDA without an all-to-all."""
    if dtype == "nvfp4":  # ModelOptNvFp4FusedMoEMethod.create_moe_runner (modelopt_quant.py:2317-2324)
        return "marlin" if sm_major in (8, 9) else "flashinfer_trtllm"
    if dtype == "int4_wo":  # CompressedTensorsWNA16MoE, Marlin (compressed_tensors/compressed_tensors.py:689-697)
        return "marlin"
    # unquant.py:405-421 (triton_kernel only when set), fp8.py:1793-1803 (DeepGEMM only with DeepEP/Mooncake/NIXL),
    # mxfp4.py:1016-1023 (triton_kernel only when set)
    return "triton"


def server_backend(case, dispatch: str, sm_major: int, triton_kernels: bool = False,
                   quantization: str | None = None) -> str:  # fmt: skip
    """The --moe-runner-backend to install: the runner the plan row's dispatch names (the plan reads it from
    SGLang's own ServerArgs per model and SM, cases/selection), else the hand rules of runner_backend.

    "auto" stays where the plan's runner is what auto resolves to and the hand rules leave auto (or name another
    explicit runner the plan overrules, e.g. DeepSeek-V4's fp8_block experts): an explicit value differs from
    auto in some quant methods (ModelOptNvFp4FusedMoEMethod's enable_flashinfer_trtllm_moe,
    modelopt_quant.py:1781-1784; int4 "triton" takes CompressedTensorsWNA16TritonMoE,
    compressed_tensors.py:689-697). triton_kernel depends on the image's packages (server_args.py:3914-3934),
    which the plan does not see: the hand rule keeps it, and a plan that says otherwise shows as a dispatch
    mismatch. verified_on: sglang==0.5.14"""
    hand = runner_backend(case, sm_major, triton_kernels, quantization)
    wanted = label_backend(dispatch, case.moe_dtype)
    if wanted is None or wanted == hand or hand == "triton_kernel":
        return hand
    return "auto" if wanted == auto_backend(case.moe_dtype, sm_major) else wanted


def quant_config(dtype: str):
    if dtype == "bfloat16":
        return None
    if dtype in ("fp8", "fp8_block"):
        from sglang.srt.layers.quantization.fp8 import Fp8Config

        block = [BLOCK, BLOCK] if dtype == "fp8_block" else None
        return Fp8Config(is_checkpoint_fp8_serialized=True, activation_scheme="dynamic", weight_block_size=block)
    if dtype == "w4a16_mxfp4":
        from sglang.srt.layers.quantization.mxfp4 import Mxfp4Config

        return Mxfp4Config(is_checkpoint_mxfp4_serialized=True)
    if dtype == "nvfp4":
        from sglang.srt.layers.quantization.modelopt_quant import ModelOptFp4Config

        return ModelOptFp4Config(is_checkpoint_nvfp4_serialized=True, group_size=NVFP4_GROUP)
    from sglang.srt.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig

    weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": INT4_GROUP,
               "dynamic": False}  # fmt: skip
    group = {"targets": ["Linear"], "weights": weights, "input_activations": None, "output_activations": None}
    return CompressedTensorsConfig.from_config(
        {"config_groups": {"group_0": group}, "format": "pack-quantized", "ignore": []}
    )


def _fill(layer, layout: MoeLayout, device: str, seed: int) -> None:
    """Checkpoint-like values: random weights and packed bits, unit scales (e8m0 127), zero biases and g_idx."""
    import torch

    from opcollect.runtime.timing import random_tensor

    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in layer.named_parameters(recurse=False):
            shape, scale = tuple(param.shape), "scale" in name
            if name.endswith("weight_shape"):  # the checkpoint's (rows, cols) of w13 / w2
                rows = 2 * layout.local_inter if name.startswith("w13") else layout.hidden
                cols = layout.hidden if name.startswith("w13") else layout.local_inter
                value = torch.tensor([rows, cols], dtype=torch.float32, device=device).expand(shape)
            elif param.dtype in (torch.uint8, torch.int32) and not scale and "idx" not in name:
                hi = 256 if param.dtype == torch.uint8 else 2**31 - 1  # packed fp4 / int4 bits
                value = torch.randint(0, hi, shape, dtype=param.dtype, device=device, generator=gen)
            elif param.dtype in (torch.uint8, torch.int32):  # e8m0 scales 127 = 1.0; g_idx 0
                value = torch.full(shape, 127 if scale else 0, dtype=param.dtype, device=device)
            elif "bias" in name or scale:
                fill = 0.0 if "bias" in name else 1 / 448 if name.endswith("inv") else 1.0
                value = torch.full(shape, fill, device=device)
            else:  # bf16 or fp8 weights, drawn in bf16 (copy_ casts)
                value = random_tensor(shape, torch.bfloat16, device, seed).mul_(0.1)
            param.copy_(value)


def kernel_name(layer, case, backend: str) -> str:
    """The reference's label of the runner backend the built layer holds: the quant method's runner (or its
    scheme's, compressed-tensors), else the resolved global backend (FlashInfer paths run without a runner)."""
    from sglang.srt.layers.moe.utils import get_moe_runner_backend

    qm = layer.quant_method
    runner = getattr(qm, "runner", None) or getattr(getattr(layer, "scheme", None), "runner", None)
    value = getattr(getattr(runner, "runner_backend", None), "value", None)
    if value is None and getattr(qm, "use_flashinfer_cutlass", False):
        value = "flashinfer_cutlass"
    value = value or get_moe_runner_backend().value
    label = LABELS.get(value, f"sglang_{value}_moe")
    if value == "marlin" and case.moe_dtype == "w4a16_mxfp4" and case.num_experts == KIMI_K3_EXPERTS:
        label += "_situ_as_silu"
    return label


QUANTIZATION = None  # the --quantization of the launch the runner stands in for (runner_backend)


def sm_major(device: str) -> int:
    import torch

    return torch.cuda.get_device_capability(torch.device(device))[0]


def prepare(case, dispatch: str, device: str, copies: int) -> Prepared:
    layout = moe_layout(case)  # refuses splits and shapes before importing SGLang
    import torch
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.utils import is_triton_kernels_available

    from opcollect.backends.sglang.context import rank_topology, sglang_context
    from opcollect.backends.sglang.moe_routing import router_logits, router_spec, routing_kwargs, topk_layer, topk_timed
    from opcollect.runtime.timing import random_tensor

    backend = server_backend(case, dispatch, sm_major(device), is_triton_kernels_available(), QUANTIZATION)
    args = {"moe_runner_backend": backend}
    spec = router_spec(case)
    # rank 0 of moe_tp x moe_ep, as serving sets it without attention DP: tp_size = moe_tp * moe_ep, moe_ep_size =
    # ep_size (distributed/parallel_state.py initialize_model_parallel). reduce_results=False: no all-reduce runs,
    # the rows are the experts' compute only, low by the communication serving adds (timed separately);
    # verified_on: sglang==0.5.14
    topology = dict(tp_size=case.moe_tp_size * case.moe_ep_size, moe_tp_size=case.moe_tp_size, moe_tp_rank=0,
                    moe_ep_size=case.moe_ep_size, moe_ep_rank=0)  # fmt: skip
    logits = router_logits(case).to(device)  # on the CPU first, outside any device context
    with sglang_context(device, **args), rank_topology(**topology):
        qc = quant_config(case.moe_dtype)
        layers = []
        for i in range(copies):
            try:
                with torch.device(device):  # parameters on the device, as the model loader builds them
                    layer = FusedMoE(num_experts=case.num_experts, hidden_size=layout.hidden,
                                     intermediate_size=case.inter_size, layer_id=i, top_k=case.topk,
                                     params_dtype=torch.bfloat16, reduce_results=False, quant_config=qc,
                                     prefix=f"opcollect_moe_{i}", activation=layout.activation,
                                     is_gated=layout.is_gated, with_bias=layout.with_bias,
                                     gemm1_alpha=layout.gemm1_alpha, gemm1_clamp_limit=layout.gemm1_clamp_limit,
                                     **routing_kwargs(spec))  # fmt: skip
            except (ValueError, AssertionError, NotImplementedError) as err:
                raise KernelLimit(f"SGLang refuses {case.moe_dtype} experts for {case}: {err}") from err
            layer.eval()
            layer.requires_grad_(False)
            _fill(layer, layout, device, 100 + i)
            if i == 0:
                source = kernel_name(layer, case, backend)
            layer.quant_method.process_weights_after_loading(layer)
            layers.append(layer)
        topk = topk_layer(spec, case, layers[0], device)
        hidden = [random_tensor((case.num_tokens, layout.hidden), torch.bfloat16, device, i) for i in range(copies)]
        timed = topk_timed(spec, case, source)
        if not timed:  # the reference's raw Triton path at EP > 1 times prebuilt top-k outputs
            with torch.no_grad():
                routed = [topk(hidden[i], logits) for i in range(copies)]
    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        with sglang_context(device, **args), rank_topology(**topology), torch.no_grad():
            layers[i](hidden[i], topk(hidden[i], logits) if timed else routed[i])

    return Prepared(call, source)
