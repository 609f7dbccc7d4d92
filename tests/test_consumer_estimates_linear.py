"""The consumer's estimate of the hybrid models reads our linear-attention tables (issue 25): aiconfigurator 0.12.0 over
one TABLES tree of our kinds (tests/consumer_trees.py), with the framework runners' skip lifted (conftest
runner_pending_lifted).

Which tables the estimates read was found by taking families out of a copy of the consumer's H200 tree (TP 8, ISL
1024, OSL 128, batch 4): Qwen3.5-27B reads gemm, context and generation attention (its full-attention layers, 256-wide
heads), custom all-reduce and gdn_perf (vLLM, SGLang, TensorRT-LLM); Nemotron-H-56B-Base-8K on TensorRT-LLM reads
gemm, attention, custom all-reduce and mamba2_perf (only TensorRT-LLM has that table). Without the linear-attention
family the consumer does not refuse: it prices those layers at its speed of light.

The consumer reads gdn rows by exact key (kernel_source, phase, batch, seq_len and the layer's widths), and of
mamba2 only the context conv1d rows: its mamba2 generation query and the SSM scan are its speed of light by design
(aiconfigurator-core 0.12.0 state_space.rs), so the estimate names our rows for those ops alone.

Our rows at the keys the reference slices hold (tests/data/reference/linear_slices: every shape at batch 4) carry the
reference's latency, as if our runners had measured what the reference measured; the estimate from that tree equals
the estimate from a copy whose rows at those keys are the reference's own rows (its op_name, model_name, framework
labels): the consumer reads our keys and names exactly as its own.
"""

from __future__ import annotations

import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import TESTS
from consumer_trees import VERSIONS, Estimate, breakdown, build_tables, estimate, metrics, sources
from test_consumer import SYSTEM
from test_consumer_estimates import KEEP as COMMON_KEEP
from test_consumer_estimates import LATENCY as COMMON_LATENCY

consumer_python = __import__("test_consumer").consumer_python  # the fixture: the consumer's venv, once per session

SLICES = TESTS / "data" / "reference" / "linear_slices" / SYSTEM / "linear_attention"
BATCH = 4  # the slices' batch: the estimates run at it, so every linear-attention key they read is in a slice
FAMILY = "linear_attention"
BASE = ("gemm", "attention_context", "attention_generation", "custom_allreduce")
OPS = {"vllm": (*BASE, "gdn"), "sglang": (*BASE, "gdn"), "trtllm": (*BASE, "gdn", "mamba2")}
TABLE = {"gdn": "gdn_perf", "mamba2": "mamba2_perf"}
# the consumer's key of each table (state_space.rs): model_name, num_tokens, op_name and the labels are not read
KEY = {
    "gdn": ("phase", "batch_size", "seq_len", "d_model", "d_conv", "num_k_heads", "head_k_dim")
    + ("num_v_heads", "head_v_dim"),
    "mamba2": ("phase", "batch_size", "seq_len", "d_model", "d_state", "d_conv", "nheads", "head_dim", "n_groups")
    + ("chunk_size",),
}
CONV = ("causal_conv1d_fn", "causal_conv1d_update")  # the conv stage's kernels; the other is the core stage's


def _stage(kernel_source: str) -> str:
    return "conv" if kernel_source in CONV else "core"


def _reference(backend: str, op: str) -> dict[tuple, float]:
    """The slice's latency by (stage, key)."""
    path = SLICES / backend / VERSIONS[backend] / f"{TABLE[op]}.parquet"
    if not path.is_file():
        return {}
    return {
        (_stage(r["kernel_source"]), *(r[k] for k in KEY[op])): r["latency"] for r in pq.read_table(path).to_pylist()
    }


# ---- the compact grid: Qwen3.5-27B (hidden 5120) and Nemotron-H-56B (hidden 8192), up to 16 sequences ----


def _attention_kept(c) -> bool:
    return c.window_size == 0 and c.head_dim in (128, 256) and c.batch_size <= 16 and c.num_heads <= 32


KEEP = {
    **COMMON_KEEP,
    "attention_context": _attention_kept,
    "attention_generation": _attention_kept,
    "gdn": lambda c: c.d_model == 5120 and c.batch_size <= 16,
    "mamba2": lambda c: c.d_model == 8192 and c.batch_size <= 16,
}


def _linear_ms(c) -> float:
    width = c.num_v_heads * c.head_v_dim if hasattr(c, "num_v_heads") else c.nheads * c.head_dim
    return 0.004 + (0.002 if c.stage == "core" else 0.0) + c.num_tokens * width * 2e-10


def _latency(backend: str) -> dict:
    """Smooth latencies; a linear-attention row at a key the reference slice holds: the reference's latency."""

    def linear(op):
        reference = _reference(backend, op)
        return lambda c: reference.get((c.stage, *(getattr(c, k) for k in KEY[op])), _linear_ms(c))

    return {**COMMON_LATENCY, "gdn": linear("gdn"), "mamba2": linear("mamba2")}


@pytest.fixture(scope="module")
def tables(tmp_path_factory, planner, pending_runners_lifted):
    return build_tables(tmp_path_factory.mktemp("linear"), planner, OPS, KEEP, _latency)


# ---- the estimates ----

QWEN = "Qwen/Qwen3.5-27B"
NEMOTRON = "nvidia/Nemotron-H-56B-Base-8K"
GDN_OPS = ("context_gdn_conv1d", "context_gdn_scan", "generation_gdn_conv1d", "generation_gdn_recurrence")
ESTIMATES = [
    *(Estimate(QWEN, b, (), "context_gdn_scan", "silicon") for b in VERSIONS),
    Estimate(NEMOTRON, "trtllm", (), "context_mamba_conv1d", "silicon"),
]
READ = {QWEN: GDN_OPS, NEMOTRON: ("context_mamba_conv1d",)}  # the ops the consumer prices from the tables


def _id(e: Estimate) -> str:
    return f"{e.model.split('/')[1]}-{e.backend}"


@pytest.mark.parametrize("e", ESTIMATES, ids=_id)
def test_the_estimate_reads_our_linear_attention_rows(tables, consumer_python, tmp_path, e):
    rc, output = estimate(consumer_python, tables, e, BATCH)
    assert rc == 0, output[-3000:]
    found = sources(output)
    assert {op: found.get(op) for op in READ[e.model]} == dict.fromkeys(READ[e.model], "silicon"), output[-3000:]
    # without the family the consumer still answers, those ops at its speed of light, and the answer moves
    copy = tmp_path / "TABLES"
    shutil.copytree(tables, copy)
    shutil.rmtree(copy / SYSTEM / FAMILY / e.backend)
    rc, without = estimate(consumer_python, copy, e, BATCH)
    assert rc == 0, without[-3000:]
    assert {op: sources(without).get(op) for op in READ[e.model]} == dict.fromkeys(READ[e.model], "sol")
    assert metrics(without) != metrics(output)


def _replaced(tables, tmp_path, backend: str) -> tuple[object, int]:
    """A copy of the tree whose linear-attention rows at the reference slices' keys are the reference's own rows,
    in our tables' schema; and how many rows it replaced."""
    copy = tmp_path / "REPLACED"
    shutil.copytree(tables, copy)
    replaced = 0
    for op in ("gdn", "mamba2"):
        path = copy / SYSTEM / FAMILY / backend / VERSIONS[backend] / f"{TABLE[op]}.parquet"
        source = SLICES / backend / VERSIONS[backend] / f"{TABLE[op]}.parquet"
        if not (path.is_file() and source.is_file()):
            continue
        ours = pq.read_table(path)
        theirs = {(r["kernel_source"], *(r[k] for k in KEY[op])): r for r in pq.read_table(source).to_pylist()}
        new = []
        for row in ours.to_pylist():
            reference = theirs.get((row["kernel_source"], *(row[k] for k in KEY[op])))
            replaced += reference is not None
            new.append({k: (reference or row).get(k, row[k]) for k in ours.column_names})
        pq.write_table(pa.Table.from_pylist(new, schema=ours.schema), path)
    return copy, replaced


# TensorRT-LLM's reference gdn_perf holds Qwen3.5-27B at TP 1 only (16 key and 48 value heads at hidden 5120): at
# TP 8 the consumer finds no row of its own for the rank's 2 and 6 heads and prices them at its speed of light, while
# our table holds them. No reference row shares a key the estimate reads, so that pair has nothing to compare here.
EQUAL = [e for e in ESTIMATES if (e.model, e.backend) != (QWEN, "trtllm")]


@pytest.mark.parametrize("e", EQUAL, ids=_id)
def test_the_estimate_equals_the_one_from_the_reference_rows(tables, consumer_python, tmp_path, e):
    copy, replaced = _replaced(tables, tmp_path, e.backend)
    assert replaced, f"{e.backend}: no row of ours at a key of the reference slices"
    rc, ours = estimate(consumer_python, tables, e, BATCH)
    assert rc == 0, ours[-3000:]
    rc, theirs = estimate(consumer_python, copy, e, BATCH)
    assert rc == 0, theirs[-3000:]
    assert metrics(ours) == metrics(theirs) and breakdown(ours) == breakdown(theirs), (ours[-2000:], theirs[-2000:])
    assert sources(ours) == sources(theirs)
