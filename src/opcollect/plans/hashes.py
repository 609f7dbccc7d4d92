"""collector_hash (the collector source) and plan_hash (the canonical plan), stable everywhere.

collector_hash: sha256 over the sorted relative POSIX paths and contents of every .py, .yaml, .yml,
.sh and .patch file and every Dockerfile under src/opcollect/, cases/, systems/ and images/; never
JSON, caches or __pycache__. File order, mtimes and the working directory do not enter it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterable

HASHED_DIRS = ("src/opcollect", "cases", "systems", "images")
HASHED_SUFFIXES = (".py", ".yaml", ".yml", ".sh", ".patch")


def _is_hashed(path: Path) -> bool:
    if "__pycache__" in path.parts or any(part.startswith(".") for part in path.parts):
        return False
    return path.suffix in HASHED_SUFFIXES or path.name == "Dockerfile" or path.name.startswith("Dockerfile.")


def collector_files(root: Path) -> list[str]:
    """Relative POSIX paths of the hashed files, sorted."""
    found = []
    for top in HASHED_DIRS:
        base = root / top
        if base.is_dir():
            for path in base.rglob("*"):
                rel = path.relative_to(root)
                if path.is_file() and _is_hashed(rel):
                    found.append(rel.as_posix())
    return sorted(found)


def collector_hash(root: Path) -> str:
    digest = hashlib.sha256()
    for rel in collector_files(root):
        content = (root / rel).read_bytes()
        digest.update(f"{rel}\0{len(content)}\0".encode())
        digest.update(content)
    return digest.hexdigest()


def plan_hash(header: Iterable[str], lines: Iterable[str]) -> str:
    """sha256 over header lines, then the plan's canonical lines (case ID with its row), sorted."""
    digest = hashlib.sha256()
    digest.update(("\n".join(header) + "\n").encode())
    digest.update("\n".join(sorted(lines)).encode())
    return digest.hexdigest()


EMBEDDED = Path(__file__).resolve().parents[1] / "collector_hash.txt"


def installed_collector_hash() -> str | None:
    """The collector hash of the code that is running: from the checkout it was installed from, or,
    in an installed wheel, the hash written into the package when the wheel was built."""
    from opcollect.errors import InputError
    from opcollect.project import find_project

    try:
        return collector_hash(find_project().root)
    except InputError:  # no checkout around the package: an installed wheel
        return EMBEDDED.read_text().strip() if EMBEDDED.is_file() else None
