"""The real consumer reads our tables: aiconfigurator-core 0.12.0 from PyPI, in its own virtual environment.

A TABLES tree is built through our own merge from run directories written with a vLLM 0.24.0 runtime on an
H200 (gemm, context and generation attention, moe, context and generation MLA, NCCL, custom all-reduce).
The consumer opens it with strict provenance; its answer for every GEMM, MoE, MLA, NCCL and custom
all-reduce key equals our parquet row, and its attention answers equal what it returns for the reference
tables' rows of the same keys (attention adds its own modelling to the stored kernel time). Its CLI
estimates a small dense model from the tree.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from conftest import ROOT, fake_run

from opcollect.cases.systems import load_systems
from opcollect.plans.attention import AttentionCase
from opcollect.plans.comm import CommCase, CustomAllreduceCase
from opcollect.plans.gemm import GemmCase
from opcollect.plans.mla import MlaCase
from opcollect.plans.moe import MoeCase
from opcollect.project import find_project
from opcollect.tables.consumer import CONSUMER, system_spec_yaml
from opcollect.tables.merge import merge
from opcollect.tables.rules import check_tables
from opcollect.tables.verify import verify_tables

PACKAGES = (CONSUMER, "aiconfigurator==0.12.0")  # the engine and its CLI
VENV = ROOT / ".cache" / "aic-venv"
DRIVER = Path(__file__).with_name("consumer_driver.py")
SLICES = ROOT / "tests" / "data" / "reference" / "attention_slices" / "vllm" / "0.24.0"
SYSTEM, BACKEND, VERSION = "h200_sxm", "vllm", "0.24.0"
ATTENTION_KERNEL = "vllm_flash_attn_fa3"
SLICE_HEADS = (12, 2, 128, 0)  # (num_heads, num_key_value_heads, head_dim, window_size) of a reference slice


@pytest.fixture(scope="session")
def consumer_python() -> Path:
    """The consumer's interpreter: a venv with PACKAGES from PyPI, made once and reused while they stay the same."""
    VENV.parent.mkdir(exist_ok=True)
    marker = VENV / "opcollect-packages.txt"
    with open(VENV.parent / "aic-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (marker.is_file() and marker.read_text() == "\n".join(PACKAGES)):
            shutil.rmtree(VENV, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
            pip = [str(VENV / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
            subprocess.run([*pip, *PACKAGES], check=True, timeout=1800)
            marker.write_text("\n".join(PACKAGES))
    return VENV / "bin" / "python"


def ask(python: Path, root: Path, queries: list[dict], tmp: Path, backend: str = BACKEND) -> list[dict]:
    request, answer = tmp / "request.json", tmp / "answer.json"
    request.write_text(
        json.dumps({"root": str(root), "system": SYSTEM, "backend": backend, "version": VERSION, "queries": queries})
    )
    done = subprocess.run([str(python), str(DRIVER), str(request), str(answer)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(answer.read_text())
    assert "error" not in result, result["error"]
    return result["answers"]


# ---- the run data: shapes of a small dense model (Qwen3-0.6B: hidden 1024, 16/8 heads of 128, FFN 3072) ----


def _gemm_ms(c: GemmCase) -> float:
    flops, moved = 2 * c.m * c.n * c.k, 2 * (c.m * c.k + c.k * c.n + c.m * c.n)
    # above the consumer's speed of light (989 TFLOPS, 4.8 TB/s), so it keeps every value as stored
    return 1e3 * max(flops / (0.6 * 989e12), moved / (0.7 * 4.8e12)) + 0.004 + (c.m * 31 + c.n * 17 + c.k) % 97 * 1e-6


def _context_ms(c: AttentionCase) -> float:
    return 0.01 + 1e3 * 4 * c.batch_size * c.isl**2 * c.num_heads * c.head_dim / (0.5 * 989e12)


def _generation_ms(c: AttentionCase) -> float:
    return 0.005 + 1e3 * 4 * c.batch_size * (c.isl + c.step) * c.num_key_value_heads * c.head_dim / (0.7 * 4.8e12)


def _slice(name: str) -> dict[AttentionCase, tuple[float, str]]:
    """The reference rows of one head config: key -> (latency, kernel_source)."""
    rows = pq.read_table(SLICES / f"{name}_attention_perf.parquet").to_pylist()
    fields = AttentionCase._fields
    return {
        AttentionCase(*(r[f] for f in fields)): (r["latency"], r["kernel_source"])
        for r in rows
        if (r["num_heads"], r["num_key_value_heads"], r["head_dim"], r["window_size"]) == SLICE_HEADS
    }


def _attention(name: str, model_ms) -> tuple[list[AttentionCase], dict]:
    reference = _slice(name)
    assert reference and {k for _, k in reference.values()} == {ATTENTION_KERNEL}
    isls, step = ((16, 128, 1024, 2048, 4096), 0) if name == "context" else ((1, 127, 511, 1023, 2047, 4095), 1)
    model = [
        AttentionCase(batch, isl, heads, kv, 128, 1, "bfloat16", "bfloat16", step, 0)
        for kv, heads, batch, isl in itertools.product((4, 8), (8, 16, 32), (1, 2, 4, 8, 16), isls)
    ]
    latency = {**{c: model_ms(c) for c in model}, **{c: ms for c, (ms, _) in reference.items()}}
    return [*model, *reference], latency


def build_tables(base: Path) -> Path:
    runs = []

    def run(name: str, op: str, cases: list, latency_of, kernel_source: str = "cutlass") -> None:
        runs.append(
            fake_run(base / name, cases, op=op, latency_of=latency_of, kernel_source=kernel_source, run_id=name)
        )

    gemm = [
        GemmCase("bfloat16", m, n, k)
        for m, n, k in itertools.product(
            (1, 8, 64, 512, 4096, 16384), (1024, 2048, 4096, 6144, 8192, 151936), (1024, 2048, 3072, 4096)
        )
    ]
    run("gemm", "gemm", gemm, _gemm_ms, "torch.nn.functional.linear")
    for name, op, model_ms in (
        ("context", "attention_context", _context_ms),
        ("generation", "attention_generation", _generation_ms),
    ):
        cases, latency = _attention(name, model_ms)
        run(name, op, cases, latency.__getitem__, ATTENTION_KERNEL)
    moe = [MoeCase("bfloat16", t, 2048, 768, 8, 128, 1, 1, "balanced") for t in (1, 4, 16, 64, 256, 1024)]
    run("moe", "moe", moe, lambda c: 0.05 + c.num_tokens * 1e-4, "fused_moe_triton")
    mla_context = [
        MlaCase("bfloat16", "bfloat16", h, b, isl, 1, 0)
        for h, b, isl in itertools.product((16, 32, 64, 128), (1, 2, 4), (128, 512, 2048))
    ]
    run(
        "mla_context",
        "mla_context",
        mla_context,
        lambda c: 0.02 + c.num_heads * c.batch_size * c.isl * 1e-7,
        "FLASHMLA",
    )
    mla_generation = [
        MlaCase("bfloat16", "bfloat16", h, b, isl, 1, 1)
        for h, b, isl in itertools.product((16, 32, 64, 128), (1, 8, 32), (127, 1023, 4095))
    ]
    run(
        "mla_generation",
        "mla_generation",
        mla_generation,
        lambda c: 0.01 + c.num_heads * c.batch_size * (c.isl + c.step) * 1e-8,
        "FLASHMLA",
    )
    sizes = (1024, 16384, 262144, 4194304, 16777216)
    nccl = [
        CommCase(dtype, op_name, gpus, size)
        for dtype, op_name, gpus, size in itertools.product(
            ("half", "int8"), ("all_reduce", "all_gather", "reduce_scatter", "alltoall"), (2, 4, 8), sizes
        )
    ]
    run("nccl", "comm", nccl, lambda c: 0.005 + c.num_gpus * c.message_size * 1e-9 + len(c.op_name) * 1e-6, "NCCL")
    for variant, kernel in (("vllm_graph", "vLLM_custom_graph"), ("vllm_eager", "vLLM_custom_eager")):
        cases = [CustomAllreduceCase("bfloat16", gpus, size, variant) for gpus in (2, 4, 8) for size in sizes]
        extra = 0.002 if variant == "vllm_eager" else 0.0
        run(
            variant,
            "custom_allreduce",
            cases,
            lambda c, e=extra: 0.003 + e + c.num_gpus * c.message_size * 5e-10,
            kernel,
        )
    tables = base / "TABLES"
    merge(runs, tables, find_project(), say=lambda _: None)
    return tables


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> Path:
    return build_tables(tmp_path_factory.mktemp("consumer"))


def reference_root(base: Path) -> Path:
    """The reference tables' vLLM attention slices as a systems root, with the same system spec as ours."""
    root = base / "reference"
    directory = root / SYSTEM / "attention" / BACKEND / VERSION
    directory.mkdir(parents=True)
    spec = load_systems(ROOT / "systems")[SYSTEM].aiconfigurator
    (root / f"{SYSTEM}.yaml").write_text(system_spec_yaml(SYSTEM, spec, None))
    for name in ("context_attention_perf", "generation_attention_perf"):
        shutil.copy(SLICES / f"{name}.parquet", directory / f"{name}.parquet")
    legacy = {
        "schema_version": 1,
        "provenance": "legacy",
        "runtime": {"framework": BACKEND, "version": VERSION},
        "tables": {
            "context_attention_perf": {"status": "complete"},
            "generation_attention_perf": {"status": "complete"},
        },
    }
    (directory / "collection_meta.yaml").write_text(yaml.safe_dump(legacy))
    return root


def _rows(tables: Path, rel: str) -> list[dict]:
    return pq.read_table(tables / SYSTEM / rel).to_pylist()


def _same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)


def test_our_own_rules_pass_on_the_tree(tables):
    assert verify_tables(tables).clean
    assert [f.render() for f in check_tables(tables) if not f.warning] == []
    spec = yaml.safe_load((tables / f"{SYSTEM}.yaml").read_text())
    assert spec["data_dir"] == SYSTEM and spec["misc"]["nccl_version"] == "2.26.2"
    assert (tables / SYSTEM / "comm" / "nccl" / "2.26.2" / "nccl_perf.parquet").is_file()


def test_strict_load_and_exact_answers(tables, consumer_python, tmp_path):
    """Every GEMM, MoE, MLA, NCCL and custom all-reduce key: the consumer answers exactly our row."""
    keyed = {
        "gemm": ("gemm/vllm/0.24.0/gemm_perf.parquet", ("gemm_dtype", "m", "n", "k")),
        "moe": (
            "moe/vllm/0.24.0/moe_perf.parquet",
            ("moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts")
            + ("moe_tp_size", "moe_ep_size", "distribution"),
        ),
        "context_mla": (
            "mla/vllm/0.24.0/context_mla_perf.parquet",
            ("mla_dtype", "kv_cache_dtype", "num_heads", "batch_size", "isl"),
        ),
        "generation_mla": (
            "mla/vllm/0.24.0/generation_mla_perf.parquet",
            ("mla_dtype", "kv_cache_dtype", "num_heads", "batch_size", "isl", "step"),
        ),
        "nccl": ("comm/nccl/2.26.2/nccl_perf.parquet", ("nccl_dtype", "op_name", "num_gpus", "message_size")),
        "custom_allreduce": ("comm/vllm/0.24.0/custom_allreduce_perf.parquet", ("num_gpus", "message_size")),
    }
    queries, expected = [], []
    for op, (rel, keys) in keyed.items():
        rows = _rows(tables, rel)
        if op == "custom_allreduce":  # the consumer reads the graph-replayed rows; eager ones are ours to keep
            assert {r["backend"] for r in rows} == {"vllm_graph", "vllm_eager"}
            rows = [r for r in rows if r["backend"] == "vllm_graph"]
        assert rows, rel
        for row in rows:
            queries.append({"op": op, **{k: row[k] for k in keys}})
            expected.append(row["latency"])
    answers = ask(consumer_python, tables, queries, tmp_path)
    wrong = [
        (q, want, got)
        for q, want, got in zip(queries, expected, answers)
        if "latency" not in got or not _same(got["latency"], want)
    ]
    assert not wrong, f"{len(wrong)} of {len(queries)} answers differ from our rows, e.g. {wrong[:3]}"
    assert {q["op"] for q in queries} == set(keyed)


def test_attention_answers_match_the_reference_tables(tables, consumer_python, tmp_path):
    """Attention adds its own modelling to the stored kernel time: ours must answer as the reference does."""
    reference = reference_root(tmp_path)
    queries = []
    for name in ("context", "generation"):
        rows = _rows(tables, f"attention/vllm/0.24.0/{name}_attention_perf.parquet")
        ours = [
            r
            for r in rows
            if (r["num_heads"], r["num_key_value_heads"], r["head_dim"], r["window_size"]) == SLICE_HEADS
        ]
        assert len(ours) == len(_slice(name))
        keys = ("batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim", "attn_dtype", "kv_cache_dtype")
        queries += [
            {"op": f"{name}_attention", **{k: r[k] for k in keys}, "step": r["step"], "window_size": r["window_size"]}
            for r in ours[:: max(1, len(ours) // 40)]
        ]
    ours = ask(consumer_python, tables, queries, tmp_path)
    theirs = ask(consumer_python, reference, queries, tmp_path)
    assert all("latency" in a for a in theirs), theirs[:3]
    differ = [
        (q, a, b)
        for q, a, b in zip(queries, ours, theirs)
        if "latency" not in a or not _same(a["latency"], b["latency"])
    ]
    assert not differ, (
        f"{len(differ)} of {len(queries)} attention answers differ from the reference's, e.g. {differ[:2]}"
    )
    assert {q["op"] for q in queries} == {"context_attention", "generation_attention"}


def test_strict_mode_refuses_a_file_it_cannot_account_for(tables, consumer_python, tmp_path):
    """The load above is strict: a planted file beside the tables is refused, so their load proved something."""
    planted = tmp_path / "TABLES"
    shutil.copytree(tables, planted)
    (planted / SYSTEM / "gemm" / BACKEND / VERSION / "notes.txt").write_text("not a table")
    request, answer = tmp_path / "request.json", tmp_path / "answer.json"
    request.write_text(
        json.dumps({"root": str(planted), "system": SYSTEM, "backend": BACKEND, "version": VERSION, "queries": []})
    )
    subprocess.run([str(consumer_python), str(DRIVER), str(request), str(answer)], check=True, capture_output=True)
    assert "notes" in json.loads(answer.read_text()).get("error", "")


@pytest.mark.parametrize("tp", [1, 2])
def test_cli_estimates_a_dense_model_from_our_tree(tables, consumer_python, tp):
    """`aiconfigurator cli estimate` on our tree; TP 2 reads the custom all-reduce table."""
    done = subprocess.run(
        [
            str(consumer_python.parent / "aiconfigurator"),
            "cli",
            "estimate",
            "--model-path",
            "Qwen/Qwen3-0.6B",  # its config ships inside the consumer: no download
            "--system",
            SYSTEM,
            "--backend",
            BACKEND,
            "--backend-version",
            VERSION,
            "--systems-paths",
            str(tables),
            "--estimate-mode",
            "static",
            "--isl",
            "1024",
            "--osl",
            "128",
            "--batch-size",
            "8",
            "--tp-size",
            str(tp),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={"PATH": str(consumer_python.parent), "AIC_STRICT_PROVENANCE": "1", "HOME": str(tables.parent)},
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    ttft = re.search(r"TTFT[^0-9]*([0-9]+\.[0-9]+)", output)
    assert ttft and float(ttft.group(1)) > 0, output[-3000:]
