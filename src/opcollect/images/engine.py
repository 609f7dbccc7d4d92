"""The Docker engine, through the Docker SDK: one connection with one clear error when none answers."""

from __future__ import annotations

from opcollect.errors import InputError

# containers this project starts carry this label, so a test or a user can find any left behind
CONTAINER_LABEL = "io.opcollect.run"


def connect():
    import docker
    from docker.errors import DockerException

    try:
        client = docker.from_env()
        client.ping()
        return client
    except DockerException as exc:
        reason = str(exc).split("\n")[0][:160]
        raise InputError(
            f"no Docker engine answers ({reason}); start one (e.g. `dockerd &`) or pass --local "
            "to collect without a container"
        ) from None


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
