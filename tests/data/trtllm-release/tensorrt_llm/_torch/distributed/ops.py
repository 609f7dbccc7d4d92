# API skeleton of tensorrt_llm/_torch/distributed/ops.py at NVIDIA/TensorRT-LLM@0071496dc625910229bf433821453636ef3770eb: names and parameters only.
import math
import os
import platform
import threading
from typing import Dict, List, Optional, Tuple, Union
import torch
from torch import nn
from tensorrt_llm._mnnvl_utils import HelixCpMnnvlMemory, MnnvlMemory
from tensorrt_llm._torch.distributed.symm_mem_allreduce import SymmetricMemoryAllReduce
from tensorrt_llm._utils import mpi_comm, mpi_disabled
from tensorrt_llm.bindings import internal as _tllm_internal
from tensorrt_llm.bindings.internal.runtime import McastGPUBuffer
from tensorrt_llm.functional import AllReduceFusionOp, AllReduceParams, AllReduceStrategy, MoEAllReduceParams
from tensorrt_llm.logger import logger
from tensorrt_llm.mapping import Mapping
from tensorrt_llm.plugin.plugin import CustomAllReduceHelper
from ..flashinfer_utils import IS_FLASHINFER_AVAILABLE, get_current_flashinfer_allreduce_workspace
_thread_local = ...
from flashinfer.comm import vllm_all_reduce

def get_allreduce_workspace(mapping):
    ...

def allocate_low_presicion_allreduce_workspace(mapping):
    ...

def get_or_scale_allreduce_mnnvl_workspace(mapping, dtype, buffer_size_bytes=...):
    ...

def userbuffers_allreduce_finalize(input, force_applying_finalize=...):
    ...

def get_output_info(input, dim):
    ...

def filter_valid_input(input_list):
    ...

def restore_full_output(valid_outputs, valid_list):
    ...

def _allgather(input, group, rank, group_boxed=..., dim=..., sizes=...):
    ...

def allgather(input, mapping, dim=..., sizes=...):
    ...

def cp_allgather(input, mapping, dim=..., sizes=...):
    ...

def alltoall_helix(inputs, group):
    ...

class HelixAllToAllNative:

    def __init__(self, mapping, workspace, workspace_tensor):
        ...

def reducescatter(input, mapping, dim=..., sizes=...):
    ...

class MNNVLAllReduce(nn.Module):

    def __init__(self, mapping, dtype):
        ...

class AllReduce(nn.Module):

    def __init__(self, mapping, strategy=..., dtype=...):
        ...

class MoEAllReduce(nn.Module):

    def __init__(self, mapping):
        ...

class FlashInferVLLMAllReduce(nn.Module):

    def __init__(self, mapping, dtype):
        ...
