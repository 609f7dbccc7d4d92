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
from opcollect.images.engine import connect, ensure_image, image_id
from opcollect.images.pins import load_pins
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


def _local_ids(client) -> Callable[[str], str]:
    """The image ID of a local base image by reference; one line when it is not there."""

    def local_id(ref: str) -> str:
        found = image_id(client, ref)
        if found is None:
            raise InputError(f"--base-image {ref}: no such local image; build it with `nox -s base-image`")
        return found

    return local_id


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
    version: str | None = None,
) -> BuiltImage:
    from docker.errors import ImageNotFound

    start = time.perf_counter()
    client = connect()

    local_id = _local_ids(client)

    plan = plan_build(tree, backend, pins_path, base_image, local_id, version)
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


@dataclass(frozen=True)
class Pruned:
    removed: tuple[str, ...]  # tags (or image IDs) removed
    kept: tuple[str, ...]  # current images, and stale ones a container still uses
    freed_bytes: int


def _current_tags(tree: ProjectTree, pins_path: Path | None, images: list, local_id) -> set[str]:
    """Tags `opcollect build` would reuse now: each pinned version of each backend (TensorRT-LLM keeps two), and
    each local base still here."""
    pins = load_pins(pins_path or tree.pins)
    wanted: set[tuple[str, str | None, str | None]] = set()
    for image in images:
        backend, base = image.labels["io.opcollect.backend"], image.labels.get("org.opencontainers.image.base.name")
        if backend in pins.backends:
            wanted |= {(backend, None, version) for version in pins.backends[backend].versions}
            if base and "@sha256:" not in base:
                wanted.add((backend, base, None))  # a local base: current while that image is here
    tags = set()
    for backend, base, version in wanted:
        try:
            tags.add(plan_build(tree, backend, pins_path, base, local_id, version).tag)
        except InputError:
            pass  # a local base that is gone: nothing built on it is current
    return tags


def _layers_size(client) -> int:
    return int(client.df().get("LayersSize") or 0)


def prune_images(
    tree: ProjectTree,
    backends: list[str] | None = None,
    pins_path: Path | None = None,
    say: Callable[[str], None] = print,
) -> Pruned:
    """Remove the collector images (tags opcollect/<backend>:..., with this project's labels) that neither a
    current pin nor a local base image that is still here names with the current input hash of ``tree``.

    Base images (the pins' and the local ones) carry no opcollect labels and are never touched; an image
    also tagged outside opcollect/ is left alone; one a container still uses is kept and named.
    """
    from docker.errors import APIError, ImageNotFound

    client = connect()

    local_id = _local_ids(client)

    images = [
        image
        for image in client.images.list(filters={"label": "io.opcollect.input-hash"})
        if "io.opcollect.backend" in image.labels
        and (backends is None or image.labels["io.opcollect.backend"] in backends)
        and all(tag.startswith(f"opcollect/{image.labels['io.opcollect.backend']}:") for tag in image.tags)
    ]
    current = _current_tags(tree, pins_path, images, local_id)
    before = _layers_size(client)
    removed, kept = [], []
    for image in images:
        if current.intersection(image.tags):
            kept.extend(image.tags)
            say(f"kept {', '.join(image.tags)} (current)")
            continue
        for name in image.tags or [image.id]:  # a tag at a time: never forced, so an image in use stays
            try:
                client.images.remove(name)
                removed.append(name)
                say(f"removed {name} ({image.short_id.split(':')[-1]})")
            except ImageNotFound:
                pass
            except APIError as exc:
                if exc.status_code != 409:
                    raise
                kept.append(name)
                say(f"kept {name}: {str(exc.explanation or exc).split(' - ')[-1].strip()}")
    freed = max(0, before - _layers_size(client)) if removed else 0
    say(f"pruned {len(removed)} images, freed {freed} bytes ({freed / 1e6:.1f} MB); kept {len(kept)}")
    return Pruned(tuple(removed), tuple(kept), freed)
