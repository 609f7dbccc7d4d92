"""Import every framework symbol a backend's runners use, in an environment that has the framework.

Run by `nox -s import-check-vllm` inside its own virtual environment (the pinned framework and the torch it
pins): for each use found by opcollect.backends.symbols (the same list `opcollect contract` checks
statically), import the module, get the name, and for calls with keywords check them against
inspect.signature. Prints one line per miss and a summary; exit 1 on a miss.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path

from opcollect.backends.symbols import FRAMEWORK_PACKAGES, runner_uses

ROOT = Path(__file__).resolve().parents[1]


def main(backend: str) -> int:
    backends = ROOT / "src" / "opcollect" / "backends"
    for module in sorted((backends / backend).glob("*.py")):  # the runner modules themselves import cleanly
        importlib.import_module(f"opcollect.backends.{backend}.{module.stem}".removesuffix(".__init__"))
    uses = runner_uses(backends / backend, FRAMEWORK_PACKAGES[backend], ROOT)
    misses = []
    driverless = []  # compiled kernels that load the CUDA driver at import: not importable on a machine without one
    for use in uses:
        try:
            target = importlib.import_module(use.module)
            if use.name is not None:
                target = getattr(target, use.name)
        except (ImportError, AttributeError) as exc:
            if use.attribute and isinstance(exc, ImportError):
                continue  # an attribute of an imported class: not a module to import
            if "libcuda" in str(exc) or "libcuda" in repr(exc.__context__):
                driverless.append(f"{use.where}: {use.label}")
                continue
            misses.append(f"{use.where}: {use.label}: {type(exc).__name__}: {exc}")
            continue
        if use.keywords:
            try:
                params = inspect.signature(target).parameters
            except (TypeError, ValueError):
                continue  # a builtin without a signature
            open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
            for keyword in use.keywords:
                if keyword not in params and not open_ended:
                    misses.append(f"{use.where}: {use.label}: no parameter {keyword!r} in {inspect.signature(target)}")
    for line in misses:
        print(line)
    for line in driverless:
        print(f"{line}: not importable without the CUDA driver (libcuda.so.1); the static contract checks it")
    import_of = importlib.import_module(FRAMEWORK_PACKAGES[backend][0])
    version = getattr(import_of, "__version__", "?")
    print(f"import-check {backend} {version}: {len(uses)} uses, {len(misses)} missing, {len(driverless)} need a driver")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
