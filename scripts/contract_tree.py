"""Assemble the small release tree the contract test checks a framework backend's runners against.

From a real source tree of the framework (a checkout at the tag, or the package copied out of the image),
keep only the files the contract check reads for the runners' uses (the modules they import from, the
re-export chains and base classes it follows) and reduce each to its API: imports, and the names and
parameter lists of its classes, functions and assignments, with every body, default and annotation dropped.
Run it again when a runner starts using another symbol (the contract test then names the miss):

    python scripts/contract_tree.py trtllm --source DIR --commits COMMITS.json --pins v1.3.0rc20,v1.3.0rc23 \
        --note NOTE.md --out tests/data/trtllm-release

COMMITS.json maps each source path (tensorrt_llm/...) to the commit it was read at, either a string or
{"commit": ..., "tags": [the pinned tags the file was read at]}; the tree's README lists them with, per pinned
tag, whether the file was read at it, after NOTE.md (how the files were found and what could not be read).
"""

from __future__ import annotations

import argparse
import ast
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from opcollect.backends.symbols import (  # noqa: E402
    FRAMEWORK_PACKAGES,
    Release,
    check,
    dataclass_fields,
    is_dataclass,
    runner_uses,
)

ELLIPSIS = ast.Constant(value=...)


class Recording(Release):
    """A release that records which modules the check parses."""

    def __init__(self, *paths: Path):
        super().__init__(*paths)
        self.read: set[str] = set()

    def tree(self, module: str):
        found = super().tree(module)
        if found is not None:
            self.read.add(module)
        return found

    def module_file(self, module: str) -> str | None:
        found = super().module_file(module)
        if found is not None:
            self.read.add(module)
        return found


def _arguments(args: ast.arguments) -> ast.arguments:
    def bare(arg: ast.arg) -> ast.arg:
        return ast.arg(arg=arg.arg)

    return ast.arguments(
        posonlyargs=[bare(a) for a in args.posonlyargs],
        args=[bare(a) for a in args.args],
        vararg=bare(args.vararg) if args.vararg else None,
        kwonlyargs=[bare(a) for a in args.kwonlyargs],
        kw_defaults=[None if d is None else ELLIPSIS for d in args.kw_defaults],
        kwarg=bare(args.kwarg) if args.kwarg else None,
        defaults=[ELLIPSIS for _ in args.defaults],
    )


def _function(node) -> ast.FunctionDef:
    return ast.FunctionDef(name=node.name, args=_arguments(node.args), body=[ast.Expr(ELLIPSIS)], decorator_list=[])


def _statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """The skeleton of the statements that run at import (if/try bodies flattened into them)."""
    kept: list[ast.stmt] = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            kept.append(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            kept.append(_function(node))
        elif isinstance(node, ast.ClassDef):
            body: list[ast.stmt] = [
                _function(item) for item in node.body if isinstance(item, ast.FunctionDef) and item.name == "__init__"
            ]
            decorators = []
            if is_dataclass(node):  # its generated __init__ takes its fields
                decorators = [ast.Name(id="dataclass")]
                body += [
                    ast.AnnAssign(target=ast.Name(id=name), annotation=ast.Name(id="object"), simple=1)
                    for name in dataclass_fields(node)
                ]
            kept.append(
                ast.ClassDef(
                    name=node.name,
                    bases=[b for b in node.bases if isinstance(b, (ast.Name, ast.Attribute))],
                    keywords=[],
                    body=body or [ast.Expr(ELLIPSIS)],
                    decorator_list=decorators,
                )
            )
        elif isinstance(node, ast.Assign):
            names = [t for t in node.targets if isinstance(t, ast.Name)]
            if names:
                keep_value = any(t.id == "__all__" for t in names)
                kept.append(ast.Assign(targets=names, value=node.value if keep_value else ELLIPSIS, lineno=0))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            kept.append(ast.Assign(targets=[node.target], value=ELLIPSIS, lineno=0))
        elif isinstance(node, ast.If):
            kept += _statements(node.body) + _statements(node.orelse)
        elif isinstance(node, ast.Try):
            for part in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                kept += _statements(part)
    return kept


def skeleton(source: str, header: str) -> str:
    module = ast.Module(body=_statements(ast.parse(source).body), type_ignores=[])
    return f"{header}\n{ast.unparse(ast.fix_missing_locations(module))}\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("backend", choices=sorted(FRAMEWORK_PACKAGES))
    parser.add_argument("--source", type=Path, required=True)
    parser.add_argument("--commits", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--pins", default="", help="the pinned tags, comma-separated")
    parser.add_argument("--note", type=Path, help="markdown put before the table: where the files come from")
    args = parser.parse_args()
    commits: dict[str, str | dict] = json.loads(args.commits.read_text())
    pins = [tag for tag in args.pins.split(",") if tag]
    packages = FRAMEWORK_PACKAGES[args.backend]
    backends = ROOT / "src" / "opcollect" / "backends"
    uses = runner_uses(backends / args.backend, packages, ROOT)
    release = Recording(args.source)
    misses = check(uses, release)
    if misses:
        for miss in misses:
            print(miss.render(), file=sys.stderr)
        print(f"{args.source}: the runners' uses do not all resolve; fix them first", file=sys.stderr)
        return 1
    if args.out.exists():
        shutil.rmtree(args.out)
    rows = []
    for module in sorted(release.read):
        path = release.module_file(module)
        entry = commits.get(path)
        commit, tags = (entry.get("commit"), entry.get("tags", [])) if isinstance(entry, dict) else (entry, [])
        if commit is None:
            print(f"{args.commits}: no commit for {path}", file=sys.stderr)
            return 1
        header = f"# API skeleton of {path} at NVIDIA/TensorRT-LLM@{commit}: names and parameters only."
        target = args.out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(skeleton(release.files[path], header))
        rows.append(f"| `{path}` | `{commit}` |" + "".join(" yes |" if tag in tags else " no |" for tag in pins))
    readme = [
        f"# {args.backend} API skeleton for the contract test",
        "",
        f"Generated by `scripts/contract_tree.py {args.backend}` from the files below: only the modules the",
        "contract check reads for the runners' uses, each reduced to imports, names and parameter lists (no",
        "bodies, defaults or annotations). tests/test_contract_trtllm.py checks the runners against it.",
        "",
        *([args.note.read_text().strip(), ""] if args.note else []),
        "| file | commit read |" + "".join(f" read at {tag} |" for tag in pins),
        "|---|---|" + "---|" * len(pins),
        *rows,
        "",
    ]
    (args.out / "README.md").write_text("\n".join(readme))
    print(f"{args.out}: {len(rows)} files for {len(uses)} uses")
    return 0


if __name__ == "__main__":
    sys.exit(main())
