"""Merge benchmark: 1,000,000 synthetic records in 8 shards merged, checked and verified.

The run directory is written the way `run` writes one (plan.json, run.json, events, 8 shards of JSON
lines, each with its runtime line). Merge, check and verify each run in a fresh process; the figure is
the median of 3 runs, with peak RSS. Baseline measured in the same run: parsing the same shards line by
line with json.loads (what a plain Python reader does) against the Arrow reader merge uses.
Targets on the 2-core dev machine: merge + check + verify under 10 s, under 2 GB peak RSS.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RECORDS = 1_000_000
SHARDS = 8
RUNS = 3

CHILD = r"""
import json, resource, sys, time
from pathlib import Path
from opcollect.project import find_project
step, run_dir, tables = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
start = time.perf_counter()
if step == "merge":
    from opcollect.tables.merge import merge
    merge([run_dir], tables, find_project())
elif step == "lock":  # 1000 uncontended acquisitions of the merge lock
    from opcollect.tables.store import locked
    for _ in range(1000):
        with locked(tables):
            pass
elif step == "check":
    from opcollect.tables.rules import check_tables
    assert not [f for f in check_tables(tables) if not f.warning]
elif step == "verify":
    from opcollect.tables.verify import verify_tables
    assert verify_tables(tables).clean
elif step == "json-lines":
    for path in sorted((run_dir / "shards").glob("*.jsonl")):
        with open(path) as handle:
            rows = [json.loads(line) for line in handle]
elif step == "arrow":
    from opcollect.tables.ingest import load_run
    load_run(run_dir)
print(json.dumps({"seconds": time.perf_counter() - start,
                  "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def write_run(root: Path) -> Path:
    from opcollect.plans.gemm import GemmCase
    from opcollect.plans.hashes import installed_collector_hash
    from opcollect.plans.planfile import read_plan, write_plan
    from opcollect.plans.planner import plan_of_cases
    from opcollect.runtime.rundir import prepare_run_dir

    run = root / "run"
    collector = installed_collector_hash() or "0" * 64
    side = int(RECORDS**0.5)
    cases = [GemmCase("bfloat16", m, n, 1024) for m in range(1, side + 1) for n in range(1, side + 1)]
    plan = plan_of_cases("vllm", "90", "gemm", cases, "cutlass", collector)
    ids = plan.ops["gemm"].ids
    plan_hash = plan.plan_hash
    write_plan(plan, run / "plan.json")
    prepare_run_dir(run, run / "plan.json", read_plan(run / "plan.json"), resume=False)
    (run / "events" / "r1.json").write_text(
        json.dumps(
            {
                "run_id": "r1",
                "collected_at": "2026-11-30T00:00:00.000+00:00",
                "finished_at": "2026-11-30T01:00:00.000+00:00",
                "host": "node1",
                "shard": None,
                "rows": RECORDS,
                "failures": 0,
                "image_digest": None,
            }
        )
    )
    per_shard = len(ids) // SHARDS
    for shard in range(SHARDS):
        runtime = json.dumps(
            {
                "kind": "runtime",
                "runtime_id": f"r1.w{shard}.1",
                "worker": shard,
                "worker_device": f"cuda:{shard}",
                "framework": "vllm",
                "version": "0.24.0",
                "python": "3.12.3",
                "torch": "2.8.0",
                "cuda": "12.8",
                "driver": "570.1",
                "device": "NVIDIA H200",
                "host": "node1",
            }
        )
        lines = [runtime]
        for i in range(shard * per_shard, (shard + 1) * per_shard):
            latency = 0.001 * (1 + i % 977)
            lines.append(
                f'{{"case_id":"{ids[i]}","status":"ok","stats":{{"latency":{latency},"latency_p25":{latency * 0.99},'
                f'"latency_p75":{latency * 1.01},"samples":10,"noise":0.02,"timing":"graph","calls_per_sample":8,'
                f'"sampled_seconds":0.01,"warmup_seconds":0.1,"l2":"rotate:4","threads":null,"sm_clock_mhz":1980.0,'
                f'"throttled_dropped":0}},"kernel_source":"cutlass","op":"gemm","row_id":"{ids[i]}",'
                f'"dispatch":"cutlass","attempt":1,"plan_hash":"{plan_hash}","collector_hash":"{collector}",'
                f'"run_id":"r1","worker":{shard},"runtime_id":"r1.w{shard}.1",'
                f'"recorded_at":"2026-11-30T00:{i // 20000:02d}:00.000+00:00"}}'
            )
        (run / "shards" / f"r1-w{shard}.jsonl").write_text("\n".join(lines) + "\n")
    return run


def child(step: str, run: Path, tables: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, step, str(run), str(tables)], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(done.stderr[-2000:])
    return json.loads(done.stdout)


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="opcollect-bench-merge-"))
    try:
        start = time.perf_counter()
        run = write_run(root)
        size = sum(p.stat().st_size for p in (run / "shards").iterdir())
        elapsed = time.perf_counter() - start
        print(f"wrote {RECORDS} records in {SHARDS} shards ({size / 2**20:.0f} MiB) in {elapsed:.1f} s")
        totals, peaks, steps = [], [], {"merge": [], "check": [], "verify": []}
        for i in range(RUNS):
            tables = root / f"tables{i}"
            results = {step: child(step, run, tables) for step in steps}
            for step, result in results.items():
                steps[step].append(result["seconds"])
            totals.append(sum(r["seconds"] for r in results.values()))
            peaks.append(max(r["rss"] for r in results.values()))
        remerge = [child("merge", run, root / f"tables{i}")["seconds"] for i in range(RUNS)]
        lock = child("lock", run, root / "tables0")
        lines_parse = child("json-lines", run, root / "unused")
        arrow_parse = child("arrow", run, root / "unused")
        table = next(root.glob("tables0/**/gemm_perf.parquet"))
        print(f"opcollect merge benchmark ({RECORDS} records, {SHARDS} shards, median of {RUNS} runs)")
        for step, values in steps.items():
            print(f"  {step:7s} {statistics.median(values):6.2f} s")
        print(
            f"  merge + check + verify: {statistics.median(totals):.2f} s   [target < 10 s]; peak RSS "
            f"{max(peaks) / 2**30:.2f} GiB   [target < 2 GiB]; table {table.stat().st_size / 2**20:.1f} MiB zstd"
        )
        print(
            f"  merge again into those tables (lock, verify of the existing tree, old rows read back): "
            f"{statistics.median(remerge):.2f} s; the lock alone: {lock['seconds'] / 1000 * 1e6:.0f} us per merge"
        )
        print(
            f"  baseline, reading the shards: json.loads per line {lines_parse['seconds']:.2f} s "
            f"({lines_parse['rss'] / 2**30:.2f} GiB) vs load_run with Arrow {arrow_parse['seconds']:.2f} s "
            f"({arrow_parse['rss'] / 2**30:.2f} GiB): ratio {arrow_parse['seconds'] / lines_parse['seconds']:.2f}"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
