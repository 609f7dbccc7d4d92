"""Operator-latency tables collected by opcollect, as an installed package.

``systems_root()`` is the TABLES tree (aiconfigurator opens it as a systems root); ``available()`` lists
every table as (system, backend, version, table); ``table_path(...)`` gives one table's parquet file and
``sidecar(...)`` its parsed collection_meta.yaml; ``verify()`` recomputes every file's sha256 against the
package's MANIFEST.json. Standard library only: this file is copied into the data wheel as its __init__.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_INDEX = "index.json"
_MANIFEST = "MANIFEST.json"


def systems_root() -> Path:
    return _HERE / "data"


def _index() -> dict:
    return json.loads((_HERE / _INDEX).read_text(encoding="utf-8"))


def available() -> list[tuple[str, str, str, str]]:
    """Every table this package holds, as sorted (system, backend, version, table) tuples."""
    return sorted((t["system"], t["backend"], t["version"], t["table"]) for t in _index()["tables"])


def _entry(system: str, backend: str, version: str, table: str) -> dict:
    for entry in _index()["tables"]:
        if (entry["system"], entry["backend"], entry["version"], entry["table"]) == (system, backend, version, table):
            return entry
    raise KeyError(f"no table {table!r} of {backend} {version} on {system}; available() lists what is here")


def table_path(system: str, backend: str, version: str, table: str) -> Path:
    """The parquet file of one table, e.g. table_path('h200_sxm', 'vllm', '0.24.0', 'gemm_perf')."""
    return systems_root() / _entry(system, backend, version, table)["path"]


def sidecar(system: str, backend: str, version: str, table: str) -> dict:
    """The table's collection_meta.yaml (runtime, and its table's rows, status and collections), parsed."""
    entry = _entry(system, backend, version, table)
    return _index()["sidecars"][entry["sidecar"]]


def verify() -> tuple[int, list[str]]:
    """(files checked, the paths whose sha256 or presence differs from MANIFEST.json)."""
    manifest = json.loads((_HERE / _MANIFEST).read_text(encoding="utf-8"))
    bad = []
    for rel, expected in sorted(manifest["files"].items()):
        path = _HERE / rel
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != expected:
            bad.append(rel)
    return len(manifest["files"]), bad


def main() -> int:
    """`python -m <package>`: verify the installed files, one line per difference, then a verdict."""
    checked, bad = verify()
    for rel in bad:
        print(f"differs: {rel}")
    print(f"{checked} files checked against {_MANIFEST}: {'verified' if not bad else f'{len(bad)} differ'}")
    return 1 if bad else 0
