"""`opcollect merge RUN_DIR... --into TABLES`: shards become tables with sidecars and a manifest.

Per (system, backend, framework version) and op: the latest record per case wins (a measured row is
never replaced by a failure), merged over what TABLES already holds; both old and new events stay in
the sidecar. Mixing collector hashes in one table is refused; systems and versions are directories.
"""

from __future__ import annotations

import hashlib
import io
import subprocess
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from opcollect.cases.systems import System as SystemSpec
from opcollect.cases.systems import load_systems, system_for_device
from opcollect.errors import InputError
from opcollect.images.pins import FRAMEWORK_NAMES
from opcollect.plans.hashes import collector_hash
from opcollect.project import ProjectTree
from opcollect.tables import sidecar as sc
from opcollect.tables.ingest import RunData, load_run
from opcollect.tables.schema import TableSchema, schema_for_op, table_files
from opcollect.tables.store import Staging, recover

PARQUET = dict(compression="zstd", compression_level=3)


@dataclass(frozen=True)
class Target:
    system: SystemSpec
    backend: str
    version: str
    device: str

    def directory(self, family: str) -> str:
        return f"{self.system.name}/{family}/{self.backend}/{self.version}"


@dataclass(frozen=True)
class TableWritten:
    path: str
    rows: int
    failures: int
    status: str


def _target(run: RunData, systems: dict[str, SystemSpec]) -> Target:
    identities = {(r["device"], r["version"]) for r in run.runtimes.values()}
    if not identities:
        raise InputError(f"{run.run_dir}: no worker identity in its shards; it recorded nothing to merge")
    if len(identities) > 1:
        raise InputError(f"{run.run_dir}: mixes devices/versions {sorted(identities)}; merge runs of one system")
    device, version = identities.pop()
    system = system_for_device(systems, device)
    if system is None:
        raise InputError(f"{run.run_dir}: device {device!r} matches no systems/*.yaml; add it to that system's devices")
    return Target(system, run.backend, version, device)


def _new_candidates(run: RunData, op: str, schema: TableSchema) -> pa.Table:
    records = run.records
    if pc.count_distinct(records["op"]).as_py() > 1:
        records = records.filter(pc.equal(records["op"], op))
    needed = [
        "case_id",
        "status",
        "recorded_at",
        "kernel_source",
        "dispatch",
        "error_class",
        "message",
        "attempt",
        "run_id",
        *(
            f"stats.{n}"
            for n in ("latency", "latency_p25", "latency_p75", "samples", "noise", "timing", "sm_clock_mhz")
        ),
    ]
    joined = records.select(needed).join(run.plan_cases[op], "case_id", join_type="inner")
    columns = {
        "case_id": joined["case_id"],
        **{f: joined[f] for f in schema.key_fields},
        "ok": pc.equal(joined["status"], "ok"),
        "recorded_at": joined["recorded_at"],
        "kernel_source": pc.coalesce(joined["kernel_source"], joined["dispatch"]),
    }
    for name in ("latency", "latency_p25", "latency_p75", "samples", "noise", "timing", "sm_clock_mhz"):
        columns[name] = joined[f"stats.{name}"]
    columns.update(
        error_class=joined["error_class"], message=joined["message"], attempt=joined["attempt"], run_id=joined["run_id"]
    )
    return pa.table({k: v.cast(CANDIDATE_TYPES[k]) if k in CANDIDATE_TYPES else v for k, v in columns.items()})


CANDIDATE_TYPES = {
    "ok": pa.bool_(),
    "recorded_at": pa.string(),
    "kernel_source": pa.string(),
    "latency": pa.float64(),
    "latency_p25": pa.float64(),
    "latency_p75": pa.float64(),
    "samples": pa.int64(),
    "noise": pa.float64(),
    "timing": pa.string(),
    "sm_clock_mhz": pa.float64(),
    "error_class": pa.string(),
    "message": pa.string(),
    "attempt": pa.int64(),
    "run_id": pa.string(),
}


def _candidates(table: pa.Table, schema: TableSchema, values: dict) -> pa.Table:
    """Candidate rows from a stored table: its keys, the given columns, nulls for the rest."""
    n = table.num_rows
    columns = {"case_id": table["case_id"], **{f: table[f] for f in schema.key_fields}}
    for name, kind in CANDIDATE_TYPES.items():
        value = values.get(name)
        if isinstance(value, str) and value in table.column_names:
            columns[name] = table[value].cast(kind)
        else:
            columns[name] = pa.array([value] * n, kind) if value is not None else pa.nulls(n, kind)
    return pa.table(columns)


def _old_candidates(directory: Path, schema: TableSchema) -> pa.Table | None:
    """What TABLES holds for this table, as candidates older than any new record."""
    perf_name, failures_name, _ = table_files(schema.name)
    parts = []
    if (directory / perf_name).is_file():
        measured = ("kernel_source", "latency", "latency_p25", "latency_p75", "samples", "noise", "timing")
        parts.append(
            _candidates(
                pq.read_table(directory / perf_name),
                schema,
                {"ok": True, "recorded_at": "", "attempt": 1, **{c: c for c in measured}},
            )
        )
    if (directory / failures_name).is_file():
        parts.append(
            _candidates(
                pq.read_table(directory / failures_name),
                schema,
                {
                    "ok": False,
                    "recorded_at": "",
                    "kernel_source": "kernel_source",
                    "error_class": "error_class",
                    "message": "message",
                    "attempt": "attempts",
                },
            )
        )
    return pa.concat_tables(parts) if parts else None


def latest_per_case(candidates: pa.Table) -> pa.Table:
    """One candidate per case: measured beats failed, then the most recent wins."""
    if pc.count_distinct(candidates["case_id"]).as_py() == candidates.num_rows:
        return candidates  # every case once: nothing to choose
    ranked = candidates.append_column("rank", pc.cast(candidates["ok"], pa.int8()))
    ordered = ranked.sort_by([("case_id", "ascending"), ("rank", "ascending"), ("recorded_at", "ascending")])
    ids = ordered["case_id"].combine_chunks()
    if len(ids) == 0:
        return ordered.drop_columns(["rank"])
    last = pc.not_equal(ids.slice(0, len(ids) - 1), ids.slice(1))
    keep = pa.concat_arrays([last, pa.array([True])])
    return ordered.filter(keep).drop_columns(["rank"])


def _leading(target: Target, schema: TableSchema, table: pa.Table) -> dict:
    n = table.num_rows
    return {
        "framework": pa.array([FRAMEWORK_NAMES.get(target.backend, target.backend)] * n, pa.string()),
        "version": pa.array([target.version] * n, pa.string()),
        "device": pa.array([target.device] * n, pa.string()),
        "op_name": pa.array([schema.op.op_name] * n, pa.string()),
        "kernel_source": table["kernel_source"],
    }


def _sorted(table: pa.Table, schema: TableSchema) -> pa.Table:
    return table.sort_by([(f, "ascending") for f in schema.key_fields] + [("case_id", "ascending")])


def build_outputs(target: Target, schema: TableSchema, chosen: pa.Table) -> tuple[pa.Table, pa.Table]:
    ok = _sorted(chosen.filter(chosen["ok"]), schema)
    failed = _sorted(chosen.filter(pc.invert(chosen["ok"])), schema)
    perf = pa.table(
        {
            **_leading(target, schema, ok),
            **{f: ok[f] for f in schema.key_fields},
            **{c: ok[c] for c in ("latency", "latency_p25", "latency_p75", "samples", "noise", "timing", "case_id")},
        }
    ).cast(schema.perf)
    failures = pa.table(
        {
            **_leading(target, schema, failed),
            **{f: failed[f] for f in schema.key_fields},
            "case_id": failed["case_id"],
            "error_class": failed["error_class"],
            "message": failed["message"],
            "attempts": failed["attempt"],
        }
    ).cast(schema.failures)
    return perf, failures


def _parquet_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, **PARQUET)
    return sink.getvalue()


def _collector_ref(tree: ProjectTree | None, wanted: str) -> str | None:
    """The git commit of the checkout, when its collector source is the one the runs used."""
    if tree is None or collector_hash(tree.root) != wanted:
        return None
    try:
        done = subprocess.run(
            ["git", "-C", str(tree.root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _events(runs: list[RunData], op: str, chosen_new: pa.Table) -> list[sc.Event]:
    counts: dict[tuple[str, bool], int] = defaultdict(int)
    if chosen_new.num_rows:
        grouped = chosen_new.group_by(["run_id", "ok"]).aggregate([("case_id", "count")])
        for row in grouped.to_pylist():
            counts[(row["run_id"], row["ok"])] = row["case_id_count"]
    events = []
    for run in runs:
        if op not in run.plan_cases:
            continue
        for e in run.events:
            events.append(
                sc.Event(
                    run_id=e["run_id"],
                    collected_at=e["collected_at"],
                    finished_at=e["finished_at"],
                    host=e["host"],
                    shard=e["shard"],
                    rows=counts[(e["run_id"], True)],
                    failures=counts[(e["run_id"], False)],
                    image=e.get("image"),
                    image_digest=e.get("image_digest"),
                    plan_hash=run.plan_hash,
                )
            )
    return events


def _runtime(target: Target, runs: list[RunData]) -> sc.Runtime:
    identity = next(iter(runs[-1].runtimes.values()))
    latest = max((e for run in runs for e in run.events), key=lambda e: e["collected_at"], default={})
    return sc.Runtime(
        framework=target.backend,
        version=target.version,
        image=latest.get("image"),
        image_digest=latest.get("image_digest"),
        python=identity.get("python"),
        torch=identity.get("torch"),
        cuda=identity.get("cuda"),
        driver=identity.get("driver"),
    )


def merge(run_dirs: list[Path], tables: Path, tree: ProjectTree | None) -> list[TableWritten]:
    tables = Path(tables)
    recover(tables)
    if tree is None:
        raise InputError("merge needs the systems/ of an opcollect checkout; pass --root")
    systems = load_systems(tree.systems)
    runs = [load_run(d) for d in run_dirs]
    groups: dict[tuple[str, str, str], list[RunData]] = defaultdict(list)
    targets: dict[tuple[str, str, str], Target] = {}
    for run in runs:
        target = _target(run, systems)
        key = (target.system.name, target.backend, target.version)
        targets[key] = target
        groups[key].append(run)
    staging = Staging(tables)
    written: list[TableWritten] = []
    try:
        for key, members in groups.items():
            hashes = {r.collector_hash for r in members}
            if len(hashes) > 1:
                raise InputError(
                    "runs of one table mix collector hashes "
                    + ", ".join(f"{r.collector_hash[:12]} ({r.run_dir})" for r in members)
                    + "; merge them into separate TABLES"
                )
            written += _merge_target(targets[key], members, hashes.pop(), tables, staging, tree)
        staging.commit()
    except BaseException:
        staging.abandon()
        raise
    return written


def _merge_target(
    target: Target, runs: list[RunData], digest: str, tables: Path, staging: Staging, tree: ProjectTree | None
) -> list[TableWritten]:
    ops = list(dict.fromkeys(op for run in runs for op in run.plan_cases))
    by_family: dict[str, list[str]] = defaultdict(list)
    for op in ops:
        by_family[schema_for_op(op).op.family].append(op)
    written = []
    for family, family_ops in by_family.items():
        directory = target.directory(family)
        old_dir = tables / directory
        old_meta = sc.read_sidecar(old_dir / sc.SIDECAR) if (old_dir / sc.SIDECAR).is_file() else None
        table_meta = dict(old_meta.tables) if isinstance(old_meta, sc.SidecarV2) else {}
        for op in family_ops:
            schema = schema_for_op(op)
            previous = table_meta.get(schema.name)
            if previous is not None and previous.collector_hash != digest:
                raise InputError(
                    f"{old_dir / sc.SIDECAR}: {schema.name} holds collector_hash {previous.collector_hash}, "
                    f"the runs have {digest}; merge into another TABLES or re-collect"
                )
            new = pa.concat_tables([_new_candidates(r, op, schema) for r in runs if op in r.plan_cases])
            new_events = _events(runs, op, new)
            old = _old_candidates(old_dir, schema)
            chosen = latest_per_case(pa.concat_tables([old, new]) if old is not None else new)
            del new, old
            perf, failures = build_outputs(target, schema, chosen)
            del chosen
            perf_name, failures_name, plan_name = table_files(schema.name)
            planned = pa.concat_tables(
                ([pq.read_table(old_dir / plan_name)] if (old_dir / plan_name).is_file() else [])
                + [
                    pa.table(
                        {
                            "case_id": r.plan_cases[op]["case_id"],
                            "plan_hash": pa.array([r.plan_hash] * r.plan_cases[op].num_rows, pa.string()),
                        }
                    )
                    for r in runs
                    if op in r.plan_cases
                ]
            )
            planned = latest_per_case_id(planned)
            perf_bytes = _parquet_bytes(perf)
            staging.write(f"{directory}/{perf_name}", perf_bytes)
            staging.write(f"{directory}/{failures_name}", _parquet_bytes(failures))
            staging.write(f"{directory}/{plan_name}", _parquet_bytes(planned))
            ids = planned["case_id"].to_pylist()
            covered = pc.is_in(
                planned["case_id"],
                value_set=pa.concat_arrays([perf["case_id"].combine_chunks(), failures["case_id"].combine_chunks()]),
            )
            status = "complete" if pc.all(covered).as_py() in (True, None) else "partial"
            events = {e.run_id: e for e in (previous.events if previous else [])}
            events.update({e.run_id: e for e in new_events})
            table_meta[schema.name] = sc.TableMeta(
                file_sha256=hashlib.sha256(perf_bytes).hexdigest(),
                rows=perf.num_rows,
                failures=failures.num_rows,
                status=status,
                collector_ref=_collector_ref(tree, digest),
                collector_hash=digest,
                case_plan_hash=hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest(),
                events=sorted(events.values(), key=lambda e: e.collected_at),
            )
            written.append(TableWritten(f"{directory}/{perf_name}", perf.num_rows, failures.num_rows, status))
        clock = [c for r in runs for c in r.records["stats.sm_clock_mhz"].to_pylist() if c is not None]
        meta = sc.SidecarV2(
            schema_version=2,
            provenance="collected",
            runtime=_runtime(target, runs),
            system=sc.System(
                name=target.system.name,
                device=target.device,
                sm=target.system.sm,
                gpus=max(1, len({i.get("worker_device") for r in runs for i in r.runtimes.values()})),
                sm_clock_mhz=sorted(clock)[len(clock) // 2] if clock else None,
                clocks_locked=None,
            ),
            tables=dict(sorted(table_meta.items())),
        )
        staging.write(f"{directory}/{sc.SIDECAR}", sc.dump_sidecar(meta).encode())
    return written


def latest_per_case_id(planned: pa.Table) -> pa.Table:
    """Planned case IDs without repeats (the newest plan's hash kept), sorted by case ID."""
    ordered = planned.sort_by([("case_id", "ascending")])
    ids = ordered["case_id"].combine_chunks()
    if len(ids) == 0:
        return ordered
    keep = pa.concat_arrays([pc.not_equal(ids.slice(0, len(ids) - 1), ids.slice(1)), pa.array([True])])
    return ordered.filter(keep)
