"""Verify a built data wheel as a user gets it: install it into a fresh virtual environment outside the source
tree, then let the installed package recompute every file's sha256 against its MANIFEST.json under
``python -I`` (no script directory, no user site, no PYTHON* variables: only what was installed)."""

from __future__ import annotations

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


def verify_wheel(wheel: Path) -> Installed:
    with tempfile.TemporaryDirectory(prefix="opcollect-release-venv-") as tmp:
        env_dir = Path(tmp) / "venv"
        venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
        python = env_dir / "bin" / "python"
        install = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(Path(wheel).resolve())],
            capture_output=True,
            text=True,
            cwd=tmp,
        )
        if install.returncode != 0:
            reason = (install.stderr.strip().splitlines() or ["no output"])[-1]
            raise InputError(f"{wheel}: pip cannot install it into a fresh venv ({reason})")
        done = subprocess.run([str(python), "-I", "-m", PACKAGE], capture_output=True, text=True, cwd=tmp)
    return Installed(done.returncode == 0, (done.stdout + done.stderr).strip())
