"""`opcollect collect BACKEND --slurm --shards N`: plan once, write one shard plan per array task and the batch
scripts into the run root, submit the array and the merge job that waits for it (afterany).

RUN_ROOT/plan.json            the whole plan (merge --plan: what the tables should hold)
RUN_ROOT/shard-i/plan.json    shard i of N (disjoint, together the whole plan; its run.json names the shard)
RUN_ROOT/collect.sbatch       the array job; RUN_ROOT/merge.sbatch the merge job; RUN_ROOT/logs/ their output
RUN_ROOT/slurm.json           the shard count and every submission's job IDs and tasks

`--resume RUN_ROOT` submits the array again for the shards not done, each resuming where its task stopped
(`opcollect run --resume`: every case exactly once), and a new merge job after it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from opcollect.cluster import scripts, slurm
from opcollect.cluster.record import SlurmRecord, Submission, read_record, write_record
from opcollect.cluster.status import shard_states
from opcollect.collect import CollectRequest, run_flags
from opcollect.errors import InputError
from opcollect.files import write_atomic
from opcollect.plans.deal import deal_plan
from opcollect.plans.planfile import to_json
from opcollect.plans.planner import Planner, PlanOptions, require_cases, shard_of
from opcollect.project import ProjectTree
from opcollect.runtime.planfile import parse_plan, read_plan_json
from opcollect.runtime.rundir import check_fresh


@dataclass(frozen=True)
class SlurmRequest:
    """What `collect --slurm` was asked, beyond the collection itself."""

    shards: int
    partition: str | None
    account: str | None
    time: str | None
    gpus_per_task: int | None  # None: 1 on a GPU SM, 0 for a CPU plan
    runtime: str
    resume: Path | None  # a run root to resubmit the shards not done of

    def gpus_for(self, sm: str) -> int:
        """GPUs per array task: as asked (0 too), else 1 on a GPU SM and 0 for a CPU plan."""
        return self.gpus_per_task if self.gpus_per_task is not None else (0 if sm == "cpu" else 1)


@dataclass(frozen=True)
class Submitted:
    root: Path
    array_job: str
    merge_job: str
    tasks: tuple[int, ...]
    planned: int


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(data, separators=(",", ":")))


def prepare_root(tree: ProjectTree, backend: str, sm: str, plan_options: PlanOptions, shards: int,
                 root: Path | None, model_configs: tuple[Path, ...] = (),
                 runtime: str = "none") -> tuple[Path, int]:  # fmt: skip
    """Plan once, write the whole plan and each shard's plan; (run root, planned cases)."""
    whole = Planner(tree, model_configs).plan(backend, sm, plan_options)
    require_cases(whole, f"collect {backend} --slurm")
    name = f"{backend}-sm{sm}-{whole.plan_hash[:12]}-{whole.collector_hash[:8]}-slurm{shards}"
    root = Path(root or tree.root / "runs" / name).resolve()
    scripts.check_root(root, "--out", runtime)  # the default root is under the checkout: its path is checked too
    check_fresh(root)
    # dealt once from the one selection by predicted time (plans/deal.py), so the array's tasks end together
    dealt = deal_plan(whole, shards, tree.systems)
    parts = [shard_of(whole, i, shards, dealt) for i in range(shards)]
    if sum(p.total_cases for p in parts) != whole.total_cases:
        raise InputError(f"--shards {shards}: the shards do not add up to the plan; report this as a bug")
    empty = [i for i, p in enumerate(parts) if not p.total_cases]
    if empty:
        raise InputError(f"--shards {shards}: shards {empty} would hold no case ({whole.total_cases} planned); "
                         "give fewer shards")  # fmt: skip
    _write_json(root / "plan.json", to_json(whole))
    for i, part in enumerate(parts):
        _write_json(root / f"shard-{i}" / "plan.json", to_json(part))
    (root / "logs").mkdir(exist_ok=True)
    return root, whole.total_cases


def submit(root: Path, tables: Path, options: scripts.SlurmOptions, checkout: Path, tasks: list[int],
           planned: int, resubmission: bool = False) -> Submitted:  # fmt: skip
    """Write the scripts, submit the array (``tasks`` of it) and the merge job after it, record both (after the
    submissions slurm.json already holds, on a ``resubmission``)."""
    collect_script, merge_script = root / "collect.sbatch", root / "merge.sbatch"
    write_atomic(collect_script, scripts.array_script(root, options))
    write_atomic(merge_script, scripts.merge_script(root, tables, options, checkout))
    everything = tasks == list(range(options.shards))
    array = slurm.sbatch(collect_script, array=None if everything else ",".join(map(str, tasks)))
    merge = slurm.sbatch(merge_script, dependency=f"afterany:{array}")
    before = read_record(root).submissions if resubmission else ()
    submitted = Submission(array, merge, tuple(tasks))
    write_record(root, SlurmRecord(options.shards, (*before, submitted), str(Path(tables).resolve())))
    return Submitted(root, array, merge, tuple(tasks), planned)


def resubmit(root: Path, tables: Path | None, options: scripts.SlurmOptions, checkout: Path) -> Submitted | None:
    """Submit the shards of ``root`` that are not done (None when every shard is); a running or pending shard is
    left to its task."""
    record = read_record(root)
    if options.shards != record.shards:
        options = replace(options, shards=record.shards)
    states = shard_states(root)
    busy = [s.index for s in states if s.state in ("running", "pending")]
    if busy:
        raise InputError(f"{root}: shards {busy} are still queued or running; wait for them (opcollect status)")
    tasks = [s.index for s in states if s.state != "done"]
    if not tasks:
        return None
    planned = sum(s.planned for s in states)
    if tables is None and record.tables is None:
        raise InputError(f"{root / 'slurm.json'}: names no TABLES; give --tables")
    return submit(root, Path(tables or record.tables), options, checkout, tasks, planned, resubmission=True)


def describe(sub: Submitted) -> str:
    tasks = ",".join(map(str, sub.tasks))
    return (
        f"submitted array job {sub.array_job} (tasks {tasks}) and merge job {sub.merge_job} (after it) for "
        f"{sub.planned} planned cases in {sub.root}\n"
        f"follow them: squeue -j {sub.array_job},{sub.merge_job}; opcollect status {sub.root}; "
        f"logs in {sub.root / 'logs'}"
    )


def collect_on_slurm(
    tree: ProjectTree, request: CollectRequest, ask: SlurmRequest, tables: Path | None, image_tag: Callable[[], str]
) -> Submitted | None:
    """Submit a new collection, or resubmit the shards of ``ask.resume`` not done (None when all are); the
    controller is asked first, and the collector image built only for a container runtime. ``tables``: default
    the checkout's tables/, or on a resubmission the TABLES the run root was submitted with."""
    sm = request.sm
    if ask.resume is not None:  # the SM the run root was planned for
        scripts.check_root(ask.resume.resolve(), "--resume", ask.runtime)
        read_record(ask.resume)
        whole = ask.resume / "plan.json"
        sm = parse_plan(whole, read_plan_json(whole), typed=False).sm
    if sm is None:
        raise InputError("--slurm: give --sm, the SM of the cluster's GPUs (cpu for a CPU collection)")
    options = scripts.SlurmOptions(
        shards=ask.shards, partition=ask.partition, account=ask.account, time=ask.time, gpus_per_task=ask.gpus_for(sm),
        runtime=ask.runtime, device="cpu" if sm == "cpu" else "cuda", run_flags=tuple(run_flags(request.run_options)),
    )  # fmt: skip
    if request.out is not None:
        scripts.check_root(Path(request.out).resolve(), "--out", ask.runtime)
    slurm.check_controller()  # before anything is written
    if ask.runtime != "none":
        options = replace(options, image=image_tag())
    if ask.resume is not None:
        return resubmit(ask.resume, tables, options, tree.root)
    root, planned = prepare_root(tree, request.backend, sm, request.plan_options, ask.shards, request.out,
                                 request.model_configs, ask.runtime)  # fmt: skip
    return submit(root, tables or tree.root / "tables", options, tree.root, list(range(ask.shards)), planned)
