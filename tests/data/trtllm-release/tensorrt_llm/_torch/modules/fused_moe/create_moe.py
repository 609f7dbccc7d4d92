# API skeleton of tensorrt_llm/_torch/modules/fused_moe/create_moe.py at NVIDIA/TensorRT-LLM@01f8de52fefe0a885a9cb5d31a271f3576f9cf32: names and parameters only.
import os
from typing import Dict, Optional, Type
import torch
from tensorrt_llm.logger import logger
from tensorrt_llm.models.modeling_utils import QuantConfig
from ...model_config import ModelConfig
from ...utils import ActivationType, AuxStreamType
from .configurable_moe import ConfigurableMoE
from .fused_moe_cute_dsl import CuteDslFusedMoE
from .fused_moe_cutlass import CutlassFusedMoE
from .fused_moe_deepgemm import DeepGemmFusedMoE
from .fused_moe_densegemm import DenseGEMMFusedMoE
from .fused_moe_triton import TritonFusedMoE
from .fused_moe_trtllm_gen import TRTLLMGenFusedMoE
from .fused_moe_vanilla import VanillaMoE
from .fused_moe_wide_ep import WideEPMoE
from .interface import MoE, MoEWeightLoadingMode
from .moe_load_balancer import get_moe_load_balancer
from .routing import BaseMoeRoutingMethod

def get_moe_cls(model_config, override_quant_config=...):
    ...

def create_moe_backend(moe_cls, routing_method, num_experts=..., hidden_size=..., intermediate_size=..., dtype=..., reduce_results=..., model_config=..., aux_stream_dict=..., weight_loading_mode=..., bias=..., apply_router_weight_on_input=..., layer_idx=..., swiglu_alpha=..., swiglu_beta=..., swiglu_limit=..., init_load_balancer=..., without_comm=..., activation_type=...):
    ...

def create_moe(routing_method, num_experts=..., hidden_size=..., intermediate_size=..., dtype=..., reduce_results=..., model_config=..., override_quant_config=..., aux_stream_dict=..., weight_loading_mode=..., bias=..., apply_router_weight_on_input=..., layer_idx=..., swiglu_alpha=..., swiglu_beta=..., swiglu_limit=..., activation_type=...):
    ...
