"""NCCL collectives with torch.distributed: gloo between CPU processes, NCCL across GPUs.

all_reduce (in place), all_gather (all_gather_into_tensor), reduce_scatter (reduce_scatter_tensor) and
alltoall (all_to_all_single) of message_size ELEMENTS of the case's dtype: the whole buffer as nccl-tests
counts it (all_gather's output, reduce_scatter's input, alltoall's send buffer), so a half case of
message_size N moves 2N bytes. One task times every case of one (dtype, num_gpus) group: starting the
ranks costs seconds. Each sample is a barrier, K back-to-back collectives, and the maximum of the ranks'
times per call. The stopping rule runs on identical numbers in every rank (its clock is the sum of those
maxima), so all ranks stop together.
"""

from __future__ import annotations

import os
import queue as queue_module
import socket
import time
from functools import partial

from opcollect.runtime.contract import KernelLimit, Measured
from opcollect.runtime.dtypes import message_bytes
from opcollect.runtime.harness import Stats, TimingConfig, sample_until_stable, summarize

TORCH_DTYPES = {"half": "float16", "bfloat16": "bfloat16", "float32": "float32", "int8": "int8", "fp8": "float8_e4m3fn"}
RANK_START_SECONDS = 120.0
SAMPLE_SECONDS = 2e-3  # one sample: enough back-to-back collectives to last about this long
MAX_CALLS_PER_SAMPLE = 100


def buffer_elements(op_name: str, message_size: int, world: int) -> tuple[int, int]:
    """Elements of one rank's (input, output) tensors; output 0: in place (all_reduce).

    message_size is the larger buffer, as nccl-tests counts it; each rank's share of it is message_size // world.
    """
    if op_name == "all_reduce":
        return message_size, 0
    if message_size % world:
        raise KernelLimit(f"{op_name} of {message_size} elements does not split evenly over {world} ranks")
    share = message_size // world
    if op_name == "all_gather":
        return share, share * world
    if op_name == "reduce_scatter":
        return share * world, share
    if op_name == "alltoall":
        return share * world, share * world
    raise KernelLimit(f"the torch backend has no collective {op_name!r}")


def footprint(case) -> int:
    inputs, outputs = buffer_elements(case.op_name, case.message_size, case.num_gpus)
    return message_bytes(case.nccl_dtype, inputs + outputs)


def _gather_scatter(op_name: str, dist):
    """The torch.distributed function of an out-of-place collective, called as f(output, input)."""
    if op_name == "all_gather":  # torch 2.13 deprecates all_gather_into_tensor for all_gather_single
        return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    if op_name == "reduce_scatter":  # and reduce_scatter_tensor for reduce_scatter_single
        return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return dist.all_to_all_single


def collective(case: dict, world: int, device: str, dist, torch):
    """The case's collective as a call without arguments, and the bytes of its larger buffer (the message)."""
    dtype = getattr(torch, TORCH_DTYPES[case["nccl_dtype"]])
    inputs, outputs = buffer_elements(case["op_name"], case["message_size"], world)
    source = torch.zeros(inputs, dtype=dtype, device=device)
    if outputs:
        target = torch.zeros(outputs, dtype=dtype, device=device)
        call = partial(_gather_scatter(case["op_name"], dist), target, source)
    else:
        target, call = source, partial(dist.all_reduce, source)
    moved = max(source.numel(), target.numel()) * source.element_size()
    if moved != message_bytes(case["nccl_dtype"], case["message_size"]):  # message_size counts elements
        raise AssertionError(f"{case['op_name']} of {case['message_size']} {case['nccl_dtype']} moves {moved} bytes")
    return call, moved


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_ranks(target, world: int, args: tuple, seconds: float, what: str):
    """Run ``target(rank, *args, results, parent_pid)`` in ``world`` spawned processes and return the first
    result one of them puts (a string is an error to raise); a rank that dies or the deadline ends it."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(rank, *args, results, os.getpid()), daemon=True) for rank in range(world)]
    for proc in procs:
        proc.start()
    try:
        deadline = time.monotonic() + seconds
        while True:
            try:
                outcome = results.get(timeout=0.2)
                break
            except queue_module.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"{what} died with exit code {dead[0].exitcode}") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{what}s did not finish") from None
        if isinstance(outcome, str):
            raise RuntimeError(outcome)
        return outcome
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()


def measure_row(cases: list, device: str, config: TimingConfig) -> list[Measured]:

    world = cases[0].num_gpus
    cuda = device.startswith("cuda")
    if cuda:
        import torch

        if torch.cuda.device_count() < world:
            raise KernelLimit(
                f"a collective over {world} GPUs needs {world} visible GPUs, found {torch.cuda.device_count()}"
            )
    payload = [c._asdict() for c in cases]
    seconds = RANK_START_SECONDS + len(cases) * (config.max_case_seconds * 4 + 5)
    return run_ranks(_rank_main, world, (world, _free_port(), cuda, payload, config), seconds, "a collective's rank")


def _rank_main(rank, world, port, cuda, payload, config, results, parent_pid) -> None:
    from opcollect.runtime import lifeline

    lifeline.hold(parent_pid)
    import torch
    import torch.distributed as dist

    device = f"cuda:{rank}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(1)
    try:
        dist.init_process_group(
            "nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )
        measured = [_time_one(case, device, cuda, config, dist, torch) for case in payload]
        if rank == 0:
            results.put(measured)
        dist.barrier()
        dist.destroy_process_group()
    except Exception as exc:  # the worker classifies the message
        if rank == 0:
            results.put(f"{type(exc).__name__}: {exc}")
        raise


def _time_one(case: dict, device: str, cuda: bool, config: TimingConfig, dist, torch) -> Measured:
    run, _ = collective(case, case["num_gpus"], device, dist, torch)
    worst = torch.zeros(1, dtype=torch.float64, device=device)
    spent = [0.0]

    def timed(calls: int) -> float:
        """Seconds per collective over ``calls`` back-to-back ones, the maximum over the ranks."""
        dist.barrier()
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            run()
        if cuda:
            torch.cuda.synchronize()
        worst.fill_((time.perf_counter() - start) / calls)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        return float(worst.item())

    timed(1)
    # every rank sees the same maximum, so every rank picks the same number of calls per sample
    calls = max(1, min(MAX_CALLS_PER_SAMPLE, int(SAMPLE_SECONDS / max(timed(1), 1e-7))))

    def sample() -> float:
        value = timed(calls)
        spent[0] += value * calls
        return value

    raw = sample_until_stable(sample, config, clock=lambda: spent[0])
    stats = summarize(raw, "eager" if cuda else "cpu", calls, threads=1 if not cuda else None)
    return Measured(stats, "NCCL" if cuda else "gloo")


# ---- shared by the frameworks' own all-reduce runners (backends/vllm/allreduce.py, backends/sglang/allreduce.py)


def all_reduce_input(case: dict, device: str):
    """The all-ones tensor of a custom_allreduce case: message_size elements of its dtype, in tensor_shape."""
    import torch

    dtype = getattr(torch, TORCH_DTYPES[case["allreduce_dtype"]])
    x = torch.ones(tensor_shape(case["message_size"]), dtype=dtype, device=device)
    if x.numel() * x.element_size() != message_bytes(case["allreduce_dtype"], case["message_size"]):
        raise AssertionError(f"all-reduce of {case['message_size']} {case['allreduce_dtype']}: wrong tensor size")
    return x


def tensor_shape(elements: int) -> tuple[int, int]:
    """The reference's layout (collect_all_reduce.py:69-75): one row up to 4096 elements, else rows of 4096."""
    if elements <= 4096 or elements % 4096:
        return (1, elements)
    return (elements // 4096, 4096)


def case_bytes(case) -> int:
    return message_bytes(case.allreduce_dtype, case.message_size)


def calls_per_sample(seconds_per_call: float, target: float = SAMPLE_SECONDS, cap: int = MAX_CALLS_PER_SAMPLE) -> int:
    """All-reduces in one sample (one graph replay, or one eager loop) so that it lasts about ``target``."""
    return max(1, min(cap, int(target / max(seconds_per_call, 1e-7))))


def time_all_reduce(all_reduce, capture, cpu_group, config: TimingConfig) -> Stats:
    """A framework's all-reduce timed alike in every rank: samples of K calls (one replay of a graph of K captured
    calls when ``capture(K)`` is given, else K eager calls of the same input), each the maximum over the ranks
    of ``cpu_group``, until the harness's stopping rule holds; K makes a sample last about SAMPLE_SECONDS."""
    import torch
    import torch.distributed as dist

    worst = torch.zeros(1, dtype=torch.float64)

    def timed(step, calls: int) -> float:
        """Seconds per all-reduce over one step of ``calls`` of them, the maximum over the ranks."""
        dist.barrier(group=cpu_group)
        torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        worst.fill_((time.perf_counter() - start) / calls)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=cpu_group)
        return float(worst.item())

    def eager(calls: int) -> None:
        for _ in range(calls):
            all_reduce()

    if capture is not None:
        probe = capture(1)
        timed(probe.replay, 1)  # the first replay pays lazy setup
        calls = calls_per_sample(timed(probe.replay, 1))  # the same in every rank: an agreed maximum
        del probe
        step = capture(calls).replay
    else:
        timed(lambda: eager(1), 1)  # the first call pays lazy setup (a JIT compile, NCCL's communicator)
        calls = calls_per_sample(timed(lambda: eager(1), 1))

        def step() -> None:
            eager(calls)

    spent = [0.0]

    def sample() -> float:
        value = timed(step, calls)
        spent[0] += value * calls
        return value

    raw = sample_until_stable(sample, config, clock=lambda: spent[0])
    return summarize(raw, "graph" if capture is not None else "eager", calls)


def run_all_reduce_row(
    cases: list, device: str, config: TimingConfig, rank_main, framework: str, variants, start_seconds: float
) -> list:
    """A framework's own all-reduce over one row of cases (one dtype, GPU count and variant): refused before any
    rank starts when it cannot run here, else ``rank_main(rank, world, port, payload, config, results,
    parent_pid)`` in every rank; rank 0 answers."""
    world = cases[0].num_gpus
    if any(
        (c.allreduce_dtype, c.num_gpus, c.backend) != (cases[0].allreduce_dtype, world, cases[0].backend) for c in cases
    ):
        raise ValueError("a custom_allreduce row mixes dtypes, GPU counts or variants")
    if cases[0].backend not in variants:
        raise KernelLimit(f"{framework} has no all-reduce variant {cases[0].backend!r}")
    if not device.startswith("cuda"):
        raise KernelLimit(f"{framework}'s all-reduce runs on CUDA GPUs only")
    import torch

    if torch.cuda.device_count() < world:
        raise KernelLimit(
            f"an all-reduce over {world} GPUs needs {world} visible GPUs, found {torch.cuda.device_count()}"
        )
    payload = [c._asdict() for c in cases]
    seconds = start_seconds + len(cases) * (config.max_case_seconds * 4 + 10)
    return run_ranks(rank_main, world, (world, _free_port(), payload, config), seconds, "an all-reduce rank")


def serve_rank(rank: int, payload: list, config: TimingConfig, results, parent_pid: int, init, parallel, time_one):
    """One rank of a framework's all-reduce: join its world (``init()``), time every case of the row with
    ``time_one(case, device, config, cpu_group)`` and let rank 0 answer; ``parallel()`` gives the framework's
    (get_tp_group, destroy_model_parallel)."""
    from opcollect.runtime import lifeline

    lifeline.hold(parent_pid)
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    try:
        init()
        get_tp_group, destroy_model_parallel = parallel()
        cpu_group = get_tp_group().cpu_group  # gloo: the ranks agree on CPU numbers without touching the GPU streams
        measured = [time_one(case, f"cuda:{rank}", config, cpu_group) for case in payload]
        if rank == 0:
            results.put(measured)
        dist.barrier(group=cpu_group)
        destroy_model_parallel()
    except Exception as exc:  # the worker classifies the message
        if rank == 0:
            results.put(f"{type(exc).__name__}: {exc}")
        raise
