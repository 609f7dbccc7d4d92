"""The CLI's flag value types, and the one line for an error of the environment (a full disk, a
read-only file system). Bad flags are bad input: one line on stderr and exit 2."""

from __future__ import annotations

import argparse
import errno
import math
import os
import re
from pathlib import Path


class Parser(argparse.ArgumentParser):
    """Bad flags are bad input: one line on stderr and exit 2, like every other error (no usage block)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # a value such as `--shard -1/2` is a value, not a flag (what Python 3.13's argparse does already)
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def error(self, message: str):
        self.exit(2, f"opcollect: error: {self.prog}: {message}; see `{self.prog} --help`\n")


def shard(text: str) -> tuple[int, int]:
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected i/N, e.g. 0/4 (shards are counted from 0)") from None
    if count < 1 or not 0 <= index < count:
        raise argparse.ArgumentTypeError(f"{text}: need 0 <= i < N (shards are counted from 0), e.g. 0/{max(count, 1)}")
    return index, count


def number(text: str, kind: type, least: float, strict: bool):
    """``text`` as a finite ``kind`` above ``least`` (or at least ``least`` when not ``strict``)."""
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value < least or (strict and value == least):
        what = "a whole number" if kind is int else "a finite number"
        raise argparse.ArgumentTypeError(f"{text!r}: must be {what} {'>' if strict else '>='} {least:g}")
    return value


def count(text: str) -> int:
    return number(text, int, 0, strict=True)


def seconds(text: str) -> float:
    return number(text, float, 0, strict=True)


def ratio(text: str) -> float:
    return number(text, float, 0, strict=False)


def png(text: str) -> Path:
    """--plot: a .png file to write, never a directory."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: is a directory; give a file name in it, e.g. {path / 'ratio.png'}")
    if path.suffix.lower() != ".png":
        raise argparse.ArgumentTypeError(f"{text}: the plot is a PNG image; give a file name ending in .png")
    if not path.absolute().parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: its directory {path.parent} does not exist; create it first")
    return path


# file-system errors that are the environment's or the path's, not a bug: what they mean and how to fix them
_FS_ERRORS = {
    errno.ENOSPC: ("no space left on the device", "free space there, or choose a directory on another file system"),
    errno.EDQUOT: ("disk quota exceeded", "free space there, or choose a directory on another file system"),
    errno.EROFS: ("read-only file system", "choose a writable directory"),
    errno.EACCES: ("permission denied", "choose a path you may use, or fix its permissions"),
    errno.ENOENT: ("no such file or directory", "check the path"),
    errno.ENAMETOOLONG: ("a name in it is too long for the file system", "give names of at most 255 bytes"),
    errno.EILSEQ: ("a name in it cannot be written on the file system", "give a UTF-8 name without NUL"),
    errno.EISDIR: ("is a directory", "give a file name (in it, or elsewhere)"),
    errno.ENOTDIR: ("a file stands where a directory is needed", "give a path whose directories are directories"),
    errno.ELOOP: ("is a symbolic link, which opcollect does not follow", "give the file or directory it points to"),
}
_WRITES = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)  # only a write fails so: the output flag is the cause
# where a verb writes, named when the error carries no path (a failed write() or fsync() has none)
_OUTPUTS = (("output", "-o"), ("table", "--table"), ("out", "--out"), ("into", "--into"), ("tables", "--tables"))


def _within(filename, value) -> bool:
    """Whether the error's path is the flag's path, inside it, or one of its parents (a directory it needs)."""
    if filename is None:
        return False
    a, b = os.path.abspath(os.fsdecode(filename)), os.path.abspath(os.fsdecode(value))
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def fs_error(exc: OSError, args) -> str | None:
    """One line for an OSError of the environment or a path (full, read-only, forbidden, missing, too long, a
    directory or a link where a file is needed); None for others. It names the flag whose path it concerns."""
    known = _FS_ERRORS.get(exc.errno)
    if known is None:
        return None
    what, fix = known
    given = [(flag, getattr(args, name)) for name, flag in _OUTPUTS if getattr(args, name, None) is not None]
    related = [(flag, value) for flag, value in given if _within(exc.filename, value)]
    if not related and (exc.errno in _WRITES or exc.filename is None):  # a write, or no path to name
        related = given
    if related:  # name the flag, and the file when it is another
        flag, value = related[0]
        at = f" (at {exc.filename})" if exc.filename not in (None, str(value)) else ""
        return f"{flag} {value}: {what}{at}; {fix}"
    if exc.filename is not None:
        return f"{exc.filename}: {what}; {fix}"
    return f"opcollect {args.verb}: {what}; {fix}"
