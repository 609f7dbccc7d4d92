"""`opcollect contract trtllm` without a wheel: the TensorRT-LLM runners against the API skeleton of the source
files they import (tests/data/trtllm-release, assembled by scripts/contract_tree.py), a copy of it doctored to
lose a symbol and a parameter the runners use, the same tree copied out of a local image through the Docker
engine (--image), and the refusal when no release is given.

The skeleton's files are copies from commits of no known tag (its README says, per file and per pinned tag, that
none could be read at a pin, and why), so these tests hold the runners to a plausible TensorRT-LLM API and the
checker's mechanics, not to the pins: at a pin, the check is `contract trtllm --image` and the preflight."""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path

import pytest
from conftest import ROOT, run_cli

from opcollect.backends.symbols import Release, check, runner_uses
from opcollect.images.engine import CONTAINER_LABEL

TREE = Path(__file__).parent / "data" / "trtllm-release"
BACKENDS = ROOT / "src" / "opcollect" / "backends"


def _uses():
    return runner_uses(BACKENDS / "trtllm", ("tensorrt_llm",), ROOT)


def test_every_symbol_the_runners_use_is_in_the_assembled_tree():
    uses = _uses()
    modules = {u.module.split(".")[0] for u in uses}
    assert len(uses) > 40 and modules == {"tensorrt_llm"}
    misses = check(uses, Release(TREE))
    assert misses == [], "\n".join(m.render() for m in misses) + (
        "\nre-assemble tests/data/trtllm-release with scripts/contract_tree.py from a real source tree"
    )
    # every file the tree holds names the commit it was read at
    readme = (TREE / "README.md").read_text()
    for path in TREE.rglob("*.py"):
        rel = path.relative_to(TREE).as_posix()
        assert f"`{rel}`" in readme and path.read_text().startswith(f"# API skeleton of {rel} at NVIDIA/")


def _doctor(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path}: {old!r} not found"
    path.write_text(text.replace(old, new, 1))


def test_a_doctored_tree_fails_at_the_runners_lines(tmp_path):
    copy = tmp_path / "release"
    shutil.copytree(TREE, copy)
    _doctor(copy / "tensorrt_llm/_torch/modules/linear.py", "class Linear(", "class LinearLayer(")
    mapping = "class Mapping(MappingBase):\n\n    def __init__(self, world_size=..., rank=..., gpus_per_node=..., *, "
    _doctor(
        copy / "tensorrt_llm/mapping.py", mapping + "cp_size=..., cp_config=..., tp_size=...,", mapping + "cp_size=...,"
    )
    done = run_cli("contract", "trtllm", "--source", str(copy))
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert any(
        line.startswith("src/opcollect/backends/trtllm/") and "linear.Linear: not defined" in line for line in lines
    ), lines
    assert any("Mapping: no parameter 'tp_size'" in line for line in lines), lines
    assert lines[-1].startswith(f"contract trtllm against {copy}: ") and "missing" in lines[-1]
    good = run_cli("contract", "trtllm", "--source", str(TREE))
    assert good.returncode == 0 and good.stdout.strip().endswith(", 0 missing"), good.stdout + good.stderr


def test_without_a_release_it_checks_nothing_and_exits_2():
    done = run_cli("contract", "trtllm")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "checked nothing" in done.stderr and "no wheel on PyPI" in done.stderr


def _build(client, tag: str, steps: str, tree: Path | None = None) -> str:
    """An image FROM the local torch base with the Dockerfile ``steps``; ``tree`` in its context as tensorrt_llm."""
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as archive:
        dockerfile = f"FROM opcollect-local/torch-cpu:latest\n{steps}".encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        archive.addfile(info, io.BytesIO(dockerfile))
        if tree is not None:
            archive.add(tree, arcname="tensorrt_llm")
    context.seek(0)
    client.images.build(fileobj=context, custom_context=True, tag=tag, rm=True)
    return tag


@pytest.fixture
def source_image(docker_client):
    """A local image whose Python finds the assembled tree as the installed tensorrt_llm."""
    steps = "COPY tensorrt_llm /opt/trtllm/tensorrt_llm\nENV PYTHONPATH=/opt/trtllm\n"
    tag = _build(docker_client, "opcollect-test/trtllm-sources:latest", steps, TREE / "tensorrt_llm")
    yield tag
    docker_client.images.remove(tag, force=True)


def test_image_sources_are_copied_out_through_the_docker_engine(source_image, docker_client):
    done = run_cli("contract", "trtllm", "--image", source_image)
    assert done.returncode == 0, done.stdout + done.stderr
    checked = len([u for u in _uses()])
    assert done.stdout.strip().endswith(f"against image {source_image}: {checked} uses checked, 0 missing")
    assert not docker_client.containers.list(all=True, filters={"label": f"{CONTAINER_LABEL}=contract"})
    absent = run_cli("contract", "trtllm", "--image", "opcollect-test/absent:none")
    assert absent.returncode == 2 and "is not present locally; pull it" in absent.stderr


def test_the_skeleton_says_per_file_whether_it_was_read_at_each_pin():
    from opcollect.images.pins import load_pins

    tags = [f"v{version}" for version in load_pins(ROOT / "pins.yaml").backends["trtllm"].versions]
    readme = (TREE / "README.md").read_text()
    header = next(line for line in readme.splitlines() if line.startswith("| file |"))
    assert all(f"read at {tag}" in header for tag in tags)
    rows = {line.split("`")[1]: line for line in readme.splitlines() if line.startswith("| `")}
    files = {str(p.relative_to(TREE)) for p in TREE.rglob("*.py")}
    assert set(rows) == files
    assert all(row.rstrip().endswith("|" + " no |" * len(tags)) or " yes |" in row for row in rows.values())


@pytest.mark.parametrize(
    "reported",
    ["/usr/lib", "/opt/../etc/tensorrt_llm", "/opt/my tree/tensorrt_llm"],
    ids=["not-named-after-it", "dot-dot", "space"],
)
def test_an_image_reporting_its_package_anywhere_but_a_safe_directory_of_its_name_is_refused(reported, docker_client):
    """An image's python3 answers where the package lives: a directory not named after the package (its parent,
    /usr/lib, would copy a whole tree as the framework), a path climbing out, or one with odd characters is
    refused in one line before anything is copied."""
    steps = (
        f"RUN printf '#!/bin/sh\\necho \"tensorrt_llm {reported}\"\\n' > /usr/local/sbin/python3 "
        "&& chmod +x /usr/local/sbin/python3\n"
    )
    tag = _build(docker_client, "opcollect-test/trtllm-liar:latest", steps)
    try:
        done = run_cli("contract", "trtllm", "--image", tag)
    finally:
        docker_client.images.remove(tag, force=True)
    assert done.returncode == 2, done.stdout + done.stderr
    said = f"image {tag}: package tensorrt_llm reported at an unexpected path {reported!r}"
    assert done.stderr == f"opcollect: error: {said}\n"
    assert not docker_client.containers.list(all=True, filters={"label": f"{CONTAINER_LABEL}=contract"})
