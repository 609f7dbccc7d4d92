"""Behaviours of image references, container settings, builds and the CLI's argument checks that no earlier test
held: each test here fails with a small plausible bug planted in the function it names."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from opcollect.cli import build_parser
from opcollect.cli import images as cli_images
from opcollect.cli import tables as cli_tables
from opcollect.errors import InputError
from opcollect.images import build, container
from opcollect.images.sources import check_image_ref, package_dirs

# ---- cases/grids*.py: the validators ---------------------------------------------------------------------------


def test_an_image_reference_is_checked_whole_and_up_to_512_characters():
    """sources.check_image_ref: repo[:tag][@sha256:<64 hex>] anchored at both ends, at most 512 characters."""
    digest = "@sha256:" + "a" * 64
    for good in ("vllm", "nvcr.io/nvidia/vllm:25.01-py3", "vllm/vllm-openai:v0.24.0" + digest, "x" * 512):
        assert check_image_ref(good) == good
    for bad in ("x" * 513, "vllm:1 rm", "vllm:1;x", "Vllm:1", "vllm:1@sha256:" + "a" * 63, ":1", "vllm" + digest + "0"):
        with pytest.raises(InputError, match="not an image reference"):
            check_image_ref(bad)


class _Locating:
    """A Docker client stand-in whose container prints what the image's Python answers."""

    def __init__(self, answer: str):
        self.answer, self.containers = answer, self

    def run(self, ref, command, **kwargs):
        assert kwargs["network_disabled"] is True and kwargs["remove"] is True
        return self.answer.encode()


def test_package_dirs_keep_the_packages_found_at_safe_paths():
    """sources.package_dirs: a banner line and '-' (not installed) are skipped; the path must end in the package."""
    answer = "banner text\nvllm /usr/lib/python3/site-packages/vllm\nflashinfer -\nother /x/other\n"
    assert package_dirs(_Locating(answer), "img:1", ("vllm", "flashinfer")) == {
        "vllm": "/usr/lib/python3/site-packages/vllm"
    }
    for where in ("/usr/lib/../vllm", "usr/lib/vllm", "/usr/lib/vllm2", "/usr/lib/vllm/sub", "/usr/l b/vllm"):
        with pytest.raises(InputError, match=r"image img:1: package vllm reported at an unexpected path"):
            package_dirs(_Locating(f"vllm {where}\n"), "img:1", ("vllm",))


def test_container_options_isolate_the_run_and_mount_only_its_outputs_writable(tmp_path, monkeypatch):
    """container.container_options: read-only run dir, rw shards/events/logs, no network, caps, limits, labels."""
    monkeypatch.setattr(container.os, "getuid", lambda: 1234)
    monkeypatch.setattr(container.os, "getgid", lambda: 567)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (tmp_path / "link").symlink_to(run_dir)  # the mounts and the label name the resolved directory
    run = container.ContainerRun("img:1", tmp_path / "plan.json", tmp_path / "link", "cpu", "all", ())
    options = container.container_options(run, ["run", "--resume"], memlock=4096)
    resolved = str(run_dir.resolve())
    assert options["volumes"] == {
        resolved: {"bind": "/opcollect/run", "mode": "ro"},
        f"{resolved}/shards": {"bind": "/opcollect/run/shards", "mode": "rw"},
        f"{resolved}/events": {"bind": "/opcollect/run/events", "mode": "rw"},
        f"{resolved}/logs": {"bind": "/opcollect/run/logs", "mode": "rw"},
    }
    assert (options["image"], options["command"], options["user"]) == ("img:1", ["run", "--resume"], "1234:567")
    assert options["entrypoint"] == ["python3", "-m", "opcollect"]
    assert (options["cap_drop"], options["security_opt"]) == (["ALL"], ["no-new-privileges"])
    isolation = ("network_mode", "read_only", "init", "ipc_mode")
    assert [options[k] for k in isolation] == ["none", True, True, "host"]
    assert options["tmpfs"] == {"/tmp": "rw,exec,nosuid,nodev,mode=1777"}
    assert (options["environment"], options["working_dir"]) == ({"HOME": "/tmp"}, "/tmp")
    assert options["labels"] == {"io.opcollect.run": "1", "io.opcollect.run-dir": resolved}
    assert options["device_requests"] is None
    limits = {u["Name"]: (u["Soft"], u["Hard"]) for u in options["ulimits"]}
    assert limits == {"memlock": (4096, 4096), "stack": (67108864, 67108864)}
    monkeypatch.setattr(container.os, "getuid", lambda: 0)
    assert container.container_ids() == (65534, 65534)
    assert container.container_options(run, [])["user"] == "65534:65534"


class _Held:
    def __init__(self, short_id: str, status: str, run_dir: str, gone: Exception | None = None):
        self.short_id, self.status, self.labels, self.gone = short_id, status, {container.RUN_DIR_LABEL: run_dir}, gone
        self.stopped = self.removed = False

    def stop(self, timeout):
        assert timeout == container.STOP_SECONDS
        self.stopped = True

    def remove(self, force):
        if self.gone:
            raise self.gone
        self.removed = force


def test_clear_holders_stops_the_live_containers_of_this_run_dir_and_removes_them_all(tmp_path):
    """container.holders/clear_holders: only this run dir's; stop when running, restarting or paused; gone is fine."""
    from docker.errors import APIError, NotFound

    mine, other = str((tmp_path / "run").resolve()), str((tmp_path / "other").resolve())
    held = [_Held(s, s, mine) for s in ("running", "restarting", "paused", "exited", "created")]
    held += [_Held("elsewhere", "running", other), _Held("gone", "exited", mine, NotFound("x"))]
    held.append(_Held("racing", "exited", mine, APIError("removal of container racing is already in progress")))

    class Client:
        containers = None

        def list(self, all, filters):
            assert all is True and filters == {"label": container.RUN_DIR_LABEL}
            return held

    client = Client()
    client.containers = client
    assert [c.short_id for c in container.holders(client, tmp_path / "run")] == [
        "running", "restarting", "paused", "exited", "created", "gone", "racing"
    ]  # fmt: skip
    cleared = container.clear_holders(client, tmp_path / "run")
    assert cleared == [(s, s) for s in ("running", "restarting", "paused", "exited", "created")]
    assert [c.stopped for c in held[:6]] == [True, True, True, False, False, False]
    assert [c.removed for c in held[:6]] == [True] * 5 + [False]
    held.append(_Held("broken", "exited", mine, APIError("server error")))
    with pytest.raises(APIError, match="server error"):
        container.clear_holders(client, tmp_path / "run")


class _Starting:
    """containers.create stand-in: each created container fails its start with the next error (None: it starts)."""

    def __init__(self, errors: list):
        self.errors, self.memlocks, self.removed, self.containers = list(errors), [], 0, self

    def create(self, **options):
        self.memlocks.append({u["Name"]: u["Soft"] for u in options["ulimits"]}["memlock"])
        error, client = self.errors.pop(0), self

        class Created:
            def start(self):
                if error is not None:
                    raise error

            def remove(self, force):
                client.removed += 1

        return Created()


def test_start_retries_once_with_the_hosts_memlock_and_names_a_missing_gpu_runtime(tmp_path, monkeypatch):
    """container._start: an rlimit refusal retries at the host's hard limit; GPU errors say install the toolkit."""
    from docker.errors import APIError

    monkeypatch.setattr(container.resource, "getrlimit", lambda which: (64, 8192))
    run = container.ContainerRun("img:1", tmp_path / "plan.json", tmp_path / "run", "cpu", "all", ())
    said: list[str] = []
    client = _Starting([APIError("setrlimit memlock: operation not permitted"), None])
    assert container._start(client, run, ["run"], said.append) is not None
    assert client.memlocks == [-1, 8192] and client.removed == 1
    assert said == ["warning: the engine refused memlock=unlimited; using the host's limit of 8192 bytes"]
    twice = _Starting([APIError("rlimit a"), APIError("rlimit b")])
    with pytest.raises(InputError, match="starting the container failed: rlimit b"):
        container._start(twice, run, ["run"], said.append)
    assert twice.removed == 2
    for text in ("could not select device driver with capabilities: [[gpu]]", "no GPU here"):
        with pytest.raises(InputError, match=r"GPUs requested but the engine has no NVIDIA runtime \(.*install nvidia"):
            container._start(_Starting([APIError(text)]), run, ["run"], said.append)


def test_a_build_log_keeps_the_failing_steps_lines_and_the_engines_message(monkeypatch):
    """build._stream_build: the log restarts at each 'Step ', errorDetail's message first, the aux ID is the image."""
    plan = SimpleNamespace(tag="opcollect/torch:x", buildargs=lambda: {"A": "1"})

    class Api:
        def __init__(self, chunks):
            self.chunks, self.api, self.images = chunks, self, self

        def build(self, **kwargs):
            assert kwargs["tag"] == plan.tag and kwargs["buildargs"] == {"A": "1"} and kwargs["nocache"] is True
            return iter(self.chunks)

        def get(self, tag):
            return SimpleNamespace(id="sha256:from-get")

    said: list[str] = []
    ok = [{"stream": "Step 1/2 : FROM x\n"}, {"aux": {"ID": "sha256:abc"}}, {"stream": "done\n\n"}]
    assert build._stream_build(Api(ok), None, plan, said.append, True) == "sha256:abc"
    assert said == ["Step 1/2 : FROM x", "done"]
    assert build._stream_build(Api(ok[:1]), None, plan, said.append, True) == "sha256:from-get"
    failing = [
        {"stream": "Step 1/2 : FROM x\n ---> a\n"},
        {"stream": "Step 2/2 : RUN pip\n"},
        {"stream": "pip said no\n  \n"},
        {"error": "generic", "errorDetail": {"message": " The command returned 1 \n"}},
    ]
    with pytest.raises(build.BuildFailed) as failed:
        build._stream_build(Api(failing), None, plan, said.append, True)
    assert (
        str(failed.value)
        == "building opcollect/torch:x failed: The command returned 1\nStep 2/2 : RUN pip\npip said no"
    )
    with pytest.raises(build.BuildFailed, match="failed: generic\n"):
        build._stream_build(Api([{"error": "generic\n", "errorDetail": {}}]), None, plan, said.append, True)
    many = [{"stream": "Step 1/1 : RUN x\n" + "".join(f"line {i}\n" for i in range(50))}, {"error": "e"}]
    with pytest.raises(build.BuildFailed) as failed:
        build._stream_build(Api(many), None, plan, said.append, True)
    assert str(failed.value).splitlines()[1:] == [f"line {i}" for i in range(10, 50)]


# ---- plans/moe.py, plans/attention.py, plans/planner.py -----------------------------------------------------------


def test_image_and_check_verbs_refuse_incomplete_arguments_before_any_work(tmp_path):
    """cli.images.cmd_build/cmd_bump and cli.tables.cmd_check: the one-line refusals of missing or clashing flags."""
    parser = build_parser()

    def refused(argv: list[str], func, message: str) -> None:
        with pytest.raises(InputError, match=message):
            func(parser.parse_args(argv))

    refused(
        ["build"], cli_images.cmd_build, r"build: name a backend \(torch, vllm, sglang or trtllm\), or pass --prune"
    )
    moved = r"bump --moved: give TABLES or OLD_TABLES NEW_TABLES, and no --image \(already pinned\)"
    refused(["bump", "vllm", "--version", "0.25.0", "--moved", "a", "b", "c"], cli_images.cmd_bump, moved)
    refused(["bump", "vllm", "--version", "0.25.0", "--moved", "a", "--image", "x"], cli_images.cmd_bump, moved)
    refused(["bump", "vllm", "--version", "0.25.0"], cli_images.cmd_bump, "bump vllm: --image REF@sha256:D is required")
    one_of = r"check: give TABLES, or --against-physics TREE \(one of them\)"
    refused(["check"], cli_tables.cmd_check, one_of)
    refused(["check", str(tmp_path), "--against-physics", str(tmp_path)], cli_tables.cmd_check, one_of)
    refused(
        ["check", str(tmp_path), "--system", "h200_sxm"], cli_tables.cmd_check, "--system: only with --against-phys"
    )
