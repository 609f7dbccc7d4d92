# API skeleton of tensorrt_llm/mapping.py at NVIDIA/TensorRT-LLM@index id 61759801786: names and parameters only.
from typing import List
import torch
from strenum import StrEnum
from torch.distributed import ProcessGroup
from tensorrt_llm._torch.device_mesh import DeviceMeshTopologyImpl
from tensorrt_llm._utils import mpi_disabled

class CpType(StrEnum):
    ...

class MappingBase:

    def __init__(self, world_size=..., rank=..., gpus_per_node=..., *, cp_size=..., cp_config=..., tp_size=..., pp_size=..., pp_partition=..., moe_cluster_size=..., moe_tp_size=..., moe_ep_size=..., attn_tp_size=..., attn_cp_size=..., enable_attention_dp=..., enable_lm_head_tp_in_adp=...):
        ...

class Mapping(MappingBase):

    def __init__(self, world_size=..., rank=..., gpus_per_node=..., *, cp_size=..., cp_config=..., tp_size=..., pp_size=..., pp_partition=..., moe_cluster_size=..., moe_tp_size=..., moe_ep_size=..., attn_tp_size=..., attn_cp_size=..., enable_attention_dp=..., enable_lm_head_tp_in_adp=...):
        ...

class MpiTopology(Mapping):

    def __init__(self, *args, **kwargs):
        ...

class DeviceMeshTopology(DeviceMeshTopologyImpl, Mapping):

    def __init__(self, *args, **kwargs):
        ...

class DraftMapping:

    def __init__(self, target_mapping, draft_tp_size, draft_moe_tp_size=..., draft_moe_ep_size=...):
        ...
