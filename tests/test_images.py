"""Images and containerized collection against a real Docker engine (no mocks of Docker)."""

from __future__ import annotations

import io
import json
import os
import queue
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT, run_cli
from docker.errors import ImageNotFound

from opcollect.errors import InputError
from opcollect.images.container import (
    RUN_DIR_LABEL,
    ContainerRun,
    Interrupted,
    container_options,
    run_container,
)
from opcollect.images.context import plan_build, render_context
from opcollect.images.engine import CONTAINER_LABEL
from opcollect.images.pins import load_pins
from opcollect.project import ProjectTree, find_project
from opcollect.runtime.rundir import read_records

LOCAL = "opcollect-local/torch-cpu:latest"
FOREIGN = "someone-else/kept:1"  # a user's own tag on a collector image


def _inside(path: str | None, root: Path) -> bool:
    return path is not None and (Path(path) == root or root in Path(path).parents)


def _leftovers(client, under: Path) -> list:
    """This project's containers of this test: those labelled with a run directory under ``under`` or mounting a
    path under it. Never the whole engine: other test runs and users share it, and their containers are theirs."""
    root = Path(under).resolve()
    found = client.containers.list(all=True, filters={"label": CONTAINER_LABEL})
    return [
        c
        for c in found
        if _inside(c.labels.get(RUN_DIR_LABEL), root) or any(_inside(m.get("Source"), root) for m in c.attrs["Mounts"])
    ]


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
    [directory] = [p.parent for p in (tables / "cpu/gemm/torch").glob("*/collection_meta.yaml")]
    for name in ("collection_meta.yaml", ".opcollect/provenance.yaml"):  # the consumer's, and our record
        text = (directory / name).read_text()
        assert f"image: {LOCAL}" in text and docker_client.images.get(LOCAL).id in text, name
    assert _leftovers(docker_client, tmp_path) == []


def test_failed_run_removes_its_container(docker_client, tmp_path):
    # a plan for SM 90 refused by the runtime on the CPU inside the container
    done = _collect(tmp_path, "--device", "cpu", "--sm", "90", "--ops", "comm")
    assert done.returncode == 2 and "exited with code 2" in done.stderr
    assert "the plan is for sm 90 but cpu is sm cpu" in done.stdout
    assert _leftovers(docker_client, tmp_path) == []


def test_interrupted_container_run_resumes_to_a_complete_table(docker_client, tmp_path):
    run_dir, tables = tmp_path / "run", tmp_path / "tables"
    args = [*_smoke_args(run_dir, tables), "--ops", "gemm,attention_context,moe"]
    args += ["--max-noise", "0", "--max-case-seconds", "0.8"]
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
    assert _leftovers(docker_client, tmp_path) == []
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
    assert _leftovers(docker_client, tmp_path) == []


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


def test_a_malformed_docker_host_is_one_line_and_exit_2():
    for host, reason in (("tcp://256.1.1.1:99999", "Port out of range"), ("tcp://[::1:2375", "Invalid IPv6 URL")):
        done = run_cli("build", "torch", env={"DOCKER_HOST": host}, timeout=120)
        assert done.returncode == 2 and done.stderr.strip().count("\n") == 0, done.stderr
        assert f"DOCKER_HOST {host!r}: not an engine address ({reason}" in done.stderr


def test_leftovers_are_the_containers_of_this_test_only(tmp_path):
    """Two test runs share one engine: each looks only at containers of its own directories."""

    class Container:
        def __init__(self, run_dir, mounts):
            self.labels = {CONTAINER_LABEL: "1", **({RUN_DIR_LABEL: str(run_dir)} if run_dir else {})}
            self.attrs = {"Mounts": [{"Source": str(m)} for m in mounts]}

    mine = [Container(tmp_path / "run", [tmp_path / "run"]), Container(None, [tmp_path / "run" / "plan.json"])]
    theirs = [
        Container(tmp_path.parent / "other" / "run", [tmp_path.parent / "other" / "run"]),
        Container(f"{tmp_path}0/run", [f"{tmp_path}0/run"]),  # a sibling whose name starts with ours
        Container(None, []),  # a contract container of someone else
    ]

    class Client:
        class containers:
            @staticmethod
            def list(all, filters):
                assert all and filters == {"label": CONTAINER_LABEL}
                return mine + theirs

    assert _leftovers(Client, tmp_path) == mine


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


def test_a_pinned_version_picks_its_own_image_and_an_unpinned_one_is_refused():
    """TensorRT-LLM keeps two pins: --version builds on the older one's image, with its own tag and hash."""
    tree = find_project()
    pins = load_pins(tree.pins)
    current, older = pins.backends["trtllm"].current, "1.3.0rc20"
    assert current != older and older in pins.backends["trtllm"].versions
    new, old = plan_build(tree, "trtllm"), plan_build(tree, "trtllm", version=older)
    assert new.version == current and old.version == older
    assert old.base_image == pins.pin("trtllm", older)[1].image and old.base_image != new.base_image
    assert old.tag.startswith(f"opcollect/trtllm:{older}-") and old.input_hash != new.input_hash
    with pytest.raises(InputError, match="has no version '1.3.0rc99'; pinned: 1.3.0rc23, 1.3.0rc20"):
        plan_build(tree, "trtllm", version="1.3.0rc99")


def test_failed_build_prints_the_failing_step_and_exits_2(docker_client, tree_copy):
    dockerfile = tree_copy / "images" / "torch" / "Dockerfile"
    text = dockerfile.read_text().replace("COPY dist/", "RUN echo about to fail && exit 3\nCOPY dist/", 1)
    dockerfile.write_text(text)
    done = _build(root=tree_copy)
    assert done.returncode == 2
    assert "failed: The command '/bin/sh -c echo about to fail && exit 3' returned a non-zero code: 3" in done.stderr
    assert "RUN echo about to fail && exit 3" in done.stderr and "about to fail" in done.stderr  # the step's log
    assert _leftovers(docker_client, tree_copy) == []


# -- Ctrl-C during start-up, isolation of the container, pruning ------------------------------------------


def _main_tag(docker_client) -> str:
    built = _build()
    assert built.returncode == 0, built.stderr[-2000:]
    return _tag(built.stdout)


def _plan(path, ops: str):
    done = run_cli("plan", "--backend", "torch", "--sm", "cpu", "--ops", ops, "--smoke", "-o", str(path))
    assert done.returncode == 0, done.stderr[-2000:]
    return path


def _smoke_args(run_dir, tables) -> list[str]:
    return [
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
        "--out",
        str(run_dir),
        "--tables",
        str(tables),
    ]


def _interrupt_when(args: list[str], marks: tuple[str, ...], delay: float) -> tuple[int, str]:
    """Start ARGS, send SIGINT ``delay`` s after a line with one of ``marks`` appears; (exit code, output)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True)
    reader.start()
    seen, deadline = [], time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            seen.append(lines.get(timeout=0.5))
        except queue.Empty:
            assert proc.poll() is None, "".join(seen)[-2000:]
            continue
        if any(mark in seen[-1] for mark in marks):
            break
    else:
        raise AssertionError(f"no line with {marks}: {''.join(seen)[-2000:]}")
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    reader.join(timeout=10)
    while not lines.empty():
        seen.append(lines.get())
    return proc.returncode, "".join(seen)


def _plant_holder(docker_client, tag: str, run_dir) -> None:
    """A container holding RUN_DIR the way a collect left behind by a crash would: labelled, running."""
    run = ContainerRun(tag, run_dir / "plan.json", run_dir, "cpu", "all", ())
    memlock = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    options = container_options(run, ["-c", "import time; time.sleep(600)"], memlock)
    docker_client.containers.create(**{**options, "entrypoint": ["python3"]}).start()


def test_ctrl_c_at_any_point_of_start_up_leaves_no_container_and_resumes_once(docker_client, tmp_path):
    tag = _main_tag(docker_client)
    run_dir, tables = tmp_path / "run", tmp_path / "tables"
    args = _smoke_args(run_dir, tables)
    built = ("cache hit: ", "Successfully tagged ")  # the image is ready: create and start follow at once
    started = ("Ctrl-C stops it and keeps the shards",)  # the container runs; `opcollect run` starts up in it
    points = [(built, d) for d in (0.0, 0.05, 0.15, 0.3, 0.5, 0.8)] + [(started, d) for d in (0.0, 0.5, 1.5)]
    for marks, delay in points:
        code, out = _interrupt_when(args, marks, delay)
        assert code == 130 and "run the same command again to resume" in out, (marks, delay, out[-2000:])
        assert _leftovers(docker_client, tmp_path) == [], (marks, delay)
    _plant_holder(docker_client, tag, run_dir)  # as if an earlier collect had died and left its container
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    assert f"left holding {run_dir.resolve()} by an earlier collect" in done.stdout
    planned = int(re.search(r"0 of (\d+) planned cases missing", done.stdout).group(1))
    ids = [r["case_id"] for r in read_records(run_dir)]
    assert len(ids) == len(set(ids)) == planned >= 20  # every planned case exactly once
    assert _leftovers(docker_client, tmp_path) == []


class _InterruptAfter:
    """The real client, but a KeyboardInterrupt arrives right after the engine answered create or start."""

    def __init__(self, client, point: str):
        self._client, self._point = client, point

    def __getattr__(self, name):
        return getattr(self._client, name)

    @property
    def containers(self):
        point, real = self._point, self._client.containers

        class Containers:
            def __getattr__(self, name):
                return getattr(real, name)

            def create(self, *args, **kwargs):
                container = real.create(*args, **kwargs)
                if point == "create":
                    raise KeyboardInterrupt  # the engine made it; its answer never reached the caller
                start = container.start

                def start_then_interrupt(*a, **k):
                    start(*a, **k)
                    raise KeyboardInterrupt

                container.start = start_then_interrupt
                return container

        return Containers()


@pytest.mark.parametrize("point", ["create", "start"])
def test_interrupt_right_after_the_engine_answers_removes_the_container(docker_client, tmp_path, point):
    tag = _main_tag(docker_client)
    plan = _plan(tmp_path / "plan.json", "gemm")
    run = ContainerRun(tag, plan, tmp_path / "run", "cpu", "all", ())
    try:
        run_container(_InterruptAfter(docker_client, point), run, say=lambda line: None)
        raised = None
    except (Interrupted, KeyboardInterrupt) as exc:
        raised = exc
    left = _leftovers(docker_client, tmp_path)
    for container in left:
        container.remove(force=True)
    assert left == [] and isinstance(raised, Interrupted), (left, raised)


_CONFINED = """
import json, os
def attempt(action):
    try:
        action()
        return "done"
    except OSError as exc:
        return exc.strerror
run = "/opcollect/run"
status = open("/proc/self/status").read()
print(json.dumps({
    "write shard dir": attempt(lambda: open(f"{run}/shards/probe.tmp", "wb").write(b"{}")),
    "write plan": attempt(lambda: open(f"{run}/plan.json", "r+b").write(b"{}")),
    "truncate plan": attempt(lambda: open(f"{run}/plan.json", "wb")),
    "unlink plan": attempt(lambda: os.unlink(f"{run}/plan.json")),
    "replace plan": attempt(lambda: os.replace(f"{run}/shards/probe.tmp", f"{run}/plan.json")),
    "chmod plan": attempt(lambda: os.chmod(f"{run}/plan.json", 0o666)),
    "write run.json": attempt(lambda: open(f"{run}/run.json", "wb")),
    "new file in run dir": attempt(lambda: open(f"{run}/other", "wb")),
    "write events dir": attempt(lambda: open(f"{run}/events/probe.tmp", "wb")),
    "write logs dir": attempt(lambda: open(f"{run}/logs/probe.tmp", "wb")),
    "write rootfs": attempt(lambda: open("/usr/lib/probe", "wb")),
    "write tmp": attempt(lambda: open("/tmp/probe", "wb")),
    "read plan": attempt(lambda: open(f"{run}/plan.json", "rb").read()),
    "uid": os.getuid(),
    "caps": status.split("CapEff:")[1].split()[0],
    "no new privs": status.split("NoNewPrivs:")[1].split()[0],
    "interfaces": sorted(os.listdir("/sys/class/net")),
}))
"""


def test_the_collect_container_cannot_modify_its_plan_and_runs_confined(docker_client, tmp_path):
    """docker exec into the container of a running collect, as its user and as root: the plan stays as it was."""
    run_dir = tmp_path / "run"
    args = _smoke_args(run_dir, tmp_path / "tables") + ["--ops", "gemm,attention_context,moe", "--max-noise", "0"]
    proc = subprocess.Popen(args + ["--max-case-seconds", "0.8"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        deadline, running = time.monotonic() + 120, []
        while not running and time.monotonic() < deadline and proc.poll() is None:
            if (run_dir / "run.json").exists():
                running = [c for c in _leftovers(docker_client, tmp_path) if c.status == "running"]
            time.sleep(0.1)
        assert running, "no collection container ran"
        [container] = running
        plan_bytes, identity_bytes = (run_dir / "plan.json").read_bytes(), (run_dir / "run.json").read_bytes()
        seen = {}
        for user in ("", "0:0"):  # the container's user, and root inside: the mounts hold even then
            code, output = container.exec_run(["python3", "-c", _CONFINED], user=user)
            assert code == 0, output.decode()[-2000:]
            seen[user or "run"] = json.loads(output.decode().strip().splitlines()[-1])
        host_config = docker_client.api.inspect_container(container.id)["HostConfig"]
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            for left in _leftovers(docker_client, tmp_path):
                left.remove(force=True)
    assert proc.returncode == 0 and "0 of 12 planned cases missing" in out, out[-2000:]
    assert (run_dir / "plan.json").read_bytes() == plan_bytes and (run_dir / "run.json").read_bytes() == identity_bytes
    for action in ("write plan", "truncate plan", "unlink plan", "chmod plan", "write run.json", "new file in run dir"):
        assert seen["run"][action] in ("Read-only file system", "Permission denied"), (action, seen)
        assert seen["0:0"][action] == "Read-only file system", (action, seen)  # the mount, not the file mode
    for action in ("write shard dir", "write events dir", "write logs dir", "write tmp", "read plan"):
        assert seen["run"][action] == "done", (action, seen)
    for outcome in seen.values():
        assert outcome["write rootfs"] == "Read-only file system" and outcome["replace plan"] != "done"
        assert outcome["caps"] == "0000000000000000" and outcome["no new privs"] == "1"
        assert outcome["interfaces"] == ["lo"]
    assert seen["run"]["uid"] == (65534 if os.getuid() == 0 else os.getuid())
    assert host_config["CapDrop"] == ["ALL"] and "no-new-privileges" in host_config["SecurityOpt"]
    assert host_config["NetworkMode"] == "none" and host_config["ReadonlyRootfs"] is True
    assert _leftovers(docker_client, tmp_path) == []


def test_prune_keeps_the_current_image_and_removes_the_older_one(docker_client, tree_copy):
    main_tag = _main_tag(docker_client)
    # every collector image here now (the checkout's, and any of others sharing this engine) is held by a
    # created container: prune must name and keep it, and the test touches nothing it did not build
    others = docker_client.images.list(filters={"label": "io.opcollect.input-hash"})
    keepers = [docker_client.containers.create(image.id, labels={"io.opcollect.test": "prune"}) for image in others]
    source = tree_copy / "src" / "opcollect" / "plans" / "skips.py"
    try:
        source.write_text(source.read_text() + "# an image of its own\n")  # not the checkout's image
        first = _build(root=tree_copy)
        assert first.returncode == 0, first.stderr[-2000:]
        old_tag = _tag(first.stdout)
        source.write_text(source.read_text() + "# and a newer one\n")
        second = _build(root=tree_copy)
        assert second.returncode == 0, second.stderr[-2000:]
        new_tag = _tag(second.stdout)
        assert new_tag != old_tag
        # a stale collector image the user also tagged outside opcollect/: theirs, never pruned
        dockerfile = f"FROM {LOCAL}\nLABEL io.opcollect.input-hash=stale io.opcollect.backend=torch\n"
        foreign, _ = docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=FOREIGN, rm=True)
        foreign.tag("opcollect/torch", "stale-and-theirs")
        done = run_cli("build", "--prune", "--root", str(tree_copy))
        assert done.returncode == 0, done.stderr[-2000:]
        again = run_cli("build", "--prune", "torch", "--root", str(tree_copy))
        assert docker_client.images.get(FOREIGN).id == foreign.id and "stale-and-theirs" not in done.stdout
    finally:
        for holder in keepers:
            holder.remove(force=True)
        for tag in (FOREIGN, "opcollect/torch:stale-and-theirs"):
            try:
                docker_client.images.remove(tag)
            except ImageNotFound:
                pass
    removed = re.findall(r"^removed (\S+)", done.stdout, re.M)
    assert removed == [old_tag] and f"kept {new_tag} (current)" in done.stdout, done.stdout
    assert f"kept {main_tag}: container" in done.stdout  # stale for tree_copy, but a container uses it
    freed = int(re.search(r"pruned 1 images, freed (\d+) bytes", done.stdout).group(1))
    assert freed > 0  # the layers only the old image had: its wheel and the labels
    with pytest.raises(ImageNotFound):
        docker_client.images.get(old_tag)
    for kept in (new_tag, main_tag, LOCAL):  # the local base is never a candidate
        docker_client.images.get(kept)
    assert again.returncode == 0 and "pruned 0 images" in again.stdout
    docker_client.images.remove(new_tag)


def test_ctrl_c_is_noted_for_the_follower_and_held_back_only_on_the_main_thread():
    from opcollect.images.container import _check_ctrl_c, _sigint_held, ctrl_c_noted

    with ctrl_c_noted():
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler raises at the next bytecode; never reached
        with pytest.raises(KeyboardInterrupt):
            _check_ctrl_c()  # the note stays: a Ctrl-C a finalizer swallowed still stops the follower
    _check_ctrl_c()  # the note ends with the block
    with pytest.raises(KeyboardInterrupt):
        with _sigint_held():
            os.kill(os.getpid(), signal.SIGINT)
            held_through = True  # the block ran to its end; the Ctrl-C came after it
    assert held_through
    with _sigint_held(reraise=False):
        os.kill(os.getpid(), signal.SIGINT)  # dropped
    # off the main thread no handler can be set: both blocks just run
    ran: list[str] = []

    def worker():
        with ctrl_c_noted():
            ran.append("noted")
        with _sigint_held():
            ran.append("held")

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert ran == ["noted", "held"]


def test_a_container_that_cannot_start_is_removed_and_named_in_one_line(docker_client, tmp_path):
    """The engine cannot make the shards/ mount (a dangling link there): the start fails, the line gives the
    engine's reason, and the created container is removed again."""
    from opcollect.images.container import _start

    run_dir = tmp_path / "a-run-directory-whose-name-makes-the-reason-longer-than-the-line-keeps" / "run"
    for sub in ("events", "logs"):
        (run_dir / sub).mkdir(parents=True)
    (run_dir / "shards").symlink_to(tmp_path / "nowhere")
    run = ContainerRun(LOCAL, tmp_path / "plan.json", run_dir, "cpu", "all", ())
    said: list[str] = []
    with pytest.raises(InputError) as refused:
        _start(docker_client, run, ["--version"], said.append)
    left = _leftovers(docker_client, tmp_path)
    for container in left:
        container.remove(force=True)
    shards = run_dir.resolve() / "shards"
    reason = f"error while creating mount source path '{shards}': mkdir {shards}: file exists"
    assert len(reason) > 200 and str(refused.value) == f"starting the container failed: {reason[:200]}"  # cut short
    assert said == [] and left == []


def test_clearing_holders_passes_over_one_removed_meanwhile(docker_client, tmp_path):
    from opcollect.images.container import clear_holders

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    options = container_options(ContainerRun(LOCAL, tmp_path / "plan.json", run_dir, "cpu", "all", ()), ["--version"])
    first, second = (docker_client.containers.create(**options) for _ in range(2))

    class RemovesTheFirstMeanwhile:
        """The real engine; the first holder goes (another collect's cleanup) between the listing and its removal."""

        def __getattr__(self, name):
            return getattr(docker_client, name)

        class containers:
            @staticmethod
            def list(**kwargs):
                found = docker_client.containers.list(**kwargs)
                first.remove(force=True)
                return found

    try:
        cleared = clear_holders(RemovesTheFirstMeanwhile(), run_dir)
        assert cleared == [(second.short_id, "created")]
        assert _leftovers(docker_client, tmp_path) == []
    finally:
        for left in _leftovers(docker_client, tmp_path):
            left.remove(force=True)
