"""TensorRT-LLM 1.3's own all-reduce, the AllReduce module with the AUTO strategy, to custom_allreduce_perf.

One task times a whole row of cases (one allreduce_dtype and GPU count): starting the ranks and TensorRT-LLM's
IPC workspace costs seconds. The structure is the vLLM and SGLang runners' (backends/vllm/allreduce.py): one
spawned rank per GPU (torch comm's run_all_reduce_row / serve_rank), each sample's seconds per call agreed as the
maximum over the ranks. tensorrt_llm is imported only inside the ranks.

How TensorRT-LLM runs AllReduce without mpirun: its Ray orchestrator's way, MPI disabled. TLLM_DISABLE_MPI=1
makes mpi_disabled() true (tensorrt_llm/_utils.py:521-523, read at every call); then Mapping(...) builds a
DeviceMeshTopology over torch.distributed (mapping.py:492-497), AllReduce calls torch.ops.trtllm.allreduce_pg with
the TP group's ProcessGroup (_torch/distributed/ops.py:698-700, :866-872), and the IPC workspace of its custom
kernels exchanges handles through Distributed.get(mapping), a TorchDist when MPI is off (communicator.py:95-101;
ops.py:31-43 -> plugin.py allocate_allreduce_fusion_workspace -> _ipc_utils.py IpcMemory.open_ipc_memory). Each
rank therefore does what a Ray worker does (executor/ray_gpu_worker.py RayWorkerWrapper.__init__;
tests/unittest/_torch/ray_orchestrator/multi_gpu/test_ops.py AllreducePGTest, which sets TLLM_DISABLE_MPI=1 for
its workers): torch.distributed over "cuda:nccl,cpu:gloo", a Mapping of tp_size = world, a TorchDist. TorchDist
finds its node-local ranks through Ray (setup_local_comm -> _get_cluster_info raises without Ray,
communicator.py:1099-1125); on one machine every rank is node-local, so this runner gives it that group directly,
the same new_group call setup_local_comm makes for one node, and nothing else of TorchDist changes (TensorRT-LLM's
own torchrun test replaces setup_local_comm the same way: tests/unittest/_torch/distributed/
test_torchdist_object_collectives.py @5bde9bdf, _build_torchdist). TorchDist then registers the groups with the C++
side (init_pg, communicator.py:1015-1016).

As the reference (collector/network/collect_all_reduce.py:110-265): AllReduce(mapping) with the AUTO strategy,
the allreduce autotuner off (TLLM_DISABLE_ALLREDUCE_AUTOTUNE=1, :121-125; with MPI off ops.py:880 skips it anyway),
a dry run outside the graph (:173), then all-reduces captured into one CUDA graph and timed by replays
(:176-180). Under AUTO the C++ op picks, per call, one-shot or two-shot Lamport kernels or NCCL
(allreduceOp.cpp AllreduceOp::selectImplementation: NCCL past the workspace or without NVLink, else
customAllReduceUtils' lookup table), which Python cannot ask: the dry run is profiled and the kernels it launched
name what ran (strategy_ran: ONESHOT, TWOSHOT, NCCL, ...). The reference reaches NCCL through TensorRT-LLM's MPI
communicator, this runner through the torch ProcessGroup, as Ray serving does; the custom kernels are the same,
but the ProcessGroup path of runNCCLAllReduce clones the input before the in-place NCCL all-reduce
(allreduceOp.cpp), one device copy of the message per call that the MPI path's out-of-place ncclAllReduce has not.
kernel_source TRTLLM (reference :262, its ``implementation`` column "trtllm"), derived from the AllReduce object
built (kernel_label); what ran comes back as Measured.ran, e.g. "allreduce_pg:AUTO->ONESHOT".

Before any rank starts, allreduce_preflight.check_installed proves against the installed package's sources that
the MPI-free start still applies (MPI switch, TorchDist.setup_local_comm, AllReduce's allreduce_pg path), and each
rank checks the objects it built (allreduce_preflight.world_problems, allreduce_problem); either refuses the row as
a KernelLimit. When the CUDA-graph capture fails on any rank, every rank times eager calls instead (timing
"eager"), and the communicator says why.
"""

from __future__ import annotations

import os
import sys
from functools import partial
from types import SimpleNamespace

from opcollect.backends.torch.comm import (
    all_reduce_input,
    case_bytes,
    run_all_reduce_row,
    serve_rank,
    time_all_reduce,
)
from opcollect.backends.trtllm import allreduce_preflight as preflight
from opcollect.backends.trtllm.context import SERVED_VERSIONS
from opcollect.runtime.contract import KernelLimit, Measured, Runner
from opcollect.runtime.dtypes import ceil_div
from opcollect.runtime.harness import TimingConfig
from opcollect.runtime.observe import observe

KERNEL_SOURCES = {"trtllm": "TRTLLM"}  # plans/comm.py VARIANTS["trtllm"]
RANK_START_SECONDS = 300.0  # importing tensorrt_llm, NCCL, the IPC workspace's handle exchange
MiB = 1 << 20
# plugin.py CustomAllReduceHelper.max_workspace_size_auto: 64 MiB by default (index id 56991117771); earlier
# releases gave 16 MB for 2 ranks and 8 MB above. The footprint takes the larger.
FUSION_WORKSPACE = 64 * MiB
IPC_ALIGN = 2 * MiB  # _ipc_utils.py open_ipc_memory rounds every cudaMalloc up to 1 << 21
LAMPORT_BUFFERS = 3  # allocate_allreduce_fusion_workspace: 3 Lamport buffers of size * tp_size
LAMPORT_BARRIER_BYTES = 256  # its barrier buffer: 256 bytes per rank
# what the kernels the AllReduce launched say it ran (allReduceFusionKernels.cu allreduce_fusion_kernel_oneshot_lamport
# / allreduce_fusion_kernel_twoshot_sync for ONESHOT, TWOSHOT and MIN_LATENCY; NCCL's ncclDevKernel_* for NCCL and
# NCCL_SYMMETRIC, which take the same torch ProcessGroup path when MPI is off; customLowPrecisionAllReduce; MNNVL's)
RAN_KERNELS = (
    ("ONESHOT", "oneshot"),
    ("TWOSHOT", "twoshot"),
    ("LOWPRECISION", "lowprecision"),
    ("MNNVL", "mnnvl"),
    ("NCCL", "nccl"),
)
KERNEL_LIMIT_PREFIX = "KernelLimit: "  # how serve_rank reports a rank's KernelLimit to the parent

_WORLD: dict = {}  # this rank's Mapping and gloo group, set by _init_world


def workspace_bytes(world: int, size: int = FUSION_WORKSPACE) -> int:
    """Bytes of the IPC workspace get_allreduce_workspace allocates once per rank for a TP group of ``world``
    (ops.py:31-43; plugin.py allocate_allreduce_fusion_workspace: buffers of size * tp, barriers of 256 * tp, Lamport
    buffers of 3 * size * tp, each rounded up to 2 MiB); none for one rank (ops.py:701)."""
    if world <= 1:
        return 0

    def aligned(nbytes: int) -> int:
        return ceil_div(nbytes, IPC_ALIGN) * IPC_ALIGN

    return aligned(size * world) + aligned(LAMPORT_BARRIER_BYTES * world) + aligned(LAMPORT_BUFFERS * size * world)


def footprint(case) -> int:
    """Bytes per rank: the input, two live outputs (AllReduce is out of place; a graph's pool reuses freed ones)
    and the IPC workspace. NCCL's own buffers are not counted."""
    return 3 * case_bytes(case) + workspace_bytes(case.num_gpus)


def kernel_label(strategy: str, tp_size: int, world: int) -> str:
    """The reference's kernel_source for the AllReduce TensorRT-LLM built: TRTLLM for the AUTO strategy over the
    whole world; another strategy (ops.py falls back from SYMM_MEM / FLASHINFER to AUTO, :703-727, :758-780) or a
    smaller group is named so the row shows it."""
    if tp_size != world:
        raise RuntimeError(f"TensorRT-LLM's AllReduce spans {tp_size} ranks, the case {world}")
    return "TRTLLM" if strategy == "AUTO" else f"TRTLLM_{strategy}"


def communicator_used(allreduce) -> str:
    """What AllReduce.forward runs for a plain all-reduce, asked of the object in its order (ops.py:824-910):
    symmetric memory, MNNVL, FlashInfer's, else the C++ op with its strategy (allreduce_pg when MPI is off)."""
    for name, attr in (("symm_mem", "symm_mem_allreduce"), ("mnnvl", "mnnvl_allreduce"),
                       ("flashinfer", "flashinfer_allreduce")):  # fmt: skip
        if getattr(allreduce, attr, None) is not None:
            return name
    op = "allreduce_pg" if getattr(allreduce, "_disable_mpi", False) else "allreduce"
    return f"{op}:{getattr(allreduce.strategy, 'name', allreduce.strategy)}"


def strategy_ran(kernel_names) -> str:
    """What AUTO resolved to, from the names of the kernels one all-reduce launched: the RAN_KERNELS labels found
    ('+'-joined), 'none' when nothing ran, else 'unknown:<first kernel>'."""
    lowered = [name.lower() for name in kernel_names]
    found = [label for label, needle in RAN_KERNELS if any(needle in name for name in lowered)]
    if found:
        return "+".join(found)
    return f"unknown:{sorted(kernel_names)[0][:60]}" if kernel_names else "none"


def describe(built: str, ran: str, eager_reason: str = "") -> str:
    """Measured.ran: the op and strategy built, what its kernels ran, and why the timing is eager."""
    text = f"{built}->{ran}"
    return f"{text}; eager: {eager_reason}" if eager_reason else text


def measure_row(cases: list, device: str, config: TimingConfig) -> list[Measured]:
    if device.startswith("cuda"):
        preflight.check_installed()  # before any rank starts: the MPI-free start still applies to this release
    try:
        return run_all_reduce_row(cases, device, config, _rank_main, "TensorRT-LLM", KERNEL_SOURCES, RANK_START_SECONDS)
    except RuntimeError as exc:  # a rank's refusal comes back as its message
        text = str(exc)
        if text.startswith(KERNEL_LIMIT_PREFIX):
            raise KernelLimit(text[len(KERNEL_LIMIT_PREFIX) :]) from None
        raise


def _one_node_local_comm(self) -> None:
    """TorchDist.setup_local_comm for one machine: every rank is node-local, one group of all of them with the
    backends setup_local_comm gives it (communicator.py:1099-1116), without asking Ray for node addresses. The
    group is kept in _WORLD so the rank can check that TorchDist took it (allreduce_preflight.world_problems)."""
    import torch.distributed as dist

    self.local_comm = dist.new_group(ranks=list(range(dist.get_world_size())), backend="cuda:nccl,cpu:gloo")
    _WORLD["local_comm"] = self.local_comm


def _init_world(rank: int, world: int, port: int) -> None:
    # Set in this rank process only, before tensorrt_llm reads them: MPI off (the Ray orchestrator sets the same
    # for its workers), the allreduce autotuner off as the reference sets it (collect_all_reduce.py:121-125).
    os.environ["TLLM_DISABLE_MPI"] = "1"
    os.environ["TLLM_DISABLE_ALLREDUCE_AUTOTUNE"] = "1"
    import torch.distributed as dist

    try:  # the IPC workspace is cudaMalloc'd through cuda-python's runtime: select the GPU there too (reference :142)
        from cuda.bindings import runtime as cudart
    except ImportError:
        from cuda import cudart
    cudart.cudaSetDevice(rank)
    # as RayWorkerWrapper initializes its process group
    dist.init_process_group(
        backend="cuda:nccl,cpu:gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=world, rank=rank
    )
    from tensorrt_llm._torch.distributed.communicator import TorchDist
    from tensorrt_llm._utils import mpi_disabled
    from tensorrt_llm.mapping import Mapping

    mapping = Mapping(world_size=world, rank=rank, gpus_per_node=world, tp_size=world)  # reference :143
    TorchDist.setup_local_comm = _one_node_local_comm
    # Distributed.get caches one TorchDist per mapping, the one the IPC workspace asks for; a release without it
    # reaches the TorchDist that registers itself with set_torch_comm
    get = getattr(TorchDist, "get", None)
    _WORLD.update(mapping=mapping, comm=get(mapping) if get is not None else TorchDist(mapping))
    _WORLD["cpu_group"] = dist.new_group(backend="gloo")  # our timing agreement, off the NCCL streams
    # every rank checks alike, so every rank refuses together (rank 0 reports it)
    found = preflight.world_problems(mpi_disabled(), _WORLD["comm"], _WORLD.get("local_comm"), mapping)
    if found:
        raise KernelLimit(f"TensorRT-LLM's all-reduce without MPI: {'; '.join(found)}")


def _rank_main(rank, world, port, payload, config, results, parent_pid) -> None:
    serve_rank(
        rank, payload, config, results, parent_pid, partial(_init_world, rank, world, port), _parallel, _time_one
    )


def _parallel():
    def destroy() -> None:
        import torch.distributed as dist

        dist.destroy_process_group()

    return (lambda: SimpleNamespace(cpu_group=_WORLD["cpu_group"])), destroy


def _capture(allreduce, x, calls: int):
    """One CUDA graph of ``calls`` all-reduces of ``x``, as the reference captures them (collect_all_reduce.py:
    176-180); each output is freed and reused in the graph's pool."""
    import torch

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            out = allreduce(x)
        del out
    torch.cuda.synchronize()
    return graph


def _agreed_capture(allreduce, x, cpu_group):
    """(capture, why not): ``capture(n)`` for time_all_reduce when every rank captured a probe graph, else None and
    the reason, so that all ranks time eager calls together. The probe is not replayed before the ranks agree: a
    replay is a collective."""
    import torch
    import torch.distributed as dist

    reason = ""
    try:
        probe = _capture(allreduce, x, 1)
        del probe
    except Exception as exc:  # capture refused (a host sync, an uncapturable NCCL path): time eagerly
        first = str(exc).strip().splitlines()
        reason = f"capture failed: {type(exc).__name__}: {first[0] if first else ''}"[:200]
        torch.cuda.synchronize()
    ok = torch.tensor([0 if reason else 1], dtype=torch.int32)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=cpu_group)
    if int(ok.item()) == 1:
        return (lambda n: _capture(allreduce, x, n)), ""
    return None, reason or "capture failed on another rank"


def _time_one(case: dict, device: str, config: TimingConfig, cpu_group) -> Measured:
    from tensorrt_llm._torch.distributed.ops import AllReduce

    x = all_reduce_input(case, device)  # reference :167-168
    mapping = _WORLD["mapping"]
    # the AUTO strategy is AllReduce's default (ops.py:646); the dtype as a Linear passes it (linear.py:2625-2627)
    allreduce = AllReduce(mapping=mapping, dtype=x.dtype)
    problem = preflight.allreduce_problem(allreduce)
    if problem:
        raise KernelLimit(f"TensorRT-LLM's all-reduce without MPI: {problem}")
    source = kernel_label(allreduce.strategy.name, mapping.tp_size, case["num_gpus"])
    # the reference's dry run outside the graph (:173): NCCL's lazy communicator, the Lamport buffers; profiled, so
    # its kernels say which strategy AUTO resolved to for this size
    launched = observe(lambda: allreduce(x), device)  # the call runs once, profiled or not
    ran = strategy_ran(launched.kernels) if launched.kernels is not None else "unread"  # the timing is unaffected
    # The same input every call: AllReduce is out of place (ops.py:793-796), so it stays intact.
    capture, eager_reason = _agreed_capture(allreduce, x, cpu_group)
    stats = time_all_reduce(lambda: allreduce(x), capture, cpu_group, config)
    communicator = describe(communicator_used(allreduce), ran, eager_reason)
    if device == "cuda:0":
        print(
            f"custom_allreduce trtllm {case['message_size']} elements: TensorRT-LLM ran {communicator}",
            file=sys.stderr,
        )
    # AUTO resolves in C++ per call: no prediction to hold it to; the dry run's kernels are the row's observed ones
    return Measured(stats, source, ran=communicator, observed=launched)


RUNNERS = {"custom_allreduce": (Runner(footprint, measure_row=measure_row, versions=SERVED_VERSIONS),)}
