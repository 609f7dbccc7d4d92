"""What `opcollect collect` aims at before it plans (collect.py): the device and SM nvidia-smi gives, read without
torch, and a --tables that the default run directory (runs/ of the checkout) would overlap. nvidia-smi here is a
stand-in script on PATH (the GPU is the one thing these tests may fake)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import run_cli

from opcollect.collect import host_gpu_sm, resolve_target
from opcollect.errors import InputError
from opcollect.project import ProjectTree, find_project


def _nvidia_smi(tmp_path: Path, monkeypatch, body: str, shebang: str = "#!/bin/sh") -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "nvidia-smi"
    script.write_text(f"{shebang}\n{body}")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    return script


def test_the_sm_is_gpu_zeros_compute_capability_without_its_dot(tmp_path, monkeypatch):
    _nvidia_smi(tmp_path, monkeypatch, 'test "$*" = "--query-gpu=compute_cap --format=csv,noheader" || exit 3\n'
                "printf '9.0\\n8.6\\n'\n")  # fmt: skip
    assert host_gpu_sm() == "90"
    assert resolve_target("auto", None) == ("cuda", "90")
    assert resolve_target("cuda", "100") == ("cuda", "100")  # --sm wins over what the GPU says
    assert resolve_target("cpu", None) == ("cpu", "cpu")


@pytest.mark.parametrize(
    ("body", "shebang"),
    [
        ("echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver'\nexit 9\n", "#!/bin/sh"),
        ("exit 0\n", "#!/bin/sh"),  # answers nothing
        ("", "#!/nonexistent/interpreter"),  # cannot be started
    ],
)
def test_an_nvidia_smi_that_fails_says_there_is_no_gpu(tmp_path, monkeypatch, body, shebang):
    _nvidia_smi(tmp_path, monkeypatch, body, shebang)
    assert host_gpu_sm() is None
    assert resolve_target("auto", None) == ("cpu", "cpu")
    with pytest.raises(InputError) as refused:
        resolve_target("cuda", None)
    assert str(refused.value) == "--device cuda: no GPU answers nvidia-smi; pass --sm, or use --device cpu"


def test_tables_overlapping_the_default_run_directory_are_refused_before_the_run(tree_copy):
    tables = tree_copy / "runs"
    done = run_cli(
        "collect", "torch", "--local", "--sm", "cpu", "--smoke", "--ops", "gemm",
        "--root", str(tree_copy), "--tables", str(tables),
    )  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    found = re.fullmatch(
        rf"opcollect: error: --tables {re.escape(str(tables))} and the run directory "
        rf"{re.escape(str(tree_copy.resolve() / 'runs'))}/(torch-smcpu-[0-9a-f]{{12}}-[0-9a-f]{{8}}) overlap; a run "
        r"directory is not a TABLES tree: give them separate paths\n",
        done.stderr,
    )
    assert found, done.stderr
    assert not tables.exists()  # refused before a plan was written there


def test_a_tree_without_cases_is_not_a_checkout_and_git_outside_one_says_nothing(tmp_path, monkeypatch):
    with pytest.raises(InputError) as refused:
        find_project(tmp_path)
    assert str(refused.value) == (
        f"{tmp_path}: no cases/base_ops here; run from an opcollect checkout (pip install -e .) or pass --root "
        "pointing at one"
    )
    (tmp_path / "cases" / "base_ops").mkdir(parents=True)
    tree = find_project(tmp_path)
    assert tree == ProjectTree(tmp_path.resolve()) and tree.package == tmp_path.resolve() / "src" / "opcollect"
    assert tree.git("rev-parse", "HEAD") is None  # not a repository: git answers with an error
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    assert tree.git("status") is None  # no git to ask
