# API skeleton of tensorrt_llm/_torch/metadata.py at NVIDIA/TensorRT-LLM@10637b323e2039a7ef882fef7feae1feeb5f6219: names and parameters only.
from dataclasses import dataclass, field
from enum import Enum
from typing import Dict, List, Optional, Union
import torch
from tensorrt_llm.sampling_params import LogitsProcessor

@dataclass
class KVCacheParams:
    use_cache: object
    num_cached_tokens_per_seq: object
    block_ids_per_seq: object
    host_max_attention_window_sizes: object
    host_sink_token_length: object
    num_extra_kv_tokens: object

class CacheType(Enum):
    ...

@dataclass
class SequenceGroup:
    logits_processors: object
    batch_indices: object
    request_ids: object
    past_token_ids: object
    stream_ptr: object
    client_id: object

@dataclass
class LogitsProcessorMetadata:
    seq_groups: object
