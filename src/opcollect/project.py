"""Where the project's declared inputs live: cases/, systems/, pins.yaml, images/."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from opcollect.errors import InputError


@dataclass(frozen=True)
class ProjectTree:
    root: Path

    @property
    def cases(self) -> Path:
        return self.root / "cases"

    @property
    def systems(self) -> Path:
        return self.root / "systems"

    @property
    def pins(self) -> Path:
        return self.root / "pins.yaml"

    @property
    def images(self) -> Path:
        return self.root / "images"

    @property
    def package(self) -> Path:
        return self.root / "src" / "opcollect"

    def git(self, *args: str) -> str | None:
        """What `git ARGS` prints in this checkout, or None when git or the repository does not answer."""
        try:
            done = subprocess.run(["git", "-C", str(self.root), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None


def find_project(root: Path | None = None) -> ProjectTree:
    """The checkout this package was installed from (editable install), or ``root`` when given."""
    candidate = Path(root) if root is not None else Path(__file__).resolve().parents[2]
    if not (candidate / "cases" / "base_ops").is_dir():
        raise InputError(
            f"{candidate}: no cases/base_ops here; run from an opcollect checkout "
            "(pip install -e .) or pass --root pointing at one"
        )
    return ProjectTree(candidate.resolve())
