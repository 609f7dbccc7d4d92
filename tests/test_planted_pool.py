"""The pool replaces a worker after a sticky CUDA error or a timeout, and keeps it after an ordinary failure.

Uses tests/light_backend.py, whose workers start without torch, so each case costs milliseconds.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from conftest import TESTS

from opcollect.runtime import pool as pool_module
from opcollect.runtime.harness import TimingConfig
from opcollect.runtime.pool import Pool, Task

HEALTHY, HANG, STICKY, OOM = 8, 12, 15, 16


def _task(k: int) -> Task:
    case_id = f"gemm:float32:m=1,n=8,k={k}"
    return Task(case_id, "gemm", "x", (case_id,), ({"gemm_dtype": "float32", "m": 1, "n": 8, "k": k},), 1)


def _run(tmp_path, monkeypatch, ks: list[int], case_timeout: float = 60.0):
    """(k, runtime_id, result) per case in answer order, and how many workers the pool started."""
    monkeypatch.setenv("PYTHONPATH", str(TESTS) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    answered = []

    def on_result(worker, task, results):
        for result in results:
            answered.append((task.cases[0]["k"], worker.runtime_id, result))

    pool = Pool("light_backend", ["cpu"], None, TimingConfig(), case_timeout, tmp_path, on_result)
    pool.run([_task(k) for k in ks])
    return answered, pool.spawned


def test_a_sticky_cuda_error_replaces_the_worker(tmp_path, monkeypatch):
    answered, spawned = _run(tmp_path, monkeypatch, [HEALTHY, STICKY, HEALTHY + 1])
    (_, first, ok1), (_, sticky_worker, sticky), (_, after, ok2) = answered
    assert sticky["status"] == "failed" and sticky["error_class"] == "unexpected"
    assert "illegal memory access" in sticky["message"]
    assert ok1["status"] == ok2["status"] == "ok"
    assert first == sticky_worker and after != sticky_worker
    assert ok1["kernel_source"] != ok2["kernel_source"]  # another process measured the next case
    assert spawned == 2


def test_an_out_of_memory_error_keeps_the_worker(tmp_path, monkeypatch):
    answered, spawned = _run(tmp_path, monkeypatch, [OOM, HEALTHY])
    (_, a, oom), (_, b, ok) = answered
    assert oom["error_class"] == "oom" and ok["status"] == "ok"
    assert a == b and spawned == 1


def test_a_hanging_case_times_out_and_the_next_runs_on_a_new_worker(tmp_path, monkeypatch):
    answered, spawned = _run(tmp_path, monkeypatch, [HANG, HEALTHY], case_timeout=1.0)
    (_, a, hung), (_, b, ok) = answered
    assert hung["status"] == "failed" and hung["error_class"] == "timeout"
    assert ok["status"] == "ok" and a != b and spawned == 2


def _backend(tmp_path, monkeypatch, name: str, setup_body: str) -> str:
    """A backend module in tmp_path: the light backend with its own setup_worker."""
    (tmp_path / f"{name}.py").write_text(
        "import os, sys, time\nfrom light_backend import *  # noqa: F403\n\n"
        f"def setup_worker(device, threads):\n{setup_body}"
    )
    path = os.pathsep.join([str(tmp_path), str(TESTS), os.environ.get("PYTHONPATH", "")])
    monkeypatch.setenv("PYTHONPATH", path)
    return name


def _pool(tmp_path, backend: str, answered: list) -> Pool:
    def on_result(worker, task, results):
        answered.extend((worker.runtime_id, result) for result in results)

    (tmp_path / "logs").mkdir()
    return Pool(backend, ["cpu"], None, TimingConfig(), 60.0, tmp_path / "logs", on_result)


def test_a_worker_that_dies_before_it_is_ready_stops_the_run_with_its_exit_and_log(tmp_path, monkeypatch):
    backend = _backend(
        tmp_path, monkeypatch, "dies_early", "    print('no device here', file=sys.stderr)\n    sys.exit(3)\n"
    )
    answered = []
    with pytest.raises(RuntimeError) as stopped:
        _pool(tmp_path, backend, answered).run([_task(HEALTHY)])
    assert str(stopped.value) == "worker exited with code 3 before it was ready: no device here"
    assert answered == []


def test_a_worker_never_ready_is_killed_at_the_ready_timeout(tmp_path, monkeypatch):
    backend = _backend(
        tmp_path,
        monkeypatch,
        "never_ready",
        "    print('warming up', file=sys.stderr, flush=True)\n    time.sleep(600)\n",
    )
    monkeypatch.setattr(pool_module, "READY_TIMEOUT_SECONDS", 2.0)
    pool = _pool(tmp_path, backend, [])
    started = time.monotonic()
    with pytest.raises(RuntimeError) as stopped:
        pool.run([_task(HEALTHY)])
    assert str(stopped.value) == "worker on cpu not ready after 2 s: warming up"
    assert time.monotonic() - started < 30
    assert pool.workers[0].proc.returncode == -signal.SIGKILL  # killed, and closed again by run's cleanup


def test_a_worker_whose_input_is_gone_fails_the_row_as_a_crash_and_the_run_goes_on(tmp_path, monkeypatch):
    """The row cannot be sent (the worker closed its end of the pipe): the send's broken pipe is swallowed, the
    worker's exit is seen, and the row fails as crash with the exit and the log's last line."""
    backend = _backend(tmp_path, monkeypatch, "deaf", "    os.close(0)\n")
    answered = []
    _pool(tmp_path, backend, answered).run([_task(HEALTHY)])
    [(runtime_id, result)] = answered
    assert runtime_id == "w0.1" and result["status"] == "failed" and result["error_class"] == "crash"
    assert result["message"].startswith("worker exited with code 1; log: Traceback (most recent call last): | ")
    assert result["message"].endswith("OSError: [Errno 9] Bad file descriptor"), result["message"]


def test_exit_statuses_and_log_tails_are_rendered_for_the_crash_message(tmp_path):
    from opcollect.runtime.pool import _log_tail, _signal_name

    assert _signal_name(None) == "still running"
    assert _signal_name(-9) == "killed by SIGKILL"
    assert _signal_name(-77) == "killed by signal 77"  # no signal of that number
    assert _signal_name(4) == "exited with code 4"
    assert _log_tail(tmp_path / "absent.log") == ""
    (tmp_path / "w.log").write_text("first\nsecond\n" + "x" * 10 + "\n\n")
    assert _log_tail(tmp_path / "w.log") == "first | second | xxxxxxxxxx"
    assert _log_tail(tmp_path / "w.log", limit=13) == "nd | xxxxxxxxxx"  # the last 13 characters


def test_an_answer_for_another_row_is_dropped(tmp_path):
    from opcollect.runtime.pool import _Worker

    answered = []
    pool = Pool("light_backend", ["cpu"], None, TimingConfig(), 60.0, tmp_path, lambda *a: answered.append(a))
    worker = _Worker(0, "cpu", None, tmp_path / "w.log", identity={}, task=_task(HEALTHY), deadline=5.0)
    pool._answer(worker, {"row_id": "gemm:float32:m=1,n=8,k=99", "results": [{"status": "ok"}]})
    assert answered == [] and worker.task is None and worker.deadline == float("inf")
    worker.task = _task(HEALTHY)
    pool._answer(worker, {"row_id": worker.task.row_id, "results": [{"status": "ok"}]})
    assert answered == [(worker, _task(HEALTHY), [{"status": "ok"}])]
