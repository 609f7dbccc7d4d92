"""The run directory: the plan it runs, its identity, shards, events and worker logs.

RUN_DIR/plan.json         the plan file, copied at the first run
RUN_DIR/run.json          plan_hash, collector_hash, backend, sm: a resume must match them
RUN_DIR/shards/*.jsonl    records, one file per worker slot and run (see shards.py)
RUN_DIR/events/<run_id>.json  one per `run` invocation: when, where, rows, failures
RUN_DIR/logs/             worker stderr
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from opcollect.errors import InputError
from opcollect.plans.planfile import PlanFile, write_atomic
from opcollect.runtime.shards import read_shard, shard_paths


@dataclass(frozen=True)
class Recorded:
    """What a run directory already holds: the latest record per case."""

    latest: dict[str, dict]

    def done(self, retry_failed: bool) -> set[str]:
        if retry_failed:
            return {cid for cid, r in self.latest.items() if r["status"] == "ok"}
        return set(self.latest)

    def attempts(self, case_id: str) -> int:
        record = self.latest.get(case_id)
        return int(record.get("attempt", 1)) if record else 0


def read_records(run_dir: Path) -> list[dict]:
    records = []
    for path in shard_paths(run_dir):
        records.extend(read_shard(path))
    return records


def recorded(run_dir: Path) -> Recorded:
    latest: dict[str, dict] = {}
    for record in read_records(run_dir):
        previous = latest.get(record["case_id"])
        if previous is None or record.get("attempt", 1) >= previous.get("attempt", 1):
            latest[record["case_id"]] = record
    return Recorded(latest)


_SKELETON = {"plan.json", ".plan.json.tmp", "shards", "events", "logs"}


def _unstarted(run_dir: Path) -> bool:
    """Empty, or left by a run killed before it wrote run.json (so it recorded nothing)."""
    names = {p.name for p in run_dir.iterdir()}
    return names <= _SKELETON and not shard_paths(run_dir)


def prepare_run_dir(run_dir: Path, plan_path: Path, plan: PlanFile, resume: bool) -> Recorded:
    """Create RUN_DIR for ``plan``, or check that it holds this plan and return what it recorded."""
    run_dir = Path(run_dir)
    identity_path = run_dir / "run.json"
    if identity_path.exists():
        identity = json.loads(identity_path.read_text())
        if identity.get("plan_hash") != plan.plan_hash:
            raise InputError(
                f"{run_dir}: holds plan_hash {identity.get('plan_hash')}, the plan has {plan.plan_hash}; "
                "use another --out for a different plan"
            )
        if not resume:
            raise InputError(f"{run_dir}: already holds a run of this plan; pass --resume to finish it")
        return recorded(run_dir)
    if run_dir.exists() and not _unstarted(run_dir):
        raise InputError(f"{run_dir}: exists and is not a run directory; choose an empty or new --out")
    for sub in ("shards", "events", "logs"):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    if Path(plan_path).resolve() != (run_dir / "plan.json").resolve():
        shutil.copyfile(plan_path, run_dir / ".plan.json.tmp")
        (run_dir / ".plan.json.tmp").replace(run_dir / "plan.json")
    identity = {
        "plan_hash": plan.plan_hash,
        "collector_hash": plan.collector_hash,
        "backend": plan.backend,
        "sm": plan.sm,
        "shard": None if plan.shard is None else f"{plan.shard[0]}/{plan.shard[1]}",
    }
    write_atomic(identity_path, json.dumps(identity, indent=2) + "\n")
    return Recorded({})
