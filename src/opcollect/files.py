"""The one writer for files opcollect creates: readers see a file's old content or its new content, never a
torn one; a symbolic link or hard link at the target is replaced, never written through; the file's mode is
what the umask gives (0644 under umask 022, 0664 under 002: a group sharing a TABLES tree reads it).

Errors are OSErrors that carry the target's path (never the temporary file's), so the CLI's one line
(flags.fs_error) names the flag that gave it: a name too long for the file system (ENAMETOOLONG) or not
encodable in its encoding (EILSEQ) is refused before anything is written, a directory at the target is
EISDIR, a file where a directory is needed ENOTDIR.
"""

from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path

NAME_MAX = 255  # bytes of one name on every Linux file system opcollect writes to (ext4, xfs, NFS, tmpfs)
PATH_MAX = 4096
_TMP_ROOM = 14  # ".", "." + 8 hex + ".tmp" around the target's name in the temporary file's name


def check_name(path: Path) -> None:
    """OSError (ENAMETOOLONG or EILSEQ, naming ``path``) for a path no file can have here."""
    path = Path(path)
    try:
        encoded = os.fsencode(path)
    except UnicodeEncodeError:
        raise OSError(errno.EILSEQ, "a name is not encodable for the file system", str(path)) from None
    if b"\0" in encoded:
        raise OSError(errno.EILSEQ, "a name holds a NUL byte", str(path))
    if len(encoded) >= PATH_MAX or any(len(os.fsencode(part)) > NAME_MAX for part in path.parts):
        raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG), str(path))


def ensure_dir(path: Path) -> Path:
    """Create directory ``path`` and its parents (mode from the umask); ENOTDIR naming the part that is a file."""
    path = Path(path)
    check_name(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next((p for p in [path, *path.parents] if p.exists() and not p.is_dir()), path)
        raise NotADirectoryError(errno.ENOTDIR, "is a file, not a directory", str(blocker)) from None
    return path


def _tmp_name(name: str) -> str:
    """A fresh hidden name beside the target, short enough for NAME_MAX whatever the target's length."""
    head = os.fsdecode(os.fsencode(name)[: NAME_MAX - _TMP_ROOM])
    return f".{head}.{secrets.token_hex(4)}.tmp"


def write_atomic(path: Path, data: str | bytes) -> Path:
    """Write ``data`` to a temporary file beside ``path``, fsync it, and rename it over ``path``.

    A symbolic or hard link already at ``path`` is replaced, never written through; a failure (a full disk,
    a kill) leaves ``path`` as it was and no temporary file behind.
    """
    path = Path(path)
    check_name(path)
    if path.is_dir() and not path.is_symlink():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    ensure_dir(path.parent)
    tmp = path.parent / _tmp_name(path.name)
    payload = data.encode() if isinstance(data, str) else data
    try:
        # O_EXCL: never an existing file or link; 0o666: the umask decides who else may read it
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (renames, new files) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
