"""Our provenance record of one table directory, ``<version>/.opcollect/provenance.yaml``.

The consumer reads collection_meta.yaml and takes every non-dot file beside it for a table, so what it
does not read lives in the dot-directory: per table the perf file's sha256, failures, the collector and
plan hashes and every run's event (host, shard, image), and the runtime probe. collection_meta.yaml is
generated from this record (``collection_meta``); check R5 holds the two to each other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from opcollect.errors import InputError
from opcollect.tables import consumer
from opcollect.tables.schema import EXTRAS
from opcollect.tables.values import Timestamp
from opcollect.yamlio import read_yaml, validate

PROVENANCE = f"{EXTRAS}/provenance.yaml"
# collector_ref when merge could not name the collector's commit (its checkout's source differs from the
# runs'): the collector_hash beside it still identifies the source
NO_REF = "unknown"
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Runtime(_Strict):
    framework: str  # the backend that collected the directory's tables
    version: str
    nccl_version: str | None = None  # NCCL as the probe reported it (gloo-<torch> on the CPU)
    image: str | None
    image_digest: str | None
    python: str | None
    torch: str | None
    cuda: str | None
    driver: str | None


class HostFigures(_Strict):
    """What the CPU workers' probe measured (runtime/hostprobe.py), the highest over workers: check R8's figures
    for a CPU table."""

    dense_tflops: dict[str, Annotated[float, Field(gt=0, allow_inf_nan=False)]] = Field(min_length=1)
    bandwidth_bytes_per_s: int = Field(gt=0)
    cache_bytes: int | None = Field(default=None, gt=0)


class System(_Strict):
    name: str
    device: str
    sm: str
    gpus: int = Field(ge=1)
    sm_clock_mhz: float | None
    clocks_locked: bool | None
    host_figures: HostFigures | None = None  # a CPU run's; None on a GPU (systems/*.yaml has its figures)


class Event(_Strict):
    run_id: str
    collected_at: Timestamp  # ISO 8601 with its UTC offset, not in the future (tables/values.py)
    finished_at: Timestamp | None
    host: str
    shard: str | None
    rows: int = Field(ge=0)
    failures: int = Field(ge=0)
    image: str | None
    image_digest: str | None
    plan_hash: Sha256
    garbage_lines: int = Field(default=0, ge=0)  # shard lines of the run that were no record, skipped
    # rows per communicator or strategy that ran beneath the label (Measured.ran), and rows where that was not
    # the one the framework's selection predicted
    ran: dict[str, int] = Field(default_factory=dict)
    unexpected_ran: int = Field(default=0, ge=0)


class TableMeta(_Strict):
    file_sha256: Sha256
    rows: int = Field(ge=0)
    failures: int = Field(ge=0)
    status: Literal["complete", "partial"]
    collector_ref: str | None
    collector_hash: Sha256
    case_plan_hash: Sha256  # sha256 over the table's sorted planned case IDs
    events: list[Event]


class Provenance(_Strict):
    schema_version: Literal[1]
    runtime: Runtime
    system: System
    tables: dict[str, TableMeta] = Field(min_length=1)


def read_provenance(path: Path) -> Provenance:
    data = read_yaml(path)
    return validate(str(path), data, Provenance)


def dump_provenance(record: Provenance) -> str:
    return yaml.safe_dump(record.model_dump(mode="json"), sort_keys=False, default_flow_style=False)


def _collection(entry: TableMeta, event: Event) -> consumer.Collection:
    return consumer.Collection(
        collector_ref=entry.collector_ref or NO_REF,
        collector_hash=entry.collector_hash,
        case_plan_hash=entry.case_plan_hash,
        collected_at=event.collected_at,
        rows=event.rows,
        # a run that never finished (killed, then resumed by another) contributed part of its plan
        status="complete" if event.finished_at is not None else "partial",
    )


def collection_meta(record: Provenance) -> consumer.CollectionMeta:
    """The directory's collection_meta.yaml in the consumer's schema 2, from our record.

    One collection per run that left rows or failures in the table (every run when none did); NCCL's
    directory names NCCL and its version, as the reference's does.
    """
    runtime = record.runtime
    nccl = set(record.tables) == {consumer.NCCL_TABLE} and runtime.nccl_version is not None
    tables = {}
    for name, entry in record.tables.items():
        events = [e for e in entry.events if e.rows or e.failures] or entry.events
        tables[name] = consumer.MetaTable(
            rows=entry.rows,
            status=entry.status,
            collections=[_collection(entry, e) for e in events],
        )
    return consumer.CollectionMeta(
        schema_version=2,
        runtime=consumer.MetaRuntime(
            framework="nccl" if nccl else runtime.framework,
            version=runtime.nccl_version if nccl else runtime.version,
            image=runtime.image or None,
            image_digest=runtime.image_digest or None,
        ),
        tables=tables,
    )


def check_sidecar_matches(path: Path, found: consumer.CollectionMeta, record: Provenance) -> None:
    """InputError naming the first field where collection_meta.yaml differs from what the record makes."""
    wanted = collection_meta(record).model_dump(mode="json", exclude_none=True)
    have = found.model_dump(mode="json", exclude_none=True)
    if have != wanted:
        field = _first_difference(have, wanted, "")
        raise InputError(f"{path}: field '{field}' differs from {PROVENANCE}; restore the file or re-merge")


def _first_difference(a: object, b: object, where: str) -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if a.get(key) != b.get(key):
                return _first_difference(a.get(key), b.get(key), f"{where}.{key}" if where else str(key))
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return _first_difference(x, y, f"{where}[{i}]")
    return where or "(top level)"
