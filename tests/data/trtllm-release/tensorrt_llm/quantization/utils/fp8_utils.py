# API skeleton of tensorrt_llm/quantization/utils/fp8_utils.py at NVIDIA/TensorRT-LLM@index id 1112088312: names and parameters only.
from typing import Optional, Tuple
import torch
from tensorrt_llm._utils import nvtx_range

def ceil_div(x, y):
    ...

def align(x, y):
    ...

def ceil_to_ue8m0(x):
    ...

def per_token_cast_to_fp8_e8m0(x):
    ...

def per_block_cast_to_fp8_e8m0(x):
    ...

def resmooth_to_fp8_e8m0(weight, sf):
    ...

def get_m_alignment_for_contiguous_layout():
    ...

def get_tma_aligned_size(x, element_size):
    ...

def get_col_major_tma_aligned_packed_tensor(x):
    ...

def check_sf_layout(sf, mn, k, gran, num_groups, tma_stride_check=..., type_check=...):
    ...

def transform_sf_into_required_layout(sf, mn, k, recipe, num_groups=..., is_sfa=...):
    ...

def per_token_quant_and_transform(input, quant_group_size=..., scale_ue8m0=..., need_permute102=...):
    ...
