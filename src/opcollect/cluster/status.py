"""`opcollect status RUN_DIR`: per shard of a Slurm collection, done, running, pending or failed, and its cases
measured of planned, from the shards on disk and from Slurm (sacct, else squeue) when it answers."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from opcollect.cluster.slurm import task_states
from opcollect.errors import InputError
from opcollect.runtime.rundir import recorded

RECORD = "slurm.json"  # what was submitted: shard count and every submission's job IDs
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


def read_record(root: Path) -> dict:
    path = Path(root) / RECORD
    if not path.is_file():
        raise InputError(f"{root}: no {RECORD}; give the run directory of `opcollect collect ... --slurm`")
    return json.loads(path.read_text())


def planned_cases(plan_path: Path) -> int:
    data = json.loads(Path(plan_path).read_text())
    return sum(len(op["case_id"]) for op in data["ops"].values())


def shard_states(root: Path) -> list[ShardStatus]:
    root = Path(root)
    record = read_record(root)
    answers = [(s["tasks"], task_states(s["array_job"])) for s in record["submissions"]]
    slurm_answered = any(answer is not None for _, answer in answers)
    latest_task: dict[int, str] = {}
    for tasks, answer in answers:  # in submission order: a resubmitted shard's latest task speaks
        latest_task.update({i: answer[i] for i in tasks if answer and i in answer})
    result = []
    for index in range(record["shards"]):
        shard = root / f"shard-{index}"
        planned = planned_cases(shard / "plan.json")
        latest = recorded(shard).latest if (shard / "run.json").is_file() else {}
        failed = sum(1 for r in latest.values() if r.get("status") != "ok")
        measured = len(latest) - failed
        said = latest_task.get(index)
        if measured + failed >= planned:
            state = "done"
        elif said in QUEUED:
            state = QUEUED[said]
        elif not slurm_answered:
            state = "incomplete"
        else:
            state = "failed"
        result.append(ShardStatus(index, state, measured, failed, planned, said))
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
