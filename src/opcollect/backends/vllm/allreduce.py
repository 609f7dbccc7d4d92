"""vLLM 0.24.0's own all-reduce, `tensor_model_parallel_all_reduce`, to custom_allreduce_perf.

One task times a whole row of cases (one allreduce_dtype, num_gpus and variant): starting the ranks and
vLLM's communicators costs seconds. The structure is the torch backend's NCCL runner (backends/torch/comm.py):
one spawned process per rank on cuda:0..num_gpus-1, a TCP rendezvous, a lifeline to the parent, and each
sample's seconds per call agreed as the maximum over the ranks, so the stopping rule runs on identical numbers
in every rank and all ranks stop together. Each rank joins vLLM's world with tensor-parallel size num_gpus, as a
serving worker does, so vLLM builds its own device communicator for the TP group and picks, per call, between
NCCL symmetric memory, FlashInfer, custom all-reduce, torch symmetric memory and pynccl
(distributed/device_communicators/cuda_communicator.py:254-311). vllm is imported only inside the ranks.

The variants, as the reference names them (aiconfigurator collect_all_reduce.py:674-691):
- vllm_graph: K all-reduces captured inside vLLM's ``graph_capture`` into one CUDA graph, timed by replays;
- vllm_eager: K direct calls back to back.
The kernel_source stays the variant's name, as in the reference, at every size, also where vLLM runs another
communicator than custom all-reduce (above custom all-reduce's max_size, see custom_ar_max_bytes); what vLLM
ran is read from its communicator objects and returned as Measured.ran, beside what expected_communicator
predicts (Measured.expected).
"""

from __future__ import annotations

import sys
from functools import partial

from opcollect.backends.torch.comm import (
    all_reduce_input,
    case_bytes,
    run_all_reduce_row,
    serve_rank,
    time_all_reduce,
)
from opcollect.runtime.contract import Measured
from opcollect.runtime.devices import device_sm
from opcollect.runtime.harness import TimingConfig

KERNEL_SOURCES = {"vllm_graph": "vLLM_custom_graph", "vllm_eager": "vLLM_custom_eager"}  # plans/comm.py VARIANTS
RANK_START_SECONDS = 300.0  # vLLM's start: NCCL, custom all-reduce's P2P test (custom_all_reduce.py:160-166)
MiB = 1 << 20
# custom_all_reduce.py:52 and :59: the world sizes it serves and its default max_size
CUSTOM_AR_WORLD_SIZES = (2, 4, 6, 8)
CUSTOM_AR_DEFAULT_MAX = 8 * MiB
# all_reduce_utils.py:31-37 (CUSTOM_ALL_REDUCE_MAX_SIZES): with torch symmetric memory enabled (the default,
# VLLM_ALLREDUCE_USE_SYMM_MEM=1, envs.py:1671-1673) max_size is min(this, 8 MiB) (custom_all_reduce.py:123-133)
CUSTOM_AR_SYMM_CAP = {
    "9.0": {2: 64 * MiB, 4: 32 * MiB, 6: MiB // 2, 8: MiB // 4},
    "10.0": {2: 2 * MiB, 4: 2 * MiB, 6: MiB, 8: MiB},
    "10.3": {2: 4 * MiB, 4: 4 * MiB, 6: 8 * MiB, 8: 4 * MiB},
}
# all_reduce_utils.py:52-58 (SYMM_MEM_ALL_REDUCE_MAX_SIZES): the largest message SymmMemCommunicator takes
SYMM_MEM_MAX = {
    "9.0": {2: 64 * MiB, 4: 32 * MiB, 6: 64 * MiB, 8: 64 * MiB},
    "10.0": {2: 8 * MiB, 4: 32 * MiB, 6: 128 * MiB, 8: 128 * MiB},
    "10.3": {2: 4 * MiB, 4: 32 * MiB, 6: 32 * MiB, 8: 64 * MiB},
}
# custom_all_reduce.py:172-174: rank_data, the table of registered IPC pointers, on every rank
CUSTOM_AR_RANK_DATA = 8 * MiB
META_ALLOWANCE = MiB  # ops.meta_size() (sizeof vllm::Signal in csrc, not read here): well under 1 MiB


def rank_devices(num_gpus: int) -> list[str]:
    return [f"cuda:{rank}" for rank in range(num_gpus)]


def capability(sm: str) -> str:
    """A plan's SM ('90', '100', '103') as vLLM's tables key it ('9.0', '10.0', '10.3')."""
    return f"{int(sm) // 10}.{int(sm) % 10}"


def custom_ar_max_bytes(world: int, sm: str, symm_mem: bool = True) -> int:
    """CustomAllreduce.max_size for this world size and SM (custom_all_reduce.py:59, 123-133)."""
    cap = CUSTOM_AR_SYMM_CAP.get(capability(sm), {}) if symm_mem else {}
    return min(cap.get(world, CUSTOM_AR_DEFAULT_MAX), CUSTOM_AR_DEFAULT_MAX)


def custom_ar_eligible(world: int, nbytes: int, sm: str, symm_mem: bool = True) -> bool:
    """should_custom_ar (custom_all_reduce.py:105-113, 230-243), for NVLink-connected GPUs that pass the P2P
    test; symm_mem: whether vLLM's SymmMemCommunicator came up (it caps max_size)."""
    return world in CUSTOM_AR_WORLD_SIZES and nbytes % 16 == 0 and nbytes < custom_ar_max_bytes(world, sm, symm_mem)


def expected_communicator(world: int, dtype: str, nbytes: int, sm: str, symm_mem: bool = True) -> str:
    """What cuda_communicator.py:254-311 picks with vLLM's defaults (no NCCL symm-mem, no FlashInfer AR)."""
    if custom_ar_eligible(world, nbytes, sm, symm_mem):
        return "custom_allreduce"
    limit = SYMM_MEM_MAX.get(capability(sm), {}).get(world, 0)
    if symm_mem and dtype == "bfloat16" and nbytes % 4 == 0 and nbytes <= limit:  # symm_mem.py:116-124: bf16 only
        return "torch_symm_mem"
    return "pynccl"


def footprint(case) -> int:
    """Bytes per rank: the input, two live outputs (vLLM's all-reduce is out of place; a graph's pool reuses the
    freed ones), custom all-reduce's two IPC buffers of max_size (meta + signal, and the eager copy-in buffer)
    and rank_data (custom_all_reduce.py:160-174), and torch symmetric memory's buffer (symm_mem.py:88-92),
    each at its largest over the SMs since the case does not name one. NCCL's own buffers are not counted."""
    nbytes = case_bytes(case)
    world = case.num_gpus
    if world not in CUSTOM_AR_WORLD_SIZES:
        return 3 * nbytes
    symm = max(table.get(world, 0) for table in SYMM_MEM_MAX.values())
    return 3 * nbytes + 2 * CUSTOM_AR_DEFAULT_MAX + META_ALLOWANCE + CUSTOM_AR_RANK_DATA + symm


def measure_row(cases: list, device: str, config: TimingConfig) -> list[Measured]:
    return run_all_reduce_row(cases, device, config, _rank_main, "vLLM", KERNEL_SOURCES, RANK_START_SECONDS)


def _init_world(rank: int, world: int, port: int) -> None:
    """context.init_world for ``world`` ranks: tensor-parallel size world, pipeline size 1, as serving's worker
    (v1/worker/gpu_worker.py) sets it up; custom all-reduce stays enabled (parallel_state.py:1432-1437)."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment

    init_distributed_environment(
        world_size=world,
        rank=rank,
        distributed_init_method=f"tcp://127.0.0.1:{port}",
        local_rank=rank,
        backend="nccl",
    )
    with set_current_vllm_config(VllmConfig(), check_compile=False):  # read by parallel_state.py:1727-1729
        ensure_model_parallel_initialized(world, 1)


def _rank_main(rank, world, port, payload, config, results, parent_pid) -> None:
    serve_rank(
        rank, payload, config, results, parent_pid, partial(_init_world, rank, world, port), _parallel, _time_one
    )


def _parallel():
    from vllm.distributed import destroy_model_parallel, get_tp_group

    return get_tp_group, destroy_model_parallel


def communicator_used(comm, x, nccl_symm_mem) -> str:
    """Which communicator vLLM's TP device communicator ``comm`` runs for ``x``, asked of the objects it built in
    the order of cuda_communicator.py:254-311; nccl_symm_mem: vLLM's should_nccl_symm_mem_allreduce."""
    if comm is None:
        return "none"
    pynccl = getattr(comm, "pynccl_comm", None)
    if pynccl is not None and nccl_symm_mem(pynccl.world_size, x):
        return "nccl_symm_mem"
    for name, attr, asks in (
        ("quick_reduce", "qr_comm", "should_quick_allreduce"),
        ("flashinfer", "fi_ar_comm", "should_use_fi_ar"),
        ("custom_allreduce", "ca_comm", "should_custom_ar"),
        ("torch_symm_mem", "symm_mem_comm", "should_use_symm_mem"),
    ):
        part = getattr(comm, attr, None)
        if part is not None and not part.disabled and getattr(part, asks)(x):
            return name
    return "pynccl" if pynccl is not None and not pynccl.disabled else "torch.distributed"


def _capture(x, calls: int, device: str):
    """One CUDA graph of ``calls`` all-reduces of ``x``, captured as vLLM's model runner captures: inside
    graph_capture, which enters custom all-reduce's capture mode and registers the graph's buffers on exit
    (parallel_state.py:1411-1429, custom_all_reduce.py:197-228)."""
    import torch
    from vllm.distributed import graph_capture, tensor_model_parallel_all_reduce

    graph = torch.cuda.CUDAGraph()
    with graph_capture(torch.device(device)) as ctx:
        # warm-up outside the stream capture: pynccl and symm-mem run for real (NCCL's lazy setup), custom
        # all-reduce only allocates (custom_all_reduce.py:264-275)
        tensor_model_parallel_all_reduce(x)
        with torch.cuda.graph(graph, stream=ctx.stream):
            for _ in range(calls):
                out = tensor_model_parallel_all_reduce(x)  # out of place: each freed output is reused in the pool
        del out
    torch.cuda.synchronize()
    return graph


def _time_one(case: dict, device: str, config: TimingConfig, cpu_group) -> Measured:
    from vllm.distributed import get_tp_group, tensor_model_parallel_all_reduce
    from vllm.distributed.device_communicators.all_reduce_utils import should_nccl_symm_mem_allreduce

    x = all_reduce_input(case, device)
    communicator = communicator_used(get_tp_group().device_communicator, x, should_nccl_symm_mem_allreduce)
    # Past custom all-reduce's max_size (custom_ar_max_bytes) vLLM runs torch symm-mem or pynccl; the label
    # stays the variant's, as the reference's does; ``communicator`` says what ran.
    graphed = case["backend"] == "vllm_graph"
    # The same input every call, not cloned: vLLM's all-reduce is out of place, so the input stays intact, and
    # serving passes its activation as is. The reference clones inside its timing
    # (collect_all_reduce.py:594-659), so its eager rows are higher than these by one device copy of the
    # message per call; these match serving.
    stats = time_all_reduce(
        lambda: tensor_model_parallel_all_reduce(x),
        (lambda n: _capture(x, n, device)) if graphed else None,
        cpu_group,
        config,
    )
    if device == "cuda:0":
        print(
            f"custom_allreduce {case['backend']} {case['message_size']} elements: vLLM ran {communicator}",
            file=sys.stderr,
        )
    nbytes = x.numel() * x.element_size()
    expected = expected_communicator(case["num_gpus"], case["allreduce_dtype"], nbytes, device_sm(device))
    return Measured(stats, KERNEL_SOURCES[case["backend"]], ran=communicator, expected=expected)
