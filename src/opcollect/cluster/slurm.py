"""Slurm's own commands (sbatch, squeue, sacct), run as subprocesses: their answers parsed, their failures named.

The controller is the scheduler; opcollect only submits and asks. A missing sbatch or a controller that does not
answer is one line, exit 2 (InputError); squeue and sacct are asked only for status, where no answer means "Slurm
does not say" rather than an error.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from opcollect.errors import InputError

JOB_ID = re.compile(r"^(\d+)(;[A-Za-z0-9_.-]+)?$")
TIMEOUT = 60.0


def _command(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise InputError(
            f"{name} not found on PATH: run --slurm on a Slurm login node (Slurm's client commands), or collect "
            "without --slurm"
        )
    return found


def check_controller() -> None:
    """sbatch is here and the controller answers (sinfo), before anything is written or submitted."""
    _command("sbatch")
    try:
        done = subprocess.run([_command("sinfo"), "-h", "-o", "%P"], capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        raise InputError(f"the Slurm controller does not answer (sinfo gave nothing in {TIMEOUT:.0f} s)") from None
    if done.returncode != 0:
        reason = " ".join(done.stderr.split())[:200] or f"exit code {done.returncode}"
        raise InputError(f"the Slurm controller does not answer ({reason}); check slurmctld, or SLURM_CONF")


def sbatch(script: Path, *, array: str | None = None, dependency: str | None = None) -> str:
    """Submit ``script``; its job ID. ``array`` overrides the script's --array (a resubmission's shards)."""
    args = [_command("sbatch"), "--parsable"]
    if array is not None:
        args.append(f"--array={array}")
    if dependency is not None:
        args.append(f"--dependency={dependency}")
    try:
        done = subprocess.run([*args, str(script)], capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        raise InputError(f"sbatch {script.name}: no answer from the Slurm controller in {TIMEOUT:.0f} s") from None
    if done.returncode != 0:
        reason = " ".join(done.stderr.split())[:200] or f"exit code {done.returncode}"
        raise InputError(f"sbatch {script.name}: the Slurm controller refused or did not answer ({reason})")
    match = JOB_ID.match(done.stdout.strip())
    if match is None:
        raise InputError(f"sbatch {script.name}: unexpected answer {done.stdout.strip()!r}; expected a job ID")
    return match.group(1)


def task_states(job: str) -> dict[int, str] | None:
    """Array task index -> state (PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, ...) of one
    array job, squeue's answer (current) over sacct's; None when neither answers."""
    states: dict[int, str] = {}
    answered = False
    asks = (
        ["sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j", job],
        ["squeue", "-h", "-r", "-o", "%i|%T", "-j", job],
    )
    for command in asks:
        if shutil.which(command[0]) is None:
            continue
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            continue
        if done.returncode != 0:
            continue
        answered = True
        for line in done.stdout.splitlines():
            ident, _, state = line.partition("|")
            task = re.match(rf"^{job}_(\d+)$", ident.strip())
            if task:
                states[int(task.group(1))] = state.split()[0] if state.strip() else "UNKNOWN"
    return states if answered else None
