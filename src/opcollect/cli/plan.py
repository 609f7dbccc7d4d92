"""`opcollect plan` and `plan-diff`: planning on the CPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from opcollect.errors import InputError
from opcollect.flags import shard


def parse_ops(text: str | None) -> tuple[str, ...]:
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
    from opcollect.cases.systems import load_systems
    from opcollect.names import BACKENDS, SMS
    from opcollect.plans.cost import Costing, system_for_sm
    from opcollect.plans.planfile import write_plan
    from opcollect.plans.planner import Planner, PlanOptions, require_cases
    from opcollect.plans.predict import plan_cost
    from opcollect.plans.report import render, summary, write_tables
    from opcollect.project import find_project

    backends = list(BACKENDS) if args.backend == "all" else [args.backend]
    sms = list(SMS) if args.sm == "all" else [args.sm]
    pairs = [(b, s) for b in backends for s in sms]
    if args.output and len(pairs) > 1:
        raise InputError("-o writes one plan: give one --backend and one --sm, not all")
    if args.against and len(pairs) > 1:
        raise InputError("--against compares one plan: give one --backend and one --sm, not all")
    ops = parse_ops(args.ops)
    options = PlanOptions(ops=ops, smoke=args.smoke, case_filter=args.case_filter, shard=args.shard)
    tree = find_project(args.root)
    planner = Planner(tree, tuple(args.model_config))
    systems = load_systems(tree.systems)
    # SM by SM, so the backends of one SM share their cases' bounds (plans/cost.py); printed in the pairs' order
    order = sorted(range(len(pairs)), key=lambda i: (sms.index(pairs[i][1]), i))
    found: dict[int, dict] = {}
    bounds: dict = {}
    for n, i in enumerate(order):
        backend, sm = pairs[i]
        if n and sm != pairs[order[n - 1]][1]:
            bounds = {}
        plan = planner.plan(backend, sm, options)
        system = system_for_sm(systems, sm)
        cost = None if system is None else plan_cost(plan, Costing.of(backend, system, bounds=bounds))
        found[i] = summary(plan, cost)
        if args.against:  # before writing anything: a bad TABLES stops here
            from opcollect.plans.coverage import coverage

            found[i]["coverage"] = coverage(plan, args.against)
        if args.table:
            write_tables(plan, args.table if len(pairs) == 1 else args.table / f"{backend}-sm{sm}")
        if args.output:
            require_cases(plan, f"-o {args.output}")  # a plan of nothing would run nothing and exit 0
            write_plan(plan, args.output)
    summaries = [found[i] for i in range(len(pairs))]
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


def add(sub) -> None:
    _add_plan(sub)
    _add_plan_diff(sub)
