"""The TensorRT-LLM backend: TensorRT-LLM's PyTorch-flow modules, as TensorRT-LLM selects their kernels.

Each runner builds what serving builds (Linear with the checkpoint's QuantConfig, the TRTLLM attention
backend over a KV cache manager, create_moe with the backend TensorRT-LLM resolves, the MLA backend and the
DeepSeek MLA module, AllReduce with the AUTO strategy) and reads what TensorRT-LLM chose; where serving calls
TensorRT-LLM's torch ops itself (the FP8 per-tensor quantize ops, MLA's absorb BMMs) the runners call them the same
way (torch_ops.py checks the installed sources still do). tensorrt_llm is imported only inside the functions that
run on the GPU; NCCL is timed as the torch backend times it.

Both pins of pins.yaml (1.3.0rc20 and 1.3.0rc23) are served: every runner is registered for the versions it
was written and checked against (context.SERVED_VERSIONS, or fewer where an API differs), and the worker
looks runners up by the version it finds installed.
"""

from __future__ import annotations

from opcollect.backends.torch import comm
from opcollect.backends.trtllm import (
    allreduce,
    attention,
    dsa,
    encoder_attention,
    gemm,
    linear_attention,
    mhc,
    mla,
    mla_bmm,
    moe,
    msa,
    quantize,
)
from opcollect.backends.trtllm.context import installed_version
from opcollect.errors import FrameworkMissing
from opcollect.runtime import devices as hardware
from opcollect.runtime import timing
from opcollect.runtime.contract import ANY_DISPATCH, Measured, Registry, Runner
from opcollect.runtime.harness import TimingConfig

FRAMEWORK = "trtllm"
devices = hardware.devices
device_sm = hardware.device_sm
free_memory = hardware.free_memory
setup_worker = hardware.setup_worker


def identity(device: str) -> dict:
    try:
        version = installed_version()
    except ImportError:
        raise FrameworkMissing(
            FRAMEWORK, "TensorRT-LLM is not installed here: run TensorRT-LLM plans in the backend's pinned image"
        ) from None
    return {"framework": FRAMEWORK, "version": version, **hardware.probe(device)}


RUNNERS = Registry(FRAMEWORK)
# each op module lists its runners per op, each registered for the versions it serves (its version routes)
for _module in (
    gemm,
    attention,
    moe,
    mla,
    allreduce,
    quantize,
    mla_bmm,
    encoder_attention,
    mhc,
    dsa,
    msa,
    linear_attention,
):
    for _op, _runners in _module.RUNNERS.items():
        for _runner in _runners:
            RUNNERS.add(_op, _runner)
RUNNERS.add("comm", Runner(comm.footprint, measure_row=comm.measure_row))  # NCCL, as nccl-tests times it


def footprint(op: str, case) -> int:
    return RUNNERS.find(op, ANY_DISPATCH, installed_version()).footprint(case)


def measure(op: str, dispatch: str, cases: list, device: str, config: TimingConfig) -> list[Measured]:
    return timing.measure_cases(RUNNERS.find(op, dispatch, installed_version()), dispatch, cases, device, config)
