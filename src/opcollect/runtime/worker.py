"""A measurement worker: one process per device, fed rows on stdin, answering on its own pipe.

Started by the pool as `python -m opcollect.runtime.worker`. It dies with its parent (lifeline), sends
its runtime identity once, then for each row: a capacity check per case, the backend's measurement,
and one answer line with a result or a classified failure per case. Anything the backend prints goes
to stderr, so it cannot corrupt the answers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import sys

from opcollect.backends import load_backend
from opcollect.runtime import lifeline
from opcollect.runtime.contract import KernelLimit
from opcollect.runtime.failures import classify
from opcollect.runtime.harness import TimingConfig
from opcollect.runtime.hostprobe import host_figures
from opcollect.runtime.planfile import case_type

# a case may use this share of the memory the device reports free
CAPACITY_SHARE = 0.9


def _answer(channel, message: dict) -> None:
    channel.write(json.dumps(message, separators=(",", ":"), allow_nan=False) + "\n")
    channel.flush()


def check_capacity(backend, op: str, case, device: str) -> None:
    need = backend.footprint(op, case)
    free = backend.free_memory(device)
    if need > CAPACITY_SHARE * free:
        raise KernelLimit(f"does not fit: needs {need / 2**30:.2f} GiB, {free / 2**30:.2f} GiB free on {device}")


def run_task(backend, task: dict, device: str, config: TimingConfig) -> dict:
    cases = [case_type(task["op"], tuple(values))(**values) for values in task["cases"]]
    results: list[dict] = []
    fatal = False
    try:
        for case in cases:
            check_capacity(backend, task["op"], case, device)
        measured = backend.measure(task["op"], task["dispatch"], cases, device, config)
        for case_id, m in zip(task["case_ids"], measured):
            results.append(
                {
                    "case_id": case_id,
                    "status": "ok",
                    "stats": dataclasses.asdict(m.stats),
                    "kernel_source": m.kernel_source,
                    **({"ran": m.ran, "expected_ran": m.expected} if m.ran is not None else {}),
                    **(m.observed.record() if m.observed is not None else {}),  # kernels, or why none were read
                }
            )
    except Exception as exc:  # every failure is recorded; the worker goes on unless it is fatal
        failure = classify(exc)
        fatal = failure.fatal
        results = [
            {"case_id": cid, "status": "failed", "error_class": failure.error_class, "message": failure.message}
            for cid in task["case_ids"]
        ]
    return {"row_id": task["row_id"], "results": results, "fatal": fatal}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="opcollect-worker")
    parser.add_argument("--backend", required=True)
    parser.add_argument("--device", required=True)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--timing", required=True, help="TimingConfig as JSON")
    args = parser.parse_args(argv)
    lifeline.hold(args.parent)
    channel = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # stray prints, C-level too, go to the log
    sys.stdout = sys.stderr
    config = TimingConfig(**json.loads(args.timing))
    # the pool's caller admitted this backend: run's plan names a known one, or run --test-backend a module
    backend = load_backend(args.backend, modules=(args.backend,))
    backend.setup_worker(args.device, args.threads)
    identity = {**backend.identity(args.device), "host": socket.gethostname()}
    # the host's own figures for check R8 on the CPU, measured once after the threads are set (None on a GPU)
    identity["host_figures"] = host_figures(args.device)
    _answer(channel, {"ready": identity})
    for line in sys.stdin:
        if line.strip():
            _answer(channel, run_task(backend, json.loads(line), args.device, config))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
