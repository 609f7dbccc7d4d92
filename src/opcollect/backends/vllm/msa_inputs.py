"""What vLLM 0.24.0's MiniMax-M3 sparse attention module (backends/vllm/msa.py) is built and fed with: the model's
config keys, the batch both of its caches share, how serving runs that batch (one CUDA graph, graph pieces around an
eager attention, or no graph), the caches' fill, and the bytes a case needs. No vllm import; torch only inside the
functions that fill tensors.

- Config: the keys MiniMaxM3SparseAttention, its indexer and the two metadata builders read (models/minimax_m3/
  nvidia/model.py:398-534; common/indexer.py:229-239; common/sparse_attention.py:169-183), as the config.json
  aiconfigurator-core 0.12.0 ships holds them (aiconfigurator_core/model_configs/MiniMaxAI--MiniMax-M3_config.json;
  tests/data/sparse_configs). At the rank: num_heads query heads, max(1, heads / 16) KV heads, as many index heads as
  KV heads (the fused projection asserts it, model_executor/layers/linear.py:1339-1344; the model shards index heads
  with the KV heads, nvidia/model.py:424-431), as the reference collector emulates them
  (collector/vllm/collect_msa_module.py:342-345, 395-409).
- Pages: 128 tokens, the sparse block, both backends' only kernel page size (common/sparse_attention.py:81-84,
  common/indexer.py:83-85). Both caches share one page table (one KV cache group); it is as wide as serving's,
  cdiv(max_model_len, 128) (v1/worker/block_table.py:248-264), its unused entries on the null block 0; each
  sequence's pages follow the null block in turn (dsa_inputs.batch_tensors).
- The K/V cache (num_blocks, 2, 128, kv_heads, 128), bf16 or fp8 bytes (uint8 storage the impl views as e4m3,
  common/sparse_attention.py:298-306, :351-353); the indexer's key cache (num_blocks, 128, 128) bf16, vLLM's default
  indexer_kv_dtype (common/indexer.py:127-141). Every byte is a finite value.
"""

from __future__ import annotations

from opcollect.backends.vllm import context, dsa_inputs
from opcollect.backends.vllm.context import breakable_graph_mode, serving_batched_tokens
from opcollect.backends.vllm.gemm import NVFP4_GROUP
from opcollect.runtime.contract import KernelLimit
from opcollect.runtime.dtypes import ceil_div

_LAYERS = 60
_PER_LAYER = [0] * 3 + [1] * (_LAYERS - 3)  # the checkpoint's first 3 layers are dense, the other 57 sparse
# MiniMax-M3's config.json (see the module docstring): the attention's keys and its sparse_attention_config
MODELS: dict[str, dict] = {
    "MiniMaxM3ForCausalLM": {
        "num_hidden_layers": _LAYERS,
        "hidden_size": 6144,
        "num_attention_heads": 64,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "rms_norm_eps": 1e-6,
        "rope_theta": 5000000,
        "rotary_dim": 64,
        "partial_rotary_factor": 0.5,
        "max_position_embeddings": 1048576,
        "sparse_attention_config": {
            "use_sparse_attention": True,
            "sparse_num_index_heads": 4,
            "sparse_index_dim": 128,
            "sparse_block_size": 128,
            "sparse_topk_blocks": 16,
            "sparse_init_block": 0,
            "sparse_local_block": 1,
            "sparse_score_type": "max",
            "sparse_attention_freq": _PER_LAYER,
            "sparse_disable_index_value": _PER_LAYER,
        },
    },
}
BLOCK_SIZE = 128
INDEX_BYTES = 2  # bf16 index keys
# e4m3 bytes 0x20..0x3f: the values 0.125 .. 1.875, finite (dsa_inputs)
FP8_LOW, FP8_HIGH = dsa_inputs.FP8_LOW, dsa_inputs.FP8_HIGH
FULL, PIECEWISE, EAGER = context.FULL, context.PIECEWISE, context.EAGER  # how serving runs a batch (graph_mode)


def model_keys(architecture: str) -> dict:
    """A fresh copy of the architecture's config keys."""
    found = MODELS.get(architecture)
    if found is None:
        raise KernelLimit(f"the vLLM MSA runner knows no config of {architecture} (backends/vllm/msa_inputs.py MODELS)")
    return {k: dict(v) if isinstance(v, dict) else v for k, v in found.items()}


def rank_kv_heads(keys: dict, heads: int) -> int:
    """KV (and index) heads on a rank of ``heads`` query heads: the model's query heads per KV head kept."""
    return max(1, heads // (keys["num_attention_heads"] // keys["num_key_value_heads"]))


def first_sparse_layer(keys: dict) -> int:
    """The first layer that runs the sparse branch (nvidia/model.py:90-97): the one serving builds first."""
    return keys["sparse_attention_config"]["sparse_attention_freq"].index(1)


def lengths(case, context: bool) -> tuple[int, int]:
    """(new tokens, tokens) per sequence: a prompt of isl tokens after `step` cached ones; a decode step of one token
    after `step` cached ones (the reference's keys: its sidecars re-keyed step -> step - 1, so step counts the cached
    tokens alone; collector/vllm/collect_msa_module.py:543-555 caches seq_len and decodes at position seq_len)."""
    return (case.isl, case.step + case.isl) if context else (1, case.step + 1)


def max_model_len(case, context: bool) -> int:
    """Serving's: the model's max_position_embeddings, or the case's sequence if it is longer."""
    return max(MODELS[case.architecture]["max_position_embeddings"], lengths(case, context)[1])


def graph_mode(case, context: bool) -> str:
    """How serving's model runner runs this batch. vLLM turns breakable CUDA graphs on for MiniMax-M3
    (config/vllm.py:1077-1097); its dispatcher (v1/cudagraph_dispatcher.py:272-324) runs a batch above the largest
    capture size without a graph, a uniform decode batch (every request one new token) from a FULL graph of the whole
    forward, and any other batch from a PIECEWISE one: the breakable capture ends a graph at the sparse layer's
    indexer and attention and runs them eagerly (nvidia/model.py:619-631; compilation/breakable_cudagraph.py:93-115),
    except under a FULL graph (:100-103)."""
    query_len, _ = lengths(case, context)
    return breakable_graph_mode(case.batch_size, query_len)


def serving_tokens(case, context: bool) -> int:
    """max_num_batched_tokens as context.serve_batch sets it for this batch."""
    query_len, _ = lengths(case, context)
    return serving_batched_tokens(case.batch_size, case.batch_size * query_len)


def msa_layout(case, context: bool) -> dsa_inputs.DsaLayout:
    query_len, seq_len = lengths(case, context)
    if query_len < 1 or case.step < 0:
        raise KernelLimit(f"an MSA {'prefill' if context else 'decode'} needs new tokens and no negative step: {case}")
    per_seq = ceil_div(seq_len, BLOCK_SIZE)
    width = ceil_div(max_model_len(case, context), BLOCK_SIZE)  # 128 // 128: no further alignment
    b = case.batch_size
    return dsa_inputs.DsaLayout(b, query_len, seq_len, per_seq, width, 1 + b * per_seq, BLOCK_SIZE)


def fill_cache(cache, generator) -> None:
    """Finite values: an fp8 cache's bytes as e4m3 values of 0.125 .. 1.875, a bf16 cache's in [-1, 1)."""
    import torch

    if cache.dtype == torch.uint8:
        cache.random_(FP8_LOW, FP8_HIGH, generator=generator)
    elif cache.element_size() == 1:  # an e4m3 index cache (indexer_kv_dtype fp8): its bytes
        cache.view(torch.uint8).random_(FP8_LOW, FP8_HIGH, generator=generator)
    else:
        cache.uniform_(-1, 1, generator=generator)


def weight_bytes(keys: dict, heads: int, gemm_type: str) -> int:
    """The fused q/k/v/index_q/index_k projection and o_proj in gemm_type (nvidia/model.py:435-456)."""
    d, hidden = keys["head_dim"], keys["hidden_size"]
    kv, index = rank_kv_heads(keys, heads), keys["sparse_attention_config"]["sparse_index_dim"]
    quantized = hidden * ((heads + 2 * kv) * d + kv * index + index) + heads * d * hidden
    if gemm_type == "fp8_block":
        return quantized + quantized // (128 * 128) * 4
    if gemm_type == "nvfp4":
        return quantized // 2 + quantized // NVFP4_GROUP
    return quantized * 2


def footprint_bytes(case, context: bool) -> int:
    """Weights, the rope table, both caches, the page table, the buffers serving sizes by its batch limits (the
    top-k indices, nvidia/model.py:769-781; the builders' context lengths), the per-token activations, the indexer's
    block scores (a prefill's per token and visible block, common/ops/index_topk.py:669-677; a decode's per request
    and block of the metadata's max_seq_len, max_model_len under a FULL graph, :787-809) and the decode split-K
    partials (common/ops/sparse_attn.py:528-538)."""
    k = MODELS.get(case.architecture)
    if k is None:
        return 0  # prepare refuses the architecture before any allocation
    layout = msa_layout(case, context)
    heads, d, hidden = case.num_heads, k["head_dim"], k["hidden_size"]
    kv, index = rank_kv_heads(k, heads), k["sparse_attention_config"]["sparse_index_dim"]
    topk = k["sparse_attention_config"]["sparse_topk_blocks"]
    kv_bytes = 1 if case.kv_cache_dtype == "fp8" else 2
    pages = layout.num_blocks * BLOCK_SIZE * (2 * kv * d * kv_bytes + index * INDEX_BYTES)
    rope = k["max_position_embeddings"] * k["rotary_dim"] * 6  # computed in fp32, kept in bf16
    tokens, batched = layout.num_tokens, serving_tokens(case, context)
    buffers = layout.batch_size * layout.table_width * 4 + batched * (kv * topk * 4 + 8)
    per_token = 2 * (2 * hidden + 2 * (heads + 2 * kv) * d + 2 * (kv + 1) * index) + 2 * hidden
    if layout.query_len > 1:
        scores = tokens * kv * ceil_div(ceil_div(layout.seq_len, BLOCK_SIZE), 16) * 16 * 4
    else:
        width = max_model_len(case, context) if graph_mode(case, context) == FULL else layout.seq_len
        scores = tokens * kv * ceil_div(ceil_div(width, BLOCK_SIZE), 16) * 16 * 4
        scores += 16 * tokens * (heads * d * 2 + heads * 4 + kv * 2 * topk * 4)  # at most 16 chunks of partials
    return weight_bytes(k, heads, case.gemm_type) + rope + pages + buffers + tokens * per_token + scores
