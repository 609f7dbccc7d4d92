"""`opcollect release`: refuse tables that fail check or verify, build the wheel and sdist, write the in-toto
statement beside the wheel, and verify the wheel from a fresh virtual environment."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from opcollect.errors import InputError
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


def cut(tables: Path, out: Path, version: str | None, epoch: int | None, tree: ProjectTree) -> Released:
    tables, out = Path(tables), Path(out)
    pins = pins_record(tree)
    builder = f"opcollect@{tree.git('rev-parse', 'HEAD') or 'unknown'}"
    refuse_unsound(tables)
    epoch = newest_collection(sidecars(tables)) if epoch is None else epoch
    if version is None:
        from datetime import datetime, timezone

        day = datetime.fromtimestamp(epoch, tz=timezone.utc)
        version = f"{day.year}.{day.month}.{day.day}"
    check_version(version)
    wheel, sdist, files = build(tables, out, version, epoch)
    path = wheel.with_name(wheel.name + ".intoto.json")
    write_statement(path, statement(tables, [wheel, sdist], version, epoch, pins, builder))
    return Released(wheel, sdist, path, version, epoch, len(files), verify_wheel(wheel))
