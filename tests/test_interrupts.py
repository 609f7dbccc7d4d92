"""Interrupts and limits end in one line (issue 21 D33, D38) and `--workers` fits the cores."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time

from conftest import ROOT

from opcollect.runtime import devices
from opcollect.runtime.rundir import read_records


def _one_line(err: str, start: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("opcollect:")]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert lines[0].startswith(start), lines[0]
    return lines[0]


def test_out_of_memory_is_one_line_and_exit_2():
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (200 * 2**20, 200 * 2**20))

    done = subprocess.run(
        [sys.executable, "-m", "opcollect", "plan", "--backend", "all", "--sm", "all"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=limit,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    _one_line(done.stderr, "opcollect: error: out of memory")


def test_ctrl_c_of_a_local_collect_is_one_line_and_keeps_the_cases(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "opcollect", "collect", "torch", "--local", "--device", "cpu", "--ops", "gemm",
         "--out", str(run_dir), "--tables", str(tmp_path / "tables"), "--max-case-seconds", "0.02",
         "--min-samples", "3"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 600  # generous: a loaded machine starts the workers slowly
    while time.monotonic() < deadline and proc.poll() is None:
        if (run_dir / "shards").is_dir() and len(read_records(run_dir)) >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, f"the collect ended before it was interrupted: {proc.communicate()[1][-3000:]}"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)  # the workers' shutdown is slow on a loaded machine
    assert proc.returncode == 130, err[-3000:]
    _one_line(err, "opcollect: interrupted (SIGINT): the cases recorded in the run directory are kept")
    assert len(read_records(run_dir)) >= 2  # finished work stays
    assert not (tmp_path / "tables").exists()  # nothing was merged from a run cut short


def test_cpu_workers_are_capped_at_the_cores(capsys, monkeypatch):
    monkeypatch.setattr(devices, "cpu_cores", lambda: 3)
    assert devices.devices("cpu", 64) == ["cpu"] * 3
    assert "--workers 64: this machine has 3 cores; running 3 CPU workers" in capsys.readouterr().err
    assert devices.devices("cpu", 2) == ["cpu"] * 2 and capsys.readouterr().err == ""
    assert devices.devices("cpu", None) == ["cpu"]


def test_cpu_cores_is_what_this_process_may_use():
    assert devices.cpu_cores() == len(os.sched_getaffinity(0))
