"""`opcollect verify TABLES`: recompute every sha256 against manifest.json and the provenance records.

This module owns the manifest: what TABLES lists (regular files only; a symbolic link or a special file is
reported, never followed or opened), how a file is hashed, and reading manifest.json. tables/store.py uses
it to write the manifest of a merge and to refuse a merge target that does not verify.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import Field

from opcollect.cases.grids import Frozen
from opcollect.errors import InputError
from opcollect.inputs import MIB, kind_of, open_regular, read_bytes, read_json
from opcollect.tables import provenance as pv
from opcollect.tables.schema import MAX_TABLE, table_files
from opcollect.yamlio import validate

MANIFEST = "manifest.json"
_MANIFEST_FIX = "restore it from a backup, or merge the runs into a new TABLES"


_FOREIGN_FIX = "remove it, or restore the tree from a backup"
MAX_FILE = MAX_TABLE  # a file of TABLES: the bound a table has, on what a planted file makes us hash
MAX_MANIFEST = 64 * MIB


def sha256_file(path: Path, tree: Path | None = None) -> str:
    """The sha256 of the regular file ``path`` of ``tree`` (its directory if not given), read by opcollect.inputs:
    never through a link, never from a FIFO (a special file or link is an InputError)."""
    digest = hashlib.sha256()
    tree = Path(path).parent if tree is None else tree
    with open_regular(path, "file merge wrote", _FOREIGN_FIX, limit=MAX_FILE, tree=tree) as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_tree_file(path: Path, tree: Path) -> bytes:
    """The bytes of a regular file of TABLES ``tree``, never through a link or from a FIFO."""
    return read_bytes(path, "file merge wrote", _FOREIGN_FIX, limit=MAX_FILE, tree=tree)


@dataclass(frozen=True)
class Listing:
    """What a TABLES tree holds, as sorted relative POSIX paths: merge writes regular files and directories
    only, so a symbolic link (wherever it points) or a special file in it is foreign and is not followed."""

    files: list[str]  # regular files, the top manifest.json excluded
    links: list[str]  # "rel -> target"
    special: list[str]  # "rel (a FIFO)"


def _raise(exc: OSError) -> None:
    raise exc


def list_tree(root: Path) -> Listing:
    root = Path(root)
    files, links, special = [], [], []
    # followlinks=False: a linked directory is listed as a link, never entered
    for directory, dirs, names in os.walk(root, onerror=_raise):
        for name in dirs + names:
            full = os.path.join(directory, name)
            rel = Path(full).relative_to(root).as_posix()
            mode = os.lstat(full).st_mode
            if stat.S_ISLNK(mode):
                links.append(f"{rel} -> {os.readlink(full)}")
            elif stat.S_ISREG(mode):
                if rel != MANIFEST:
                    files.append(rel)
            elif not stat.S_ISDIR(mode):
                special.append(f"{rel} ({kind_of(mode)})")
    return Listing(sorted(files), sorted(links), sorted(special))


def listed_files(root: Path) -> list[str]:
    """Every regular file under TABLES but the manifest, as sorted relative POSIX paths."""
    return list_tree(root).files


class ManifestEntry(Frozen):
    sha256: pv.Sha256
    size: int = Field(ge=0)


class Manifest(Frozen):
    schema_version: Literal[1]
    files: dict[str, ManifestEntry]


def read_manifest_files(root: Path) -> dict[str, ManifestEntry]:
    """TABLES/manifest.json's files, checked to be a manifest; InputError naming what is wrong in it."""
    path = Path(root) / MANIFEST
    data = read_json(path, "manifest", _MANIFEST_FIX, limit=MAX_MANIFEST, tree=root)
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
    links: list[str] = field(default_factory=list)  # symbolic links, never followed: merge writes none
    special: list[str] = field(default_factory=list)  # FIFOs, sockets, devices: never opened

    @property
    def clean(self) -> bool:
        return not (self.modified or self.missing or self.unexpected or self.sidecar or self.links or self.special)

    def render(self) -> str:
        lines = [
            f"{kind}: {path}"
            for kind, paths in (
                ("modified", self.modified),
                ("missing", self.missing),
                ("unexpected", self.unexpected),
                ("sidecar mismatch", self.sidecar),
                ("symbolic link (not followed)", self.links),
                ("not a regular file", self.special),
            )
            for path in paths
        ]
        verdict = "verified" if self.clean else f"{len(lines)} differences"
        return "\n".join(lines + [f"{self.checked} files checked: {verdict}"]) + "\n"


def verify_tables(root: Path) -> VerifyReport:
    """Every difference between TABLES and its manifest; a link or special file in the tree is one, and is
    neither followed nor opened (so verify cannot be made to read outside the tree or to block)."""
    root = Path(root)
    if not (root / MANIFEST).is_file():
        raise InputError(f"{root}: no {MANIFEST}; give the TABLES directory of `opcollect merge`")
    files = read_manifest_files(root)
    listing = list_tree(root)
    present = set(listing.files)
    foreign = {entry.split(" -> ")[0] for entry in listing.links} | {e.rsplit(" (", 1)[0] for e in listing.special}
    report = VerifyReport(
        len(files), unexpected=sorted(present - files.keys()), links=listing.links, special=listing.special
    )
    for rel, entry in sorted(files.items()):
        path = root / rel
        if rel in foreign:
            continue  # reported as a link or a special file
        if rel not in present:
            report.missing.append(rel)
        elif path.stat().st_size != entry.size or sha256_file(path, root) != entry.sha256:
            report.modified.append(rel)
    for rel in listing.files:
        if not (rel == pv.PROVENANCE or rel.endswith(f"/{pv.PROVENANCE}")):
            continue
        record_path = root / rel
        directory = record_path.parent.parent
        try:
            record = pv.read_provenance(record_path)
        except InputError:
            continue  # the manifest already reports an edited record; check rule R5 explains it
        for name, entry in record.tables.items():
            perf = directory / table_files(name)[0]
            rel_perf = perf.relative_to(root).as_posix()
            if rel_perf in present and sha256_file(perf, root) != entry.file_sha256:
                report.sidecar.append(rel_perf)
    return report
