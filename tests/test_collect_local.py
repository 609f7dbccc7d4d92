"""The embedded default end to end: `nox -s collect-torch -- --local --device cpu --smoke`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import REFERENCE, ROOT, TESTS, gemm_plan, run_cli
from test_consumer import consumer_python  # noqa: F401  # the consumer's venv, a fixture

from opcollect.runtime.rundir import read_records

OPS = {
    "gemm",
    "compute_scale",
    "scale_matrix",
    "attention_context",
    "attention_generation",
    "moe",
    "mla_context",
    "mla_generation",
    "mla_bmm",
    "encoder_attention",
    "comm",
    # issue 24: DeepSeek-V4's attention modules and kernels, mHC (backends/torch/dsv4.py, mhc.py)
    "dsv4_csa_context_module",
    "dsv4_csa_generation_module",
    "dsv4_hca_context_module",
    "dsv4_hca_generation_module",
    "dsv4_paged_mqa_logits_module",
    "dsv4_hca_attn_module",
    "dsv4_csa_topk_calib",
    "mhc",
    # issue 24: DSA, GLM-5 and MSA modules (backends/torch/dsa.py, msa.py)
    "dsa_context_module",
    "dsa_generation_module",
    "glm5_mqa_logits_module",
    "glm5_topk_module",
    "glm5_dsa_attn_module",
    "msa_context_module",
    "msa_generation_module",
    # issue 25: Gated DeltaNet and Mamba2 (backends/torch/linear_attention.py)
    "gdn",
    "mamba2",
}
# the reference tables of the issue-22 families, copied into tests/data (see their README.md)
QUANT_BMM = TESTS / "data" / "reference" / "quant_bmm_tables"
ENCODER = TESTS / "data" / "reference" / "encoder_attention_slices"
NEW_TABLES = (  # (our family directory, the reference table with its columns, the op_names its rows hold)
    ("quantize", QUANT_BMM / "quantize/vllm/0.24.0/computescale_perf.parquet", {"compute_scale"}),
    ("quantize", QUANT_BMM / "quantize/vllm/0.24.0/scale_matrix_perf.parquet", {"scale_matrix"}),
    ("mla_bmm", QUANT_BMM / "mla_bmm/sglang/0.5.14/mla_bmm_perf.parquet", {"mla_gen_pre", "mla_gen_post"}),
    ("encoder_attention", ENCODER / "vllm/0.24.0/encoder_attention_perf.parquet", {"encoder_attention"}),
)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One `nox -s collect-torch -- --local --device cpu --smoke`: (run directory, TABLES, the finished process)."""
    tmp_path = tmp_path_factory.mktemp("smoke")
    run_dir = tmp_path / "run"
    nox = Path(sys.executable).with_name("nox")
    tables = tmp_path / "tables"
    done = subprocess.run(
        [
            str(nox),
            "-s",
            "collect-torch",
            "--",
            "--local",
            "--device",
            "cpu",
            "--smoke",
            "--out",
            str(run_dir),
            "--tables",
            str(tables),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return run_dir, tables, done


def test_nox_collect_torch_smoke_on_the_cpu(smoke):
    run_dir, tables, done = smoke
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_records(run_dir)
    assert {r["op"] for r in records} == OPS
    assert all(r["status"] == "ok" for r in records), [r for r in records if r["status"] != "ok"][:2]
    per_op = Counter(r["op"] for r in records)
    assert all(1 <= n <= 4 for n in per_op.values())
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["backend"] == "torch" and plan["sm"] == "cpu" and plan["selection"]["smoke"] is True
    assert sum(len(op["case_id"]) for op in plan["ops"].values()) == len(records)
    assert "0 of" in done.stdout and "planned cases missing" in done.stdout
    # real tables: they pass check and verify, and lead with the reference tables' columns and types
    assert run_cli("check", str(tables)).returncode == 0
    assert run_cli("verify", str(tables)).returncode == 0
    for ours, theirs in (
        ("cpu/gemm/torch", "gemm/vllm/0.24.0/gemm_perf.parquet"),
        ("cpu/attention/torch", "attention/sglang/0.5.14/context_attention_perf.parquet"),
        ("cpu/attention/torch", "attention/sglang/0.5.14/generation_attention_perf.parquet"),
        ("cpu/comm/nccl", "comm/nccl/2.29.2/nccl_perf.parquet"),  # NCCL's table under its (gloo) version
    ):
        [path] = list((tables / ours).glob(f"*/{Path(theirs).name}"))
        mine, ref = pq.read_schema(path), pq.read_schema(REFERENCE / theirs)
        assert [(f.name, f.type) for f in mine][: len(ref)] == [(f.name, f.type) for f in ref]
    # the quantize, MLA BMM and encoder attention tables: written with rows, the reference's columns first
    for family, theirs, op_names in NEW_TABLES:
        [path] = list((tables / "cpu" / family / "torch").glob(f"*/{theirs.name}"))
        mine, ref = pq.read_schema(path), pq.read_schema(theirs)
        assert [(f.name, f.type) for f in mine][: len(ref)] == [(f.name, f.type) for f in ref]
        rows = pq.read_table(path).to_pylist()
        assert rows and all(r["latency"] > 0 for r in rows), path
        assert {r["op_name"] for r in rows} == op_names, path
    # an aiconfigurator systems root: the system spec beside its directory, only tables and their
    # collection_meta.yaml in a version directory, our extras in its .opcollect/
    assert (tables / "cpu.yaml").is_file()
    for meta in tables.rglob("collection_meta.yaml"):
        files = {p.name for p in meta.parent.iterdir() if p.is_file()}
        assert files - {"collection_meta.yaml"} and all(n.endswith("_perf.parquet") for n in files - {meta.name})
        assert (meta.parent / ".opcollect" / "provenance.yaml").is_file()
    assert "tables in" in done.stdout and "0 violations" in done.stdout
    # a second collect of the same plan resumes: nothing left to measure
    again = run_cli(
        "collect", "torch", "--local", "--device", "cpu", "--smoke", "--out", str(run_dir), "--tables", str(tables)
    )
    assert again.returncode == 0 and f"measured 0 this run ({len(records)} recorded before)" in again.stdout


STRICT_LOAD = """
import sys
from aiconfigurator_core.sdk import perf_database
try:
    perf_database.get_database("cpu", "torch", sys.argv[2], systems_paths=[sys.argv[1]], strict_provenance=True,
                               shared_layer=False)
except Exception as exc:
    sys.exit(f"refused: {exc}")
"""


def test_the_consumer_opens_the_smoke_tree_strictly(smoke, consumer_python, tmp_path):  # noqa: F811
    """aiconfigurator-core's strict provenance accounts for every table of the CPU tree, the issue-22, issue-24 and
    issue-25 families among them; its engine takes only the vllm, sglang and trtllm backends, so the torch tree
    opens as data."""
    _, tables, done = smoke
    assert done.returncode == 0, done.stderr[-3000:]
    [version] = {p.name for p in (tables / "cpu" / "mla_bmm" / "torch").iterdir()}

    def load(root: Path) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(consumer_python), "-c", STRICT_LOAD, str(root), version], capture_output=True, text=True, timeout=300
        )

    opened = load(tables)
    assert opened.returncode == 0, opened.stderr[-2000:]
    # the load read these families' directories: a file their collection_meta.yaml does not list is refused
    for family in ("quantize", "mla_bmm", "encoder_attention", "sparse_attention", "mhc", "linear_attention"):
        planted = tmp_path / family
        shutil.copytree(tables, planted)
        (planted / "cpu" / family / "torch" / version / "stray_perf.parquet").write_bytes(b"")
        refused = load(planted)
        assert refused.returncode != 0 and "stray_perf" in refused.stderr, (family, refused.stderr[-500:])


def test_two_cpu_workers_share_the_cases(tmp_path):
    shapes = [(m, 64, 64) for m in range(1, 9)]
    plan = gemm_plan(tmp_path / "plan.json", shapes)
    # each case samples to its 0.5 s cap, so the work outlasts the second worker's start-up
    done = run_cli(
        "run",
        "--plan",
        str(plan),
        "--out",
        str(tmp_path / "run"),
        "--device",
        "cpu",
        "--workers",
        "2",
        "--max-noise",
        "0",
        "--max-case-seconds",
        "0.5",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    records = read_records(tmp_path / "run")
    assert len(records) == len(shapes) == len({r["case_id"] for r in records})
    assert {r["worker"] for r in records} == {0, 1}
    assert {r["stats"]["threads"] for r in records} == {1}  # two cores split between two workers


def test_device_and_plan_mismatches_exit_2(tmp_path):
    no_gpu = run_cli("collect", "torch", "--local", "--device", "cuda")
    assert no_gpu.returncode == 2 and "no GPU answers nvidia-smi" in no_gpu.stderr
    plan = tmp_path / "sm90.json"
    assert run_cli("plan", "--backend", "torch", "--sm", "90", "--ops", "comm", "-o", str(plan)).returncode == 0
    wrong = run_cli("run", "--plan", str(plan), "--out", str(tmp_path / "run"), "--device", "cpu")
    assert wrong.returncode == 2 and "the plan is for sm 90 but cpu is sm cpu" in wrong.stderr
    missing = run_cli("run", "--plan", str(tmp_path / "nope.json"), "--out", str(tmp_path / "run"))
    assert missing.returncode == 2 and "nope.json: cannot read plan" in missing.stderr
    unknown = run_cli("collect", "onnx", "--local", "--device", "cpu", "--ops", "comm")
    assert unknown.returncode == 2 and "--backend: unknown backend 'onnx'" in unknown.stderr


def test_run_refuses_another_framework_version(tmp_path):
    plan = gemm_plan(tmp_path / "plan.json", [(1, 8, 8)])
    done = run_cli(
        "run", "--plan", str(plan), "--out", str(tmp_path / "run"), "--device", "cpu", "--expect-version", "0.0.1"
    )
    assert done.returncode == 2
    assert "is installed, the pin says 0.0.1" in done.stderr and done.stderr.strip().count("\n") == 0
