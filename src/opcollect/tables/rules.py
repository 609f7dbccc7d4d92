"""`opcollect check TABLES`: the data rules R1-R9 over every table directory under TABLES.

R1 schema   each file reads as parquet; columns, types and order are the table's schema
R2 keys     no two rows share a key
R3 values   no nulls; the value rules merge admits rows by (tables/values.py): latency finite and positive
            (>= 0 for an op whose latency is a difference of two timings: compute_scale, and for a case the plan
            holds at 0: OpPlan.zero_latency), 0 <= p25 <= latency <= p75 all finite, samples >= 1, noise finite
            and >= 0, timing graph/eager/cpu (none, not run, on a zero-latency case alone)
R4 account  every planned case is a row or a failure (a partial table's gaps are warnings), once,
            and nothing outside the plan is present
R5 prov.    collection_meta.yaml validates against the consumer's schema and says what our record
            (.opcollect/provenance.yaml) makes of it, which lists every file the consumer takes for a table;
            the record's hashes and counts match the files; manifest.json (when present) validates; each
            system has the spec the consumer opens, naming an NCCL directory that exists
R6 identity every row's framework, version, device and op_name match the record, its key columns (perf and
            failures) hold what its case ID names, and in a framework's
            tables every dtype column names a value the consumer knows (the torch backend's: a warning)
R7 noise    rows noisier than the bound are counted: a warning, a failure with --strict
R8 physics  rows faster than their system's speed-of-light bound are counted (a warning, a failure with --strict),
            and a warning per table gives its fraction of speed of light (tables/physics.py); `check
            --against-physics TREE` runs R8 alone over any aiconfigurator tree, legacy tables included
R9 kernels  rows whose observed kernels contradict their kernel_source label, or whose label contradicts the plan's
            dispatch, are counted (a warning, a failure with --strict; tables/observed.py)
Legacy (schema 1) sidecars, like the reference tables', have no plan, hashes or identity: R1 checks their
leading columns and latency, then R2 and R3 (latency) apply.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from opcollect.errors import InputError
from opcollect.names import framework_name
from opcollect.tables import consumer
from opcollect.tables import provenance as pv
from opcollect.tables import sidecar as sc
from opcollect.tables.schema import TableSchema, read_parquet, schemas, table_files
from opcollect.tables.values import key_faults, measured_faults, schema_untimed
from opcollect.tables.verify import MANIFEST, list_tree, read_manifest_files, sha256_file
from opcollect.yamlio import read_yaml, validate

NOISE_BOUND = 0.05
MAX_KEYS = 10


@dataclass(frozen=True)
class Finding:
    rule: str
    path: str
    message: str
    keys: tuple[str, ...] = ()
    warning: bool = False

    def render(self) -> str:
        level = "warning" if self.warning else "violation"
        shown = f": {', '.join(self.keys)}" if self.keys else ""
        return f"{self.rule} {level}: {self.path}: {self.message}{shown}"


def _ids(table: pa.Table, mask) -> tuple[str, ...]:
    """Up to MAX_KEYS offending rows: their case IDs, or their key values in a table without them."""
    picked = table.filter(mask).slice(0, MAX_KEYS)
    if "case_id" in table.column_names:
        return tuple(str(v) for v in picked["case_id"].to_pylist())
    keys = [c for c in table.column_names[3:] if c != "latency"]
    return tuple(",".join(f"{k}={row[k]}" for k in keys) for row in picked.to_pylist())


def _read_all(paths: list[Path]) -> list[pa.Table] | Finding:
    """The table files, or R1 for the first that does not read as parquet (the other rules cannot run)."""
    tables = []
    for path in paths:
        try:
            tables.append(read_parquet(path))
        except InputError as exc:
            return Finding("R1", str(path), str(exc).removeprefix(f"{path}: "))
    return tables


def _r1(path: Path, table: pa.Table, expected: pa.Schema, legacy: bool) -> list[Finding]:
    names, wanted = table.schema.names, expected.names
    if legacy:
        wanted = [n for n in wanted if n not in ("latency_p25", "latency_p75", "samples", "noise", "timing", "case_id")]
        names = names[: len(wanted)]
    if names != wanted:
        return [Finding("R1", str(path), f"columns {names} differ from {wanted}")]
    wrong = [
        f"{n}: {table.schema.field(n).type} (want {expected.field(n).type})"
        for n in wanted
        if table.schema.field(n).type != expected.field(n).type
    ]
    return [Finding("R1", str(path), "wrong types", tuple(wrong[:MAX_KEYS]))] if wrong else []


def _r2(path: Path, table: pa.Table, schema: TableSchema) -> list[Finding]:
    keys = [c for c in schema.key_columns if c in table.column_names]
    counted = table.group_by(keys).aggregate([([], "count_all")])
    dupes = counted.filter(pc.greater(counted["count_all"], 1))
    if not dupes.num_rows:
        return []
    shown = tuple(",".join(str(row[k]) for k in keys[3:]) for row in dupes.slice(0, MAX_KEYS).to_pylist())
    return [Finding("R2", str(path), f"{dupes.num_rows} keys appear more than once", shown)]


def _r3(path: Path, table: pa.Table, schema: TableSchema) -> list[Finding]:
    """No nulls, and the value rules merge admits rows by (tables/values.py); a legacy table has latency alone."""
    found = []
    for name in table.column_names:
        if table[name].null_count:
            found.append(
                Finding(
                    "R3", str(path), f"{table[name].null_count} nulls in {name}", _ids(table, pc.is_null(table[name]))
                )
            )
    untimed = schema_untimed(table, schema)  # zero-latency cases (OpPlan.zero_latency)
    faults = measured_faults(table, difference=schema.op.latency_is_difference, untimed=untimed)
    found += [Finding(f.rule, str(path), f.what, _ids(table, f.mask)) for f in faults]
    return found


def _r4(path: Path, perf: pa.Table, failures: pa.Table, planned: pa.Table, partial: bool) -> list[Finding]:
    found = []
    done = pa.concat_arrays([perf["case_id"].combine_chunks(), failures["case_id"].combine_chunks()])
    missing = pc.invert(pc.is_in(planned["case_id"], value_set=done))
    if pc.any(missing).as_py():
        count = pc.sum(missing).as_py()
        found.append(
            Finding(
                "R4",
                str(path),
                f"{count} planned cases have neither a row nor a failure",
                _ids(planned, missing),
                warning=partial,
            )
        )
    for name, table in (("rows", perf), ("failures", failures)):
        outside = pc.invert(pc.is_in(table["case_id"], value_set=planned["case_id"].combine_chunks()))
        if pc.any(outside).as_py():
            found.append(Finding("R4", str(path), f"{name} outside the plan", _ids(table, outside)))
    both = pc.is_in(failures["case_id"], value_set=perf["case_id"].combine_chunks())
    if pc.any(both).as_py():
        found.append(Finding("R4", str(path), "cases both measured and failed", _ids(failures, both)))
    return found


def _check_v2(directory: Path, meta: consumer.CollectionMeta, strict: bool, noise_bound: float) -> list[Finding]:
    record_path = directory / pv.PROVENANCE
    if not record_path.is_file():
        return [Finding("R5", str(directory), f"no {pv.PROVENANCE}; restore it, or merge the runs into a new TABLES")]
    try:
        record = pv.read_provenance(record_path)
        pv.check_sidecar_matches(directory / sc.SIDECAR, meta, record)
    except InputError as exc:
        path, _, message = str(exc).partition(": ")
        return [Finding("R5", path, message)]
    found: list[Finding] = []
    uncovered = [name for name in consumer.table_names(directory) if consumer.stem(name) not in meta.tables]
    if uncovered:
        found.append(
            Finding("R5", str(directory), f"taken for tables by the consumer, not in {sc.SIDECAR}", tuple(uncovered))
        )
    for name, entry in record.tables.items():
        schema = schemas(record.runtime.framework).get(name)
        if schema is None:
            found.append(Finding("R5", str(record_path), f"unknown table {name!r}"))
            continue
        perf_name, failures_name, plan_name = table_files(name)
        paths = [directory / n for n in (perf_name, failures_name, plan_name)]
        absent = [p.relative_to(directory).as_posix() for p in paths if not p.is_file()]
        if absent:
            found.append(Finding("R5", str(directory), f"{name}: missing files", tuple(absent)))
            continue
        read = _read_all(paths)
        if isinstance(read, Finding):
            found.append(read)
            continue
        perf, failures, planned = read
        path = paths[0]
        schema_findings = _r1(path, perf, schema.perf, legacy=False) + _r1(
            paths[1], failures, schema.failures, legacy=False
        )
        found += schema_findings
        if schema_findings:  # the other rules read columns this table may lack
            continue
        found += _r2(path, perf, schema) + _r3(path, perf, schema)
        found += _r4(path, perf, failures, planned, partial=entry.status == "partial")
        if sha256_file(path) != entry.file_sha256:
            found.append(Finding("R5", str(path), "sha256 differs from the sidecar's file_sha256"))
        if (perf.num_rows, failures.num_rows) != (entry.rows, entry.failures):
            found.append(
                Finding(
                    "R5",
                    str(path),
                    f"{perf.num_rows} rows/{failures.num_rows} failures, sidecar says {entry.rows}/{entry.failures}",
                )
            )
        runtime = record.runtime
        found += _r6(
            path,
            perf,
            schema,
            framework_name(runtime.framework, name),
            consumer.row_version(name, runtime.version, runtime.nccl_version),
            record.system.device,
        )
        found += [Finding(f.rule, str(paths[1]), f.what, _ids(failures, f.mask)) for f in key_faults(failures, schema)]
        found += _known_values(path, perf, warning=runtime.framework == "torch")
        noisy = pc.invert(pc.fill_null(pc.less_equal(perf["noise"], noise_bound), False))  # NaN is noisy too
        if pc.any(noisy).as_py():
            found.append(
                Finding(
                    "R7",
                    str(path),
                    f"{pc.sum(noisy).as_py()} rows with noise above {noise_bound}",
                    _ids(perf, noisy),
                    warning=not strict,
                )
            )
        from opcollect.tables.physics import r8_record  # physics builds on this module's Finding

        found += r8_record(path, perf, schema, record, strict)
        from opcollect.tables.observed import r9  # observed builds on this module's Finding

        found += r9(path, perf, schema, record.runtime.framework, strict)
    return found


def _r6(
    path: Path, perf: pa.Table, schema: TableSchema, framework: str | None, version: str | None, device: str | None
) -> list[Finding]:
    found = []
    for column, wanted in (
        ("framework", framework),
        ("version", version),
        ("device", device),
        ("op_name", schema.op.op_name),
    ):
        if wanted is None:
            continue
        off = pc.not_equal(perf[column], wanted)
        if pc.any(off).as_py():
            found.append(Finding("R6", str(path), f"{column} is not {wanted!r}", _ids(perf, off)))
    # every key column (comm's op_name among them) holds what its case ID names
    found += [Finding(f.rule, str(path), f.what, _ids(perf, f.mask)) for f in key_faults(perf, schema)]
    return found


def _known_values(path: Path, perf: pa.Table, warning: bool) -> list[Finding]:
    """R6: a dtype value the consumer has no quant mode for drops the whole op from its support matrix."""
    unknown = [
        f"{column}={value}"
        for column, known in consumer.known_values(path.stem).items()  # the table's own loader's values too
        if column in perf.column_names
        for value in sorted(set(pc.unique(perf[column]).to_pylist()) - known)
    ]
    if not unknown:
        return []
    message = f"dtype values {consumer.CONSUMER} does not know"
    return [Finding("R6", str(path), message, tuple(unknown), warning=warning)]


def _system_specs(root: Path) -> list[Finding]:
    """R5: every system directory of a merged tree has the spec the consumer opens it by."""
    found = []
    for directory in sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")):
        path = root / f"{directory.name}.yaml"
        if not path.is_file():
            found.append(Finding("R5", str(path), f"missing: the consumer cannot open {directory.name}; re-merge"))
            continue
        try:
            spec = validate(str(path), read_yaml(path), consumer.SpecFile)
        except InputError as exc:
            found.append(Finding("R5", str(path), str(exc).split(": ", 1)[-1]))
            continue
        if spec.data_dir != directory.name:
            found.append(Finding("R5", str(path), f"data_dir {spec.data_dir!r} is not {directory.name!r}; re-merge"))
        nccl_version = spec.misc.nccl_version
        present = sorted(p.name for p in (directory / "comm" / "nccl").glob("*") if p.is_dir())
        if present and nccl_version not in present:
            found.append(
                Finding("R5", str(path), f"misc.nccl_version {nccl_version!r}: no such comm/nccl/", tuple(present))
            )
    return found


def _version_dirs_without_sidecar(root: Path) -> list[Finding]:
    """R5: a family-layout version directory (<system>/<family>/<backend>/<version>) holding files the consumer
    takes for tables but no collection_meta.yaml: its strict load refuses the whole request
    (perf_database.py:1143-1177, 1097-1105)."""
    found = []
    for system in sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")):
        for version in sorted(system.glob("*/*/*")):
            if version.parts[-3] in consumer.NOT_FAMILIES or not version.is_dir():
                continue
            if any(part.startswith(".") for part in version.parts[-3:]) or (version / sc.SIDECAR).exists():
                continue
            names = consumer.table_names(version)
            if names:
                found.append(
                    Finding("R5", str(version), f"taken for tables by the consumer, no {sc.SIDECAR}", tuple(names))
                )
    return found


def _check_v1(directory: Path, meta: sc.SidecarV1) -> list[Finding]:
    found: list[Finding] = []
    for name in meta.tables:
        schema = schemas(meta.runtime.framework).get(name)
        path = directory / table_files(name)[0]
        if schema is None or not path.is_file():
            continue
        read = _read_all([path])
        if isinstance(read, Finding):
            found.append(read)
            continue
        [perf] = read
        findings = _r1(path, perf, schema.perf, legacy=True)
        found += findings
        if not findings:
            found += _r2(path, perf, schema) + _r3(path, perf, schema)
    return found


def check_tables(root: Path, strict: bool = False, noise_bound: float = NOISE_BOUND) -> list[Finding]:
    root = Path(root)
    sidecars = sorted(root.rglob(sc.SIDECAR))
    if not sidecars:
        raise InputError(f"{root}: no {sc.SIDECAR} below it; give the TABLES directory of `opcollect merge`")
    # a link (its target may lie outside TABLES) or a special file is nothing merge writes: the consumer's walk
    # may still read it, so check names each one, as verify does
    listing = list_tree(root)
    found = [
        Finding("R5", str(root / entry.split(" -> ")[0]), f"symbolic link (not followed): {entry}")
        for entry in listing.links
    ]
    found += [
        Finding("R5", str(root / entry.rsplit(" (", 1)[0]), f"not a regular file: {entry}") for entry in listing.special
    ]
    if (root / MANIFEST).is_file():  # verify compares it with the files; here it must at least be a manifest
        try:
            read_manifest_files(root)
        except InputError as exc:
            found.append(Finding("R5", str(root / MANIFEST), str(exc).removeprefix(f"{root / MANIFEST}: ")))
        found += _system_specs(root) + _version_dirs_without_sidecar(root)
    for path in sidecars:
        try:
            meta = sc.read_sidecar(path)
        except InputError as exc:
            found.append(Finding("R5", str(path), str(exc).split(": ", 1)[-1]))
            continue
        if isinstance(meta, consumer.CollectionMeta):
            found += _check_v2(path.parent, meta, strict, noise_bound)
        else:
            found += _check_v1(path.parent, meta)
    return found
