"""collector_hash (the collector source), plan_hash and content_hash (the canonical plan), stable everywhere.

collector_hash: sha256 over the sorted relative POSIX paths and contents of every .py, .yaml, .yml,
.sh and .patch file and every Dockerfile under src/opcollect/, cases/, systems/ and images/; never
JSON, caches or __pycache__. File order, mtimes and the working directory do not enter it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterable, Sequence

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


def plan_hash(header: Iterable[str], lines: Iterable[str], presorted: bool = False) -> str:
    """sha256 over header lines, then the plan's canonical lines (case ID with its row), sorted.

    ``presorted`` says the lines are sorted already (sorting is most of the cost), so two hashes over
    the same lines sort once.
    """
    digest = hashlib.sha256()
    digest.update(("\n".join(header) + "\n").encode())
    digest.update("\n".join(lines if presorted else sorted(lines)).encode())
    return digest.hexdigest()


def plan_header(backend: str, sm: str) -> list[str]:
    return [f"backend={backend}", f"sm={sm}"]


def canonical_lines(ids: Sequence[str], dispatch: Sequence[str], rows) -> list[str]:
    """'case_id<TAB>dispatch[<TAB>row_id]' per case; ``rows`` None means each case is its own row.

    ``rows`` are (row_id, dispatch, case_ids) triples, in any order.
    """
    if rows is None:
        return list(map("%s\t%s".__mod__, zip(ids, dispatch)))
    return [f"{case_id}\t{row_dispatch}\t{row_id}" for row_id, row_dispatch, case_ids in rows for case_id in case_ids]


def content_hash(
    backend: str,
    sm: str,
    whole_plan_hash: str,
    shard: tuple[int, int] | None,
    selection: dict,
    lines: Iterable[str],
    presorted: bool = False,
) -> str:
    """The identity of one plan file: the whole plan's hash, its shard, its selection and its own cases.

    Shards of one plan share plan_hash; each has its own content_hash, which a run directory keeps.
    """
    header = plan_header(backend, sm) + [
        f"plan_hash={whole_plan_hash}",
        f"shard={'none' if shard is None else f'{shard[0]}/{shard[1]}'}",
        "selection=" + json.dumps(selection, sort_keys=True, separators=(",", ":")),
    ]
    return plan_hash(header, lines, presorted)


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
