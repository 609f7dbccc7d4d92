"""`opcollect build BACKEND`: build (or reuse) the collector image through the Docker SDK.

The tag carries the input hash: an image with that tag is reused at once (cache hit). Otherwise the
context is rendered and built with the classic builder, the log streamed live; a failed build prints
the failing step's log and exits 2.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from opcollect.errors import InputError
from opcollect.images.context import BuildPlan, plan_build, render_context
from opcollect.images.engine import connect, ensure_image
from opcollect.project import ProjectTree


@dataclass(frozen=True)
class BuiltImage:
    plan: BuildPlan
    image_id: str
    cache_hit: bool
    seconds: float

    @property
    def tag(self) -> str:
        return self.plan.tag


class BuildFailed(InputError):
    """The engine refused the build; the message holds the failing step's log."""


def _python_tag(client, image: str) -> str:
    """CPython of a local base image, e.g. '311', for the runtime wheels an offline build needs."""
    output = client.containers.run(
        image,
        entrypoint=["python3", "-c", "import sys; print(f'{sys.version_info[0]}{sys.version_info[1]}')"],
        remove=True,
        network_disabled=True,
    )
    return output.decode().strip()


def build_image(
    tree: ProjectTree,
    backend: str,
    pins_path: Path | None = None,
    base_image: str | None = None,
    say: Callable[[str], None] = print,
    no_cache: bool = False,
) -> BuiltImage:
    from docker.errors import ImageNotFound

    start = time.perf_counter()
    client = connect()

    def local_id(ref: str) -> str:
        try:
            return client.images.get(ref).id
        except ImageNotFound:
            raise InputError(f"--base-image {ref}: no such local image; build it with `nox -s base-image`") from None

    plan = plan_build(tree, backend, pins_path, base_image, local_id)
    if not no_cache:
        try:
            image = client.images.get(plan.tag)
            say(f"cache hit: {plan.tag}")
            return BuiltImage(plan, image.id, True, time.perf_counter() - start)
        except ImageNotFound:
            pass
    ensure_image(client, plan.base_image)
    with tempfile.TemporaryDirectory(prefix="opcollect-context-") as tmp:
        render_context(plan, tree, Path(tmp), _python_tag(client, plan.base_image) if plan.local_base else None)
        say(f"building {plan.tag} from {plan.base_image}")
        image_id = _stream_build(client, Path(tmp), plan, say, no_cache)
    return BuiltImage(plan, image_id, False, time.perf_counter() - start)


def _stream_build(client, context: Path, plan: BuildPlan, say: Callable[[str], None], no_cache: bool) -> str:
    from docker.errors import APIError

    step_log: list[str] = []
    image_id = None
    try:
        stream = client.api.build(
            path=str(context),
            tag=plan.tag,
            buildargs=plan.buildargs(),
            decode=True,
            rm=True,
            forcerm=True,
            pull=False,
            nocache=no_cache,
        )
        for chunk in stream:
            if "error" in chunk:
                detail = chunk.get("errorDetail", {}).get("message") or chunk["error"]
                log = "\n".join(step_log[-40:])
                raise BuildFailed(f"building {plan.tag} failed: {detail.strip()}\n{log}")
            text = chunk.get("stream", "")
            for line in text.splitlines():
                if line.startswith("Step "):
                    step_log = []
                if line.strip():
                    step_log.append(line)
                    say(line)
            if "aux" in chunk and "ID" in chunk["aux"]:
                image_id = chunk["aux"]["ID"]
    except APIError as exc:
        raise BuildFailed(f"building {plan.tag} failed: {exc}") from None
    if image_id is None:
        image_id = client.images.get(plan.tag).id
    return image_id
