"""The batch scripts of a Slurm collection, rendered from typed options: readable, resubmittable as they are.

collect.sbatch is an array job: task i runs `opcollect run` on RUN_ROOT/shard-i (its plan written there at
submission), resuming when that shard already started, in the backend's image through the chosen container
runtime or directly (`none`). merge.sbatch merges every shard into TABLES against the whole plan (a shard that
did not finish leaves its tables partial) and checks them. Every value that reaches a script is validated
first (SlurmOptions) and shell-quoted.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from opcollect.errors import InputError

RUNTIMES = ("none", "docker", "pyxis", "apptainer")
SLURM_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # partition, account
SLURM_TIME = re.compile(r"^(\d+-)?\d{1,3}(:\d{2}){0,2}$")  # minutes, [D-]HH:MM:SS, ...
IMAGE = re.compile(r"^[a-z0-9][a-z0-9._/:-]*(@sha256:[0-9a-f]{64})?$")


@dataclass(frozen=True)
class SlurmOptions:
    shards: int
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    gpus_per_task: int = 0  # 0: a CPU collection
    cpus_per_task: int = 1
    runtime: str = "none"
    image: str | None = None  # the collector image, for a container runtime
    device: str = "cuda"
    run_flags: tuple[str, ...] = ()  # the timing options of `opcollect run` (collect._run_flags)

    def __post_init__(self) -> None:
        if not 1 <= self.shards <= 1000:
            raise InputError(f"--shards {self.shards}: give 1 to 1000 array tasks")
        for flag, value in (("--partition", self.partition), ("--account", self.account)):
            if value is not None and not SLURM_NAME.match(value):
                raise InputError(f"{flag} {value!r}: not a Slurm name (letters, digits, _ . -)")
        if self.time is not None and not SLURM_TIME.match(self.time):
            raise InputError(f"--time {self.time!r}: not a Slurm time limit; give e.g. 90, 4:00:00 or 1-00:00:00")
        if not 0 <= self.gpus_per_task <= 64:
            raise InputError(f"--gpus-per-task {self.gpus_per_task}: give 0 to 64")
        if self.runtime not in RUNTIMES:
            raise InputError(f"--container-runtime {self.runtime!r}: one of {', '.join(RUNTIMES)}")
        if self.image is not None and not IMAGE.match(self.image):
            raise InputError(f"collector image {self.image!r}: not an image reference")


def _header(name: str, options: SlurmOptions, logs: Path, array: bool) -> list[str]:
    lines = ["#!/bin/bash", f"#SBATCH --job-name={name}"]
    pattern = "%x-%A_%a.out" if array else "%x-%j.out"
    lines.append(f"#SBATCH --output={shlex.quote(str(logs / pattern))}")
    if array:
        lines.append(f"#SBATCH --array=0-{options.shards - 1}")
        lines.append(f"#SBATCH --cpus-per-task={options.cpus_per_task}")
        if options.gpus_per_task:
            lines.append(f"#SBATCH --gpus-per-task={options.gpus_per_task}")
    for flag, value in (("partition", options.partition), ("account", options.account), ("time", options.time)):
        if value is not None:
            lines.append(f"#SBATCH --{flag}={value}")
    return lines


def _run_command(options: SlurmOptions, root: Path) -> str:
    """The `opcollect run` of one shard, through the container runtime: "$@" are run's arguments."""
    if options.runtime != "none" and options.image is None:
        raise ValueError(f"the {options.runtime} runtime runs the collector image: build it first")
    python = shlex.quote(sys.executable)
    mount = shlex.quote(f"{root}:{root}")
    image = shlex.quote(options.image or "")
    if options.runtime == "none":
        return f'{python} -m opcollect run "$@"'
    if options.runtime == "docker":
        gpus = '--gpus "device=${CUDA_VISIBLE_DEVICES:-all}" ' if options.gpus_per_task else ""
        return f'docker run --rm --ipc=host {gpus}-v {mount} {image} run "$@"'  # the image's entrypoint is opcollect
    if options.runtime == "pyxis":
        return f'srun --ntasks=1 --container-image={image} --container-mounts={mount} python3 -m opcollect run "$@"'
    return f'apptainer exec --nv --bind {mount} docker://{options.image} python3 -m opcollect run "$@"'


def array_script(root: Path, options: SlurmOptions) -> str:
    """collect.sbatch: task i runs shard i of the plan written under ``root``."""
    root = Path(root).resolve()
    lines = _header("opcollect-collect", options, root / "logs", array=True)
    quoted = shlex.quote(str(root))
    lines += [
        "set -euo pipefail",
        f"root={quoted}",
        'shard="$root/shard-$SLURM_ARRAY_TASK_ID"',
        "resume=()",
        '[ -f "$shard/run.json" ] && resume=(--resume)  # a task that died left its shard resumable',
        "collect_run() {",
        f"  {_run_command(options, root)}",
        "}",
        f'collect_run --plan "$shard/plan.json" --out "$shard" --device {options.device} '
        f'{" ".join(map(shlex.quote, options.run_flags))} "${{resume[@]}}"',
    ]
    return "\n".join(lines) + "\n"


def merge_script(root: Path, tables: Path, options: SlurmOptions, checkout: Path) -> str:
    """merge.sbatch: every shard that recorded something, merged against the whole plan, then checked."""
    root, tables = Path(root).resolve(), Path(tables).resolve()
    python = shlex.quote(sys.executable)
    lines = _header("opcollect-merge", SlurmOptions(1, options.partition, options.account, options.time),
                    root / "logs", array=False)  # fmt: skip
    lines += [
        "set -uo pipefail",
        f"root={shlex.quote(str(root))}",
        "shards=()",
        'for shard in "$root"/shard-*; do',
        '  compgen -G "$shard/shards/*.jsonl" >/dev/null && shards+=("$shard")',
        "done",
        'if [ ${#shards[@]} -eq 0 ]; then echo "no shard recorded anything; resubmit with --resume" >&2; exit 1; fi',
        f'{python} -m opcollect merge "${{shards[@]}}" --plan "$root/plan.json" '
        f"--into {shlex.quote(str(tables))} --root {shlex.quote(str(Path(checkout).resolve()))}",
        f"{python} -m opcollect check {shlex.quote(str(tables))}",
        f'{python} -m opcollect status "$root"',
    ]
    return "\n".join(lines) + "\n"
