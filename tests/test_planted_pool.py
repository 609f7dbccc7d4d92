"""The pool replaces a worker after a sticky CUDA error or a timeout, and keeps it after an ordinary failure.

Uses tests/light_backend.py, whose workers start without torch, so each case costs milliseconds.
"""

from __future__ import annotations

import os

from conftest import TESTS

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
