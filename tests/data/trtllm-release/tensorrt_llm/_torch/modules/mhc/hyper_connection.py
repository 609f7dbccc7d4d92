# API skeleton of tensorrt_llm/_torch/modules/mhc/hyper_connection.py at NVIDIA/TensorRT-LLM@10ce7685b1fbf165e784a72f53350ee094d584d9: names and parameters only.
from dataclasses import dataclass
from typing import Optional
import torch
from torch import nn

@dataclass
class HCState:
    residual: object
    post_mix: object
    comb_mix: object
    x_prev: object
from tensorrt_llm._torch.modules.mhc.mhc_cuda import mhc_hc_head_cuda, mhc_post_mapping_cuda
from tensorrt_llm._torch.modules.mhc.mhc_cuda import mhc_fused_hc as mhc_fused_hc_cuda
from tensorrt_llm._torch.modules.mhc.mhc_cuda import mhc_pre_mapping_fused as mhc_pre_mapping_fused_cuda
_cuda_available = ...
_cuda_available = ...
mhc_hc_head_cuda = ...
mhc_post_mapping_cuda = ...
mhc_pre_mapping_fused_cuda = ...
mhc_fused_hc_cuda = ...

class mHC(nn.Module):

    def __init__(self, mult, hidden_size, sinkhorn_iters, dtype=..., eps=..., norm_eps=..., sinkhorn_eps=..., post_mult_value=..., n_splits=...):
        ...

class HCHead(nn.Module):

    def __init__(self, mult, hidden_size, eps=..., norm_eps=...):
        ...
