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

# serving's batch limits where `vllm serve` picks them on a GPU of at least 70 GiB that is no A100 (H100, H200,
# B200): engine/arg_utils.py:2404-2412 (OPENAI_API_SERVER)
SERVING_MAX_NUM_SEQS = 1024  # verified_on: vllm==0.24.0
SERVING_MAX_NUM_BATCHED_TOKENS = 8192
# the IR-op priority the CUDA platform sets when vLLM does not compile: its C kernels, then native
# (platforms/cuda.py:688-703); the reference collector installs vllm_c too (collector/vllm/utils.py
# enable_engine_fused_ops). Compiled serving fuses the native norm into Inductor kernels instead
EAGER_IR_PRIORITY = ("vllm_c", "native")  # verified_on: vllm==0.24.0


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


def serving_capture_sizes(
    max_num_seqs: int = SERVING_MAX_NUM_SEQS, max_num_batched_tokens: int = SERVING_MAX_NUM_BATCHED_TOKENS
) -> tuple[int, ...]:
    """The CUDA-graph batch sizes vLLM captures by default for these limits (config/vllm.py:1685-1741: balanced
    performance mode, no speculative decoding): 1, 2, 4, every 8 below 256, every 16 up to the largest size."""
    largest = min(max_num_seqs * 2, 512, max_num_batched_tokens)
    sizes = {s for s in (1, 2, 4) if s <= largest}
    if largest >= 8:
        sizes.update(range(8, min(largest + 1, 256), 8))
    if largest >= 256:
        sizes.update(range(256, largest + 1, 16))
    if max_num_batched_tokens <= largest:
        sizes.add(max_num_batched_tokens)
    return tuple(sorted(sizes))


def serving_batched_tokens(batch_size: int, num_tokens: int) -> int:
    """max_num_batched_tokens as serve_batch sets it: serving's, raised to the batch's tokens."""
    return max(num_tokens, batch_size, SERVING_MAX_NUM_BATCHED_TOKENS)


# how serving's model runner runs a batch when the model turns breakable CUDA graphs on (config/vllm.py:1077-1097:
# DeepSeek-V4, MiniMax-M3); its dispatcher (v1/cudagraph_dispatcher.py:272-324): FULL, one graph of the whole
# forward, for a uniform decode batch; PIECEWISE, vLLM's breakable graph, for any other batch; both up to the largest
# capture size; EAGER (CUDAGraphMode.NONE) above it
FULL, PIECEWISE, EAGER = "FULL", "PIECEWISE", "NONE"


def breakable_graph_mode(batch_size: int, query_len: int) -> str:
    """The CUDAGraphMode name serving runs a batch of ``batch_size`` requests of ``query_len`` new tokens each with,
    breakable CUDA graphs on and serving's capture sizes (serving_capture_sizes)."""
    if batch_size * query_len > serving_capture_sizes()[-1]:
        return EAGER
    return FULL if query_len == 1 else PIECEWISE


def serve_batch(config, batch_size: int, num_tokens: int) -> None:
    """Give ``config`` a served engine's sizes for a batch of ``batch_size`` sequences and ``num_tokens`` tokens,
    and the kernels an engine runs without compiling. Call it before building the layer and its metadata builder.

    - max_num_seqs: serving's, raised to the batch. VllmConfig() keeps 128 (config/scheduler.py:44), and the
      builders size persistent buffers from it: FA3's scheduler_metadata (v1/attention/backends/flash_attn.py:
      372-393, filled at :563-567), FLASH_ATTN_MLA's and FLASHMLA's, which assert on it (mla/flashattn_mla.py:
      236-243, mla/flashmla.py:190-199), FlashInfer's paged_kv_indptr (flashinfer.py:725-730, 900-906). The
      reference collector sets max_num_seqs=batch_size; at or under 1024 this is serving's config exactly.
    - max_num_batched_tokens: serving's, raised to the batch's tokens.
    - CUDA-graph capture sizes: serving's (serving_capture_sizes, largest 512). VllmConfig() without a model
      captures none, largest 0 (config/vllm.py:1680, 1795-1797), so FA3 and FLASH_ATTN_MLA would take FA3's own
      split heuristic and TRITON_ATTN would assert on the empty list (triton_attn.py:138-140); with
      serving's, a batch of at most 512 tokens gets serving's cap of 32 splits (flash_attn.py:448-458,
      config/attention.py:30; mla/flashattn_mla.py:211-221), a larger one the heuristic, as in serving.
    - custom ops all on and the RMSNorm IR ops on vLLM's C kernels (EAGER_IR_PRIORITY), installed as the worker
      installs them (v1/worker/worker_base.py:93-96). VllmConfig() under O2 turns custom ops off ("none",
      config/vllm.py:1148-1155) for Inductor to fuse the native code, and the IR ops stay native: run eagerly,
      as here, rope, norms and fp8 quant would be chains of small torch kernels. The reference collector sets
      custom_ops=["all"] and vllm_c norms (collector/vllm/utils.py create_vllm_config, enable_engine_fused_ops).
      Serving compiles these into Inductor kernels, fused with their neighbours: rows err a little high there.
      verified_on: vllm==0.24.0
    """
    from vllm.config.kernel import IrOpPriorityConfig
    from vllm.ir import set_default_torch_wrap

    scheduler = config.scheduler_config
    scheduler.max_num_batched_tokens = serving_batched_tokens(batch_size, num_tokens)
    scheduler.max_num_seqs = max(batch_size, SERVING_MAX_NUM_SEQS)
    compilation = config.compilation_config
    sizes = serving_capture_sizes()
    compilation.cudagraph_capture_sizes = list(sizes)
    compilation.max_cudagraph_capture_size = sizes[-1]
    # "+op"/"-op" entries (block fp8's "+quant_fp8", config/vllm.py:1129-1131) stay; "all" replaces "none"
    compilation.custom_ops = ["all", *(op for op in compilation.custom_ops if op not in ("all", "none"))]
    config.kernel_config.ir_op_priority = IrOpPriorityConfig.with_default(list(EAGER_IR_PRIORITY))
    config.kernel_config.ir_op_priority.set_default()
    set_default_torch_wrap(compilation.ir_enable_torch_wrap)
