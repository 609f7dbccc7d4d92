"""RUN_ROOT/slurm.json, what `collect --slurm` submitted: the shard count and every submission's job IDs and tasks.

It is read back by `status` and `collect --slurm --resume`, so it is read as input from outside: a regular file
(no FIFO, device, directory or symlink), at most MAX_BYTES, UTF-8 JSON of bounded nesting, every field typed;
anything else is one line (InputError) naming the file and what is wrong with it.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from opcollect.errors import InputError
from opcollect.files import write_atomic

RECORD = "slurm.json"
MAX_BYTES = 16 * 1024 * 1024  # 1000 shards resubmitted many times stay far below this
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


def read_bytes(path: Path, what: str, fix: str, limit: int = MAX_BYTES) -> bytes:
    """A regular file's bytes, opened without following a symlink or blocking on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise InputError(f"{path.parent}: no {path.name}; {fix}") from None
    except OSError as exc:
        link = " (a symlink)" if os.path.islink(path) else ""
        raise InputError(f"{path}: cannot read {what}{link}: {exc.strerror}; {fix}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"{path}: not a regular file; {fix}")
        if info.st_size > limit:
            raise InputError(f"{path}: {info.st_size} bytes, over the {limit} a {what} may hold; {fix}")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise InputError(f"{path}: cannot read {what}: {exc.strerror}; {fix}") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise InputError(f"{path}: over the {limit} bytes a {what} may hold; {fix}")
    return data


def read_json(path: Path, what: str, fix: str) -> object:
    data = read_bytes(path, what, fix)
    try:
        return json.loads(data.decode())
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start}); {fix}") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: invalid JSON at line {exc.lineno} ({exc.msg}); {fix}") from None
    except RecursionError:
        raise InputError(f"{path}: JSON nested too deeply; {fix}") from None


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
    return parse_record(path, read_json(path, "Slurm record", FIX))


def write_record(root: Path, record: SlurmRecord) -> None:
    write_atomic(Path(root) / RECORD, json.dumps(record.to_json(), indent=2) + "\n")
