"""collection_meta.yaml: the provenance sidecar of one table directory, read strictly.

Schema 2 (written by merge) carries runtime, system and per-table hashes and events; the reader also
accepts schema 1, the legacy sidecars of the aiconfigurator reference tables.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from opcollect.errors import InputError
from opcollect.yamlio import read_yaml, validate

SIDECAR = "collection_meta.yaml"
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Runtime(_Strict):
    framework: str
    version: str
    image: str | None
    image_digest: str | None
    python: str | None
    torch: str | None
    cuda: str | None
    driver: str | None


class System(_Strict):
    name: str
    device: str
    sm: str
    gpus: int = Field(ge=1)
    sm_clock_mhz: float | None
    clocks_locked: bool | None


class Event(_Strict):
    run_id: str
    collected_at: str
    finished_at: str | None
    host: str
    shard: str | None
    rows: int = Field(ge=0)
    failures: int = Field(ge=0)
    image: str | None
    image_digest: str | None
    plan_hash: Sha256
    garbage_lines: int = Field(default=0, ge=0)  # shard lines of the run that were no record, skipped


class TableMeta(_Strict):
    file_sha256: Sha256
    rows: int = Field(ge=0)
    failures: int = Field(ge=0)
    status: Literal["complete", "partial"]
    collector_ref: str | None
    collector_hash: Sha256
    case_plan_hash: Sha256  # sha256 over the table's sorted planned case IDs
    events: list[Event]


class SidecarV2(_Strict):
    schema_version: Literal[2]
    provenance: Literal["collected"]
    runtime: Runtime
    system: System
    tables: dict[str, TableMeta] = Field(min_length=1)


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


def read_sidecar(path: Path) -> SidecarV1 | SidecarV2:
    data = read_yaml(path)
    version = data.get("schema_version") if isinstance(data, dict) else data
    if version not in (1, 2):
        raise InputError(f"{path}: field 'schema_version': expected 1 or 2, got {version!r}")
    model = SidecarV2 if data["schema_version"] == 2 else SidecarV1
    return validate(str(path), data, model)


def dump_sidecar(sidecar: SidecarV2) -> str:
    return yaml.safe_dump(sidecar.model_dump(mode="json"), sort_keys=False, default_flow_style=False)
