"""A row that spans several devices (comm, custom all-reduce: its ranks start on cuda:0..N-1) runs with every
other worker idle, so no single-device case is timed on a GPU its ranks use, and no rank shares a GPU with one.

Uses tests/light_backend.py: its slow cases report the wall-clock interval they ran in.
"""

from __future__ import annotations

import os

from conftest import TESTS

from opcollect.runtime.harness import TimingConfig
from opcollect.runtime.pool import Pool, Task

SLOW = 20


def _gemm(i: int) -> Task:
    case_id = f"gemm:float32:m={i},n=8,k={SLOW}"
    return Task(case_id, "gemm", "x", (case_id,), ({"gemm_dtype": "float32", "m": i, "n": 8, "k": SLOW},), 1)


def _comm(gpus: int) -> Task:
    fields = {"nccl_dtype": "half", "num_gpus": gpus, "message_size": 1024, "op_name": "all_reduce"}
    case_id = f"comm:half:op_name=all_reduce,num_gpus={gpus},message_size=1024"
    return Task(case_id, "comm", "x", (case_id,), (fields,), 1)


def _intervals(tmp_path, monkeypatch, tasks: list[Task]) -> dict[str, tuple[float, float]]:
    monkeypatch.setenv("PYTHONPATH", str(TESTS) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    spans = {}

    def on_result(worker, task, results):
        for result in results:
            _, _, start, end = result["kernel_source"].split(":")
            spans[result["case_id"]] = (float(start), float(end))

    Pool("light_backend", ["cpu", "cpu"], None, TimingConfig(), 60.0, tmp_path, on_result).run(tasks)
    return spans


def test_a_multi_device_row_runs_with_every_other_worker_idle(tmp_path, monkeypatch):
    tasks = [_gemm(1), _comm(2), _gemm(2), _gemm(3), _comm(4), _gemm(4)]
    spans = _intervals(tmp_path, monkeypatch, tasks)
    assert set(spans) == {t.case_ids[0] for t in tasks}
    multi = [cid for cid in spans if cid.startswith("comm")]
    for m in multi:
        m_start, m_end = spans[m]
        for other, (start, end) in spans.items():
            if other != m:
                assert end <= m_start or start >= m_end, f"{other} ran beside {m}"
    # the single-device rows still share the two workers
    singles = sorted(spans[cid] for cid in spans if cid.startswith("gemm"))
    assert any(b[0] < a[1] for a, b in zip(singles, singles[1:]))


def test_a_one_rank_row_is_not_held_back():
    assert _comm(1).ranks == 1 and _gemm(1).ranks == 1 and _comm(8).ranks == 8
