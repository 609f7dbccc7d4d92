# API skeleton of tensorrt_llm/_torch/models/modeling_deepseekv3.py at NVIDIA/TensorRT-LLM@a43cf9e363d5657061b5ce0e12f3d993a08d8158: names and parameters only.
import copy
import math
import os
import warnings
from typing import Dict, List, Optional, Tuple
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import nn
from tqdm import tqdm
from transformers import PretrainedConfig
from tensorrt_llm._ipc_utils import can_access_peer
from tensorrt_llm._utils import get_sm_version
from tensorrt_llm.functional import PositionEmbeddingType
from tensorrt_llm.llmapi.utils import enable_llm_debug
from tensorrt_llm.mapping import Mapping
from tensorrt_llm.models.modeling_utils import QuantConfig
from tensorrt_llm.quantization.mode import QuantAlgo
from ..attention_backend import AttentionMetadata
from ..attention_backend.interface import PositionalEmbeddingParams, RopeParams
from ..distributed import AllReduce, AllReduceFusionOp, AllReduceParams, MoEAllReduce, MoEAllReduceParams, allgather
from ..model_config import ModelConfig
from ..modules.attention import MLA
from ..modules.decoder_layer import DecoderLayer
from ..modules.embedding import Embedding
from ..modules.fused_moe import DeepSeekV3MoeRoutingMethod, MoEWeightLoadingMode, create_moe
from ..modules.gated_mlp import GatedMLP
from ..modules.linear import Linear, TensorParallelMode, WeightsLoadingConfig
from ..modules.multi_stream_utils import maybe_execute_in_parallel
from ..modules.rms_norm import RMSNorm
from ..peft.lora.layer import LoraLayer
from ..speculative import SpecMetadata
from ..utils import AuxStreamType, EventType, Fp4QuantizedTensor, create_lm_head_tp_mapping
from .modeling_speculative import SpecDecOneEngineForCausalLM
from .modeling_utils import DecoderModel, EagerFusionConfig, filter_weights, register_auto_model

def weight_dequant_kernel(x_ptr, s_ptr, y_ptr, M, N, BLOCK_SIZE):
    ...

def weight_dequant(x, s, block_size=...):
    ...

def moe_reduce_add_shared_output(routed_output, shared_output):
    ...

class DeepseekV3WeightLoader:

    def __init__(self, model, is_draft_model=...):
        ...

class DeepseekV3MTPHead(nn.Module):

    def __init__(self, model_config):
        ...

class DeepseekV3Linear(Linear):

    def __init__(self, in_features, out_features, bias=..., dtype=..., mapping=..., tensor_parallel_mode=..., gather_output=..., quant_config=..., weights_loading_config=..., reduce_output=..., skip_create_weights_in_init=..., use_custom_cublas_mm=..., lora=...):
        ...

class DeepseekV3Attention(MLA):

    def __init__(self, model_config, layer_idx=..., aux_stream=...):
        ...

class Deepseekv3RoutingImpl:

    def __init__(self, top_k, n_group, topk_group, routed_scaling_factor, is_fused=...):
        ...

class DeepseekV3Gate(DeepSeekV3MoeRoutingMethod):

    def __init__(self, hidden_size, num_experts, top_k, n_group, topk_group, routed_scaling_factor, dtype=..., fuse_routing_kernel=..., apply_routing=..., moe_backend=...):
        ...

class Deepseekv3MoE(nn.Module):

    def __init__(self, *, num_experts, top_k, hidden_size, intermediate_size, shared_expert_intermediate_size, aux_stream_dict, dtype=..., model_config=..., override_quant_config=..., layer_idx=...):
        ...

class DeepseekV3DecoderLayer(DecoderLayer):

    def __init__(self, model_config, layer_idx, aux_stream_dict, is_separate_draft_engine=...):
        ...

class DeepseekV3MTP(DeepseekV3DecoderLayer):

    def __init__(self, model_config, layer_idx, aux_stream_dict, is_separate_draft_engine=...):
        ...

class DeepseekV3Model(DecoderModel):

    def __init__(self, model_config):
        ...

class DeepseekV3ForCausalLM:

    def __init__(self, model_config):
        ...
