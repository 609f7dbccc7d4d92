#!/usr/bin/env python3
"""Record which tests execute each line of src/opcollect: the map that scripts/mutants.py --map uses to
run, for a planted bug, every test that reaches the changed lines (what CI would run against it) and
no other.

    .venv/bin/python scripts/covermap.py --out .cache/covermap.json [-- PYTEST ARGS]

The whole suite runs once under coverage.py in a copy of the project (the copy mutants.py makes),
with one coverage context per test node ID. Python subprocesses the tests start (`python -m opcollect`,
run workers, Slurm jobs) are measured too and their lines charged to the test that started them: a
hook module and its .pth file are placed in the interpreter's site-packages for the length of the run
(coverage's own subprocess support works the same way), and it starts coverage only in processes
that carry the run's data directory in their environment, the one channel a child process inherits.
Code that runs inside a container is not measured. Lines run only at import (module constants,
``def`` lines, defaults) carry no test; mutants.py charges them to every test that reaches the module.

The map is JSON: {"tests": [node IDs], "files": {"tables/merge.py": {"12": [test indices]}},
"failed": [node IDs that failed in this run; mutants.py leaves them out], "seconds": {node ID: seconds}}.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import _copy_project, _env, _python  # noqa: E402

HOOK = "_opcollect_covermap"
DATA_VAR = "OPCOLLECT_COVERMAP_DATA"
TEST_VAR = "OPCOLLECT_COVERMAP_TEST"

# Imported at every interpreter start through its .pth file; inert unless DATA_VAR is set. In the pytest
# process it is also the plugin (-p) that switches the context per test and passes it to children.
HOOK_SOURCE = f'''
import atexit
import os

_cov = None
if os.environ.get("{DATA_VAR}"):
    import coverage

    _data, _, _source = os.environ["{DATA_VAR}"].partition("|")
    _cov = coverage.Coverage(data_file=_data, data_suffix=True, source=[_source],
                             context=os.environ.get("{TEST_VAR}") or None, config_file=False)
    _cov.start()
    _real_exit = os._exit

    def _save():
        _cov.stop()
        _cov.save()

    def _exit(code):
        _save()
        _real_exit(code)

    os._exit = _exit
    atexit.register(_save)


def pytest_runtest_protocol(item, nextitem):
    os.environ["{TEST_VAR}"] = item.nodeid
    if _cov is not None:
        _cov.switch_context(item.nodeid)


def pytest_runtest_logreport(report):
    with open(os.environ["{DATA_VAR}"].partition("|")[0] + ".seconds", "a") as out:
        out.write(f"{{report.nodeid}}\\t{{report.duration:.3f}}\\n")
    if report.failed:
        with open(os.environ["{DATA_VAR}"].partition("|")[0] + ".failed", "a") as out:
            out.write(report.nodeid + "\\n")


def pytest_runtest_logfinish(nodeid, location):
    os.environ.pop("{TEST_VAR}", None)
    if _cov is not None:
        _cov.switch_context("")
'''


def _site_packages(python: str) -> Path:
    if Path(python).resolve() == Path(sys.executable).resolve():
        return Path(sysconfig.get_paths()["purelib"])
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return Path(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.strip())


@contextlib.contextmanager
def installed_hook(site: Path):
    """The hook module and its .pth file in ``site`` for the length of the block. A map made inside another
    (the covermap test under an outer map's run) finds them there and leaves them: removing them would stop
    the outer run measuring the children of every test after it."""
    hook, pth = site / f"{HOOK}.py", site / f"{HOOK}.pth"
    outer = pth.exists()
    hook.write_text(HOOK_SOURCE)
    pth.write_text(f"import {HOOK}\n")
    try:
        yield
    finally:
        if not outer:
            pth.unlink(missing_ok=True)
            hook.unlink(missing_ok=True)


def _read(data_dir: Path, source: Path) -> dict:
    import coverage

    cov = coverage.Coverage(data_file=str(data_dir / ".coverage"), config_file=False)
    cov.combine([str(p) for p in data_dir.glob(".coverage.*") if p.suffix not in (".failed", ".seconds")])
    data = cov.get_data()
    tests: dict[str, int] = {}
    files: dict[str, dict[str, list[int]]] = {}
    for measured in sorted(data.measured_files()):
        rel = Path(measured).resolve().relative_to(source.resolve()).as_posix()
        lines: dict[str, list[int]] = {}
        for line, contexts in sorted(data.contexts_by_lineno(measured).items()):
            ids = sorted(tests.setdefault(c, len(tests)) for c in set(contexts) if c)
            lines[str(line)] = ids
        files[rel] = lines
    failed_file = data_dir / ".coverage.failed"
    failed = sorted(set(failed_file.read_text().split("\n")) - {""}) if failed_file.exists() else []
    seconds: dict[str, float] = {}  # setup, call and teardown of each test, summed
    seconds_file = data_dir / ".coverage.seconds"
    for line in seconds_file.read_text().splitlines() if seconds_file.exists() else ():
        node, _, took = line.rpartition("\t")
        seconds[node] = round(seconds.get(node, 0.0) + float(took), 3)
    return {"tests": list(tests), "files": files, "failed": failed, "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="where to write the map (JSON)")
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to pytest (default: the whole suite)")
    args = parser.parse_args(argv)
    python = _python()
    site = _site_packages(python)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="opcollect-covermap-") as tmp:
        copy, data_dir = Path(tmp) / "project", Path(tmp) / "data"
        copy.mkdir()
        data_dir.mkdir()
        _copy_project(copy)
        source = copy / "src" / "opcollect"
        with installed_hook(site):
            # an outer map's test ID is not this run's: its pytest process starts with no test of its own
            env = {k: v for k, v in _env(copy).items() if k != TEST_VAR}
            env[DATA_VAR] = f"{data_dir / '.coverage'}|{source}"
            cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", HOOK, *args.pytest_args]
            done = subprocess.run(cmd, cwd=copy, env=env)
        found = _read(data_dir, source)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(found, separators=(",", ":")))
    lines = sum(len(v) for v in found["files"].values())
    print(
        f"{len(found['tests'])} tests over {len(found['files'])} files, {lines} lines; pytest exit "
        f"{done.returncode}; {time.monotonic() - started:.0f} s -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
