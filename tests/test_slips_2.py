"""Behaviours the second blind round (scripts/blind_mutants_2.json: bugs planted by someone who had not read the
tests) found unguarded: what a run's event counts, a row of one sample, the order of a merged table's rows, plan-diff
of a moved batch row, repeated grid values, system names, re-pinning and untagged images in a bump, sbatch's answer,
a Slurm record of no shards, release versions, a wheel's timestamps, the longest file name, check's exit code on
warnings, a torch GEMM's footprint."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import ROOT, TESTS, fake_run, gemm_plan

from opcollect.plans.gemm import GemmCase
from opcollect.project import find_project
from opcollect.runtime.run import RunOptions, run_plan
from opcollect.tables.merge import merge
from opcollect.tables.values import measured_faults

HEALTHY = [(1, 64, 64), (2, 64, 128)]
FAILING = (1, 16, 13)  # tests/faulty_backend.py raises an unexpected error at k=13


def test_a_runs_event_counts_the_rows_it_measured_and_its_failures_apart(tmp_path, monkeypatch):
    """The event's `rows` are the cases measured by this run; a failure is counted under `failures`, not as a row."""
    monkeypatch.setenv("PYTHONPATH", f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")  # workers import it
    plan = gemm_plan(tmp_path / "plan.json", [HEALTHY[0], FAILING, HEALTHY[1]])
    run_dir = tmp_path / "run"
    options = RunOptions(device="cpu", case_timeout=30, max_case_seconds=0.05, test_backend="faulty_backend")
    summary = run_plan(plan, run_dir, options)
    [event_path] = (run_dir / "events").glob("*.json")
    event = json.loads(event_path.read_text())
    assert (event["rows"], event["failures"]) == (2, 1), event
    assert (summary.ok, sum(summary.failed_by_class.values())) == (2, 1)


def _measured(samples: list[int]) -> pa.Table:
    n = len(samples)
    return pa.table(
        {
            "latency": [1.0] * n,
            "latency_p25": [1.0] * n,
            "latency_p75": [1.0] * n,
            "samples": samples,
            "noise": [0.0] * n,
            "timing": ["eager"] * n,
        }
    )


def test_a_row_of_one_sample_is_a_value_and_zero_samples_is_not():
    [fault] = measured_faults(_measured([1, 0, 2]))
    assert fault.what == "samples below 1"
    assert fault.mask.to_pylist() == [False, True, False]
    assert measured_faults(_measured([1, 1])) == []


def test_a_merged_table_is_ordered_by_its_key_fields_as_numbers(tmp_path):
    """m=128 comes before m=1024 (the case IDs as strings order them the other way round)."""
    cases = [GemmCase("bfloat16", m, 64, 64) for m in (1024, 128, 16)]
    tables = tmp_path / "TABLES"
    merge([fake_run(tmp_path / "run", cases)], tables, find_project(), say=lambda _: None)
    [path] = tables.rglob("gemm_perf.parquet")
    assert pq.read_table(path).column("m").to_pylist() == [16, 128, 1024]


def test_plan_diff_counts_a_case_moved_to_another_batch_row_as_changed():
    """Same case ID and dispatch, another batch row: the case is timed with other cases, so the plans differ."""
    from opcollect.plans.diff import OpView, _diff_op

    old = OpView(cases=2, rows={"c1": ("nccl", "row-a"), "c2": ("nccl", "row-a")})
    new = OpView(cases=2, rows={"c1": ("nccl", "row-a"), "c2": ("nccl", "row-b")})
    diff = _diff_op("comm", old, new)
    assert (diff.added, diff.removed, diff.changed) == (0, 0, 1) and diff.examples == ("c2",)
    assert _diff_op("comm", old, old).differs is False


def test_a_grid_axis_with_a_repeated_value_is_refused():
    from pydantic import ValidationError

    from opcollect.cases.grids import GemmGrid

    grid = {"dtypes": ["bfloat16"], "n": [64], "k": [64], "model_tp_sizes": [1]}
    assert GemmGrid(m=[1, 2, 4], **grid).m == [1, 2, 4]
    with pytest.raises(ValidationError, match="without repeats"):
        GemmGrid(m=[1, 2, 2], **grid)


def test_a_system_name_is_matched_whole(tmp_path):
    """A name is a file stem and a directory of the consumer's tree: `h200-SXM` past a valid prefix is refused."""
    from opcollect.cases.systems import load_systems
    from opcollect.errors import InputError

    text = (ROOT / "systems" / "h200_sxm.yaml").read_text()
    (tmp_path / "h200_sxm.yaml").write_text(text)
    assert list(load_systems(tmp_path)) == ["h200_sxm"]
    (tmp_path / "h200_sxm.yaml").unlink()
    (tmp_path / "h200-SXM.yaml").write_text(text.replace("name: h200_sxm", "name: h200-SXM"))  # stem and name agree
    with pytest.raises(InputError, match="name"):
        load_systems(tmp_path)


def _pins_copy(tmp_path):
    path = tmp_path / "pins.yaml"
    path.write_text((ROOT / "pins.yaml").read_text())
    return path


def test_repinning_vllms_current_version_keeps_its_entry(tmp_path):
    """vLLM keeps one version: a new digest for the current version replaces its image, it does not drop the entry."""
    from opcollect.images.bump import BumpRequest, bump
    from opcollect.images.pins import load_pins

    pins = _pins_copy(tmp_path)
    current, pin = load_pins(pins).pin("vllm")
    repushed = pin.image.rsplit("@sha256:", 1)[0] + "@sha256:" + ("f" if pin.digest[-1] != "f" else "e") * 64
    after = yaml.safe_load(bump(pins, BumpRequest("vllm", current, repushed)).after)["backends"]["vllm"]
    assert after["current"] == current and after["versions"] == {current: {"image": repushed}}


def test_an_image_without_a_tag_is_not_the_new_versions_image(tmp_path):
    from opcollect.errors import InputError
    from opcollect.images.bump import BumpRequest, check_request

    digest = "@sha256:" + "a" * 64
    check_request(_pins_copy(tmp_path), BumpRequest("vllm", "0.25.0", "vllm/vllm-openai:v0.25.0" + digest))
    with pytest.raises(InputError, match="tag None is not version 0.25.0"):
        check_request(_pins_copy(tmp_path), BumpRequest("vllm", "0.25.0", "vllm/vllm-openai" + digest))


@pytest.mark.parametrize("answer, job", [("123", "123"), ("123;cluster_a", "123"), ("123abc", None), ("123\nx", None)])
def test_sbatchs_answer_is_a_job_id_matched_whole(tmp_path, monkeypatch, answer, job):
    """sbatch --parsable answers `id` or `id;cluster`; anything after it is no job of ours."""
    from opcollect.cluster.slurm import sbatch
    from opcollect.errors import InputError

    fake = tmp_path / "bin" / "sbatch"  # an sbatch that answers what a confused controller might
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\nprintf '%s' {json.dumps(answer)}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    script = tmp_path / "collect.sbatch"
    script.write_text("#!/bin/sh\n")
    if job is None:
        with pytest.raises(InputError, match="unexpected answer"):
            sbatch(script)
    else:
        assert sbatch(script) == job


def test_a_slurm_record_of_no_shards_is_refused(tmp_path):
    from opcollect.cluster.record import read_record
    from opcollect.errors import InputError

    (tmp_path / "slurm.json").write_text('{"shards": 0, "submissions": []}')
    with pytest.raises(InputError, match="field 'shards': 0 is not a whole number from 1"):
        read_record(tmp_path)


@pytest.mark.parametrize("version", ["1.0.0-bad", "2026.12.1 ", "1.0.0rc1+local/x"])
def test_a_release_version_is_matched_whole(version):
    from opcollect.errors import InputError
    from opcollect.release.package import check_version

    assert check_version("1.0.0rc1+local.2") == "1.0.0rc1+local.2"
    with pytest.raises(InputError, match="not a release version"):
        check_version(version)


def test_a_wheel_of_an_epoch_before_1980_is_stamped_1980(tmp_path):
    """SOURCE_DATE_EPOCH=0 is a common reproducible-build setting; a zip entry cannot hold a time before 1980."""
    import zipfile

    from opcollect.release.archives import write_wheel

    wheel = tmp_path / "t-1.0-py3-none-any.whl"
    write_wheel(wheel, {"t/a.txt": b"a"}, "t-1.0.dist-info/RECORD", epoch=0)
    with zipfile.ZipFile(wheel) as archive:
        assert {info.date_time for info in archive.infolist()} == {(1980, 1, 1, 0, 0, 0)}


def test_a_wheels_record_lists_every_entry_with_its_unpadded_urlsafe_sha256_and_size(tmp_path):
    """The wheel spec (PEP 427, after PEP 376) hashes RECORD entries as urlsafe base64 with the '=' padding removed;
    installers that check RECORD compare the strings."""
    import base64
    import hashlib
    import zipfile

    from opcollect.release.archives import write_wheel

    wheel = tmp_path / "t-1.0-py3-none-any.whl"
    files = {"t/a.txt": b"a", "t/__init__.py": b"x = 1\n", "t-1.0.dist-info/METADATA": b"Name: t\n"}
    write_wheel(wheel, files, "t-1.0.dist-info/RECORD", epoch=1700000000)
    with zipfile.ZipFile(wheel) as archive:
        record = archive.read("t-1.0.dist-info/RECORD").decode().splitlines()
        stored = {name: archive.read(name) for name in archive.namelist()}
    rows = dict((name, (digest, size)) for name, digest, size in (line.split(",") for line in record))
    assert rows.pop("t-1.0.dist-info/RECORD") == ("", "")
    assert set(rows) == set(files) == set(stored) - {"t-1.0.dist-info/RECORD"}
    for name, (digest, size) in rows.items():
        encoded = base64.urlsafe_b64encode(hashlib.sha256(stored[name]).digest()).decode()
        assert digest == "sha256=" + encoded.rstrip("=") and "=" not in digest.removeprefix("sha256=")
        assert int(size) == len(stored[name]) == len(files[name])


def test_an_sdist_holds_each_directory_of_its_files_once_and_no_other(tmp_path):
    import tarfile

    from opcollect.release.archives import write_sdist

    sdist = tmp_path / "t-1.0.tar.gz"
    write_sdist(sdist, {"t-1.0/PKG-INFO": b"p", "t-1.0/t/data/a.txt": b"a", "t-1.0/t/b.txt": b"b"}, epoch=1700000000)
    with tarfile.open(sdist) as archive:
        members = [(m.name, m.isdir()) for m in archive.getmembers()]
    assert members == [
        ("t-1.0", True),
        ("t-1.0/PKG-INFO", False),
        ("t-1.0/t", True),
        ("t-1.0/t/b.txt", False),
        ("t-1.0/t/data", True),
        ("t-1.0/t/data/a.txt", False),
    ]


def test_a_name_of_exactly_name_max_bytes_is_a_name(tmp_path):
    from opcollect.files import NAME_MAX, check_name, write_atomic

    check_name(tmp_path / ("a" * NAME_MAX))
    (tmp_path / ("a" * NAME_MAX)).write_text("fits")  # the file system agrees
    # and the atomic writer's temporary name beside it fits too
    assert write_atomic(tmp_path / ("b" * NAME_MAX), "fits").read_text() == "fits"
    assert sorted(p.name[0] for p in tmp_path.iterdir()) == ["a", "b"]  # no temporary file left
    with pytest.raises(OSError, match="too long|File name too long") as raised:
        check_name(tmp_path / ("a" * (NAME_MAX + 1)))
    assert raised.value.errno == 36  # ENAMETOOLONG


def test_check_exits_0_on_warnings_alone_and_1_on_a_violation(tmp_path, capsys):
    """Slow rows (R8) are warnings: check passes; a latency below 0 (R3) is a violation: it fails."""
    from opcollect.cli import build_parser
    from opcollect.cli.tables import cmd_check

    tables = tmp_path / "TABLES"
    merge([fake_run(tmp_path / "run", [GemmCase("bfloat16", m, 64, 64) for m in (1, 2)])], tables, find_project())
    args = build_parser().parse_args(["check", str(tables)])
    assert cmd_check(args) == 0
    shown = capsys.readouterr().out
    assert "R8 warning" in shown and "check " in shown and ": 0 violations" in shown
    [path] = tables.rglob("gemm_perf.parquet")
    table = pq.read_table(path)
    latency = pa.array([-1.0] + table["latency"].to_pylist()[1:], pa.float64())
    pq.write_table(table.set_column(table.schema.get_field_index("latency"), "latency", latency), path)
    assert cmd_check(args) == 1


def test_a_torch_gemms_footprint_is_the_bytes_of_its_tensors():
    """x [m, k], w [n, k] and y [m, n], each at its dtype's width: float32's output is 4 bytes an element."""
    import torch

    from opcollect.backends.torch import gemm

    for dtype, torch_dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        m, n, k = 3, 5, 7
        tensors = (
            torch.empty(m, k, dtype=torch_dtype),
            torch.empty(n, k, dtype=torch_dtype),
            torch.empty(m, n, dtype=torch_dtype),
        )
        assert gemm.footprint(GemmCase(dtype, m, n, k)) == sum(t.numel() * t.element_size() for t in tensors)
