# API skeleton of tensorrt_llm/_torch/pyexecutor/resource_manager.py at NVIDIA/TensorRT-LLM@001541bad83b84ae4c5c4a279e464572d5f690f7: names and parameters only.
import copy
import enum
import math
import os
from abc import ABC, abstractmethod
from collections import OrderedDict, defaultdict, deque
from typing import TYPE_CHECKING, Dict, Iterable, List, Optional, Sequence, Set, Tuple, Union
import numpy as np
import torch
from mpi4py import MPI
import tensorrt_llm
import tensorrt_llm.bindings
from tensorrt_llm._torch.distributed.communicator import Distributed, ReduceOp
from tensorrt_llm._utils import TensorWrapper, convert_to_torch_tensor, get_size_in_bytes, mpi_comm, mpi_disabled, torch_comm
from tensorrt_llm.bindings.internal.batch_manager.kv_cache_manager_v2_utils import IndexMapper, copy_batch_block_offsets_to_device
from tensorrt_llm.bindings.internal.runtime import TaskLayerModuleConfig
from tensorrt_llm.llmapi.llm_args import KvCacheConfig, PeftCacheConfig
from tensorrt_llm.lora_helper import LoraConfig
from tensorrt_llm.lora_manager import LoraManager, LoraModelConfig
from tensorrt_llm.math_utils import ceil_div
from tensorrt_llm.runtime import ModelConfig as ModelConfigPython
from tensorrt_llm.runtime.kv_cache_manager_v2 import DEFAULT_BEAM_INDEX, AttentionLayerConfig, BufferConfig, GpuCacheTierConfig, HostCacheTierConfig
from tensorrt_llm.runtime.kv_cache_manager_v2 import KVCacheManager as KVCacheManagerPy
from tensorrt_llm.runtime.kv_cache_manager_v2 import KVCacheManagerConfig as KVCacheManagerConfigPy
from tensorrt_llm.runtime.kv_cache_manager_v2 import LayerId, TokenIdExt, _KVCache
from tensorrt_llm.runtime.kv_cache_manager_v2._common import GPU_LEVEL
from tensorrt_llm.runtime.kv_cache_manager_v2._config import DataRole
from tensorrt_llm.runtime.kv_cache_manager_v2._utils import exact_div, typed_range
from tensorrt_llm.sampling_params import SamplingParams
from ..._utils import binding_to_str_dtype, get_size_in_bytes, mpi_rank, nvtx_range
from ...logger import logger
from ...mapping import CpType, Mapping
from .kv_cache_connector import KvCacheConnectorManager
from .llm_request import LlmRequest, LlmRequestState, SamplingConfig, get_draft_token_length
from .scheduler import ScheduledRequests
BufferManagerCpp = ...
KVCacheManagerCpp = ...
CacheTypeCpp = ...
ModelConfigCpp = ...
DataType = ...
KVCacheEventManagerCpp = ...
RequestList = ...
PeftCacheManagerCpp = ...
WorldConfig = ...
from tensorrt_llm._torch.attention_backend.interface import AttentionMetadata
TempAttentionWindowInputs = ...
BlocksPerWindow = ...

class ResourceManagerType(enum.Enum):
    ...

class Role:
    ...

def compute_page_count(token_count, tokens_per_page):
    ...

class BaseResourceManager(ABC):
    ...

def get_pp_layers(num_layers, mapping, spec_config=..., layer_mask=...):
    ...

def request_context(is_draft, scheduled_requests):
    ...

class KVCacheManager(BaseResourceManager):

    def __init__(self, kv_cache_config, kv_cache_type, *, num_layers, num_kv_heads, head_dim, tokens_per_block, max_seq_len, max_batch_size, mapping, dtype=..., spec_config=..., layer_mask=..., max_num_tokens=..., model_config=..., max_beam_width=..., is_draft=..., kv_connector_manager=..., enable_indexer_k_cache=..., indexer_k_cache_quant_block_size=..., indexer_k_cache_index_head_dim=..., is_estimating_kv_cache=..., execution_stream=..., **kwargs):
        ...

class KVCacheManagerV2(BaseResourceManager):

    def __init__(self, kv_cache_config, kv_cache_type, *, num_layers, num_kv_heads, head_dim, tokens_per_block, max_seq_len, max_batch_size, mapping, dtype=..., spec_config=..., layer_mask=..., vocab_size=..., max_num_tokens=..., model_config=..., max_beam_width=..., is_draft=..., kv_connector_manager=..., **kwargs):
        ...

class SlotManager:

    def __init__(self, max_num_requests):
        ...

class BlockManager:

    def __init__(self, num_blocks, tokens_per_block):
        ...

class ResourceManager:

    def __init__(self, resource_managers):
        ...

class PeftCacheManager(BaseResourceManager):

    def __init__(self, peft_cache_config, lora_config, model_config, world_config=..., execution_stream=...):
        ...
