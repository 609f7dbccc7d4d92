"""Run a plan inside the collector image: mounts, GPUs, limits, logs, and removal in every case."""

from __future__ import annotations

import os
import resource
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from opcollect.errors import InputError
from opcollect.images.engine import CONTAINER_LABEL

PLAN_IN = "/opcollect/plan.json"
RUN_IN = "/opcollect/run"
STOP_SECONDS = 10
STACK_BYTES = 67108864  # the frameworks' recommended --ulimit stack


@dataclass(frozen=True)
class ContainerRun:
    image: str
    plan_path: Path
    run_dir: Path
    device: str  # cpu or cuda
    gpus: str  # all, or device indices such as 0,1
    run_args: tuple[str, ...]  # flags for `opcollect run` after --plan/--out/--device


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


def _start(client, run: ContainerRun, command: list[str], say: Callable[[str], None]):
    """Create and start the container; it is removed again if it cannot start."""
    from docker.errors import APIError

    limits = [-1, resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]]  # unlimited, else the host's hard limit
    for attempt, memlock in enumerate(limits):
        container = client.containers.create(
            run.image,
            command=command,
            entrypoint=["python3", "-m", "opcollect"],
            volumes={
                str(run.plan_path.resolve()): {"bind": PLAN_IN, "mode": "ro"},
                str(run.run_dir.resolve()): {"bind": RUN_IN, "mode": "rw"},
            },
            user=f"{os.getuid()}:{os.getgid()}",
            ipc_mode="host",
            hostname=socket.gethostname(),
            ulimits=_ulimits(memlock),
            device_requests=_device_requests(run),
            environment={"HOME": "/tmp"},
            working_dir="/tmp",
            labels={CONTAINER_LABEL: "1"},
        )
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
    from docker.errors import APIError

    run.run_dir.mkdir(parents=True, exist_ok=True)
    command = ["run", "--plan", PLAN_IN, "--out", RUN_IN, "--device", run.device, *run.run_args]
    container = _start(client, run, command, say)
    try:
        for chunk in container.logs(stream=True, follow=True):
            for line in chunk.decode(errors="replace").splitlines():
                say(line)
        return int(container.wait()["StatusCode"])
    except KeyboardInterrupt:
        container.stop(timeout=STOP_SECONDS)
        raise Interrupted() from None
    finally:
        try:
            container.remove(force=True)
        except APIError:
            pass
