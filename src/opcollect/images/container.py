"""Run a plan inside the collector image: mounts, user, isolation, GPUs, limits, logs, and removal in every case.

The run directory is mounted read-only (its plan.json and run.json with it) and only its shards/, events/
and logs/ read-write on top, so the container cannot rewrite the plan it runs. The host therefore writes
run.json before the start (prepare_run_dir), and `run` inside always resumes.

Ctrl-C at any point between create and the end of the run stops and removes the container: create and
start run with SIGINT held back until they return (so the container is known), and the cleanup removes
every container labelled with this run directory, including one whose create answer never arrived.
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import stat
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from opcollect.errors import InputError
from opcollect.images.engine import CONTAINER_LABEL

RUN_IN = "/opcollect/run"
PLAN_IN = f"{RUN_IN}/plan.json"  # read-only with the rest of the run directory
WRITABLE = ("shards", "events", "logs")  # the only parts of the run directory the container may write
RUN_DIR_LABEL = "io.opcollect.run-dir"  # the resolved host path of the run directory a container holds
UNPRIVILEGED = (65534, 65534)  # nobody:nogroup, the container's user when the invoking user is root
STOP_SECONDS = 10
STACK_BYTES = 67108864  # the frameworks' recommended --ulimit stack


@dataclass(frozen=True)
class ContainerRun:
    image: str
    plan_path: Path
    run_dir: Path
    device: str  # cpu or cuda
    gpus: str  # all, or device indices such as 0,1
    run_args: tuple[str, ...]  # flags for `opcollect run` after --plan/--out/--device/--resume


class Interrupted(Exception):
    """Ctrl-C stopped the container; the shards written so far are kept."""


def _device_requests(run: ContainerRun):
    if run.device != "cuda":
        return None
    import docker

    if run.gpus == "all":
        return [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
    return [docker.types.DeviceRequest(device_ids=[g.strip() for g in run.gpus.split(",")], capabilities=[["gpu"]])]


def _ulimits(memlock: int):
    import docker

    return [
        docker.types.Ulimit(name="memlock", soft=memlock, hard=memlock),
        docker.types.Ulimit(name="stack", soft=STACK_BYTES, hard=STACK_BYTES),
    ]


def container_ids() -> tuple[int, int]:
    """The container's uid:gid: the invoking user's, or an unprivileged one instead of root."""
    return UNPRIVILEGED if os.getuid() == 0 else (os.getuid(), os.getgid())


def container_options(run: ContainerRun, command: list[str], memlock: int = -1) -> dict:
    """Keyword arguments of containers.create for this run (tests create with them too)."""
    run_dir = run.run_dir.resolve()
    volumes = {str(run_dir): {"bind": RUN_IN, "mode": "ro"}}
    volumes.update({str(run_dir / sub): {"bind": f"{RUN_IN}/{sub}", "mode": "rw"} for sub in WRITABLE})
    uid, gid = container_ids()
    return dict(
        image=run.image,
        command=command,
        entrypoint=["python3", "-m", "opcollect"],
        volumes=volumes,
        user=f"{uid}:{gid}",
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        network_mode="none",  # gloo (and NCCL's bootstrap) rendezvous over loopback, which remains
        read_only=True,
        tmpfs={"/tmp": "rw,exec,nosuid,nodev,mode=1777"},  # exec: JIT caches (triton, inductor) load from HOME
        init=True,  # docker-init as PID 1: SIGTERM from `docker stop` reaches `opcollect run` at once
        ipc_mode="host",
        hostname=socket.gethostname(),
        ulimits=_ulimits(memlock),
        device_requests=_device_requests(run),
        environment={"HOME": "/tmp"},
        working_dir="/tmp",
        labels={CONTAINER_LABEL: "1", RUN_DIR_LABEL: str(run_dir)},
    )


_ctrl_c = threading.Event()  # set by a Ctrl-C inside ctrl_c_noted()


@contextmanager
def ctrl_c_noted():
    """Ctrl-C raises KeyboardInterrupt as usual and is noted too: Python drops an exception raised while a
    finalizer runs (e.g. one closing a Docker connection), and run_container checks the note before it
    creates the container and while it follows it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def note(signum, frame):
        _ctrl_c.set()
        raise KeyboardInterrupt

    _ctrl_c.clear()
    previous = signal.signal(signal.SIGINT, note)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        _ctrl_c.clear()


def _check_ctrl_c() -> None:
    if _ctrl_c.is_set():
        raise KeyboardInterrupt


@contextmanager
def _sigint_held(reraise: bool = True):
    """Ctrl-C inside waits until the block has run (raised after it when ``reraise``, else dropped)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught and reraise and previous is not signal.SIG_IGN:
        raise KeyboardInterrupt


def holders(client, run_dir: Path) -> list:
    """Containers of this project, in any state, labelled with this run directory."""
    found = client.containers.list(all=True, filters={"label": RUN_DIR_LABEL})
    return [c for c in found if c.labels.get(RUN_DIR_LABEL) == str(run_dir.resolve())]


def clear_holders(client, run_dir: Path) -> list[tuple[str, str]]:
    """Stop and remove every container holding ``run_dir``; (short id, state before) of each."""
    from docker.errors import APIError, NotFound

    cleared = []
    for container in holders(client, run_dir):
        try:
            state = container.status
            if state in ("running", "restarting", "paused"):
                container.stop(timeout=STOP_SECONDS)
            container.remove(force=True)
            cleared.append((container.short_id, state))
        except NotFound:
            pass  # removed meanwhile
        except APIError as exc:
            if "already in progress" not in str(exc):
                raise
    return cleared


def _chown_tree(path: Path, uid: int, gid: int) -> None:
    os.chown(path, uid, gid)
    for parent, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(parent, name), uid, gid, follow_symlinks=False)


def prepare_host_side(run: ContainerRun) -> None:
    """Write run.json here (the container cannot) and hand the writable parts to the container's user."""
    from opcollect.plans.planfile import read_plan
    from opcollect.runtime.rundir import prepare_run_dir

    run_dir = run.run_dir.resolve()
    prepare_run_dir(run_dir, run.plan_path, read_plan(run.plan_path), resume=(run_dir / "run.json").exists())
    if os.getuid() != 0:
        return  # the container runs as this user, who owns the run directory already
    uid, gid = UNPRIVILEGED
    for sub in WRITABLE:
        _chown_tree(run_dir / sub, uid, gid)
    for path, extra in ((run_dir, stat.S_IRGRP | stat.S_IXGRP), (run_dir / "plan.json", stat.S_IRGRP)):
        os.chown(path, -1, gid)  # readable by the container's group; its owner (root) alone may write
        os.chmod(path, stat.S_IMODE(path.stat().st_mode) | extra)
    identity = run_dir / "run.json"
    os.chown(identity, -1, gid)
    os.chmod(identity, stat.S_IMODE(identity.stat().st_mode) | stat.S_IRGRP)


def _start(client, run: ContainerRun, command: list[str], say: Callable[[str], None]):
    """Create and start the container; it is removed again if it cannot start."""
    from docker.errors import APIError

    limits = [-1, resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]]  # unlimited, else the host's hard limit
    for attempt, memlock in enumerate(limits):
        container = client.containers.create(**container_options(run, command, memlock))
        try:
            container.start()
            return container
        except APIError as exc:
            container.remove(force=True)
            text = str(getattr(exc, "explanation", None) or exc)
            if "rlimit" in text and attempt == 0 and memlock != limits[1]:
                say(f"warning: the engine refused memlock=unlimited; using the host's limit of {limits[1]} bytes")
                continue
            if "gpu" in text.lower() or "device driver" in text.lower():
                raise InputError(
                    f"GPUs requested but the engine has no NVIDIA runtime ({text.splitlines()[0][:160]}); "
                    "install nvidia-container-toolkit, or use --device cpu"
                ) from None
            raise InputError(f"starting the container failed: {text.splitlines()[0][:200]}") from None
    raise AssertionError("unreachable")


def run_container(client, run: ContainerRun, say: Callable[[str], None] = print) -> int:
    """The container's exit code; raises Interrupted on Ctrl-C after stopping it. Always removes it."""
    run_dir = run.run_dir.resolve()
    for short_id, state in clear_holders(client, run_dir):
        say(f"removed container {short_id} ({state}) left holding {run_dir} by an earlier collect")
    prepare_host_side(run)
    command = ["run", "--plan", PLAN_IN, "--out", RUN_IN, "--device", run.device, "--resume", *run.run_args]
    _check_ctrl_c()
    try:
        with _sigint_held():  # a Ctrl-C here lands once create and start have answered
            container = _start(client, run, command, say)
        say(f"container {container.short_id} runs {run.image}; Ctrl-C stops it and keeps the shards")
        for chunk in container.logs(stream=True, follow=True):
            for line in chunk.decode(errors="replace").splitlines():
                say(line)
            _check_ctrl_c()
        return int(container.wait()["StatusCode"])
    except KeyboardInterrupt:
        raise Interrupted() from None
    finally:
        with _sigint_held(reraise=False):  # stop (SIGTERM, then SIGKILL after STOP_SECONDS) and remove
            clear_holders(client, run_dir)
