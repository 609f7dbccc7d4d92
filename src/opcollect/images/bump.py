"""`opcollect bump BACKEND --version V --image REF@sha256:D`: move one backend's pin in pins.yaml.

pins.yaml is rewritten through ruamel.yaml's round-trip loader, which keeps every comment, the key order and the
quoting of the lines it does not change (PyYAML drops comments), so only that backend's entry changes: the new
version goes first under ``versions``, becomes ``current``, and the previous current entry goes unless
``keep_old`` (TensorRT-LLM keeps two). The result is read back through the typed pins model before it is written.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from pathlib import Path

from opcollect.errors import InputError
from opcollect.images.pins import IMAGE_REF, VersionPin, load_pins, tag_matches
from opcollect.names import BACKENDS
from opcollect.yamlio import validate

# matched against the whole value (fullmatch): a trailing newline is no part of a version or a reference
VERSION = re.compile(r"[0-9][A-Za-z0-9.+-]{0,63}", re.ASCII)
TAG_REF = re.compile(r"[a-z0-9][a-z0-9._/-]*:[A-Za-z0-9._-]+", re.ASCII)  # repo:tag, for --resolve


@dataclass(frozen=True)
class BumpRequest:
    backend: str
    version: str
    image: str  # repo:tag@sha256:<digest>; repo:tag with resolve
    keep_old: bool = False
    allow_downgrade: bool = False
    resolve: bool = False


@dataclass(frozen=True)
class Bumped:
    backend: str
    old_version: str
    new_version: str
    image: str
    before: str  # pins.yaml text
    after: str


def resolve_digest(ref: str) -> str:
    """repo:tag@sha256:<index digest>, as the registry reports it through the Docker engine."""
    from docker.errors import APIError, DockerException

    from opcollect.images.engine import connect

    if not TAG_REF.fullmatch(ref):
        raise InputError(f"--resolve --image {ref!r}: give repo:tag (without a digest) to look up")
    try:
        data = connect().images.get_registry_data(ref)
    except (APIError, DockerException) as exc:
        reason = str(getattr(exc, "explanation", None) or exc).split("\n")[0][:160]
        raise InputError(
            f"--resolve: no registry answers for {ref} ({reason}); "
            f"pin the digest yourself: --image {ref}@sha256:<digest>"
        ) from None
    return f"{ref}@{data.id}"


def _parse_version(value: str):
    from packaging.version import InvalidVersion, Version

    try:
        return Version(value)
    except InvalidVersion:
        raise InputError(f"--version {value!r}: not a version (PEP 440, e.g. 0.25.0 or 1.3.0rc24)") from None


def check_names(request: BumpRequest) -> None:
    """The backend is one opcollect knows and the version is a version: both name the report's file."""
    if request.backend not in BACKENDS:
        raise InputError(f"bump {request.backend!r}: not a backend; give one of {', '.join(BACKENDS)}")
    if not VERSION.fullmatch(request.version):
        raise InputError(f"--version {request.version!r}: not a version; give e.g. 0.25.0 or 1.3.0rc24")
    _parse_version(request.version)


def check_request(pins_path: Path, request: BumpRequest) -> str:
    """The backend's current version, once the request is sound; InputError naming what is not.

    The same version with another digest (a re-pushed tag, pinned again) is no downgrade: only an older version
    needs --allow-downgrade."""
    check_names(request)
    new = _parse_version(request.version)
    if not re.fullmatch(IMAGE_REF, request.image, re.ASCII):
        problem = "not an image reference" if "@" in request.image else "no digest"
        raise InputError(
            f"--image {request.image!r}: {problem}; pin the image by its index digest, repo:tag@sha256:<64 hex> "
            "(or --resolve to ask the registry)"
        )
    pin = VersionPin(image=request.image)
    if pin.tag is None or not tag_matches(pin.tag, request.version):
        raise InputError(
            f"--image {request.image}: tag {pin.tag!r} is not version {request.version}; pin that version's image "
            f"(tag {request.version} or v{request.version})"
        )
    pins = load_pins(pins_path)
    entry = pins.backends.get(request.backend)  # type: ignore[call-overload]
    if entry is None:
        raise InputError(f"{pins_path}: no pin for backend {request.backend!r}; pinned: {', '.join(pins.backends)}")
    old = _parse_version(entry.current)
    if new < old and not request.allow_downgrade:
        raise InputError(
            f"--version {request.version}: older than the current pin {entry.current} of {request.backend}; "
            "pass --allow-downgrade to pin it anyway"
        )
    if request.version in entry.versions and entry.versions[request.version].image == request.image:
        if entry.current == request.version:
            raise InputError(
                f"{request.backend} {request.version} is already pinned to {request.image}: nothing to bump"
            )
    return entry.current


def rewrite_pins(text: str, request: BumpRequest, old_version: str) -> str:
    """pins.yaml's text with the backend's entry moved to the new version, every other byte kept."""
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap

    yaml = YAML()  # round-trip: comments, order and quotes kept
    yaml.preserve_quotes = True
    yaml.width = 4096  # image references stay on one line
    yaml.indent(mapping=2, sequence=4, offset=2)
    data = yaml.load(text)
    entry = data["backends"][request.backend]
    versions = entry["versions"]
    if request.version in versions:
        del versions[request.version]
    versions.insert(0, request.version, CommentedMap({"image": request.image}))
    entry["current"] = request.version
    if not request.keep_old and old_version != request.version:
        del versions[old_version]
    out = io.StringIO()
    yaml.dump(data, out)
    return out.getvalue()


def bump(pins_path: Path, request: BumpRequest) -> Bumped:
    """The rewritten pins (not yet written): checked, and read back through the typed model."""
    if request.resolve:
        request = BumpRequest(**{**request.__dict__, "image": resolve_digest(request.image), "resolve": False})
    old_version = check_request(pins_path, request)
    before = pins_path.read_text()
    after = rewrite_pins(before, request, old_version)
    import yaml

    from opcollect.images.pins import Pins

    validate(str(pins_path), yaml.safe_load(after), Pins)
    return Bumped(request.backend, old_version, request.version, request.image, before, after)
