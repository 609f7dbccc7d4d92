"""merge: layout, columns, latest-wins, events, status, refusals, determinism, atomicity."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest
from conftest import REFERENCE, ROOT, fake_run, run_cli

from opcollect.errors import InputError
from opcollect.plans.comm import CommCase
from opcollect.plans.gemm import GemmCase
from opcollect.project import find_project
from opcollect.tables.consumer import CollectionMeta
from opcollect.tables.merge import merge
from opcollect.tables.provenance import PROVENANCE, read_provenance
from opcollect.tables.rules import check_tables
from opcollect.tables.sidecar import read_sidecar
from opcollect.tables.verify import verify_tables

CASES = [GemmCase("bfloat16", m, n, 4096) for m in (1, 2, 4) for n in (4096, 7168)]
DIR = "h200_sxm/gemm/vllm/0.24.0"


def _perf(tables):
    return pq.read_table(tables / DIR / "gemm_perf.parquet")


def test_layout_columns_and_sidecar(tmp_path):
    run = fake_run(tmp_path / "run", CASES, status={"gemm:bfloat16:m=1,n=7168,k=4096": "kernel_limit"})
    tables = tmp_path / "tables"
    [written] = merge([run], tables, find_project())
    assert written.path == f"{DIR}/gemm_perf.parquet" and (written.rows, written.failures) == (5, 1)
    # the consumer takes every non-dot file of a version directory for a table: our extras are in .opcollect/
    assert sorted(p.name for p in (tables / DIR).iterdir()) == [
        ".opcollect",
        "collection_meta.yaml",
        "gemm_perf.parquet",
    ]
    assert sorted(p.name for p in (tables / DIR / ".opcollect").iterdir()) == [
        "gemm_failures.parquet",
        "gemm_kernels.parquet",  # the kernels each row ran (tables/observed.py)
        "gemm_plan.parquet",
        "provenance.yaml",
    ]
    assert (tables / "h200_sxm.yaml").is_file()  # the system spec the consumer opens the tree by
    perf = _perf(tables)
    reference = pq.read_table(REFERENCE / "gemm/vllm/0.24.0/gemm_perf.parquet").schema
    assert perf.schema.names[: len(reference.names)] == reference.names  # the reference columns lead, in order
    assert [perf.schema.field(n).type for n in reference.names] == [reference.field(n).type for n in reference.names]
    assert perf.schema.names[len(reference.names) :] == [
        "latency_p25",
        "latency_p75",
        "samples",
        "noise",
        "timing",
        "case_id",
    ]
    row = perf.to_pylist()[0]
    assert (row["framework"], row["version"], row["device"], row["op_name"]) == (
        "VLLM",
        "0.24.0",
        "NVIDIA H200",
        "gemm",
    )
    assert pq.ParquetFile(tables / DIR / "gemm_perf.parquet").metadata.row_group(0).column(0).compression == "ZSTD"
    failures = pq.read_table(tables / DIR / ".opcollect/gemm_failures.parquet").to_pylist()
    assert failures[0]["error_class"] == "kernel_limit" and failures[0]["attempts"] == 1
    record = read_provenance(tables / DIR / PROVENANCE)
    entry = record.tables["gemm_perf"]
    assert record.schema_version == 1 and record.system.name == "h200_sxm" and record.system.sm == "90"
    assert record.runtime.cuda == "12.8" and record.system.sm_clock_mhz == 1980.0
    assert record.runtime.nccl_version == "2.26.2"
    assert entry.status == "complete" and (entry.rows, entry.failures) == (5, 1)
    assert [(e.run_id, e.rows, e.failures) for e in entry.events] == [("r1", 5, 1)]
    meta = read_sidecar(tables / DIR / "collection_meta.yaml")  # the consumer's schema 2, nothing more
    assert isinstance(meta, CollectionMeta) and meta.schema_version == 2
    assert (meta.runtime.framework, meta.runtime.version) == ("vllm", "0.24.0")
    [collection] = meta.tables["gemm_perf"].collections
    assert (meta.tables["gemm_perf"].rows, meta.tables["gemm_perf"].status) == (5, "complete")
    assert (collection.rows, collection.status, collection.collector_hash) == (5, "complete", entry.collector_hash)
    assert verify_tables(tables).clean
    assert [f for f in check_tables(tables) if not f.warning] == []


def test_row_order_is_sorted_and_merge_is_deterministic(tmp_path):
    run = fake_run(tmp_path / "run", list(reversed(CASES)))
    first, second = tmp_path / "a", tmp_path / "b"
    merge([run], first, find_project())
    merge([run], second, find_project())
    perf = _perf(first).to_pylist()
    assert [(r["m"], r["n"]) for r in perf] == sorted((r["m"], r["n"]) for r in perf)
    for name in (
        "gemm_perf.parquet",
        ".opcollect/gemm_failures.parquet",
        ".opcollect/gemm_plan.parquet",
        ".opcollect/provenance.yaml",
        "collection_meta.yaml",
    ):
        assert (first / DIR / name).read_bytes() == (second / DIR / name).read_bytes(), name
    assert (first / "h200_sxm.yaml").read_bytes() == (second / "h200_sxm.yaml").read_bytes()


def test_newer_event_replaces_rows_and_keeps_both_events(tmp_path):
    tables = tmp_path / "tables"
    merge(
        [fake_run(tmp_path / "old", CASES, latency=2.0, run_id="old", recorded_at="2026-11-01T00:00:00.000+00:00")],
        tables,
        find_project(),
    )
    newer = fake_run(
        tmp_path / "new",
        CASES[:2],
        latency=1.0,
        run_id="new",
        recorded_at="2026-11-02T00:00:00.000+00:00",
        status={"gemm:bfloat16:m=1,n=7168,k=4096": "timeout"},
    )
    merge([newer], tables, find_project())
    rows = {r["case_id"]: r["latency"] for r in _perf(tables).to_pylist()}
    assert rows["gemm:bfloat16:m=1,n=4096,k=4096"] == 1.0  # replaced by the newer event
    assert rows["gemm:bfloat16:m=1,n=7168,k=4096"] == 2.0  # a failure never replaces a measured row
    assert rows["gemm:bfloat16:m=4,n=7168,k=4096"] == 2.0  # untouched by the newer event
    assert len(rows) == len(CASES)
    events = read_provenance(tables / DIR / PROVENANCE).tables["gemm_perf"].events
    assert [e.run_id for e in events] == ["old", "new"]
    collections = read_sidecar(tables / DIR / "collection_meta.yaml").tables["gemm_perf"].collections
    assert [c.collected_at[:10] for c in collections] == ["2026-11-01", "2026-11-02"]
    assert verify_tables(tables).clean


def test_shards_of_one_plan_merge_into_one_complete_table(tmp_path):
    a = fake_run(
        tmp_path / "a",
        CASES,
        run_id="a",
        status={c: "missing" for c in ["gemm:bfloat16:m=1,n=4096,k=4096", "gemm:bfloat16:m=2,n=4096,k=4096"]},
    )
    b = fake_run(
        tmp_path / "b",
        CASES,
        run_id="b",
        status={
            f"gemm:bfloat16:m={m},n={n},k=4096": "missing"
            for m in (1, 2, 4)
            for n in (4096, 7168)
            if (m, n) not in ((1, 4096), (2, 4096))
        },
    )
    tables = tmp_path / "tables"
    merge([a], tables, find_project())
    meta = read_provenance(tables / DIR / PROVENANCE).tables["gemm_perf"]
    assert meta.status == "partial" and meta.rows == 4
    assert read_sidecar(tables / DIR / "collection_meta.yaml").tables["gemm_perf"].status == "partial"
    r4 = [f for f in check_tables(tables) if f.rule == "R4"]
    assert r4 and r4[0].warning and "2 planned cases" in r4[0].message
    merge([a, b], tables, find_project())
    meta = read_provenance(tables / DIR / PROVENANCE).tables["gemm_perf"]
    assert meta.status == "complete" and meta.rows == len(CASES)
    assert read_sidecar(tables / DIR / "collection_meta.yaml").tables["gemm_perf"].rows == len(CASES)


def test_mixing_collector_hashes_is_refused(tmp_path):
    tables = tmp_path / "tables"
    merge([fake_run(tmp_path / "a", CASES)], tables, find_project())
    other = fake_run(tmp_path / "b", CASES, digest="e" * 64)
    with pytest.raises(InputError, match=r"holds collector_hash .* the runs have e{64}"):
        merge([other], tables, find_project())
    with pytest.raises(InputError, match="mix collector hashes"):
        merge([fake_run(tmp_path / "c", CASES), other], tmp_path / "fresh", find_project())
    assert verify_tables(tables).clean


def test_other_versions_and_systems_get_their_own_tables(tmp_path):
    tables = tmp_path / "tables"
    merge(
        [
            fake_run(tmp_path / "a", CASES),
            fake_run(tmp_path / "b", CASES, version="0.25.0", run_id="b"),
            fake_run(tmp_path / "c", CASES, device="NVIDIA B200", sm="100", run_id="c"),
        ],
        tables,
        find_project(),
    )
    assert (tables / "h200_sxm/gemm/vllm/0.25.0/gemm_perf.parquet").is_file()
    assert (tables / "b200_sxm/gemm/vllm/0.24.0/gemm_perf.parquet").is_file()
    assert sorted(p.name for p in tables.glob("*.yaml")) == ["b200_sxm.yaml", "h200_sxm.yaml"]  # a spec per system
    unknown = fake_run(tmp_path / "d", CASES, device="NVIDIA H20", run_id="d")
    with pytest.raises(InputError, match="device 'NVIDIA H20' matches no systems"):
        merge([unknown], tables, find_project())


def test_merge_cli_and_errors(tmp_path):
    run = fake_run(tmp_path / "run", CASES)
    done = run_cli("merge", str(run), "--into", str(tmp_path / "tables"))
    assert done.returncode == 0 and "6 rows, 0 failures, complete" in done.stdout
    bad = run_cli("merge", str(tmp_path), "--into", str(tmp_path / "tables"))
    assert bad.returncode == 2 and "not a run directory" in bad.stderr


def _merge_proc(run, tables):
    return subprocess.Popen(
        [sys.executable, "-m", "opcollect", "merge", str(run), "--into", str(tables)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def test_merge_killed_part_way_leaves_the_earlier_tables_valid(tmp_path):
    cases = [GemmCase("bfloat16", m, n, k) for m in range(1, 101) for n in range(64, 64 + 300) for k in (512, 1024)]
    big = fake_run(tmp_path / "big", cases, run_id="big", recorded_at="2026-11-05T00:00:00.000+00:00")
    timing = tmp_path / "timing"
    merge([fake_run(tmp_path / "small", CASES)], timing, find_project())
    start = time.monotonic()
    assert _merge_proc(big, timing).wait() == 0
    duration = time.monotonic() - start
    tables = tmp_path / "tables"
    merge([fake_run(tmp_path / "small2", CASES, run_id="small2")], tables, find_project())
    before = (tables / "manifest.json").read_bytes()
    outcomes = []
    for fraction in ("staging", 0.3, 0.5, 0.65, 0.8, 0.9, 0.97):
        proc = _merge_proc(big, tables)
        if fraction == "staging":  # the moment the staging copy appears, before it is complete
            deadline = time.monotonic() + 2 * duration + 5
            while not list(tmp_path.glob(".tables.staging-*")) and time.monotonic() < deadline:
                time.sleep(0.0005)
        else:
            time.sleep(duration * fraction)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        staged = bool(list(tmp_path.glob(".tables.staging-*")))
        report = verify_tables(tables)
        assert report.clean, (fraction, report.render())
        unchanged = (tables / "manifest.json").read_bytes() == before
        assert unchanged or _perf(tables).num_rows == len(CASES) + len(cases)  # the old tables or the whole new ones
        assert [f for f in check_tables(tables) if not f.warning] == []
        outcomes.append((fraction, staged, unchanged))
        if not unchanged:
            break
    assert any(staged and unchanged for _, staged, unchanged in outcomes), outcomes  # a kill landed mid-merge
    done = run_cli("merge", str(big), "--into", str(tables))  # a later merge cleans up and completes
    assert done.returncode == 0 and verify_tables(tables).clean
    assert _perf(tables).num_rows == len(CASES) + len(cases)
    assert [p.name for p in tmp_path.glob(".tables.*")] == [".tables.lock"]  # no staging or old copy left


def test_merge_against_the_whole_plan_leaves_a_missing_shard_partial(tmp_path):
    """A sharded collection whose second shard recorded nothing: merged alone the first shard's table is complete
    for its own plan; merged with --plan of the whole plan (as the Slurm merge job does) it is partial."""
    plan = ("plan", "--backend", "torch", "--sm", "cpu", "--ops", "gemm", "--smoke")
    assert run_cli(*plan, "-o", str(tmp_path / "whole.json")).returncode == 0
    assert run_cli(*plan, "--shard", "0/2", "-o", str(tmp_path / "s0.json")).returncode == 0
    assert run_cli(*plan[:-1], "--shard", "0/2", "-o", str(tmp_path / "other.json")).returncode == 0  # not smoke
    ran = run_cli("run", "--plan", str(tmp_path / "s0.json"), "--out", str(tmp_path / "r0"), "--device", "cpu")
    assert ran.returncode == 0, ran.stderr
    alone = run_cli("merge", str(tmp_path / "r0"), "--into", str(tmp_path / "alone"))
    assert alone.returncode == 0 and alone.stdout.strip().endswith("complete"), alone.stdout
    whole = run_cli(
        "merge", str(tmp_path / "r0"), "--into", str(tmp_path / "whole"), "--plan", str(tmp_path / "whole.json")
    )
    assert whole.returncode == 0 and whole.stdout.strip().endswith("partial"), whole.stdout + whole.stderr
    meta = read_sidecar(next((tmp_path / "whole").rglob("gemm/torch/*/collection_meta.yaml")))
    assert meta.tables["gemm_perf"].status == "partial"
    other = run_cli(
        "merge", str(tmp_path / "r0"), "--into", str(tmp_path / "x"), "--plan", str(tmp_path / "other.json")
    )
    assert other.returncode == 2 and "no run merged here is of this plan" in other.stderr


def _set_event(run, **fields) -> None:
    [event] = list((run / "events").glob("*.json"))
    event.write_text(json.dumps({**json.loads(event.read_text()), **fields}))


def test_provenance_and_sidecar_name_the_image_of_the_newest_run(tmp_path):
    cases = [GemmCase("bfloat16", m, 1024, 1024) for m in (1, 2)]
    runs = []
    for i, (day, image) in enumerate((("2026-11-20", "new"), ("2026-11-10", "old"))):
        run = fake_run(tmp_path / image, cases[i : i + 1], run_id=image, recorded_at=f"{day}T00:00:00.000+00:00")
        _set_event(run, image=f"opcollect/vllm:{image}", image_digest="sha256:" + str(i) * 64)
        runs.append(run)
    tables = tmp_path / "tables"
    merge(runs, tables, find_project(), say=lambda line: None)
    here = tables / "h200_sxm/gemm/vllm/0.24.0"
    runtime = read_provenance(here / PROVENANCE).runtime
    assert (runtime.image, runtime.image_digest) == ("opcollect/vllm:new", "sha256:" + "0" * 64)
    [meta] = read_sidecar(here / "collection_meta.yaml").tables.values()
    sidecar = read_sidecar(here / "collection_meta.yaml").runtime
    assert (sidecar.image, sidecar.image_digest) == ("opcollect/vllm:new", "sha256:" + "0" * 64)
    assert len(meta.collections) == 2


def test_a_run_whose_workers_report_two_nccl_versions_is_refused(tmp_path):
    from opcollect.runtime.shards import ShardWriter

    run = fake_run(tmp_path / "run", [GemmCase("bfloat16", 1, 1024, 1024)])
    first = json.loads((run / "shards" / "r1-w0.jsonl").read_text().splitlines()[0])  # worker 0's runtime line
    second = {**first, "runtime_id": "r1.w1.1", "worker": 1, "worker_device": "cuda:1", "nccl_version": "2.27.3"}
    writer = ShardWriter(run / "shards" / "r1-w1.jsonl")
    writer.append(second)
    writer.close()
    with pytest.raises(InputError, match=r"NCCL versions \['2.26.2', '2.27.3'\]; run one image"):
        merge([run], tmp_path / "tables", find_project(), say=lambda line: None)
    assert not (tmp_path / "tables" / "h200_sxm").exists()


def test_merge_without_a_project_is_bad_input(tmp_path):
    with pytest.raises(InputError) as raised:
        merge([fake_run(tmp_path / "run", CASES)], tmp_path / "tables", None)
    assert str(raised.value) == "merge needs the systems/ of an opcollect checkout; pass --root"
    assert not (tmp_path / "tables").exists()


def _runtime_lines(run, change):
    """Worker 0's shard with its runtime line changed by ``change`` (a list of lines in, a list out)."""
    shard = run / "shards" / "r1-w0.jsonl"
    lines = [json.loads(x) for x in shard.read_text().splitlines()]
    shard.write_text("".join(json.dumps(x) + "\n" for x in change(lines)))


def test_a_run_without_a_worker_identity_or_with_two_is_refused(tmp_path):
    run = fake_run(tmp_path / "run", CASES)
    _runtime_lines(run, lambda lines: [x for x in lines if x.get("kind") != "runtime"])
    with pytest.raises(InputError) as raised:
        merge([run], tmp_path / "tables", find_project(), say=lambda line: None)
    assert str(raised.value) == f"{run}: no worker identity in its shards; it recorded nothing to merge"
    run = fake_run(tmp_path / "two", CASES)
    _runtime_lines(
        run,
        lambda lines: [*lines, {**lines[0], "runtime_id": "r1.w1.1", "worker": 1, "version": "0.25.0"}],
    )
    with pytest.raises(InputError) as raised:
        merge([run], tmp_path / "tables", find_project(), say=lambda line: None)
    assert str(raised.value) == (
        f"{run}: mixes devices/versions [('NVIDIA H200', '0.24.0'), ('NVIDIA H200', '0.25.0')]; "
        "merge runs of one system"
    )
    assert not (tmp_path / "tables").exists()


def test_runs_of_one_backend_version_with_other_nccl_versions_are_refused(tmp_path):
    first = fake_run(tmp_path / "a", CASES)
    second = fake_run(tmp_path / "b", CASES, nccl_version="2.27.3", run_id="b")
    with pytest.raises(InputError) as raised:
        merge([first, second], tmp_path / "tables", find_project())
    assert str(raised.value) == (
        f"{second}: NCCL 2.27.3, other runs of vllm 0.24.0 on h200_sxm NCCL 2.26.2; merge them into separate TABLES"
    )
    assert not (tmp_path / "tables").exists()


NCCL_CASES = [CommCase("half", "all_reduce", 8, s) for s in (256, 512)]


def test_comm_cases_of_workers_that_reported_no_nccl_version_are_refused(tmp_path):
    run = fake_run(tmp_path / "run", NCCL_CASES, op="comm", nccl_version=None)
    with pytest.raises(InputError) as raised:
        merge([run], tmp_path / "tables", find_project())
    assert str(raised.value) == (
        "vllm 0.24.0: its workers reported no nccl_version, and nccl_perf lives under comm/nccl/<nccl_version>/; "
        "re-run the comm cases with this collector"
    )


def test_an_nccl_table_another_framework_collected_is_kept(tmp_path):
    """NCCL's table is one per system and NCCL version: the first collector's stays, another's comm cases are told
    to stay in its run directories; its other tables merge."""
    tables, said = tmp_path / "tables", []
    merge([fake_run(tmp_path / "vllm", NCCL_CASES, op="comm")], tables, find_project())
    path = tables / "h200_sxm/comm/nccl/2.26.2/nccl_perf.parquet"
    before = path.read_bytes()
    trtllm = {"backend": "trtllm", "version": "1.3.0rc20", "run_id": "t"}
    runs = [
        fake_run(tmp_path / "trt-comm", [CommCase("half", "all_reduce", 8, 1024)], op="comm", **trtllm),
        fake_run(tmp_path / "trt-gemm", CASES, **trtllm),
    ]
    written = merge(runs, tables, find_project(), say=said.append)
    assert [w.path for w in written] == ["h200_sxm/gemm/trtllm/1.3.0rc20/gemm_perf.parquet"]
    assert said == [
        "h200_sxm/comm/nccl/2.26.2: keeps the nccl_perf vllm 0.24.0 collected; NCCL is one table per system and "
        "NCCL version, so trtllm 1.3.0rc20's comm cases are not merged (its run directories keep them)"
    ]
    assert path.read_bytes() == before and verify_tables(tables).clean
    # another version of the same framework is another collector too
    said.clear()
    newer = fake_run(tmp_path / "vllm-new", NCCL_CASES, op="comm", version="0.25.0", run_id="n")
    assert merge([newer], tables, find_project(), say=said.append) == []
    assert said == [
        "h200_sxm/comm/nccl/2.26.2: keeps the nccl_perf vllm 0.24.0 collected; NCCL is one table per system and "
        "NCCL version, so vllm 0.25.0's comm cases are not merged (its run directories keep them)"
    ]
    assert path.read_bytes() == before
    # the collector that owns it merges into it again
    again = merge([fake_run(tmp_path / "vllm2", NCCL_CASES[:1], op="comm", run_id="v2")], tables, find_project())
    assert [w.path for w in again] == ["h200_sxm/comm/nccl/2.26.2/nccl_perf.parquet"]


def test_a_shard_torn_by_a_kill_merges_its_complete_records(tmp_path):
    """A worker killed mid-write leaves a shard whose last line has no newline: that record was never written, so
    the complete ones merge and nothing is garbage."""
    run = fake_run(tmp_path / "run", CASES)
    with open(run / "shards" / "r1-w0.jsonl", "ab") as handle:
        handle.write(b'{"case_id": "gemm:bfloat16:m=8,n=4096,k=4096", "sta')
    said = []
    [written] = merge([run], tmp_path / "tables", find_project(), say=said.append)
    assert (written.rows, written.failures, written.status) == (len(CASES), 0, "complete") and said == []
    [event] = read_provenance(tmp_path / "tables" / DIR / PROVENANCE).tables["gemm_perf"].events
    assert event.garbage_lines == 0
