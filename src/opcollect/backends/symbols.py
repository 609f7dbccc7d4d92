"""`opcollect contract BACKEND`: the framework symbols a backend's runners use, checked against the pinned
release's Python sources without importing them (no framework, no GPU needed).

From the runners' source (``backends/<backend>/**.py``) it collects every ``from <framework> import name``
and ``import <framework>.module`` (module level or inside the functions that run on the GPU), and every
call of an imported name with the keyword arguments it passes. In the release (a wheel or a source tree) it
resolves each name as Python would: a definition or assignment at the module's top level (inside if/try
blocks too), a re-export (``from .x import name``), a star import (honouring ``__all__``) or a submodule;
and each keyword against the parameters of the function, or of the class's ``__init__`` (its own or a
base's found in the release), unless it takes ``**kwargs``. Each miss names the runner's file and line.
"""

from __future__ import annotations

import ast
import zipfile
from dataclasses import dataclass
from pathlib import Path

from opcollect.errors import InputError
from opcollect.inputs import MIB, parse_python, read_bytes

MAX_SOURCE_BYTES = 64 * MIB  # the largest module of a pinned framework is ~1 MB
_SOURCE_FIX = "give the pinned release's unpacked sources or its wheel"

# the top-level packages each framework backend imports from
FRAMEWORK_PACKAGES = {"vllm": ("vllm",), "sglang": ("sglang", "sgl_kernel"), "trtllm": ("tensorrt_llm",)}
# frameworks whose pinned release has no wheel on the package index: where their sources come from
NO_WHEEL = {
    "trtllm": "TensorRT-LLM's release candidates have no wheel on PyPI: --source a checkout at the tag or the "
    "tensorrt_llm/ package copied out of the image, or --image with the pinned image pulled"
}
# what `pip download` fetches for a framework's release: the framework at the pinned version, then the packages
# its runners also import, pinned by that release's requirements (SGLang 0.5.14's kernels: sglang-kernel 0.4.4)
WHEEL_REQUIREMENTS = {"vllm": ("vllm",), "sglang": ("sglang", "sglang-kernel==0.4.4")}
MAX_DEPTH = 32  # re-export chains longer than this are reported rather than followed


@dataclass(frozen=True)
class Use:
    """One framework symbol a runner uses: ``module.name`` (name None: the module itself), with keywords."""

    module: str
    name: str | None
    keywords: tuple[str, ...]
    where: str  # runner file:line
    attribute: bool = False  # an attribute read off an imported name: checked when that name is a module

    @property
    def label(self) -> str:
        return self.module if self.name is None else f"{self.module}.{self.name}"


@dataclass(frozen=True)
class Miss:
    use: Use
    problem: str

    def render(self) -> str:
        return f"{self.use.where}: {self.use.label}: {self.problem}"


class Release:
    """A framework's Python sources: wheels (read in place) or directories holding the top-level packages;
    several of them together (SGLang's own and its kernel package's)."""

    def __init__(self, *paths: Path):
        self.files: dict[str, str] = {}
        for path in map(Path, paths):
            if path.is_file() and path.suffix == ".whl":
                try:
                    with zipfile.ZipFile(path) as wheel:
                        for name in wheel.namelist():
                            if name.endswith(".py"):
                                self.files[name] = wheel.read(name).decode("utf-8", "replace")
                except zipfile.BadZipFile:
                    raise InputError(f"{path}: not a wheel (bad zip); download it again with pip download") from None
            elif path.is_dir():
                for file in path.rglob("*.py"):  # a FIFO or a link out of the directory: one line, exit 2
                    data = read_bytes(file, "Python source", _SOURCE_FIX, limit=MAX_SOURCE_BYTES, tree=path)
                    self.files[file.relative_to(path).as_posix()] = data.decode("utf-8", "replace")
            else:
                raise InputError(f"{path}: neither a .whl file nor a source directory; give the pinned release")
        self._trees: dict[str, ast.Module | None] = {}

    def packages(self) -> set[str]:
        return {name.split("/", 1)[0] for name in self.files}

    def module_file(self, module: str) -> str | None:
        base = module.replace(".", "/")
        for candidate in (f"{base}.py", f"{base}/__init__.py"):
            if candidate in self.files:
                return candidate
        return None

    def is_package(self, module: str) -> bool:
        return f"{module.replace('.', '/')}/__init__.py" in self.files

    def tree(self, module: str) -> ast.Module | None:
        if module not in self._trees:
            file = self.module_file(module)
            try:
                self._trees[module] = None if file is None else ast.parse(self.files[file])
            except (SyntaxError, RecursionError, MemoryError):  # not Python this interpreter parses: unread
                self._trees[module] = None
        return self._trees[module]


def _top_level(body: list[ast.stmt]):
    """Statements that run at import: the body, and the bodies of its if/try blocks."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _top_level(node.body)
            yield from _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            for part in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _top_level(part)


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


@dataclass(frozen=True)
class Found:
    module: str
    node: ast.AST | None  # the def or class; None for a module or an assigned value


def resolve(release: Release, module: str, name: str, depth: int = 0) -> Found | None:
    """Where ``module.name`` is defined in the release, following re-exports and star imports."""
    if depth > MAX_DEPTH:
        return None
    tree = release.tree(module)
    if tree is None:
        return None
    package = release.is_package(module)
    stars = []
    for node in _top_level(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return Found(module, node)
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return Found(module, None)
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return Found(module, None)
        if isinstance(node, ast.ImportFrom):
            source = _absolute(module, package, node)
            for alias in node.names:
                if alias.name == "*":
                    stars.append(source)
                elif (alias.asname or alias.name) == name:
                    found = resolve(release, source, alias.name, depth + 1)
                    if found is None and release.module_file(f"{source}.{alias.name}"):
                        return Found(f"{source}.{alias.name}", None)  # a submodule imported by name
                    return found or Found(source, None)  # from a package outside the release: trust it
        if isinstance(node, ast.Import):
            for alias in node.names:
                if (alias.asname or alias.name.split(".")[0]) == name:
                    return Found(alias.name, None)
    if package and release.module_file(f"{module}.{name}"):
        return Found(f"{module}.{name}", None)
    for source in stars:
        exported = _all(release, source)
        if exported is None or name in exported:
            found = resolve(release, source, name, depth + 1)
            if found is not None:
                return found
    return None


def _all(release: Release, module: str) -> set[str] | None:
    tree = release.tree(module)
    if tree is None:
        return None
    for node in _top_level(tree.body):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            try:
                return set(ast.literal_eval(node.value))
            except ValueError:
                return None
    return None


def _parameters(release: Release, found: Found, depth: int = 0) -> tuple[set[str], bool] | None:
    """Parameter names of a function, or of a class's __init__ (its own or a base's); None when unknown."""
    node = found.node
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        args = node.args
        names = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
        return names, args.kwarg is not None
    if isinstance(node, ast.ClassDef) and depth <= MAX_DEPTH:
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                return _parameters(release, Found(found.module, item))
        parents = []
        for base in node.bases:
            if isinstance(base, ast.Name):
                parent = resolve(release, found.module, base.id)
                if parent is not None and parent.node is not None:
                    parents.append(parent)
        if is_dataclass(node):  # the generated __init__ takes its fields and those of its dataclass bases
            names = set(dataclass_fields(node))
            for parent in parents:
                inherited = _parameters(release, parent, depth + 1) if is_dataclass(parent.node) else None
                if inherited is None:
                    return None
                names |= inherited[0]
            return names, False
        return _parameters(release, parents[0], depth + 1) if parents else None
    return None


def is_dataclass(node: ast.AST) -> bool:
    """A class under @dataclass, @dataclass(...) or @dataclasses.dataclass(...)."""
    for decorator in getattr(node, "decorator_list", ()):
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
        if name == "dataclass":
            return True
    return False


def dataclass_fields(node: ast.ClassDef) -> list[str]:
    """The fields of a dataclass body: its annotated names, ClassVar ones left out."""
    fields = []
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            if "ClassVar" not in ast.unparse(item.annotation):
                fields.append(item.target.id)
    return fields


def runner_uses(backend_dir: Path, packages: tuple[str, ...], root: Path) -> list[Use]:
    """Every framework symbol the runner files under ``backend_dir`` use, with the keywords of its calls."""
    uses: list[Use] = []
    for path in sorted(Path(backend_dir).rglob("*.py")):
        tree = parse_python(path, "runner source", "restore it from the checkout", limit=MAX_SOURCE_BYTES)
        rel = path.relative_to(root).as_posix()
        bound: dict[str, tuple[str, str | None]] = {}  # local name -> (module, name)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in packages:
                for alias in node.names:
                    bound[alias.asname or alias.name] = (node.module, alias.name)
                    uses.append(Use(node.module, alias.name, (), f"{rel}:{node.lineno}"))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] in packages:
                        uses.append(Use(alias.name, None, (), f"{rel}:{node.lineno}"))
                        if alias.asname:
                            bound[alias.asname] = (alias.name, None)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in bound:
                keywords = tuple(k.arg for k in node.keywords if k.arg is not None)
                module, name = bound[node.func.id]
                if keywords and name is not None:
                    uses.append(Use(module, name, keywords, f"{rel}:{node.lineno}"))
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
                module, name = bound[node.value.id]
                owner = module if name is None else f"{module}.{name}"  # `from vllm import envs`: envs.X
                uses.append(Use(owner, node.attr, (), f"{rel}:{node.lineno}", attribute=name is not None))
    return uses


def check(uses: list[Use], release: Release) -> list[Miss]:
    misses = []
    for use in uses:
        if use.name is None:
            if release.module_file(use.module) is None:
                misses.append(Miss(use, "no such module in the release"))
            continue
        if release.module_file(use.module) is None:
            if not use.attribute:  # an attribute of an imported class or value: not known statically
                misses.append(Miss(use, f"no module {use.module} in the release"))
            continue
        found = resolve(release, use.module, use.name)
        if found is None:
            if not use.keywords:  # a call of a missing name: its import is the one reported
                misses.append(Miss(use, f"not defined in {use.module} (nor re-exported there)"))
            continue
        if not use.keywords:
            continue
        params = _parameters(release, found)
        if params is None:
            continue  # a value or a class whose __init__ lies outside the release: its parameters are unknown
        names, open_ended = params
        for keyword in use.keywords:
            if keyword not in names and not open_ended:
                misses.append(Miss(use, f"no parameter {keyword!r}"))
    return misses


def contract(backend: str, releases: list[Path], backends_dir: Path) -> tuple[int, list[Miss], list[str]]:
    """(uses checked, misses, packages left unchecked) of ``backend``'s runners against the release (its
    wheels or source trees); a package none of them holds (SGLang's sgl_kernel without its wheel) is left
    out and named. InputError when nothing can be checked."""
    packages = FRAMEWORK_PACKAGES.get(backend)
    if packages is None:
        known = ", ".join(FRAMEWORK_PACKAGES)
        raise InputError(f"contract {backend}: not a framework backend ({known}); the torch backend has no pin")
    runners = Path(backends_dir) / backend
    if not runners.is_dir():
        raise InputError(f"contract {backend}: checked nothing: {runners} holds no runner yet")
    if not releases:
        how = NO_WHEEL.get(backend, f"nox -s contract-{backend} downloads the wheel")
        raise InputError(
            f"contract {backend}: checked nothing: give the pinned release with --wheel PATH, --source DIR or "
            f"--image [REF] ({how})"
        )
    uses = runner_uses(runners, packages, Path(backends_dir).parents[2])  # paths from the checkout's root
    if not uses:
        raise InputError(f"contract {backend}: checked nothing: no runner under {runners} imports {packages[0]}")
    release = Release(*releases)
    held = release.packages()
    unchecked = sorted({u.module.split(".")[0] for u in uses} - held)
    checked = [u for u in uses if u.module.split(".")[0] in held]
    return len(checked), check(checked, release), unchecked


def fetch_wheels(backend: str, version: str, cache: Path, timeout: float = 1800) -> list[Path]:
    """The release's wheels in ``cache``, downloaded once with `pip download --no-deps` (a pinned wheel does not
    change); InputError saying why when the backend has no wheel or pip cannot fetch it."""
    import subprocess
    import sys

    if backend not in WHEEL_REQUIREMENTS:
        raise InputError(NO_WHEEL.get(backend, f"{backend} has no framework release to check"))
    found = []
    for requirement in (f"{WHEEL_REQUIREMENTS[backend][0]}=={version}", *WHEEL_REQUIREMENTS[backend][1:]):
        name, pinned = requirement.split("==")
        pattern = f"{name.replace('-', '_')}-{pinned}-*.whl"
        wheels = sorted(Path(cache).glob(pattern))
        if not wheels:
            pip = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", requirement, "-d", str(cache)]
            done = subprocess.run(pip, capture_output=True, text=True, timeout=timeout)
            wheels = sorted(Path(cache).glob(pattern))
            if done.returncode != 0 or not wheels:
                reason = (done.stderr.strip().splitlines() or ["no wheel downloaded"])[-1][:200]
                raise InputError(f"pip cannot fetch {requirement} ({reason})")
        found.append(wheels[-1])
    return found
