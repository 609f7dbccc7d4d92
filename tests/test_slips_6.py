"""Behaviours of the release, tables, runtime and top-level modules that no earlier test held: each test here
fails with a small plausible bug planted in the function it names."""

from __future__ import annotations

import argparse
import hashlib
import json
import tarfile
import zipfile

import pytest
from conftest import slurm_says

from opcollect import flags, names
from opcollect.cluster import slurm
from opcollect.errors import InputError
from opcollect.release import data_api
from opcollect.release.archives import write_sdist, write_wheel
from opcollect.release.attest import statement

EPOCH = 1700000000  # 2023-11-14T22:13:20Z


def test_an_sdist_stamps_every_entry_with_the_epoch_mode_and_no_owner(tmp_path):
    """write_sdist: files 0644, directories 0755, uid/gid 0, no names, the epoch as mtime in tar and gzip header."""
    sdist = tmp_path / "t-1.0.tar.gz"
    write_sdist(sdist, {"t-1.0/PKG-INFO": b"p", "t-1.0/t/a.txt": b"abc"}, epoch=EPOCH)
    raw = sdist.read_bytes()
    assert raw[:3] == b"\x1f\x8b\x08" and raw[3] & 0x08 == 0  # gzip, and no FNAME flag: no file name in the header
    assert int.from_bytes(raw[4:8], "little") == EPOCH
    with tarfile.open(sdist) as archive:
        members = {m.name: m for m in archive.getmembers()}
        assert archive.extractfile("t-1.0/t/a.txt").read() == b"abc"
    assert {name: (m.isdir(), m.mode, m.size) for name, m in members.items()} == {
        "t-1.0": (True, 0o755, 0),
        "t-1.0/PKG-INFO": (False, 0o644, 1),
        "t-1.0/t": (True, 0o755, 0),
        "t-1.0/t/a.txt": (False, 0o644, 3),
    }
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members.values()} == {(EPOCH, 0, 0, "", "")}


def test_a_wheel_stamps_every_entry_with_the_epoch_and_unix_mode_0644(tmp_path):
    """write_wheel: each entry deflated, dated at the epoch (UTC), unix-made, mode 0644 regular file."""
    wheel = tmp_path / "t-1.0-py3-none-any.whl"
    write_wheel(wheel, {"t/a.txt": b"a" * 100}, "t-1.0.dist-info/RECORD", epoch=EPOCH)
    with zipfile.ZipFile(wheel) as archive:
        infos = archive.infolist()
        assert archive.read("t/a.txt") == b"a" * 100
    assert [i.filename for i in infos] == ["t-1.0.dist-info/RECORD", "t/a.txt"]
    for info in infos:
        assert info.date_time == (2023, 11, 14, 22, 13, 20)
        assert info.compress_type == zipfile.ZIP_DEFLATED and info.create_system == 3
        assert info.external_attr >> 16 == 0o100644


def _package(root, files: dict[str, bytes], tables: list[dict]) -> None:
    (root / "data").mkdir(parents=True)
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    manifest = {"files": {rel: hashlib.sha256(data).hexdigest() for rel, data in files.items()}}
    (root / "MANIFEST.json").write_text(json.dumps(manifest))
    sidecars = {t["sidecar"]: {"runtime": {"version": t["version"]}} for t in tables}
    (root / "index.json").write_text(json.dumps({"tables": tables, "sidecars": sidecars}))


def _entry(system, backend, version, table):
    path = f"{system}/{backend}/{version}/{table}.parquet"
    return {"system": system, "backend": backend, "version": version, "table": table, "path": path,
            "sidecar": f"{system}/{backend}/{version}/collection_meta.yaml"}  # fmt: skip


def test_the_data_package_lists_serves_and_verifies_its_files(tmp_path, monkeypatch, capsys):
    """data_api: available() sorted; table_path/sidecar by the exact key; verify() names changed and missing files."""
    tables = [_entry("b200", "vllm", "1.0", "gemm_perf"), _entry("a100", "vllm", "2.0", "gemm_perf"),
              _entry("a100", "vllm", "1.0", "moe_perf")]  # fmt: skip
    files = {"data/a.bin": b"a", "data/b.bin": b"b", "data/c.bin": b"c"}
    _package(tmp_path, files, tables)
    monkeypatch.setattr(data_api, "_HERE", tmp_path)
    assert data_api.available() == [
        ("a100", "vllm", "1.0", "moe_perf"),
        ("a100", "vllm", "2.0", "gemm_perf"),
        ("b200", "vllm", "1.0", "gemm_perf"),
    ]
    assert data_api.table_path("a100", "vllm", "2.0", "gemm_perf") == tmp_path / "data/a100/vllm/2.0/gemm_perf.parquet"
    assert data_api.sidecar("a100", "vllm", "2.0", "gemm_perf") == {"runtime": {"version": "2.0"}}
    assert data_api.verify() == (3, []) and data_api.main() == 0
    assert capsys.readouterr().out == "3 files checked against MANIFEST.json: verified\n"
    (tmp_path / "data/c.bin").write_bytes(b"C")
    (tmp_path / "data/a.bin").unlink()
    assert data_api.verify() == (3, ["data/a.bin", "data/c.bin"])
    assert data_api.main() == 1
    assert capsys.readouterr().out == (
        "differs: data/a.bin\ndiffers: data/c.bin\n3 files checked against MANIFEST.json: 2 differ\n"
    )


def _provenance(events: list[dict], collector: str) -> str:
    table = {"collector_hash": collector, "collector_ref": f"ref-{collector}", "case_plan_hash": f"cp-{collector}"}
    return json.dumps({"tables": {"gemm_perf": {**table, "events": events}}})  # JSON is YAML


def test_the_statement_lists_every_file_and_only_sha256_images_as_dependencies(tmp_path):
    """attest.statement: every artifact, tree file and manifest; sorted facts; only sha256 images as dependencies."""
    tables = tmp_path / "TABLES"
    one, two = tables / "s/gemm/vllm/1.0", tables / "s/gemm/vllm/2.0"
    for directory in (one, two):
        (directory / ".opcollect").mkdir(parents=True)
        (directory / "gemm_perf.parquet").write_bytes(directory.name.encode())
    (one / ".opcollect/provenance.yaml").write_text(
        _provenance([{"plan_hash": "h2", "image": "img:z", "image_digest": "sha256:ff"}, {"plan_hash": "h1"}], "c2")
    )
    (two / ".opcollect/provenance.yaml").write_text(
        _provenance(
            [
                {"plan_hash": "h3", "image": "img:a", "image_digest": "md5:00"},
                {"plan_hash": "h1", "image": "img:b", "image_digest": None},
            ],
            "c1",
        )  # fmt: skip
    )
    (tables / "manifest.json").write_text("{}")
    wheel = tmp_path / "w.whl"
    wheel.write_bytes(b"wheel")
    made = statement(tables, [wheel], "1.2.3", EPOCH, {"torch": {}}, "opcollect@abc")

    def sha(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    assert [(s["name"], s["digest"]["sha256"]) for s in made["subject"]] == [
        ("w.whl", sha(b"wheel")),
        ("tables/s/gemm/vllm/1.0/.opcollect/provenance.yaml", sha((one / ".opcollect/provenance.yaml").read_bytes())),
        ("tables/s/gemm/vllm/1.0/gemm_perf.parquet", sha(b"1.0")),
        ("tables/s/gemm/vllm/2.0/.opcollect/provenance.yaml", sha((two / ".opcollect/provenance.yaml").read_bytes())),
        ("tables/s/gemm/vllm/2.0/gemm_perf.parquet", sha(b"2.0")),
        ("tables/manifest.json", sha(b"{}")),
    ]
    build = made["predicate"]["buildDefinition"]
    assert build["externalParameters"] == {"tables": "TABLES", "version": "1.2.3"}
    assert build["internalParameters"] == {
        "source_date_epoch": EPOCH,
        "pins": {"torch": {}},
        "collector_hashes": ["c1", "c2"],
        "collector_refs": ["ref-c1", "ref-c2"],
        "plan_hashes": ["h1", "h2", "h3"],
        "case_plan_hashes": ["cp-c1", "cp-c2"],
        "images": {"img:a": "md5:00", "img:b": None, "img:z": "sha256:ff"},
    }
    assert list(build["internalParameters"]["images"]) == ["img:a", "img:b", "img:z"]  # sorted, not as met
    assert build["resolvedDependencies"] == [{"uri": "docker://img:z", "digest": {"sha256": "ff"}}]
    assert made["predicate"]["runDetails"] == {
        "builder": {"id": "opcollect@abc"},
        "metadata": {
            "invocationId": "opcollect-release-1.2.3",
            "startedOn": "2023-11-14T22:13:20Z",
            "finishedOn": "2023-11-14T22:13:20Z",
        },
    }


def test_task_states_take_squeue_over_sacct_the_first_word_and_only_this_jobs_tasks(tmp_path, monkeypatch):
    """slurm.task_states: first word of a state, blank UNKNOWN, squeue wins, only this job's tasks, {} not None."""
    sacct = (
        "42_0|COMPLETED\n42_1|CANCELLED by 1000\n42_2|\n142_5|FAILED\n42_4.batch|FAILED\n4_3|FAILED\n42_10|RUNNING\n"
    )
    slurm_says(tmp_path, monkeypatch, sacct, "42_10|PENDING\n")
    assert slurm.task_states("42") == {0: "COMPLETED", 1: "CANCELLED", 2: "UNKNOWN", 10: "PENDING"}
    assert slurm.task_states("7") == {}


@pytest.mark.parametrize("value", ["a" * 128, "0.24.0+cu128", "1.3.0rc20", "v_1-2", "A", "-x", "+x"])
def test_a_name_of_letters_digits_and_dot_plus_dash_underscore_up_to_128_names_a_directory(value):
    """names.path_name: the whole class [A-Za-z0-9._+-], no leading dot, at most 128 characters."""
    assert names.path_name(value, "run.json: runtime field 'version'") == value


@pytest.mark.parametrize("value", ["a" * 129, ".x", "a b", "a/b", "a\\b", "x\n", 1, None, "é"])
def test_anything_else_cannot_name_a_directory(value):
    """names.path_name: 129 characters, a leading dot, a space, a separator, a newline or a non-string is refused."""
    with pytest.raises(InputError, match=r"^f: .* cannot name a directory; it must be letters, digits and \._\+- "):
        names.path_name(value, "f")


def test_framework_and_sm_labels_read_as_the_reference_writes_them():
    """names.framework_name: vLLM's own all-reduce is 'vLLM', else the backend's name; sm_label: 'sm90', 'cpu'."""
    assert names.framework_name("vllm", "custom_allreduce_perf") == "vLLM"
    assert names.framework_name("vllm", "gemm_perf") == "VLLM"
    assert names.framework_name("sglang", "custom_allreduce_perf") == "SGLang"
    assert names.framework_name("other", "gemm_perf") == "other"
    assert names.sm_label("vllm", "90") == "vllm sm90" and names.sm_label("torch", "cpu") == "torch cpu"


def test_a_plot_is_a_png_file_in_a_directory_that_exists(tmp_path):
    """flags.png: any case of .png in an existing directory; a directory, another suffix or a missing parent refused."""
    assert flags.png(str(tmp_path / "r.PNG")) == tmp_path / "r.PNG"
    assert flags.png(str(tmp_path / "r.png")) == tmp_path / "r.png"
    for text, says in (
        (str(tmp_path / "gone" / "r.png"), f"its directory {tmp_path / 'gone'} does not exist; create it first"),
        (str(tmp_path / "r.jpg"), "the plot is a PNG image; give a file name ending in .png"),
        (str(tmp_path), f"is a directory; give a file name in it, e.g. {tmp_path / 'ratio.png'}"),
    ):
        with pytest.raises(argparse.ArgumentTypeError) as refused:
            flags.png(text)
        assert str(refused.value) == f"{text}: {says}"
