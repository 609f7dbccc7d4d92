"""The gpu_check checks that go through worker processes: an illegal address replacing the pool's worker,
and a torch plan end to end (run, kill, resume, merge, check); and --host-finish, which merges and checks
on a machine with the project installed what the device could not (merge and check import pydantic)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpu_check_common import (
    CheckResult,
    Context,
    plan_path,
    plan_state,
    read_report,
    rel,
    render_table,
    write_report,
)

KILL_AFTER_RECORDS = 3  # the run is killed once this many cases are recorded
RUN_TIMEOUT_SECONDS = 240.0
HARMLESS = {"kernel_limit", "oom"}  # failure classes a plan may record on a device; the others fail the check


def check_illegal_address(ctx: Context) -> CheckResult:
    """A wild write in a pool worker: recorded as a fatal failure, worker replaced, next case ok."""
    from gpu_check_backend import ILLEGAL

    from opcollect.runtime.harness import TimingConfig
    from opcollect.runtime.pool import Pool, Task

    case = {"gemm_dtype": "bfloat16", "m": 256, "n": 4096, "k": 4096}
    tasks = [
        Task("wild", "gemm", ILLEGAL, ("wild",), (case,), 1),
        Task("after", "gemm", "torch.nn.functional.linear", ("after",), (case,), 1),
    ]
    seen: dict[str, dict] = {}

    def on_result(worker, task, results) -> None:
        seen[task.row_id] = {"runtime_id": worker.runtime_id, **results[0]}

    log_dir = ctx.workdir / "illegal_address"
    log_dir.mkdir(parents=True, exist_ok=True)
    config = TimingConfig.for_device("cuda" if ctx.cuda else "cpu", max_case_seconds=0.2)
    pool = Pool("gpu_check_backend", [ctx.device], None, config, 120.0, log_dir, on_result)
    pool.run(tasks)
    wild, after = seen.get("wild", {}), seen.get("after", {})
    message = wild.get("message", "")
    ok = (
        wild.get("status") == "failed"
        and wild.get("error_class") == "unexpected"  # classified fatal (a crash would read "crash")
        and any(p in message.lower() for p in ("illegal", "device-side assert"))
        and pool.spawned == 2
        and after.get("status") == "ok"
        and after.get("runtime_id") != wild.get("runtime_id")
    )
    summary = (
        f"wild write: {wild.get('status')} {wild.get('error_class')} ({message[:70]}); workers started "
        f"{pool.spawned}; next case {after.get('status')} in {after.get('runtime_id')}"
    )
    figures = {"wild": wild, "after": after, "workers_started": pool.spawned, "logs": str(log_dir)}
    if not ctx.cuda:  # the pool's path ran, but the fault was simulated: that proves nothing about a GPU
        return CheckResult("", "skip" if ok else "fail", f"CPU rehearsal, simulated fault: {summary}", figures)
    return CheckResult("", "pass" if ok else "fail", summary, figures)


def _opcollect(*args: str, timeout: float = RUN_TIMEOUT_SECONDS) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "opcollect", *args], capture_output=True, text=True, timeout=timeout, env=os.environ
    )


def _workers_of(parent: int) -> list[int]:
    """Pids of live opcollect workers started by ``parent`` (their command line names it with --parent)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"opcollect.runtime.worker" in argv and b"--parent" in argv and state != "Z":
            if argv[argv.index(b"--parent") + 1] == str(parent).encode():
                found.append(int(entry.name))
    return found


def _recorded(run_dir: Path) -> dict[str, dict]:
    from opcollect.runtime.rundir import recorded

    return recorded(run_dir).latest if (run_dir / "shards").is_dir() else {}


def check_plan_e2e(ctx: Context) -> CheckResult:
    """A prepared torch plan: run on the device, killed, resumed, then merged and checked."""
    from opcollect.backends.torch import device_sm
    from opcollect.runtime.planfile import read_plan

    sm = device_sm(ctx.device)
    usable, state = plan_state(sm)
    if not usable:
        return CheckResult("", "fail", f"plan sm{sm}: {state}")
    plan_file = plan_path(sm)
    planned = {cid for op in read_plan(plan_file).ops.values() for cid in op.ids}
    run_dir = ctx.workdir / "plan_e2e" / "run"
    shutil.rmtree(run_dir.parent, ignore_errors=True)
    run_dir.parent.mkdir(parents=True)
    device = "cuda" if ctx.cuda else "cpu"
    command = [sys.executable, "-m", "opcollect", "run", "--plan", str(plan_file), "--out", str(run_dir)]
    command += ["--device", device, "--workers", "1"]
    figures: dict = {"plan": rel(plan_file), "planned": len(planned), "steps": {}}
    steps = figures["steps"]

    # run, and kill it once a few cases are recorded
    with open(run_dir.parent / "first-run.log", "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=os.environ)
        deadline = time.monotonic() + RUN_TIMEOUT_SECONDS
        while proc.poll() is None and time.monotonic() < deadline and len(_recorded(run_dir)) < KILL_AFTER_RECORDS:
            time.sleep(0.1)
        workers = _workers_of(proc.pid)
        finished_early = proc.poll() is not None
        proc.send_signal(signal.SIGKILL)  # the run process only: its worker must follow by the lifeline
        proc.wait()
    before = _recorded(run_dir)
    gone_by = time.monotonic() + 10
    while any(_workers_of(proc.pid)) and time.monotonic() < gone_by:
        time.sleep(0.1)
    orphans = _workers_of(proc.pid)
    steps["run_killed"] = {
        "recorded_at_kill": len(before),
        "finished_before_kill": finished_early,
        "workers_at_kill": len(workers),
        "workers_left": len(orphans),
    }
    for pid in orphans:  # ours, named by its --parent; do not leave it holding the device
        os.kill(pid, signal.SIGKILL)

    # resume
    resumed = _opcollect(*command[3:], "--resume")
    after = _recorded(run_dir)
    runs = {r.get("run_id") for r in after.values()}
    remeasured = [cid for cid, r in after.items() if cid in before and r.get("run_id") != before[cid].get("run_id")]
    classes: dict[str, int] = {}
    for record in after.values():
        if record["status"] != "ok":
            classes[record["error_class"]] = classes.get(record["error_class"], 0) + 1
    steps["resume"] = {
        "rc": resumed.returncode,
        "tail": (resumed.stdout + resumed.stderr).strip().splitlines()[-1:] or [""],
        "recorded": len(after),
        "missing": sorted(planned - set(after))[:5],
        "run_ids": len(runs),
        "remeasured": remeasured[:5],
        "failures": classes,
    }
    problems = []
    if finished_early or not before:
        problems.append(f"not killed mid-run ({len(before)} of {len(planned)} recorded at the kill)")
    if orphans:
        problems.append(f"{len(orphans)} worker(s) outlived the killed run")
    if resumed.returncode != 0 or set(after) != planned:
        problems.append(f"resume rc {resumed.returncode}, {len(planned - set(after))} cases missing")
    if remeasured:
        problems.append(f"{len(remeasured)} cases recorded before the kill were measured again")
    if set(classes) - HARMLESS:
        problems.append(f"failures {classes}")

    # merge and check: they import pydantic, which only a host may have
    figures["run_dir"] = os.path.relpath(run_dir, ctx.out_dir)
    if not _importable("pydantic"):
        steps["merge"] = steps["check"] = "deferred to the host: pydantic is not installed here"
        status = "fail" if problems else "deferred"
        summary = "; ".join(problems) or (
            f"{len(before)} recorded, killed, resumed to {len(after)}/{len(planned)}; merge and check deferred to "
            "the host (--host-finish)"
        )
        return CheckResult("", status, summary, figures)
    merged = merge_and_check(run_dir, run_dir.parent / "tables")
    steps.update(merged)
    problems += [f"{step} failed" for step in ("merge", "check") if merged[step]["rc"] != 0]
    summary = (
        "; ".join(problems)
        or f"{len(before)} recorded, killed, resumed to {len(after)}/{len(planned)}, merged, checked"
    )
    return CheckResult("", "fail" if problems else "pass", summary, figures)


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a finder that refuses it (as tests do, to stand in for the device)
        return False


def merge_and_check(run_dir: Path, tables: Path) -> dict:
    """`opcollect merge RUN --into TABLES`, then `opcollect check TABLES`: their rc and last lines."""
    steps = {}
    for step, args in (("merge", ("merge", str(run_dir), "--into", str(tables))), ("check", ("check", str(tables)))):
        done = _opcollect(*args)
        lines = (done.stdout + done.stderr).strip().splitlines()
        steps[step] = {"rc": done.returncode, "lines": lines[-8:]}
        if done.returncode != 0:
            break
    steps.setdefault("check", {"rc": None, "lines": ["not run: merge failed"]})
    return steps


def host_finish(folder: Path, out: Path | None) -> int:
    """Merge and check the plan_e2e run directory of a returned $OUT folder; write the completed report."""
    import dataclasses

    source = folder / "gpu_check.json"
    report = read_report(source)
    results = []
    for result in report.results:
        if result.name == "plan_e2e" and result.status == "deferred":
            with tempfile.TemporaryDirectory() as tmp:  # the returned files are read-only: merge a copy
                run_dir = Path(tmp) / "run"
                shutil.copytree(folder / result.figures["run_dir"], run_dir)
                merged = merge_and_check(run_dir, Path(tmp) / "tables")
            failed = [step for step in ("merge", "check") if merged[step]["rc"] != 0]
            figures = {**result.figures, "steps": {**result.figures["steps"], **merged}, "finished_on": "host"}
            summary = result.summary.replace("merge and check deferred to the host (--host-finish)", "")
            summary += (
                ("merge or check failed on the host: " + ", ".join(failed)) if failed else "merged, checked on the host"
            )
            result = dataclasses.replace(result, status="fail" if failed else "pass", summary=summary, figures=figures)
        results.append(result)
    report = dataclasses.replace(report, results=results)
    target = out or (folder / "gpu_check.host.json" if os.access(folder, os.W_OK) else Path("gpu_check.host.json"))
    write_report(report, target)
    print(render_table(report))
    print(f"written to {target}")
    return report.exit_code
