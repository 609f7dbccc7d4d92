"""TABLES on disk: file hashes, manifest.json, and atomic replacement of the whole tree.

A merge writes into a staging copy beside TABLES (unchanged files are hard links, changed ones are
new files), writes its manifest, then exchanges the staging directory with TABLES in one
renameat2(RENAME_EXCHANGE). A merge killed at any point leaves TABLES as it was (or, after the
exchange, as the new one): never a mixture. Where the filesystem cannot exchange, two renames are
used and `recover` puts TABLES back if a kill fell between them.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import secrets
import shutil
from pathlib import Path

MANIFEST = "manifest.json"
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def listed_files(root: Path) -> list[str]:
    """Every file under TABLES but the manifest, as sorted relative POSIX paths."""
    return sorted(
        p.relative_to(root).as_posix()
        for p in Path(root).rglob("*")
        if p.is_file() and p.relative_to(root).as_posix() != MANIFEST
    )


def read_manifest(root: Path) -> dict:
    return json.loads((Path(root) / MANIFEST).read_text())


def _exchange(a: Path, b: Path) -> bool:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    return renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0


def _siblings(tables: Path, kind: str) -> list[Path]:
    return sorted(tables.parent.glob(f".{tables.name}.{kind}-*"))


def recover(tables: Path) -> None:
    """Undo a kill between the two fallback renames, and drop staging left by killed merges."""
    tables = Path(tables)
    old = _siblings(tables, "old")
    if not tables.exists() and old:
        old[-1].rename(tables)
    for leftover in _siblings(tables, "staging") + _siblings(tables, "old"):
        shutil.rmtree(leftover, ignore_errors=True)


class Staging:
    """A copy of TABLES to change; ``commit`` makes it TABLES atomically."""

    def __init__(self, tables: Path):
        self.tables = Path(tables)
        self.root = self.tables.parent / f".{self.tables.name}.staging-{secrets.token_hex(4)}"
        self.written: set[str] = set()
        self.root.mkdir(parents=True)
        if self.tables.is_dir():
            for src in self.tables.rglob("*"):
                dst = self.root / src.relative_to(self.tables)
                if src.is_dir():
                    dst.mkdir(parents=True, exist_ok=True)
                elif src.name != MANIFEST:
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    os.link(src, dst)

    def write(self, rel: str, data: bytes) -> Path:
        """A new file at ``rel``; a hard link already there is replaced, never written through."""
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        self.written.add(rel)
        return path

    def commit(self) -> None:
        previous = read_manifest(self.tables)["files"] if (self.tables / MANIFEST).is_file() else {}
        files = {}
        for rel in listed_files(self.root):
            old = previous.get(rel)
            if old is not None and rel not in self.written:
                files[rel] = old  # a hard link of a file the old manifest already hashed
            else:
                path = self.root / rel
                files[rel] = {"sha256": sha256_file(path), "size": path.stat().st_size}
        self.write(MANIFEST, (json.dumps({"schema_version": 1, "files": files}, indent=1) + "\n").encode())
        _fsync_dir(self.root)
        if not self.tables.exists():
            self.root.rename(self.tables)
        elif _exchange(self.root, self.tables):
            shutil.rmtree(self.root)  # it now holds the previous TABLES
        else:
            old = self.tables.parent / f".{self.tables.name}.old-{secrets.token_hex(4)}"
            self.tables.rename(old)
            self.root.rename(self.tables)
            shutil.rmtree(old)
        _fsync_dir(self.tables.parent)

    def abandon(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
