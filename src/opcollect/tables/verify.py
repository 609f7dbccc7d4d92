"""`opcollect verify TABLES`: recompute every sha256 against manifest.json and the sidecars."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from opcollect.errors import InputError
from opcollect.tables import sidecar as sc
from opcollect.tables.schema import table_files
from opcollect.tables.store import MANIFEST, listed_files, read_manifest, sha256_file


@dataclass(frozen=True)
class VerifyReport:
    checked: int
    modified: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    sidecar: list[str] = field(default_factory=list)  # perf files whose sidecar file_sha256 disagrees

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
    try:
        files = read_manifest(root)["files"]
    except (ValueError, KeyError):
        return VerifyReport(0, modified=[MANIFEST])
    present = set(listed_files(root))
    report = VerifyReport(len(files), unexpected=sorted(present - files.keys()))
    for rel, entry in sorted(files.items()):
        path = root / rel
        if rel not in present:
            report.missing.append(rel)
        elif path.stat().st_size != entry.get("size") or sha256_file(path) != entry.get("sha256"):
            report.modified.append(rel)
    for meta_path in sorted(root.rglob(sc.SIDECAR)):
        try:
            meta = sc.read_sidecar(meta_path)
        except InputError:
            continue  # the manifest already reports an edited sidecar; check rule R5 explains it
        if isinstance(meta, sc.SidecarV2):
            for name, entry in meta.tables.items():
                perf = meta_path.parent / table_files(name)[0]
                if perf.is_file() and sha256_file(perf) != entry.file_sha256:
                    report.sidecar.append(str(perf.relative_to(root)))
    return report
