"""TABLES on disk: the merge lock, and atomic replacement of the whole tree (tables/verify.py owns the
manifest: what the tree lists, how a file is hashed, and reading manifest.json).

A merge writes into a staging copy beside TABLES (unchanged files are hard links, changed ones are
new files), writes its manifest, then exchanges the staging directory with TABLES in one
renameat2(RENAME_EXCHANGE). A merge killed at any point leaves TABLES as it was (or, after the
exchange, as the new one): never a mixture. Where the filesystem cannot exchange, two renames are
used and `recover` puts TABLES back if a kill fell between them.

One merge at a time changes a TABLES tree: `locked` holds an exclusive flock on `.<TABLES>.lock`
beside it for the whole merge, recovery included, and names the holder to whoever waits.

A TABLES path that is a symbolic link (`--into current -> tables-2026-05`) means the tree it points to: the
lock, the staging copy and the exchange are beside and of that tree, so the link stays a link to it.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import secrets
import shutil
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from opcollect.errors import InputError
from opcollect.files import fsync_dir, write_atomic
from opcollect.tables.verify import MANIFEST, list_tree, read_manifest_files, sha256_file, verify_tables

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def real_tables(tables: Path) -> Path:
    """The tree a TABLES path names: a symbolic link to a tree is that tree, so it is changed, not replaced."""
    return Path(tables).resolve()


def lock_path(tables: Path) -> Path:
    tables = real_tables(tables)
    return tables.parent / f".{tables.name}.lock"


@contextmanager
def locked(tables: Path, wait: bool = True, say: Callable[[str], None] = print) -> Iterator[None]:
    """Hold the TABLES tree's merge lock; wait for another holder (naming it), or refuse with wait=False."""
    path = lock_path(tables)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)  # the umask decides; never via a link
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
            if not wait:
                raise InputError(
                    f"{tables}: another merge holds it ({holder}); wait for it to finish, or drop --no-wait"
                ) from None
            say(f"waiting for the merge into {tables} held by {holder}")
            fcntl.flock(fd, fcntl.LOCK_EX)
        me = f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%H:%M:%S')}: {' '.join(sys.argv)}"
        os.ftruncate(fd, 0)
        os.pwrite(fd, me[:4000].encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def check_into(tables: Path, verify: bool = True) -> None:
    """Refuse a merge target that is a file, a foreign directory, or (``verify``) a tree that fails verify."""
    tables = Path(tables)
    if not tables.exists():
        return
    if not tables.is_dir():
        raise InputError(f"--into {tables}: is a file, not a TABLES directory; give a new or existing TABLES path")
    if not (tables / MANIFEST).is_file():
        if any(tables.iterdir()):
            raise InputError(
                f"--into {tables}: a non-empty directory without {MANIFEST} is not a TABLES tree; "
                "give a new directory or an existing TABLES tree"
            )
        return
    if not verify:
        return
    report = verify_tables(tables)
    if not report.clean:
        first = report.render().splitlines()[0]
        raise InputError(
            f"--into {tables}: fails verify ({first}); restore it or run `opcollect verify {tables}` "
            "and merge into a new TABLES"
        )


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
    tables = real_tables(tables)
    old = _siblings(tables, "old")
    if not tables.exists() and old:
        old[-1].rename(tables)
    for leftover in _siblings(tables, "staging") + _siblings(tables, "old"):
        shutil.rmtree(leftover, ignore_errors=True)


class Staging:
    """A copy of TABLES to change; ``commit`` makes it TABLES atomically."""

    def __init__(self, tables: Path):
        self.tables = real_tables(tables)
        self.root = self.tables.parent / f".{self.tables.name}.staging-{secrets.token_hex(4)}"
        self.written: set[str] = set()
        self.root.mkdir(parents=True)
        if self.tables.is_dir():  # regular files only: check_into refused a tree holding links or special files
            for rel in list_tree(self.tables).files:
                dst = self.root / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.link(self.tables / rel, dst, follow_symlinks=False)

    def write(self, rel: str, data: bytes) -> Path:
        """A new file at ``rel``; a hard link already there is replaced, never written through."""
        self.written.add(rel)
        return write_atomic(self.root / rel, data)

    def commit(self) -> None:
        previous = read_manifest_files(self.tables) if (self.tables / MANIFEST).is_file() else {}
        files = {}
        for rel in list_tree(self.root).files:
            old = previous.get(rel)
            if old is not None and rel not in self.written:
                files[rel] = old.model_dump()  # a hard link of a file the old manifest already hashed
            else:
                path = self.root / rel
                files[rel] = {"sha256": sha256_file(path), "size": path.stat().st_size}
        self.write(MANIFEST, (json.dumps({"schema_version": 1, "files": files}, indent=1) + "\n").encode())
        fsync_dir(self.root)
        if not self.tables.exists():
            self.root.rename(self.tables)
        elif _exchange(self.root, self.tables):
            shutil.rmtree(self.root)  # it now holds the previous TABLES
        else:
            old = self.tables.parent / f".{self.tables.name}.old-{secrets.token_hex(4)}"
            self.tables.rename(old)
            self.root.rename(self.tables)
            shutil.rmtree(old)
        fsync_dir(self.tables.parent)

    def abandon(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
