"""Typed model of pins.yaml: framework version and image digest per backend."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from opcollect.cases.grids import Frozen
from opcollect.errors import InputError
from opcollect.names import BACKENDS
from opcollect.yamlio import load_typed

# repo[:tag]@sha256:<64 hex>: a pin names one immutable image; matched against the whole value (re.fullmatch)
IMAGE_REF = r"[a-z0-9][a-z0-9._/:-]*(:[A-Za-z0-9._-]+)?@sha256:[0-9a-f]{64}"


class VersionPin(Frozen):
    image: str

    @field_validator("image")
    @classmethod
    def _pinned_by_digest(cls, value: str) -> str:
        if not re.fullmatch(IMAGE_REF, value, re.ASCII):
            raise ValueError("must be repo:tag@sha256:<64 hex digits>; pin the image by its index digest")
        return value

    @property
    def digest(self) -> str:
        return self.image.split("@", 1)[1]

    @property
    def name(self) -> str:
        return self.image.split("@", 1)[0]

    @property
    def tag(self) -> str | None:
        """The tag of the image reference (after the last ':' of its last path part), if it has one."""
        last = self.name.rsplit("/", 1)[-1]
        return last.split(":", 1)[1] if ":" in last else None


def tag_matches(tag: str, version: str) -> bool:
    """A tag names ``version``: the version itself, after an optional 'v', then nothing or a -_+ suffix.

    As the pinned images are tagged: v0.24.0 (vLLM), 1.3.0rc23 (TensorRT-LLM), 2.8.0-cuda12.8-cudnn9-runtime.
    """
    return re.fullmatch(rf"v?{re.escape(version)}([-_+].*)?", tag) is not None


class BackendPins(Frozen):
    current: str = Field(min_length=1)
    versions: dict[str, VersionPin] = Field(min_length=1)

    @model_validator(mode="after")
    def _current_is_pinned(self) -> BackendPins:
        if self.current not in self.versions:
            raise ValueError(f"current version {self.current!r} has no entry under versions")
        for version, pin in self.versions.items():
            if pin.tag is not None and not tag_matches(pin.tag, version):
                raise ValueError(
                    f"version {version!r} pins image tag {pin.tag!r}, which is another version; "
                    f"pin the image of {version} (tag {version} or v{version}, with its digest) or fix the version"
                )
        return self


class Pins(Frozen):
    schema_version: Literal[1]
    backends: dict[Literal[BACKENDS], BackendPins] = Field(min_length=1)
    _source: str = PrivateAttr(default="pins.yaml")  # the file it was read from, which its refusals name

    def pin(self, backend: str, version: str | None = None) -> tuple[str, VersionPin]:
        entry = self.backends.get(backend)  # type: ignore[call-overload]
        if entry is None:
            raise InputError(f"{self._source}: no pin for backend {backend!r}; pinned: {', '.join(self.backends)}")
        chosen = version or entry.current
        if chosen not in entry.versions:
            raise InputError(
                f"{self._source}: backend {backend!r} has no version {chosen!r}; pinned: {', '.join(entry.versions)}"
            )
        return chosen, entry.versions[chosen]


def load_pins(path: Path) -> Pins:
    pins = load_typed(path, Pins)
    pins._source = str(path)
    return pins
