"""The router side of the SGLang MoE runner: SGLang's TopK layer configured as each model configures it, the router
logits that make it pick the case's experts, and whether the reference times the top-k with the experts.

Paths are relative to the SGLang 0.5.14 wheel's sglang/srt/. Serving runs ``self.topk(hidden, router_logits)``
before every ``self.experts(hidden, topk_output)`` (models/deepseek_v2.py:640-676, qwen3_moe.py:252-257,
gpt_oss.py:210-214, nemotron_h.py:207-217). The TopK layer is built with ``output_format=None``, so its
forward_cuda picks the format the installed runner backend consumes (layers/moe/topk.py:470-493): BYPASSED for
flashinfer_trtllm and flashinfer_mxfp4 (their runners assert it: moe_runner/flashinfer_trtllm.py:743,
quantization/mxfp4.py:1167), TRITON_KERNEL for triton_kernel (moe_runner/triton_kernels.py:171), STANDARD
otherwise. The per-model values are the reference collector's (aiconfigurator collector/cases/models/*_cases.yaml,
``sglang_moe_*``), which copy each model's config.json and its SGLang model class.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RouterSpec:
    """TopK's and FusedMoE's routing arguments for one model's experts."""

    scoring_func: str = "softmax"
    renormalize: bool = True
    num_expert_group: int | None = None  # with topk_group: grouped top-k (use_grouped_topk)
    topk_group: int | None = None
    correction_bias: bool = False  # e_score_correction_bias (zeros, float32, as the reference)
    routed_scaling_factor: float | None = None
    routing_method_type: str | None = None  # a RoutingMethodType name, passed to FusedMoE
    apply_router_weight_on_input: bool = False


# softmax, renormalised top-k: TopK's defaults (gpt-oss, the generic shapes); a model not in SPECS gets it too, which
# differs from serving where its own routing differs (gemma-4's router): verified_on: sglang==0.5.14
DEFAULT = RouterSpec()


def _deepseek(groups: int, topk_group: int, scale: float, scoring: str = "sigmoid", method: str | None = "DeepSeekV3"):
    return RouterSpec(scoring, True, groups, topk_group, True, scale, method)


# (hidden_size, inter_size, topk, num_experts) -> the model's routing, from its reference cases yaml
SPECS: dict[tuple[int, int, int, int], RouterSpec] = {
    (7168, 2048, 8, 256): _deepseek(8, 4, 2.5),  # DeepSeek-V3 / R1 / V3.2
    (7168, 2048, 8, 384): _deepseek(1, 1, 2.827),  # Kimi-K2 / K2.5
    (3584, 3072, 16, 896): _deepseek(1, 1, 1.0),  # Kimi-K3
    (6144, 2048, 8, 256): _deepseek(1, 1, 2.5),  # GLM-5
    (4096, 2048, 8, 256): _deepseek(1, 1, 1.0, method=None),  # MiMo-V2-Flash
    (2688, 1856, 6, 128): _deepseek(1, 1, 2.5),  # Nemotron-3-Nano
    (8192, 5120, 22, 512): _deepseek(1, 1, 5.0),  # Nemotron-3-Ultra
    (2048, 5120, 22, 512): _deepseek(1, 1, 5.0),  # Nemotron-3-Ultra, latent width
    (4096, 2048, 6, 256): RouterSpec("sqrtsoftplus", True, None, None, True, 1.5, "DeepSeekV3"),  # DeepSeek-V4-Flash
    (7168, 3072, 6, 384): RouterSpec("sqrtsoftplus", True, None, None, True, 2.5, "DeepSeekV3"),  # DeepSeek-V4-Pro
    (3072, 1536, 8, 256): RouterSpec("sigmoid", True, None, None, True),  # MiniMax-M2
    (6144, 3072, 4, 128): RouterSpec("sigmoid", True, None, None, True, 2.0, "DeepSeekV3"),  # MiniMax-M3
    (6144, 2560, 8, 160): RouterSpec(routing_method_type="Renormalize"),  # Qwen3-Coder-480B
    (2048, 512, 8, 256): RouterSpec(routing_method_type="RenormalizeNaive"),  # Qwen3.5-35B
    (3072, 1024, 8, 256): RouterSpec(routing_method_type="RenormalizeNaive"),  # Qwen3.5-122B
    (4096, 1024, 10, 512): RouterSpec(routing_method_type="RenormalizeNaive"),  # Qwen3.5-397B
    # Llama-4: top-1 then sigmoid (Llama4MoE.custom_routing_function), equal to sigmoid then top-1 unrenormalised
    (5120, 8192, 1, 16): RouterSpec("sigmoid", False, routing_method_type="Llama4", apply_router_weight_on_input=True),
    (5120, 8192, 1, 128): RouterSpec("sigmoid", False, routing_method_type="Llama4", apply_router_weight_on_input=True),
}


def router_spec(case) -> RouterSpec:
    return SPECS.get((case.hidden_size, case.inter_size, case.topk, case.num_experts), DEFAULT)


def router_logits(case):
    """(tokens, E) float32 logits on the CPU whose top-k is the case's routing: 1 at each token's chosen experts,
    0 elsewhere, so every monotonic scoring (softmax, sigmoid, sqrtsoftplus) ranks them first and the renormalised
    weights are equal. Built on the CPU whatever device is current (the torch backend's routing draws from a CPU
    generator); the caller moves it. Grouped top-k with topk_group < num_expert_group (DeepSeek-V3: 4 of 8) keeps
    only the best groups, as serving and the reference do, so some chosen experts may be swapped for others."""
    import torch

    from opcollect.backends.torch.moe import routing

    with torch.device("cpu"):
        ids = routing(case).to(device="cpu", dtype=torch.int64)
        logits = torch.zeros(case.num_tokens, case.num_experts, dtype=torch.float32)
        return logits.scatter_(1, ids, 1.0)


def routing_kwargs(spec: RouterSpec) -> dict:
    """FusedMoE's routing keywords (layers/moe/fused_moe_triton/layer.py:157-183)."""
    from sglang.srt.layers.moe.utils import RoutingMethodType

    method = None if spec.routing_method_type is None else RoutingMethodType[spec.routing_method_type]
    return {
        "routing_method_type": method,
        "routed_scaling_factor": spec.routed_scaling_factor,
        "apply_router_weight_on_input": spec.apply_router_weight_on_input,
    }


def topk_layer(spec: RouterSpec, case, layer, device: str):
    """SGLang's TopK as the model builds it next to ``layer`` (its FusedMoE), output format left to the backend."""
    import torch
    from sglang.srt.layers.moe.topk import TopK

    grouped = spec.num_expert_group is not None and spec.topk_group is not None
    bias = torch.zeros(case.num_experts, dtype=torch.float32, device=device) if spec.correction_bias else None
    scaled = spec.routed_scaling_factor is not None and layer.should_fuse_routed_scaling_factor_in_topk
    return TopK(top_k=case.topk, layer_id=0, use_grouped_topk=grouped, num_expert_group=spec.num_expert_group,
                topk_group=spec.topk_group, renormalize=spec.renormalize, scoring_func=spec.scoring_func,
                correction_bias=bias, routed_scaling_factor=spec.routed_scaling_factor,
                apply_routed_scaling_factor_on_output=scaled, output_format=None)  # fmt: skip


def topk_timed(spec: RouterSpec, case, source: str) -> bool:
    """Whether the reference times the top-k inside the MoE row: its FusedMoE path calls
    ``moe_layer(hidden, topk_layer(hidden, logits))`` in the timed function, and its raw Triton path
    (default routing on the Triton runner) runs select_experts in the timed run_op at EP 1; only that raw path
    at EP > 1 times prebuilt rank-0 top-k outputs (aiconfigurator collector/sglang/collect_moe.py
    run_moe_torch use_framework_layer, _benchmark_framework_quantized_moe kernel_func, benchmark_config run_op)."""
    # differs from serving, which always runs the top-k before the experts: verified_on: sglang==0.5.14
    raw_triton = (
        spec == DEFAULT and source == "sglang_fused_moe_triton" and case.moe_dtype in ("bfloat16", "fp8", "fp8_block")
    )
    return not (raw_triton and case.moe_ep_size > 1)
