"""All-reduce with torch.distributed: gloo between CPU processes, NCCL across GPUs.

One task times every message size of one (dtype, num_gpus) group: starting the ranks costs seconds.
Each sample is a barrier, K back-to-back all_reduces, and the maximum of the ranks' times per call. The
stopping rule runs on identical numbers in every rank (its clock is the sum of those maxima), so all
ranks stop together.
"""

from __future__ import annotations

import os
import queue as queue_module
import socket
import time

from opcollect.runtime.contract import KernelLimit, Measured
from opcollect.runtime.harness import TimingConfig, sample_until_stable, summarize

ELEMENT_BYTES = {"float32": 4, "half": 2, "bfloat16": 2}
RANK_START_SECONDS = 120.0
SAMPLE_SECONDS = 2e-3  # one sample: enough back-to-back all_reduces to last about this long
MAX_CALLS_PER_SAMPLE = 100


def footprint(case) -> int:
    return 2 * case.message_size


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def measure_row(cases: list, device: str, config: TimingConfig) -> list[Measured]:
    import multiprocessing

    world = cases[0].num_gpus
    cuda = device.startswith("cuda")
    if cuda:
        import torch

        if torch.cuda.device_count() < world:
            raise KernelLimit(
                f"all-reduce over {world} GPUs needs {world} visible GPUs, found {torch.cuda.device_count()}"
            )
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    payload = [c._asdict() for c in cases]
    procs = [
        ctx.Process(
            target=_rank_main, args=(rank, world, port, cuda, payload, config, results, os.getpid()), daemon=True
        )
        for rank in range(world)
    ]
    for proc in procs:
        proc.start()
    try:
        deadline = time.monotonic() + RANK_START_SECONDS + len(cases) * (config.max_case_seconds * 4 + 5)
        while True:
            try:
                outcome = results.get(timeout=0.2)
                break
            except queue_module.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"all-reduce rank died with exit code {dead[0].exitcode}") from None
                if time.monotonic() > deadline:
                    raise TimeoutError("all-reduce ranks did not finish") from None
        if isinstance(outcome, str):
            raise RuntimeError(outcome)
        return outcome
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()


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
    dtype = {"float32": torch.float32, "half": torch.float16, "bfloat16": torch.bfloat16}[case["nccl_dtype"]]
    numel = max(1, case["message_size"] // ELEMENT_BYTES[case["nccl_dtype"]])
    tensor = torch.ones(numel, dtype=dtype, device=device)
    worst = torch.zeros(1, dtype=torch.float64, device=device)
    spent = [0.0]

    def timed(calls: int) -> float:
        """Seconds per all_reduce over ``calls`` back-to-back ones, the maximum over the ranks."""
        dist.barrier()
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            dist.all_reduce(tensor)
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
    return Measured(stats, "nccl" if cuda else "gloo")
