"""Ask aiconfigurator-core what a systems root says: run by tests/test_consumer.py in the consumer's own venv.

Usage: python consumer_driver.py REQUEST.json ANSWER.json. The request names the root, system, backend,
version and a list of queries; the answer holds one {latency, source} per query, or {error} for the whole
request. The database opens with strict provenance and without the shared layer, so every answer comes
from the named version's own tables. This file imports only the consumer (and the standard library).

compute_scale and scale_matrix are no op of their own: the consumer reads them as GEMM's table views
(sdk/operations/gemm.py GEMM.load_data) and prices an fp8_static GEMM from them; a query of either kind answers
the view's entry, a gemm query may carry low_precision_input.
"""

from __future__ import annotations

import json
import sys


def _op(query: dict):
    from aiconfigurator_core.sdk import common
    from aiconfigurator_core.sdk import operations as ops

    kind = query["op"]
    kv = common.KVCacheQuantMode[query["kv_cache_dtype"]] if "kv_cache_dtype" in query else None
    if kind == "gemm":
        op = ops.GEMM(
            "q",
            1,
            query["n"],
            query["k"],
            common.GEMMQuantMode[query["gemm_dtype"]],
            low_precision_input=query.get("low_precision_input", False),
        )
        return op, {"is_context": True, "batch_size": 1, "s": 1, "x": query["m"]}
    if kind == "context_attention":
        op = ops.ContextAttention(
            "q",
            1,
            query["num_heads"],
            query["num_key_value_heads"],
            kv,
            common.FMHAQuantMode[query["attn_dtype"]],
            window_size=query["window_size"],
            head_size=query["head_dim"],
        )
        return op, {"is_context": True, "batch_size": query["batch_size"], "s": query["isl"]}
    if kind == "generation_attention":
        op = ops.GenerationAttention(
            "q",
            1,
            query["num_heads"],
            query["num_key_value_heads"],
            kv,
            window_size=query["window_size"],
            head_size=query["head_dim"],
        )
        return op, {"is_context": False, "batch_size": query["batch_size"], "s": query["isl"] + query["step"]}
    if kind == "moe":
        op = ops.MoE(
            "q",
            1,
            query["hidden_size"],
            query["inter_size"],
            query["topk"],
            query["num_experts"],
            query["moe_tp_size"],
            query["moe_ep_size"],
            common.MoEQuantMode[query["moe_dtype"]],
            query["distribution"],
            1,
            is_context=True,
        )
        return op, {"is_context": True, "batch_size": 1, "s": 1, "x": query["num_tokens"]}
    if kind == "context_mla":
        op = ops.ContextMLA("q", 1, query["num_heads"], kv, common.FMHAQuantMode[query["mla_dtype"]])
        return op, {"is_context": True, "batch_size": query["batch_size"], "s": query["isl"]}
    if kind == "generation_mla":
        op = ops.GenerationMLA("q", 1, query["num_heads"], kv)
        return op, {"is_context": False, "batch_size": query["batch_size"], "s": query["isl"] + query["step"]}
    if kind == "nccl":
        # one element per token: x tokens make a message of x elements
        op = ops.NCCL("q", 1, query["op_name"], 1, query["num_gpus"], common.CommQuantMode[query["nccl_dtype"]])
        return op, {"is_context": True, "batch_size": 1, "s": 1, "x": query["message_size"]}
    if kind == "custom_allreduce":
        op = ops.CustomAllReduce("q", 1, 1, query["num_gpus"])
        return op, {"is_context": True, "batch_size": 1, "s": 1, "x": query["message_size"]}
    if kind == "mla_bmm":  # the absorb BMM of MLA decode: one token per sequence, so batch_size is num_tokens
        op = ops.MLABmm(
            "q",
            1,
            query["num_heads"],
            common.GEMMQuantMode[query["bmm_dtype"]],
            if_pre=query["op_name"] == "mla_gen_pre",
        )
        return op, {"is_context": False, "batch_size": query["num_tokens"], "s": 1}
    if kind == "encoder_attention":  # no RoPE: the table's kernel time alone
        op = ops.EncoderAttention(
            "q",
            1,
            query["num_heads"],
            query["head_dim"],
            fmha_quant_mode=common.FMHAQuantMode[query["attn_dtype"]],
            partial_rotary_factor=0.0,
        )
        return op, {"is_context": True, "batch_size": query["batch_size"], "s": query["isl"]}
    if kind == "context_dsa_module":  # the table's step is the cached prefix before the isl new tokens
        op = ops.ContextDSAModule(
            "q",
            1,
            query["num_heads"],
            kv,
            common.FMHAQuantMode[query["mla_dtype"]],
            common.GEMMQuantMode[query["gemm_type"]],
            architecture=query["architecture"],
        )
        return op, {"is_context": True, "batch_size": query["batch_size"], "s": query["isl"], "prefix": query["step"]}
    if kind == "generation_dsa_module":
        op = ops.GenerationDSAModule(
            "q",
            1,
            query["num_heads"],
            kv,
            common.GEMMQuantMode[query["gemm_type"]],
            architecture=query["architecture"],
        )
        return op, {"is_context": False, "batch_size": query["batch_size"], "s": query["isl"] + query["step"]}
    if kind in ("context_msa_module", "generation_msa_module"):
        # the table is keyed by heads, prefix, isl and batch alone; the geometry (the query's, and the indexer's
        # constants of the consumer's MiniMax-M3 model) anchors its speed of light only
        from aiconfigurator_core.sdk.models.minimax_m3 import MiniMaxM3Model as m3

        context = kind == "context_msa_module"
        op = (ops.ContextMSAModule if context else ops.GenerationMSAModule)(
            "q",
            1,
            query["num_heads"],
            query["num_key_value_heads"],
            query["hidden_size"],
            query["head_dim"],
            m3.V_HEAD_DIM,
            m3.INDEX_N_HEADS,
            m3.INDEX_HEAD_DIM,
            m3.SPARSE_TOPK_BLOCKS * m3.SPARSE_BLOCK_SIZE,
            m3.SPARSE_BLOCK_SIZE,
            kv,
            common.FMHAQuantMode[query["mla_dtype"]],
            common.GEMMQuantMode[query["gemm_type"]],
            dsa_architecture=m3.DSA_TRANSFER_ARCH,
        )
        if context:
            return op, {
                "is_context": True,
                "batch_size": query["batch_size"],
                "s": query["isl"],
                "prefix": query["step"],
            }
        return op, {"is_context": False, "batch_size": query["batch_size"], "s": query["isl"] + query["step"]}
    if kind in ("context_dsv4_module", "generation_dsv4_module"):
        # built as the consumer's DeepSeek-V4 model builds its attention ops (sdk/models/deepseek_v4.py:117-157):
        # the model's config as the consumer parses it (its shipped copy), rank-local heads native // tp, rank-local
        # o_groups, and compress_ratio choosing CSA (4) or HCA (any other)
        from aiconfigurator_core.sdk.utils import get_model_config_from_model_path

        config = get_model_config_from_model_path(query["model"])
        v4, native, tp = config["extra_params"], config["n"], query["tp_size"]
        context = kind == "context_dsv4_module"
        op = (ops.ContextDeepSeekV4AttentionModule if context else ops.GenerationDeepSeekV4AttentionModule)(
            "q",
            1,
            native // tp,
            native,
            tp,
            config["hidden_size"],
            v4.q_lora_rank,
            v4.o_lora_rank,
            v4.head_dim,
            v4.qk_rope_head_dim,
            v4.index_n_heads,
            v4.index_head_dim,
            v4.index_topk,
            v4.sliding_window,
            query["compress_ratio"],
            max(1, v4.o_groups // tp),
            kv,
            common.FMHAQuantMode[query["mla_dtype"]],
            common.GEMMQuantMode[query["gemm_type"]],
            architecture=config["architecture"],
        )
        if context:  # the table's step is the cached prefix before the isl new tokens
            return op, {
                "is_context": True,
                "batch_size": query["batch_size"],
                "s": query["isl"],
                "prefix": query["step"],
            }
        return op, {"is_context": False, "batch_size": query["batch_size"], "s": query["isl"] + query["step"]}
    if kind == "mhc":  # "pre" or "post" over num_tokens tokens
        op = ops.DeepSeekV4MHCModule(
            "q",
            1,
            query["op_name"],
            query["hidden_size"],
            query["hc_mult"],
            query["sinkhorn_iters"],
            common.GEMMQuantMode.bfloat16,
            architecture=query["architecture"],
        )
        return op, {"is_context": True, "batch_size": 1, "s": query["num_tokens"]}
    raise ValueError(f"unknown query op {kind!r}")


# the GEMM table views of the quantize tables (sdk/engine_table_view.py VIEW_KEY_LAYERS: quant mode -> m -> k)
VIEWS = {"compute_scale": "_compute_scale_data", "scale_matrix": "_scale_matrix_data"}


def _view(db, query: dict) -> dict:
    from aiconfigurator_core.sdk import common
    from aiconfigurator_core.sdk import operations as ops

    ops.GEMM.load_data(db)
    entry = getattr(db, VIEWS[query["op"]])[common.GEMMQuantMode[query["quant_dtype"]]][query["m"]][query["k"]]
    return {"latency": entry["latency"], "source": "view"}


def answer(request: dict) -> dict:
    from aiconfigurator_core.sdk import perf_database
    from aiconfigurator_core.sdk.engine import EngineHandle, build_ops_json

    db = perf_database.get_database(
        request["system"],
        request["backend"],
        request["version"],
        systems_paths=[request["root"]],
        strict_provenance=True,
        shared_layer=False,
    )
    if db is None:
        return {"error": "get_database returned None"}
    handle = EngineHandle.for_database(db, systems_path=request["root"])
    answers = []
    for query in request["queries"]:
        if query["op"] in VIEWS:
            try:
                answers.append(_view(db, query))
            except KeyError as exc:  # no such entry in the view
                answers.append({"error": f"KeyError: {exc}"})
            continue
        op, at = _op(query)
        try:
            [(_, latency, _, source)] = handle.evaluate_ops_json(build_ops_json([op]), **at)
        except Exception as exc:  # the consumer's refusal is the answer to report
            answers.append({"error": f"{type(exc).__name__}: {exc}"})
            continue
        answers.append({"latency": latency, "source": source})
    return {"answers": answers}


def main() -> int:
    request_path, answer_path = sys.argv[1:3]
    with open(request_path) as handle:
        request = json.load(handle)
    try:
        result = answer(request)
    except Exception as exc:  # a strict-provenance refusal or a loader error: the test shows it
        result = {"error": f"{type(exc).__name__}: {exc}"}
    with open(answer_path, "w") as handle:
        json.dump(result, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
