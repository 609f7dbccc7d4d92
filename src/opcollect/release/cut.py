"""`opcollect release`: refuse tables that fail check or verify, build the wheel and sdist, write the in-toto
statement beside the wheel, and verify the wheel from a fresh virtual environment.

The three files are built in a hidden staging directory inside --out and moved into --out only once the wheel
was verified; an error or an interrupt (SIGINT, or SIGTERM, which the CLI raises as KeyboardInterrupt) removes
the staging directory (and --out, when the release made it and it is empty), so --out never holds a wheel that
was not verified; release/verify.py kills its children's process groups and drops its venv on the way out.
"""

from __future__ import annotations

import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

from opcollect.errors import InputError
from opcollect.files import check_name, ensure_dir
from opcollect.images.pins import load_pins
from opcollect.project import ProjectTree
from opcollect.release.attest import statement, write_statement
from opcollect.release.package import build, check_version, newest_collection, sidecars
from opcollect.release.verify import Installed, verify_wheel
from opcollect.tables.rules import check_tables
from opcollect.tables.verify import verify_tables


@dataclass(frozen=True)
class Released:
    wheel: Path
    sdist: Path
    statement: Path
    version: str
    epoch: int
    packaged: int  # files of the package
    installed: Installed


def refuse_unsound(tables: Path) -> None:
    """InputError unless the tables verify against their manifest and pass every check rule."""
    report = verify_tables(tables)
    if not report.clean:
        first = report.render().splitlines()[0]
        raise InputError(f"--tables {tables}: fails verify ({first}); restore the tables or merge again first")
    violations = [f for f in check_tables(tables) if not f.warning]
    if violations:
        raise InputError(
            f"--tables {tables}: fails check ({len(violations)} violations, first: {violations[0].render()}); "
            "fix them before releasing"
        )


def pins_record(tree: ProjectTree) -> dict:
    """Every pin of the checkout, as the statement records it: backend -> current and version -> image."""
    pins = load_pins(tree.pins)
    return {
        name: {"current": entry.current, "versions": {v: pin.image for v, pin in entry.versions.items()}}
        for name, entry in pins.backends.items()
    }


def check_out(tables: Path, out: Path) -> None:
    """Refuse an --out that cannot hold the release: a file, a name too long, or a place inside --tables."""
    check_name(out)  # OSError naming --out (ENAMETOOLONG, EILSEQ) before any work
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: is a file; give a directory for the wheel, sdist and statement")
    real_out, real_tables = out.resolve(), tables.resolve()
    if real_out == real_tables or real_tables in real_out.parents:
        raise InputError(
            f"--out {out}: is inside --tables {tables}, whose manifest would not list the release files "
            "(verify then fails); give a directory outside the tables"
        )


def cut(tables: Path, out: Path, version: str | None, epoch: int | None, tree: ProjectTree) -> Released:
    tables, out = Path(tables), Path(out)
    check_out(tables, out)
    pins = pins_record(tree)
    builder = f"opcollect@{tree.git('rev-parse', 'HEAD') or 'unknown'}"
    refuse_unsound(tables)
    epoch = newest_collection(sidecars(tables)) if epoch is None else epoch
    if version is None:
        from datetime import datetime, timezone

        day = datetime.fromtimestamp(epoch, tz=timezone.utc)
        version = f"{day.year}.{day.month}.{day.day}"
    check_version(version)
    made_out = not out.exists()
    staging = out / f".opcollect-release-{secrets.token_hex(4)}"
    try:
        ensure_dir(staging)
        wheel, sdist, files = build(tables, staging, version, epoch)
        path = wheel.with_name(wheel.name + ".intoto.json")
        write_statement(path, statement(tables, [wheel, sdist], version, epoch, pins, builder))
        installed = verify_wheel(wheel)
        final = [out / p.name for p in (wheel, sdist, path)]
        for src, dst in zip((wheel, sdist, path), final):
            os.replace(src, dst)  # a link planted at dst is replaced, never written through
    finally:  # also on Ctrl-C or SIGTERM (the CLI raises it as KeyboardInterrupt): nothing unverified is left
        shutil.rmtree(staging, ignore_errors=True)
        if made_out:
            try:
                out.rmdir()  # only when empty: a release that finished left its files in it
            except OSError:
                pass
    return Released(*final, version, epoch, len(files), installed)
