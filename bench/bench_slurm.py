"""Slurm scale-out benchmark: the same torch CPU plan collected as 1 array task and as 2 (each task one CPU),
submitted with `opcollect collect --slurm` to the cluster that answers here (scripts/slurm_up.sh starts a
one-node one), timed from submission until its merge job has left the queue. Median of several runs of each, and
the ratio 1 task / 2 tasks (on this 2-core machine at most 2 tasks run at once, so 2.0 is the ceiling).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time

RUNS = 3
PLAN = ("--sm", "cpu", "--ops", "gemm", "--case-filter", "gemm:float32", "--max-case-seconds", "0.2")


def _wait(job: str) -> None:
    while subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip():
        time.sleep(0.5)


def _collect(shards: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "opcollect", "collect", "torch", "--slurm", "--shards", str(shards), *PLAN,
             "--out", f"{tmp}/run", "--tables", f"{tmp}/tables"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        words = done.stdout.split()
        _wait(words[words.index("merge") + 2])
        elapsed = time.perf_counter() - start
        status = subprocess.run([sys.executable, "-m", "opcollect", "status", f"{tmp}/run"], capture_output=True,
                                text=True).stdout  # fmt: skip
        if f"{shards} shards: {shards} done" not in status:
            raise SystemExit(f"the {shards}-task collection did not finish:\n{status}")
        return elapsed


def main() -> None:
    if subprocess.run(["sinfo", "-h"], capture_output=True).returncode != 0:
        raise SystemExit("no Slurm controller answers: start one with scripts/slurm_up.sh")
    planned = (
        subprocess.run(
            [sys.executable, "-m", "opcollect", "plan", "--backend", "torch", *PLAN[:6]], capture_output=True, text=True
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    one, two = [], []
    for _ in range(RUNS):  # interleaved, so drift hits both
        one.append(_collect(1))
        two.append(_collect(2))
    m1, m2 = statistics.median(one), statistics.median(two)
    print(f"plan: {planned}")
    print(f"1 task : median {m1:.1f} s over {RUNS} runs ({', '.join(f'{t:.1f}' for t in one)})")
    print(f"2 tasks: median {m2:.1f} s over {RUNS} runs ({', '.join(f'{t:.1f}' for t in two)})")
    print(f"ratio 1 task / 2 tasks: {m1 / m2:.2f}x (submission to merged tables)")


if __name__ == "__main__":
    main()
