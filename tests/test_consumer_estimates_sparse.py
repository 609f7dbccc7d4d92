"""The consumer estimates the sparse-attention models from our tables alone (issue 24): aiconfigurator 0.12.0 over one
TABLES tree of our kinds (tests/consumer_trees.py), with the framework runners' skip lifted (conftest
runner_pending_lifted: the grids and dispatch the frameworks get once their runners land).

Which tables each estimate reads was found by taking families out of a copy of the consumer's H200 tree until the
CLI refused (TP 8, MoE TP 8, ISL 1024, OSL 128, batch 8):

- DeepSeek-V3.2 (vLLM, SGLang; TensorRT-LLM with a bfloat16 KV cache, the only one its DSA tables hold) and GLM-5
  (all three): dsa_context_module and dsa_generation_module, gemm, moe, custom all-reduce.
- MiniMax-M3 (vLLM 0.24.0; TensorRT-LLM 1.3.0rc23, whose msa tables sit at the second pin and whose other tables
  the consumer fills from 1.3.0rc20): msa_context_module and msa_generation_module, gemm, moe, custom all-reduce.
- DeepSeek-V4-Flash-FP8 (vLLM, SGLang; TensorRT-LLM serves DeepSeek-V4 on Blackwell only): the CSA and HCA context
  and generation modules, mhc_module, gemm, moe, custom all-reduce. SGLang's tree also holds dsv4_csa_topk_calib,
  the top-k correction the consumer subtracts from its CSA context rows.

The CLI estimates each from the tree alone (strict provenance, no built-in systems) with its attention (and mHC)
from our rows, and refuses once the new family is taken out; the consumer's per-op answers at every key of the new
tables the estimates read equal our rows.
"""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import TESTS
from consumer_trees import (
    VERSIONS,
    Estimate,
    ask,
    breakdown,
    build_tables,
    close,
    estimate,
    metrics,
    rows,
    sources,
)
from test_consumer import SYSTEM
from test_consumer_estimates import KEEP as COMMON_KEEP
from test_consumer_estimates import LATENCY as COMMON_LATENCY

consumer_python = __import__("test_consumer").consumer_python  # the fixture: the consumer's venv, once per session

RC23 = "1.3.0rc23"  # TensorRT-LLM's MSA route (pins.yaml: current)
DSA = ("dsa_context_module", "dsa_generation_module")
MSA = ("msa_context_module", "msa_generation_module")
DSV4 = ("dsv4_csa_context_module", "dsv4_csa_generation_module", "dsv4_hca_context_module")
DSV4 += ("dsv4_hca_generation_module",)
BASE = ("gemm", "moe", "custom_allreduce")
OPS = {
    "vllm": (*BASE, *DSA, *MSA, *DSV4, "mhc"),
    "sglang": (*BASE, *DSA, *DSV4, "dsv4_csa_topk_calib", "mhc"),
    "trtllm": (*BASE, *DSA, *MSA, "mhc"),
}

# ---- the compact grid ----

HIDDEN = frozenset({4096, 6144, 7168})  # DeepSeek-V4-Flash, GLM-5 and MiniMax-M3, DeepSeek-V3.(2)


def _module_kept(c) -> bool:
    """Up to 16 sequences, 4096 tokens of prompt and of cache, the heads a rank holds at TP 8 (8 or 16) and their
    neighbours for interpolation."""
    return c.batch_size <= 16 and c.isl <= 4096 and c.step <= 4096 and c.num_heads in (8, 16, 32)


KEEP = {
    **COMMON_KEEP,
    "moe": lambda c: (
        c.moe_dtype in ("bfloat16", "fp8_block")
        and c.hidden_size in HIDDEN
        and (c.moe_tp_size, c.moe_ep_size) == (8, 1)
        and c.distribution == "power_law_1.01"
    ),
    **{op: _module_kept for op in (*DSA, *MSA, *DSV4)},
    # native heads (64 for Flash), one row per score mode: the correction the consumer subtracts from CSA context
    "dsv4_csa_topk_calib": lambda c: c.batch_size <= 16 and c.isl <= 4096 and c.step <= 4096,
    "mhc": lambda c: True,
}

# ---- smooth latencies (ms) well above the consumer's speed of light ----


def _module_ms(c) -> float:
    context = c.isl > 1
    tokens = c.batch_size * c.isl
    cached = c.batch_size * (c.isl + c.step)
    return 0.05 + c.num_heads * 2e-3 + tokens * 2e-4 * (1 + c.step / 8192) + (0.0 if context else cached * 1e-5)


def _calib_ms(c) -> float:
    # the flat score runs longer than the top-last one: the consumer subtracts their difference from CSA context
    flat = 2.0 if c.score_mode.endswith("flat") else 1.0
    return flat * (0.001 + c.batch_size * c.isl * 1e-7)


def _mhc_ms(c) -> float:
    return 0.005 + c.num_tokens * c.hidden_size * c.hc_mult * 1e-9 + (0.001 if c.op_name == "pre" else 0.0)


LATENCY = {
    **COMMON_LATENCY,
    **{op: _module_ms for op in (*DSA, *MSA, *DSV4)},
    "dsv4_csa_topk_calib": _calib_ms,
    "mhc": _mhc_ms,
}


def _version(backend: str, op: str) -> str:
    return RC23 if backend == "trtllm" and op in MSA else VERSIONS[backend]


@pytest.fixture(scope="module")
def tables(tmp_path_factory, planner, pending_runners_lifted):
    return build_tables(tmp_path_factory.mktemp("sparse"), planner, OPS, KEEP, LATENCY, _version)


# ---- the estimates ----

DSV32 = "deepseek-ai/DeepSeek-V3.2"
GLM5 = "zai-org/GLM-5"
M3 = "MiniMaxAI/MiniMax-M3"
V4 = "sgl-project/DeepSeek-V4-Flash-FP8"
MOE_TP = ("--moe-tp-size", "8", "--moe-ep-size", "1")
BF16_KV = ("--kvcache-quant-mode", "bfloat16")
ESTIMATES = [
    Estimate(DSV32, "vllm", MOE_TP, "context_attention", "silicon"),
    Estimate(DSV32, "sglang", MOE_TP, "context_attention", "silicon"),
    Estimate(DSV32, "trtllm", MOE_TP + BF16_KV, "context_attention", "silicon"),
    *(Estimate(GLM5, b, MOE_TP, "context_attention", "silicon") for b in VERSIONS),
    Estimate(M3, "vllm", MOE_TP, "context_attention", "silicon"),
    Estimate(M3, "trtllm", MOE_TP, "context_attention", "silicon", RC23),
    *(Estimate(V4, b, MOE_TP, "context_attention", "silicon") for b in ("vllm", "sglang")),
]
NEW_OPS = ("context_attention", "generation_attention")  # the modules' ops in every estimate's breakdown
MHC_OPS = ("context_mhc_pre", "context_mhc_post", "generation_mhc_pre", "generation_mhc_post")


def _id(e: Estimate) -> str:
    return f"{e.model.split('/')[1]}-{e.backend}"


@pytest.mark.parametrize("e", ESTIMATES, ids=_id)
def test_cli_estimates_the_model_from_our_tree_alone(tables, consumer_python, e):
    rc, output = estimate(consumer_python, tables, e)
    assert rc == 0, output[-3000:]
    assert all(metrics(output).get(m, 0) > 0 for m in ("TTFT", "TPOT")), output[-3000:]
    found = sources(output)
    expected = NEW_OPS + (MHC_OPS if e.model == V4 else ())
    assert {op: found.get(op) for op in expected} == dict.fromkeys(expected, "silicon"), output[-3000:]
    # and nothing of the model falls back to the speed of light: our kinds hold every table the estimate reads
    assert found and "sol" not in found.values(), found


def _of(model: str, backend: str) -> Estimate:
    return next(e for e in ESTIMATES if (e.model, e.backend) == (model, backend))


# each new family is what its estimate cannot do without: taken out of a copy, the CLI refuses and names its table
WITHOUT = [
    (_of(DSV32, "sglang"), "sparse_attention", "dsa_context_module_perf"),
    (_of(GLM5, "trtllm"), "sparse_attention", "dsa_context_module_perf"),
    (_of(M3, "vllm"), "msa", "msa_context_module_perf"),
    (_of(V4, "vllm"), "sparse_attention", "dsv4_csa_context_module_perf"),
    (_of(V4, "sglang"), "mhc", "mhc_module_perf"),
]


@pytest.mark.parametrize("e, family, table", WITHOUT, ids=lambda v: v if isinstance(v, str) else _id(v))
def test_the_estimate_needs_the_new_family(tables, consumer_python, tmp_path, e, family, table):
    copy = tmp_path / "TABLES"
    shutil.copytree(tables, copy)
    shutil.rmtree(copy / SYSTEM / family / e.backend)
    rc, output = estimate(consumer_python, copy, e)
    assert rc != 0 and table in output, output[-3000:]


# ---- the consumer's per-op answers ----

DSA_KEYS = ("architecture", "mla_dtype", "kv_cache_dtype", "gemm_type", "num_heads", "batch_size", "isl", "step")
M3_CONFIG = json.loads((TESTS / "data" / "sparse_configs" / "MiniMaxAI--MiniMax-M3_config.json").read_text())


def _module_queries(tables, backend: str) -> tuple[list[dict], list[float]]:
    """Every key of the DSA, MSA and mHC tables of ``backend`` (TensorRT-LLM's MSA at its own version: a second
    request); GLM-5.2's skip-indexer rows are the consumer's other split of the DSA table, not asked here."""
    queries, expected = [], []
    for table, kind in (("dsa_context_module_perf", "context"), ("dsa_generation_module_perf", "generation")):
        for row in rows(tables, "sparse_attention", backend, table):
            if "skip_indexer" not in row["op_name"]:
                queries.append({"op": f"{kind}_dsa_module", **{k: row[k] for k in DSA_KEYS}})
                expected.append(row["latency"])
    for row in rows(tables, "mhc", backend, "mhc_module_perf"):
        keys = ("op_name", "architecture", "num_tokens", "hidden_size", "hc_mult", "sinkhorn_iters")
        queries.append({"op": "mhc", **{k: row[k] for k in keys}})
        expected.append(row["latency"])
    return queries, expected


def _msa_queries(tables, backend: str) -> tuple[list[dict], list[float]]:
    queries, expected = [], []
    heads, kv_heads = M3_CONFIG["num_attention_heads"], M3_CONFIG["num_key_value_heads"]
    for table, kind in (("msa_context_module_perf", "context"), ("msa_generation_module_perf", "generation")):
        for row in rows(tables, "msa", backend, table, _version(backend, "msa_context_module")):
            queries.append(
                {
                    "op": f"{kind}_msa_module",
                    **{k: row[k] for k in DSA_KEYS},
                    # a rank's KV heads where a rank holds num_heads of MiniMax-M3's query heads
                    "num_key_value_heads": max(1, kv_heads * row["num_heads"] // heads),
                    "hidden_size": M3_CONFIG["hidden_size"],
                    "head_dim": M3_CONFIG["head_dim"],
                }
            )
            expected.append(row["latency"])
    return queries, expected


def _wrong(queries, expected, answers) -> list:
    return [
        (q, want, got)
        for q, want, got in zip(queries, expected, answers)
        if "latency" not in got or not close(got["latency"], want)
    ]


@pytest.mark.parametrize("backend", VERSIONS)
def test_the_consumer_answers_our_rows(tables, consumer_python, tmp_path, backend):
    """Every key of the DSA module, MSA module and mHC tables: the consumer answers exactly our row, from silicon."""
    queries, expected = _module_queries(tables, backend)
    answers = ask(consumer_python, tables, backend, queries, tmp_path)
    wrong = _wrong(queries, expected, answers)
    assert not wrong, f"{backend}: {len(wrong)} of {len(queries)} answers differ from our rows, e.g. {wrong[:3]}"
    assert {a["source"] for a in answers} == {"silicon"}
    if "msa_context_module" in OPS[backend]:
        version = _version(backend, "msa_context_module")
        queries, expected = _msa_queries(tables, backend)
        answers = ask(consumer_python, tables, backend, queries, tmp_path, version)
        wrong = _wrong(queries, expected, answers)
        assert not wrong, f"{backend} {version} MSA: {len(wrong)} of {len(queries)} differ, e.g. {wrong[:3]}"
        assert {a["source"] for a in answers} == {"silicon"}


# ---- DeepSeek-V4's attention modules ----

# the consumer's DSv4 loader reads SGLang's fp8_e4m3 spelling as fp8 for mla_dtype and kv_cache_dtype, gemm_type as
# written (aiconfigurator-core perf_database/dsv4.rs:1315-1320 normalize_dsv4_dtype)
DSV4_DTYPE = {"fp8_e4m3": "fp8"}
DSV4_KEYS = ("model", "compress_ratio", "tp_size", "gemm_type", "batch_size", "isl", "step")
CALIB = "dsv4_csa_topk_calib_perf"


def _dsv4_queries(tables, backend: str) -> tuple[list[dict], list[tuple[str, dict]]]:
    """A query at every key of the four DSv4 module tables of ``backend``, with (phase, our row) for each."""
    queries, keyed = [], []
    for table in ("dsv4_csa_context_module_perf", "dsv4_hca_context_module_perf"):
        keyed += [("context", row) for row in rows(tables, "sparse_attention", backend, table)]
    for table in ("dsv4_csa_generation_module_perf", "dsv4_hca_generation_module_perf"):
        keyed += [("generation", row) for row in rows(tables, "sparse_attention", backend, table)]
    for phase, row in keyed:
        queries.append(
            {
                "op": f"{phase}_dsv4_module",
                **{k: row[k] for k in DSV4_KEYS},
                "mla_dtype": DSV4_DTYPE.get(row["mla_dtype"], row["mla_dtype"]),
                "kv_cache_dtype": DSV4_DTYPE.get(row["kv_cache_dtype"], row["kv_cache_dtype"]),
            }
        )
    return queries, keyed


def _topk_deltas(calib: list[dict]) -> dict[tuple, float]:
    """(variant, native heads, step, isl, batch_size) -> max(0, flat - top_last), first row of each key wins."""
    latency: dict[tuple, float] = {}
    for row in calib:
        variant, mode = row["score_mode"].split("_", 1)
        key = (variant, row["num_heads"], row["step"], row["isl"], row["batch_size"], mode)
        latency.setdefault(key, row["latency"])
    return {
        key[:-1]: max(0.0, flat - latency[(*key[:-1], "top_last")])
        for key, flat in latency.items()
        if key[-1] == "flat" and (*key[:-1], "top_last") in latency
    }


def _delta_key(phase: str, row: dict) -> tuple:
    """Where the consumer looks up a CSA row's correction: the variant and the query's native heads (num_heads *
    tp_size), then (prefix, isl, batch) of context or (isl + step - 1, 1, batch) of decode."""
    native = row["num_heads"] * row["tp_size"]
    if phase == "context":
        return ("v1", native, row["step"], row["isl"], row["batch_size"])
    return ("v2", native, row["isl"] + row["step"] - 1, 1, row["batch_size"])


def _dsv4_expected(keyed: list[tuple[str, dict]], deltas: dict[tuple, float] | None) -> list[float]:
    """Our row; a CSA row less its correction where the tree holds the calibration (``deltas``)."""
    expected = []
    for phase, row in keyed:
        if deltas is None or row["compress_ratio"] != 4:
            expected.append(row["latency"])
        else:
            expected.append(max(0.0, row["latency"] - deltas[_delta_key(phase, row)]))
    return expected


def _calib_path(tables, backend: str):
    return tables / SYSTEM / "sparse_attention" / backend / VERSIONS[backend] / f"{CALIB}.parquet"


@pytest.mark.parametrize("backend", ("vllm", "sglang"))
def test_the_consumer_answers_our_dsv4_modules(tables, consumer_python, tmp_path, backend):
    """Every key of the CSA and HCA context and generation module tables: the consumer (ops built as its DeepSeek-V4
    model builds them, tests/consumer_driver.py) answers our row from silicon; on SGLang a CSA row less the top-k
    correction the consumer takes from dsv4_csa_topk_calib.

    The consumer's rule (aiconfigurator-core 0.12.0 perf_database/dsv4.rs, compiled into the wheel's
    _aiconfigurator_core.abi3.so; read at ai-dynamo/aiconfigurator 095f58a5,
    aic-core/rust/aiconfigurator-core/src/perf_database/dsv4.rs):

    - load_topk_calib_parquet (:815-900) reads {framework}/{version}/dsv4_csa_topk_calib_perf.parquet, keys each row
      by its num_heads (the model's native heads; a row without it is skipped, :851), (step, isl, batch_size) and
      score_mode, first row wins, and pairs DELTA = max(0, v1_flat - v1_top_last) (:881) and max(0, v2_flat -
      v2_top_last) (:887); no file means no correction (:874).
    - CSA only (compress_ratio 4; HCA untouched): query_context subtracts v1's DELTA at (prefix, isl, batch) (:344-346),
      query_generation v2's at (s_total - 1, 1, batch), s_total = isl + step (:420-428).
    - topk_corrected (:467-503) takes the bucket of the query's native heads only (:488), is on unless
      AIC_DSV4_TOPK_CORRECTION=0 (:740-750), and returns max(0, latency - DELTA) (apply_topk_delta :783-794);
      topk_delta_ms (:1000-1003) takes the exact (prefix, isl, batch) and interpolates only off the grid.
    - A module row's native heads are num_heads * tp_size (load_module_parquet :1481); the op carries the model's.
    """
    queries, keyed = _dsv4_queries(tables, backend)
    calib = _calib_path(tables, backend)
    assert calib.exists() == (CALIB.removesuffix("_perf") in OPS[backend])
    deltas = _topk_deltas(rows(tables, "sparse_attention", backend, CALIB)) if calib.exists() else None
    if deltas is not None:
        # our calibration holds every CSA key at the exact point the consumer looks up: no interpolation, and a
        # correction that moves every CSA answer off our row
        csa = [_delta_key(phase, row) for phase, row in keyed if row["compress_ratio"] == 4]
        assert csa and all(deltas.get(key, 0.0) > 0 for key in csa), [k for k in csa if k not in deltas][:3]
    expected = _dsv4_expected(keyed, deltas)
    answers = ask(consumer_python, tables, backend, queries, tmp_path)
    wrong = _wrong(queries, expected, answers)
    assert not wrong, f"{backend}: {len(wrong)} of {len(queries)} DSv4 answers differ, e.g. {wrong[:3]}"
    assert {a["source"] for a in answers} == {"silicon"}
    assert {row["compress_ratio"] for _, row in keyed} == {4, 128}


def _attention_ms(output: str) -> dict[str, float]:
    return {op: float(breakdown(output)[op].split()[0]) for op in NEW_OPS}


def test_sglang_estimates_deepseek_v4_without_the_topk_calibration(tables, consumer_python, tmp_path):
    """dsv4_csa_topk_calib is a correction, not a requirement: taken out of a copy, the CLI still estimates
    DeepSeek-V4-Flash on SGLang (the loader's missing file means no correction, dsv4.rs:874), with slower context
    and generation attention (no top-k DELTA is taken off the CSA modules), and the consumer's CSA answers are then
    our rows themselves."""
    e = _of(V4, "sglang")
    copy = tmp_path / "TABLES"
    shutil.copytree(tables, copy)
    _calib_path(copy, "sglang").unlink()
    rc, without = estimate(consumer_python, copy, e)
    assert rc == 0, without[-3000:]
    assert {op: sources(without).get(op) for op in NEW_OPS} == dict.fromkeys(NEW_OPS, "silicon"), without[-3000:]
    rc, with_calib = estimate(consumer_python, tables, e)
    assert rc == 0, with_calib[-3000:]
    slower, faster = _attention_ms(without), _attention_ms(with_calib)
    assert all(slower[op] > faster[op] for op in NEW_OPS), (slower, faster)
    queries, keyed = _dsv4_queries(copy, "sglang")
    answers = ask(consumer_python, copy, "sglang", queries, tmp_path)
    wrong = _wrong(queries, _dsv4_expected(keyed, None), answers)
    assert not wrong, f"{len(wrong)} of {len(queries)} DSv4 answers differ from our rows, e.g. {wrong[:3]}"
