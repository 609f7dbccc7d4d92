"""The worker pool: hands rows to worker processes, enforces timeouts, replaces dead workers.

Single-threaded: one selector over the workers' answer pipes. A row that outlives its deadline kills its
worker (and the worker's process group); a worker that dies mid-row fails the row as ``crash`` with the
signal and the tail of its log; an answer marked fatal (sticky CUDA error) replaces the worker. Every
outcome is handed to ``on_result`` and the run goes on.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from opcollect.runtime.harness import TimingConfig
from opcollect.safepath import WORKER_START

READY_TIMEOUT_SECONDS = 300.0


@dataclass(frozen=True)
class Task:
    row_id: str
    op: str
    dispatch: str
    case_ids: tuple[str, ...]
    cases: tuple[dict, ...]  # case fields by name
    attempt: int

    @property
    def ranks(self) -> int:
        """Devices one measurement of the row spans: its cases' num_gpus (comm, custom all-reduce), else 1."""
        return max((int(case.get("num_gpus", 1)) for case in self.cases), default=1)


@dataclass
class _Worker:
    slot: int
    device: str
    proc: subprocess.Popen
    log_path: Path
    buffer: bytes = b""
    identity: dict | None = None
    runtime_id: str = ""  # names this worker process's identity in the shards
    task: Task | None = None
    deadline: float = 0.0
    sent: float = 0.0  # monotonic time the current task was sent: its row's wall seconds end at the answer


def _signal_name(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


def _log_tail(path: Path, limit: int = 600) -> str:
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        return ""
    return text[-limit:].replace("\n", " | ")


class Pool:
    def __init__(
        self,
        backend: str,
        devices: list[str],
        threads: int | None,
        config: TimingConfig,
        case_timeout: float,
        log_dir: Path,
        on_result: Callable[[_Worker, Task, list[dict]], None],
    ):
        self.backend, self.devices, self.threads = backend, devices, threads
        self.config, self.case_timeout, self.log_dir = config, case_timeout, Path(log_dir)
        self.on_result = on_result
        self.selector = selectors.DefaultSelector()
        self.workers: list[_Worker] = []
        self.spawned = 0

    # -- worker lifecycle -------------------------------------------------------------------------
    def _spawn(self, slot: int) -> _Worker:
        device = self.devices[slot]
        self.spawned += 1
        log_path = self.log_dir / f"worker-{slot}.log"
        log = open(log_path, "ab")
        cmd = [
            sys.executable,
            "-c",
            WORKER_START,  # runs opcollect.runtime.worker with the working directory off sys.path
            "--backend",
            self.backend,
            "--device",
            device,
            "--parent",
            str(os.getpid()),
            "--timing",
            json.dumps(asdict(self.config)),
        ]
        if self.threads:
            cmd += ["--threads", str(self.threads)]
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
        log.close()
        os.set_blocking(proc.stdout.fileno(), False)
        worker = _Worker(
            slot,
            device,
            proc,
            log_path,
            deadline=time.monotonic() + READY_TIMEOUT_SECONDS,
            runtime_id=f"w{slot}.{self.spawned}",
        )
        self.selector.register(proc.stdout, selectors.EVENT_READ, worker)
        return worker

    def _kill(self, worker: _Worker) -> None:
        try:
            self.selector.unregister(worker.proc.stdout)
        except (KeyError, ValueError):
            pass
        try:
            os.killpg(worker.proc.pid, signal.SIGKILL)  # the worker and anything it started
        except ProcessLookupError:
            pass
        worker.proc.wait()
        for stream in (worker.proc.stdin, worker.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass

    def _replace(self, worker: _Worker) -> None:
        self._kill(worker)
        self.workers[worker.slot] = self._spawn(worker.slot)

    def close(self) -> None:
        for worker in self.workers:
            self._kill(worker)
        self.selector.close()

    # -- the loop ---------------------------------------------------------------------------------
    def run(self, tasks: list[Task]) -> None:
        # A row whose measurement spans several devices starts its ranks on cuda:0..N-1 (or N CPU processes),
        # where the other workers time their cases: it runs alone, after every single-device row.
        pending = deque(sorted(tasks, key=lambda t: t.ranks > 1))
        self.workers = [self._spawn(slot) for slot in range(min(len(self.devices), max(1, len(tasks))))]
        try:
            while pending or any(w.task for w in self.workers):
                for worker in self.workers:
                    if worker.identity is not None and worker.task is None and pending and self._may_start(pending[0]):
                        self._send(worker, pending.popleft())
                self._wait()
        finally:
            self.close()

    def _may_start(self, task: Task) -> bool:
        """A multi-device row starts only when every worker is idle; nothing starts beside one."""
        busy = [w.task for w in self.workers if w.task is not None]
        return not busy if task.ranks > 1 else all(t.ranks == 1 for t in busy)

    def _send(self, worker: _Worker, task: Task) -> None:
        worker.task = task
        worker.sent = time.monotonic()
        worker.deadline = worker.sent + self.case_timeout * len(task.case_ids)
        message = {
            "row_id": task.row_id,
            "op": task.op,
            "dispatch": task.dispatch,
            "case_ids": list(task.case_ids),
            "cases": list(task.cases),
        }
        try:
            worker.proc.stdin.write((json.dumps(message) + "\n").encode())
            worker.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the worker is dead; the selector sees EOF and records the crash

    def _wait(self) -> None:
        now = time.monotonic()
        timeout = max(0.0, min(w.deadline for w in self.workers) - now) if self.workers else 1.0
        for key, _ in self.selector.select(timeout=min(timeout, 1.0)):
            self._read(key.data)
        now = time.monotonic()
        for worker in list(self.workers):
            if now > worker.deadline and self.workers[worker.slot] is worker:
                self._expire(worker)

    def _read(self, worker: _Worker) -> None:
        try:
            chunk = os.read(worker.proc.stdout.fileno(), 1 << 20)
        except BlockingIOError:
            return
        if not chunk:
            self._died(worker)
            return
        worker.buffer += chunk
        while b"\n" in worker.buffer:
            line, worker.buffer = worker.buffer.split(b"\n", 1)
            self._answer(worker, json.loads(line))

    def _answer(self, worker: _Worker, message: dict) -> None:
        if "ready" in message:
            worker.identity = message["ready"]
            worker.deadline = float("inf")
            return
        task = worker.task
        worker.task, worker.deadline = None, float("inf")
        if task is None or message.get("row_id") != task.row_id:
            return
        self.on_result(worker, task, message["results"])
        if message.get("fatal"):
            self._replace(worker)

    def _fail(self, worker: _Worker, error_class: str, message: str) -> None:
        task = worker.task
        worker.task = None
        if task is not None:
            results = [
                {"case_id": cid, "status": "failed", "error_class": error_class, "message": message}
                for cid in task.case_ids
            ]
            self.on_result(worker, task, results)

    def _died(self, worker: _Worker) -> None:
        worker.proc.wait()
        reason = f"worker {_signal_name(worker.proc.returncode)}"
        tail = _log_tail(worker.log_path)
        if worker.identity is None and worker.task is None:
            raise RuntimeError(f"{reason} before it was ready: {tail}")
        self._fail(worker, "crash", f"{reason}; log: {tail}" if tail else reason)
        self._replace(worker)

    def _expire(self, worker: _Worker) -> None:
        if worker.identity is None:
            self._kill(worker)
            raise RuntimeError(
                f"worker on {worker.device} not ready after {READY_TIMEOUT_SECONDS:.0f} s: {_log_tail(worker.log_path)}"
            )
        limit = self.case_timeout * len(worker.task.case_ids) if worker.task else self.case_timeout
        self._fail(worker, "timeout", f"no answer within {limit:g} s; worker killed and replaced")
        self._replace(worker)
