"""`opcollect verify TABLES`: recompute every sha256 against manifest.json and the provenance records."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import Field

from opcollect.cases.grids import Frozen
from opcollect.errors import InputError
from opcollect.tables import provenance as pv
from opcollect.tables.schema import table_files
from opcollect.tables.store import MANIFEST, listed_files, sha256_file
from opcollect.yamlio import not_utf8, validate

_MANIFEST_FIX = "restore it from a backup, or merge the runs into a new TABLES"


class ManifestEntry(Frozen):
    sha256: pv.Sha256
    size: int = Field(ge=0)


class Manifest(Frozen):
    schema_version: Literal[1]
    files: dict[str, ManifestEntry]


def read_manifest_files(root: Path) -> dict[str, ManifestEntry]:
    """TABLES/manifest.json's files, checked to be a manifest; InputError naming what is wrong in it."""
    path = Path(root) / MANIFEST
    try:
        data = json.loads(path.read_bytes())
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}; {_MANIFEST_FIX}") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: {not_utf8(exc)}; {_MANIFEST_FIX}") from None
    try:
        return validate(str(path), data, Manifest).files
    except InputError as exc:
        raise InputError(f"{exc}; {_MANIFEST_FIX}") from None


@dataclass(frozen=True)
class VerifyReport:
    checked: int
    modified: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    sidecar: list[str] = field(default_factory=list)  # perf files whose recorded file_sha256 disagrees

    @property
    def clean(self) -> bool:
        return not (self.modified or self.missing or self.unexpected or self.sidecar)

    def render(self) -> str:
        lines = [
            f"{kind}: {path}"
            for kind, paths in (
                ("modified", self.modified),
                ("missing", self.missing),
                ("unexpected", self.unexpected),
                ("sidecar mismatch", self.sidecar),
            )
            for path in paths
        ]
        verdict = "verified" if self.clean else f"{len(lines)} differences"
        return "\n".join(lines + [f"{self.checked} files checked: {verdict}"]) + "\n"


def verify_tables(root: Path) -> VerifyReport:
    root = Path(root)
    if not (root / MANIFEST).is_file():
        raise InputError(f"{root}: no {MANIFEST}; give the TABLES directory of `opcollect merge`")
    files = read_manifest_files(root)
    present = set(listed_files(root))
    report = VerifyReport(len(files), unexpected=sorted(present - files.keys()))
    for rel, entry in sorted(files.items()):
        path = root / rel
        if rel not in present:
            report.missing.append(rel)
        elif path.stat().st_size != entry.size or sha256_file(path) != entry.sha256:
            report.modified.append(rel)
    for record_path in sorted(root.rglob(pv.PROVENANCE)):
        directory = record_path.parent.parent
        try:
            record = pv.read_provenance(record_path)
        except InputError:
            continue  # the manifest already reports an edited record; check rule R5 explains it
        for name, entry in record.tables.items():
            perf = directory / table_files(name)[0]
            if perf.is_file() and sha256_file(perf) != entry.file_sha256:
                report.sidecar.append(str(perf.relative_to(root)))
    return report
