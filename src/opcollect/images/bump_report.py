"""The report of a pin bump (markdown, printed and written beside the pins): the pins diff, the plan diff at every
SM between the old and the new version, the contract check against the new release, and the re-check list.

A plan depends on the framework version through the runners' version routes: at a version, the cases that run
are those whose (op, dispatch) has a runner serving that version (Registry.find), so a version no runner was
checked against plans nothing for those ops until the runners are extended.
"""

from __future__ import annotations

import difflib
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
