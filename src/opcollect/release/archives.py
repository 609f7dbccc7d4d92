"""Byte-reproducible wheel (zip) and sdist (tar.gz) writers: the same files and epoch give the same bytes.

Entries are written in sorted order, each with the epoch as its time (zip can hold no date before 1980), mode
0644 and no owner; the gzip header carries the epoch and no file name. A wheel's RECORD lists every other
entry with its urlsafe-base64 sha256, as the wheel spec (PEP 427/376) asks. Both are written by the one writer
(files.write_atomic): a link planted at the target is replaced, never written through.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import tarfile
import time
import zipfile
from pathlib import Path

from opcollect.files import write_atomic

ZIP_EPOCH_MIN = 315532800  # 1980-01-01T00:00:00Z, the earliest time a zip entry holds
FILE_MODE = 0o644


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def write_wheel(path: Path, files: dict[str, bytes], record: str, epoch: int) -> None:
    """A wheel holding ``files`` (archive path -> bytes) and the RECORD at ``record`` listing them."""
    lines = [f"{name},{_record_hash(data)},{len(data)}" for name, data in sorted(files.items())]
    entries = {**files, record: ("\n".join(lines + [f"{record},,"]) + "\n").encode()}
    stamp = time.gmtime(max(epoch, ZIP_EPOCH_MIN))[:6]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for name in sorted(entries):
            info = zipfile.ZipInfo(name, date_time=stamp)
            info.external_attr = (0o100000 | FILE_MODE) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3  # unix, so the mode above is read
            archive.writestr(info, entries[name], compresslevel=9)
    write_atomic(path, buffer.getvalue())


def write_sdist(path: Path, files: dict[str, bytes], epoch: int) -> None:
    """A .tar.gz holding ``files`` (archive path -> bytes), with every directory entry it needs."""
    directories = sorted({str(Path(name).parents[i]) for name in files for i in range(len(Path(name).parents) - 1)})
    tar_bytes = io.BytesIO()
    with tarfile.open(fileobj=tar_bytes, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name in sorted([*directories, *files]):
            info = tarfile.TarInfo(name)
            info.mtime = epoch
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if name in files:
                info.size, info.mode = len(files[name]), FILE_MODE
                archive.addfile(info, io.BytesIO(files[name]))
            else:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                archive.addfile(info)
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=epoch, compresslevel=9) as zipped:
        zipped.write(tar_bytes.getvalue())
    write_atomic(path, out.getvalue())
