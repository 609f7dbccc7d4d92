"""verify catches tampering; check names the rule each broken table violates; the sidecar is strict.

A version directory holds the consumer's collection_meta.yaml and perf tables; our provenance record,
failures and plans are in its .opcollect/; TABLES/<system>.yaml is the system spec the consumer opens.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import REFERENCE, fake_run, run_cli

from opcollect.errors import InputError
from opcollect.plans.gemm import GemmCase
from opcollect.project import find_project
from opcollect.tables.merge import merge
from opcollect.tables.observed import KERNELS
from opcollect.tables.provenance import PROVENANCE, read_provenance
from opcollect.tables.rules import check_tables
from opcollect.tables.sidecar import SidecarV1, read_sidecar
from opcollect.tables.verify import sha256_file, verify_tables

CASES = [GemmCase("bfloat16", m, n, 1024) for m in (1, 8, 64) for n in (1024, 2048)]
DIR = "h200_sxm/gemm/vllm/0.24.0"


@pytest.fixture
def tables(tmp_path):
    root = tmp_path / "tables"
    merge([fake_run(tmp_path / "run", CASES, status={"gemm:bfloat16:m=64,n=2048,k=1024": "oom"})], root, find_project())
    assert verify_tables(root).clean
    return root


def test_flipped_byte_in_parquet(tables):
    path = tables / DIR / "gemm_perf.parquet"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    report = verify_tables(tables)
    assert report.modified == [f"{DIR}/gemm_perf.parquet"] and report.sidecar == [f"{DIR}/gemm_perf.parquet"]
    done = run_cli("verify", str(tables))
    assert done.returncode == 1 and f"modified: {DIR}/gemm_perf.parquet" in done.stdout


def _edit_yaml(path, change):
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def _r5(tables):
    return [f for f in check_tables(tables) if f.rule == "R5"]


def test_edited_sidecar(tables):
    """collection_meta.yaml's table rows edited: the manifest catches it, and R5 holds it to our record."""
    _edit_yaml(tables / DIR / "collection_meta.yaml", lambda d: d["tables"]["gemm_perf"].update(rows=6))
    assert verify_tables(tables).modified == [f"{DIR}/collection_meta.yaml"]
    [finding] = _r5(tables)
    assert finding.path == str(tables / DIR / "collection_meta.yaml") and not finding.warning
    assert finding.message == "field 'tables.gemm_perf.rows' differs from .opcollect/provenance.yaml; " + (
        "restore the file or re-merge"
    )
    done = run_cli("check", str(tables))
    assert done.returncode == 1 and "R5 violation" in done.stdout


def test_edited_provenance_counts(tables):
    """.opcollect/provenance.yaml's counts edited: the manifest catches it, and R5 counts the files."""
    record = tables / DIR / PROVENANCE
    _edit_yaml(record, lambda d: d["tables"]["gemm_perf"].update(failures=2))  # not in collection_meta.yaml
    assert verify_tables(tables).modified == [f"{DIR}/{PROVENANCE}"]
    assert [f.message for f in _r5(tables)] == ["5 rows/1 failures, sidecar says 5/2"]
    # rows edited in both files alike, so that they agree with each other: the files still disagree
    _edit_yaml(record, lambda d: d["tables"]["gemm_perf"].update(failures=1, rows=6))
    _edit_yaml(tables / DIR / "collection_meta.yaml", lambda d: d["tables"]["gemm_perf"].update(rows=6))
    assert sorted(verify_tables(tables).modified) == [f"{DIR}/{PROVENANCE}", f"{DIR}/collection_meta.yaml"]
    assert [f.message for f in _r5(tables)] == ["5 rows/1 failures, sidecar says 6/1"]
    # rows edited in the record alone: collection_meta.yaml no longer says what the record makes
    _edit_yaml(tables / DIR / "collection_meta.yaml", lambda d: d["tables"]["gemm_perf"].update(rows=5))
    assert ["differs from .opcollect/provenance.yaml" in f.message for f in _r5(tables)] == [True]


def test_deleted_and_extra_files(tables):
    (tables / DIR / ".opcollect/gemm_failures.parquet").unlink()
    report = verify_tables(tables)
    assert report.missing == [f"{DIR}/.opcollect/gemm_failures.parquet"] and report.unexpected == []
    assert run_cli("verify", str(tables)).returncode == 1
    [finding] = _r5(tables)
    assert "gemm_perf: missing files" in finding.message and finding.keys == (".opcollect/gemm_failures.parquet",)


def test_a_planted_file_is_unexpected_and_taken_for_a_table(tables):
    """The consumer takes every non-dot file of a version directory for a table: check says so, verify too."""
    (tables / DIR / "notes.txt").write_text("hello")
    (tables / DIR / ".opcollect/notes.txt").write_text("hello")  # where the consumer does not read
    (tables / DIR / ".opcollect/manifest.json").write_text("{}")  # a manifest's name below the root is a file too
    report = verify_tables(tables)
    planted = [f"{DIR}/.opcollect/manifest.json", f"{DIR}/.opcollect/notes.txt", f"{DIR}/notes.txt"]
    assert report.unexpected == planted and report.missing == []
    assert run_cli("verify", str(tables)).returncode == 1
    [finding] = _r5(tables)
    assert finding.path == str(tables / DIR) and finding.keys == ("notes.txt",)
    assert finding.message == "taken for tables by the consumer, not in collection_meta.yaml" and not finding.warning


def test_a_missing_or_broken_system_spec(tables):
    spec = tables / "h200_sxm.yaml"
    text = spec.read_text()
    spec.unlink()
    assert verify_tables(tables).missing == ["h200_sxm.yaml"]
    [finding] = _r5(tables)
    assert finding.path == str(spec) and finding.message.startswith("missing: the consumer cannot open h200_sxm")
    spec.write_text(text.replace("data_dir: h200_sxm", "data_dir: elsewhere"))
    assert [f.message for f in _r5(tables)] == ["data_dir 'elsewhere' is not 'h200_sxm'; re-merge"]
    spec.write_text(text.replace("  mem_bw:", "  mem_bandwidth:"))
    [finding] = _r5(tables)
    assert finding.path == str(spec) and "'gpu.mem_bandwidth': unknown field" in finding.message


def test_verify_without_manifest_is_bad_input(tmp_path):
    done = run_cli("verify", str(tmp_path))
    assert done.returncode == 2 and "no manifest.json" in done.stderr


def _rewrite(tables, change, name="gemm_perf.parquet"):
    path = tables / DIR / name
    path.write_bytes(b"")
    table = change(pq.read_table(_original(tables, name)))
    pq.write_table(table, path)


def _original(tables, name):
    return tables.parent / "run-original" / Path(name).name


@pytest.fixture
def breakable(tables):
    keep = tables.parent / "run-original"
    keep.mkdir()
    for name in ("gemm_perf.parquet", ".opcollect/gemm_failures.parquet", ".opcollect/gemm_plan.parquet"):
        shutil.copy(tables / DIR / name, keep / Path(name).name)
    return tables


def _rules(tables, strict=False):
    return {(f.rule, f.warning) for f in check_tables(tables, strict=strict)}


def test_r1_schema(breakable):
    _rewrite(breakable, lambda t: t.drop_columns(["noise"]))
    assert ("R1", False) in _rules(breakable)
    _rewrite(breakable, lambda t: t.set_column(t.schema.get_field_index("m"), "m", pc.cast(t["m"], pa.int32())))
    findings = check_tables(breakable)
    assert any(f.rule == "R1" and "m: int32 (want int64)" in f.keys for f in findings)


def test_r2_duplicate_keys(breakable):
    _rewrite(breakable, lambda t: pa.concat_tables([t, t.slice(0, 1)]))
    [finding] = [f for f in check_tables(breakable) if f.rule == "R2"]
    assert "1 keys appear more than once" in finding.message
    assert finding.keys == ("gemm,cutlass,bfloat16,1,1024,1024",)  # op_name, kernel_source, then the key fields


def test_r3_values(breakable):
    def negative(t):
        latency = pc.multiply(t["latency"], -1.0)
        return t.set_column(t.schema.get_field_index("latency"), "latency", latency)

    _rewrite(breakable, negative)
    findings = [f for f in check_tables(breakable) if f.rule == "R3"]
    assert any("latency not finite and positive" in f.message for f in findings)
    assert any("p25 <= latency <= p75" in f.message for f in findings)
    _rewrite(
        breakable,
        lambda t: t.set_column(
            t.schema.get_field_index("timing"), "timing", pa.array([None] * t.num_rows, pa.string())
        ),
    )
    assert any(f.rule == "R3" and "nulls in timing" in f.message for f in check_tables(breakable))


def test_r4_accounting(breakable):
    _rewrite(breakable, lambda t: t.slice(1))  # a measured case vanished from a complete table
    finding = next(f for f in check_tables(breakable) if f.rule == "R4")
    assert not finding.warning and "1 planned cases have neither" in finding.message
    _rewrite(breakable, lambda t: t.slice(0, 1), name=".opcollect/gemm_plan.parquet")
    _rewrite(breakable, lambda t: t)
    assert any(f.rule == "R4" and "rows outside the plan" in f.message for f in check_tables(breakable))


def test_r5_provenance(breakable):
    meta = breakable / DIR / "collection_meta.yaml"
    data = yaml.safe_load(meta.read_text())
    data["tables"]["gemm_perf"]["surprise"] = 1
    meta.write_text(yaml.safe_dump(data))
    [finding] = [f for f in check_tables(breakable) if f.rule == "R5"]
    assert "tables.gemm_perf.surprise" in finding.message and "unknown field" in finding.message
    del data["tables"]["gemm_perf"]["surprise"]
    meta.write_text(yaml.safe_dump(data))
    assert [f for f in check_tables(breakable) if f.rule == "R5"] == []
    record = breakable / DIR / PROVENANCE
    record_data = yaml.safe_load(record.read_text())
    record_data["tables"]["gemm_perf"]["surprise"] = 1
    record.write_text(yaml.safe_dump(record_data))
    [finding] = [f for f in check_tables(breakable) if f.rule == "R5"]
    assert finding.path == str(record) and "tables.gemm_perf.surprise" in finding.message
    record.unlink()
    [finding] = [f for f in check_tables(breakable) if f.rule == "R5"]
    assert finding.message.startswith("no .opcollect/provenance.yaml")


def test_r6_identity(breakable):
    _rewrite(
        breakable,
        lambda t: t.set_column(
            t.schema.get_field_index("device"), "device", pa.array(["NVIDIA H100 80GB HBM3"] * t.num_rows)
        ),
    )
    finding = next(f for f in check_tables(breakable) if f.rule == "R6")
    assert "device is not 'NVIDIA H200'" in finding.message and len(finding.keys) == 5


def _dtype(value, rows=1):
    """The first rows' gemm_dtype made ``value``, their case IDs with it (R6 holds a key column to its case ID)."""

    def change(t):
        column = t["gemm_dtype"].to_pylist()
        ids = t["case_id"].to_pylist()
        column[:rows] = [value] * rows
        ids[:rows] = [i.replace(":bfloat16:", f":{value}:") for i in ids[:rows]]
        t = t.set_column(t.schema.get_field_index("gemm_dtype"), "gemm_dtype", pa.array(column, pa.string()))
        return t.set_column(t.schema.get_field_index("case_id"), "case_id", pa.array(ids, pa.string()))

    return change


def test_r6_a_dtype_the_consumer_does_not_know_in_a_framework_table(breakable):
    """float32 in a framework's GEMM table drops GEMM from the consumer's support matrix: a violation."""
    _rewrite(breakable, _dtype("float32"))
    [finding] = [f for f in check_tables(breakable) if f.rule == "R6"]
    assert not finding.warning and "does not know" in finding.message
    assert len(finding.keys) == 1 and "float32" in finding.keys[0]  # the one unknown value, named
    done = run_cli("check", str(breakable))
    assert done.returncode == 1 and "R6 violation" in done.stdout


def test_r6_a_dtype_the_consumer_does_not_know_in_a_torch_table_is_a_warning(tmp_path):
    tables = tmp_path / "tables"
    cases = [GemmCase("float32", m, 64, 64) for m in (1, 2)]
    merge(
        [fake_run(tmp_path / "run", cases, backend="torch", version="2.8.0", device="cpu", sm="cpu")],
        tables,
        find_project(),
    )
    findings = check_tables(tables)
    [finding] = [f for f in findings if f.rule == "R6"]
    assert finding.warning and "does not know" in finding.message
    assert len(finding.keys) == 1 and "float32" in finding.keys[0]
    assert [f.render() for f in findings if not f.warning] == []
    done = run_cli("check", str(tables))
    assert done.returncode == 0 and "0 violations" in done.stdout


def test_r7_noise_is_a_warning_unless_strict(breakable):
    def noisy(t):
        return t.set_column(t.schema.get_field_index("noise"), "noise", pa.array([0.2] * t.num_rows))

    _rewrite(breakable, noisy)
    assert ("R7", True) in _rules(breakable)
    assert ("R7", False) in _rules(breakable, strict=True)
    done = run_cli("check", str(breakable), "--strict")
    assert done.returncode == 1 and "R7 violation" in done.stdout


def test_clean_tables_pass_check_cli(tables):
    done = run_cli("check", str(tables))
    assert done.returncode == 0 and "0 violations" in done.stdout


def test_sidecar_reader_is_strict_and_reads_legacy(tables, tmp_path):
    for path in sorted(REFERENCE.rglob("collection_meta.yaml")):
        assert isinstance(read_sidecar(path), SidecarV1)
    meta = tables / DIR / "collection_meta.yaml"
    data = yaml.safe_load(meta.read_text())
    data["tables"]["gemm_perf"]["rows"] = "five"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(InputError, match=r"bad.yaml: field 'tables.gemm_perf.rows': Input should be a valid integer"):
        read_sidecar(bad)
    record = yaml.safe_load((tables / DIR / PROVENANCE).read_text())
    record["system"]["gpus"] = "eight"
    bad.write_text(yaml.safe_dump(record))
    with pytest.raises(InputError, match=r"bad.yaml: field 'system.gpus': Input should be a valid integer"):
        read_provenance(bad)
    data["tables"]["gemm_perf"]["rows"] = 5
    data["schema_version"] = 3
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(InputError, match="schema_version"):
        read_sidecar(bad)


def test_reference_tables_pass_the_rules_that_apply():
    assert [f.render() for f in check_tables(REFERENCE) if not f.warning] == []


def test_a_schema_break_in_one_table_does_not_hide_another_tables_findings(tmp_path):
    """context and generation attention share a sidecar: R1 in the first must not skip R2 in the second."""
    from opcollect.plans.attention import AttentionCase

    tables = tmp_path / "tables"
    ctx = [AttentionCase(b, 16, 8, 1, 64, 1, "bfloat16", "bfloat16", 0, 0) for b in (1, 2)]
    gen = [AttentionCase(b, 1, 8, 1, 64, 1, "bfloat16", "bfloat16", 127, 0) for b in (1, 2)]
    merge(
        [
            fake_run(tmp_path / "c", ctx, op="attention_context", run_id="c"),
            fake_run(tmp_path / "g", gen, op="attention_generation", run_id="g"),
        ],
        tables,
        find_project(),
    )
    directory = tables / "h200_sxm/attention/vllm/0.24.0"
    context = directory / "context_attention_perf.parquet"
    pq.write_table(pq.read_table(context).drop_columns(["noise"]), context)
    generation = directory / "generation_attention_perf.parquet"
    table = pq.read_table(generation)
    pq.write_table(pa.concat_tables([table, table.slice(0, 1)]), generation)
    rules = {(f.rule, Path(f.path).name) for f in check_tables(tables)}
    assert ("R1", "context_attention_perf.parquet") in rules
    assert ("R2", "generation_attention_perf.parquet") in rules


def test_check_without_a_sidecar_is_bad_input(tmp_path):
    (tmp_path / "gemm_perf.parquet").write_bytes(b"")
    with pytest.raises(InputError) as raised:
        check_tables(tmp_path)
    assert str(raised.value) == (
        f"{tmp_path}: no collection_meta.yaml below it; give the TABLES directory of `opcollect merge`"
    )


def test_r5_a_table_the_record_names_that_no_schema_knows(tables):
    """The record and collection_meta.yaml agree on a table name no schema has: R5 names it, the file is uncovered."""
    for path in (tables / DIR / "collection_meta.yaml", tables / DIR / PROVENANCE):
        _edit_yaml(path, lambda d: d["tables"].update(bogus_perf=d["tables"].pop("gemm_perf")))
    assert sorted((f.path, f.message, f.keys) for f in _r5(tables)) == [
        (str(tables / DIR), "taken for tables by the consumer, not in collection_meta.yaml", ("gemm_perf.parquet",)),
        (str(tables / DIR / PROVENANCE), "unknown table 'bogus_perf'", ()),
    ]


def test_r5_a_system_spec_naming_an_nccl_version_the_tree_lacks(tables):
    """The spec's misc.nccl_version (2.26.2, from the run) must be one of the tree's comm/nccl/ directories."""
    nccl = tables / "h200_sxm/comm/nccl"
    (nccl / "2.29.2").mkdir(parents=True)
    [finding] = _r5(tables)
    assert finding.path == str(tables / "h200_sxm.yaml") and finding.keys == ("2.29.2",)
    assert finding.message == "misc.nccl_version '2.26.2': no such comm/nccl/"
    (nccl / "2.26.2").mkdir()
    assert _r5(tables) == []


def test_r5_skips_legacy_layout_directories_and_files_where_version_directories_lie(tables):
    """<system>/<family>/<backend>/<version> with tables and no sidecar is R5; a legacy-layout backend's
    subdirectory (<system>/vllm/<version>/<dir>) and a file at a version directory's depth are no version directory."""
    legacy = tables / "h200_sxm/vllm/0.24.0/extra"
    legacy.mkdir(parents=True)
    (legacy / "gemm_perf.txt").write_text("x")
    (tables / "h200_sxm/gemm/vllm/notes.txt").write_text("x")
    assert _r5(tables) == []
    family = tables / "h200_sxm/moe/vllm/0.24.0"
    family.mkdir(parents=True)
    (family / "moe_perf.txt").write_text("x")
    [finding] = _r5(tables)
    assert (finding.path, finding.keys) == (str(family), ("moe_perf.txt",))
    assert finding.message == "taken for tables by the consumer, no collection_meta.yaml"


def _legacy(tmp_path, change=lambda t: t):
    """A legacy (schema 1) tree like the reference tables': the vLLM GEMM sidecar and two rows of its table."""
    directory = tmp_path / "legacy" / "gemm/vllm/0.24.0"
    directory.mkdir(parents=True)
    source = REFERENCE / "gemm/vllm/0.24.0"
    shutil.copy(source / "collection_meta.yaml", directory)
    pq.write_table(change(pq.read_table(source / "gemm_perf.parquet").slice(0, 2)), directory / "gemm_perf.parquet")
    return directory


def test_legacy_findings_name_rows_by_their_key_values(tmp_path):
    """A legacy table has no case IDs: check names an offending row by its key columns (op_name on), not latency."""

    def negative(t):
        return t.set_column(t.schema.get_field_index("latency"), "latency", pa.array([1.5, -1.0]))

    directory = _legacy(tmp_path, negative)
    [finding] = check_tables(tmp_path / "legacy")
    assert (finding.rule, finding.path, finding.message) == (
        "R3",
        str(directory / "gemm_perf.parquet"),
        "latency not finite and positive",
    )
    assert finding.keys == (
        "op_name=gemm,kernel_source=CutlassFP8ScaledMMLinearKernel,gemm_dtype=fp8,m=32768,n=4096,k=65536",
    )


def test_legacy_table_that_does_not_read_and_tables_not_there(tmp_path):
    directory = _legacy(tmp_path)
    assert check_tables(tmp_path / "legacy") == []
    path = directory / "gemm_perf.parquet"
    path.write_bytes(b"not parquet")
    [finding] = check_tables(tmp_path / "legacy")
    assert (finding.rule, finding.path) == ("R1", str(path))
    assert finding.message.startswith("not a readable parquet table (")
    # a table the sidecar lists that the directory lacks, or that no schema knows, has nothing to check
    path.unlink()
    _edit_yaml(directory / "collection_meta.yaml", lambda d: d["tables"].update(bogus_perf={"status": "complete"}))
    (directory / "bogus_perf.parquet").write_bytes(b"not parquet")
    assert check_tables(tmp_path / "legacy") == []


# ---- R9 over the kernels file (tables/observed.py); no torch needed, so here rather than test_observed_kernels.py
KERNELS_FILE = f"{DIR}/.opcollect/gemm_kernels.parquet"


def _kernels(tables, change):
    """The kernels file rewritten by ``change``, and the manifest told (as a TABLES another writer made)."""
    path = tables / KERNELS_FILE
    pq.write_table(change(pq.read_table(path)), path)
    manifest = json.loads((tables / "manifest.json").read_text())
    manifest["files"][KERNELS_FILE] = {"sha256": sha256_file(path), "size": path.stat().st_size}
    (tables / "manifest.json").write_text(json.dumps(manifest))
    return path


def _column(table, name, values):
    return table.set_column(table.schema.get_field_index(name), name, pa.array(values, table.schema.field(name).type))


def _r9(tables, strict=False):
    return [(f.path, f.message, f.keys, f.warning) for f in check_tables(tables, strict=strict) if f.rule == "R9"]


def test_r9_a_kernels_file_that_does_not_read_or_has_other_columns(tables):
    path = tables / KERNELS_FILE
    path.write_bytes(b"not parquet")
    [(where, message, keys, warning)] = _r9(tables)
    assert (where, keys, warning) == (str(path), (), False)
    assert message.startswith("not a readable parquet table (")
    shutil.copy(tables / DIR / "gemm_perf.parquet", path)  # parquet, but not the kernels file's columns
    [(where, message, keys, warning)] = _r9(tables)
    assert (where, keys, warning) == (str(path), (), False)
    names = pq.read_schema(path).names
    assert message == f"columns {names} are not {KERNELS.names}"


def test_merge_into_tables_whose_kernels_file_has_other_columns_is_bad_input(tables, tmp_path):
    path = _kernels(tables, lambda t: t.drop_columns(["kernels_unread"]))
    assert verify_tables(tables).clean
    with pytest.raises(InputError) as raised:
        merge([tmp_path / "run"], tables, find_project())
    assert str(raised.value) == (
        f"{path}: columns ['case_id', 'dispatch', 'kernel_source', 'kernels'] are not {KERNELS.names}; "
        "re-merge into a new TABLES"
    )


def test_r9_a_label_other_than_the_plans_dispatch(tmp_path):
    """A row labelled DeepGEMM where its plan dispatched CUTLASS: a warning, a violation with --strict."""
    tables = tmp_path / "tables"
    cases = [GemmCase("fp8_block", m, 4096, 7168) for m in (1, 64)]
    merge([fake_run(tmp_path / "run", cases, kernel_source="DeepGemmFp8BlockScaledMMKernel")], tables, find_project())
    assert _r9(tables) == []
    _kernels(
        tables, lambda t: _column(t, "dispatch", ["CutlassFp8BlockScaledMMKernel", "DeepGemmFp8BlockScaledMMKernel"])
    )
    wanted = (
        str(tables / DIR / "gemm_perf.parquet"),
        "1 rows report another kernel_source than their plan's dispatch",
        (
            "gemm:fp8_block:m=1,n=4096,k=7168 "
            "(CutlassFp8BlockScaledMMKernel planned, DeepGemmFp8BlockScaledMMKernel ran)",
        ),
    )
    assert _r9(tables) == [(*wanted, True)]
    assert _r9(tables, strict=True) == [(*wanted, False)]


def test_r9_a_label_the_backends_kernel_table_does_not_know(tmp_path):
    """Rows that observed kernels under a label backends/vllm/kernels.py lacks: a warning even with --strict, counted
    per label; a row that observed nothing is not counted."""
    tables = tmp_path / "tables"
    cases = [GemmCase("bfloat16", m, 1024, 1024) for m in (1, 8, 64)]
    merge([fake_run(tmp_path / "run", cases, kernel_source="MysteryKernel")], tables, find_project())
    assert _r9(tables) == []
    _kernels(tables, lambda t: _column(t, "kernels", [["void mystery_gemm"], ["void mystery_gemm"], []]))
    assert _r9(tables, strict=True) == [
        (
            str(tables / DIR / "gemm_perf.parquet"),
            "kernel_source labels the vllm kernel table does not know (backends/vllm/kernels.py)",
            ("MysteryKernel (2 rows)",),
            True,
        )
    ]


def test_r6_takes_every_kv_cache_dtype_the_consumer_knows_and_names_one_it_does_not(tmp_path):
    """aiconfigurator-core's KV cache quant modes are bfloat16, int8 and fp8: an int8 cache is no finding, int4 is
    a violation in a framework's table."""
    from opcollect.plans.attention import AttentionCase

    found = {}
    for kv in ("int8", "fp8", "int4"):
        cases = [AttentionCase(b, 1, 8, 8, 128, 1, "bfloat16", kv, 1024, 0) for b in (1, 2)]
        tables = tmp_path / kv
        run = fake_run(tmp_path / f"run-{kv}", cases, op="attention_generation", backend="trtllm",
                       version="1.3.0rc23", kernel_source="torch_flow")  # fmt: skip
        merge([run], tables, find_project(), say=lambda line: None)
        found[kv] = [f for f in check_tables(tables) if f.rule == "R6"]
    assert found["int8"] == [] and found["fp8"] == []
    [unknown] = found["int4"]
    assert not unknown.warning and "does not know" in unknown.message and "int4" in unknown.keys[0]
