"""Typed model of pins.yaml: framework version and image digest per backend."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from opcollect.cases.grids import Frozen
from opcollect.errors import InputError
from opcollect.yamlio import load_typed

BACKENDS = ("torch", "vllm", "sglang", "trtllm")
FRAMEWORK_NAMES = {"torch": "Torch", "vllm": "VLLM", "sglang": "SGLang", "trtllm": "TRTLLM"}

# repo[:tag]@sha256:<64 hex>: a pin names one immutable image
IMAGE_REF = r"^[a-z0-9][a-z0-9._/:-]*(:[A-Za-z0-9._-]+)?@sha256:[0-9a-f]{64}$"


class VersionPin(Frozen):
    image: str

    @field_validator("image")
    @classmethod
    def _pinned_by_digest(cls, value: str) -> str:
        if not re.match(IMAGE_REF, value):
            raise ValueError("must be repo:tag@sha256:<64 hex digits>; pin the image by its index digest")
        return value

    @property
    def digest(self) -> str:
        return self.image.split("@", 1)[1]

    @property
    def name(self) -> str:
        return self.image.split("@", 1)[0]


class BackendPins(Frozen):
    current: str = Field(min_length=1)
    versions: dict[str, VersionPin] = Field(min_length=1)

    @model_validator(mode="after")
    def _current_is_pinned(self) -> BackendPins:
        if self.current not in self.versions:
            raise ValueError(f"current version {self.current!r} has no entry under versions")
        return self


class Pins(Frozen):
    schema_version: Literal[1]
    backends: dict[Literal["torch", "vllm", "sglang", "trtllm"], BackendPins] = Field(min_length=1)

    def pin(self, backend: str, version: str | None = None) -> tuple[str, VersionPin]:
        entry = self.backends.get(backend)  # type: ignore[call-overload]
        if entry is None:
            raise InputError(f"pins.yaml: no pin for backend {backend!r}; pinned: {', '.join(self.backends)}")
        chosen = version or entry.current
        if chosen not in entry.versions:
            raise InputError(
                f"pins.yaml: backend {backend!r} has no version {chosen!r}; pinned: {', '.join(entry.versions)}"
            )
        return chosen, entry.versions[chosen]


def load_pins(path: Path) -> Pins:
    return load_typed(path, Pins)
