"""Shards survive SIGKILL at any moment, and --resume ends with every planned case exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import ROOT, gemm_plan, run_cli

from opcollect.runtime.rundir import read_records
from opcollect.runtime.shards import ShardWriter, read_shard

SHAPES = [(m, n, 64) for m in (1, 2, 4, 8, 16) for n in (32, 64, 96, 128, 160, 192)]  # 30 quick cases
FAST = ["--device", "cpu", "--max-case-seconds", "0.02", "--min-samples", "3"]


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _start_run(plan: Path, run_dir: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "opcollect", "run", "--plan", str(plan), "--out", str(run_dir), *FAST, *extra],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _wait_for_records(run_dir: Path, count: int, proc: subprocess.Popen, limit: float = 120) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and proc.poll() is None:
        if (run_dir / "shards").is_dir() and len(read_records(run_dir)) >= count:
            return
        time.sleep(0.02)


@pytest.mark.parametrize("kill_after", [0, 3, 12])
def test_sigkill_then_resume_records_every_case_exactly_once(tmp_path, kill_after):
    plan = gemm_plan(tmp_path / "plan.json", SHAPES)
    run_dir = tmp_path / "run"
    proc = _start_run(plan, run_dir)
    if kill_after:
        _wait_for_records(run_dir, kill_after, proc)
    else:  # inside start-up: the run directory exists, the worker is still importing torch
        deadline = time.monotonic() + 60
        while not (run_dir / "run.json").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    workers = _children(proc.pid)
    proc.kill()  # SIGKILL to the run alone: its workers must die with it
    proc.wait()
    deadline = time.monotonic() + 5
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(w) for w in workers), "a worker outlived its killed parent"
    before = len(read_records(run_dir)) if (run_dir / "shards").exists() else 0
    assert before < len(SHAPES)
    done = run_cli("run", "--plan", str(plan), "--out", str(run_dir), "--resume", *FAST)
    assert done.returncode == 0, done.stderr[-2000:]
    counts = Counter(r["case_id"] for r in read_records(run_dir))
    assert set(counts) == {f"gemm:float32:m={m},n={n},k={k}" for m, n, k in SHAPES}
    assert set(counts.values()) == {1}
    assert f"({before} recorded before)" in done.stdout
    events = [json.loads(p.read_text()) for p in (run_dir / "events").iterdir()]
    finished = [e for e in events if e["finished_at"]]
    assert len(finished) == 1 and finished[0]["rows"] == len(SHAPES) - before  # the resume's own event


def test_repeated_kills_of_the_whole_group(tmp_path):
    """Kill the run and its workers together several times, at growing record counts; then finish."""
    plan = gemm_plan(tmp_path / "plan.json", SHAPES)
    run_dir = tmp_path / "run"
    for round_, target in enumerate((2, 9, 17)):
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "opcollect",
                "run",
                "--plan",
                str(plan),
                "--out",
                str(run_dir),
                *FAST,
                *(["--resume"] if round_ else []),
            ],
            cwd=ROOT,
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        _wait_for_records(run_dir, target, proc)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    done = run_cli("run", "--plan", str(plan), "--out", str(run_dir), "--resume", *FAST)
    assert done.returncode == 0, done.stderr[-2000:]
    counts = Counter(r["case_id"] for r in read_records(run_dir))
    assert len(counts) == len(SHAPES) and set(counts.values()) == {1}


def test_resume_refuses_another_plan_naming_both_hashes(tmp_path):
    first = gemm_plan(tmp_path / "a.json", SHAPES[:2])
    second = gemm_plan(tmp_path / "b.json", SHAPES[2:4])
    run_dir = tmp_path / "run"
    assert run_cli("run", "--plan", str(first), "--out", str(run_dir), *FAST).returncode == 0
    refused = run_cli("run", "--plan", str(second), "--out", str(run_dir), "--resume", *FAST)
    assert refused.returncode == 2
    a, b = (json.loads(p.read_text())["plan_hash"] for p in (first, second))
    assert a in refused.stderr and b in refused.stderr
    again = run_cli("run", "--plan", str(first), "--out", str(run_dir), *FAST)
    assert again.returncode == 2 and "pass --resume" in again.stderr


def test_retry_failed_runs_failed_cases_again(tmp_path):
    from conftest import faulty_env

    plan = gemm_plan(tmp_path / "plan.json", [(1, 16, 13), (1, 32, 32)])
    run_dir = tmp_path / "run"
    faulty = ("--test-backend", "faulty_backend", *FAST)
    assert run_cli("run", "--plan", str(plan), "--out", str(run_dir), *faulty, env=faulty_env()).returncode == 0
    plain = run_cli("run", "--plan", str(plan), "--out", str(run_dir), "--resume", *faulty, env=faulty_env())
    assert plain.returncode == 0 and "measured 0 this run (2 recorded before)" in plain.stdout
    retried = run_cli(
        "run", "--plan", str(plan), "--out", str(run_dir), "--resume", "--retry-failed", *faulty, env=faulty_env()
    )
    assert retried.returncode == 0
    attempts = sorted((r["case_id"], r["attempt"]) for r in read_records(run_dir))
    assert attempts == [
        ("gemm:float32:m=1,n=16,k=13", 1),
        ("gemm:float32:m=1,n=16,k=13", 2),
        ("gemm:float32:m=1,n=32,k=32", 1),
    ]


def test_torn_last_line_is_skipped(tmp_path):
    path = tmp_path / "shard.jsonl"
    writer = ShardWriter(path)
    writer.append({"case_id": "a", "status": "ok"})
    writer.append({"case_id": "b", "status": "ok"})
    writer.close()
    with open(path, "ab") as handle:
        handle.write(b'{"case_id": "c", "sta')  # a write cut short by SIGKILL
    assert [r["case_id"] for r in read_shard(path)] == ["a", "b"]


def test_run_refuses_a_plan_of_other_collector_source(tmp_path):
    from opcollect.plans.gemm import GemmCase
    from opcollect.plans.planfile import write_plan
    from opcollect.plans.planner import plan_of_cases

    plan = tmp_path / "plan.json"
    write_plan(plan_of_cases("torch", "cpu", "gemm", [GemmCase("float32", 1, 8, 8)], "x", "f" * 64), plan)
    done = run_cli("run", "--plan", str(plan), "--out", str(tmp_path / "run"), *FAST)
    assert done.returncode == 2
    assert "planned by collector_hash " + "f" * 64 in done.stderr and "re-plan" in done.stderr
    assert not (tmp_path / "run").exists()


def test_sigterm_ends_the_run_promptly_and_resume_completes(tmp_path):
    plan = gemm_plan(tmp_path / "plan.json", SHAPES)
    run_dir = tmp_path / "run"
    proc = _start_run(plan, run_dir)
    _wait_for_records(run_dir, 2, proc)
    workers = _children(proc.pid)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 128 + signal.SIGTERM
    assert not any(_alive(w) for w in workers)
    done = run_cli("run", "--plan", str(plan), "--out", str(run_dir), "--resume", *FAST)
    assert done.returncode == 0
    counts = Counter(r["case_id"] for r in read_records(run_dir))
    assert len(counts) == len(SHAPES) and set(counts.values()) == {1}


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_run_ends_in_one_line_and_keeps_its_cases(tmp_path, signum):
    plan = gemm_plan(tmp_path / "plan.json", SHAPES)
    run_dir = tmp_path / "run"
    proc = _start_run(plan, run_dir)
    _wait_for_records(run_dir, 2, proc)
    workers = _children(proc.pid)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 128 + signum
    lines = [line for line in err.decode().splitlines() if line.startswith("opcollect:")]  # progress aside
    assert len(lines) == 1 and "Traceback" not in err.decode(), err.decode()
    assert err.decode().rstrip().endswith(lines[0])
    assert lines[0].startswith(f"opcollect: interrupted ({signal.Signals(signum).name}): the cases recorded in")
    assert "--resume" in lines[0]
    assert not any(_alive(w) for w in workers)
    kept = len(read_records(run_dir))
    assert kept >= 2 and not list(run_dir.rglob("*.tmp"))
    done = run_cli("run", "--plan", str(plan), "--out", str(run_dir), "--resume", *FAST)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"({kept} recorded before)" in done.stdout


def test_an_unstarted_run_skeleton_resumes(tmp_path):
    from opcollect.runtime.planfile import read_plan
    from opcollect.runtime.rundir import prepare_run_dir

    plan = gemm_plan(tmp_path / "plan.json", SHAPES[:3])
    run_dir = tmp_path / "run"
    prepare_run_dir(run_dir, plan, read_plan(plan), resume=False)  # what a run killed before its first case leaves
    assert read_records(run_dir) == []
    done = run_cli("run", "--plan", str(plan), "--out", str(run_dir), "--resume", *FAST)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "measured 3 this run (0 recorded before)" in done.stdout
    assert sorted(Counter(r["case_id"] for r in read_records(run_dir)).values()) == [1, 1, 1]


# --- a run directory has one owner at a time; the plan is read once (issue 21: D1, D10) ----------------


def test_a_second_run_or_a_resume_while_one_runs_is_refused_naming_the_holder(tmp_path):
    """D10: two `run`s on one --out, or `--resume` while another ran, both measured (125/130 cases twice)."""
    from opcollect.errors import InputError
    from opcollect.runtime.planfile import read_plan
    from opcollect.runtime.rundir import prepare_run_dir

    plan = gemm_plan(tmp_path / "plan.json", SHAPES)
    run_dir = tmp_path / "run"
    first = _start_run(plan, run_dir, "--max-case-seconds", "0.5")  # 30 cases: it runs for a while
    try:
        _wait_for_records(run_dir, 1, first)
        assert first.poll() is None, first.communicate()
        for extra in ((), ("--resume",)):
            second = run_cli("run", "--plan", str(plan), "--out", str(run_dir), *FAST, *extra)
            assert second.returncode == 2 and second.stderr.count("\n") == 1, second.stderr
            assert f"{run_dir}: another run owns it (pid {first.pid} on " in second.stderr, second.stderr
    finally:
        first.wait(120)
    assert first.returncode == 0
    counts = Counter(r["case_id"] for r in read_records(run_dir))
    assert len(counts) == len(SHAPES) and set(counts.values()) == {1}
    # in one process too: the lock lives as long as what prepare_run_dir returned
    held = prepare_run_dir(run_dir, plan, read_plan(plan), resume=True)
    with pytest.raises(InputError, match=f"another run owns it \\(pid {os.getpid()} on "):
        prepare_run_dir(run_dir, plan, read_plan(plan), resume=True)
    del held
    assert len(prepare_run_dir(run_dir, plan, read_plan(plan), resume=True).latest) == len(SHAPES)


def test_a_plan_from_a_pipe_is_never_run_beside_an_empty_plan_json(tmp_path):
    """D1: `run --plan <(cat p.json)` measured every case, then RUN_DIR/plan.json was empty (read a 2nd time)."""
    plan = gemm_plan(tmp_path / "plan.json", SHAPES[:2])
    run_dir = tmp_path / "run"
    read_end, write_end = os.pipe()
    os.write(write_end, plan.read_bytes())
    os.close(write_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "opcollect", "run", "--plan", f"/dev/fd/{read_end}", "--out", str(run_dir), *FAST],
            cwd=ROOT, capture_output=True, text=True, pass_fds=(read_end,), timeout=120,
        )  # fmt: skip
    finally:
        os.close(read_end)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert "--plan /dev/fd/" in done.stderr
    assert not (run_dir / "shards").exists() or not list((run_dir / "shards").iterdir())  # nothing measured
    assert not (run_dir / "plan.json").exists()


def test_the_plan_kept_in_the_run_directory_is_the_plan_that_was_read(tmp_path):
    """plan_bytes reads the plan file again for RUN_DIR/plan.json: a device is refused (it cannot be read twice),
    and a file that no longer holds the plan read first, or no plan at all, is refused as changed."""
    from opcollect.errors import InputError
    from opcollect.runtime.planfile import read_plan
    from opcollect.runtime.rundir import plan_bytes

    path = gemm_plan(tmp_path / "plan.json", SHAPES[:2])
    plan = read_plan(path)
    assert plan_bytes(path, plan) == path.read_bytes()
    with pytest.raises(InputError) as refused:
        plan_bytes(Path("/dev/null"), plan)
    assert str(refused.value) == (
        "--plan /dev/null: not a regular file (a pipe or device), so the run directory cannot keep it; save the plan "
        "as a file (`opcollect plan -o p.json`) and give that"
    )
    changed = f"--plan {path}: changed while the run started; give a plan file nobody is writing"
    for replacement in (gemm_plan(tmp_path / "other.json", SHAPES[2:4]).read_bytes(), b'{"ops": '):
        path.write_bytes(replacement)
        with pytest.raises(InputError) as refused:
            plan_bytes(path, plan)
        assert str(refused.value) == changed


def test_a_run_directory_is_described_by_hash_shard_and_selection_and_a_used_path_is_refused(tmp_path):
    from opcollect.errors import InputError
    from opcollect.runtime.rundir import check_fresh, describe_identity

    held = {"plan_hash": "ab12", "shard": "2/4", "selection": {"ops": ["gemm", "moe"], "smoke": True}}
    assert describe_identity(held) == "plan_hash ab12 shard 2/4 (gemm,moe smoke)"
    held["selection"]["case_filter"] = "m<=64"
    assert describe_identity(held) == "plan_hash ab12 shard 2/4 (gemm,moe smoke filter 'm<=64')"
    assert describe_identity({"plan_hash": "cd34", "shard": None, "selection": None}) == "plan_hash cd34 ()"
    check_fresh(tmp_path / "new")  # a new path
    (tmp_path / "empty").mkdir()
    check_fresh(tmp_path / "empty")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "notes.txt").write_text("mine")
    (tmp_path / "file").write_text("")
    for taken in (tmp_path / "used", tmp_path / "file"):
        with pytest.raises(InputError) as refused:
            check_fresh(taken)
        assert str(refused.value) == f"{taken}: exists and is not a run directory; choose an empty or new --out"
