"""GPU acceptance check: runs as it is on a lent GPU machine with torch, triton, pyarrow and pyyaml, and
nothing else (no pydantic, no Docker, no framework, no ../shared, no install: src/ is put on sys.path).

    python bench/gpu_check.py --out $OUT/gpu_check.json     # on the GPU machine: every check, < 8 minutes
    python bench/gpu_check.py --dry-run                     # anywhere: lists checks and data, exits 0
    python bench/gpu_check.py --prepare                     # here, before carrying: plans for the e2e check
    python bench/gpu_check.py --host-finish DIR             # here, on the returned $OUT: merge and check

Checks (one function each, in bench/gpu_check_timing.py and bench/gpu_check_runs.py):

- harness_vs_profiler: bf16 GEMMs of the torch backend, timed by runtime/timing.py in the rotate and
  the flush regime, against the sum of their kernel durations from torch.profiler, taken eagerly under
  the same regime (rotating input copies, or an L2 flush before each call): within 3% (rotate), 5% (flush).
- two_kernel_gap: a GEMM, 200 us of Python, then a ReLU: timed as a graph in both regimes (the gap does
  not reach the GPU), so the harness matches the profiler's sum of the two kernels' durations.
- eager_fallback: an op that syncs with the host (.item()): its capture fails, it is timed eagerly, and
  the device captures graphs again afterwards.
- illegal_address: a worker of the real pool (runtime/pool.py) writes through a wild pointer; the case is
  recorded as a fatal failure, the worker replaced, and the next case runs and succeeds in a new worker.
- plan_e2e: a torch plan run by `python -m opcollect run` on the GPU, the run killed (SIGKILL to the run
  process; its worker must die with it), resumed with --resume, then merged and checked.
- gemm_reference: bf16 GEMM of the torch backend against the vLLM 0.24.0 H200 reference rows carried in
  bench/data/, ratio medians split by the L2 regime the harness used.

Why the design is what it is:

- pydantic is not on the device. The planner (cases/*, via plans/planner.py) and merge/check (tables/*)
  import it; the runtime (runtime/*, backends/torch, plans/hashes.py, runtime/planfile.py) does not.
  So the plan is made here by the real planner: `--prepare` writes bench/gpu_check_data/ (git-ignored;
  carry it to the device) with a torch smoke plan per SM. The plan holds the collector_hash of the
  checkout it was made from, and `opcollect run` refuses a plan of other source, so the check says
  "stale: re-run --prepare" when src/ changed after preparing. pydantic is not vendored.
- merge and check run on the device only when pydantic imports there; otherwise the e2e check ends
  "deferred" (not failed) with its run directory under the --out folder, and `--host-finish DIR` (here,
  on the returned files) merges and checks that run directory and writes the completed JSON.
- The reference rows are a committed slice (bench/data/, Apache-2.0, see bench/data/README.md), read
  with the csv module, so a fresh clone has them and the dry run needs no pyarrow.
- --dry-run imports every module the checks import except the GPU stack (torch, triton: their presence
  is reported, they are imported inside the checks), with pydantic blocked: it fails if any of them
  would pull pydantic in.

Off the GPU, `--device cpu` rehearses plan_e2e (the whole flow, on the CPU plan) and the pool's side of
illegal_address (the fault simulated, so it reports skip, never pass); the timing checks skip.
tests/test_gpu_check.py runs the dry run and both rehearsals with pydantic blocked; GPU_CHECK_DATA names
another folder than bench/gpu_check_data for them.

On a lent device (the `run` tool; bench/gpu_check_data is git-ignored, so it is carried by name):

    python bench/gpu_check.py --prepare                                  # here, just before
    run: python bench/gpu_check.py --out $OUT/gpu_check.json   carry: ["bench/gpu_check_data"]
    python bench/gpu_check.py --host-finish <files_at of that run>       # here, after

Exit status: 0 when every check passed or was deferred to the host, 1 when one failed or the whole run
took longer than 8 minutes, 2 for bad input (a missing prepared plan is a failed check, not bad input).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
for _path in (ROOT / "src", BENCH):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
# worker subprocesses (the pool's, `python -m opcollect run`'s) import opcollect and our test backend too
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT / "src"), str(BENCH)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
)

import gpu_check_common as common  # noqa: E402  (after sys.path is set)

BUDGET_SECONDS = 8 * 60
# what the checks import; --dry-run imports them all and proves pydantic stays out
DEVICE_MODULES = (
    "gpu_check_timing",
    "gpu_check_runs",
    "gpu_check_backend",
    "opcollect.cli",
    "opcollect.backends.torch",
    "opcollect.runtime.timing",
    "opcollect.runtime.pool",
    "opcollect.runtime.run",
    "opcollect.runtime.worker",
    "opcollect.runtime.rundir",
    "opcollect.runtime.planfile",
    "opcollect.plans.hashes",
)
FORBIDDEN = ("pydantic",)


def checks() -> list[tuple[str, str, object]]:
    """(name, what it shows, function) in run order."""
    import gpu_check_runs as runs
    import gpu_check_timing as timing

    return [
        ("harness_vs_profiler", timing.check_harness_vs_profiler.__doc__, timing.check_harness_vs_profiler),
        ("two_kernel_gap", timing.check_two_kernel_gap.__doc__, timing.check_two_kernel_gap),
        ("eager_fallback", timing.check_eager_fallback.__doc__, timing.check_eager_fallback),
        ("illegal_address", runs.check_illegal_address.__doc__, runs.check_illegal_address),
        ("plan_e2e", runs.check_plan_e2e.__doc__, runs.check_plan_e2e),
        ("gemm_reference", timing.check_gemm_reference.__doc__, timing.check_gemm_reference),
    ]


class _Blocker:
    """A meta-path finder that refuses the FORBIDDEN packages: the dry run proves the device path avoids them."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in FORBIDDEN:
            raise ImportError(f"gpu_check: {name} is not on the device, and a device-side module imported it")
        return None


def dry_run() -> int:
    import importlib
    import importlib.util

    sys.meta_path.insert(0, _Blocker())
    problems = []
    for name in DEVICE_MODULES:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            problems.append(f"{name}: {exc}")
    pulled = sorted(m for m in sys.modules if m.split(".")[0] in FORBIDDEN)
    if pulled:
        problems.append(f"imported {', '.join(pulled)}")
    verdict = "pydantic never imported" if not problems else f"{len(problems)} import problems (below)"
    print(f"gpu_check --dry-run: {len(DEVICE_MODULES)} device-side modules imported, {verdict}")
    print("checks:")
    for name, doc, _ in checks():
        print(f"  {name:20} {common.first_line(doc)}")
    rows = common.reference_rows()
    print(f"reference rows: {len(rows)} bf16 GEMM rows of vLLM 0.24.0 on NVIDIA H200 in {common.rel(common.REFERENCE)}")
    if rows:
        ms, ns, ks = ({r[key] for r in rows} for key in ("m", "n", "k"))
        print(f"  m {min(ms)}..{max(ms)} ({len(ms)} values), n {min(ns)}..{max(ns)}, k {min(ks)}..{max(ks)}")
    by_state: dict[str, list[str]] = {}
    for sm, state in common.prepared_plans().items():
        by_state.setdefault(state.replace(f"torch-sm{sm}.", "torch-sm*."), []).append(f"sm{sm}")
    for state, sms in by_state.items():
        print(f"prepared plan {', '.join(sms)}: {state}")
    stack = {m: importlib.util.find_spec(m) is not None for m in ("torch", "triton", "pyarrow", "yaml")}
    print(
        "here: " + ", ".join(f"{m} {'yes' if ok else 'no'}" for m, ok in stack.items()) + " (the device has all four)"
    )
    for problem in problems:
        print(f"IMPORT PROBLEM: {problem}")
    return 1 if problems else 0


def run_checks(out: Path | None, only: list[str] | None, device: str) -> int:
    import tempfile

    selected = [c for c in checks() if only is None or c[0] in only]
    unknown = set(only or ()) - {c[0] for c in checks()}
    if unknown:
        print(f"gpu_check: unknown check {sorted(unknown)}; --dry-run lists them", file=sys.stderr)
        return 2
    # run directories and logs go beside the JSON, so they come back with $OUT
    out_dir = out.resolve().parent if out else Path(tempfile.mkdtemp(prefix="gpu_check-"))
    workdir = out_dir / "gpu_check_work"
    workdir.mkdir(parents=True, exist_ok=True)
    ctx = common.Context(device=device, workdir=workdir, out_dir=out_dir)
    header = common.environment(device)
    print(json.dumps(header))
    started = time.perf_counter()
    results = []
    for name, _, function in selected:
        print(f"--- {name}", flush=True)
        result = common.guarded(name, function, ctx)
        results.append(result)
        print(common.render_row(result), flush=True)
    total = time.perf_counter() - started
    report = common.Report(header, results, total, BUDGET_SECONDS)
    common.write_report(report, out)
    print(common.render_table(report))
    return report.exit_code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="list checks and data, verify imports, exit 0")
    parser.add_argument("--prepare", action="store_true", help="write bench/gpu_check_data/ (needs the project)")
    parser.add_argument("--host-finish", type=Path, metavar="DIR", help="merge and check a returned $OUT folder")
    parser.add_argument("--out", type=Path, metavar="JSON", help="write the figures here (e.g. $OUT/gpu_check.json)")
    parser.add_argument("--only", help="comma-separated check names (default: all)")
    parser.add_argument(
        "--device",
        default="cuda:0",
        help="cuda:0 (default); cpu rehearses plan_e2e and illegal_address, skips the rest",
    )
    args = parser.parse_args(argv)
    if args.dry_run:
        return dry_run()
    if args.prepare:
        import gpu_check_prepare

        return gpu_check_prepare.prepare()
    if args.host_finish:
        import gpu_check_runs

        return gpu_check_runs.host_finish(args.host_finish, args.out)
    only = [name.strip() for name in args.only.split(",") if name.strip()] if args.only else None
    return run_checks(args.out, only, args.device)


if __name__ == "__main__":
    raise SystemExit(main())
