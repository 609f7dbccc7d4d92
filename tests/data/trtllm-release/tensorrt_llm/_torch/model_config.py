# API skeleton of tensorrt_llm/_torch/model_config.py at NVIDIA/TensorRT-LLM@008e0af8980fc560003631ba4ac37828836a91c8: names and parameters only.
import contextlib
import errno
import json
import os
import struct
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Generic, Iterator, List, Optional, TypeVar
import filelock
import torch
import transformers
from transformers.utils import HF_MODULES_CACHE
from tensorrt_llm._torch.pyexecutor.config_utils import get_kimi_linear_num_attention_layers, get_qwen3_hybrid_num_attention_layers, is_kimi_linear, is_nemotron_hybrid, is_qwen3_hybrid, load_pretrained_config
from tensorrt_llm._utils import get_sm_version, is_sm_100f, torch_dtype_to_binding
from tensorrt_llm.bindings import LayerType as LayerTypeCpp
from tensorrt_llm.functional import AllReduceStrategy
from tensorrt_llm.llmapi.llm_args import DeepSeekSparseAttentionConfig, DeepSeekV4SparseAttentionConfig, KvCacheConfig, MoeLoadBalancerConfig, MultimodalConfig
from tensorrt_llm.logger import logger
from tensorrt_llm.mapping import Mapping
from tensorrt_llm.models.modeling_utils import QuantConfig
from tensorrt_llm.models.quant_config_utils import update_quant_config_from_compressed_tensors
from tensorrt_llm.quantization.mode import QuantAlgo
from tensorrt_llm.quantization.modelopt_config import is_modelopt_quant_config, read_modelopt_quant_config, warn_if_inline_diverges
from tensorrt_llm.bindings import ModelConfig as ModelConfigCpp
from tensorrt_llm.llmapi.llm_args import DecodingBaseConfig, KvCacheCompressionConfig, LoraConfig, SparseAttentionConfig, SpeculativeConfig
TConfig = ...
_DEEPSEEK_V4_ARCHITECTURES = ...
_DEEPSEEK_V4_ROUTED_EXPERT_WEIGHT = ...
_KIMI_K3_ARCHITECTURES = ...
_MINIMAX_M3_ARCHITECTURES = ...

def _is_lock_infra_error(exc):
    ...

def _release_lock_ignoring_infra_errors(lock):
    ...

def _try_take_lock(lock):
    ...

def hf_remote_code_lock(timeout=...):
    ...

@dataclass
class ModelConfig:
    pretrained_config: object
    mapping: object
    quant_config: object
    quant_config_dict: object
    skip_create_weights_in_init: object
    spec_config: object
    lm_head_gather_output: object
    lora_config: object
    sparse_attention_config: object
    kv_cache_compression_config: object
    is_generation: object
    is_encoder_decoder: object
    max_num_tokens: object
    max_seq_len: object
    moe_max_num_tokens: object
    moe_load_balancer: object
    attn_backend: object
    moe_backend: object
    moe_disable_finalize_fusion: object
    use_low_precision_moe_combine: object
    nvfp4_gemm_allowed_backends: object
    allreduce_strategy: object
    enable_min_latency: object
    use_cuda_graph: object
    force_dynamic_quantization: object
    extra_attrs: object
    use_cute_dsl_blockscaling_mm: object
    use_cute_dsl_blockscaling_bmm: object
    use_cute_dsl_bf16_bmm: object
    use_cute_dsl_bf16_gemm: object
    _frozen: object
    mm_encoder_only: object
    disable_mm_encoder: object
    video_pruning_rate: object
    multimodal_config: object

def _mirror_text_subconfig_attrs(pretrained_config):
    ...
