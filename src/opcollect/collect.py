"""The main job, `opcollect collect BACKEND`: plan on the host, run, merge and check the tables."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

from opcollect.errors import InputError
from opcollect.files import write_atomic
from opcollect.plans.planfile import to_json
from opcollect.plans.planner import Planner, PlanOptions, require_cases
from opcollect.project import ProjectTree
from opcollect.runtime.run import RunOptions, RunSummary, run_plan
from opcollect.runtime.rundir import check_fresh, describe_identity, read_identity


@dataclass(frozen=True)
class CollectRequest:
    backend: str
    sm: str | None
    device: str  # auto, cpu, cuda
    plan_options: PlanOptions
    run_options: RunOptions
    out: Path | None
    model_configs: tuple[Path, ...] = ()
    version: str | None = None  # one of the backend's pinned versions; None: its current one
    tables: Path | None = None  # the TABLES the run is merged into afterwards; checked before the run


def host_gpu_sm() -> str | None:
    """The SM of GPU 0 as nvidia-smi reports it, without importing torch; None without a GPU."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    first = done.stdout.strip().splitlines()[:1]
    return first[0].strip().replace(".", "") if done.returncode == 0 and first else None


def resolve_target(device: str, sm: str | None) -> tuple[str, str]:
    """(device kind, sm): --device defaults to cuda when a GPU answers; --sm to that device's SM."""
    gpu_sm = host_gpu_sm() if device in ("auto", "cuda") else None
    kind = device if device != "auto" else ("cuda" if gpu_sm else "cpu")
    if kind == "cuda" and gpu_sm is None and sm is None:
        raise InputError("--device cuda: no GPU answers nvidia-smi; pass --sm, or use --device cpu")
    return kind, sm or (gpu_sm if kind == "cuda" else "cpu")


@dataclass(frozen=True)
class Prepared:
    """A planned collection: its device kind, plan file and run directory."""

    kind: str
    plan_path: Path
    run_dir: Path
    resume: bool
    planned: int


def check_tables_target(tables: Path, run_dir: Path | None) -> None:
    """Refuse, before any case runs, a --tables that the merge after the run would refuse: a file, a foreign
    directory, or one that is the run directory or holds it or lies in it."""
    from opcollect.tables.store import check_into

    try:
        check_into(tables, verify=False)  # verify runs under the merge's lock, after the run
    except InputError as exc:
        raise InputError(str(exc).replace("--into ", "--tables ", 1)) from None
    if run_dir is None:
        return
    a, b = Path(tables).resolve(), Path(run_dir).resolve()
    if a == b or a in b.parents or b in a.parents:
        raise InputError(
            f"--tables {tables} and the run directory {run_dir} overlap; a run directory is not a TABLES tree: "
            "give them separate paths"
        )


def prepare(tree: ProjectTree, request: CollectRequest) -> Prepared:
    if request.tables is not None:
        check_tables_target(request.tables, request.out)
    kind, sm = resolve_target(request.device, request.sm)
    plan = Planner(tree, request.model_configs).plan(request.backend, sm, request.plan_options)
    require_cases(plan, f"collect {request.backend}")  # before any image is built or run directory made
    # the collector hash is in the name: an edited collector starts a new run instead of resuming
    name = f"{request.backend}-sm{sm}-{plan.plan_hash[:12]}-{plan.collector_hash[:8]}"
    run_dir = request.out or tree.root / "runs" / name
    if request.tables is not None and request.out is None:
        check_tables_target(request.tables, run_dir)
    resume = (run_dir / "run.json").exists()
    plan_path = run_dir / "plan.json"
    data = to_json(plan)
    if resume:
        held = read_identity(run_dir)
        if held["content_hash"] != data["content_hash"]:
            wanted = {"plan_hash": plan.plan_hash, "shard": None, "selection": data["selection"]}
            raise InputError(
                f"{run_dir}: holds {describe_identity(held)}, this collection is {describe_identity(wanted)}; "
                "give another --out, or repeat the selection that run directory holds"
            )
    else:
        check_fresh(run_dir)
        write_atomic(plan_path, json.dumps(data, separators=(",", ":")))
    return Prepared(kind, plan_path, run_dir, resume, plan.total_cases)


def collect_local(tree: ProjectTree, request: CollectRequest) -> RunSummary:
    prepared = prepare(tree, request)
    options = replace(request.run_options, device=prepared.kind, resume=prepared.resume)
    return run_plan(prepared.plan_path, prepared.run_dir, options)


def run_flags(options: RunOptions) -> list[str]:
    """The timing options of `opcollect run` for a run elsewhere (a container, a Slurm task)."""
    flags = ["--case-timeout", str(options.case_timeout)]
    for flag, value in (
        ("--max-noise", options.max_noise),
        ("--min-samples", options.min_samples),
        ("--max-case-seconds", options.max_case_seconds),
        ("--workers", options.workers),
    ):
        if value is not None:
            flags += [flag, str(value)]
    return flags


def collect_in_container(
    tree: ProjectTree, request: CollectRequest, pins_path: Path | None, base_image: str | None, gpus: str, say=print
) -> Prepared:
    """Plan here, build or reuse the image, run the plan in it; the run directory stays on this host."""
    from opcollect.images.build import build_image
    from opcollect.images.container import ContainerRun, ctrl_c_noted, run_container
    from opcollect.images.engine import connect

    with ctrl_c_noted():  # a Ctrl-C that Python drops on the way still stops the collection before its start
        prepared = prepare(tree, request)
        built = build_image(tree, request.backend, pins_path, base_image, say, version=request.version)
        flags = run_flags(request.run_options) + [
            "--image",
            built.plan.base_image,
            "--image-digest",
            built.plan.base_digest,
        ]
        if built.plan.version is not None:
            flags += ["--expect-version", built.plan.version]
        # the host writes run.json first (the run directory is read-only inside), so `run` always resumes
        run = ContainerRun(built.tag, prepared.plan_path, prepared.run_dir, prepared.kind, gpus, tuple(flags))
        code = run_container(connect(), run, say)
    if code != 0:
        raise InputError(f"the collection container exited with code {code}; its log is above")
    return prepared


def finish(tree: ProjectTree, run_dir: Path, tables: Path) -> int:
    """Merge the run into TABLES, check them, print where they are; 1 when a data rule is violated."""
    from opcollect.tables.merge import merge
    from opcollect.tables.rules import check_tables

    written = merge([run_dir], tables, tree)
    for table in written:
        print(f"  {tables / table.path}: {table.rows} rows, {table.failures} failures, {table.status}")
    findings = check_tables(tables)
    violations = [f for f in findings if not f.warning]
    for finding in violations:
        print(finding.render())
    print(
        f"tables in {tables}: {len(written)} written; check: {len(violations)} violations, "
        f"{len(findings) - len(violations)} warnings"
    )
    return 1 if violations else 0
