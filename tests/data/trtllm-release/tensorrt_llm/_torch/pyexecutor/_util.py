# API skeleton of tensorrt_llm/_torch/pyexecutor/_util.py at NVIDIA/TensorRT-LLM@0004396720054fd8e205cbf616f21f0b57c6b412: names and parameters only.
import copy
import dataclasses
import os
from typing import Any, Dict, List, Optional, Sequence, Union
import torch
import tensorrt_llm
from tensorrt_llm.llmapi.llm_args import CacheTransceiverConfig, KvCacheConfig, SparseAttentionConfig
from tensorrt_llm.logger import logger
from tensorrt_llm.mapping import CpType, Mapping
from ..attention.backends import get_sparse_attn_kv_cache_manager
from ..model_config import ModelConfig
from .resource_manager import KVCacheManager
GB = ...

def ceil_div(a, b):
    ...

def _non_hybrid_kv_cache_manager_cls(config, kv_cache_config):
    ...

def get_kv_cache_manager_cls(model_config, kv_cache_config, is_disagg=..., cache_transceiver_config=...):
    ...
