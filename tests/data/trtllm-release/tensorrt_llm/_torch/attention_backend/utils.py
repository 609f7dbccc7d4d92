# API skeleton of tensorrt_llm/_torch/attention_backend/utils.py at NVIDIA/TensorRT-LLM@index id 56166237717: names and parameters only.
from typing import Optional, Type
import torch
from tensorrt_llm.logger import logger
from ...models.modeling_utils import QuantConfig
from ..flashinfer_utils import IS_FLASHINFER_AVAILABLE
from .interface import AttentionBackend, MLAParams, PositionalEmbeddingParams
from .sparse import get_flashinfer_sparse_attn_attention_backend, get_trtllm_sparse_attn_attention_backend, get_vanilla_sparse_attn_attention_backend
from .trtllm import TrtllmAttention
from .vanilla import VanillaAttention

def get_attention_backend(backend_name, sparse_attn_config=...):
    ...

def create_attention(backend_name, layer_idx, num_heads, head_dim, num_kv_heads=..., pos_embd_params=..., quant_config=..., q_scaling=..., is_mla_enable=..., q_lora_rank=..., kv_lora_rank=..., qk_rope_head_dim=..., qk_nope_head_dim=..., v_head_dim=..., rope_append=..., hidden_size=..., predicted_tokens_per_seq=..., skip_create_weights_in_init=..., attention_chunk_size=..., sparse_attention_config=..., dtype=..., aux_stream=...):
    ...
