# API skeleton of tensorrt_llm/_torch/modules/linear.py at NVIDIA/TensorRT-LLM@00bbf71e796406ea8593a77cbfb828356182db16: names and parameters only.
from __future__ import annotations
import enum
import math
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Dict, List, Optional, Union
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parameter import Parameter
import tensorrt_llm.quantization.utils.fp4_utils as fp4_utils
from tensorrt_llm._torch.custom_ops.torch_custom_ops import BufferKind
from tensorrt_llm._torch.peft.lora.layer import LoraLayer
from tensorrt_llm._utils import is_device_integrated, mpi_disabled
from tensorrt_llm.bindings import ipc_nvls_supported
from tensorrt_llm.functional import AllReduceFusionOp, AllReduceParams, AllReduceStrategy
from tensorrt_llm.logger import logger
from tensorrt_llm.mapping import Mapping
from tensorrt_llm.quantization.functional import preprocess_weights_for_mixed_gemm
from tensorrt_llm.quantization.mode import QuantAlgo
from tensorrt_llm.quantization.utils.fp8_utils import per_token_quant_and_transform, resmooth_to_fp8_e8m0, transform_sf_into_required_layout
from ..._utils import get_sm_version, is_sm_100f
from ...models.modeling_utils import QuantConfig
from ..utils import Fp4QuantizedTensor, get_model_extra_attrs, replace_parameter_and_save_metadata, unswizzle_sf

class WeightMode(str, enum.Enum):
    ...

@dataclass
class WeightsLoadingConfig:
    weight_mode: object
    ignore_tensor_parallel: object

class TensorParallelMode(str, enum.Enum):
    ...

def load_weight_shard(weight, tensor_parallel_size=..., tensor_parallel_rank=..., tensor_parallel_mode=..., device=..., return_slice_indices=...):
    ...

def copy_weight(dst, src):
    ...

def copy_weight_shard(dst, src, shard_offset, shard_size):
    ...

def load_weights_vanilla_helper(module, weights, weight_transform=..., bias_transform=..., allow_partial_loading=...):
    ...

def load_weights_fused_qkv_helper(module, weights, weight_transform=..., bias_transform=..., allow_partial_loading=...):
    ...

def load_weights_fused_gate_up_helper(module, weights, weight_transform=..., bias_transform=..., allow_partial_loading=...):
    ...

def get_weight_dtype_and_id(module):
    ...

class LinearMethodBase(ABC):
    ...

class UnquantizedLinearMethod(LinearMethodBase):
    ...

class FP8QDQLinearMethod(UnquantizedLinearMethod):
    ...

class FP8RowwiseLinearMethod(UnquantizedLinearMethod):
    ...

class FP8BlockScalesLinearMethod(UnquantizedLinearMethod):
    ...

class NVFP4LinearMethod(LinearMethodBase):
    ...

class W4A8NVFP4FP8LinearMethod(LinearMethodBase):
    ...

class W4A8MXFP4FP8LinearMethod(LinearMethodBase):
    ...

class WeightOnlyQuantLinearMethod(LinearMethodBase):
    ...

class W4A16_AWQ_LinearMethod(LinearMethodBase):
    ...

class W4A8_AWQ_LinearMethod(LinearMethodBase):
    ...

class W4A8MXFP4MXFP8LinearMethod(W4A8MXFP4FP8LinearMethod):
    ...

def get_quant_method(quant_config=...):
    ...

class Linear(nn.Module):

    def __init__(self, in_features, out_features, bias=..., dtype=..., mapping=..., tensor_parallel_mode=..., gather_output=..., quant_config=..., weights_loading_config=..., reduce_output=..., skip_create_weights_in_init=..., use_custom_cublas_mm=..., lora=..., allreduce_strategy=..., force_dynamic_quantization=..., use_cute_dsl_blockscaling_mm=..., disable_deep_gemm=..., fused_weight_shard_indices_mapping=..., nvfp4_allowed_backends=..., enable_gemm_allreduce_fusion=...):
        ...

class NVFP4ARCLinearMethod(NVFP4LinearMethod):
    ...
