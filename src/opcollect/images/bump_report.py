"""The report of a pin bump (markdown, printed and written beside the pins): the pins diff, the plan diff at every
SM between the old and the new version, the contract check against the new release, and the re-check list.

Once the new version is collected, `opcollect bump BACKEND --version V --moved TABLES` adds to the re-check list the
rows that really moved: every table of the backend at the old version against its counterpart at V, each shared
key classified same, faster, slower or ambiguous from the two rows' p25-p75 intervals (tables/noise.py).

A plan depends on the framework version through the runners' version routes: at a version, the cases that run
are those whose (op, dispatch) has a runner serving that version (Registry.find), so a version no runner was
checked against plans nothing for those ops until the runners are extended.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

from opcollect.backends import load_backend
from opcollect.backends.markers import Marker, behind, find_markers
from opcollect.errors import InputError
from opcollect.files import write_atomic
from opcollect.images.bump import Bumped, BumpRequest, bump, check_names
from opcollect.names import GPU_SMS
from opcollect.plans.planner import Planner
from opcollect.project import ProjectTree
from opcollect.runtime.contract import KernelLimit
from opcollect.tables.noise import AMBIGUOUS, DEFAULT_THRESHOLDS, FASTER, SAME, SLOWER, Thresholds


@dataclass(frozen=True)
class PlanChange:
    sm: str
    op: str
    dispatch: str
    old: int  # cases that run at the old version
    new: int


def _served(registry, op: str, dispatch: str, version: str) -> bool:
    try:
        registry.find(op, dispatch, version)
        return True
    except KernelLimit:
        return False


def plan_changes(tree: ProjectTree, backend: str, old: str, new: str) -> list[PlanChange]:
    """Per SM, op and dispatch, the cases that run at ``old`` and at ``new`` where the two differ."""
    registry = load_backend(backend).RUNNERS
    planner = Planner(tree)
    changes = []
    for sm in GPU_SMS:
        try:
            plan = planner.plan(backend, sm)
        except InputError:
            continue  # nothing planned for this backend on this SM
        for name, selection in plan.ops.items():
            counts: dict[str, int] = {}
            for dispatch in selection.dispatch:
                counts[dispatch] = counts.get(dispatch, 0) + 1
            for dispatch, count in sorted(counts.items()):
                before = count if _served(registry, name, dispatch, old) else 0
                after = count if _served(registry, name, dispatch, new) else 0
                if before != after:
                    changes.append(PlanChange(sm, name, dispatch, before, after))
    return changes


def contract_section(tree: ProjectTree, backend: str, version: str, image: str) -> list[str]:
    """The contract check of the backend's runners against the new release's wheels, or why there is none."""
    from opcollect.backends.symbols import WHEEL_REQUIREMENTS, contract, fetch_wheels

    if backend not in WHEEL_REQUIREMENTS:
        if backend == "torch":
            return ["Not run: plain PyTorch has no framework release to check."]
        return [
            f"Not run: {backend} {version} has no wheel to fetch. Once {image} is pulled: "
            f"`opcollect contract {backend} --image` (or `--source` a checkout at the tag)."
        ]
    try:
        wheels = fetch_wheels(backend, version, tree.root / ".cache" / "wheels")
    except InputError as exc:
        return [f"Not run: {exc}."]
    checked, misses, unchecked = contract(backend, wheels, tree.root / "src" / "opcollect" / "backends")
    lines = [f"Against {', '.join(w.name for w in wheels)}: {checked} uses checked, {len(misses)} missing."]
    lines += [f"- `{m.render()}`" for m in misses]
    if unchecked:
        lines.append(f"Not checked (no release of it): {', '.join(unchecked)}.")
    return lines


def render(bumped: Bumped, changes: list[PlanChange], contract: list[str], rechecks: list[Marker]) -> str:
    diff = difflib.unified_diff(
        bumped.before.splitlines(True), bumped.after.splitlines(True), "pins.yaml (before)", "pins.yaml (after)"
    )
    lines = [
        f"# Pin bump: {bumped.backend} {bumped.old_version} -> {bumped.new_version}",
        "",
        f"Image: `{bumped.image}`",
        "",
        "## pins.yaml",
        "",
        "```diff",
        "".join(diff).rstrip("\n"),
        "```",
        "",
        "## Plan diff (cases that run, per SM, op and dispatch)",
        "",
    ]
    if changes:
        lines += [f"| sm | op | dispatch | {bumped.old_version} | {bumped.new_version} |", "|---|---|---|---|---|"]
        lines += [f"| {c.sm} | {c.op} | {c.dispatch} | {c.old} | {c.new} |" for c in changes]
    else:
        lines.append("No change at any SM: every planned (op, dispatch) has a runner at both versions.")
    lines += ["", "## Contract check against the new release", "", *contract, "", "## Re-check list", ""]
    if rechecks:
        lines.append(
            f"Each of these was checked on an older version than {bumped.new_version}: re-check it, then move its "
            "`verified_on` marker (tests/test_version_contract.py fails until every one has moved)."
        )
        lines.append("")
        lines += [f"- `{m.path}:{m.line}` ({m.backend}=={m.version}): {m.text}" for m in rechecks]
    else:
        lines.append(f"No marker of {bumped.backend} is behind {bumped.new_version}.")
    lines += [
        "",
        f"Rows: once {bumped.backend} {bumped.new_version} is collected into a TABLES tree that holds the "
        f"{bumped.old_version} tables too, `opcollect bump {bumped.backend} --version {bumped.new_version} --moved "
        "TABLES` adds here the rows that really moved: faster or slower beyond both rows' p25-p75 noise.",
    ]
    return "\n".join(lines) + "\n"


def report(tree: ProjectTree, bumped: Bumped) -> str:
    changes = plan_changes(tree, bumped.backend, bumped.old_version, bumped.new_version)
    contract = contract_section(tree, bumped.backend, bumped.new_version, bumped.image)
    rechecks = behind(find_markers(tree.root, bumped.backend), {bumped.backend: bumped.new_version})
    return render(bumped, changes, contract, rechecks)


def report_path(tree: ProjectTree, backend: str, version: str) -> Path:
    return tree.root / "docs" / "bumps" / f"{backend}-{version}.md"


def check_report_path(tree: ProjectTree, path: Path) -> None:
    """The report can be written at ``path``: each of its directories that exists is a directory, and the path
    itself is nothing or a regular file; checked before the plan diff and the contract check, which take a while."""
    for directory in reversed(path.relative_to(tree.root).parents):
        where = tree.root / directory
        if where.exists() and not where.is_dir():
            raise InputError(
                f"{where}: not a directory; the bump report goes to {path}: move that file away and bump again"
            )
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise InputError(f"{path}: not a regular file; the bump report goes there: move it away and bump again")


def apply_bump(tree: ProjectTree, request: BumpRequest) -> tuple[str, Path]:
    """Bump, write the report and then pins.yaml (each atomically; nothing is written when the bump is refused or
    its report fails); (report text, report path)."""
    check_names(request)
    path = report_path(tree, request.backend, request.version)
    check_report_path(tree, path)
    bumped = bump(tree.pins, request)
    text = report(tree, bumped)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)
    write_atomic(tree.pins, bumped.after)
    return text, path


MOVED_HEADING = "### Rows that moved"
VERDICT_COLUMNS = (SAME, FASTER, SLOWER, AMBIGUOUS)
MOVED_SHOWN = 50  # rows listed per table; the counts give the rest
_HEADER = re.compile(r"# Pin bump: (\S+) (\S+) -> (\S+)")


def moved_section(old_tables: Path, new_tables: Path, backend: str, old: str, new: str, thresholds: Thresholds) -> str:
    """Counts per table and the rows that moved, every table of ``backend`` at ``old`` against ``new``."""
    from opcollect.tables.compare import compare_tables, describe_change, render_counts, version_pairs

    pairs = version_pairs(old_tables, new_tables, backend, old, new)
    if not pairs:
        raise InputError(
            f"{old_tables}: no {backend} {old} table with a {new} counterpart under {new_tables} "
            f"(<system>/<family>/{backend}/<version>/<table>_perf.parquet); collect {backend} {new} there first"
        )
    compared = [(before, compare_tables(before, after, thresholds=thresholds)) for before, after in pairs]
    same_tree = Path(old_tables).resolve() == Path(new_tables).resolve()
    where = f"{old_tables}" if same_tree else f"{old_tables} against {new_tables}"
    lines = [
        f"{MOVED_HEADING} ({old} -> {new})",
        "",
        f"{where}: {len(compared)} {'table' if len(compared) == 1 else 'tables'}; {thresholds.describe()}.",
        "",
        "| table | shared | same | faster | slower | ambiguous |",
        "|---|---|---|---|---|---|",
    ]
    names = [str(before.relative_to(old_tables).parent.parent / before.stem) for before, _ in compared]
    for name, (_, c) in zip(names, compared):
        counts = c.counts
        lines.append(f"| {name} | {c.shared} | " + " | ".join(str(counts[v]) for v in VERDICT_COLUMNS) + " |")
    moved = [(name, c) for name, (_, c) in zip(names, compared) if c.changes]
    lines += ["", "Re-check these rows, the largest change first:" if moved else "No row moved beyond its noise."]
    for name, c in moved:
        lines += ["", f"{name}: {render_counts(c)}", ""]
        lines += [f"- `{r.key}`: {describe_change(r)}" for r in c.changes[:MOVED_SHOWN]]
        if len(c.changes) > MOVED_SHOWN:
            lines.append(f"- and {len(c.changes) - MOVED_SHOWN} more: `opcollect compare` the two tables")
    return "\n".join(lines) + "\n"


def apply_moved(
    tree: ProjectTree,
    backend: str,
    version: str,
    old_tables: Path,
    new_tables: Path | None = None,
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
) -> tuple[str, Path]:
    """Add (or replace) the rows that moved in the bump report of ``backend`` ``version``; (section, report path).
    The old version is the one the report bumped from; NEW_TABLES defaults to OLD_TABLES (both versions merged into
    one tree)."""
    check_names(BumpRequest(backend, version, ""))
    path = report_path(tree, backend, version)
    check_report_path(tree, path)
    if not path.is_file():
        raise InputError(
            f"{path}: no bump report; bump first (opcollect bump {backend} --version {version} --image REF@sha256:D)"
        )
    text = path.read_text()
    header = _HEADER.fullmatch(text.split("\n", 1)[0])
    if header is None or header.group(1) != backend or header.group(3) != version:
        raise InputError(f"{path}: its first line is no '# Pin bump: {backend} OLD -> {version}'; bump again")
    section = moved_section(old_tables, new_tables or old_tables, backend, header.group(2), version, thresholds)
    kept = text.split(f"\n{MOVED_HEADING}", 1)[0].rstrip("\n")  # an earlier re-collection's rows are replaced
    write_atomic(path, f"{kept}\n\n{section}")
    return section, path
