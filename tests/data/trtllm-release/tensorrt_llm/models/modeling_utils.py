# API skeleton of tensorrt_llm/models/modeling_utils.py at NVIDIA/TensorRT-LLM@01ea6d79d454bb3ab10c7510a6f706ba039090c2: names and parameters only.
import argparse
import copy
import dataclasses
import fnmatch
import json
import os
import re
from enum import IntFlag, auto
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, Generator, List, Optional, Union
import numpy as np
import safetensors
import torch
from .._common import default_net
from .._utils import QuantModeWrapper, get_init_params, numpy_to_torch, release_gc, str_dtype_to_torch, str_dtype_to_trt, trt_dtype_to_torch
from ..bindings import KVCacheType
from ..bindings.executor import RuntimeDefaults
from ..functional import PositionEmbeddingType, Tensor, allgather, constant, cp_split_plugin, gather_last_token_logits, index_select, tanh, view
from ..layers import MLP, AttentionParams, Embedding, FusedGatedMLP, FusedRgLru, GatedMLP, KeyValueCacheParams, LoraParams, PromptTuningEmbedding, RgLru
from ..layers.attention import Attention, BertAttention
from ..layers.linear import ColumnLinear, Linear, RowLinear
from ..layers.lora import Dora, Lora
from ..layers.moe import MOE, MoeOOTB
from ..logger import logger
from ..mapping import Mapping
from ..module import Module, ModuleList
from ..parameter import Parameter
from ..plugin import init_all_reduce_helper
from ..quantization import QuantMode
from ..quantization.functional import preprocess_weights_for_mixed_gemm
from ..quantization.layers import FP8Linear, Fp8RowwiseFusedGatedMLP, Fp8RowwiseGatedMLP, WeightOnlyGroupwiseQuantLinear, WeightOnlyGroupwiseQuantRowLinear, WeightOnlyQuantLinear, WeightOnlyQuantRowLinear
from ..quantization.mode import KV_CACHE_QUANT_ALGO_LIST, QUANT_ALGO_LIST, W8A8_SQ_PLUGIN_LIST, QuantAlgo
from ..quantization.utils.fp4_utils import float4_sf_dtype
from ..top_model_mixin import TopModelMixin
from .convert_utils import weight_only_quantize_dict
from .generation_mixin import GenerationMixin

@dataclass
class Gemma2ConfigGroup:
    query_pre_attn_scalar: object
    final_logit_softcapping: object
    attn_logit_softcapping: object

@dataclass
class Gemma3ConfigGroup:
    query_pre_attn_scalar: object
    final_logit_softcapping: object
    sliding_window_pattern: object
    rope_local_base_freq: object
    sliding_window: object
from typing import Type, TypeVar
from typing_extensions import Self
ConfigGroups = ...
CG = ...
RuntimeDefaultsIn = ...

class SpeculativeDecodingMode(IntFlag):
    ...

@dataclass
class QuantConfig:
    quant_algo: object
    kv_cache_quant_algo: object
    group_size: object
    smoothquant_val: object
    clamp_val: object
    use_meta_recipe: object
    has_zero_point: object
    pre_quant_scale: object
    exclude_modules: object

@dataclass
class LayerQuantConfig(QuantConfig):

    def __init__(self, *, quant_algo=..., kv_cache_quant_algo=..., quantized_layers=..., **kwargs):
        ...
    quant_algo: object
    kv_cache_quant_algo: object
    quantized_layers: object

class PretrainedConfig:

    def __init__(self, *, architecture, dtype, hidden_size, num_hidden_layers, num_attention_heads, vocab_size=..., hidden_act=..., logits_dtype=..., norm_epsilon=..., position_embedding_type=..., max_position_embeddings=..., rotary_embedding_dim=..., num_key_value_heads=..., intermediate_size=..., mapping=..., quantization=..., use_parallel_embedding=..., embedding_sharding_dim=..., head_size=..., qk_layernorm=..., runtime_defaults=..., **kwargs):
        ...

class DecoderLayerList(ModuleList):

    def __init__(self, cls, config):
        ...

class PostInitCaller(type):
    ...

class PretrainedModel(Module, GenerationMixin, TopModelMixin):

    def __init__(self, config):
        ...

class DecoderModelForCausalLM(PretrainedModel):

    def __init__(self, config, transformer, lm_head):
        ...

def fuse_gate_mlp(model, gemm_swiglu_plugin_dtype=..., low_latency_gemm_swiglu_plugin_dtype=...):
    ...

def unfuse_qkv_gemm(model):
    ...

def fuse_rg_lru(model):
    ...

def set_prompt_tuning(model):
    ...

def add_lora(model, max_lora_rank, with_dora=...):
    ...

def to_ootb_moe(model):
    ...

def parallelize_embedding(model):
    ...

def share_embedding(model):
    ...

def set_fp8_context_fhma(model):
    ...

def set_fuse_fp4_quant(model):
    ...

def optimize_model(model, use_parallel_embedding=..., share_embedding_table=..., use_ootb_moe=..., use_fused_mlp=..., gemm_swiglu_plugin_dtype=..., low_latency_gemm_swiglu_plugin_dtype=..., use_fused_rg_lru=..., use_unfused_qkv_gemm=..., use_prompt_tuning=..., use_lora=..., max_lora_rank=..., use_fp8_context_fmha=..., fuse_fp4_quant=..., use_optimize_cross_qkv=..., use_dora=...):
    ...

def optimize_cross_qkv(model):
    ...

def preprocess_perlayer_weights(weights, model_config, quant_algo, from_pruned=...):
    ...

def preprocess_weights(weights, model_config, from_pruned=...):
    ...

def get_kv_cache_type_from_legacy(use_cache, paged_kv_cache):
    ...

def save_config(config, *, output_dir, log):
    ...

def save_checkpoint(*, output_dir, weights, rank):
    ...
