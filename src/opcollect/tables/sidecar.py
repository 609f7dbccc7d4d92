"""collection_meta.yaml, read strictly: the consumer's schema 2 (written by merge) or schema 1.

Schema 1 is the legacy sidecar of the aiconfigurator reference tables; schema 2 is exactly what
aiconfigurator-core validates (tables/consumer.py). Our own richer record is tables/provenance.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from opcollect.errors import InputError
from opcollect.tables.consumer import SIDECAR, CollectionMeta
from opcollect.yamlio import read_yaml, validate

__all__ = ["SIDECAR", "SidecarV1", "read_sidecar"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class LegacyRuntime(_Strict):
    framework: str
    version: str


class LegacyTable(_Strict):
    status: Literal["complete", "partial"]


class SidecarV1(_Strict):
    schema_version: Literal[1]
    provenance: Literal["legacy", "collected"]
    runtime: LegacyRuntime
    tables: dict[str, LegacyTable] = Field(min_length=1)


def read_sidecar(path: Path) -> SidecarV1 | CollectionMeta:
    data = read_yaml(path)
    version = data.get("schema_version") if isinstance(data, dict) else data
    if version not in (1, 2):
        raise InputError(f"{path}: field 'schema_version': expected 1 or 2, got {version!r}")
    model = CollectionMeta if data["schema_version"] == 2 else SidecarV1
    return validate(str(path), data, model)
