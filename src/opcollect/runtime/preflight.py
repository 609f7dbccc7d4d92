"""The preflight of `opcollect run`: before the first case, and before any device is touched, every framework
symbol, keyword and attribute a backend's runners use is checked against the framework installed where the
run executes. It is `opcollect contract`'s check (backends/symbols.py) over the installed package's files, so
a collection in a pinned image starts with the contract check at that image's exact version.

The packages are located with importlib's find_spec, which does not run them (a top-level name imports no
parent), and only the modules the check reaches are read and parsed: the framework is never imported. A
framework that is not installed at all is left to the backend, whose identity names the pinned image; the
torch backend and a backend outside the package use no framework and have nothing to check.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Iterator, Mapping
from pathlib import Path

import opcollect.backends
from opcollect.backends.symbols import FRAMEWORK_PACKAGES, Release, check, runner_uses
from opcollect.errors import FrameworkMissing


class FrameworkMismatch(FrameworkMissing):
    """The installed framework lacks a symbol, keyword or module a runner uses: the CLI prints the one line, with
    the backend's pinned image, and exits 2."""


def locate(package: str) -> tuple[Path, ...] | None:
    """Where the top-level ``package`` is installed (its directories; a namespace package may have several; a
    single-module package is its file), as ``import`` would find it first on sys.path; None when it is not."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):  # ValueError: a module in sys.modules without a spec
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations is not None:
        return tuple(Path(p) for p in spec.submodule_search_locations) or None
    if spec.origin and spec.origin.endswith(".py"):
        return (Path(spec.origin),)
    return None  # a compiled module: no Python source to check


class InstalledFiles(Mapping[str, str]):
    """The .py files of installed packages under their release names (``vllm/config/scheduler.py``), looked up
    on the file system and read only when the check asks for them."""

    def __init__(self, located: dict[str, tuple[Path, ...]]):
        self.located = located
        self._paths: dict[str, Path | None] = {}

    def path(self, name: str) -> Path | None:
        if name not in self._paths:
            package, _, rest = name.partition("/")
            single = not rest  # ``vllm.py``: a package installed as one module
            found = None
            for root in self.located.get(package.removesuffix(".py") if single else package, ()):
                candidate = (root if root.is_file() else None) if single else root / rest
                if candidate is not None and candidate.is_file():
                    found = candidate
                    break
            self._paths[name] = found
        return self._paths[name]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.path(name) is not None

    def __getitem__(self, name: str) -> str:
        path = self.path(name)
        if path is None:
            raise KeyError(name)
        return path.read_text("utf-8", "replace")

    def __iter__(self) -> Iterator[str]:
        for package, roots in self.located.items():
            for root in roots:
                files = [root] if root.is_file() else sorted(root.rglob("*.py"))
                for file in files:
                    yield f"{package}.py" if file == root else f"{package}/{file.relative_to(root).as_posix()}"

    def __len__(self) -> int:
        return sum(1 for _ in self)


class InstalledRelease(Release):
    """A Release over the installed packages: each module read and parsed once, when the check reaches it."""

    def __init__(self, located: dict[str, tuple[Path, ...]]):
        super().__init__()
        self.files = InstalledFiles(located)

    def packages(self) -> set[str]:
        return set(self.files.located)


def _runners_root(backends_dir: Path) -> Path:
    """What runner paths are named from: the checkout (``src/opcollect/...``, as `opcollect contract` names them),
    or the directory an installed opcollect lies in (``opcollect/...``)."""
    return backends_dir.parents[2] if backends_dir.parents[1].name == "src" else backends_dir.parents[1]


def _version(package: str) -> str:
    try:
        return " " + importlib.metadata.version(package)  # reads the dist-info; runs nothing of the package
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return ""


def preflight(backend: str) -> int | None:
    """Check ``backend``'s runners against its installed framework: the number of uses checked, or None when there
    is nothing to check (no framework for this backend, or it is not installed). FrameworkMismatch, one line
    naming the runner's file:line and what is missing, when the installed framework lacks something."""
    packages = FRAMEWORK_PACKAGES.get(backend)
    if packages is None:
        return None
    main = locate(packages[0])
    if main is None:
        return None  # not installed: the backend's identity raises FrameworkMissing with the pinned image
    located = {packages[0]: main}
    for package in packages[1:]:
        where = locate(package)
        if where is not None:
            located[package] = where  # one not installed: the check names the runner line that imports it
    backends_dir = Path(opcollect.backends.__file__).resolve().parent
    uses = runner_uses(backends_dir / backend, packages, _runners_root(backends_dir))
    misses = check(uses, InstalledRelease(located))
    if misses:
        at = ", ".join(str(p) for p in main)
        absent = "".join(f", without {p}," for p in packages[1:] if p not in located)
        more = ""
        if len(misses) > 1:
            parents = dict.fromkeys(root.parent for roots in located.values() for root in roots)
            sources = " ".join(f"--source {p}" for p in parents)
            more = f" (and {len(misses) - 1} more: `opcollect contract {backend} {sources}` lists them)"
        raise FrameworkMismatch(
            backend,
            f"preflight: the installed {packages[0]}{_version(packages[0])} ({at}){absent} lacks what a runner "
            f"uses: {misses[0].render()}{more}; run {backend} plans in the backend's pinned image",
        )
    return len(uses)
