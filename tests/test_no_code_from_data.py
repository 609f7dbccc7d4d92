"""Nothing derived from data runs as code (issue 21 D2): a plan names a backend opcollect knows, never a module;
`python -m opcollect` and its workers import nothing from the working directory."""

from __future__ import annotations

import os
import sys

import pytest
from conftest import TESTS, gemm_plan, run_cli

from opcollect.backends import load_backend
from opcollect.errors import InputError
from opcollect.runtime.harness import TimingConfig
from opcollect.runtime.pool import Pool, Task
from opcollect.safepath import working_directory_entry


def _planted(directory, module: str) -> None:
    """A module file that leaves a marker when imported, as a crafted download or run directory could hold."""
    marker = directory / f"{module}.imported"
    (directory / f"{module}.py").write_text(f"open({str(marker)!r}, 'w').close()\nraise SystemExit(99)\n")


def test_load_backend_refuses_a_module_named_by_data(capsys):
    with pytest.raises(InputError, match="backend 'this' is not one opcollect knows"):
        load_backend("this")
    with pytest.raises(InputError, match="backend 'os.path' is not one"):
        load_backend("os.path")
    assert "Zen of Python" not in capsys.readouterr().out  # `this` was never imported
    assert "this" not in sys.modules or sys.modules["this"].__name__ == "this"


def test_load_backend_takes_a_module_only_when_the_caller_names_it(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    assert load_backend("light_backend", modules=("light_backend",)).device_sm("cpu") == "cpu"
    with pytest.raises(InputError):
        load_backend("light_backend", modules=("faulty_backend",))


def test_python_m_opcollect_imports_nothing_from_the_working_directory(tmp_path):
    # argparse is imported by the CLI, json by the plan summary: neither is loaded before opcollect's __main__
    for module in ("argparse", "json"):
        _planted(tmp_path, module)
    done = run_cli("plan", "--ops", "gemm", "--smoke", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.glob("*.imported")) == []


def test_a_run_and_its_workers_import_nothing_from_the_working_directory(tmp_path):
    plan = gemm_plan(tmp_path / "plan.json", [(1, 8, 8)])
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    for module in ("torch", "socket", "argparse"):
        _planted(cwd, module)
    done = run_cli("run", "--plan", str(plan), "--out", str(tmp_path / "run"), "--device", "cpu", cwd=cwd)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in cwd.glob("*.imported")) == []


def test_pool_workers_import_nothing_from_the_working_directory(tmp_path, monkeypatch):
    # the test process has socket loaded already: only a worker would import the planted one
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    _planted(cwd, "socket")
    monkeypatch.chdir(cwd)
    # no empty entry: Python reads an empty PYTHONPATH entry as the working directory, explicitly configured
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, (str(TESTS), os.environ.get("PYTHONPATH")))))
    answered = []
    case_id = "gemm:float32:m=1,n=8,k=8"
    task = Task(case_id, "gemm", "x", (case_id,), ({"gemm_dtype": "float32", "m": 1, "n": 8, "k": 8},), 1)
    pool = Pool("light_backend", ["cpu"], None, TimingConfig(), 60.0, tmp_path, lambda w, t, r: answered.extend(r))
    pool.run([task])
    assert [r["status"] for r in answered] == ["ok"]
    assert not (cwd / "socket.imported").exists()


def test_the_working_directory_entry_is_recognised(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert working_directory_entry(["", "/usr/lib/python3"])
    assert working_directory_entry([str(tmp_path), "/usr/lib/python3"])
    assert not working_directory_entry(["/usr/lib/python3", str(tmp_path)])  # only the entry -m puts first
    assert not working_directory_entry([])
