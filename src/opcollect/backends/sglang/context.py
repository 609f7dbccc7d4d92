"""SGLang's process-wide state for one worker: a world of one rank with SGLang's model-parallel groups, and the
global ServerArgs (with the backend choices a scheduler derives from it) while a runner builds and calls SGLang's
layers. It runs inside the worker; sglang and torch are imported inside the functions.

SGLang 0.5.14 reads all of it even for one GPU (paths relative to the wheel's sglang/srt/): every parallel
linear and FusedMoE reads the TP/EP group sizes (distributed/parallel_state.py), RadixAttention and the
DP-attention helpers assert dp attention was initialised (layers/dp_attention.py:360-362), and kernels read
get_global_server_args() (server_args.py:7180-7195), e.g. the fused MoE Triton config. The per-forward
ForwardContext (model_executor/forward_context.py) is not set here: the attention runners set it per call with
SGLang's own ``forward_context`` manager, which restores the previous one itself.
"""

from __future__ import annotations

import os
import socket
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Iterator

_initialised: set[str] = set()  # devices whose process already joined its one-rank world
_args_cache: dict[tuple, object] = {}  # ServerArgs per (device, fields): a runner re-enters the context per call
MODEL_PATH = "dummy"  # ServerArgs.__post_init__ returns early for it (server_args.py:2485-2487): no checkpoint read
# DeepGEMM's JIT would otherwise compile every M from 1 to 16384 on the first call of each (n, k) ("typically
# 10-20 mins", layers/deep_gemm_wrapper/compile_utils.py:113-150), far past a case's timeout. SGLang reads the flag
# once, into compile_utils._ENABLE_JIT_DEEPGEMM_PRECOMPILE when that module is imported (compile_utils.py:31, via
# environ.py:553 envs.SGLANG_JIT_DEEPGEMM_PRECOMPILE), so both the variable and the module's copy are set. The
# reference collector sets the variable to 0 before importing SGLang (collector/sglang/collect_gemm.py:19).
DEEPGEMM_PRECOMPILE = "SGLANG_JIT_DEEPGEMM_PRECOMPILE"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _server_args(device: str, **server_args):
    """ServerArgs for a model SGLang does not look at: only the fields given (and the defaults of the rest) hold,
    none of the model-specific adjustments run, so the runners pass the backend SGLang would pick explicitly."""
    import torch
    from sglang.srt.server_args import ServerArgs

    server_args.setdefault("device", torch.device(device).type)
    key = (device, repr(sorted(server_args.items())))
    if key not in _args_cache:
        _args_cache[key] = ServerArgs(model_path=MODEL_PATH, **server_args)
    return _args_cache[key]


def init_world(device: str) -> None:
    """Join a world of one rank, tp = pp = ep = 1, as ModelRunner.init_torch_distributed does
    (model_executor/model_runner.py:1216-1240): init_distributed_environment, initialize_model_parallel,
    initialize_dp_attention. Once per worker process."""
    if device in _initialised:
        return
    import torch
    from sglang.srt.distributed.parallel_state import (
        init_distributed_environment,
        initialize_model_parallel,
        model_parallel_is_initialized,
    )
    from sglang.srt.layers.dp_attention import initialize_dp_attention

    local_rank = torch.device(device).index or 0
    if torch.device(device).type == "cuda":
        torch.cuda.set_device(local_rank)
    if not model_parallel_is_initialized():
        init_distributed_environment(
            world_size=1,
            rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
            local_rank=local_rank,
            backend="nccl" if torch.device(device).type == "cuda" else "gloo",
        )
        initialize_model_parallel(
            tensor_model_parallel_size=1, expert_model_parallel_size=1, pipeline_model_parallel_size=1
        )
    # dp attention off (dp_size 1): sets _ATTN_DP_SIZE = 1 and the gathered-buffer metadata
    # (layers/dp_attention.py:279-320); it reads only hf_config, hidden_size and dtype of the model config
    model = SimpleNamespace(hf_config=SimpleNamespace(), hidden_size=1, dtype=torch.bfloat16)
    initialize_dp_attention(server_args=_server_args(device), model_config=model)
    _initialised.add(device)


@contextmanager
def sglang_context(device: str, **server_args) -> Iterator[object]:
    """The global ServerArgs ServerArgs(model_path="dummy", **server_args) on ``device``, yielded.

    Sets, and on exit restores to what they were before, these process-wide objects:
    - sglang.srt.server_args._global_server_args, installed with set_global_server_args_for_scheduler as the
      model runner does (model_executor/model_runner.py:526);
    - the MoE globals of sglang.srt.layers.moe.utils (MOE_RUNNER_BACKEND, MOE_A2A_BACKEND, ...), the FP8 and FP4
      GEMM runner backends (layers/quantization/fp8_utils.py:235, fp4_utils.py:146), all three derived from the
      server args as the scheduler does (managers/scheduler.py:752-756: initialize_moe_config,
      initialize_fp8_gemm_config, initialize_fp4_gemm_config, which resolve "auto" per SM there);
    - torch's default dtype, bf16 as the model loader sets it while layers are built
      (model_loader/loader.py:756, set_default_torch_dtype);
    - DeepGEMM's JIT precompile switch, off: the SGLANG_JIT_DEEPGEMM_PRECOMPILE variable, set before SGLang is
      imported here, and sglang.srt.layers.deep_gemm_wrapper.compile_utils._ENABLE_JIT_DEEPGEMM_PRECOMPILE.
    The one-rank world (init_world) is joined once and kept for the worker's life.
    """
    precompile = os.environ.get(DEEPGEMM_PRECOMPILE)
    os.environ[DEEPGEMM_PRECOMPILE] = "0"  # before the first import of compile_utils, which reads it
    try:
        with _installed(device, server_args) as args:
            yield args
    finally:
        if precompile is None:
            os.environ.pop(DEEPGEMM_PRECOMPILE, None)
        else:
            os.environ[DEEPGEMM_PRECOMPILE] = precompile


@contextmanager
def _installed(device: str, server_args: dict) -> Iterator[object]:
    import sglang.srt.layers.deep_gemm_wrapper.compile_utils as deep_gemm_compile
    import sglang.srt.layers.moe.utils as moe_utils
    import sglang.srt.layers.quantization.fp4_utils as fp4_utils
    import sglang.srt.layers.quantization.fp8_utils as fp8_utils
    import sglang.srt.server_args as server_args_module
    import torch
    from sglang.srt.layers.moe import initialize_moe_config
    from sglang.srt.layers.quantization.fp4_utils import initialize_fp4_gemm_config
    from sglang.srt.layers.quantization.fp8_utils import initialize_fp8_gemm_config
    from sglang.srt.server_args import set_global_server_args_for_scheduler

    init_world(device)
    args = _server_args(device, **server_args)
    moe_names = [name for name in vars(moe_utils) if name.isupper() and not name.startswith("_")]
    saved = [
        (server_args_module, ["_global_server_args"]),
        (moe_utils, moe_names),
        (fp8_utils, ["FP8_GEMM_RUNNER_BACKEND"]),
        (fp4_utils, ["FP4_GEMM_RUNNER_BACKEND"]),
        (deep_gemm_compile, ["_ENABLE_JIT_DEEPGEMM_PRECOMPILE"]),
    ]
    previous = [(module, {name: getattr(module, name) for name in names}) for module, names in saved]
    dtype = torch.get_default_dtype()
    try:
        deep_gemm_compile._ENABLE_JIT_DEEPGEMM_PRECOMPILE = False  # imported earlier than this context, maybe
        set_global_server_args_for_scheduler(args)
        initialize_moe_config(args)
        initialize_fp8_gemm_config(args)
        initialize_fp4_gemm_config(args)
        torch.set_default_dtype(torch.bfloat16)
        yield args
    finally:
        torch.set_default_dtype(dtype)
        for module, values in previous:
            for name, value in values.items():
                setattr(module, name, value)


@contextmanager
def rank_topology(**fields: int) -> Iterator[None]:
    """Make SGLang's layers see the given parallel sizes and ranks (moe_ep_size, moe_tp_size, ...) while the one-rank
    world stays what it is: SGLang's own get_parallel().override (runtime_context.py:86-100), which the MoE layer,
    its dispatcher and quant methods read (layers/moe/fused_moe_triton/layer.py:197-200,
    token_dispatcher/standard.py:90,112) and which restores the previous values on exit."""
    from sglang.srt.runtime_context import get_parallel

    with get_parallel().override(**fields):
        yield
