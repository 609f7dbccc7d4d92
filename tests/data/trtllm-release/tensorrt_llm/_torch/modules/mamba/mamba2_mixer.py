# API skeleton of tensorrt_llm/_torch/modules/mamba/mamba2_mixer.py at NVIDIA/TensorRT-LLM@02140fd43556cd6117a5798ba57a2f30603608c1: names and parameters only.
import functools
import os
import torch
from einops import rearrange, repeat
from flashinfer.mamba import selective_state_update as selective_state_update_fi
from torch import nn
from tensorrt_llm._torch.modules.mamba.mamba2_metadata import Mamba2Metadata
from tensorrt_llm.mapping import Mapping
from ...model_config import ModelConfig
from ..linear import Linear, TensorParallelMode
from .causal_conv1d import causal_conv1d_fn, causal_conv1d_update
from .causal_conv1d_triton import causal_conv1d_update as causal_conv1d_update_triton
from .fuse_elementwise_ops import extract_transpose_xbc_prefill, fused_split_rearrange_after_conv1d
from .layernorm_gated import RMSNorm as RMSNormGated
from .selective_state_update import selective_state_update as selective_state_update_native
from .ssd_combined import mamba_chunk_scan_combined

class Mamba2Mixer(nn.Module):

    def __init__(self, *, d_model, d_state, d_conv, nheads, n_groups, head_dim, chunk_size, layer_idx, bias=..., conv_bias=..., delta_rank=..., delta_softplus=..., remove_padding=..., apply_silu=..., rms_norm_eps=..., dtype=..., config=..., use_custom_cublas_mm=...):
        ...

def _cached_arange(n, device):
    ...
