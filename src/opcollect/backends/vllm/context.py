"""vLLM's process-wide state for one worker: a world of one rank, and the current VllmConfig while a runner
builds and calls its layers. It runs inside the worker; vllm is imported inside the functions.

vLLM 0.24.0 needs both even for one GPU: every weight parameter reads the tensor-parallel rank when it is
created (model_executor/parameter.py:65-66), initialize_model_parallel reads the current config
(distributed/parallel_state.py:1727-1729), and custom ops read its compilation config while layers are built
(config/vllm.py:2246-2262). A model_config stands in for a checkpoint's: Fp8LinearMethod reads its dtype
(model_executor/layers/quantization/fp8.py:285), and DeepGEMM's block-fp8 kernel refuses a layer without one
and reads hf_text_config.model_type (model_executor/kernels/linear/scaled_mm/deep_gemm.py:69-76), which
would silently fall back to CUTLASS. The reference collector sets the same stand-in
(collector/vllm/collect_gemm.py:203-210).
"""

from __future__ import annotations

import socket
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Iterator

_initialised: set[str] = set()  # devices whose process already joined its one-rank world


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def init_world(device: str) -> None:
    """Join a world of one rank with tensor and pipeline parallel size 1, once per worker process."""
    if device in _initialised:
        return
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment

    local_rank = torch.device(device).index or 0
    init_distributed_environment(
        world_size=1,
        rank=0,
        distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
        local_rank=local_rank,
        backend="nccl",
    )
    with set_current_vllm_config(VllmConfig(), check_compile=False):
        ensure_model_parallel_initialized(1, 1)
    _initialised.add(device)


def model_stand_in(dtype) -> SimpleNamespace:
    """The parts of a ModelConfig the runners' layers read, for a model of activation ``dtype``."""
    return SimpleNamespace(
        dtype=dtype, hf_text_config=SimpleNamespace(model_type=""), model="opcollect", quantization_config=None
    )


@contextmanager
def vllm_context(device: str, quant_config=None, max_num_batched_tokens: int | None = None) -> Iterator[object]:
    """The current VllmConfig for building and calling layers on ``device``: bf16 activations, and
    ``quant_config`` as a served checkpoint's (serving passes it, which enables the CUDA fp8 quant op for
    block-fp8 weights: config/vllm.py:1114-1131)."""
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config

    init_world(device)
    config = VllmConfig(quant_config=quant_config)
    config.model_config = model_stand_in(torch.bfloat16)
    if max_num_batched_tokens is not None:
        config.scheduler_config.max_num_batched_tokens = max_num_batched_tokens
    with set_current_vllm_config(config, check_compile=False):
        yield config
