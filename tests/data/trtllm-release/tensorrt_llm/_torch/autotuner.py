# API skeleton of tensorrt_llm/_torch/autotuner.py at NVIDIA/TensorRT-LLM@index id 3648310208: names and parameters only.
import ast
import contextlib
import copy
import enum
import fcntl
import inspect
import itertools
import json
import os
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, Union
import torch
from cuda.bindings import driver
import tensorrt_llm
from tensorrt_llm._torch.distributed import Distributed
from tensorrt_llm._utils import nvtx_range
from tensorrt_llm.bindings.internal.runtime import delay_kernel
from tensorrt_llm.logger import logger
from tensorrt_llm.mapping import Mapping
PP_COMM_TAG_AUTOTUNING = ...

class DistributedTuningStrategy(enum.Enum):
    ...

@dataclass
class DynamicTensorSpec:
    input_idx: object
    dim_idx: object
    gen_tuning_buckets: object
    map_to_tuning_buckets: object

@dataclass
class ConstraintSpec:
    input_idx: object
    dim_idx: object
    infer_shape: object

@dataclass
class TuningConfig:
    dynamic_tensor_specs: object
    constraint_specs: object
    tune_max_num_tokens: object
    inputs_pre_hook: object
    use_cold_l2_cache: object
    use_cuda_graph: object
    distributed_tuning_strategy: object

@dataclass
class StaticDim:
    val: object

@dataclass
class DynamicDim:
    min: object
    opt: object
    max: object
Dim = ...

@dataclass
class OptimizationProfile:
    shapes: object

@dataclass
class FakeTensor:
    dtype: object
    device: object
    shape: object

class TunableRunner(ABC):
    ...

def autotune(tune_mode=..., cache_path=...):
    ...

@dataclass
class AutoTunerStatistics:
    cache_misses: object
    cache_miss_config_collection: object
    failed_profiling_count: object
    tuned_op_profiled_configs: object
    tuned_op_time_cost: object

class AutoTunerProfilingCache:

    def __init__(self):
        ...

class AutoTuner:

    def __init__(self, warmup=..., repeat=..., stream_delay_micro_secs=...):
        ...
