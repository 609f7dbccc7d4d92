# API skeleton of tensorrt_llm/_torch/modules/mamba/gdn_mixer.py at NVIDIA/TensorRT-LLM@0d4bd901fb04656bf6b43236a6e4ddaa2994dad2: names and parameters only.
import functools
import os
import weakref
from typing import Optional
import torch
import triton
import triton.language as tl
from torch import nn
from transformers import Qwen3NextConfig
from tensorrt_llm._torch.modules.fla.fused_recurrent import fused_recurrent_gated_delta_rule_update
from tensorrt_llm._torch.modules.fla.fused_sigmoid_gating_recurrent import _can_use_flashinfer_gdn_verify, _flashinfer_gdn_verify, fused_sigmoid_gating_delta_rule_update
from tensorrt_llm.mapping import Mapping
from ...model_config import ModelConfig
from ..linear import FP8QDQLinearMethod, Linear, TensorParallelMode
from .causal_conv1d import causal_conv1d_fn, causal_conv1d_update
from .causal_conv1d_triton import causal_conv1d_update as causal_conv1d_update_triton
from .fuse_elementwise_ops import extract_transpose_prefill_slice, fused_gdn_post_conv, pack_gdn_decode_qkv
from .layernorm_gated import RMSNorm as RMSNormGated
from .mamba2_metadata import Mamba2Metadata

def _resolve_chunk_gated_delta_rule():
    ...

def chunk_gated_delta_rule(*args, **kwargs):
    ...

def gdn_custom_op_inplace(mixed_qkv, a, b, layer_idx, output):
    ...

def fused_gdn_gating_kernel(g, A_log, a, dt_bias, stride_a_row, NUM_HEADS, beta, threshold, BLK_HEADS):
    ...

def fused_gdn_gating(A_log, a, dt_bias, beta=..., threshold=...):
    ...

class Qwen3NextGatedDeltaNet(nn.Module):

    def __init__(self, model_config, aux_stream, layer_idx=...):
        ...
