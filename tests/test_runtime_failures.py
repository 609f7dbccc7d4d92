"""Isolation: every failure is classified, every healthy case measured, and the run exits 0."""

from __future__ import annotations

import json

from conftest import faulty_env, gemm_plan, run_cli

from opcollect.runtime.rundir import read_records
from opcollect.runtime.shards import read_runtimes, shard_paths

HEALTHY = [(1, 64, 64), (4, 128, 64), (2, 64, 128), (8, 32, 32), (3, 96, 64)]
FAULTY = [(1, 16, 11), (1, 16, 12), (1, 16, 13), (1, 16, 14), (1, 16, 15)]


def test_each_failure_is_classified_and_healthy_cases_are_measured(tmp_path):
    shapes = [
        HEALTHY[0],
        FAULTY[0],
        HEALTHY[1],
        FAULTY[1],
        HEALTHY[2],
        FAULTY[2],
        FAULTY[3],
        HEALTHY[3],
        FAULTY[4],
        HEALTHY[4],
    ]
    plan = gemm_plan(tmp_path / "plan.json", shapes)
    run_dir = tmp_path / "run"
    done = run_cli(
        "run",
        "--plan",
        str(plan),
        "--out",
        str(run_dir),
        "--device",
        "cpu",
        "--test-backend",
        "faulty_backend",
        "--case-timeout",
        "4",
        "--max-case-seconds",
        "0.05",
        env=faulty_env(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = {r["case_id"]: r for r in read_records(run_dir)}
    runtimes = {k: v for path in shard_paths(run_dir) for k, v in read_runtimes(path).items()}
    assert len(runtimes) >= 2  # the crashes and the sticky error replaced the first worker
    assert len(records) == len(shapes) == len(read_records(run_dir))  # each case exactly once
    by_k = {int(cid.rsplit("k=", 1)[1]): r for cid, r in records.items()}
    assert by_k[11]["error_class"] == "crash" and "SIGSEGV" in by_k[11]["message"]
    assert by_k[12]["error_class"] == "timeout" and "4 s" in by_k[12]["message"]
    assert by_k[13]["error_class"] == "unexpected" and "boom from the faulty backend" in by_k[13]["message"]
    assert by_k[14]["error_class"] == "kernel_limit" and by_k[14]["message"].startswith("does not fit")
    assert by_k[15]["error_class"] == "unexpected" and "illegal memory access" in by_k[15]["message"]
    for m, n, k in HEALTHY:
        record = records[f"gemm:float32:m={m},n={n},k={k}"]
        assert record["status"] == "ok", record
        stats = record["stats"]
        assert stats["latency"] > 0 and stats["latency_p25"] <= stats["latency"] <= stats["latency_p75"]
        assert stats["timing"] == "cpu" and stats["threads"] >= 1 and stats["samples"] >= 1
        runtime = runtimes[record["runtime_id"]]
        assert runtime["framework"] == "torch" and runtime["torch"] and runtime["device"] == "cpu"
        assert record["plan_hash"] == json.loads(plan.read_text())["plan_hash"]
    assert "failures crash 1, kernel_limit 1, timeout 1, unexpected 2" in done.stdout
    logs = sorted(p.name for p in (run_dir / "logs").iterdir())
    assert logs == ["worker-0.log"]


def test_a_run_of_only_failures_still_exits_0(tmp_path):
    plan = gemm_plan(tmp_path / "plan.json", [FAULTY[2], FAULTY[3]])
    out = str(tmp_path / "run")
    done = run_cli(
        "run",
        "--plan",
        str(plan),
        "--out",
        out,
        "--device",
        "cpu",
        "--test-backend",
        "faulty_backend",
        env=faulty_env(),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert {r["error_class"] for r in read_records(tmp_path / "run")} == {"unexpected", "kernel_limit"}
