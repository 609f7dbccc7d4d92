"""Append-only, crash-safe shards: one JSON record per line, one file per worker slot and run.

Two kinds of line: a runtime line ({"kind": "runtime", "runtime_id", framework, version, python, torch,
cuda, driver, device, host, ...}) once per worker process, then case records that name it by
``runtime_id`` ({"case_id", "op", "status", "stats" or "error_class"/"message", "kernel_source",
"attempt", "plan_hash", "collector_hash", "run_id", "recorded_at", ...}).

A record is written whole with one write() and flushed to the OS at once, so killing the process loses
at most the record being written; fsync follows every FSYNC_EVERY records and at close. A reader skips
a torn last line, so its case counts as not recorded and a resume runs it again.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Iterator

from opcollect.inputs import MIB, NotJson, parse_json
from opcollect.inputs import read_lines as read_lines_of

FSYNC_EVERY = 64
MAX_SHARD_BYTES = 4 * 1024 * MIB  # a worker's records of a whole plan stay far below this
SHARD_FIX = "remove it from the run directory's shards/, or collect into a new --out"


class ShardWriter:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._unsynced = 0

    def append(self, record: dict) -> None:
        line = (json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n").encode()
        written = os.write(self._fd, line)
        if written != len(line):  # only a full disk cuts a write to a regular file short
            raise OSError(errno.ENOSPC, f"short write ({written} of {len(line)} bytes)", str(self.path))
        self._unsynced += 1
        if self._unsynced >= FSYNC_EVERY:
            os.fsync(self._fd)
            self._unsynced = 0

    def append_runtime(self, identity: dict) -> None:
        self.append({"kind": "runtime", **identity})

    def close(self) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1


def read_lines(path: Path) -> Iterator[dict]:
    """Complete lines of one shard, both kinds, in write order; a torn or corrupt line (not JSON, not UTF-8,
    nested too deeply) is skipped. The shard is read by opcollect.inputs, line by line: a regular file of
    RUN_DIR (a FIFO or a link planted in shards/ is one line, exit 2) of at most MAX_SHARD_BYTES."""
    path = Path(path)
    for raw in read_lines_of(path, "shard", SHARD_FIX, limit=MAX_SHARD_BYTES, tree=path.parent.parent):
        if not raw.endswith(b"\n"):
            return  # torn tail: the process died mid-write
        try:
            record = parse_json(raw, str(path), SHARD_FIX)
        except NotJson:
            continue
        if isinstance(record, dict):
            yield record


def read_shard(path: Path) -> Iterator[dict]:
    """Case records of one shard, in write order."""
    return (line for line in read_lines(path) if "case_id" in line)


def read_runtimes(path: Path) -> dict[str, dict]:
    """The runtime identities a shard announces, by runtime_id."""
    return {line["runtime_id"]: line for line in read_lines(path) if line.get("kind") == "runtime"}


def shard_paths(run_dir: Path) -> list[Path]:
    return sorted((Path(run_dir) / "shards").glob("*.jsonl"))
