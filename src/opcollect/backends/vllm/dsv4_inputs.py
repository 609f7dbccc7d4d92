"""What vLLM 0.24.0's DeepSeek-V4 attention runners (backends/vllm/dsv4.py) are built and fed with: each model's config
keys, the batch, how serving runs it (one CUDA graph, graph pieces around the eager attention, or none), the caches'
fill, and the bytes a case needs. No vllm import; torch only inside the functions that fill tensors.

- Config: the keys of the config.json files aiconfigurator-core 0.12.0 ships (aiconfigurator_core/model_configs/
  sgl-project--DeepSeek-V4-{Flash,Pro}-FP8_config.json; tests/data/dsv4_configs), by the case's model, with
  rope_scaling's legacy "type" named rope_type as vLLM's config loader renames it (transformers_utils/config.py:
  490-509), and rms_norm_eps 1e-6, which the FP8 files leave out and vLLM's attention reads (attention.py:186), as
  the reference collector sets it (collector/vllm/collect_dsv4_attn.py:134-136).
- Pages: each cache layer's own page size, one page table per layer as serving's KV cache groups have (the
  compressed MLA cache and the indexer's 256 tokens, sparse_mla.py:55-56 and attention.py:611-623; the sliding-window
  cache 64, v1/attention/backends/mla/sparse_swa.py:76; the compressor states 4 or 8, compressor.py:150-153); each
  sequence's pages follow the null block 0 in turn (dsa_inputs.batch_tensors), the table exactly as wide as the
  sequence needs.
- Fill: every cache byte of a uint8 layout (fp8_ds_mla, the indexer's fp8 keys and fp32 scales) is drawn from
  0x20..0x3f, so each fp8 e4m3 value, ue8m0 scale, bf16 rope value and fp32 scale the kernels read from it is finite
  whatever the byte's place; fp32 compressor states are uniform in [-1, 1).
"""

from __future__ import annotations

from typing import NamedTuple

from opcollect.backends.vllm import context, dsa_inputs
from opcollect.backends.vllm.context import breakable_graph_mode, serving_batched_tokens
from opcollect.runtime.contract import KernelLimit
from opcollect.runtime.dtypes import ceil_div

_COMMON = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "num_key_value_heads": 1,
    "head_dim": 512,
    "vocab_size": 129280,
    "max_position_embeddings": 1048576,
    "n_shared_experts": 1,
    "num_experts_per_tok": 6,
    "num_nextn_predict_layers": 1,
    "o_lora_rank": 1024,
    "qk_rope_head_dim": 64,
    "index_head_dim": 128,
    "index_n_heads": 64,
    "sliding_window": 128,
    "num_hash_layers": 3,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-06,
    "compress_rope_theta": 160000,
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "scale_fmt": "ue8m0",
        "weight_block_size": [128, 128],
    },
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 16,
        "original_max_position_embeddings": 65536,
        "rope_type": "yarn",  # "type" in the files
    },
    "topk_method": "noaux_tc",
    "scoring_func": "sqrtsoftplus",
    "torch_dtype": "bfloat16",
    "rms_norm_eps": 1e-6,
}
MODELS: dict[str, dict] = {
    "sgl-project/DeepSeek-V4-Flash-FP8": {
        **_COMMON,
        "hidden_size": 4096,
        "num_hidden_layers": 43,
        "num_attention_heads": 64,
        "moe_intermediate_size": 2048,
        "n_routed_experts": 256,
        "q_lora_rank": 1024,
        "o_groups": 8,
        "index_topk": 512,
    },
    "sgl-project/DeepSeek-V4-Pro-FP8": {
        **_COMMON,
        "hidden_size": 7168,
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "moe_intermediate_size": 3072,
        "n_routed_experts": 384,
        "q_lora_rank": 1536,
        "o_groups": 16,
        "index_topk": 1024,
    },
}
MLA_BLOCK = 256  # DeepseekV4FlashMLABackend's only kernel page size (sparse_mla.py:55-56)
INDEX_BLOCK = 64  # the indexer cache DeepGEMM's paged MQA logits reads: 64 tokens a page (collector :580)
KV_TOKEN_BYTES = 584  # fp8_ds_mla: 448 fp8 NoPE, 64 bf16 RoPE, 8 scale bytes (sparse_mla.py:98-110)
INDEX_TOKEN_BYTES = 132  # 128 fp8 values and an fp32 scale (attention.py:738-742)
STATE_BYTES = {4: 2 * 2 * 2 * 4, 128: 2 * 4}  # fp32 per token and head_dim value: (kv, score) x coff (compressor.py)
FP8_LOW, FP8_HIGH = dsa_inputs.FP8_LOW, dsa_inputs.FP8_HIGH
PREFILL_CHUNK = 4  # DeepseekV4Attention.PREFILL_CHUNK_SIZE (attention.py:120): the bf16 gather workspace's chunks
MAX_LOGITS_BYTES = dsa_inputs.MAX_LOGITS_BYTES
MIN_MODEL_LEN = 4096  # the reference's max_model_len floor (collector :213)
# how serving runs a batch (graph_mode, context.breakable_graph_mode); every builder supports a FULL graph of a uniform
# decode batch, UNIFORM_BATCH or ALWAYS (sparse_mla.py:139, sparse_swa.py:294, compressor.py:87)
FULL, PIECEWISE, EAGER = context.FULL, context.PIECEWISE, context.EAGER


def model_keys(model: str) -> dict:
    """A fresh copy of the model's config keys (vLLM's rope builder writes into rope_parameters)."""
    found = MODELS.get(model)
    if found is None:
        raise KernelLimit(f"the vLLM DeepSeek-V4 runner knows no config of {model} (backends/vllm/dsv4_inputs.py)")
    return {k: dict(v) if isinstance(v, dict) else v for k, v in found.items()}


def lengths(case, context: bool) -> tuple[int, int]:
    """(new tokens, tokens) per sequence: a prompt of isl tokens after `step` cached ones; a decode step of one token
    after `step` cached ones (the reference builds its metadata with step + 1 tokens, collector :451-471)."""
    return (case.isl, case.step + case.isl) if context else (1, case.step + 1)


def max_model_len(case, context: bool) -> int:
    """The reference's: the sequence, at least 4096 (collector :212-213)."""
    return max(lengths(case, context)[1], MIN_MODEL_LEN)


def serving_tokens(case, context: bool) -> int:
    """max_num_batched_tokens as context.serve_batch sets it for this batch."""
    query_len, _ = lengths(case, context)
    return serving_batched_tokens(case.batch_size, case.batch_size * query_len)


def graph_mode(case, context: bool) -> str:
    """How serving's model runner runs this batch: vLLM turns breakable CUDA graphs on for DeepseekV4ForCausalLM
    (config/vllm.py:1077-1097); a batch above the largest capture size runs without a graph, a uniform decode batch
    from a FULL graph of the whole forward, any other from a PIECEWISE one, whose capture breaks at attention_impl
    and runs it eagerly (attention.py:428; compilation/breakable_cudagraph.py:93-115)."""
    query_len, _ = lengths(case, context)
    return breakable_graph_mode(case.batch_size, query_len)


class Batch(NamedTuple):
    """The batch one call runs: every sequence alike, query_len new tokens ending a sequence of seq_len."""

    batch_size: int
    query_len: int
    seq_len: int

    @property
    def num_tokens(self) -> int:
        return self.batch_size * self.query_len


def batch(case, context: bool) -> Batch:
    query_len, seq_len = lengths(case, context)
    if query_len < 1 or case.step < 0 or case.batch_size < 1:
        raise KernelLimit(f"a DeepSeek-V4 {'prefill' if context else 'decode'} needs new tokens: {case}")
    return Batch(case.batch_size, query_len, seq_len)


def layout(b: Batch, block_size: int) -> dsa_inputs.DsaLayout:
    """One cache layer's pages of the batch at its page size: the null block, then each sequence's pages."""
    per_seq = ceil_div(b.seq_len, block_size)
    return dsa_inputs.DsaLayout(b.batch_size, b.query_len, b.seq_len, per_seq, per_seq, 1 + b.batch_size * per_seq,
                                block_size)  # fmt: skip


def fill_pages(raw, dtype, generator) -> None:
    """A cache's bytes: finite values in any uint8 layout (the module docstring), uniform fp32/bf16 values else."""
    import torch

    if dtype == torch.uint8:
        raw.random_(FP8_LOW, FP8_HIGH, generator=generator)
    else:
        raw.view(dtype).uniform_(-1, 1, generator=generator)


def weight_bytes(k: dict, heads: int, tp: int, ratio: int) -> int:
    """Block-fp8 projections (a byte a weight, an fp32 scale per 128 x 128; attention.py:198-236, the indexer's wq_b
    :707-713) and the bf16 ones: the compressors' fused_wkv_wgate (compressor.py:229-237), the indexer's
    weights_proj (:714-720)."""
    d, hidden, groups = k["head_dim"], k["hidden_size"], max(1, k["o_groups"] // tp)
    fp8 = hidden * (k["q_lora_rank"] + d) + k["q_lora_rank"] * heads * d + heads * d * k["o_lora_rank"]
    fp8 += groups * k["o_lora_rank"] * hidden
    coff = 2 if ratio == 4 else 1
    bf16 = hidden * 2 * coff * d
    if ratio == 4:
        index = k["index_n_heads"] * k["index_head_dim"]
        fp8 += k["q_lora_rank"] * index
        bf16 += hidden * (k["index_n_heads"] + 2 * 2 * k["index_head_dim"])
    return fp8 + fp8 // (128 * 128) * 4 + 2 * bf16


def footprint_bytes(case, context: bool, heads: int, module: bool = True) -> int:
    """Weights, every cache layer's pages (every token of every sequence paged, as the reference allocates them), the
    per-token activations at FlashMLA's padded heads, and the buffers vLLM sizes by its batch limits and max_model_len:
    the top-k indices (nvidia/model.py:951-955), the indexer's expanded page table (v1/attention/backends/mla/indexer.py
    :310-320) and logits, the C128A index buffers (sparse_mla.py:170-196), the prefill gather workspace
    (sparse_swa.py:210-227). ``module`` False: forward_mqa alone, no activations beyond its query and output."""
    k = MODELS.get(case.model)
    if k is None:
        return 0  # prepare refuses the model before any allocation
    b = batch(case, context)
    ratio, d, hidden = case.compress_ratio, k["head_dim"], k["hidden_size"]
    length, tokens, batched = max_model_len(case, context), b.num_tokens, serving_tokens(case, context)
    padded = 64 if heads <= 64 else 128
    sequence = b.batch_size * (b.seq_len + 4 * MLA_BLOCK)
    pages = sequence * (KV_TOKEN_BYTES + KV_TOKEN_BYTES // ratio + STATE_BYTES[ratio] * d)
    buffers = batched * k["index_topk"] * 4 + PREFILL_CHUNK * (length // ratio + 128 + batched) * d * 2
    if ratio == 4:
        pages += sequence * (INDEX_TOKEN_BYTES // 4 + STATE_BYTES[4] * k["index_head_dim"])
        buffers += batched * ceil_div(length, MLA_BLOCK) * 4
        buffers += MAX_LOGITS_BYTES if b.query_len > 1 else b.batch_size * ceil_div(length, 4) * 4
    else:
        buffers += 2 * batched * ceil_div(ceil_div(length, ratio), 128) * 128 * 4
    per_token = 2 * padded * d * 2 * 2  # the query and the output, bf16, at the padded heads
    if module:
        per_token += 2 * (4 * hidden + 2 * k["q_lora_rank"] + 4 * d) + 4 * 2 * 2 * d * 2
        if ratio == 4:
            per_token += k["index_n_heads"] * (k["index_head_dim"] * 3 + 8) + 4 * 2 * 2 * k["index_head_dim"]
        pages += weight_bytes(k, heads, case.tp_size, ratio)
    return pages + buffers + tokens * per_token
