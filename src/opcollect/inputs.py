"""The one reader for files that come from outside: plans, model configs, run records, events, manifests,
sidecars, Slurm state, committed selections and framework sources.

A file is read only if it is a regular file: it is opened with O_NONBLOCK, so a FIFO planted where a file is
expected opens at once instead of waiting for a writer, and fstat refuses it (and a device, socket or
directory) before a byte is read. Given the tree it belongs to (TABLES, RUN_DIR, RUN_ROOT), a file of it that
is a symbolic link is not followed, and a path that a linked directory takes out of the tree is refused.
Every read has a size bound, and JSON a nesting bound (yamlio reads YAML through it; Python sources are
parsed here with their recursion caught). Whatever is wrong is one line, InputError (exit 2), naming the
file, what it is and how to fix it.
"""

from __future__ import annotations

import ast
import errno
import json
import os
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

from opcollect.errors import InputError

MIB = 1024 * 1024
KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a device",
    stat.S_IFBLK: "a device",
    stat.S_IFDIR: "a directory",
    stat.S_IFLNK: "a symbolic link",
}


def kind_of(mode: int) -> str:
    """What a file that is not a regular file is, in words."""
    return KINDS.get(stat.S_IFMT(mode), "not a regular file")


def not_utf8(exc: UnicodeDecodeError) -> str:
    """What is wrong with bytes that are not UTF-8: the first bad byte and its offset."""
    return f"not UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})"


def _check_inside(path: Path, tree: Path, what: str, fix: str) -> None:
    """Refuse ``path`` when a linked directory on its way takes it out of ``tree``."""
    parent, root = os.path.realpath(path.parent), os.path.realpath(tree)
    if os.path.commonpath([parent, root]) != root:
        raise InputError(f"{path}: reached through a symlink out of {tree} (into {parent}), so no {what}; {fix}")


@contextmanager
def open_regular(path: Path, what: str, fix: str, *, limit: int, tree: Path | None = None) -> Iterator[BinaryIO]:
    """The regular file at ``path``, open for reading, at most ``limit`` bytes (as fstat says)."""
    path = Path(path)
    if tree is not None:
        _check_inside(path, tree, what, fix)
    # in a tree, whose files opcollect wrote (never as links), the file itself is never a link: O_NOFOLLOW
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if tree is None else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and tree is not None:
            raise InputError(f"{path}: a symlink, not followed in {tree}, so no {what}; {fix}") from None
        raise InputError(f"{path}: cannot read {what} ({exc.strerror}); {fix}") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):  # worded as open() words it for a directory
            raise InputError(f"{path}: cannot read {what} (Is a directory); {fix}")
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"{path}: not a regular file ({kind_of(info.st_mode)}), so no {what}; {fix}")
        if info.st_size > limit:
            raise InputError(f"{path}: {info.st_size} bytes, over the {limit} a {what} may hold; {fix}")
        os.set_blocking(fd, True)
        handle = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with handle:
        try:
            yield handle
        except OSError as exc:
            raise InputError(f"{path}: cannot read {what} ({exc.strerror}); {fix}") from None


def read_bytes(path: Path, what: str, fix: str, *, limit: int, tree: Path | None = None) -> bytes:
    """The bytes of the regular file at ``path``: at most ``limit`` of them, even if it grows while read."""
    with open_regular(path, what, fix, limit=limit, tree=tree) as handle:
        # read(n) allocates n bytes up front: ask for what fstat saw, then in blocks for what was added since
        chunks = [handle.read(os.fstat(handle.fileno()).st_size + 1)]
        total = len(chunks[0])
        while total <= limit and (chunk := handle.read(min(1 << 20, limit + 1 - total))):
            chunks.append(chunk)
            total += len(chunk)
    if total > limit:
        raise InputError(f"{path}: over the {limit} bytes a {what} may hold; {fix}")
    return b"".join(chunks) if len(chunks) > 1 else chunks[0]


def read_text(path: Path, what: str, fix: str, *, limit: int, tree: Path | None = None) -> str:
    """The UTF-8 text of the regular file at ``path``."""
    data = read_bytes(path, what, fix, limit=limit, tree=tree)
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: {not_utf8(exc)}; {fix}") from None


class NotJson(InputError):
    """Bytes that are not JSON, for a reader that words its own message around what is wrong: ``detail`` says it
    whole ("invalid JSON at line 3 (Expecting value)"), ``reason`` after the words "not valid JSON" ("at line 3:
    Expecting value", "nested too deeply", "not UTF-8 (...)")."""

    def __init__(self, where: str, detail: str, reason: str, fix: str):
        super().__init__(f"{where}: {detail}; {fix}")
        self.detail, self.reason = detail, reason


def parse_json(data: bytes, where: str, fix: str) -> object:
    """JSON decoded from UTF-8, nested no deeper than the interpreter's recursion limit (the C decoder raises
    RecursionError past it, at about 1000 levels); ``where`` names its source in the message."""
    try:
        return json.loads(data.decode())
    except UnicodeDecodeError as exc:
        detail = reason = not_utf8(exc)
    except json.JSONDecodeError as exc:
        detail, reason = f"invalid JSON at line {exc.lineno} ({exc.msg})", f"at line {exc.lineno}: {exc.msg}"
    except RecursionError:
        detail, reason = "JSON nested too deeply", "nested too deeply"
    raise NotJson(where, detail, reason, fix)


def read_json(path: Path, what: str, fix: str, *, limit: int, tree: Path | None = None) -> object:
    """The JSON value in the regular file at ``path``: UTF-8, at most ``limit`` bytes, of bounded nesting."""
    return parse_json(read_bytes(path, what, fix, limit=limit, tree=tree), str(path), fix)


def read_lines(path: Path, what: str, fix: str, *, limit: int, tree: Path | None = None) -> Iterator[bytes]:
    """The lines of the regular file at ``path``, one at a time (a large shard is never held whole)."""
    with open_regular(path, what, fix, limit=limit, tree=tree) as handle:
        yield from handle


def parse_python(path: Path, what: str, fix: str, *, limit: int) -> ast.Module:
    """The syntax tree of the Python source at ``path``; a file nested past the parser's limits, too large
    or not Python is one line."""
    text = read_text(path, what, fix, limit=limit)
    try:
        return ast.parse(text, filename=str(path))
    except SyntaxError as exc:
        raise InputError(f"{path}: not Python (line {exc.lineno}: {exc.msg}); {fix}") from None
    except (RecursionError, MemoryError):
        raise InputError(f"{path}: nested too deeply to parse as Python; {fix}") from None
