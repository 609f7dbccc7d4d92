# API skeleton of tensorrt_llm/_torch/models/modeling_minimaxm3.py at NVIDIA/TensorRT-LLM@index id 55546326808: names and parameters only.
from typing import Any, Dict, List, Optional, Tuple
import torch
from torch import nn
from transformers import PretrainedConfig
from ..modules.decoder_layer import DecoderLayer
from ..utils import AuxStreamType

def get_sparse_layer_ids(text_config):
    ...

def get_sparse_disable_index_value_layer_ids(text_config):
    ...

def get_moe_layer_ids(text_config):
    ...

class MiniMaxM3Attention(nn.Module):

    def __init__(self, model_config, layer_idx, is_sparse_attention_layer=..., disable_index_value=...):
        ...

    def forward(self, position_ids=..., hidden_states=..., attn_metadata=..., all_reduce_params=..., **kwargs):
        ...

class MiniMaxM3DecoderLayer(DecoderLayer):

    def __init__(self, model_config, layer_idx, aux_stream_dict):
        ...
