"""The batch scripts of a Slurm collection, rendered from typed options: readable, resubmittable as they are.

collect.sbatch is an array job: task i runs `opcollect run` on RUN_ROOT/shard-i (its plan written there at
submission), resuming when that shard already started, in the backend's image through the chosen container
runtime or directly (`none`). merge.sbatch merges every shard into TABLES against the whole plan (a shard that
did not finish leaves its tables partial) and checks them.

The #SBATCH lines are read by sbatch, not by the shell, and sbatch does not unquote them the shell's way: its
parser (src/sbatch/opt.c _get_argument) escapes with a backslash, ends a value at an unescaped '#' and a line at a
newline, and groups with double quotes; single quotes group only in some versions (literal in older opt.c, taken
by slurm-wlm 22.05.8). A value there is not made safe by shlex.quote: every value that reaches an #SBATCH line is
validated where it enters (SlurmOptions, and check_root for the run root in the log path), each against the whole
value (fullmatch: a trailing "\ncommand" would become a line of the script that bash runs), and the one path among
them is written in the quoting every version reads (sbatch_path: double quotes, backslash escapes). Values in the
script's body are for bash, and shell-quoted.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from opcollect.errors import InputError

RUNTIMES = ("none", "docker", "pyxis", "apptainer")
DEVICES = ("cuda", "cpu")
# each is matched against the whole value (fullmatch), ASCII digits only
SLURM_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}", re.ASCII)  # partition, account
SLURM_TIME = re.compile(r"([0-9]{1,3}-)?[0-9]{1,4}(:[0-9]{2}){0,2}", re.ASCII)  # minutes, [D-]HH:MM:SS, ...
IMAGE = re.compile(r"[a-z0-9][a-z0-9._/:-]*(@sha256:[0-9a-f]{64})?", re.ASCII)
# a run root's path: printable, no backslash (sbatch's escape; in --output it also turns off the %-patterns)
ROOT_CHARS = re.compile(r"[^\x00-\x1f\x7f\\]+")
MOUNT_CHARS = re.compile(r"[^:,]+")  # docker -v, pyxis --container-mounts and apptainer --bind split at : and ,


def _whole_number(flag: str, value: object, low: int, high: int) -> None:
    if type(value) is not int or not low <= value <= high:
        raise InputError(f"{flag} {value!r}: give a whole number from {low} to {high}")


def check_root(root: Path, flag: str, runtime: str = "none") -> None:
    """The run root can be written into collect.sbatch's #SBATCH --output and, for a container runtime, into a
    mount specification; InputError naming ``flag`` when it cannot."""
    text = str(root)
    try:
        text.encode()
    except UnicodeEncodeError:
        raise InputError(f"{flag} {text!r}: not UTF-8; a Slurm run root is written into its scripts") from None
    if not ROOT_CHARS.fullmatch(text):
        raise InputError(
            f"{flag} {text!r}: a Slurm run root cannot hold a control character (a newline, a tab) or a "
            "backslash: sbatch reads its log path from an #SBATCH line; choose another directory"
        )
    if runtime != "none" and not MOUNT_CHARS.fullmatch(text):
        raise InputError(
            f"{flag} {text!r}: the {runtime} runtime mounts the run root by a spec that ':' and ',' split; "
            "choose a directory without them"
        )


def sbatch_path(path: Path, flag: str) -> str:
    """``path`` as one #SBATCH value: double-quoted, '"' and '#' escaped for sbatch's parser, '%' doubled for
    the filename pattern of --output (%x, %A, %a and %j are Slurm's)."""
    check_root(path.parent, flag)
    text = str(path.parent).replace("%", "%%") + "/" + path.name
    return '"' + text.replace('"', '\\"').replace("#", "\\#") + '"'


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
        if type(self.shards) is not int or not 1 <= self.shards <= 1000:
            raise InputError(f"--shards {self.shards}: give 1 to 1000 array tasks")
        for flag, value in (("--partition", self.partition), ("--account", self.account)):
            if value is not None and not (isinstance(value, str) and SLURM_NAME.fullmatch(value)):
                raise InputError(f"{flag} {value!r}: not a Slurm name (letters, digits, _ . -)")
        if self.time is not None and not (isinstance(self.time, str) and SLURM_TIME.fullmatch(self.time)):
            raise InputError(f"--time {self.time!r}: not a Slurm time limit; give e.g. 90, 4:00:00 or 1-00:00:00")
        _whole_number("--gpus-per-task", self.gpus_per_task, 0, 64)
        _whole_number("--cpus-per-task", self.cpus_per_task, 1, 1024)
        if self.runtime not in RUNTIMES:
            raise InputError(f"--container-runtime {self.runtime!r}: one of {', '.join(RUNTIMES)}")
        if self.device not in DEVICES:
            raise InputError(f"--device {self.device!r}: one of {', '.join(DEVICES)}")
        if self.image is not None and not (isinstance(self.image, str) and IMAGE.fullmatch(self.image)):
            raise InputError(f"collector image {self.image!r}: not an image reference")


def _header(name: str, options: SlurmOptions, logs: Path, array: bool) -> list[str]:
    lines = ["#!/bin/bash", f"#SBATCH --job-name={name}"]
    pattern = "%x-%A_%a.out" if array else "%x-%j.out"
    lines.append(f"#SBATCH --output={sbatch_path(logs / pattern, 'the run root')}")
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
