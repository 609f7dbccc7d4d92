"""A MoE layer's experts on one rank through vLLM 0.24.0's FusedMoE factory, with the experts kernel vLLM's
oracle picks per quant mode and split (docs/research/vllm-0.24.0-gemm-moe.md §5; paths relative to vllm/).

Quant config per moe_dtype, as the reference collector builds it (aiconfigurator collector/vllm/collect_moe.py):
bfloat16 None (UnquantizedFusedMoEMethod); fp8 ModelOptFp8Config, static per-tensor (modelopt.py:749-771);
fp8_block Fp8Config(serialized, dynamic, [128, 128]) (fp8.py:515-532); int4_wo compressed-tensors pack-quantized
int4 group 128 (CompressedTensorsWNA16MarlinMoEMethod); w4a16_mxfp4 Mxfp4Config for gpt-oss (mxfp4.py:73-89).
Routing comes from the case's distribution as the torch backend draws it, handed to vLLM as router logits.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from opcollect.runtime.contract import KernelLimit, Prepared
from opcollect.runtime.dtypes import ceil_div, tensor_bytes

BLOCK = 128  # fp8_block weight blocks
INT4_GROUP = 128
MXFP4_BLOCK = 32  # one e8m0 scale per 32 fp4 values
GPT_OSS = (2880, 2880)  # (hidden, inter) of gpt-oss, the one model served through Mxfp4Config
BACKEND_ATTRS = ("unquantized_backend", "fp8_backend", "nvfp4_backend", "mxfp4_backend", "wna16_backend")


@dataclass(frozen=True)
class MoeLayout:
    local_experts: int
    local_inter: int  # per rank, after the quant method's round-up (mxfp4)
    hidden: int
    tokens: int
    topk: int
    parallel_size: int  # the logical TP world FusedMoE is told (vLLM turns it into EP when EP is on)
    expert_parallel: bool
    params: tuple[tuple[str, tuple[int, ...], str], ...]  # what create_weights registers: name, shape, dtype
    config_class: str | None
    config_args: tuple[tuple[str, object], ...]
    activation: str = "silu"
    has_bias: bool = False


def split(case) -> tuple[int, int, int, bool]:
    """(local experts, local inter, logical parallel size, expert parallel) as vLLM shards one rank."""
    tp, ep = case.moe_tp_size, case.moe_ep_size
    if tp > 1 and ep > 1:
        # with enable_expert_parallel vLLM flattens all of TP into EP and keeps every expert's full inter size
        # (model_executor/layers/fused_moe/config.py:1190-1238): no served split holds both
        raise KernelLimit(f"vLLM MoE does not combine TP and EP (tp={tp}, ep={ep}): EP takes over the TP ranks")
    if ep > 1:
        return case.num_experts // ep, case.inter_size, ep, True
    return case.num_experts, case.inter_size // tp, tp, False


def moe_layout(case) -> MoeLayout:
    experts, inter, size, ep = split(case)
    hidden, dtype = case.hidden_size, case.moe_dtype
    w13, w2 = (experts, 2 * inter, hidden), (experts, hidden, inter)

    def make(params, config_class=None, config_args=(), **more) -> MoeLayout:
        return MoeLayout(experts, inter, hidden, case.num_tokens, case.topk, size, ep, params, config_class,
                         config_args, **more)  # fmt: skip

    if dtype == "bfloat16":  # unquantized_fused_moe_method.py create_weights (~:98-121)
        params = (("w13_weight", w13, "bfloat16"), ("w2_weight", w2, "bfloat16"))
        return make(params)
    if dtype == "fp8":  # ModelOptFp8MoEMethod.create_weights (modelopt.py:793-875)
        fp8 = "float8_e4m3fn"
        params = (
            ("w13_weight", w13, fp8),
            ("w2_weight", w2, fp8),
            ("w13_weight_scale", (experts, 2), "float32"),
            ("w2_weight_scale", (experts,), "float32"),
            ("w13_input_scale", (experts,), "float32"),
            ("w2_input_scale", (experts,), "float32"),
        )
        args = (("quant_method", "FP8"), ("is_checkpoint_fp8_serialized", True), ("kv_cache_quant_method", None))
        return make(params, "ModelOptFp8Config", (*args, ("exclude_modules", ())))
    if dtype == "fp8_block":  # Fp8MoEMethod.create_weights, block branch (fp8.py:534-643)
        if inter % BLOCK:  # fp8.py:561-566 raises
            raise KernelLimit(f"block fp8 experts need the per-rank inter size % {BLOCK} == 0 (got {inter})")
        fp8 = "float8_e4m3fn"
        params = (
            ("w13_weight", w13, fp8),
            ("w2_weight", w2, fp8),
            ("w13_weight_scale_inv", (experts, 2 * ceil_div(inter, BLOCK), ceil_div(hidden, BLOCK)), "float32"),
            ("w2_weight_scale_inv", (experts, ceil_div(hidden, BLOCK), ceil_div(inter, BLOCK)), "float32"),
        )
        args = (("is_checkpoint_fp8_serialized", True), ("activation_scheme", "dynamic"))
        return make(params, "Fp8Config", (*args, ("weight_block_size", (BLOCK, BLOCK))))
    if dtype == "int4_wo":
        # CompressedTensorsWNA16MarlinMoEMethod, Marlin layout
        # (compressed_tensors/compressed_tensors_moe/compressed_tensors_moe_wna16_marlin.py:120-180, 207-400);
        # on the SM100 family the FlashInfer TRT-LLM backend transposes w13/w2 and their scales (same lines)
        if hidden % INT4_GROUP or inter % INT4_GROUP:  # :262-282 raise
            raise KernelLimit(f"int4 experts need hidden and per-rank inter % {INT4_GROUP} == 0 ({hidden}, {inter})")
        params = (
            ("w13_weight_packed", (experts, hidden // 8, 2 * inter), "int32"),
            ("w2_weight_packed", (experts, inter // 8, hidden), "int32"),
            ("w13_weight_scale", (experts, hidden // INT4_GROUP, 2 * inter), "bfloat16"),
            ("w2_weight_scale", (experts, inter // INT4_GROUP, hidden), "bfloat16"),
            ("w2_weight_shape", (experts, 2), "bfloat16"),  # torch.empty in the default dtype, bf16 while loading
            ("w13_weight_shape", (experts, 2), "bfloat16"),
            ("w13_weight_g_idx", (experts, hidden), "int32"),
            ("w2_weight_g_idx", (experts, inter), "int32"),
            ("w13_g_idx_sort_indices", (experts, hidden), "int32"),
            ("w2_g_idx_sort_indices", (experts, inter), "int32"),
        )
        args = (("format", "pack-quantized"), ("num_bits", 4), ("group_size", INT4_GROUP), ("symmetric", True))
        return make(params, "CompressedTensorsConfig", args)
    if dtype == "w4a16_mxfp4":
        if (case.hidden_size, case.inter_size) != GPT_OSS:
            # other MXFP4 checkpoints (Kimi) load through compressed-tensors with an activation stock 0.24.0 lacks;
            # the reference collector patches vLLM for them (collect_moe.py:544-591): not collected here
            raise KernelLimit("vLLM w4a16_mxfp4 experts are collected for gpt-oss shapes (hidden = inter = 2880) only")
        # the TRITON backend rounds the per-rank inter size up to 64 (oracle/mxfp4.py:633-665, the last branch);
        # SM100's TRT-LLM backend rounds both sizes to 256 instead, so there this layout (and the footprint) is low
        inter = ceil_div(inter, 64) * 64
        params = (
            ("w13_weight", (experts, 2 * inter, hidden // 2), "uint8"),
            ("w13_weight_scale", (experts, 2 * inter, hidden // MXFP4_BLOCK), "uint8"),
            ("w2_weight", (experts, hidden, inter // 2), "uint8"),
            ("w2_weight_scale", (experts, hidden, inter // MXFP4_BLOCK), "uint8"),
            ("w13_bias", (experts, 2 * inter), "bfloat16"),
            ("w2_bias", (experts, hidden), "bfloat16"),
        )  # GptOssMxfp4MoEMethod.create_weights (mxfp4.py:183-290)
        # gpt-oss builds its experts with has_bias=True and activation "swigluoai" (models/gpt_oss.py:191-203)
        return make(params, "Mxfp4Config", activation="swigluoai", has_bias=True)
    raise KernelLimit(f"the vLLM MoE runner has no {dtype} path")


def footprint(case) -> int:
    layout = moe_layout(case)
    weights = tensor_bytes(layout.params)
    routed = layout.tokens * layout.topk
    # hidden states, router logits, output; per routed pair the gate_up and activation intermediates
    activations = (2 * layout.tokens * layout.hidden + routed * (layout.hidden + 3 * layout.local_inter)) * 2
    return weights + activations + layout.tokens * case.num_experts * 2


def router_logits(case):
    """[tokens, num_experts] bf16 logits whose top-k are the experts the case's distribution routes each token to
    (opcollect.backends.torch.moe.routing, so both backends route alike): 1 at the chosen experts, 0 elsewhere.
    Rank 0 owns experts [0, E / ep) (linear placement, the default: config/parallel.py:175)."""
    import torch

    from opcollect.backends.torch.moe import routing

    ids = routing(case)
    logits = torch.zeros(case.num_tokens, case.num_experts, dtype=torch.bfloat16)
    return logits.scatter_(1, ids, 1.0)


def moe_label(method: str, backend: str, experts: str) -> str:
    """The kernel_source as the reference records it (collect_moe.py:671-716); the planner's _moe_label, which a
    framework backend may not import."""
    return f"vllm_{method}_{backend}_{experts}".lower().replace(" ", "_").replace("-", "_")


def quant_config(layout: MoeLayout):
    if layout.config_class is None:
        return None
    args = {key: list(v) if isinstance(v, tuple) else v for key, v in layout.config_args}
    if layout.config_class == "ModelOptFp8Config":
        from vllm.model_executor.layers.quantization.modelopt import ModelOptFp8Config

        return ModelOptFp8Config(
            quant_method=args["quant_method"],
            is_checkpoint_fp8_serialized=args["is_checkpoint_fp8_serialized"],
            kv_cache_quant_method=args["kv_cache_quant_method"],
            exclude_modules=args["exclude_modules"],
        )
    if layout.config_class == "Fp8Config":
        from vllm.model_executor.layers.quantization.fp8 import Fp8Config

        return Fp8Config(
            is_checkpoint_fp8_serialized=args["is_checkpoint_fp8_serialized"],
            activation_scheme=args["activation_scheme"],
            weight_block_size=args["weight_block_size"],
        )
    if layout.config_class == "Mxfp4Config":
        from vllm.model_executor.layers.quantization.mxfp4 import Mxfp4Config

        return Mxfp4Config()
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig

    weights = {
        "num_bits": args["num_bits"],
        "type": "int",
        "strategy": "group",
        "group_size": args["group_size"],
        "symmetric": args["symmetric"],
        "dynamic": False,
    }
    group = {
        "format": args["format"],
        "weights": weights,
        "input_activations": None,
        "output_activations": None,
        "targets": ["Linear"],
    }
    return CompressedTensorsConfig.from_config(
        {"quant_method": "compressed-tensors", "format": args["format"], "config_groups": {"group_0": group}}
    )


@contextmanager
def _served(config, forward: bool):
    """bf16 default dtype (as the model loader sets it), ``config`` current, and for a forward its context: the
    layer is looked up by name inside torch.ops.vllm.moe_forward (runner/moe_runner.py:73-87, 301-305)."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import set_forward_context

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with set_current_vllm_config(config, check_compile=False):
            if forward:
                with set_forward_context({}, config):
                    yield
            else:
                yield
    finally:
        torch.set_default_dtype(previous)


def _fill(experts, layout: MoeLayout, device: str, seed: int) -> None:
    """Checkpoint-like values: random weights and packed bytes, unit scales (e8m0 127 = 1.0), zero biases."""
    import warnings

    import torch

    from opcollect.runtime.timing import random_tensor

    expected = {name: shape for name, shape, _ in layout.params}
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in experts.named_parameters(recurse=False):
            if name in expected and tuple(param.shape) != expected[name]:
                # vLLM is the truth for what it loads; a mismatch only makes the footprint estimate wrong
                warnings.warn(f"vLLM made {name} {tuple(param.shape)}, the layout says {expected[name]}", stacklevel=2)
            shape, scale = tuple(param.shape), "scale" in name
            if name.endswith("weight_shape"):  # the checkpoint's (rows, cols) of w13 / w2
                rows, cols = (
                    (2 * layout.local_inter, layout.hidden)
                    if name[:3] == "w13"
                    else (layout.hidden, layout.local_inter)
                )
                value = torch.tensor([rows, cols], dtype=torch.float32, device=device).expand(shape)
            elif (
                param.dtype in (torch.uint8, torch.int32)
                and not scale
                and ("packed" in name or name in ("w13_weight", "w2_weight"))
            ):
                hi = 256 if param.dtype == torch.uint8 else 2**31 - 1  # packed fp4 / int4 bits
                value = torch.randint(0, hi, shape, dtype=param.dtype, device=device, generator=gen)
            elif param.dtype in (torch.uint8, torch.int32):  # e8m0 scales 127 = 1.0; unused g_idx
                value = torch.full(shape, 127 if scale else 0, dtype=param.dtype, device=device)
            elif "bias" in name or scale:
                value = torch.full(
                    shape, 0.0 if "bias" in name else 1 / 448 if name.endswith("inv") else 1.0, device=device
                )
            else:  # bf16 or fp8 weights, drawn in bf16 (copy_ casts)
                value = random_tensor(shape, torch.bfloat16, device, seed).mul_(0.1)
            param.copy_(value)


def kernel_name(runner, hidden_states) -> str:
    """vllm_<method>_<backend>_<experts>: the quant method, the oracle's backend and the experts class that runs
    for these hidden states, read from the built layer (fused_moe/modular_kernel.py:1563;
    experts/fallback.py:127-154)."""
    from vllm.model_executor.layers.fused_moe.experts.fallback import FallbackExperts

    experts = runner.routed_experts
    qm = experts.quant_method
    backend = next((getattr(qm, a) for a in BACKEND_ATTRS if hasattr(qm, a)), None)
    kernel = getattr(qm, "moe_kernel", None)
    leaf = getattr(kernel, "fused_experts", None)
    if isinstance(leaf, FallbackExperts):  # picks per call by shape, e.g. TritonOrDeepGemmExperts
        leaf = leaf._select_experts_impl(hidden_states, experts.w13_weight, experts.w2_weight)
    method = type(qm).__name__.removesuffix("Method")
    return moe_label(method, str(getattr(backend, "value", backend)), type(leaf).__name__ if leaf else "direct")


def prepare(case, dispatch: str, device: str, copies: int) -> Prepared:
    layout = moe_layout(case)  # refuses splits and shapes before allocating
    import torch
    from vllm.forward_context import get_forward_context
    from vllm.model_executor.layers.fused_moe.layer import FusedMoE
    from vllm.v1.worker.workspace import init_workspace_manager, is_workspace_manager_initialized

    from opcollect.backends.vllm.context import vllm_context
    from opcollect.runtime.timing import random_tensor

    if not is_workspace_manager_initialized():  # the modular kernels take their scratch from it (workspace.py:216)
        init_workspace_manager(torch.device(device))
    qc = quant_config(layout)
    names = [f"opcollect_moe_{i}" for i in range(copies)]  # registered by name: duplicates raise (moe_runner.py:60-70)
    with vllm_context(device, quant_config=qc, max_num_batched_tokens=case.num_tokens) as config:
        # one rank of the split: the logical TP world, and EP on for an EP split (AIC collect_moe.py:594-620). At
        # world size 1 there is no all-reduce after TP experts and no all2all dispatch/combine around EP experts
        # (fused_moe/config.py:1190-1238, the all-reduce in runner/moe_runner.py:451 is a no-op): these rows are the
        # experts' compute only, low by the communication serving adds (timed separately as all-reduce/all2all).
        config.parallel_config.enable_expert_parallel = layout.expert_parallel
        runners = []
        with _served(config, forward=False), torch.device(device):
            for name in names:
                try:
                    runner = FusedMoE(
                        num_experts=case.num_experts,
                        top_k=case.topk,
                        hidden_size=case.hidden_size,
                        intermediate_size=case.inter_size,
                        params_dtype=torch.bfloat16,
                        renormalize=True,
                        quant_config=qc,
                        tp_size=layout.parallel_size,
                        dp_size=1,
                        pcp_size=1,
                        prefix=name,
                        has_bias=layout.has_bias,
                        activation=layout.activation,
                    )
                except ValueError as err:  # create_weights or the backend oracle refuses the shape
                    raise KernelLimit(f"vLLM refuses {case.moe_dtype} experts for {case}: {err}") from err
                runner.eval()
                runner.requires_grad_(False)
                _fill(runner.routed_experts, layout, device, 100 + len(runners))
                runner.routed_experts.quant_method.process_weights_after_loading(runner.routed_experts)
                runners.append(runner)
        # serving's router logits come from the gate GEMM (not timed here, as in the reference); the top-k softmax
        # router (router/fused_topk_router.py) and, for monolithic kernels, in-kernel routing are timed
        logits = router_logits(case).to(device)
        hidden = [random_tensor((case.num_tokens, case.hidden_size), torch.bfloat16, device, i) for i in range(copies)]
        source = kernel_name(runners[0], hidden[0])
    order = config.compilation_config.static_all_moe_layers
    index = [order.index(name) if name in order else 0 for name in names]
    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        with _served(config, forward=True), torch.no_grad():
            # the custom op may resolve its layer by position in all_moe_layers (moe_runner.py:73-83)
            get_forward_context().moe_layer_index = index[i]
            runners[i](hidden[i], logits)

    return Prepared(call, source)
