"""`opcollect merge`, `check`, `verify` and `compare`: the tables."""

from __future__ import annotations

import sys
from pathlib import Path

from opcollect.flags import count, png, ratio


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
    p = sub.add_parser("check", help="data rules R1-R9 over every table under TABLES")
    p.add_argument("tables", type=Path, metavar="TABLES", nargs="?")
    p.add_argument(
        "--strict",
        action="store_true",
        help="noisy rows (R7), rows faster than physics (R8) and rows whose kernels contradict their label (R9) fail",
    )
    p.add_argument(
        "--against-physics",
        type=Path,
        metavar="TREE",
        help="run R8 alone over any aiconfigurator tree (legacy tables too): <system>/<family>/... or one system's",
    )
    p.add_argument("--system", help="with --against-physics: the system of TREE's tables (default: from TREE)")
    p.add_argument("--noise-bound", type=ratio, default=0.05, help="relative IQR above which R7 counts a row")
    p.set_defaults(func=cmd_check)


def cmd_check(args) -> int:
    from opcollect.errors import InputError
    from opcollect.tables.rules import check_tables

    if (args.tables is None) == (args.against_physics is None):
        raise InputError("check: give TABLES, or --against-physics TREE (one of them)")
    if args.against_physics is not None:
        from opcollect.tables.physics import against_physics

        target = args.against_physics
        findings = against_physics(target, system=args.system, strict=args.strict)
    else:
        if args.system is not None:
            raise InputError("--system: only with --against-physics; our tables name their system")
        target = args.tables
        findings = check_tables(target, strict=args.strict, noise_bound=args.noise_bound)
    for finding in findings:
        print(finding.render())
    failed = [f for f in findings if not f.warning]
    print(f"check {target}: {len(failed)} violations, {len(findings) - len(failed)} warnings")
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


def add_verdict_flags(p) -> None:
    """The thresholds that classify a row same, faster, slower or ambiguous (tables/noise.py); compare and bump."""
    from opcollect.tables.noise import DEFAULT_THRESHOLDS as d

    g = p.add_argument_group("verdicts", "same, faster, slower or ambiguous, from each row's p25-p75 interval")
    g.add_argument(
        "--min-gap",
        type=ratio,
        default=d.min_gap,
        help=f"disjoint intervals apart by at least this (relative) are a real change (default {d.min_gap})",
    )
    g.add_argument(
        "--noise-ceiling",
        type=ratio,
        default=d.max_noise,
        help=f"a relative IQR above this leaves the row ambiguous (default {d.max_noise})",
    )
    g.add_argument(
        "--min-samples",
        type=count,
        default=d.min_samples,
        help=f"fewer samples leave the row ambiguous (default {d.min_samples})",
    )
    g.add_argument(
        "--tolerance",
        type=ratio,
        default=d.tolerance,
        help=f"rows without quartiles: NEW/OLD within [1/(1+this), 1+this] is the same (default {d.tolerance})",
    )


def thresholds_of(args):
    from opcollect.tables.noise import Thresholds

    return Thresholds(args.min_gap, args.noise_ceiling, args.min_samples, args.tolerance)


def _add_compare(sub) -> None:
    p = sub.add_parser("compare", help="join two tables on their key columns, report NEW/OLD and the rows that moved")
    p.add_argument("old", type=Path)
    p.add_argument("new", type=Path)
    p.add_argument("--op", help="which table when a directory holds several (e.g. gemm, attention_context)")
    p.add_argument("--plot", type=png, metavar="PNG", help="write ratio against the sweep axis to this .png file")
    add_verdict_flags(p)
    p.set_defaults(func=cmd_compare)


def cmd_compare(args) -> int:
    from opcollect.tables.compare import compare_tables, plot, render

    comparison = compare_tables(args.old, args.new, args.op, thresholds_of(args))
    sys.stdout.write(render(comparison))
    if args.plot:
        plot(comparison, args.plot)
        print(f"plot written to {args.plot}")
    return 0


def add(sub) -> None:
    _add_merge(sub)
    _add_check(sub)
    _add_verify(sub)
    _add_compare(sub)
