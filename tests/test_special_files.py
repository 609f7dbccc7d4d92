"""No command hangs on a special file (issue 21 D7, D8): given a FIFO wherever it reads a file, each command ends
within 10 s with one line and exit 2 (verify and check report it as a difference, exit 1).

Every row plants a FIFO (os.mkfifo: nobody ever writes to it, so a plain open() would wait forever) and runs the
real CLI in a subprocess; the files come from outside, so they are read by opcollect.inputs, which opens with
O_NONBLOCK and refuses what fstat says is not a regular file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
from conftest import ROOT, fake_run, gemm_plan

from opcollect.plans.gemm import GemmCase
from opcollect.project import find_project
from opcollect.tables.merge import merge

DIR = "h200_sxm/gemm/vllm/0.24.0"
PROVENANCE = DIR + "/.opcollect/provenance.yaml"
CASES = [GemmCase("bfloat16", m, 1024, 1024) for m in (1, 8)]
PLAN = ("plan", "--ops", "gemm", "--smoke")


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """A run directory and the TABLES merged from it, which rows copy and plant a FIFO in."""
    base = tmp_path_factory.mktemp("special")
    merge([fake_run(base / "run", CASES)], base / "tables", find_project())
    return base


class Place:
    """Where a row works: {tmp}, and copies of the template's run and TABLES made on first use."""

    def __init__(self, tmp: Path, template: Path):
        self.tmp, self._template = tmp, template

    def copy(self, name: str) -> Path:
        target = self.tmp / name
        if not target.exists():
            shutil.copytree(self._template / name, target)
        return target

    @property
    def run(self) -> Path:
        return self.copy("run")

    @property
    def tables(self) -> Path:
        return self.copy("tables")

    @property
    def plan(self) -> Path:
        path = self.tmp / "plan.json"
        return path if path.exists() else gemm_plan(path, [(1, 8, 8)])

    def fifo(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            path.unlink()
        os.mkfifo(path)
        return path


def _cpu_run_dir(p: Place) -> Path:
    """An unfinished CPU run of p.plan, as `run` leaves it, with a FIFO where a worker's shard would be."""
    from opcollect.runtime.planfile import read_plan
    from opcollect.runtime.rundir import prepare_run_dir

    run_dir = p.tmp / "out"
    prepare_run_dir(run_dir, p.plan, read_plan(p.plan), resume=False).lock.release()
    p.fifo(run_dir / "shards" / "r0-w0.jsonl")
    return run_dir


def _source_tree(p: Place) -> Path:
    """vLLM sources in which one module is a FIFO."""
    source = p.tmp / "source"
    (source / "vllm").mkdir(parents=True)
    (source / "vllm" / "__init__.py").write_text("")
    p.fifo(source / "vllm" / "config.py")
    return source


@dataclass(frozen=True)
class Case:
    id: str
    args: Callable[[Place], tuple]  # the command's arguments; a FIFO given as an argument is planted here
    plant: str | None = None  # or: where the FIFO goes, relative to the run ({run}) or TABLES ({tables})
    code: int = 2
    needle: str = "not a regular file (a FIFO)"


MERGE = lambda p: ("merge", p.run, "--into", p.tmp / "new")  # noqa: E731
RELEASE = lambda p: ("release", "--tables", p.tables, "--out", p.tmp / "dist")  # noqa: E731
IN_RUN, IN_TABLES = "{run}/", "{tables}/"

CASES_WITH_A_FIFO = [
    Case("plan-model-config", lambda p: (*PLAN, "--model-config", p.fifo(p.tmp / "config.json"))),
    Case("plan-diff-old", lambda p: ("plan-diff", p.fifo(p.tmp / "old.json"), p.plan)),
    Case("plan-diff-new", lambda p: ("plan-diff", p.plan, p.fifo(p.tmp / "new.json"))),
    Case("run-plan", lambda p: ("run", "--plan", p.fifo(p.tmp / "p.json"), "--out", p.tmp / "out", "--device", "cpu")),
    Case(
        "run-resume-shard",
        lambda p: ("run", "--plan", p.plan, "--out", _cpu_run_dir(p), "--resume", "--device", "cpu"),
    ),
    Case("merge-event", MERGE, IN_RUN + "events/r1.json"),
    Case("merge-run-json", MERGE, IN_RUN + "run.json"),
    Case("merge-plan-json", MERGE, IN_RUN + "plan.json"),
    Case("merge-shard", MERGE, IN_RUN + "shards/r1-w0.jsonl"),
    Case("merge-plan-flag", lambda p: (*MERGE(p), "--plan", p.fifo(p.tmp / "whole.json"))),
    Case(
        "merge-into-provenance",
        lambda p: ("merge", p.run, "--into", p.tables),
        IN_TABLES + PROVENANCE,
        needle="provenance.yaml (a FIFO)",
    ),
    Case(
        "merge-into-manifest",
        lambda p: ("merge", p.run, "--into", p.tables),
        IN_TABLES + "manifest.json",
        needle="manifest",
    ),
    Case(
        "verify-provenance",
        lambda p: ("verify", p.tables),
        IN_TABLES + PROVENANCE,
        code=1,
        needle="provenance.yaml (a FIFO)",
    ),
    Case("verify-manifest", lambda p: ("verify", p.tables), IN_TABLES + "manifest.json", needle="manifest"),
    Case("check-provenance", lambda p: ("check", p.tables), IN_TABLES + PROVENANCE, code=1, needle="provenance.yaml"),
    Case("check-manifest", lambda p: ("check", p.tables), IN_TABLES + "manifest.json", code=1, needle="manifest"),
    Case("release-provenance", RELEASE, IN_TABLES + PROVENANCE, needle="provenance.yaml (a FIFO)"),
    Case("release-manifest", RELEASE, IN_TABLES + "manifest.json", needle="manifest"),
    Case("status-slurm-json", lambda p: (p.fifo(p.tmp / "slurm.json"), "status", p.tmp)[1:]),
    Case("contract-source", lambda p: ("contract", "vllm", "--source", _source_tree(p))),
    Case("compare-table", lambda p: ("compare", p.tables, p.tables), IN_TABLES + DIR + "/gemm_perf.parquet"),
]


def _id(case) -> str:
    return case.id if isinstance(case, Case) else case.values[0].id


@pytest.mark.parametrize("case", CASES_WITH_A_FIFO, ids=_id)
def test_a_fifo_where_a_file_is_read_ends_in_one_line(case: Case, tmp_path, template):
    place = Place(tmp_path, template)
    args = [str(a) for a in case.args(place)]
    if case.plant is not None:
        place.fifo(Path(case.plant.format(run=place.run, tables=place.tables)))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "opcollect", *args], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"opcollect {' '.join(args)}: still running after 10 s on a FIFO")
    shown = f"exit {done.returncode}\nstdout: {done.stdout[-1500:]}\nstderr: {done.stderr[-1500:]}"
    assert "Traceback" not in done.stdout + done.stderr, shown
    assert done.returncode == case.code, shown
    if case.code == 2:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("opcollect: error: "), shown
        assert case.needle in lines[0], shown
    else:  # a difference of verify or check: reported on stdout
        assert case.needle in done.stdout, shown


def test_the_reader_bounds_size_and_refuses_a_link_out_of_its_tree(tmp_path):
    from opcollect.errors import InputError
    from opcollect.inputs import parse_python, read_bytes

    (tmp_path / "tree").mkdir()
    big = tmp_path / "tree" / "big.json"
    big.write_bytes(b"x" * 11)
    assert read_bytes(big, "plan", "fix", limit=11) == b"x" * 11
    with pytest.raises(InputError, match="big.json: 11 bytes, over the 10 a plan may hold; fix"):
        read_bytes(big, "plan", "fix", limit=10)
    (tmp_path / "outside.json").write_text("{}")
    (tmp_path / "tree" / "link.json").symlink_to(tmp_path / "outside.json")
    assert read_bytes(tmp_path / "tree" / "link.json", "plan", "fix", limit=10) == b"{}"  # no tree: a path is a path
    with pytest.raises(InputError, match="link.json: a symlink, not followed in"):
        read_bytes(tmp_path / "tree" / "link.json", "plan", "fix", limit=10, tree=tmp_path / "tree")
    (tmp_path / "tree" / "sub").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(InputError, match="reached through a symlink out of"):
        read_bytes(tmp_path / "tree" / "sub" / "outside.json", "plan", "fix", limit=10, tree=tmp_path / "tree")
    deep = tmp_path / "deep.py"
    deep.write_text("x = " + "(" * 100_000 + ")" * 100_000 + "\n")
    with pytest.raises(InputError, match="deep.py: (nested too deeply to parse as Python|not Python)"):
        parse_python(deep, "runner source", "fix", limit=1 << 20)


def test_a_file_larger_than_its_size_read_to_the_limit_and_errors_while_reading_are_one_line(tmp_path):
    """A /proc file says it holds 0 bytes and holds more (as a file growing while read does): it is read whole
    in blocks up to the limit, refused past it; a read that fails, a file that is not UTF-8, and Python nested
    past the parser's limits are one line each."""
    from opcollect.errors import InputError
    from opcollect.inputs import parse_python, read_bytes, read_text

    status = Path("/proc/self/status")
    assert status.stat().st_size == 0
    data = read_bytes(status, "status", "fix", limit=1 << 20)
    assert data.startswith(b"Name:\t") and b"\nPid:\t" in data and len(data) > 200
    with pytest.raises(InputError) as refused:
        read_bytes(status, "status", "fix", limit=100)
    assert str(refused.value) == "/proc/self/status: over the 100 bytes a status may hold; fix"
    with pytest.raises(InputError) as refused:
        read_bytes(Path("/proc/self/mem"), "plan", "fix", limit=100)  # a regular file whose offset 0 cannot be read
    assert str(refused.value) == "/proc/self/mem: cannot read plan (Input/output error); fix"
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(InputError) as refused:
        read_text(latin, "case file", "save it as UTF-8", limit=100)
    assert str(refused.value) == f"{latin}: not UTF-8 (byte 0xe9 at offset 9); save it as UTF-8"
    deep = tmp_path / "unary.py"
    deep.write_text("x = " + "-" * 100_000 + "1\n")  # past the parser's stack, not its nesting rule
    with pytest.raises(InputError) as refused:
        parse_python(deep, "runner source", "fix", limit=1 << 20)
    assert str(refused.value) == f"{deep}: nested too deeply to parse as Python; fix"
