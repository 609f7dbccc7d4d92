"""SGLang 0.5.14's own all-reduce, `tensor_model_parallel_all_reduce`, to custom_allreduce_perf.

The vLLM runner's structure (backends/vllm/allreduce.py), on SGLang's objects: one spawned rank per GPU
(torch comm's run_ranks), each joining SGLang's world with tensor-parallel size num_gpus as the model runner does
(model_executor/model_runner.py:1179-1236), each sample's seconds per call agreed as the maximum over the ranks.
SGLang's TP GroupCoordinator picks per call (distributed/parallel_state.py:578-660, 764-776): pynccl with
symmetric memory (off: enable_symm_mem), custom all-reduce, quick all-reduce (ROCm), mscclpp and torch symm-mem
(both off by default, parallel_state.py:1680-1682), else in place: pynccl where enabled (inside graph_capture
only, pynccl.py:123-126, parallel_state.py:561-576), else torch.distributed. On CUDA the custom all-reduce is
CustomAllReduceV2, JIT-compiled (SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2=1, environ.py:624;
custom_all_reduce.py:344-369), where NVLink joins all GPUs; the legacy CustomAllreduce otherwise. No global
ServerArgs is needed: the only reads on this path catch its absence (pynccl_allocator.py:160-164,
pymscclpp.py:26-30). sglang is imported only inside the ranks.

Variants, as the reference names them (aiconfigurator collector/network/collect_all_reduce.py:703-920):
- sglang_graph: K all-reduces captured inside SGLang's ``graph_capture`` into one CUDA graph, timed by replays;
- sglang_eager: K direct calls back to back (the reference clones the input per call; serving does not).
The kernel_source stays the variant's at every size; what SGLang ran comes back as Measured.ran, beside
the communicator expected_communicator predicts (Measured.expected).
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

KERNEL_SOURCES = {"sglang_graph": "SGLang_CustomAllReduce_graph", "sglang_eager": "SGLang_CustomAllReduce_eager"}
RANK_START_SECONDS = 300.0  # SGLang's start: NCCL, pynccl, the custom all-reduce's IPC exchange
JIT_SECONDS = 300.0  # CustomAllReduceV2 compiles its push and pull modules per dtype and world on first use
KiB, MiB = 1 << 10, 1 << 20
INF = 1 << 60
# custom_all_reduce_v2.py:192-220 (THRESHOLD_2_SHOT_MAP): (one_shot_push, one_shot_pull) thresholds per world
# size; the first table where is_sm100_supported (compute capability major 10, utils/common.py:282-286)
V2_THRESHOLDS = {
    "sm100": {
        2: (4 * MiB, INF),
        3: (4 * MiB, 4 * MiB),
        4: (2 * MiB, 2 * MiB),
        5: (2 * MiB, 2 * MiB),
        6: (1 * MiB, 1 * MiB),
        7: (896 * KiB, 896 * KiB),
        8: (720 * KiB, 720 * KiB),
    },
    "other": {
        2: (2 * MiB, INF),
        3: (512 * KiB, 512 * KiB),
        4: (384 * KiB, 256 * KiB),
        5: (256 * KiB, 256 * KiB),
        6: (192 * KiB, 192 * KiB),
        7: (192 * KiB, 192 * KiB),
        8: (160 * KiB, 160 * KiB),
    },
}
V2_WORLD_SIZES = tuple(V2_THRESHOLDS["other"])  # can_use_custom_all_reduce_v2 (custom_all_reduce_v2.py:223-236)
V2_PULL_BYTES = 16 * MiB  # custom_all_reduce_v2.py:55-56: max_pull_size
V2_GRAPH_INPUTS = 131072  # custom_all_reduce_v2.py:70; 64-byte AllReduceData each (custom_all_reduce.cuh:28-31)
V2_PUSH_STAGES = 2  # PushController::kNumStages (include/sgl_kernel/distributed/common.cuh:96)
V1_WORLD_SIZES = (2, 4, 6, 8)  # CustomAllreduce._SUPPORTED_WORLD_SIZES (custom_all_reduce.py:41)
V1_MAX = 8 * MiB  # CustomAllreduce._MAX_CAR_SIZE on CUDA (custom_all_reduce.py:42)
SIGNAL_ALLOWANCE = MiB  # V2's pull and push signal arrays: a few KiB


def family(sm: str) -> str:
    """Which V2 threshold table an SM ('90', '100', '103', '120') takes."""
    return "sm100" if sm.isdigit() and int(sm) // 10 == 10 else "other"


def custom_ar_version(world: int, nvlink: bool = True) -> str | None:
    """Which custom all-reduce SGLang builds (custom_all_reduce.py:344-369, custom_all_reduce_utils.py:415-485):
    V2 on fully NVLink-connected GPUs of 2 to 8, the legacy one for two GPUs without NVLink, else none."""
    if nvlink and world in V2_WORLD_SIZES:
        return "v2"
    if world == 2:
        return "v1"
    return None


def custom_ar_max_bytes(world: int, sm: str, nvlink: bool = True) -> int:
    """The custom all-reduce's max_size (custom_all_reduce_v2.py:55-62; custom_all_reduce.py:42, 97); 0: none."""
    version = custom_ar_version(world, nvlink)
    if version == "v2":
        return max(V2_PULL_BYTES, V2_THRESHOLDS[family(sm)][world][0])
    return V1_MAX if version == "v1" else 0


def custom_ar_eligible(world: int, nbytes: int, sm: str, nvlink: bool = True) -> bool:
    """should_custom_ar (custom_all_reduce_v2.py:132-142, custom_all_reduce.py:260-274) for a contiguous input:
    a multiple of 16 bytes, at most max_size (inclusive), on GPUs that pass the P2P check."""
    if custom_ar_version(world, nvlink) is None:
        return False
    return nbytes % 16 == 0 and nbytes <= custom_ar_max_bytes(world, sm, nvlink)


def v2_algorithm(world: int, nbytes: int, sm: str) -> str:
    """CustomAllReduceV2._determine_algo with its thresholds clipped to the buffers (custom_all_reduce_v2.py:
    83-97, 164-173)."""
    push, pull = V2_THRESHOLDS[family(sm)][world]
    if nbytes <= push:
        return "one_shot_push"
    return "one_shot_pull" if nbytes <= min(pull, V2_PULL_BYTES) else "two_shot_pull"


def expected_communicator(world: int, nbytes: int, sm: str, graphed: bool, nvlink: bool = True) -> str:
    """What GroupCoordinator.all_reduce runs with SGLang's defaults (parallel_state.py:613-660, 764-776)."""
    if custom_ar_eligible(world, nbytes, sm, nvlink):
        return "custom_allreduce_v2" if custom_ar_version(world, nvlink) == "v2" else "custom_allreduce"
    return "pynccl" if graphed else "torch.distributed"  # pynccl is enabled only inside graph_capture


def footprint(case) -> int:
    """Bytes per rank: the input, two live outputs (a graph's pool reuses freed ones), and V2's IPC storage at
    its largest over the SMs: signals, graph parameters, the pull buffer and the push buffers of every rank
    (custom_all_reduce.cuh:356-388). It exceeds the legacy one's 2 x 8 MiB + rank_data. NCCL's are not counted."""
    nbytes = case_bytes(case)
    world = case.num_gpus
    if custom_ar_version(world) is None:
        return 3 * nbytes
    push = max(table[world][0] for table in V2_THRESHOLDS.values())
    graph = 64 * (1 + V2_GRAPH_INPUTS)
    return 3 * nbytes + SIGNAL_ALLOWANCE + graph + V2_PULL_BYTES + V2_PUSH_STAGES * world * push


def measure_row(cases: list, device: str, config: TimingConfig) -> list[Measured]:
    return run_all_reduce_row(
        cases, device, config, _rank_main, "SGLang", KERNEL_SOURCES, RANK_START_SECONDS + JIT_SECONDS
    )


def _init_world(rank: int, world: int, port: int) -> None:
    """SGLang's world as ModelRunner.init_torch_distributed builds it with default ServerArgs
    (model_runner.py:1179-1180, 1196-1198, 1216-1236): no P2P test (enable_p2p_check=False), custom all-reduce
    on, mscclpp and torch symm-mem off, tensor-parallel size world, pipeline size 1."""
    from sglang.srt.distributed.parallel_state import (
        init_distributed_environment,
        initialize_model_parallel,
        set_custom_all_reduce,
        set_mscclpp_all_reduce,
        set_torch_symm_mem_all_reduce,
    )
    from sglang.srt.utils.common import monkey_patch_p2p_access_check

    monkey_patch_p2p_access_check()
    set_custom_all_reduce(True)
    set_mscclpp_all_reduce(False)
    set_torch_symm_mem_all_reduce(False)
    init_distributed_environment(
        backend="nccl",
        world_size=world,
        rank=rank,
        local_rank=rank,
        distributed_init_method=f"tcp://127.0.0.1:{port}",
    )
    initialize_model_parallel(tensor_model_parallel_size=world, pipeline_model_parallel_size=1)


def _rank_main(rank, world, port, payload, config, results, parent_pid) -> None:
    serve_rank(
        rank, payload, config, results, parent_pid, partial(_init_world, rank, world, port), _parallel, _time_one
    )


def _parallel():
    from sglang.srt.distributed.parallel_state import destroy_model_parallel, get_tp_group

    return get_tp_group, destroy_model_parallel


def communicator_used(group, x, graphed: bool) -> str:
    """Which communicator SGLang's TP GroupCoordinator ``group`` runs for ``x``, asked of the objects it built in
    the order of parallel_state.py:613-660 and 764-776; graphed: inside graph_capture, where pynccl is on."""
    if group is None or group.world_size == 1:
        return "none"
    mscclpp = group.pymscclpp_comm is not None and group.pymscclpp_comm.should_mscclpp_allreduce(x)
    pynccl = group.pynccl_comm
    if pynccl is not None and group.is_symmetric_memory_enabled() and not mscclpp:
        return "pynccl_symm_mem"
    ca = group.ca_comm
    if ca is not None and not ca.disabled and not mscclpp and ca.should_custom_ar(x):
        return "custom_allreduce_v2" if type(ca).__name__ == "CustomAllReduceV2" else "custom_allreduce"
    qr = group.qr_comm
    if qr is not None and not qr.disabled and qr.should_quick_allreduce(x):
        return "quick_allreduce"
    if mscclpp:
        return "pymscclpp"
    symm = group.torch_symm_mem_comm
    if symm is not None and not symm.disabled and symm.should_torch_symm_mem_allreduce(x):
        return "torch_symm_mem"
    if pynccl is not None and (graphed or not pynccl.disabled):
        return "pynccl"
    return "torch.distributed"


def _capture(x, calls: int):
    """One CUDA graph of ``calls`` all-reduces of ``x``, captured as SGLang's cuda graph runners capture
    (model_executor/runner/decode_cuda_graph_runner.py:687): inside graph_capture, which enters the custom
    all-reduce's capture mode and registers the graph's inputs on exit (custom_all_reduce_v2.py:99-116)."""
    import torch
    from sglang.srt.distributed.communication_op import tensor_model_parallel_all_reduce
    from sglang.srt.distributed.parallel_state import graph_capture

    graph = torch.cuda.CUDAGraph()
    with graph_capture() as ctx:
        # warm-up outside the stream capture: V2 and pynccl run for real (V2's JIT compile, NCCL's lazy setup)
        tensor_model_parallel_all_reduce(x)
        with torch.cuda.graph(graph, stream=ctx.stream):
            for _ in range(calls):
                out = tensor_model_parallel_all_reduce(x)  # a freed out-of-place output is reused in the pool
        del out
    torch.cuda.synchronize()
    return graph


def _time_one(case: dict, device: str, config: TimingConfig, cpu_group) -> Measured:
    from sglang.srt.distributed.communication_op import tensor_model_parallel_all_reduce
    from sglang.srt.distributed.parallel_state import get_tp_group

    x = all_reduce_input(case, device)
    graphed = case["backend"] == "sglang_graph"
    group = get_tp_group()
    communicator = communicator_used(group, x, graphed)
    # The same input every call, not cloned, as serving passes its activation. V2 and the in-place fallbacks
    # overwrite x with the sum (all ones grow to inf, which costs the same); the reference clones per call
    # (collect_all_reduce.py:865-883), one device copy of the message per call more than these.
    stats = time_all_reduce(
        lambda: tensor_model_parallel_all_reduce(x), (lambda n: _capture(x, n)) if graphed else None, cpu_group, config
    )
    if device == "cuda:0":
        algo = getattr(group.ca_comm, "_determine_algo", None) if communicator == "custom_allreduce_v2" else None
        detail = f" ({algo(x).name.lower()})" if algo is not None else ""
        print(
            f"custom_allreduce {case['backend']} {case['message_size']} elements: SGLang ran {communicator}{detail}",
            file=sys.stderr,
        )
    nbytes = x.numel() * x.element_size()
    expected = expected_communicator(case["num_gpus"], nbytes, device_sm(device), graphed)
    return Measured(stats, KERNEL_SOURCES[case["backend"]], ran=communicator, expected=expected)
