"""`opcollect run`: execute a plan file into a run directory, resumably."""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from opcollect.backends import load_backend
from opcollect.backends.kernels import contradicts_dispatch, describe_observed
from opcollect.errors import InputError
from opcollect.files import write_atomic
from opcollect.plans.hashes import installed_collector_hash
from opcollect.runtime.contract import KernelLimit
from opcollect.runtime.harness import TimingConfig
from opcollect.runtime.planfile import PlanFile, read_plan
from opcollect.runtime.pool import Pool, Task
from opcollect.runtime.preflight import preflight
from opcollect.runtime.progress import Progress
from opcollect.runtime.rundir import prepare_run_dir, read_identity, recorded
from opcollect.runtime.shards import ShardWriter


@dataclass(frozen=True)
class RunOptions:
    device: str = "auto"  # auto, cpu, cuda
    resume: bool = False
    retry_failed: bool = False
    case_timeout: float = 120.0
    max_noise: float | None = None
    min_samples: int | None = None
    max_case_seconds: float | None = None
    workers: int | None = None
    image: str | None = None  # the container image the run executes in, when the host knows it
    image_digest: str | None = None  # its pinned base digest, or a local base's image ID
    expect_version: str | None = None  # the pinned framework version: refuse to run another
    test_backend: str | None = None  # a dotted module standing in for the plan's backend (tests; command line only)


@dataclass(frozen=True)
class RunSummary:
    run_dir: Path
    run_id: str
    planned: int
    recorded_before: int
    ok: int
    failed_by_class: dict[str, int]
    cost: str = ""  # predicted against measured device-seconds per op (plans/predict.py run_cost)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _tasks(plan: PlanFile, skip: set[str], attempts) -> list[Task]:
    tasks = []
    for name, op in plan.ops.items():
        fields_of = {cid: case._asdict() for cid, case in zip(op.ids, op.cases)}
        for row in op.rows:
            todo = tuple(cid for cid in row.case_ids if cid not in skip)
            if todo:
                attempt = 1 + max(attempts(cid) for cid in todo)
                tasks.append(Task(row.row_id, name, row.dispatch, todo, tuple(fields_of[c] for c in todo), attempt))
    return tasks


def _resolve_devices(backend, plan: PlanFile, options: RunOptions) -> list[str]:
    try:
        devices = backend.devices(options.device, options.workers)
    except KernelLimit as exc:
        raise InputError(str(exc)) from None
    sm = backend.device_sm(devices[0])
    if sm != plan.sm:
        raise InputError(f"the plan is for sm {plan.sm} but {devices[0]} is sm {sm}; plan with --sm {sm}")
    return devices


def check_collector(plan_path: Path, plan: PlanFile) -> None:
    """Refuse a plan made by other collector source than the one about to run it."""
    installed = installed_collector_hash()
    if installed is not None and installed != plan.collector_hash:
        raise InputError(
            f"{plan_path}: planned by collector_hash {plan.collector_hash}, but this collector is "
            f"{installed}; re-plan with this collector (and use a new --out)"
        )


def run_plan(plan_path: Path, run_dir: Path, options: RunOptions) -> RunSummary:
    plan = read_plan(plan_path)
    check_collector(plan_path, plan)
    # the installed framework has what every runner uses, or the run stops here: before a run directory or a device
    preflight(plan.backend)
    run_dir = Path(run_dir)
    # the run directory exists before the backend loads: a run killed at any point can be resumed
    before = prepare_run_dir(run_dir, plan_path, plan, options.resume)
    backend = load_backend(plan.backend)  # one opcollect knows: a plan never names a module
    if options.test_backend is not None:
        backend = load_backend(options.test_backend, modules=(options.test_backend,))
    devices = _resolve_devices(backend, plan, options)
    found = backend.identity(devices[0])["version"]
    if options.expect_version is not None and found != options.expect_version:
        raise InputError(
            f"{plan.backend} {found} is installed, the pin says {options.expect_version}; rebuild the "
            "image from pins.yaml (opcollect build) or bump the pin"
        )
    skip = before.done(options.retry_failed)
    tasks = _tasks(plan, skip, before.attempts)
    kind = "cpu" if devices[0] == "cpu" else "cuda"
    config = TimingConfig.for_device(kind, options.max_noise, options.min_samples, options.max_case_seconds)
    threads = max(1, (os.cpu_count() or 1) // len(devices)) if kind == "cpu" else None
    run_id = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)
    event = {
        "run_id": run_id,
        "collected_at": now_iso(),
        "finished_at": None,
        "host": socket.gethostname(),
        "shard": plan.shard_label,
        "rows": 0,
        "failures": 0,
        "image": options.image,
        "image_digest": options.image_digest,
        "devices": devices,
    }
    event_path = run_dir / "events" / f"{run_id}.json"
    write_atomic(event_path, json.dumps(event, indent=2) + "\n")
    totals = {name: len(op.ids) for name, op in plan.ops.items()}
    already = {name: sum(1 for cid in op.ids if cid in skip) for name, op in plan.ops.items()}
    progress = Progress(totals, already)
    writers = {slot: ShardWriter(run_dir / "shards" / f"{run_id}-w{slot}.jsonl") for slot in range(len(devices))}

    announced: set[str] = set()

    spent: dict[str, dict[str, float]] = {}  # op -> case ID -> its share of its row's wall seconds
    device_names: list[str] = []  # the devices the workers report, for the system the costs are predicted on

    def on_result(worker, task: Task, results: list[dict]) -> None:
        share = (time.monotonic() - worker.sent) / max(1, len(results))  # the row's wall seconds, per case
        if worker.identity is not None and not device_names:
            device_names.append(str(worker.identity.get("device")))
        writer = writers[worker.slot]
        runtime_id = f"{run_id}.{worker.runtime_id}"
        if runtime_id not in announced and worker.identity is not None:
            writer.append_runtime(
                {"runtime_id": runtime_id, "worker": worker.slot, "worker_device": worker.device, **worker.identity}
            )
            announced.add(runtime_id)
        for result in results:
            record = {
                **result,
                "op": task.op,
                "row_id": task.row_id,
                "dispatch": task.dispatch,
                "attempt": task.attempt,
                "plan_hash": plan.plan_hash,
                "collector_hash": plan.collector_hash,
                "run_id": run_id,
                "worker": worker.slot,
                "runtime_id": runtime_id,
                "recorded_at": now_iso(),
                "wall_seconds": round(share, 6),
            }
            spent.setdefault(task.op, {})[result["case_id"]] = share
            writer.append(record)
            progress.record(task.op, result["status"], result.get("error_class"))

    module = options.test_backend or plan.backend
    pool = Pool(module, devices, threads, config, options.case_timeout, run_dir / "logs", on_result)
    try:
        pool.run(tasks)
    except RuntimeError as exc:
        raise InputError(f"{plan.backend} worker failed to start: {exc}") from None
    finally:
        for writer in writers.values():
            writer.close()
        progress.close()
    failed = dict(progress.failures_by_class)
    event.update(finished_at=now_iso(), rows=sum(progress.ok.values()), failures=sum(failed.values()))
    write_atomic(event_path, json.dumps(event, indent=2) + "\n")
    cost = _cost_line(plan, spent, config, device_names[0] if device_names else None, len(devices))
    return RunSummary(run_dir, run_id, plan.total_cases, len(skip), sum(progress.ok.values()), failed, cost=cost)


def _cost_line(plan: PlanFile, spent: dict, config, device_name: str | None, workers: int) -> str:
    """Predicted against measured device-seconds per op. The prediction reads the planner's systems and grids,
    which need pydantic; a device without it (the runtime needs none) says so instead of failing a finished run."""
    try:
        from opcollect.plans.predict import run_cost
    except ImportError as exc:
        return f"cost: not predicted here ({exc}); the host's `opcollect plan --json` predicts it"
    return run_cost(plan, spent, config, device_name, workers)


def describe(summary: RunSummary) -> str:
    this_run = f"run {summary.run_id}: measured {summary.ok} this run ({summary.recorded_before} recorded before); "
    return this_run + describe_run_dir(summary.run_dir, summary.planned) + (f"\n{summary.cost}" if summary.cost else "")


def describe_run_dir(run_dir: Path, planned: int) -> str:
    """Rows, failures per class and missing cases of a run directory."""
    state = recorded(run_dir)
    total_ok = sum(1 for r in state.latest.values() if r["status"] == "ok")
    total_failed: dict[str, int] = {}
    for r in state.latest.values():
        if r["status"] != "ok":
            total_failed[r["error_class"]] = total_failed.get(r["error_class"], 0) + 1
    classes = ", ".join(f"{k} {v}" for k, v in sorted(total_failed.items())) or "none"
    backend = read_identity(run_dir)["backend"]  # whose kernel table judges the labels (backends/kernels.py)
    return (
        f"{run_dir}: {total_ok} rows, failures {classes}, {planned - len(state.latest)} of {planned} planned "
        "cases missing"
        + describe_observed(backend, state.latest.values())
        + _dispatch_misses(state.latest.values(), backend)
    )


def _dispatch_misses(records, backend: str | None = None) -> str:
    """Rows whose kernel_source (what ran) is not the plan's dispatch (what the plan predicted) nor a finer label
    that serves it (backends/kernels.py), or whose communicator or strategy (``ran``) is not the one the framework's
    selection predicted, by pair."""
    pairs = Counter(
        (r.get("dispatch"), r.get("kernel_source"))
        for r in records
        if r["status"] == "ok" and contradicts_dispatch(backend, r.get("dispatch"), r.get("kernel_source"), r.get("op"))
    )
    pairs.update(
        (r.get("expected_ran"), r.get("ran"))
        for r in records
        if r["status"] == "ok" and r.get("expected_ran") is not None and r.get("ran") != r.get("expected_ran")
    )
    if not pairs:
        return "; every row ran the kernel its plan named"
    shown = ", ".join(f"{d} ran {k} ({n})" for (d, k), n in pairs.most_common(3))
    more = f", {len(pairs) - 3} more pairs" if len(pairs) > 3 else ""
    return f"; {sum(pairs.values())} rows ran another kernel than the plan named: {shown}{more}"
