"""Planning benchmark: time and peak RSS to plan one (backend, SM) and the full 4 x 8 matrix.

Each measurement runs in a fresh subprocess (cold imports, cold caches). Prints medians of several runs
and ratios against baselines measured in the same run:
  - the matrix with shared expansion against the same matrix with a fresh planner per pair
  - parsing the case YAML with libyaml (what the planner uses) against the pure-Python loader
  - with --anchor DIR --anchor-python PY: `opcollect plan --backend vllm --sm 90 --json` against the
    public aiconfigurator collector's own plan overview in the checkout DIR
    (`PY collector/collect.py --backend vllm --sm 90 --plan-only --model-cases-full`, which lists ops
    without expanding a case; it needs pyyaml, numpy and tqdm, and imports torch when PY has it, as in
    the framework images it runs in), interleaved, median of 7 each
Targets on the 2-core dev machine: one pair < 0.5 s, matrix < 10 s, peak RSS < 1 GB, anchor ratio <= 0.6.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from opcollect.plans.planner import Planner
from opcollect.names import BACKENDS, SMS
from opcollect.project import find_project
t1 = time.perf_counter()
mode = sys.argv[1]
counts = {}
if mode == "pair":
    plan = Planner(find_project()).plan("vllm", "90")
    counts = {op: len(s.ids) for op, s in plan.ops.items()}
elif mode == "matrix":
    planner = Planner(find_project())
    total = sum(planner.plan(b, s).total_cases for b in BACKENDS for s in SMS)
    counts = {"total": total}
elif mode == "matrix-unshared":
    total = sum(Planner(find_project()).plan(b, s).total_cases for b in BACKENDS for s in SMS)
    counts = {"total": total}
t2 = time.perf_counter()
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"import_s": t1 - t0, "plan_s": t2 - t1, "rss": rss, "counts": counts}))
"""


def measure(mode: str, runs: int) -> dict:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True)
        wall = time.perf_counter() - start
        data = json.loads(out.stdout)
        data["wall_s"] = wall
        samples.append(data)
    return {
        "plan_s": statistics.median(s["plan_s"] for s in samples),
        "import_s": statistics.median(s["import_s"] for s in samples),
        "wall_s": statistics.median(s["wall_s"] for s in samples),
        "rss_mb": max(s["rss"] for s in samples) / 2**20,
        "counts": samples[0]["counts"],
        "runs": runs,
    }


OURS = [sys.executable, "-m", "opcollect", "plan", "--backend", "vllm", "--sm", "90", "--json"]


def wall(command: list[str], cwd: Path | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(command, cwd=cwd, capture_output=True, check=True)
    return time.perf_counter() - start


def cli_wall(runs: int) -> float:
    return statistics.median(wall(OURS) for _ in range(runs))


def anchor_side_by_side(anchor: Path, python: str, runs: int) -> None:
    """Ours and the anchor's plan overview, interleaved so both see the same machine load."""
    theirs = [python, "collector/collect.py", "--backend", "vllm", "--sm", "90", "--plan-only", "--model-cases-full"]
    with_torch = subprocess.run([python, "-c", "import torch"], capture_output=True).returncode == 0
    ours_s, theirs_s = [], []
    for _ in range(runs):
        ours_s.append(wall(OURS))
        theirs_s.append(wall(theirs, cwd=anchor))
    a, b = statistics.median(ours_s), statistics.median(theirs_s)
    print(
        f"  side by side (median of {runs}, interleaved): ours {a:.3f} s; aiconfigurator plan-only {b:.3f} s "
        f"({'torch importable, as in its images' if with_torch else 'without torch'}); ratio {a / b:.2f}   "
        "[target <= 0.6]"
    )


def yaml_parse(runs: int) -> tuple[float, float]:
    import glob

    import yaml

    texts = [open(p).read() for p in sorted(glob.glob("cases/**/*.yaml", recursive=True))]
    results = []
    for loader in (yaml.CSafeLoader, yaml.SafeLoader):
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            for text in texts:
                yaml.load(text, Loader=loader)
            times.append(time.perf_counter() - start)
        results.append(statistics.median(times))
    return results[0], results[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--anchor", type=Path, help="a checkout of ai-dynamo/aiconfigurator")
    parser.add_argument("--anchor-python", default=sys.executable, help="a Python with pyyaml, numpy and tqdm")
    args = parser.parse_args()
    pair = measure("pair", 7)
    matrix = measure("matrix", 3)
    unshared = measure("matrix-unshared", 1)
    cli = cli_wall(5)
    c_yaml, py_yaml = yaml_parse(7)
    print("opcollect plan benchmark (median of runs; fresh process each)")
    print(
        f"  one pair vllm/sm90: plan {pair['plan_s']:.3f} s (+ imports {pair['import_s']:.3f} s), "
        f"peak RSS {pair['rss_mb']:.0f} MB, runs {pair['runs']}   [target < 0.5 s, < 1 GB]"
    )
    print(f"  `opcollect plan --backend vllm --sm 90 --json` wall: {cli:.3f} s (interpreter start included)")
    print(
        f"  matrix 4 backends x 8 SMs: plan {matrix['plan_s']:.3f} s, peak RSS {matrix['rss_mb']:.0f} MB, "
        f"{matrix['counts']['total']} cases, runs {matrix['runs']}   [target < 10 s, < 1 GB]"
    )
    print(
        f"  baseline, matrix without shared expansion: {unshared['plan_s']:.3f} s "
        f"({unshared['plan_s'] / 32:.3f} s per pair), peak RSS {unshared['rss_mb']:.0f} MB"
    )
    print(f"  ratio shared/unshared matrix: {matrix['plan_s'] / unshared['plan_s']:.2f}")
    print(
        f"  case YAML parse: libyaml {c_yaml * 1000:.1f} ms vs pure-Python {py_yaml * 1000:.1f} ms "
        f"(ratio {c_yaml / py_yaml:.2f})"
    )
    if args.anchor:
        anchor_side_by_side(args.anchor, args.anchor_python, 7)
    print("  cases per op, vllm/sm90:")
    for op, n in pair["counts"].items():
        print(f"    {op:22s} {n:8d}")


if __name__ == "__main__":
    main()
