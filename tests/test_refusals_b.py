"""Refusals reached from code rather than the command line (or only from a machine state a test cannot make
for real: no debootstrap, no CUDA device, a short write): each calls the real function with the bad input and
checks the exception's type and message."""

from __future__ import annotations

import errno
import io
import json
import platform
import subprocess
import tarfile

import pytest

from opcollect.errors import InputError
from opcollect.runtime.contract import KernelLimit


def test_a_wheel_pip_cannot_build_is_one_input_error(tree_copy):
    from opcollect.images.context import build_wheel
    from opcollect.project import ProjectTree

    (tree_copy / "pyproject.toml").write_text("[project\nname = 'opcollect'\n")  # not TOML
    with pytest.raises(InputError, match=r"building the opcollect wheel failed: (?!\[)\S") as refused:
        build_wheel(ProjectTree(tree_copy), "0" * 64, tree_copy / "dist")
    assert "\n" not in str(refused.value)  # pip's last line, not a Python list of lines


class _NoImages:
    """A Docker client whose engine holds no image at all."""

    class images:
        @staticmethod
        def get(ref):
            from docker.errors import ImageNotFound

            raise ImageNotFound(f"no such image: {ref}")


def test_the_local_base_without_debootstrap_says_how_to_install_it(monkeypatch):
    from opcollect.images import localbase

    monkeypatch.setattr(localbase.shutil, "which", lambda name: None)
    with pytest.raises(InputError, match=r"debootstrap is not installed; `apt-get install debootstrap`"):
        localbase._python_image(_NoImages(), print)


class _ImageWithout:
    """A Docker client holding the image, inside which Python finds none of the packages asked for."""

    def __init__(self):
        self.images = self
        self.containers = self
        self.id = "sha256:" + "0" * 64

    def get(self, ref):
        return self

    def run(self, ref, command, **kwargs):
        return "".join(f"{name} -\n" for name in command).encode()


def test_contract_from_an_image_without_the_package_checked_nothing(tmp_path):
    from opcollect.images.sources import copy_package_sources

    with pytest.raises(InputError, match=r"contract: checked nothing: image vllm:1 has none of vllm installed"):
        copy_package_sources(_ImageWithout(), "vllm:1", ("vllm",), tmp_path)


def test_a_package_name_that_is_not_an_identifier_is_refused_before_docker_runs():
    from opcollect.images.sources import package_dirs

    with pytest.raises(ValueError, match=r"not a package name: 'vllm; rm'"):
        package_dirs(None, "vllm:1", ("vllm; rm",))


def test_an_archive_member_climbing_out_of_its_package_is_refused():
    from opcollect.images.sources import _members

    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as archive:
        body = b"x = 1\n"
        member = tarfile.TarInfo("vllm/../evil.py")
        member.size = len(body)
        archive.addfile(member, io.BytesIO(body))
    data.seek(0)
    with tarfile.open(fileobj=data) as archive:
        with pytest.raises(InputError, match=r"the archive of vllm holds an unsafe path 'vllm/../evil.py'"):
            list(_members(archive, "vllm"))


def test_only_the_regular_py_files_under_the_packages_own_directory_are_copied_out_of_an_image():
    """docker's archive of a package's directory can hold more than the package (a sibling named alike, links):
    the contract reads the package's own sources and nothing else."""
    from opcollect.images.sources import _members

    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as archive:
        for name in ("vllm/a.py", "vllm/sub/b.py", "other/c.py", "vllm/d.txt", "vllmx/e.py", "f.py"):
            member = tarfile.TarInfo(name)
            member.size = 1
            archive.addfile(member, io.BytesIO(b"x"))
        for name, kind in (("vllm/pkg.py", tarfile.DIRTYPE), ("vllm/link.py", tarfile.SYMTYPE)):
            member = tarfile.TarInfo(name)
            member.type, member.linkname = kind, "a.py" if kind == tarfile.SYMTYPE else ""
            archive.addfile(member)
    data.seek(0)
    with tarfile.open(fileobj=data) as archive:
        assert [member.name for member in _members(archive, "vllm")] == ["vllm/a.py", "vllm/sub/b.py"]


def test_a_selection_table_that_is_not_a_mapping_is_refused(tmp_path, monkeypatch):
    from opcollect.plans import selection

    (tmp_path / "listed.yaml").write_text("- 90\n- 100\n")
    monkeypatch.setattr(selection, "SELECTION", tmp_path)
    with pytest.raises(InputError, match=r"listed.yaml: not a selection table \(a YAML mapping\)"):
        selection.table("listed.yaml")


def test_the_data_package_names_a_table_it_does_not_hold(tmp_path, monkeypatch):
    from opcollect.release import data_api

    (tmp_path / "index.json").write_text(json.dumps({"tables": []}))
    monkeypatch.setattr(data_api, "_HERE", tmp_path)
    with pytest.raises(KeyError, match=r"no table 'gemm_perf' of vllm 0.24.0 on h200_sxm; available\(\) lists"):
        data_api.table_path("h200_sxm", "vllm", "0.24.0", "gemm_perf")


def test_tables_without_a_collection_have_no_release_date():
    from opcollect.release.package import newest_collection

    metas = {"h200_sxm/gemm/vllm/0.24.0/collection_meta.yaml": {"tables": {"gemm_perf": {"collections": []}}}}
    with pytest.raises(InputError, match="--tables: no collection in any collection_meta.yaml; merge a run"):
        newest_collection(metas)


def _pip_fails(step: str):
    """A stand-in for verify.run_group where the command containing ``step`` fails with pip's last word."""

    def run_group(command, cwd):
        failed = step in command
        return subprocess.CompletedProcess(command, int(failed), "", "ERROR: no such thing here\n" if failed else "")

    return run_group


@pytest.mark.parametrize(
    "step, message",
    [
        ("ensurepip", r"x.whl: cannot put pip into a fresh venv to verify it \(ERROR: no such thing here\)"),
        ("install", r"x.whl: pip cannot install it into a fresh venv \(ERROR: no such thing here\)"),
    ],
)
def test_verify_names_the_pip_step_that_failed(step, message, tmp_path, monkeypatch):
    from opcollect.release import verify

    monkeypatch.setattr(verify, "run_group", _pip_fails(step))
    with pytest.raises(InputError, match=message):
        verify.verify_wheel(tmp_path / "x.whl")


def test_a_backend_without_a_runner_for_the_op_is_a_kernel_limit():
    from opcollect.runtime.contract import Registry

    with pytest.raises(KernelLimit, match=r"the torch backend has no runner for gemm dispatch 'cutlass' at 1.0"):
        Registry("torch").find("gemm", "cutlass", "1.0")


def test_device_cuda_without_a_cuda_device_says_use_cpu(monkeypatch):
    torch = pytest.importorskip("torch")
    from opcollect.runtime.devices import devices

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(KernelLimit, match="--device cuda: no CUDA device answers; use --device cpu"):
        devices("cuda", None)


def test_a_stopping_rule_that_kept_no_sample_has_no_statistics():
    from opcollect.runtime.harness import Sampled, summarize

    with pytest.raises(RuntimeError, match="no usable sample: 3 dropped"):
        summarize(Sampled([], 0.0, 0.0, 3), "cpu", 1)


def test_a_short_write_to_a_shard_is_a_full_disk(tmp_path, monkeypatch):
    from opcollect.runtime import shards

    writer = shards.ShardWriter(tmp_path / "w0.jsonl")
    monkeypatch.setattr(shards.os, "write", lambda fd, data: len(data) - 1)
    try:
        with pytest.raises(OSError, match=r"short write \(\d+ of \d+ bytes\)") as raised:
            writer.append({"case_id": "a"})
    finally:
        monkeypatch.undo()
        writer.close()
    assert raised.value.errno == errno.ENOSPC


def test_yaml_nested_past_the_pure_python_loader_is_one_line(tmp_path, monkeypatch):
    """Without libyaml (the C loader refuses deep nesting itself) the pure-Python loader recurses."""
    import yaml

    from opcollect import yamlio

    monkeypatch.setattr(yamlio, "_Loader", yaml.SafeLoader)
    path = tmp_path / "deep.yaml"
    path.write_text("[" * 5000 + "]" * 5000)
    with pytest.raises(InputError, match="deep.yaml: YAML nested too deeply; flatten it"):
        yamlio.read_yaml(path, "case file", "flatten it")


def test_the_cpu_model_in_a_workers_identity_is_the_bare_name(tmp_path):
    """It is a provenance value: "model name\t: <name>\n" gives the name without the spaces around it."""
    from opcollect.runtime.devices import _cpu_model

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t:  Intel(R) Xeon(R) CPU @ 2.20GHz \n")
    assert _cpu_model(str(info)) == "Intel(R) Xeon(R) CPU @ 2.20GHz"
    info.write_text("processor\t: 0\n")  # no model line (some ARM kernels): the platform's word, never empty
    assert _cpu_model(str(info)) == (platform.processor() or "cpu")
    assert _cpu_model(str(tmp_path / "absent")) == (platform.processor() or "cpu")
