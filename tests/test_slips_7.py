"""Behaviours of the tables, runtime and cluster modules that no earlier test held: each test here fails with a
small plausible bug planted in the function it names."""

from __future__ import annotations

import shlex
import sys
import types

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from opcollect.cluster.scripts import SlurmOptions, array_script, merge_script
from opcollect.errors import InputError
from opcollect.tables import consumer
from opcollect.tables.candidates import CANDIDATE_TYPES, admitted, latest_per_case, new_candidates, old_candidates
from opcollect.tables.schema import read_parquet, read_parquet_schema, schema_for_op, table_files

GEMM = schema_for_op("gemm")
GEMM_KEYS = {"gemm_dtype": pa.string(), "m": pa.int64(), "n": pa.int64(), "k": pa.int64()}


def _gemm_id(m: int) -> str:
    return f"gemm:bfloat16:m={m},n=64,k=64"


def _candidates(rows: list[dict]) -> pa.Table:
    """Gemm candidates: each row's case ID and keys from its m, the given columns, nulls for the rest."""
    full = []
    for row in rows:
        m = row.pop("m")
        keys = {"case_id": _gemm_id(m), "gemm_dtype": "bfloat16", "m": m, "n": 64, "k": 64}
        full.append({**keys, **dict.fromkeys(CANDIDATE_TYPES), **row})
    return pa.Table.from_pylist(full, pa.schema({"case_id": pa.string(), **GEMM_KEYS, **CANDIDATE_TYPES}))


def _measured(latency: float = 1.0, **more) -> dict:
    return {"ok": True, "latency": latency, "latency_p25": latency, "latency_p75": latency, "samples": 5,
            "noise": 0.0, "timing": "graph", "attempt": 1, **more}  # fmt: skip


def test_latest_per_case_prefers_a_measured_row_then_the_most_recent():
    """latest_per_case: a measured row beats any failure, newer or not; among equals the latest recorded_at wins."""
    rows = [
        {"m": 16, "ok": False, "recorded_at": "2026-01-03", "run_id": "fail-newest"},
        {"m": 16, "ok": True, "recorded_at": "2026-01-02", "run_id": "ok-newer"},
        {"m": 16, "ok": True, "recorded_at": "2026-01-01", "run_id": "ok-older"},
        {"m": 32, "ok": False, "recorded_at": "2026-01-02", "run_id": "fail-newer"},
        {"m": 32, "ok": False, "recorded_at": "2026-01-01", "run_id": "fail-older"},
        {"m": 8, "ok": True, "recorded_at": "2026-01-01", "run_id": "once"},
    ]
    chosen = latest_per_case(_candidates(rows))
    assert chosen.column_names == ["case_id", *GEMM_KEYS, *CANDIDATE_TYPES]
    assert chosen["run_id"].to_pylist() == ["ok-newer", "fail-newer", "once"]  # sorted by case ID
    assert chosen["case_id"].to_pylist() == [_gemm_id(16), _gemm_id(32), _gemm_id(8)]


def test_latest_per_case_leaves_distinct_cases_as_they_came():
    """latest_per_case: every case once is returned as is, in its own order."""
    rows = [{"m": m, "ok": m != 32, "recorded_at": "2026-01-01", "run_id": str(m)} for m in (32, 8, 16)]
    assert latest_per_case(_candidates(rows))["run_id"].to_pylist() == ["32", "8", "16"]


def test_admitted_drops_measured_rows_that_break_a_rule_and_rows_whose_keys_lie():
    """admitted: a measured row's values and every row's keys are held; a failure's empty stats are no fault."""
    rows = [
        {"m": 16, **_measured(), "run_id": "good"},
        {"m": 32, **_measured(latency=0.0), "run_id": "zero"},
        {"m": 8, "ok": False, "attempt": 2, "error_class": "OOM", "run_id": "failed"},
        {"m": 64, **_measured(), "run_id": "lying-keys"},
        {"m": 128, **_measured(latency_p25=2.0), "run_id": "p25-above"},
    ]
    table = _candidates(rows)
    m = table.schema.get_field_index("m")
    table = table.set_column(m, "m", pa.array([16, 32, 8, 65, 128], pa.int64()))  # the row of m=64 holds m=65
    kept, faults = admitted(table, GEMM)
    assert kept["run_id"].to_pylist() == ["good", "failed"]
    assert [(f.rule, f.what, f.mask.to_pylist()) for f in faults] == [
        ("R3", "latency not finite and positive", [False, True, False, False, False]),
        ("R3", "0 <= p25 <= latency <= p75 broken", [False, False, False, False, True]),
        ("R6", "m is not the one its case ID names", [False, False, False, True, False]),
    ]


def test_admitted_returns_clean_candidates_unchanged():
    """admitted: candidates that all pass come back whole, with no faults."""
    table = _candidates([{"m": 16, **_measured(), "run_id": "a"}, {"m": 8, "ok": False, "run_id": "b"}])
    kept, faults = admitted(table, GEMM)
    assert faults == [] and kept.equals(table)


def _stored_gemm(directory, perf_rows: list[dict], failure_rows: list[dict]) -> None:
    perf_name, failures_name, _ = table_files(GEMM.name)
    (directory / ".opcollect").mkdir(parents=True)
    lead = {"framework": "vllm", "version": "1", "device": "d", "op_name": "gemm", "gemm_dtype": "bfloat16", "n": 64}
    perf = [{**lead, "k": 64, "case_id": _gemm_id(r["m"]), **r} for r in perf_rows]
    failed = [{**lead, "k": 64, "case_id": _gemm_id(r["m"]), **r} for r in failure_rows]
    pq.write_table(pa.Table.from_pylist(perf, GEMM.perf), directory / perf_name)
    pq.write_table(pa.Table.from_pylist(failed, GEMM.failures), directory / failures_name)


def test_old_candidates_are_stored_rows_measured_then_failed_with_their_attempts(tmp_path):
    """old_candidates: perf rows are measured, attempt 1, recorded_at ''; failures keep their attempts and errors."""
    assert old_candidates(tmp_path, GEMM) is None
    stats = {"latency": 2.0, "latency_p25": 1.5, "latency_p75": 2.5, "samples": 7, "noise": 0.1, "timing": "graph"}
    _stored_gemm(
        tmp_path,
        [{"m": 16, "kernel_source": "cutlass", **stats}],
        [{"m": 8, "kernel_source": "triton", "error_class": "OOM", "message": "out of memory", "attempts": 3}],
    )
    found = old_candidates(tmp_path, GEMM)
    assert found.schema == pa.schema({"case_id": pa.string(), **GEMM_KEYS, **CANDIDATE_TYPES})
    rows = found.to_pylist()
    assert [r["case_id"] for r in rows] == [_gemm_id(16), _gemm_id(8)]
    assert [(r["m"], r["n"], r["k"], r["gemm_dtype"]) for r in rows] == [
        (16, 64, 64, "bfloat16"),
        (8, 64, 64, "bfloat16"),
    ]
    measured, failed = rows
    assert (measured["ok"], measured["recorded_at"], measured["attempt"], measured["kernel_source"]) == (
        True, "", 1, "cutlass")  # fmt: skip
    assert {k: measured[k] for k in stats} == stats
    assert (measured["error_class"], measured["message"], measured["run_id"]) == (None, None, None)
    assert (failed["ok"], failed["recorded_at"], failed["attempt"], failed["kernel_source"]) == (False, "", 3, "triton")
    assert (failed["error_class"], failed["message"], failed["latency"], failed["timing"]) == (
        "OOM", "out of memory", None, None)  # fmt: skip


def _record(case_id: str, op: str = "gemm", **more) -> dict:
    stats = dict.fromkeys(("latency", "latency_p25", "latency_p75", "samples", "noise", "timing", "sm_clock_mhz"))
    base = {"case_id": case_id, "op": op, "status": "ok", "recorded_at": "2026-01-01", "kernel_source": None,
            "dispatch": "cutlass", "ran": None, "expected_ran": None, "kernels": None, "kernels_unread": None,
            "error_class": None, "message": None, "attempt": 1, "run_id": "r1"}  # fmt: skip
    return {**base, **{f"stats.{k}": v for k, v in stats.items()}, **more}


def test_new_candidates_take_the_ops_records_of_planned_cases_with_keys_from_the_plan():
    """new_candidates: only this op's records of planned cases; keys from the plan; kernel_source else dispatch."""
    names = list(_record("x"))
    types_ = {n: pa.int64() if n in ("attempt", "stats.samples") else pa.string() for n in names}
    types_.update(
        {f"stats.{n}": pa.float64() for n in ("latency", "latency_p25", "latency_p75", "noise", "sm_clock_mhz")}
    )
    records = pa.Table.from_pylist(
        [
            _record(_gemm_id(16), kernel_source="cublas", **{"stats.latency": 2.0, "stats.samples": 4}),
            _record(_gemm_id(8), status="failed", error_class="OOM", message="m", attempt=2, run_id="r2"),
            _record(_gemm_id(4)),  # no planned case: a stray record
            _record(_gemm_id(32), op="moe"),  # another op's record under a planned ID
        ],
        pa.schema(types_),
    )
    planned = pa.Table.from_pylist(
        [{"case_id": _gemm_id(m), "gemm_dtype": "bfloat16", "m": m, "n": 64, "k": 64} for m in (8, 16, 32)]
    )
    run = types.SimpleNamespace(records=records, plan_cases={"gemm": planned})
    found = sorted(new_candidates(run, "gemm", GEMM).to_pylist(), key=lambda r: r["m"])
    assert [(r["case_id"], r["m"], r["n"], r["k"], r["gemm_dtype"]) for r in found] == [
        (_gemm_id(8), 8, 64, 64, "bfloat16"),
        (_gemm_id(16), 16, 64, 64, "bfloat16"),
    ]
    failed, measured = found
    assert (measured["ok"], measured["kernel_source"], measured["dispatch"], measured["latency"]) == (
        True, "cublas", "cutlass", 2.0)  # fmt: skip
    assert (measured["samples"], measured["attempt"], measured["run_id"]) == (4, 1, "r1")
    assert (failed["ok"], failed["kernel_source"], failed["error_class"], failed["message"]) == (
        False, "cutlass", "OOM", "m")  # fmt: skip
    assert (failed["attempt"], failed["run_id"], failed["recorded_at"]) == (2, "r2", "2026-01-01")


def test_the_consumer_takes_every_regular_non_dot_non_marker_file_for_a_table(tmp_path):
    """consumer.table_names: sorted; dot-files, the four markers and directories left out; a link to a file taken."""
    for name in ("gemm_perf.parquet", "a.parquet.bak", ".hidden", *sorted(consumer.NOT_TABLES)):
        (tmp_path / name).write_text("x")
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.parquet").symlink_to(tmp_path / "gemm_perf.parquet")
    (tmp_path / "dangling.parquet").symlink_to(tmp_path / "nowhere")
    assert consumer.NOT_TABLES == {"collection_meta.yaml", "reuse.yaml", "SHARED_LAYER_REUSE.txt", "INCOMPLETE.txt"}
    assert consumer.table_names(tmp_path) == ["a.parquet.bak", "gemm_perf.parquet", "link.parquet"]
    assert [consumer.stem(n) for n in ("a.parquet.bak", "gemm_perf.parquet")] == ["a.parquet", "gemm_perf"]


def test_nccl_rows_carry_the_nccl_version_and_sit_under_comm():
    """consumer.row_version / nccl_directory / version_directory: NCCL's rows and directory by the NCCL version."""
    assert consumer.row_version("nccl_perf", "0.9", "2.26.2") == "2.26.2"
    assert consumer.row_version("gemm_perf", "0.9", "2.26.2") == "0.9"
    assert consumer.nccl_directory("h200", "2.26.2") == "h200/comm/nccl/2.26.2"
    assert consumer.version_directory("h200", "gemm", "vllm", "0.9") == "h200/gemm/vllm/0.9"


def test_known_values_add_a_tables_own_loader_values_to_that_table_alone():
    """consumer.known_values: fp8_e4m3 is an mla/kv dtype of the DSV4 and GLM-5 module tables, not of others."""
    for table in ("dsv4_csa_context_module_perf", "glm5_topk_module_perf"):
        values = consumer.known_values(table)
        assert values["mla_dtype"] == consumer.KNOWN_VALUES["mla_dtype"] | {"fp8_e4m3"}
        assert values["kv_cache_dtype"] == {"bfloat16", "int8", "fp8", "fp8_e4m3"}
        assert values["gemm_dtype"] == consumer.KNOWN_VALUES["gemm_dtype"]
    assert consumer.known_values("mla_context_perf") == consumer.KNOWN_VALUES


def test_a_system_spec_names_its_nccl_version_only_when_there_is_one():
    """consumer.system_spec_yaml / spec_nccl_version: data_dir the system, no nulls, misc.nccl_version when given."""
    spec = consumer.SystemSpec(
        gpu={"mem_bw": 4.8e12, "mem_capacity": 2**30, "bfloat16_tc_flops": 1e15},
        node={"num_gpus_per_node": 8, "inter_node_bw": 5e10, "intra_node_bw": 4.5e11},
        misc={"nccl_mem": {1: 0, 8: 1024}, "other_mem": 7},
    )
    without = consumer.system_spec_yaml("h200", spec, None)
    assert without.startswith(f"# The system spec {consumer.CONSUMER} reads;")
    assert yaml.safe_load(without) == {
        "data_dir": "h200",
        "gpu": {"mem_bw": 4.8e12, "mem_capacity": 2**30, "bfloat16_tc_flops": 1e15},
        "node": {"num_gpus_per_node": 8, "inter_node_bw": 5e10, "intra_node_bw": 4.5e11},
        "misc": {"nccl_mem": {1: 0, 8: 1024}, "other_mem": 7},
    }
    assert consumer.spec_nccl_version(without) is None
    written = consumer.system_spec_yaml("h200", spec, "2.26.2")
    assert yaml.safe_load(written)["misc"] == {"nccl_mem": {1: 0, 8: 1024}, "other_mem": 7, "nccl_version": "2.26.2"}
    assert consumer.spec_nccl_version(written) == "2.26.2"
    assert consumer.SpecFile.model_validate(yaml.safe_load(written)).misc.nccl_version == "2.26.2"
    for text in ("misc:\n  nccl_version: 2.26\n", "- misc\n", "misc: 3\n"):
        assert consumer.spec_nccl_version(text) is None


def test_collection_meta_leaves_absent_optional_fields_out():
    """consumer.dump_collection_meta: no null is written; what is set comes out in field order."""
    collection = {"collector_ref": "abc", "collector_hash": "h", "case_plan_hash": "p",
                  "collected_at": "2026-01-01T00:00:00+00:00", "rows": 2, "status": "complete"}  # fmt: skip
    meta = consumer.CollectionMeta(
        schema_version=2,
        runtime={"framework": "vllm", "version": "0.9", "image_digest": "sha256:1"},
        tables={"gemm_perf": {"rows": 2, "status": "complete", "collections": [collection]}},
    )
    text = consumer.dump_collection_meta(meta)
    assert "null" not in text
    assert yaml.safe_load(text) == {
        "schema_version": 2,
        "runtime": {"framework": "vllm", "version": "0.9", "image_digest": "sha256:1"},
        "tables": {"gemm_perf": {"rows": 2, "status": "complete", "collections": [collection]}},
    }
    assert text.startswith("schema_version: 2\nruntime:\n  framework: vllm\n")


def test_a_tables_failures_and_plan_files_sit_in_the_extras_named_by_its_stem():
    """schema.table_files: <table>.parquet, .opcollect/<stem>_failures.parquet and .opcollect/<stem>_plan.parquet."""
    assert table_files("gemm_perf") == (
        "gemm_perf.parquet",
        ".opcollect/gemm_failures.parquet",
        ".opcollect/gemm_plan.parquet",
    )
    assert table_files("nccl_perf")[1:] == (".opcollect/nccl_failures.parquet", ".opcollect/nccl_plan.parquet")


def test_a_backend_names_its_key_columns_and_after_latency_fields_follow_latency():
    """TableSchema perf/failures: TRT-LLM's implementation column after latency (perf) and after the keys (failures)."""
    trtllm, vllm = schema_for_op("custom_allreduce", "trtllm"), schema_for_op("custom_allreduce", "vllm")
    lead = ["framework", "version", "device", "op_name", "kernel_source", "allreduce_dtype", "num_gpus", "message_size"]
    quantiles = ["latency_p25", "latency_p75", "samples", "noise", "timing", "case_id"]
    assert trtllm.perf.names == [*lead, "latency", "implementation", *quantiles]
    assert vllm.perf.names == [*lead, "latency", "backend", *quantiles]
    assert trtllm.failures.names == [*lead, "implementation", "case_id", "error_class", "message", "attempts"]
    assert [str(trtllm.perf.field(c).type) for c in ("num_gpus", "message_size", "implementation", "samples")] == [
        "int64", "int64", "string", "int64"]  # fmt: skip
    assert str(trtllm.failures.field("attempts").type) == "int64"
    assert trtllm.key_fields == vllm.key_fields == ("allreduce_dtype", "num_gpus", "message_size", "backend")
    assert trtllm.column("backend") == "implementation" and vllm.column("backend") == "backend"
    assert trtllm.field_columns == ("allreduce_dtype", "num_gpus", "message_size", "implementation")
    assert trtllm.plan.names == ["case_id", "plan_hash"]


def test_a_field_a_backends_table_lacks_is_no_key_and_op_name_is_a_leading_column():
    """TableSchema.key_fields / field_columns: SGLang's paged-MQA table has no local_num_heads; comm's op_name leads."""
    sglang, vllm = (schema_for_op("dsv4_paged_mqa_logits_module", b) for b in ("sglang", "vllm"))
    assert "local_num_heads" in vllm.key_fields and "local_num_heads" not in sglang.key_fields
    assert sglang.column("local_num_heads") is None
    assert "local_num_heads" not in sglang.perf.names and "local_num_heads" in vllm.perf.names
    comm = schema_for_op("comm")
    assert comm.key_fields == ("nccl_dtype", "op_name", "num_gpus", "message_size")
    assert comm.field_columns == ("nccl_dtype", "num_gpus", "message_size")
    assert comm.key_columns[:5] == ("framework", "version", "device", "op_name", "kernel_source")


def test_for_columns_finds_the_backend_whose_key_columns_a_file_has():
    """TableSchema.for_columns: a file with TRT-LLM's columns gets TRT-LLM's schema; one with neither keeps its own."""
    vllm = schema_for_op("custom_allreduce", "vllm")
    names = schema_for_op("custom_allreduce", "trtllm").perf.names
    assert vllm.for_columns(names).column("backend") == "implementation"
    assert vllm.for_columns(vllm.perf.names).backend == "vllm"
    assert vllm.for_columns(["case_id"]) is vllm


def test_a_file_that_is_no_parquet_is_named_in_an_input_error(tmp_path):
    """schema.read_parquet / read_parquet_schema: garbage is an InputError naming the file; a missing file too."""
    bad = tmp_path / "gemm_perf.parquet"
    bad.write_bytes(b"not parquet at all")
    for read in (read_parquet, read_parquet_schema):
        with pytest.raises(InputError, match=r"gemm_perf\.parquet: not a readable parquet table"):
            read(bad)
    with pytest.raises(InputError, match="nothere.parquet: cannot read parquet table"):
        read_parquet(tmp_path / "nothere.parquet")
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"a": [1], "b": ["x"]}), good)
    assert read_parquet(good, columns=["b"]).to_pylist() == [{"b": "x"}]
    assert read_parquet_schema(good).names == ["a", "b"]


def test_merge_sbatch_merges_every_shard_that_recorded_then_checks_and_reports(tmp_path):
    """scripts.merge_script: one job (no array, cpus or gpus) with the queue options, merge, check and status."""
    options = SlurmOptions(3, partition="gpu", account="perf", time="1:00:00", gpus_per_task=2, cpus_per_task=4)
    python = shlex.quote(sys.executable)
    root, tables = tmp_path / "run", tmp_path / "tables"
    assert merge_script(root, tables, options, tmp_path).splitlines() == [
        "#!/bin/bash",
        "#SBATCH --job-name=opcollect-merge",
        f'#SBATCH --output="{root}/logs/%x-%j.out"',
        "#SBATCH --partition=gpu",
        "#SBATCH --account=perf",
        "#SBATCH --time=1:00:00",
        "set -uo pipefail",
        f"root={root}",
        "shards=()",
        'for shard in "$root"/shard-*; do',
        '  compgen -G "$shard/shards/*.jsonl" >/dev/null && shards+=("$shard")',
        "done",
        'if [ ${#shards[@]} -eq 0 ]; then echo "no shard recorded anything; resubmit with --resume" >&2; exit 1; fi',
        f'{python} -m opcollect merge "${{shards[@]}}" --plan "$root/plan.json" --into {tables} --root {tmp_path}',
        f"{python} -m opcollect check {tables}",
        f'{python} -m opcollect status "$root"',
    ]


def test_collect_sbatch_runs_its_shard_directly_with_the_device_and_run_flags(tmp_path):
    """scripts.array_script: one task per shard, 1 CPU by default and no GPU line; resume when the shard started."""
    python = shlex.quote(sys.executable)
    script = array_script(tmp_path, SlurmOptions(2, device="cpu", run_flags=("--repeats", "3")))
    assert script.splitlines() == [
        "#!/bin/bash",
        "#SBATCH --job-name=opcollect-collect",
        f'#SBATCH --output="{tmp_path}/logs/%x-%A_%a.out"',
        "#SBATCH --array=0-1",
        "#SBATCH --cpus-per-task=1",
        "set -euo pipefail",
        f"root={tmp_path}",
        'shard="$root/shard-$SLURM_ARRAY_TASK_ID"',
        "resume=()",
        '[ -f "$shard/run.json" ] && resume=(--resume)  # a task that died left its shard resumable',
        "collect_run() {",
        f'  {python} -m opcollect run "$@"',
        "}",
        'collect_run --plan "$shard/plan.json" --out "$shard" --device cpu --repeats 3 "${resume[@]}"',
    ]
    docker = array_script(tmp_path, SlurmOptions(2, runtime="docker", image="opcollect/torch:1"))
    assert f'  docker run --rm --ipc=host -v {tmp_path}:{tmp_path} opcollect/torch:1 run "$@"' in docker.splitlines()
    with pytest.raises(ValueError, match="the pyxis runtime runs the collector image"):
        array_script(tmp_path, SlurmOptions(2, runtime="pyxis"))
