"""`opcollect merge RUN_DIR... --into TABLES`: shards become tables with sidecars and a manifest.

Per (system, backend, framework version) and op: the latest record per case wins (a measured row is
never replaced by a failure), merged over what TABLES already holds; both old and new events stay in
the provenance record. Mixing collector hashes in one table is refused; systems and versions are
directories. TABLES is an aiconfigurator systems root (tables/consumer.py): ``<system>.yaml`` beside each
system's directory, NCCL under ``comm/nccl/<NCCL version>/``, the consumer's collection_meta.yaml per
version directory, and our extras in its ``.opcollect/`` (tables/provenance.py).
"""

from __future__ import annotations

import hashlib
import io
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from opcollect.cases.systems import System as SystemSpec
from opcollect.cases.systems import load_systems, system_for_device
from opcollect.errors import InputError
from opcollect.names import framework_name, path_name
from opcollect.plans.hashes import collector_hash
from opcollect.project import ProjectTree
from opcollect.tables import consumer, observed
from opcollect.tables import provenance as pv
from opcollect.tables.candidates import admitted, latest_per_case, new_candidates, old_candidates, unique_planned
from opcollect.tables.ingest import RunData, load_planned, load_run
from opcollect.tables.schema import TableSchema, read_parquet, schema_for_op, table_files
from opcollect.tables.store import Staging, check_into, locked, recover
from opcollect.tables.values import tally

PARQUET = dict(compression="zstd", compression_level=3)


@dataclass(frozen=True)
class Target:
    system: SystemSpec
    backend: str
    version: str
    device: str
    nccl_version: str | None  # as the workers' probe reported it

    def directory(self, schema: TableSchema) -> str:
        if schema.name == consumer.NCCL_TABLE:
            if self.nccl_version is None:
                raise InputError(
                    f"{self.backend} {self.version}: its workers reported no nccl_version, and nccl_perf lives "
                    "under comm/nccl/<nccl_version>/; re-run the comm cases with this collector"
                )
            return consumer.nccl_directory(self.system.name, self.nccl_version)
        return consumer.version_directory(self.system.name, schema.op.family, self.backend, self.version)


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
    nccl = {r.get("nccl_version") for r in run.runtimes.values()}
    if len(nccl) > 1:
        raise InputError(f"{run.run_dir}: its workers report NCCL versions {sorted(map(str, nccl))}; run one image")
    nccl_version = nccl.pop()
    system = system_for_device(systems, device)
    if system is None:
        raise InputError(f"{run.run_dir}: device {device!r} matches no systems/*.yaml; add it to that system's devices")
    # each becomes a directory of TABLES: crafted run data must not reach outside it
    path_name(system.name, f"systems/{system.name}.yaml: field 'name'")
    path_name(run.backend, f"{run.run_dir / 'run.json'}: field 'backend'")
    path_name(version, f"{run.run_dir / 'shards'}: runtime field 'version'")
    if nccl_version is not None:
        path_name(nccl_version, f"{run.run_dir / 'shards'}: runtime field 'nccl_version'")
    return Target(system, run.backend, version, device, nccl_version)


def _leading(target: Target, schema: TableSchema, table: pa.Table) -> dict:
    n = table.num_rows
    return {
        "framework": pa.array([framework_name(target.backend, schema.name)] * n, pa.string()),
        "version": pa.array([consumer.row_version(schema.name, target.version, target.nccl_version)] * n, pa.string()),
        "device": pa.array([target.device] * n, pa.string()),
        # comm's cases carry their collective; every other op has one op_name
        "op_name": table["op_name"] if schema.op.op_name is None else pa.array([schema.op.op_name] * n, pa.string()),
        "kernel_source": table["kernel_source"],
    }


def _sorted(table: pa.Table, schema: TableSchema) -> pa.Table:
    return table.sort_by([(f, "ascending") for f in schema.key_fields] + [("case_id", "ascending")])


def build_outputs(target: Target, schema: TableSchema, chosen: pa.Table) -> tuple[pa.Table, pa.Table]:
    ok = _sorted(chosen.filter(chosen["ok"]), schema)
    failed = _sorted(chosen.filter(pc.invert(chosen["ok"])), schema)
    perf = {
        **{schema.column(f): ok[f] for f in schema.key_fields},
        **_leading(target, schema, ok),
        **{c: ok[c] for c in ("latency", "latency_p25", "latency_p75", "samples", "noise", "timing", "case_id")},
    }
    failures = {
        **{schema.column(f): failed[f] for f in schema.key_fields},
        **_leading(target, schema, failed),
        "case_id": failed["case_id"],
        "error_class": failed["error_class"],
        "message": failed["message"],
        "attempts": failed["attempt"],
    }
    # in the schema's column order: some key fields follow latency, as in the reference
    return (
        pa.table({c: perf[c] for c in schema.perf.names}).cast(schema.perf),
        pa.table({c: failures[c] for c in schema.failures.names}).cast(schema.failures),
    )


def _parquet_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, **PARQUET)
    return sink.getvalue()


def _collector_ref(tree: ProjectTree | None, wanted: str) -> str | None:
    """The git commit of the checkout, when its collector source is the one the runs used."""
    if tree is None or collector_hash(tree.root) != wanted:
        return None
    return tree.git("rev-parse", "HEAD")


def _events(runs: list[RunData], op: str, chosen_new: pa.Table) -> list[pv.Event]:
    counts: dict[tuple[str, bool], int] = defaultdict(int)
    ran: dict[str, dict[str, int]] = defaultdict(dict)
    unexpected: dict[str, int] = defaultdict(int)
    if chosen_new.num_rows:
        grouped = chosen_new.group_by(["run_id", "ok"]).aggregate([("case_id", "count")])
        for row in grouped.to_pylist():
            counts[(row["run_id"], row["ok"])] = row["case_id_count"]
        measured = chosen_new.filter(pc.and_(chosen_new["ok"], pc.is_valid(chosen_new["ran"])))
        if measured.num_rows:
            by_ran = measured.group_by(["run_id", "ran", "expected_ran"]).aggregate([("case_id", "count")])
            for row in by_ran.to_pylist():
                ran[row["run_id"]][row["ran"]] = ran[row["run_id"]].get(row["ran"], 0) + row["case_id_count"]
                if row["expected_ran"] is not None and row["ran"] != row["expected_ran"]:
                    unexpected[row["run_id"]] += row["case_id_count"]
    events = []
    for run in runs:
        if op not in run.plan_cases:
            continue
        for e in run.events:
            events.append(
                pv.Event(
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
                    garbage_lines=run.garbage_lines,
                    ran=dict(sorted(ran[e["run_id"]].items())),
                    unexpected_ran=unexpected[e["run_id"]],
                )
            )
    return events


def _host_figures(runs: list[RunData]) -> pv.HostFigures | None:
    """The CPU workers' probed figures (runtime/hostprobe.py), the highest of each over the workers: the bound
    check R8 draws from them must hold for every row; None when no worker probed (a GPU run, an older run)."""
    probed = [i["host_figures"] for r in runs for i in r.runtimes.values() if i.get("host_figures")]
    rates: dict[str, float] = {}
    for figures in probed:
        for name, value in (figures.get("dense_tflops") or {}).items():
            if value is not None and value > 0:
                rates[name] = max(rates.get(name, 0.0), value)
    bandwidth = max((f.get("bandwidth_bytes_per_s") or 0 for f in probed), default=0)
    if not rates or bandwidth <= 0:
        return None
    caches = [f["cache_bytes"] for f in probed if f.get("cache_bytes")]
    return pv.HostFigures(dense_tflops=rates, bandwidth_bytes_per_s=bandwidth, cache_bytes=max(caches, default=None))


def _runtime(target: Target, runs: list[RunData]) -> pv.Runtime:
    identity = next(iter(runs[-1].runtimes.values()))
    latest = max((e for run in runs for e in run.events), key=lambda e: e["collected_at"], default={})
    return pv.Runtime(
        framework=target.backend,
        version=target.version,
        nccl_version=target.nccl_version,
        image=latest.get("image"),
        image_digest=latest.get("image_digest"),
        python=identity.get("python"),
        torch=identity.get("torch"),
        cuda=identity.get("cuda"),
        driver=identity.get("driver"),
    )


def merge(
    run_dirs: list[Path],
    tables: Path,
    tree: ProjectTree | None,
    wait: bool = True,
    say: Callable[[str], None] = print,
    plans: tuple[Path, ...] = (),
) -> list[TableWritten]:
    """Merge the runs into TABLES under its lock; TABLES must be new, empty or a tree that verifies. The cases of
    ``plans`` (plan files of the same plan_hash as runs merged) count as planned too: a table misses them, partial."""
    tables = Path(tables)
    if tree is None:
        raise InputError("merge needs the systems/ of an opcollect checkout; pass --root")
    systems = load_systems(tree.systems)
    runs = [load_run(d) for d in run_dirs]
    planned_only = [load_planned(p) for p in plans]
    for plan in planned_only:
        if not any((r.backend, r.plan_hash) == (plan.backend, plan.plan_hash) for r in runs):
            raise InputError(f"--plan {plan.run_dir}: no run merged here is of this plan; give its run directories")
    for run in runs:
        if run.garbage_lines:
            unparsed = run.garbage_lines - sum(n for _, n in run.refused)
            parts = [f"{unparsed} not a record"] * bool(unparsed) + [f"{n} {what}" for what, n in run.refused]
            say(f"{run.run_dir}: skipped {run.garbage_lines} garbage shard lines ({', '.join(parts)})")
    groups: dict[tuple[str, str, str], list[RunData]] = defaultdict(list)
    targets: dict[tuple[str, str, str], Target] = {}
    for run in runs:
        target = _target(run, systems)
        key = (target.system.name, target.backend, target.version)
        if key in targets and targets[key].nccl_version != target.nccl_version:
            raise InputError(
                f"{run.run_dir}: NCCL {target.nccl_version}, other runs of {target.backend} {target.version} on "
                f"{target.system.name} NCCL {targets[key].nccl_version}; merge them into separate TABLES"
            )
        targets[key] = target
        groups[key].append(run)
    for members in groups.values():  # planned-only first: a table's runtime is read from its last run
        members[:0] = [p for p in planned_only if any(p.plan_hash == m.plan_hash for m in members)]
    check_into(tables, verify=False)  # a file or a foreign directory: refused before the lock file appears
    with locked(tables, wait, say):
        recover(tables)
        check_into(tables)
        staging = Staging(tables)
        written: list[TableWritten] = []
        try:
            nccl_written: dict[str, str] = {}  # system -> the NCCL version whose table this merge wrote
            for key, members in groups.items():
                hashes = {r.collector_hash for r in members}
                if len(hashes) > 1:
                    raise InputError(
                        "runs of one table mix collector hashes "
                        + ", ".join(f"{r.collector_hash[:12]} ({r.run_dir})" for r in members)
                        + "; merge them into separate TABLES"
                    )
                found = _merge_target(targets[key], members, hashes.pop(), tables, staging, tree, say)
                written += found
                if any(t.path.endswith(f"/{consumer.NCCL_TABLE}.parquet") for t in found):
                    nccl_written[key[0]] = targets[key].nccl_version
            for target in {t.system.name: t for t in targets.values()}.values():
                _write_system_spec(target, nccl_written.get(target.system.name), tables, staging)
            staging.commit()
        except BaseException:
            staging.abandon()
            raise
    return written


def _write_system_spec(target: Target, nccl_written: str | None, tables: Path, staging: Staging) -> None:
    """``<system>.yaml``: misc.nccl_version names the NCCL table this merge wrote, else the one it named."""
    name = target.system.name
    old = tables / f"{name}.yaml"
    nccl_version = nccl_written or (consumer.spec_nccl_version(old.read_text()) if old.is_file() else None)
    text = consumer.system_spec_yaml(name, target.system.aiconfigurator, nccl_version or target.nccl_version)
    staging.write(f"{name}.yaml", text.encode())


def _merge_table(
    target: Target,
    runs: list[RunData],
    op: str,
    tables: Path,
    staging: Staging,
    previous: pv.TableMeta | None,
    digest: str,
    collector_ref: str | None,
    say: Callable[[str], None],
) -> tuple[pv.TableMeta, TableWritten]:
    """One table: choose the rows, write perf, failures and plan into staging, and describe it."""
    schema = schema_for_op(op, target.backend)
    directory = target.directory(schema)
    old_dir = tables / directory
    if previous is not None and previous.collector_hash != digest:
        raise InputError(
            f"{old_dir / pv.PROVENANCE}: {schema.name} holds collector_hash {previous.collector_hash}, "
            f"the runs have {digest}; merge into another TABLES or re-collect"
        )
    perf_name, failures_name, plan_name = table_files(schema.name)
    new = pa.concat_tables([new_candidates(r, op, schema) for r in runs if op in r.plan_cases])
    new_events = _events(runs, op, new)
    old = old_candidates(old_dir, schema)
    if old is not None:  # a row stored before merge held rows to the value rules does not stick
        old, faults = admitted(old, schema)
        if faults:
            broken = ", ".join(f"{n} {what}" for what, n in tally(faults))
            say(f"{old_dir / perf_name}: dropped stored rows that fail the value rules ({broken}); re-collect them")
    chosen = latest_per_case(pa.concat_tables([old, new]) if old is not None else new)
    del new, old  # the largest tables of a merge: free them before building the outputs
    perf, failures = build_outputs(target, schema, chosen)
    kernels = observed.extras(chosen)  # what each measured case ran, beside the table (tables/observed.py)
    del chosen
    stored = [read_parquet(old_dir / plan_name)] if (old_dir / plan_name).is_file() else []
    planned = unique_planned(
        pa.concat_tables(
            stored
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
    )
    perf_bytes = _parquet_bytes(perf)
    staging.write(f"{directory}/{perf_name}", perf_bytes)
    staging.write(f"{directory}/{failures_name}", _parquet_bytes(failures))
    staging.write(f"{directory}/{plan_name}", _parquet_bytes(planned))
    staging.write(f"{directory}/{observed.kernels_file(schema.name)}", _parquet_bytes(kernels))
    done = pa.concat_arrays([perf["case_id"].combine_chunks(), failures["case_id"].combine_chunks()])
    status = "complete" if pc.all(pc.is_in(planned["case_id"], value_set=done)).as_py() in (True, None) else "partial"
    events = {e.run_id: e for e in (previous.events if previous else [])}
    events.update({e.run_id: e for e in new_events})
    meta = pv.TableMeta(
        file_sha256=hashlib.sha256(perf_bytes).hexdigest(),
        rows=perf.num_rows,
        failures=failures.num_rows,
        status=status,
        collector_ref=collector_ref,
        collector_hash=digest,
        # planned is sorted by case ID (ASCII, so Arrow's byte order is Python's)
        case_plan_hash=hashlib.sha256("\n".join(planned["case_id"].to_pylist()).encode()).hexdigest(),
        events=sorted(events.values(), key=lambda e: e.collected_at),
    )
    return meta, TableWritten(f"{directory}/{perf_name}", perf.num_rows, failures.num_rows, status)


def _owner(record: pv.Provenance | None, target: Target) -> str | None:
    """Who else's NCCL table a directory holds: NCCL's is one per system and NCCL version."""
    if record is None or (record.runtime.framework, record.runtime.version) == (target.backend, target.version):
        return None
    return f"{record.runtime.framework} {record.runtime.version}"


def _merge_target(
    target: Target,
    runs: list[RunData],
    digest: str,
    tables: Path,
    staging: Staging,
    tree: ProjectTree | None,
    say: Callable[[str], None],
) -> list[TableWritten]:
    by_directory: dict[str, list[str]] = defaultdict(list)
    # an op no run planned a case of (custom_allreduce for torch, every case skipped) makes no empty table
    for op in dict.fromkeys(op for run in runs for op, planned in run.plan_cases.items() if planned.num_rows):
        by_directory[target.directory(schema_for_op(op))].append(op)
    collector_ref = _collector_ref(tree, digest)
    written = []
    for directory, directory_ops in by_directory.items():
        record_path = tables / directory / pv.PROVENANCE
        old = pv.read_provenance(record_path) if record_path.is_file() else None
        owner = _owner(old, target) if directory_ops == ["comm"] else None
        if owner is not None:
            say(
                f"{directory}: keeps the nccl_perf {owner} collected; NCCL is one table per system and NCCL "
                f"version, so {target.backend} {target.version}'s comm cases are not merged (its run "
                "directories keep them)"
            )
            continue
        table_meta = dict(old.tables) if old is not None else {}
        for op in directory_ops:
            name = schema_for_op(op).name
            table_meta[name], table = _merge_table(
                target, runs, op, tables, staging, table_meta.get(name), digest, collector_ref, say
            )
            written.append(table)
        clock = [c for r in runs for c in r.records["stats.sm_clock_mhz"].to_pylist() if c is not None]
        record = pv.Provenance(
            schema_version=1,
            runtime=_runtime(target, runs),
            system=pv.System(
                name=target.system.name,
                device=target.device,
                sm=target.system.sm,
                gpus=max(1, len({i.get("worker_device") for r in runs for i in r.runtimes.values()})),
                sm_clock_mhz=sorted(clock)[len(clock) // 2] if clock else None,
                clocks_locked=None,
                host_figures=_host_figures(runs),
            ),
            tables=dict(sorted(table_meta.items())),
        )
        staging.write(f"{directory}/{pv.PROVENANCE}", pv.dump_provenance(record).encode())
        sidecar = consumer.dump_collection_meta(pv.collection_meta(record))
        staging.write(f"{directory}/{consumer.SIDECAR}", sidecar.encode())
    return written
