"""Images and containerized collection against a real Docker engine (no mocks of Docker)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, run_cli

from opcollect.images.context import plan_build, render_context
from opcollect.images.engine import CONTAINER_LABEL
from opcollect.images.pins import load_pins
from opcollect.project import ProjectTree, find_project
from opcollect.runtime.rundir import read_records

LOCAL = "opcollect-local/torch-cpu:latest"


def _leftovers(client) -> list:
    return client.containers.list(all=True, filters={"label": CONTAINER_LABEL})


def _tag(stdout: str) -> str:
    return stdout.strip().splitlines()[-1].split()[0]  # the summary line: "<tag> (built|cache hit in ...)"


def _collect(tmp_path, *args):
    """`opcollect collect torch` on the local base, with its run directory and tables in tmp_path."""
    return run_cli(
        "collect",
        "torch",
        "--base-image",
        LOCAL,
        *args,
        "--out",
        str(tmp_path / "run"),
        "--tables",
        str(tmp_path / "tables"),
    )


def _build(*args, root=None):
    extra = ["--root", str(root)] if root else []
    return run_cli("build", "torch", "--base-image", LOCAL, *extra, *args)


def test_build_cache_hit_and_rebuild_after_a_source_edit(docker_client, tree_copy):
    first = _build(root=tree_copy)
    assert first.returncode == 0, first.stderr[-2000:]
    tag = _tag(first.stdout)
    image = docker_client.images.get(tag)
    labels = image.labels
    assert labels["io.opcollect.backend"] == "torch" and labels["org.opencontainers.image.base.name"] == LOCAL
    assert labels["org.opencontainers.image.base.digest"] == docker_client.images.get(LOCAL).id
    assert labels["io.opcollect.input-hash"].startswith(tag.rsplit("-", 1)[1])
    assert image.attrs["Config"]["Entrypoint"] == ["python3", "-m", "opcollect"]
    again = _build(root=tree_copy)
    assert again.returncode == 0 and "cache hit" in again.stdout and _tag(again.stdout) == tag
    source = tree_copy / "src" / "opcollect" / "plans" / "skips.py"
    source.write_text(source.read_text() + "# one more line\n")
    edited = _build("--root", str(tree_copy))
    assert edited.returncode == 0, edited.stderr[-2000:]
    new_tag = _tag(edited.stdout)
    assert new_tag != tag and "built in" in edited.stdout
    log = edited.stdout
    requirements_step = log[log.index("-r /tmp/opcollect/requirements.txt") :]
    assert requirements_step.split("\n", 2)[1].strip() == "---> Using cache"  # only the layers after the wheel rebuild
    inside = (
        docker_client.containers.run(
            new_tag,
            entrypoint=[
                "python3",
                "-c",
                ("from opcollect.plans.hashes import installed_collector_hash; print(installed_collector_hash())"),
            ],
            remove=True,
        )
        .decode()
        .strip()
    )
    assert inside == docker_client.images.get(new_tag).labels["io.opcollect.collector-hash"]
    for t in (tag, new_tag):
        docker_client.images.remove(t, force=True)


def test_containerized_smoke_collection_merges_checks_and_verifies(docker_client, tmp_path):
    run_dir, tables = tmp_path / "run", tmp_path / "tables"
    done = _collect(tmp_path, "--device", "cpu", "--smoke")
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    records = read_records(run_dir)
    assert len(records) >= 20 and all(r["status"] == "ok" for r in records)
    assert "0 violations" in done.stdout
    assert run_cli("verify", str(tables)).returncode == 0
    meta = (tables / "cpu/gemm/torch").glob("*/collection_meta.yaml")
    text = next(meta).read_text()
    assert f"image: {LOCAL}" in text and docker_client.images.get(LOCAL).id in text
    assert _leftovers(docker_client) == []


def test_failed_run_removes_its_container(docker_client, tmp_path):
    # a plan for SM 90 refused by the runtime on the CPU inside the container
    done = _collect(tmp_path, "--device", "cpu", "--sm", "90", "--ops", "comm")
    assert done.returncode == 2 and "exited with code 2" in done.stderr
    assert "the plan is for sm 90 but cpu is sm cpu" in done.stdout
    assert _leftovers(docker_client) == []


def test_interrupted_container_run_resumes_to_a_complete_table(docker_client, tmp_path):
    run_dir, tables = tmp_path / "run", tmp_path / "tables"
    args = [
        sys.executable,
        "-m",
        "opcollect",
        "collect",
        "torch",
        "--base-image",
        LOCAL,
        "--device",
        "cpu",
        "--smoke",
        "--ops",
        "gemm,attention_context,moe",
        "--max-noise",
        "0",
        "--max-case-seconds",
        "0.8",
        "--out",
        str(run_dir),
        "--tables",
        str(tables),
    ]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if (run_dir / "shards").is_dir() and len(read_records(run_dir)) >= 3:
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out[-1000:], err[-2000:])
    assert "run the same command again to resume" in err
    assert _leftovers(docker_client) == []
    partial = len(read_records(run_dir))
    assert 3 <= partial < 12
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    ids = [r["case_id"] for r in read_records(run_dir)]
    assert len(ids) == len(set(ids)) == 12
    assert "0 of 12 planned cases missing" in done.stdout and run_cli("verify", str(tables)).returncode == 0


def test_gpu_request_without_nvidia_runtime_is_one_line(docker_client, tmp_path):
    done = _collect(tmp_path, "--device", "cuda", "--sm", "90", "--ops", "comm")
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "no NVIDIA runtime" in done.stderr
    assert _leftovers(docker_client) == []


def test_pinned_image_that_cannot_be_pulled_is_named(docker_client):
    done = run_cli("build", "vllm")
    pin = load_pins(ROOT / "pins.yaml").pin("vllm")[1].image
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0
    assert f"image {pin} is not present and cannot be pulled" in done.stderr


def test_no_engine_is_one_line_and_exit_2(tmp_path):
    env = {"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}  # the Docker SDK's own setting, pointed nowhere
    done = run_cli("build", "torch", "--base-image", LOCAL, env=env)
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0
    assert "no Docker engine answers" in done.stderr and "--local" in done.stderr


@pytest.mark.parametrize("backend", ["vllm", "sglang", "trtllm", "torch"])
def test_framework_build_contexts_render(backend, tmp_path):
    """Their base images cannot be pulled here; the rendered context must still be right."""
    tree = find_project()
    plan = plan_build(tree, backend)
    version, pin = load_pins(tree.pins).pin(backend)
    assert plan.buildargs()["BASE_IMAGE"] == pin.image and plan.base_digest == pin.digest
    assert plan.tag == f"opcollect/{backend}:{version}-{plan.input_hash[:12]}"
    context = render_context(plan, tree, tmp_path / "ctx")
    dockerfile = (context / "Dockerfile").read_text()
    lines = [line.strip() for line in dockerfile.splitlines()]
    assert lines[lines.index("ARG BASE_IMAGE") + 1] == "FROM ${BASE_IMAGE}"
    assert 'ENTRYPOINT ["python3", "-m", "opcollect"]' in lines
    for label in (
        "org.opencontainers.image.created",
        "org.opencontainers.image.source",
        "org.opencontainers.image.revision",
        "org.opencontainers.image.version",
        "org.opencontainers.image.base.name",
        "org.opencontainers.image.base.digest",
        "io.opcollect.collector-hash",
        "io.opcollect.pins-entry-hash",
        "io.opcollect.input-hash",
    ):
        assert f"{label}=" in dockerfile
    assert not any(line.startswith(("# syntax", "RUN --mount")) or "<<" in line for line in lines)  # classic builder
    for arg in ("BASE_DIGEST", "COLLECTOR_HASH", "PINS_ENTRY_HASH", "INPUT_HASH", "OCI_CREATED"):
        assert f"ARG {arg}" in lines and plan.buildargs()[arg]
    [wheel] = list((context / "dist").glob("opcollect-*-py3-none-any.whl"))
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        assert archive.read("opcollect/collector_hash.txt").decode().strip() == plan.collector_hash
    assert (context / "requirements.txt").read_text().split() == ["pyyaml>=6.0", "pydantic>=2.6", "rich>=13.0"]


def test_input_hash_follows_its_inputs(tree_copy):
    tree = ProjectTree(tree_copy)
    base = plan_build(tree, "vllm").input_hash
    assert plan_build(tree, "vllm").input_hash == base
    dockerfile = tree_copy / "images" / "vllm" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "\n")
    assert plan_build(tree, "vllm").input_hash != base
    other = plan_build(tree, "vllm", base_image="vllm/vllm-openai:v0.25.0@sha256:" + "1" * 64)
    assert other.input_hash != base and other.version is None


def test_failed_build_prints_the_failing_step_and_exits_2(docker_client, tree_copy):
    dockerfile = tree_copy / "images" / "torch" / "Dockerfile"
    text = dockerfile.read_text().replace("COPY dist/", "RUN echo about to fail && exit 3\nCOPY dist/", 1)
    dockerfile.write_text(text)
    done = _build(root=tree_copy)
    assert done.returncode == 2
    assert "failed: The command '/bin/sh -c echo about to fail && exit 3' returned a non-zero code: 3" in done.stderr
    assert "RUN echo about to fail && exit 3" in done.stderr and "about to fail" in done.stderr  # the step's log
    assert _leftovers(docker_client) == []
