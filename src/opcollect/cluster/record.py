"""RUN_ROOT/slurm.json, what `collect --slurm` submitted: the shard count and every submission's job IDs and tasks.

It is read back by `status` and `collect --slurm --resume`, so it is read as input from outside, by
opcollect.inputs (a regular file of at most MAX_BYTES, UTF-8 JSON of bounded nesting), every field typed;
anything else is one line (InputError) naming the file and what is wrong with it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from opcollect.errors import InputError
from opcollect.files import write_atomic
from opcollect.inputs import MIB, read_json

RECORD = "slurm.json"
MAX_BYTES = 16 * MIB  # 1000 shards resubmitted many times stay far below this
MAX_SHARDS = 1000  # as SlurmOptions allows
JOB = re.compile(r"[0-9]{1,20}", re.ASCII)  # sbatch --parsable's job ID (slurm.JOB_ID); it reaches sacct -j
FIX = "give the run directory of `opcollect collect ... --slurm`, as that command wrote it"


@dataclass(frozen=True)
class Submission:
    array_job: str
    merge_job: str
    tasks: tuple[int, ...]  # the array task (shard) indices this submission ran


@dataclass(frozen=True)
class SlurmRecord:
    shards: int
    submissions: tuple[Submission, ...]
    tables: str | None  # the TABLES the merge job merges into

    def to_json(self) -> dict:
        return {
            "shards": self.shards,
            "submissions": [
                {"array_job": s.array_job, "merge_job": s.merge_job, "tasks": list(s.tasks)} for s in self.submissions
            ],
            **({"tables": self.tables} if self.tables is not None else {}),
        }


class _Bad(Exception):
    """A field of slurm.json that is missing or of the wrong kind: (field path, what is wrong)."""


def _count(value: object, where: str, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise _Bad(where, f"{value!r} is not a whole number from {low} to {high}")
    return value


def _job(value: object, where: str) -> str:
    if not isinstance(value, str) or not JOB.fullmatch(value):
        raise _Bad(where, f"{value!r} is not a Slurm job ID")
    return value


def parse_record(path: Path, data: object) -> SlurmRecord:
    try:
        if not isinstance(data, dict):
            raise _Bad("", f"a JSON {type(data).__name__}, not an object")
        for key in ("shards", "submissions"):
            if key not in data:
                raise _Bad(key, "missing")
        shards = _count(data["shards"], "shards", 1, MAX_SHARDS)
        raw = data["submissions"]
        if not isinstance(raw, list):
            raise _Bad("submissions", "not a list")
        submissions = []
        for i, entry in enumerate(raw):
            where = f"submissions[{i}]"
            if not isinstance(entry, dict):
                raise _Bad(where, "not an object")
            tasks = entry.get("tasks")
            if not isinstance(tasks, list) or not tasks:
                raise _Bad(f"{where}.tasks", "missing" if tasks is None else "not a non-empty list")
            submissions.append(
                Submission(
                    _job(entry.get("array_job"), f"{where}.array_job"),
                    _job(entry.get("merge_job"), f"{where}.merge_job"),
                    tuple(_count(t, f"{where}.tasks", 0, shards - 1) for t in tasks),
                )
            )
        tables = data.get("tables")
        if tables is not None and not isinstance(tables, str):
            raise _Bad("tables", "not a path")
    except _Bad as exc:
        field, problem = exc.args
        named = f"field '{field}': " if field else ""
        raise InputError(f"{path}: {named}{problem}; {FIX}") from None
    return SlurmRecord(shards, tuple(submissions), tables)


def read_record(root: Path) -> SlurmRecord:
    path = Path(root) / RECORD
    if not os.path.lexists(path):
        raise InputError(f"{root}: no {RECORD}; {FIX}")
    return parse_record(path, read_json(path, "Slurm record", FIX, limit=MAX_BYTES, tree=root))


def write_record(root: Path, record: SlurmRecord) -> None:
    write_atomic(Path(root) / RECORD, json.dumps(record.to_json(), indent=2) + "\n")
