"""`opcollect status RUN_DIR`: per shard of a Slurm collection, done, running, pending or failed, and its cases
measured of planned, from the shards on disk and from Slurm (sacct, else squeue) when it answers.

Only records of a case in the shard's own plan count: a record of any other case (a run directory reused, a
shard file copied in) is not progress of that shard."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from opcollect.cluster.record import RECORD, SlurmRecord, read_record
from opcollect.cluster.slurm import task_states
from opcollect.errors import InputError
from opcollect.runtime.planfile import parse_plan, read_plan_json
from opcollect.runtime.rundir import read_records

__all__ = ["RECORD", "ShardStatus", "describe", "planned_ids", "read_record", "shard_states"]

QUEUED = {"PENDING": "pending", "CONFIGURING": "pending", "REQUEUED": "pending", "RUNNING": "running",
          "COMPLETING": "running", "SUSPENDED": "running"}  # fmt: skip


@dataclass(frozen=True)
class ShardStatus:
    index: int
    state: str  # done, running, pending, failed; "incomplete" when Slurm does not say
    measured: int
    failed: int
    planned: int
    slurm: str | None  # Slurm's state of its latest task

    def render(self) -> str:
        said = f" (Slurm: {self.slurm})" if self.slurm else ""
        return (
            f"shard {self.index}: {self.state}{said}, {self.measured + self.failed}/{self.planned} cases "
            f"({self.failed} failed)"
        )


def planned_ids(plan_path: Path, shard: tuple[int, int] | None = None) -> set[str]:
    """The case IDs of a plan file, read and verified; ``shard``: the (index, count) the file must be."""
    plan = parse_plan(plan_path, read_plan_json(plan_path), typed=False)
    if shard is not None and plan.shard != shard:
        raise InputError(
            f"{plan_path}: the plan of shard {plan.shard_label or 'none'}, not {shard[0]}/{shard[1]}; "
            "give the run directory of `opcollect collect ... --slurm` as it wrote it"
        )
    return {cid for op in plan.ops.values() for cid in op.ids}


def _latest_status(shard: Path, planned: set[str]) -> dict[str, str]:
    """Case ID -> status of its latest attempt, for the cases of ``planned`` that the shard recorded."""
    latest: dict[str, tuple[int, str]] = {}
    for record in read_records(shard):
        case_id, attempt = record.get("case_id"), record.get("attempt", 1)
        if not isinstance(case_id, str) or case_id not in planned:
            continue
        attempt = attempt if type(attempt) is int else 0
        if case_id not in latest or attempt >= latest[case_id][0]:
            latest[case_id] = (attempt, str(record.get("status")))
    return {cid: status for cid, (_, status) in latest.items()}


def _slurm_says(record: SlurmRecord) -> tuple[dict[int, str], bool]:
    """Array task index -> Slurm's state of its latest task; whether Slurm answered at all."""
    answers = [(s.tasks, task_states(s.array_job)) for s in record.submissions]
    latest_task: dict[int, str] = {}
    for tasks, answer in answers:  # in submission order: a resubmitted shard's latest task speaks
        latest_task.update({i: answer[i] for i in tasks if answer and i in answer})
    return latest_task, any(answer is not None for _, answer in answers)


def shard_states(root: Path) -> list[ShardStatus]:
    root = Path(root)
    record = read_record(root)
    latest_task, slurm_answered = _slurm_says(record)
    result = []
    for index in range(record.shards):
        shard = root / f"shard-{index}"
        ids = planned_ids(shard / "plan.json", (index, record.shards))
        latest = _latest_status(shard, ids) if (shard / "run.json").is_file() else {}
        failed = sum(1 for status in latest.values() if status != "ok")
        measured = len(latest) - failed
        said = latest_task.get(index)
        if measured + failed >= len(ids):
            state = "done"
        elif said in QUEUED:
            state = QUEUED[said]
        elif not slurm_answered:
            state = "incomplete"
        else:
            state = "failed"
        result.append(ShardStatus(index, state, measured, failed, len(ids), said))
    return result


def describe(root: Path, states: list[ShardStatus]) -> str:
    counts: dict[str, int] = {}
    for s in states:
        counts[s.state] = counts.get(s.state, 0) + 1
    total = sum(s.planned for s in states)
    done = sum(s.measured + s.failed for s in states)
    lines = [s.render() for s in states]
    summary = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    lines.append(f"{root}: {len(states)} shards: {summary}; {done}/{total} planned cases recorded")
    if any(s.state in ("failed", "incomplete") for s in states):
        lines.append(f"resubmit the shards not done: opcollect collect ... --slurm --resume {root}")
    return "\n".join(lines)
