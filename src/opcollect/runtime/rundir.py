"""The run directory: the plan it runs, its identity, shards, events and worker logs.

RUN_DIR/plan.json         the plan file, copied at the first run
RUN_DIR/run.json          plan_hash, content_hash (plan, shard and selection), collector_hash, backend,
                          sm: a resume must hold the same content_hash
RUN_DIR/shards/*.jsonl    records, one file per worker slot and run (see shards.py)
RUN_DIR/events/<run_id>.json  one per `run` invocation: when, where, rows, failures
RUN_DIR/logs/             worker stderr
RUN_DIR/run.lock          flock'ed by the run that owns the directory (pid, host, since, command inside)

A run directory has one owner at a time: prepare_run_dir takes RUN_DIR/run.lock (a second `run`, or a
`--resume` while one runs, is refused naming the holder) and the Recorded it returns holds it, so the run
that keeps it (runtime/run.py keeps it for its whole life) owns the directory until it ends or dies.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import stat
import sys
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from opcollect.errors import InputError
from opcollect.files import check_name, write_atomic
from opcollect.inputs import MIB, NotJson, parse_json, read_bytes, read_json
from opcollect.runtime.planfile import MAX_PLAN_BYTES, PLAN_FIX, PlanFile, parse_plan
from opcollect.runtime.shards import read_shard, shard_paths

LOCK = "run.lock"
MAX_IDENTITY_BYTES = 16 * MIB  # run.json is one small object
_DAMAGED = "the run directory is damaged, collect into a new --out"


class RunLock:
    """An exclusive flock on RUN_DIR/run.lock, released by ``release``, when this object goes, or at exit."""

    def __init__(self, run_dir: Path):
        path = Path(run_dir) / LOCK
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)  # mode: the umask's
            writable = True
        except PermissionError:  # a container's user, in a run directory its host made (and names as holder)
            fd, writable = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise InputError(
                f"{run_dir}: another run owns it ({holder}); wait for it to end, or give another --out"
            ) from None
        if writable:
            me = f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%H:%M:%S')}: {' '.join(sys.argv)}"
            os.ftruncate(fd, 0)
            os.pwrite(fd, me[:4000].encode(errors="replace"), 0)
        self.release = weakref.finalize(self, os.close, fd)  # closing the descriptor releases the flock


@dataclass(frozen=True)
class Recorded:
    """What a run directory already holds: the latest record per case."""

    latest: dict[str, dict]
    lock: RunLock | None = field(default=None, compare=False, repr=False)  # held while this is kept

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


_SKELETON = {"plan.json", "shards", "events", "logs", LOCK}


def _unstarted(run_dir: Path) -> bool:
    """Empty, or left by a run killed before it wrote run.json (so it recorded nothing)."""
    names = {p.name for p in run_dir.iterdir() if not p.name.startswith(".plan.json.")}
    return names <= _SKELETON and not shard_paths(run_dir)


def identity_of(plan: PlanFile) -> dict:
    """What run.json holds: a resume must run a plan with the same content_hash."""
    return {
        "plan_hash": plan.plan_hash,
        "content_hash": plan.content_hash,
        "collector_hash": plan.collector_hash,
        "backend": plan.backend,
        "sm": plan.sm,
        "shard": plan.shard_label,
        "selection": plan.selection,
    }


def read_identity(run_dir: Path) -> dict:
    """RUN_DIR/run.json, checked to be one; InputError for a damaged or foreign file."""
    path = Path(run_dir) / "run.json"
    if not os.path.lexists(path):
        raise InputError(f"{run_dir}: not a run directory (no run.json); give the --out of `opcollect run`")
    try:
        identity = read_json(path, "run identity", _DAMAGED, limit=MAX_IDENTITY_BYTES, tree=run_dir)
    except NotJson as exc:
        raise InputError(f"{path}: not valid JSON ({exc.reason}); {_DAMAGED}") from None
    missing = (
        [k for k in ("plan_hash", "content_hash", "collector_hash", "backend", "sm") if k not in identity]
        if (isinstance(identity, dict))
        else ["plan_hash"]
    )
    if missing:
        raise InputError(
            f"{path}: field '{missing[0]}' is missing; the run directory is damaged or of an older opcollect"
        )
    return identity


def describe_identity(identity: dict) -> str:
    shard = f" shard {identity['shard']}" if identity.get("shard") else ""
    selection = identity.get("selection") or {}
    chosen = ",".join(selection.get("ops", ())) + (" smoke" if selection.get("smoke") else "")
    if selection.get("case_filter"):
        chosen += f" filter {selection['case_filter']!r}"
    return f"plan_hash {identity['plan_hash']}{shard} ({chosen})"


def check_same_plan(run_dir: Path, plan: PlanFile) -> None:
    """Refuse a run directory that holds another plan, shard or selection, naming both."""
    held = read_identity(run_dir)
    if held["content_hash"] != plan.content_hash:
        raise InputError(
            f"{run_dir}: holds {describe_identity(held)}, not {describe_identity(identity_of(plan))}; "
            "use another --out for a different plan or shard"
        )


def check_run_dir(run_dir: Path, plan: PlanFile, resume: bool) -> bool:
    """Whether RUN_DIR already holds a run of ``plan``; refuses every other state, creating nothing."""
    run_dir = Path(run_dir)
    if (run_dir / "run.json").exists():
        check_same_plan(run_dir, plan)
        if not resume and shard_paths(run_dir):
            raise InputError(f"{run_dir}: already holds a run of this plan; pass --resume to finish it")
        return True
    if resume and not run_dir.is_dir():
        raise InputError(f"{run_dir}: does not exist, so there is nothing to resume; drop --resume to start a run")
    check_fresh(run_dir)
    return False


def check_fresh(run_dir: Path) -> None:
    """Refuse to start a run in a path that exists and is neither empty nor an unstarted run directory."""
    if run_dir.exists() and (not run_dir.is_dir() or not _unstarted(run_dir)):
        raise InputError(f"{run_dir}: exists and is not a run directory; choose an empty or new --out")


def plan_bytes(plan_path: Path, plan: PlanFile) -> bytes:
    """The bytes of the plan file that ``plan`` was read from, to keep as RUN_DIR/plan.json.

    A pipe or device (`--plan <(cat p.json)`) gave its bytes to the first read and has none left: refused,
    before anything runs, rather than measuring every case beside an empty plan.json. A regular file is read
    again and must still hold the same plan (it may have been replaced since)."""
    mode = os.stat(plan_path).st_mode
    if not stat.S_ISREG(mode):
        raise InputError(
            f"--plan {plan_path}: not a regular file (a pipe or device), so the run directory cannot keep it; "
            "save the plan as a file (`opcollect plan -o p.json`) and give that"
        )
    data = read_bytes(plan_path, "plan", PLAN_FIX, limit=MAX_PLAN_BYTES)
    try:
        same = parse_plan(plan_path, parse_json(data, str(plan_path), PLAN_FIX), typed=False).content_hash
        same = same == plan.content_hash
    except InputError:
        same = False
    if not same:
        raise InputError(f"--plan {plan_path}: changed while the run started; give a plan file nobody is writing")
    return data


def prepare_run_dir(run_dir: Path, plan_path: Path, plan: PlanFile, resume: bool) -> Recorded:
    """Create RUN_DIR for ``plan``, or check that it holds this plan and return what it recorded; the result
    holds the run directory's lock (refused, naming the holder, while another run holds it)."""
    run_dir = Path(run_dir)
    check_name(run_dir / LOCK)  # OSError naming --out for a name the file system cannot hold, before any work
    if not run_dir.is_dir():
        check_run_dir(run_dir, plan, resume)  # a file, or nothing to resume: refused, creating nothing
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = RunLock(run_dir)
    try:
        if check_run_dir(run_dir, plan, resume):
            return Recorded(recorded(run_dir).latest, lock)
        same_file = Path(plan_path).resolve() == (run_dir / "plan.json").resolve()
        data = None if same_file else plan_bytes(plan_path, plan)
        for sub in ("shards", "events", "logs"):
            (run_dir / sub).mkdir(parents=True, exist_ok=True)
        if data is not None:
            write_atomic(run_dir / "plan.json", data)
        write_atomic(run_dir / "run.json", json.dumps(identity_of(plan), indent=2) + "\n")
    except BaseException:
        lock.release()
        raise
    return Recorded({}, lock)
