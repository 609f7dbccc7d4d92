"""Refusals reached from code rather than the command line: the case-grid validators (each grid file loads them,
taken here from the checkout's own YAML with one thing broken), the Slurm scripts, client and shard deal, the file
helpers, the wheel download and the collection container's exit code. Each calls the real function with the bad
input and checks the exception's type and message."""

from __future__ import annotations

import shutil
import subprocess
from copy import deepcopy
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import ROOT
from pydantic import ValidationError

from opcollect.cases.grids import GRID_TYPES, OpFile
from opcollect.errors import InputError


def _grid_file(op: str) -> dict:
    """cases/base_ops/OP.yaml of the checkout, as loaded before validation."""
    return yaml.safe_load((ROOT / "cases" / "base_ops" / f"{op}.yaml").read_text())


def _validate(op: str, data: dict):
    return OpFile[GRID_TYPES[op]].model_validate(data)  # type: ignore[index]


def test_the_unbroken_grid_files_validate():
    """The baseline of the tests below: each file loads as it is."""
    for op in ("comm", "mla_context_module", "dsv4_csa_context_module", "dsv4_csa_generation_module", "gdn"):
        _validate(op, _grid_file(op))
    _validate("dsa_context_module", _grid_file("dsa_context_module"))


def test_comm_message_sizes_for_other_dtypes_than_the_grid_lists_are_refused():
    data = _grid_file("comm")
    del data["grid"]["message_size"]["int8"]
    with pytest.raises(
        ValidationError, match=r"message_size lists sizes for \['half'\], dtypes are \['half', 'int8'\]"
    ):
        _validate("comm", data)


def test_comm_an_empty_list_of_message_sizes_is_refused():
    data = _grid_file("comm")
    data["grid"]["message_size"]["half"] = []
    with pytest.raises(ValidationError, match=r"message_size\.half is empty"):
        _validate("comm", data)


def test_by_sm_on_an_sm_with_a_narrowed_grid_is_refused():
    data = _grid_file("mla_context_module")
    sm = data["by_sm"][0]["sms"][0]
    data.setdefault("narrowed", {})[sm] = deepcopy(data["grid"])
    with pytest.raises(ValidationError, match=rf"by_sm\.0: SM {sm} has a narrowed grid; add its values there"):
        _validate("mla_context_module", data)


def test_a_dsv4_sweep_without_shapes_is_refused():
    data = _grid_file("dsv4_csa_context_module")
    del data["grid"]["sweeps"][0]["context"]
    with pytest.raises(ValidationError, match="a sweep needs context or decode shapes"):
        _validate("dsv4_csa_context_module", data)


def test_a_dsv4_context_sweep_with_decode_shapes_is_refused():
    data = _grid_file("dsv4_csa_context_module")
    data["grid"]["sweeps"][0]["decode"] = _grid_file("dsv4_csa_generation_module")["grid"]["sweeps"][0]["decode"]
    with pytest.raises(ValidationError, match=r"sweeps\.0: this op's sweeps have context shapes only"):
        _validate("dsv4_csa_context_module", data)


@pytest.mark.parametrize("both", [True, False], ids=["profile-and-shape", "neither"])
def test_a_linear_model_gives_its_profile_or_its_shape(both):
    data = _grid_file("gdn")
    entry = data["grid"]["models"][0]
    if both:
        entry["profile"] = "Qwen3.5-27B"
    else:
        del entry["shape"]
    with pytest.raises(ValidationError, match=r"model 'Qwen/Qwen3\.5-0\.8B': give its profile or its shape, one of"):
        _validate("gdn", data)


def test_a_backend_in_two_sparse_sweeps_is_refused():
    data = _grid_file("dsa_context_module")
    sweeps = data["grid"]["sweeps"]
    sweeps[1]["backends"] = [*sweeps[1]["backends"], sweeps[0]["backends"][0]]
    backend = sweeps[0]["backends"][0]
    with pytest.raises(ValidationError, match=rf"backend {backend} is in sweeps 0 and 1; give each backend one sweep"):
        _validate("dsa_context_module", data)


def test_a_container_runtime_without_the_collector_image_is_refused():
    from opcollect.cluster import scripts

    options = scripts.SlurmOptions(shards=1, runtime="apptainer", image=None)
    with pytest.raises(ValueError, match="the apptainer runtime runs the collector image: build it first"):
        scripts._run_command(options, Path("/scratch/run"))


def _fake_sbatch(tmp_path: Path, monkeypatch, body: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "sbatch"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    job = tmp_path / "collect.sbatch"
    job.write_text("#!/bin/sh\n")
    return job


def test_sbatch_that_does_not_answer_in_time_is_refused(monkeypatch, tmp_path):
    from opcollect.cluster import slurm

    job = _fake_sbatch(tmp_path, monkeypatch, f"exec {shutil.which('sleep')} 30")
    monkeypatch.setattr(slurm, "TIMEOUT", 0.3)
    with pytest.raises(InputError, match=r"sbatch collect\.sbatch: no answer from the Slurm controller in 0 s"):
        slurm.sbatch(job)


def test_a_name_holding_a_nul_byte_is_refused():
    from opcollect.files import check_name

    with pytest.raises(OSError, match="a name holds a NUL byte"):
        check_name(Path("runs/a\0b"))


def test_ensure_dir_under_a_file_names_the_file(tmp_path):
    from opcollect.files import ensure_dir

    (tmp_path / "runs").write_text("")
    with pytest.raises(NotADirectoryError, match="is a file, not a directory") as refused:
        ensure_dir(tmp_path / "runs" / "r1" / "shards")
    assert refused.value.filename == str(tmp_path / "runs")


def test_wheels_pip_cannot_download_are_one_input_error(monkeypatch, tmp_path):
    from opcollect.images import context

    def refused(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found for nvidia-nope\n")

    monkeypatch.setattr(context.subprocess, "run", refused)
    with pytest.raises(InputError, match=r"downloading wheels of nvidia-nope for cp311 failed: \['ERROR: No matching"):
        context.download_wheels(("nvidia-nope",), "311", tmp_path)


def test_a_collection_container_exiting_non_zero_is_one_input_error(monkeypatch, tmp_path):
    """The container's log went to the terminal already; the host adds one line with its exit code. The image build,
    the engine and the container are stand-ins: what the host does with the exit code is under test."""
    from opcollect import collect
    from opcollect.images import build, container, engine
    from opcollect.runtime.run import RunOptions

    prepared = SimpleNamespace(kind="cpu", plan_path=tmp_path / "plan.json", run_dir=tmp_path / "run")
    image = SimpleNamespace(
        tag="opcollect/torch:t", plan=SimpleNamespace(base_image="b", base_digest="d", version=None)
    )
    monkeypatch.setattr(collect, "prepare", lambda tree, request: prepared)
    monkeypatch.setattr(build, "build_image", lambda *args, **kwargs: image)
    monkeypatch.setattr(engine, "connect", lambda: None)
    monkeypatch.setattr(container, "run_container", lambda client, run, say: 3)
    request = SimpleNamespace(backend="torch", version=None, run_options=RunOptions())
    with pytest.raises(InputError, match="the collection container exited with code 3; its log is above"):
        collect.collect_in_container(None, request, None, None, "all", say=lambda *a: None)


def test_shards_that_do_not_add_up_to_the_plan_are_refused_as_a_bug(monkeypatch, tmp_path):
    """An internal check of the Slurm submission: a shard that lost a case (a stand-in shard_of drops one from
    shard 0) stops the submission before anything is written."""
    from opcollect.cluster import submit
    from opcollect.plans.planner import PlanOptions, shard_of
    from opcollect.project import find_project

    def losing(whole, i, count, dealt):
        part = shard_of(whole, i, count, dealt)
        return SimpleNamespace(total_cases=part.total_cases - 1) if i == 0 else part

    monkeypatch.setattr(submit, "shard_of", losing)
    with pytest.raises(InputError, match=r"--shards 2: the shards do not add up to the plan; report this as a bug"):
        submit.prepare_root(
            find_project(ROOT), "torch", "cpu", PlanOptions(ops=("gemm",), smoke=True), 2, tmp_path / "root"
        )
    assert not (tmp_path / "root").exists()
