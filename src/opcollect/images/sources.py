"""A framework's Python sources copied out of its image through the Docker SDK, for `opcollect contract --image`:
where a release has no wheel to download (TensorRT-LLM's release candidates), its pinned image holds it.

The image is never pulled or started with a GPU: one short container asks Python where the package lives
(importlib's find_spec, which does not run the package), a second, never started, hands that directory out
as a tar stream (get_archive), and only its regular ``.py`` files are written, under ``dest/<package>/``.
"""

from __future__ import annotations

import re
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from opcollect.errors import InputError
from opcollect.images.engine import CONTAINER_LABEL, image_id

# a local or remote image reference: repo[:tag][@sha256:<64 hex>]
IMAGE = re.compile(r"^[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9._-]+)?(@sha256:[0-9a-f]{64})?$")
PACKAGE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SAFE_PATH = re.compile(r"^/[A-Za-z0-9._/+-]+$")
_LOCATE = (
    "import importlib.util, sys\n"
    "for name in sys.argv[1:]:\n"
    "    spec = importlib.util.find_spec(name)\n"
    "    print(name, spec.submodule_search_locations[0] if spec and spec.submodule_search_locations else '-')\n"
)


def check_image_ref(ref: str) -> str:
    if not IMAGE.match(ref) or len(ref) > 512:
        raise InputError(f"--image {ref!r}: not an image reference; give repo:tag or repo:tag@sha256:<64 hex>")
    return ref


def package_dirs(client, ref: str, packages: tuple[str, ...]) -> dict[str, str]:
    """Where each package is installed inside the image, as its own Python finds it."""
    for name in packages:
        if not PACKAGE.match(name):
            raise ValueError(f"not a package name: {name!r}")
    out = client.containers.run(
        ref,
        command=list(packages),
        entrypoint=["python3", "-c", _LOCATE, "--"],  # the image's own entrypoint may print a banner
        remove=True,
        network_disabled=True,
        labels={CONTAINER_LABEL: "contract"},
    )
    found: dict[str, str] = {}
    for line in out.decode("utf-8", "replace").splitlines():
        name, _, where = line.partition(" ")
        if name in packages and where != "-":
            path = PurePosixPath(where)
            if not SAFE_PATH.match(where) or ".." in path.parts or path.name != name:
                raise InputError(f"image {ref}: package {name} reported at an unexpected path {where!r}")
            found[name] = where
    return found


def _members(archive: tarfile.TarFile, package: str):
    """The regular .py files of the archive, each under ``package/``; anything else is skipped."""
    for member in archive.getmembers():
        parts = PurePosixPath(member.name).parts
        if not member.isfile() or not member.name.endswith(".py") or not parts or parts[0] != package:
            continue
        if member.name.startswith("/") or ".." in parts:
            raise InputError(f"the archive of {package} holds an unsafe path {member.name!r}")
        yield member


def copy_package_sources(client, ref: str, packages: tuple[str, ...], dest: Path) -> list[str]:
    """Copy each package's .py files out of the local image ``ref`` into ``dest``; the packages found."""
    check_image_ref(ref)
    if image_id(client, ref) is None:
        raise InputError(
            f"contract: checked nothing: image {ref} is not present locally; pull it (docker pull {ref}) "
            "or give the release with --source DIR"
        )
    found = package_dirs(client, ref, packages)
    if not found:
        raise InputError(f"contract: checked nothing: image {ref} has none of {', '.join(packages)} installed")
    holder = client.containers.create(ref, command=["true"], entrypoint=[], labels={CONTAINER_LABEL: "contract"})
    try:
        for name, where in found.items():
            stream, _ = holder.get_archive(where)
            with tempfile.TemporaryFile() as spool:
                for chunk in stream:
                    spool.write(chunk)
                spool.seek(0)
                with tarfile.open(fileobj=spool) as archive:
                    for member in _members(archive, name):
                        target = dest / member.name
                        target.parent.mkdir(parents=True, exist_ok=True)
                        target.write_bytes(archive.extractfile(member).read())
    finally:
        holder.remove(force=True)
    return sorted(found)


def image_release(backend: str, ref: str, version: str | None, pins_path: Path | None, dest: Path) -> tuple[Path, str]:
    """(directory, image): the backend's packages copied out of ``ref``, or out of its pinned image (``version``,
    else the current pin) when ``ref`` is empty."""
    from opcollect.backends.symbols import FRAMEWORK_PACKAGES
    from opcollect.images.engine import connect
    from opcollect.images.pins import load_pins
    from opcollect.project import find_project

    if not ref:
        _, pin = load_pins(pins_path or find_project(None).pins).pin(backend, version)
        ref = pin.image
    check_image_ref(ref)
    copy_package_sources(connect(), ref, FRAMEWORK_PACKAGES.get(backend, ()), dest)
    return dest, ref
