# API skeleton of tensorrt_llm/_torch/modules/fused_moe/routing.py at NVIDIA/TensorRT-LLM@0f3e29af15c406a262d677ecd6aee6a266b8eec7: names and parameters only.
import math
import threading
import warnings
from enum import IntEnum
from typing import Callable, Dict, List, Optional, Type
import torch
import torch.nn.functional as F
from torch import nn
from tensorrt_llm.llmapi.utils import enable_llm_debug
_PERFECT_ROUTER_LOGITS_CACHE = ...

def get_perfect_router_cache_stats():
    ...

def precompute_common_perfect_router_logits(num_experts, experts_per_token, moe_ep_size, dtype):
    ...

def get_cached_perfect_router_logits(num_tokens, num_experts, experts_per_token, moe_ep_size, device, dtype):
    ...

class RoutingMethodType(IntEnum):
    ...

class BaseMoeRoutingMethod(nn.Module):
    ...

class DefaultMoeRoutingMethod(BaseMoeRoutingMethod):

    def __init__(self, top_k, output_dtype=..., force_enable_pytorch_op=...):
        ...

class Deepseekv3RoutingImpl:

    def __init__(self, top_k, n_group, topk_group, routed_scaling_factor, is_fused=...):
        ...

class DeepSeekV3MoeRoutingMethod(BaseMoeRoutingMethod):

    def __init__(self, top_k, n_group, topk_group, routed_scaling_factor, callable_e_score_correction_bias, is_fused=...):
        ...

class MiniMaxM2MoeRoutingMethod(BaseMoeRoutingMethod):

    def __init__(self, top_k, num_experts, callable_e_score_correction_bias, output_dtype=...):
        ...

class RenormalizeMoeRoutingMethod(BaseMoeRoutingMethod):

    def __init__(self, top_k, output_dtype=..., force_enable_pytorch_op=...):
        ...

class Llama4RenormalizeMoeRoutingMethod(BaseMoeRoutingMethod):

    def __init__(self, top_k, output_dtype=...):
        ...

class SparseMixerMoeRoutingMethod(BaseMoeRoutingMethod):

    def __init__(self, top_k, eps):
        ...

class StaticMoeRoutingMethod(BaseMoeRoutingMethod):

    def __init__(self, routing_tensor, routing_scales=...):
        ...

class LoadBalancedMoeRoutingMethod(BaseMoeRoutingMethod):

    def __init__(self, top_k):
        ...

class RenormalizeNaiveMoeRoutingMethod(RenormalizeMoeRoutingMethod):

    def __init__(self, top_k, output_dtype=...):
        ...

class AdaptiveKMoeRoutingMethod(BaseMoeRoutingMethod):

    def __init__(self, k_min=..., k_max=..., entropy_thresholds=..., output_dtype=...):
        ...
ROUTING_METHOD_TYPE_TO_CLASS = ...

def create_renormalize_expert_load_balanced_logits(num_tokens, num_experts, experts_per_token, moe_ep_size, device, dtype=...):
    ...
