"""The consumer estimates whole models from our tables alone: aiconfigurator 0.12.0 from PyPI over one TABLES tree.

The tree is merged by our own merge from run directories written as `run` writes them, with framework identities
(vLLM 0.24.0, SGLang 0.5.14, TensorRT-LLM 1.3.0rc20 on an H200) and latencies from a smooth formula per op. Each
op's cases are the ones our planner plans for that backend at SM 90, narrowed to a compact grid that spans what
the estimates below query. Which tables each estimate reads was found by taking kinds out of a copy of the
reference H200 tree until the CLI refused:

- Qwen3-32B-FP8-Static-PerTensor, TP 8 (every framework): gemm (bf16, fp8), context and generation attention
  (fp8 KV cache), custom all-reduce, and both quantize tables: the consumer prices a static FP8 GEMM as the
  dynamic fp8 GEMM less compute_scale (less scale_matrix too when its input is already fp8).
- DeepSeek-V3, TP 8, MoE TP 8 (SGLang, TensorRT-LLM): gemm (bf16, fp8_block), context and generation MLA
  (fp8 KV cache), mla_bmm (fp8) around generation MLA, moe (fp8_block, power_law_1.01), custom all-reduce.
- Qwen3-VL-8B-Instruct with one 448 x 448 image, TP 8 (every framework): gemm (bf16), context and generation
  attention, custom all-reduce, NCCL and encoder_attention (the vision tower).

The CLI estimates each from the tree alone (strict provenance, no built-in systems), and refuses once the new
family it needs is taken out; the consumer's own per-op answers for every key of the new tables equal our rows.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Callable

import consumer_trees
import pytest
import test_consumer
import yaml
from conftest import ROOT
from consumer_trees import VERSIONS, Estimate, ask, estimate
from test_consumer import SYSTEM, _context_ms, _gemm_ms, _generation_ms

from opcollect.tables.rules import check_tables
from opcollect.tables.verify import verify_tables

consumer_python = test_consumer.consumer_python  # the fixture: the consumer's venv, made once per session

COMMON_OPS = ("gemm", "compute_scale", "scale_matrix", "attention_context", "attention_generation")
COMMON_OPS += ("custom_allreduce", "mla_bmm", "encoder_attention")
OPS = {
    "vllm": (*COMMON_OPS, "comm"),  # NCCL is one table per system: one framework's runs write it
    "sglang": (*COMMON_OPS, "moe", "mla_context", "mla_generation"),
    "trtllm": (*COMMON_OPS, "moe", "mla_context", "mla_generation"),
}

# ---- the compact grid: each op's planned cases kept by these ----

TOKENS = frozenset(2**i for i in range(16))  # 1 ... 32768
WIDTHS = frozenset({128, 512, 1024, 2048, 4096, 8192, 16384, 65536})  # bracket every model's per-rank widths


def _attention_kept(c) -> bool:
    """Full attention of 128-wide heads at TP 8 of the dense models, up to 16 sequences."""
    return (
        c.window_size == 0
        and c.head_dim == 128
        and c.batch_size <= 16
        and c.num_heads in (1, 2, 4, 8, 16, 32)
        and c.num_key_value_heads in (1, 2, 4, 8)
    )


KEEP: dict[str, Callable] = {
    "gemm": lambda c: c.gemm_dtype in ("bfloat16", "fp8", "fp8_block") and c.m in TOKENS and {c.n, c.k} <= WIDTHS,
    "compute_scale": lambda c: c.m in TOKENS and c.k in WIDTHS,
    "scale_matrix": lambda c: c.m in TOKENS and c.k in WIDTHS,
    "attention_context": _attention_kept,
    "attention_generation": _attention_kept,
    "custom_allreduce": lambda c: True,
    "comm": lambda c: True,
    "mla_bmm": lambda c: True,
    "encoder_attention": lambda c: True,
    # DeepSeek-V3 at TP 8 (the consumer reads the 16-head rows of MLA's per-TP tables): every dtype
    "mla_context": lambda c: c.tp_size == 8,
    "mla_generation": lambda c: c.tp_size == 8,
    # DeepSeek-V3's experts at MoE TP 8
    "moe": lambda c: (
        c.moe_dtype == "fp8_block" and (c.hidden_size, c.num_experts, c.moe_tp_size, c.moe_ep_size) == (7168, 256, 8, 1)
    ),
}

# ---- smooth latencies (ms), above the consumer's speed of light (989 dense bf16 TFLOPS, 4.8 TB/s) ----

FLOPS, BANDWIDTH = 989e12, 4.8e12


# The consumer prices a static FP8 GEMM as the fp8 GEMM's row less these, floored at its speed of light: kept
# small enough that every such price here stays above it (the fp8 rows move 1.7 bytes per m x k element in time).
def _scale_matrix_ms(c) -> float:
    return 0.001 + 1e3 * 0.25 * c.m * c.k / BANDWIDTH


def _compute_scale_ms(c) -> float:
    return 0.0005 + 1e3 * 0.125 * c.m * c.k / BANDWIDTH


def _bmm_ms(c) -> float:
    inner, outer = (128, 512) if c.op_name == "mla_gen_pre" else (512, 128)
    weight = 1 if c.bmm_dtype == "fp8" else 2
    flops = 2 * c.num_tokens * c.num_heads * inner * outer
    moved = c.num_heads * (inner * outer * weight + 2 * c.num_tokens * (inner + outer))
    post = 0.0003 if c.op_name == "mla_gen_post" else 0.0
    return 0.004 + post + 1e3 * max(flops / (0.5 * FLOPS), moved / (0.6 * BANDWIDTH))


def _encoder_ms(c) -> float:
    flops = 4 * c.batch_size * c.isl**2 * c.num_heads * c.head_dim
    return 0.006 + 1e3 * flops / (0.4 * FLOPS) + 1e3 * 8 * c.batch_size * c.isl * c.num_heads * c.head_dim / BANDWIDTH


def _mla_context_ms(c) -> float:
    flops = c.batch_size * c.isl**2 * c.num_heads * (192 + 128)  # causal: half of 2 x isl^2 per head and width
    return 0.02 + 1e3 * flops / (0.4 * FLOPS)


def _mla_generation_ms(c) -> float:
    cached = c.batch_size * (c.isl + c.step) * 576  # the latent cache read once per step
    return 0.01 + c.num_heads * 1e-5 + 1e3 * 2 * cached / (0.6 * BANDWIDTH)


def _moe_ms(c) -> float:
    return 0.05 + c.num_tokens * 1e-4 + c.topk * 1e-4


def _comm_ms(c) -> float:
    return 0.005 + c.num_gpus * c.message_size * 1e-9 + len(c.op_name) * 1e-6


def _allreduce_ms(c) -> float:
    return 0.003 + (0.002 if c.backend.endswith("eager") else 0.0) + c.num_gpus * c.message_size * 5e-10


def _dtype_gemm_ms(c) -> float:
    # fp8 runs faster than bf16, and the two fp8 kinds differ, so a row read from the wrong dtype shows
    return _gemm_ms(c) * {"bfloat16": 1.0, "fp8": 0.6, "fp8_block": 0.7}[c.gemm_dtype]


LATENCY: dict[str, Callable] = {
    "gemm": _dtype_gemm_ms,
    "compute_scale": _compute_scale_ms,
    "scale_matrix": _scale_matrix_ms,
    "attention_context": _context_ms,
    "attention_generation": _generation_ms,
    "custom_allreduce": _allreduce_ms,
    "comm": _comm_ms,
    "mla_bmm": _bmm_ms,
    "encoder_attention": _encoder_ms,
    "mla_context": _mla_context_ms,
    "mla_generation": _mla_generation_ms,
    "moe": _moe_ms,
}


def build_tables(base: Path, planner) -> Path:
    """One run directory per (backend, op, dispatch) of the compact grid, merged into one TABLES tree."""
    return consumer_trees.build_tables(base, planner, OPS, KEEP, LATENCY)


@pytest.fixture(scope="module")
def tables(tmp_path_factory, planner) -> Path:
    return build_tables(tmp_path_factory.mktemp("estimates"), planner)


_rows, _close = consumer_trees.rows, consumer_trees.close


# ---- the tree ----


def _pinned(backend: str) -> set[str]:
    return set(yaml.safe_load((ROOT / "pins.yaml").read_text())["backends"][backend]["versions"])


def test_the_tree_holds_the_new_tables_with_framework_identities(tables):
    assert all(version in _pinned(backend) for backend, version in VERSIONS.items())
    assert verify_tables(tables).clean
    assert [f.render() for f in check_tables(tables) if not f.warning] == []
    new = (
        ("quantize", "computescale_perf"),
        ("quantize", "scale_matrix_perf"),
        ("mla_bmm", "mla_bmm_perf"),
        ("encoder_attention", "encoder_attention_perf"),
    )
    for backend, version in VERSIONS.items():
        for family, table in new:
            rows = _rows(tables, family, backend, table)
            assert rows and {(r["version"], r["device"]) for r in rows} == {(version, "NVIDIA H200")}
            meta = yaml.safe_load((tables / SYSTEM / family / backend / version / "collection_meta.yaml").read_text())
            assert meta["runtime"] == {"framework": backend, "version": version}
            assert meta["tables"][table]["rows"] == len(rows)


# ---- the estimates ----


QWEN_FP8 = "Qwen/Qwen3-32B-FP8-Static-PerTensor"
DEEPSEEK = "deepseek-ai/DeepSeek-V3"
QWEN_VL = "Qwen/Qwen3-VL-8B-Instruct"
IMAGE = ("--image-height", "448", "--image-width", "448", "--num-images", "1")
MOE_TP = ("--moe-tp-size", "8", "--moe-ep-size", "1")
ESTIMATES = [
    # a static FP8 GEMM is the consumer's estimate from the fp8 GEMM and the quantize tables
    *(Estimate(QWEN_FP8, b, (), "context_qkv_gemm", "estimated") for b in VERSIONS),
    *(Estimate(DEEPSEEK, b, MOE_TP, "generation_mla_block", "silicon") for b in ("sglang", "trtllm")),
    *(Estimate(QWEN_VL, b, IMAGE, "encoder_attention", "silicon") for b in VERSIONS),
]


@pytest.mark.parametrize("e", ESTIMATES, ids=lambda e: f"{e.model.split('/')[1]}-{e.backend}")
def test_cli_estimates_the_model_from_our_tree_alone(tables, consumer_python, e):
    rc, output = estimate(consumer_python, tables, e)
    assert rc == 0, output[-3000:]
    for metric in ("TTFT", "TPOT"):
        found = re.search(rf"{metric}[^0-9]*([0-9]+\.[0-9]+)", output)
        assert found and float(found.group(1)) > 0, output[-3000:]
    line = re.search(rf"^\s*{e.op}\s.*\[(\w+)\]\s*$", output, re.MULTILINE)
    assert line and line.group(1) == e.source, f"{e.op}: {line and line.group(0)!r}\n{output[-3000:]}"


# each new family is what its estimate cannot do without: taken out of a copy, the CLI refuses and names it
def _of(model: str, backend: str) -> Estimate:
    return next(e for e in ESTIMATES if (e.model, e.backend) == (model, backend))


WITHOUT = [
    (_of(QWEN_FP8, "vllm"), "quantize", "computescale_perf"),
    (_of(DEEPSEEK, "sglang"), "mla_bmm", "mla_bmm_perf"),
    (_of(QWEN_VL, "trtllm"), "encoder_attention", "encoder_attention_perf"),
]


@pytest.mark.parametrize("e, family, table", WITHOUT, ids=lambda v: v if isinstance(v, str) else v.backend)
def test_the_estimate_needs_the_new_family(tables, consumer_python, tmp_path, e, family, table):
    copy = tmp_path / "TABLES"
    shutil.copytree(tables, copy)
    shutil.rmtree(copy / SYSTEM / family / e.backend)
    rc, output = estimate(consumer_python, copy, e)
    assert rc != 0 and table in output, output[-3000:]


# ---- the consumer's per-op answers ----


def _new_kind_queries(tables: Path, backend: str) -> tuple[list[dict], list[float]]:
    """Every key of the new tables, and a static FP8 GEMM at every fp8 GEMM key the quantize tables hold."""
    queries, expected = [], []
    keyed = {
        ("mla_bmm", "mla_bmm_perf", "mla_bmm"): ("op_name", "bmm_dtype", "num_tokens", "num_heads"),
        ("encoder_attention", "encoder_attention_perf", "encoder_attention"): (
            "batch_size",
            "isl",
            "num_heads",
            "head_dim",
            "attn_dtype",
        ),
        ("quantize", "computescale_perf", "compute_scale"): ("m", "k", "quant_dtype"),
        ("quantize", "scale_matrix_perf", "scale_matrix"): ("m", "k", "quant_dtype"),
    }
    for (family, table, op), keys in keyed.items():
        rows = _rows(tables, family, backend, table)
        assert rows, (backend, table)
        for row in rows:
            queries.append({"op": op, **{k: row[k] for k in keys}})
            expected.append(row["latency"])
    scale = {
        name: {(r["m"], r["k"]): r["latency"] for r in _rows(tables, "quantize", backend, table)}
        for name, table in (("compute", "computescale_perf"), ("matrix", "scale_matrix_perf"))
    }
    static = 0
    for row in _rows(tables, "gemm", backend, "gemm_perf"):
        key = (row["m"], row["k"])
        if row["gemm_dtype"] != "fp8" or key not in scale["compute"]:
            continue
        static += 1
        at = {"m": row["m"], "n": row["n"], "k": row["k"], "gemm_dtype": "fp8_static"}
        # the dynamic GEMM less the scale computation; less the quantization too when the input is already fp8
        queries.append({"op": "gemm", **at, "low_precision_input": False})
        expected.append(row["latency"] - scale["compute"][key])
        queries.append({"op": "gemm", **at, "low_precision_input": True})
        expected.append(row["latency"] - scale["compute"][key] - scale["matrix"][key])
    assert static, f"{backend}: no fp8 GEMM key the quantize tables hold"
    return queries, expected


def _existing_kind_queries(tables: Path, backend: str) -> tuple[list[dict], list[float]]:
    """SGLang's and TensorRT-LLM's GEMM, MoE and MLA rows, as test_consumer.py asks vLLM's."""
    if backend == "vllm":
        return [], []
    keyed = {
        "gemm": ("gemm", "gemm_perf", ("gemm_dtype", "m", "n", "k")),
        "moe": (
            "moe",
            "moe_perf",
            ("moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts")
            + ("moe_tp_size", "moe_ep_size", "distribution"),
        ),
        "context_mla": ("mla", "context_mla_perf", ("mla_dtype", "kv_cache_dtype", "num_heads", "batch_size", "isl")),
        "generation_mla": (
            "mla",
            "generation_mla_perf",
            ("mla_dtype", "kv_cache_dtype", "num_heads", "batch_size", "isl", "step"),
        ),
    }
    queries, expected = [], []
    for op, (family, table, keys) in keyed.items():
        for row in _rows(tables, family, backend, table):
            queries.append({"op": op, **{k: row[k] for k in keys}})
            expected.append(row["latency"])
    return queries, expected


@pytest.mark.parametrize("backend", VERSIONS)
def test_the_consumer_answers_our_rows(tables, consumer_python, tmp_path, backend):
    """Every MLA BMM, encoder attention and quantize key: the consumer answers exactly our row."""
    new, new_expected = _new_kind_queries(tables, backend)
    old, old_expected = _existing_kind_queries(tables, backend)
    queries, expected = new + old, new_expected + old_expected
    answers = ask(consumer_python, tables, backend, queries, tmp_path)
    wrong = [
        (q, want, got)
        for q, want, got in zip(queries, expected, answers)
        if "latency" not in got or not _close(got["latency"], want)
    ]
    assert not wrong, f"{backend}: {len(wrong)} of {len(queries)} answers differ from our rows, e.g. {wrong[:3]}"
    # the new kinds' answers come from their tables: silicon rows, the GEMM's views, a static GEMM composed of them
    sources = {(q["op"], a["source"]) for q, a in zip(new, answers)}
    assert sources == {
        ("mla_bmm", "silicon"),
        ("encoder_attention", "silicon"),
        ("compute_scale", "view"),
        ("scale_matrix", "view"),
        ("gemm", "estimated"),
    }
