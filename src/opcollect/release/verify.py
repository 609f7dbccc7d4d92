"""Verify a built data wheel as a user gets it: install it into a fresh virtual environment outside the source
tree, then let the installed package recompute every file's sha256 against its MANIFEST.json under
``python -I`` (no script directory, no user site, no PYTHON* variables: only what was installed).

Each child runs in its own session and, when the release is interrupted, is killed with its whole process
group (ensurepip starts pip as a grandchild); the venv's temporary directory goes with the exception."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import venv
from dataclasses import dataclass
from pathlib import Path

from opcollect.errors import InputError
from opcollect.release.package import PACKAGE


@dataclass(frozen=True)
class Installed:
    ok: bool
    output: str  # what the installed package printed: one line per difference, then its verdict


def run_group(command: list[str], cwd: str) -> subprocess.CompletedProcess:
    """``command`` in a new session, its output captured; on any exception (an interrupt) its whole process
    group is killed before the exception goes on, so no child or grandchild outlives the release; their
    temporary files go into ``cwd`` (the venv's temporary directory), removed with it."""
    env = {**os.environ, "TMPDIR": cwd}  # what a killed child leaves in its temporary files goes with ``cwd``
    with subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    ) as child:
        try:
            stdout, stderr = child.communicate()
        except BaseException:
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            child.wait()
            raise
    return subprocess.CompletedProcess(command, child.returncode, stdout, stderr)


def verify_wheel(wheel: Path) -> Installed:
    with tempfile.TemporaryDirectory(prefix="opcollect-release-venv-") as tmp:
        env_dir = Path(tmp) / "venv"
        venv.EnvBuilder(with_pip=False, clear=True).create(env_dir)
        python = str(env_dir / "bin" / "python")
        # what EnvBuilder(with_pip=True) runs, here in a killable process group
        pip = run_group([python, "-Im", "ensurepip", "--upgrade", "--default-pip"], tmp)
        if pip.returncode != 0:
            reason = (pip.stderr.strip().splitlines() or ["no output"])[-1]
            raise InputError(f"{wheel}: cannot put pip into a fresh venv to verify it ({reason})")
        install = run_group(
            [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(Path(wheel).resolve())], tmp
        )
        if install.returncode != 0:
            reason = (install.stderr.strip().splitlines() or ["no output"])[-1]
            raise InputError(f"{wheel}: pip cannot install it into a fresh venv ({reason})")
        done = run_group([python, "-I", "-m", PACKAGE], tmp)
    return Installed(done.returncode == 0, (done.stdout + done.stderr).strip())
