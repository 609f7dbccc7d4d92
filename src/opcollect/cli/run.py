"""`opcollect run` and `collect`: executing a plan, locally, in the backend's image or on Slurm."""

from __future__ import annotations

import sys
from pathlib import Path

from opcollect.cli.images import check_pins
from opcollect.cli.plan import parse_ops
from opcollect.errors import InputError
from opcollect.flags import count, ratio, seconds


def _add_timing(p) -> None:
    p.add_argument(
        "--case-timeout",
        type=seconds,
        default=120.0,
        metavar="S",
        help="seconds a case may take before its worker is killed (default 120)",
    )
    p.add_argument("--max-noise", type=ratio, help="stop sampling at this relative IQR (default 0.01)")
    p.add_argument("--min-samples", type=count, help="samples before the noise check (GPU 10, CPU 5)")
    p.add_argument("--max-case-seconds", type=seconds, help="sampling cap per case (GPU 1.0, CPU 0.25)")
    p.add_argument("--workers", type=count, help="worker processes (default: one per GPU; 1 on the CPU)")


def _run_options(args, **overrides):
    from opcollect.runtime.run import RunOptions

    values = dict(
        case_timeout=args.case_timeout,
        max_noise=args.max_noise,
        min_samples=args.min_samples,
        max_case_seconds=args.max_case_seconds,
        workers=args.workers,
    )
    values.update(overrides)
    return RunOptions(**values)


def _add_run(sub) -> None:
    p = sub.add_parser("run", help="execute a plan file into a run directory (in a container or locally)")
    p.add_argument("--plan", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True, metavar="RUN_DIR")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--resume", action="store_true", help="finish a run directory of the same plan")
    p.add_argument("--retry-failed", action="store_true", help="with --resume: run failed cases again")
    p.add_argument("--image", help="the image this run executes in, for the provenance events")
    p.add_argument("--image-digest", help="that image's pinned digest (or a local base's image ID)")
    p.add_argument("--expect-version", help="refuse to run unless the backend's framework has this version")
    p.add_argument(
        "--test-backend",
        metavar="MODULE",
        help="a dotted module that stands in for the plan's backend (the test suite's fake backends)",
    )
    _add_timing(p)
    p.set_defaults(func=cmd_run)


def cmd_run(args) -> int:
    from opcollect.runtime.run import describe, run_plan

    options = _run_options(
        args,
        device=args.device,
        resume=args.resume,
        retry_failed=args.retry_failed,
        image=args.image,
        image_digest=args.image_digest,
        expect_version=args.expect_version,
        test_backend=args.test_backend,
    )
    print(describe(run_plan(args.plan, args.out, options)))
    return 0


def _add_collect(sub) -> None:
    p = sub.add_parser("collect", help="the main job: plan, run, and report the run directory")
    p.add_argument("backend", help="torch, vllm, sglang or trtllm")
    p.add_argument("--sm", help="default: the SM of the device found (cpu with --device cpu)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--local", action="store_true", help="run here, without a container")
    p.add_argument("--gpus", default="all", help="all, or device indices such as 0,1 (containers only)")
    p.add_argument("--pins", type=Path, help="pins file (default: pins.yaml of the checkout)")
    p.add_argument("--base-image", help="build on this image instead of the pin (a local image needs no digest)")
    p.add_argument("--version", help="one of the backend's pinned versions (default: its current pin)")
    p.add_argument("--smoke", action="store_true", help="at most 4 cases per op")
    p.add_argument("--ops", help="comma-separated ops (default: every op)")
    p.add_argument("--case-filter", metavar="PREFIX", help="keep cases whose ID starts with PREFIX")
    p.add_argument("--model-config", action="append", type=Path, default=[], metavar="CONFIG_JSON")
    p.add_argument(
        "--out", type=Path, metavar="RUN_DIR", help="default: runs/<backend>-sm<sm>-<plan hash>-<collector hash>"
    )
    p.add_argument("--tables", type=Path, metavar="DIR", help="merge into this TABLES directory (default: tables/)")
    p.add_argument("--root", type=Path, help="the opcollect checkout (default: the one this package is in)")
    slurm = p.add_argument_group("Slurm", "submit the collection as an array job of plan shards and a merge job")
    slurm.add_argument("--slurm", action="store_true", help="submit to Slurm instead of running here")
    slurm.add_argument("--shards", type=int, default=1, help="array tasks, one shard of the plan each")
    slurm.add_argument("--partition")
    slurm.add_argument("--account")
    slurm.add_argument("--time", help="each task's time limit, as sbatch takes it (e.g. 4:00:00)")
    slurm.add_argument("--gpus-per-task", type=int, help="default: 1 on a GPU SM, 0 for --sm cpu")
    slurm.add_argument(
        "--container-runtime", choices=("docker", "pyxis", "apptainer", "none"), default="none",
        help="how a task runs the backend's image (none: this Python, on a shared filesystem)",
    )  # fmt: skip
    slurm.add_argument("--resume", type=Path, metavar="RUN_DIR", help="resubmit the shards of RUN_DIR not done")
    _add_timing(p)
    p.set_defaults(func=cmd_collect)


def cmd_collect(args) -> int:
    from dataclasses import replace

    from opcollect.collect import CollectRequest, collect_in_container, collect_local, finish
    from opcollect.images.container import Interrupted
    from opcollect.plans.planner import PlanOptions
    from opcollect.project import find_project
    from opcollect.runtime.run import describe, describe_run_dir

    ops = parse_ops(args.ops)
    request = CollectRequest(
        backend=args.backend,
        sm=args.sm,
        device=args.device,
        plan_options=PlanOptions(ops=ops, smoke=args.smoke, case_filter=args.case_filter),
        run_options=_run_options(args, expect_version=args.version),
        out=args.out,
        model_configs=tuple(args.model_config),
        version=args.version,
    )
    tree = find_project(args.root)
    request = replace(request, tables=args.tables or tree.root / "tables")  # checked before the run, not after
    if args.version is not None:  # a version must be pinned, also for a local run, which refuses another one
        check_pins(tree, args.pins, args.backend, args.version)
    if args.slurm:
        return _collect_slurm(args, tree, request)
    if args.resume is not None:
        raise InputError(
            "--resume RUN_DIR resubmits a Slurm collection: add --slurm (a local collect resumes by itself)"
        )
    if args.local:
        summary = collect_local(tree, request)
        print(describe(summary))
        run_dir = summary.run_dir
    else:
        check_pins(tree, args.pins, args.backend)
        try:
            prepared = collect_in_container(tree, request, args.pins, args.base_image, args.gpus)
        except (Interrupted, KeyboardInterrupt) as exc:
            stopped = "the container was stopped and removed" if isinstance(exc, Interrupted) else "no container ran"
            print(
                f"interrupted: {stopped}; the shards in {args.out or 'the run directory'} "
                "are kept; run the same command again to resume",
                file=sys.stderr,
            )
            return 130
        print(describe_run_dir(prepared.run_dir, prepared.planned))
        run_dir = prepared.run_dir
    return finish(tree, run_dir, request.tables)


def _collect_slurm(args, tree, request) -> int:
    from opcollect.cluster.submit import SlurmRequest, collect_on_slurm, describe

    def image_tag() -> str:
        from opcollect.images.build import build_image

        return build_image(tree, args.backend, args.pins, args.base_image, version=args.version).plan.tag

    slurm = SlurmRequest(
        args.shards, args.partition, args.account, args.time, args.gpus_per_task, args.container_runtime, args.resume
    )
    done = collect_on_slurm(tree, request, slurm, args.tables, image_tag)
    print(describe(done) if done else f"{args.resume}: every shard is done; nothing to resubmit")
    return 0


def add(sub) -> None:
    _add_run(sub)
    _add_collect(sub)
