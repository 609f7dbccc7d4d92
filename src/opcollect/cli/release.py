"""`opcollect release`: the data wheel of verified tables."""

from __future__ import annotations

from pathlib import Path

from opcollect.errors import InputError


def _add_release(sub) -> None:
    p = sub.add_parser("release", help="package verified tables as a reproducible data wheel and sdist")
    p.add_argument("--tables", type=Path, required=True, metavar="DIR")
    p.add_argument("--out", type=Path, required=True, metavar="DIST")
    p.add_argument("--version", help="the data package's version (default: the newest collection's date)")
    p.add_argument("--root", type=Path, help="the opcollect checkout (default: the one this package is in)")
    p.set_defaults(func=cmd_release)


def _source_date_epoch() -> int | None:
    """SOURCE_DATE_EPOCH, the reproducible-builds convention for a fixed build time, when set."""
    import os

    value = os.environ.get("SOURCE_DATE_EPOCH")
    if value is None:
        return None
    if not value.isdigit():
        raise InputError(f"SOURCE_DATE_EPOCH={value!r}: not a count of seconds since 1970; unset it or give one")
    return int(value)


def cmd_release(args) -> int:
    from opcollect.project import find_project
    from opcollect.release.cut import cut

    done = cut(args.tables, args.out, args.version, _source_date_epoch(), find_project(args.root))
    print(f"{done.wheel}: {done.packaged} files, version {done.version}, epoch {done.epoch}")
    print(f"{done.sdist}\n{done.statement}")
    print(f"installed into a fresh venv: {done.installed.output.splitlines()[-1] if done.installed.output else ''}")
    if not done.installed.ok:
        print(done.installed.output)
        return 1
    return 0


def add(sub) -> None:
    _add_release(sub)
