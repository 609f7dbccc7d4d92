"""`opcollect <verb>`: the one front door. Each verb parses its flags and calls one room's function."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from opcollect.errors import FrameworkMissing, InputError, Terminated
from opcollect.flags import Parser, count, fs_error, png, ratio, seconds, shard


def _ops(text: str | None) -> tuple[str, ...]:
    """--ops a,b as a tuple; every op when absent."""
    from opcollect.plans.ops import OPS

    return tuple(o.strip() for o in text.split(",") if o.strip()) if text else tuple(OPS)


def _add_plan(sub) -> None:
    p = sub.add_parser("plan", help="plan on the CPU: which cases a backend times on an SM")
    p.add_argument("--backend", default="torch", help="torch, vllm, sglang, trtllm or all (default torch)")
    p.add_argument("--sm", default="cpu", help="80, 86, 89, 90, 100, 103, 120, cpu or all (default cpu)")
    p.add_argument("--ops", help="comma-separated ops (default: every op)")
    p.add_argument(
        "--model-config",
        action="append",
        type=Path,
        default=[],
        metavar="CONFIG_JSON",
        help="a Hugging Face config.json whose shapes the sweeps must include (repeatable)",
    )
    p.add_argument("--smoke", action="store_true", help="at most 4 cases per op, chosen deterministically")
    p.add_argument("--case-filter", metavar="PREFIX", help="keep cases whose ID starts with PREFIX")
    p.add_argument("--shard", type=shard, metavar="i/N", help="the i-th of N disjoint shards (0 <= i < N)")
    p.add_argument("--json", action="store_true", help="print a JSON summary to stdout")
    p.add_argument("--table", type=Path, metavar="DIR", help="write <op>.csv with one row per case")
    p.add_argument("-o", "--output", type=Path, metavar="PLAN", help="write the plan file that `run` executes")
    p.add_argument(
        "--against",
        type=Path,
        metavar="TABLES",
        help="report how many key rows of the backend's tables in TABLES the plan covers, and the missing patterns",
    )
    p.add_argument("--root", type=Path, help="the opcollect checkout (default: the one this package is in)")
    p.set_defaults(func=cmd_plan)


def cmd_plan(args) -> int:
    from opcollect.names import BACKENDS, SMS
    from opcollect.plans.planfile import write_plan
    from opcollect.plans.planner import Planner, PlanOptions, require_cases
    from opcollect.plans.report import render, summary, write_tables
    from opcollect.project import find_project

    backends = list(BACKENDS) if args.backend == "all" else [args.backend]
    sms = list(SMS) if args.sm == "all" else [args.sm]
    pairs = [(b, s) for b in backends for s in sms]
    if args.output and len(pairs) > 1:
        raise InputError("-o writes one plan: give one --backend and one --sm, not all")
    if args.against and len(pairs) > 1:
        raise InputError("--against compares one plan: give one --backend and one --sm, not all")
    ops = _ops(args.ops)
    options = PlanOptions(ops=ops, smoke=args.smoke, case_filter=args.case_filter, shard=args.shard)
    planner = Planner(find_project(args.root), tuple(args.model_config))
    summaries = []
    for backend, sm in pairs:
        plan = planner.plan(backend, sm, options)
        summaries.append(summary(plan))
        if args.against:  # before writing anything: a bad TABLES stops here
            from opcollect.plans.coverage import coverage

            summaries[-1]["coverage"] = coverage(plan, args.against)
        if args.table:
            write_tables(plan, args.table if len(pairs) == 1 else args.table / f"{backend}-sm{sm}")
        if args.output:
            require_cases(plan, f"-o {args.output}")  # a plan of nothing would run nothing and exit 0
            write_plan(plan, args.output)
    if args.json:
        print(json.dumps(summaries[0] if len(summaries) == 1 else summaries, indent=2))
    else:
        sys.stdout.write(render(summaries, terminal=sys.stdout.isatty()))
        if args.against:
            from opcollect.plans.coverage import render_coverage

            sys.stdout.write(render_coverage(summaries[0]["coverage"]))
        if args.output:
            print(f"plan written to {args.output}")
    return 0


def _add_plan_diff(sub) -> None:
    p = sub.add_parser("plan-diff", help="compare two plan files or two --json summaries")
    p.add_argument("old", type=Path)
    p.add_argument("new", type=Path)
    p.set_defaults(func=cmd_plan_diff)


def cmd_plan_diff(args) -> int:
    from opcollect.plans.diff import diff_plans, render_diff

    sys.stdout.write(render_diff(diff_plans(args.old, args.new)))
    return 0


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

    ops = _ops(args.ops)
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
        _check_pins(tree, args.pins, args.backend, args.version)
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
        _check_pins(tree, args.pins)
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


def _add_status(sub) -> None:
    p = sub.add_parser("status", help="per shard of a Slurm collection: done, running, pending or failed")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.set_defaults(func=cmd_status)


def cmd_status(args) -> int:
    from opcollect.cluster.status import describe, shard_states

    print(describe(args.run_dir, shard_states(args.run_dir)))
    return 0


def _add_build(sub) -> None:
    p = sub.add_parser("build", help="build (or reuse) a backend's collector image through the Docker engine")
    p.add_argument("backend", nargs="?", help="torch, vllm, sglang or trtllm (with --prune: default every backend)")
    p.add_argument(
        "--prune",
        action="store_true",
        help="instead of building: remove the collector images no current pin or current input hash names",
    )
    p.add_argument("--pins", type=Path, help="pins file (default: pins.yaml of the checkout)")
    p.add_argument("--base-image", help="build on this image instead of the pin (a local image needs no digest)")
    p.add_argument("--version", help="one of the backend's pinned versions (default: its current pin)")
    p.add_argument("--no-cache", action="store_true", help="build every layer again, reusing nothing")
    p.add_argument("--root", type=Path, help="the opcollect checkout (default: the one this package is in)")
    p.set_defaults(func=cmd_build)


def _check_pins(tree, pins: Path | None, backend: str | None = None, version: str | None = None) -> None:
    """Read the pins before planning or reaching the Docker engine: a broken pins.yaml, or a version it does not
    pin, is named first."""
    from opcollect.images.pins import load_pins

    loaded = load_pins(pins or tree.pins)
    if version is not None:
        loaded.pin(backend, version)


def cmd_build(args) -> int:
    from opcollect.images.build import build_image, prune_images
    from opcollect.project import find_project

    if args.prune:
        prune_images(find_project(args.root), [args.backend] if args.backend else None, args.pins)
        return 0
    if args.backend is None:
        raise InputError("build: name a backend (torch, vllm, sglang or trtllm), or pass --prune")
    _check_pins(find_project(args.root), args.pins)
    built = build_image(
        find_project(args.root), args.backend, args.pins, args.base_image, no_cache=args.no_cache, version=args.version
    )
    state = "cache hit" if built.cache_hit else "built"
    print(
        f"{built.tag} ({state} in {built.seconds:.1f} s; input hash {built.plan.input_hash[:12]}, "
        f"image {built.image_id[:19]})"
    )
    return 0


def _add_base_image(sub) -> None:
    p = sub.add_parser("base-image", help="build opcollect-local/torch-cpu without a registry (debootstrap)")
    p.add_argument("--force", action="store_true", help="rebuild it even if it exists")
    p.add_argument("--root", type=Path, help="the opcollect checkout (default: the one this package is in)")
    p.set_defaults(func=cmd_base_image)


def cmd_base_image(args) -> int:
    from opcollect.images.localbase import build_local_base
    from opcollect.project import find_project

    print(build_local_base(find_project(args.root), force=args.force))
    return 0


def _add_merge(sub) -> None:
    p = sub.add_parser("merge", help="merge run directories into an aiconfigurator systems root with a manifest")
    p.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR")
    p.add_argument("--into", type=Path, required=True, metavar="TABLES")
    p.add_argument(
        "--no-wait", action="store_true", help="refuse, instead of waiting, while another merge holds TABLES"
    )
    p.add_argument(
        "--plan",
        type=Path,
        action="append",
        default=[],
        help="a plan file whose cases count as planned (the whole plan of sharded runs): missing ones leave partial",
    )
    p.add_argument("--root", type=Path, help="the opcollect checkout (default: the one this package is in)")
    p.set_defaults(func=cmd_merge)


def cmd_merge(args) -> int:
    from opcollect.project import find_project
    from opcollect.tables.merge import merge

    written = merge(args.run_dirs, args.into, find_project(args.root), wait=not args.no_wait, plans=tuple(args.plan))
    for table in written:
        print(f"{args.into / table.path}: {table.rows} rows, {table.failures} failures, {table.status}")
    return 0


def _add_check(sub) -> None:
    p = sub.add_parser("check", help="data rules R1-R7 over every table under TABLES")
    p.add_argument("tables", type=Path, metavar="TABLES")
    p.add_argument("--strict", action="store_true", help="noisy rows (R7) fail the check")
    p.add_argument("--noise-bound", type=ratio, default=0.05, help="relative IQR above which R7 counts a row")
    p.set_defaults(func=cmd_check)


def cmd_check(args) -> int:
    from opcollect.tables.rules import check_tables

    findings = check_tables(args.tables, strict=args.strict, noise_bound=args.noise_bound)
    for finding in findings:
        print(finding.render())
    failed = [f for f in findings if not f.warning]
    print(f"check {args.tables}: {len(failed)} violations, {len(findings) - len(failed)} warnings")
    return 1 if failed else 0


def _add_verify(sub) -> None:
    p = sub.add_parser("verify", help="recompute every sha256 against manifest.json and the provenance records")
    p.add_argument("tables", type=Path, metavar="TABLES")
    p.set_defaults(func=cmd_verify)


def cmd_verify(args) -> int:
    from opcollect.tables.verify import verify_tables

    report = verify_tables(args.tables)
    sys.stdout.write(report.render())
    return 0 if report.clean else 1


def _add_compare(sub) -> None:
    p = sub.add_parser("compare", help="join two tables on their key columns and report NEW/OLD")
    p.add_argument("old", type=Path)
    p.add_argument("new", type=Path)
    p.add_argument("--op", help="which table when a directory holds several (e.g. gemm, attention_context)")
    p.add_argument("--plot", type=png, metavar="PNG", help="write ratio against the sweep axis to this .png file")
    p.set_defaults(func=cmd_compare)


def cmd_compare(args) -> int:
    from opcollect.tables.compare import compare_tables, plot, render

    comparison = compare_tables(args.old, args.new, args.op)
    sys.stdout.write(render(comparison))
    if args.plot:
        plot(comparison, args.plot)
        print(f"plot written to {args.plot}")
    return 0


def _add_contract(sub) -> None:
    p = sub.add_parser(
        "contract", help="check the framework symbols a backend's runners use against its pinned release"
    )
    p.add_argument("backend", metavar="BACKEND", help="vllm, sglang or trtllm")
    p.add_argument(
        "--wheel", type=Path, action="append", default=[], help="a pinned wheel (pip download --no-deps); repeatable"
    )
    p.add_argument(
        "--source", type=Path, action="append", default=[], help="a directory of the release's packages; repeatable"
    )
    p.add_argument(
        "--image",
        nargs="?",
        const="",
        metavar="REF",
        help="copy the release out of a local image through the Docker engine (default: the pinned image)",
    )
    p.add_argument("--version", help="with --image and no REF: the pinned version whose image to read")
    p.add_argument("--pins", type=Path, help="pins file (default: pins.yaml of the checkout)")
    p.set_defaults(func=cmd_contract)


def cmd_contract(args) -> int:
    import tempfile

    from opcollect.backends.symbols import contract

    releases = [*args.wheel, *args.source]
    shown = [str(r) for r in releases]
    with tempfile.TemporaryDirectory(prefix="opcollect-contract-") as tmp:
        if args.image is not None:
            from opcollect.images.sources import image_release

            directory, ref = image_release(args.backend, args.image, args.version, args.pins, Path(tmp))
            releases.append(directory)
            shown.append(f"image {ref}")
        checked, misses, unchecked = contract(args.backend, releases, Path(__file__).resolve().parent / "backends")
    for miss in misses:
        print(miss.render())
    left = f"; not checked: {', '.join(unchecked)} (no release of it given)" if unchecked else ""
    print(f"contract {args.backend} against {', '.join(shown)}: {checked} uses checked, {len(misses)} missing{left}")
    return 1 if misses else 0


def _add_bump(sub) -> None:
    p = sub.add_parser("bump", help="move a backend's pin to a new framework version, with its report")
    p.add_argument("backend", metavar="BACKEND", help="torch, vllm, sglang or trtllm")
    p.add_argument("--version", required=True, help="the framework version to pin")
    p.add_argument("--image", required=True, metavar="REF@sha256:D", help="its image, by index digest")
    p.add_argument("--keep-old", action="store_true", help="keep the previous version's entry (TensorRT-LLM keeps two)")
    p.add_argument("--allow-downgrade", action="store_true", help="pin a version older than the current one")
    p.add_argument("--resolve", action="store_true", help="ask the registry for --image's (repo:tag) index digest")
    p.add_argument("--root", type=Path, help="the opcollect checkout (default: the one this package is in)")
    p.set_defaults(func=cmd_bump)


def cmd_bump(args) -> int:
    from opcollect.images.bump import BumpRequest
    from opcollect.images.bump_report import apply_bump
    from opcollect.project import find_project

    request = BumpRequest(args.backend, args.version, args.image, args.keep_old, args.allow_downgrade, args.resolve)
    tree = find_project(args.root)
    text, path = apply_bump(tree, request)
    print(text)
    print(f"wrote {tree.pins} and {path}")
    return 0


def _add_release(sub) -> None:
    p = sub.add_parser("release", help="package verified tables as a reproducible data wheel and sdist")
    p.add_argument("--tables", type=Path, required=True, metavar="DIR")
    p.add_argument("--out", type=Path, required=True, metavar="DIST")
    p.add_argument("--version", help="the data package's version (default: the newest collection's date)")
    p.add_argument("--root", type=Path, help="the opcollect checkout (default: the one this package is in)")
    p.set_defaults(func=cmd_release)


def _source_date_epoch() -> int | None:
    """SOURCE_DATE_EPOCH, the reproducible-builds convention for a fixed build time, when set."""
    import os

    value = os.environ.get("SOURCE_DATE_EPOCH")
    if value is None:
        return None
    if not value.isdigit():
        raise InputError(f"SOURCE_DATE_EPOCH={value!r}: not a count of seconds since 1970; unset it or give one")
    return int(value)


def cmd_release(args) -> int:
    from opcollect.project import find_project
    from opcollect.release.cut import cut

    done = cut(args.tables, args.out, args.version, _source_date_epoch(), find_project(args.root))
    print(f"{done.wheel}: {done.packaged} files, version {done.version}, epoch {done.epoch}")
    print(f"{done.sdist}\n{done.statement}")
    print(f"installed into a fresh venv: {done.installed.output.splitlines()[-1] if done.installed.output else ''}")
    if not done.installed.ok:
        print(done.installed.output)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="opcollect", description=__doc__)
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    _add_plan(sub)
    _add_plan_diff(sub)
    _add_run(sub)
    _add_collect(sub)
    _add_build(sub)
    _add_base_image(sub)
    _add_merge(sub)
    _add_check(sub)
    _add_verify(sub)
    _add_compare(sub)
    _add_contract(sub)
    _add_status(sub)
    _add_bump(sub)
    _add_release(sub)
    return parser


def _pinned_image(backend: str, version: str | None) -> str:
    """`` <image> (...)`` for the backend's pin (``version``, else its current one), or nothing when pins.yaml
    cannot tell."""
    from opcollect.images.pins import load_pins
    from opcollect.project import find_project

    try:
        _, pin = load_pins(find_project().pins).pin(backend, version)
    except (InputError, OSError, AttributeError):
        return ""
    flag = f" --version {version}" if version else ""
    return f" {pin.image} (`opcollect collect {backend}{flag}` builds on it and runs the plan inside)"


def _terminate(signum, frame) -> None:
    raise Terminated(signum)


def _kept(args) -> str:
    """What an interrupted command leaves, and how to go on."""
    if args.verb == "run":
        return f"the cases recorded in {args.out} are kept; the same command with --resume finishes the run"
    if args.verb == "collect" and not args.slurm:
        return "the cases recorded in the run directory are kept; the same command again resumes the collection"
    return "nothing half-written is kept; run the same command again"


def main(argv: list[str] | None = None) -> int:
    import signal
    import threading

    # `docker stop` and `kill` send SIGTERM, which PID 1 of a container ignores unless handled: it unwinds the
    # command as Ctrl-C does (workers killed, containers stopped, temporary files removed), then one line
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return _main(argv)
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)


def _main(argv: list[str] | None) -> int:
    import signal

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM as Terminated: finally blocks have run on the way here
        signum = exc.signum if isinstance(exc, Terminated) else signal.SIGINT
        print(f"opcollect: interrupted ({signal.Signals(signum).name}): {_kept(args)}", file=sys.stderr)
        return 128 + signum
    except MemoryError:
        print(
            "opcollect: error: out of memory; select less at once (one --backend and --sm, fewer --ops) "
            "or raise the memory limit (ulimit -v)",
            file=sys.stderr,
        )
        return InputError.exit_code
    except FrameworkMissing as exc:
        pinned = _pinned_image(exc.backend, getattr(args, "version", None) or getattr(args, "expect_version", None))
        print(f"opcollect: error: {exc}{pinned}", file=sys.stderr)
        return exc.exit_code
    except InputError as exc:
        print(f"opcollect: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        return 0
    except OSError as exc:
        message = fs_error(exc, args)
        if message is None:
            raise  # any other OSError is a bug to see whole
        print(f"opcollect: error: {message}", file=sys.stderr)
        return InputError.exit_code
