"""The Docker engine, through the Docker SDK: one connection with one clear error when none answers."""

from __future__ import annotations

import os

from opcollect.errors import InputError

# containers this project starts carry this label, so a test or a user can find any left behind
CONTAINER_LABEL = "io.opcollect.run"


def connect():
    """A client of the engine the environment names (DOCKER_HOST, DOCKER_TLS_VERIFY, DOCKER_CERT_PATH, else the
    local socket) that answered a ping; InputError naming the setting or the engine when there is none."""
    import docker
    from docker.errors import DockerException

    try:
        client = docker.from_env()
    except ValueError as exc:  # docker 7.2.0 utils.parse_host (utils/utils.py:293) reads DOCKER_HOST through
        # urllib, which raises ValueError for a port out of range or a broken IPv6 address
        host = os.environ.get("DOCKER_HOST", "")
        raise InputError(
            f"DOCKER_HOST {host!r}: not an engine address ({exc}); give e.g. unix:///var/run/docker.sock or "
            "tcp://HOST:2376, or unset it for the local engine"
        ) from None
    except DockerException as exc:
        raise _no_engine(exc) from None
    try:
        client.ping()
        return client
    except DockerException as exc:
        raise _no_engine(exc) from None


def _no_engine(exc: Exception) -> InputError:
    reason = str(exc).split("\n")[0][:160]
    return InputError(
        f"no Docker engine answers ({reason}); start one (e.g. `dockerd &`) or pass --local "
        "to collect without a container"
    )


def ensure_image(client, ref: str) -> None:
    """The image is here, or is pulled now; otherwise one line names it."""
    from docker.errors import APIError, ImageNotFound

    try:
        client.images.get(ref)
        return
    except ImageNotFound:
        pass
    try:
        client.images.pull(ref)
    except APIError as exc:
        reason = str(getattr(exc, "explanation", None) or exc).split("\n")[0][:200]
        raise InputError(
            f"image {ref} is not present and cannot be pulled ({reason}); pull it on a machine "
            "that reaches its registry, or pass --base-image"
        ) from None


def image_id(client, ref: str) -> str | None:
    """The ID of a local image, or None when the engine has no such image."""
    from docker.errors import ImageNotFound

    try:
        return client.images.get(ref).id
    except ImageNotFound:
        return None
