# API skeleton of tensorrt_llm/_torch/attention_backend/interface.py at NVIDIA/TensorRT-LLM@51ea5c963794a4818ad8396a77d147fa901435d9: names and parameters only.
import copy
import weakref
from collections import namedtuple
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import TYPE_CHECKING, Dict, Generic, List, Optional, Protocol, Tuple, Type, TypeVar, Union
import torch
from typing_extensions import Self
from ..speculative.utils import SpecDecodingTensor
from tensorrt_llm.functional import PositionEmbeddingType, RopeEmbeddingUtils, RotaryScalingType
from tensorrt_llm.mapping import Mapping
from tensorrt_llm.models.modeling_utils import QuantConfig
from ..metadata import KVCacheParams
from ..pyexecutor.resource_manager import KVCacheManager
from ..utils import get_model_extra_attrs

@dataclass
class AttentionRuntimeFeatures:
    chunked_prefill: object
    cache_reuse: object
    has_speculative_draft_tokens: object
    chunk_size: object
    chunked_prefill_buffer_batch_size: object

class AttentionInputType(IntEnum):
    ...

@dataclass
class AttentionMetadata:
    max_num_requests: object
    max_num_tokens: object
    max_num_sequences: object
    kv_cache_manager: object
    mapping: object
    enable_flash_mla: object
    enable_context_mla_with_cached_kv: object
    is_cuda_graph: object
    seq_lens: object
    num_contexts: object
    position_ids: object
    _num_contexts: object
    kv_cache_params: object
    seq_lens_kv: object
    _seq_lens: object
    _seq_lens_kv: object
    _seq_lens_cuda: object
    _seq_lens_kv_cuda: object
    cross: object
    request_ids: object
    prompt_lens: object
    runtime_features: object
    all_rank_num_tokens: object
    _num_generations: object
    _num_ctx_tokens: object
    _num_tokens: object
    padded_num_tokens: object
    cache_indirection: object
    cuda_graph_buffers: object
    _saved_tensors: object
    sparse_attention_config: object

class PositionalEmbedder(Protocol):
    ...

@dataclass
class RopeParams:
    dim: object
    theta: object
    alpha: object
    scale_type: object
    scale: object
    low_freq_factor: object
    high_freq_factor: object
    short_m_scale: object
    long_m_scale: object
    max_positions: object
    original_max_positions: object
    beta_fast: object
    beta_slow: object
    mscale: object
    mscale_all_dim: object
    short_factor: object
    long_factor: object
    max_seq_len: object
    duplicate_data: object

@dataclass
class PositionalEmbeddingParams:
    type: object
    embedder: object
    rope: object
    is_neox: object
    mrope_section: object
TMetadata = ...

class PredefinedAttentionMask(str, Enum):
    ...

class CustomAttentionMask(str, Enum):
    ...
AttentionMask = ...

class AttentionBackend:

    def __init__(self, layer_idx, num_heads, head_dim, num_kv_heads=..., quant_config=..., skip_create_weights_in_init=..., sparse_attention_config=..., **kwargs):
        ...

@dataclass
class MLAParams:
    q_lora_rank: object
    kv_lora_rank: object
    qk_rope_head_dim: object
    qk_nope_head_dim: object
    v_head_dim: object
    predicted_tokens_per_seq: object
    chunked_prefill_buffer_batch_size: object
    hidden_size: object
