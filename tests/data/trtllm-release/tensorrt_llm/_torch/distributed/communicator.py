# API skeleton of tensorrt_llm/_torch/distributed/communicator.py at NVIDIA/TensorRT-LLM@index id 68312757152: names and parameters only.
import math
import os
import pickle
import threading
from abc import ABC, abstractmethod
from enum import IntEnum
from functools import lru_cache, wraps
from typing import Any, Callable, List, Optional, Tuple
import numpy as np
import torch
import torch.distributed as dist
from numpy.typing import ArrayLike
from torch.distributed.distributed_c10d import _object_to_tensor, _tensor_to_object
from mpi4py import MPI
MPI = ...
from tensorrt_llm._mnnvl_utils import init_helix_cp_comm
from tensorrt_llm._utils import local_mpi_size, mpi_allgather, mpi_barrier, mpi_comm, mpi_disabled, mpi_isend, mpi_isend_object, mpi_recv, mpi_recv_object, mpi_send, mpi_send_object, mpi_world_size, prefer_pinned, torch_pybind11_abi
from tensorrt_llm.bindings.BuildInfo import ENABLE_MULTI_DEVICE
from tensorrt_llm.bindings.internal.process_group import init_pg
from tensorrt_llm.logger import logger
from tensorrt_llm.mapping import Mapping
import ray
from tensorrt_llm.executor.ray import stub as ray

class ReduceOp(IntEnum):
    ...
_reduce_op_to_torch_dict = ...

def _check_reduce_op(op):
    ...

def reduce_op_to_torch(op):
    ...
_reduce_op_to_mpi_dict = ...

def reduce_op_to_mpi(op):
    ...

class Distributed(ABC):

    def __init__(self, mapping):
        ...

def safe_broadcast(comm, obj, root=..., chunk_size=...):
    ...

def _serialize_and_exchange_lengths(comm, obj):
    ...

def _chunked_transfer_loop(comm, rank, size, lengths, displs, sendbuf, num_rounds, chunk_size, recvbuf, collective_fn):
    ...

def _deserialize_recvbuf(recvbuf, lengths, displs, size):
    ...

def safe_gather(comm, obj, root=..., chunk_size=...):
    ...

def safe_allgather(comm, obj, chunk_size=...):
    ...

class MPIDist(Distributed):

    def __init__(self, mapping):
        ...

class MultiHandleWrapper:

    def __init__(self, handles):
        ...

class TorchDist(Distributed):

    def __init__(self, mapping):
        ...

class PPCommNCCL:

    def __init__(self, global_mapping):
        ...

class PPCommTorch:

    def __init__(self, global_mapping):
        ...
_pp_comm = ...

def init_pp_comm(mapping):
    ...

def pp_recv(tensor):
    ...

def pp_send(tensor):
    ...

def pp_recv_tensors(tensors):
    ...

def pp_send_tensors(tensors):
    ...
