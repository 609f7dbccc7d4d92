"""`opcollect status`: the shards of a Slurm collection."""

from __future__ import annotations

from pathlib import Path


def _add_status(sub) -> None:
    p = sub.add_parser("status", help="per shard of a Slurm collection: done, running, pending or failed")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.set_defaults(func=cmd_status)


def cmd_status(args) -> int:
    from opcollect.cluster.status import describe, shard_states

    print(describe(args.run_dir, shard_states(args.run_dir)))
    return 0


def add(sub) -> None:
    _add_status(sub)
