"""What SGLang 0.5.14's DSA attention module (backends/sglang/dsa.py) is built and fed with: each model's config
keys, the batch in SGLang's paged token pools, the caches' byte layouts, the label of what ran, and the bytes a case
needs. No sglang import; torch only inside the functions that build tensors. Paths relative to the wheel's sglang/srt/.

- Config: the keys DeepseekV2AttentionMLA, its Indexer and the DSA backend read (models/deepseek_v2.py:1484-1690,
  1966-1977; configs/model_config.py:103-205), as the config.json files aiconfigurator-core 0.12.0 ships hold them and
  transformers 5.8.1 (SGLang's pin) reads them: rope_parameters with rope_theta inside (DeepSeek-V3.2's yarn keys
  too). GLM-5.2 differs from GLM-5 in max_position_embeddings, rope_theta and its indexer-skipping pattern
  (index_topk_freq 4, index_skip_topk_offset 3); a model label not listed takes its architecture's keys, with
  max_position_embeddings grown to hold the case.
- Pages: 64 tokens, the only page size of SGLang's DSA on CUDA (DSATokenToKVPool asserts it, mem_cache/
  memory_pool.py:2549; dsa_indexer.py:613). Each request's tokens fill its own pages after the pool's padded first
  page (slot 0..63, memory_pool.py:2160-2167); the request-to-token rows start at 1 (ReqToTokenPool keeps row 0).
- The latent cache: 576 bf16 values a token, or for an fp8 cache outside trtllm FlashMLA's 656 bytes (512 fp8
  values, 4 fp32 scales, 64 bf16 rope values; model_runner_kv_cache_mixin.py:226-271). The indexer's keys: per
  page 64 x 128 fp8 values, then 64 fp32 scales (memory_pool.py:2555-2574). Every byte is a finite value.
"""

from __future__ import annotations

from typing import NamedTuple

from opcollect.backends.mla_configs import checkpoint_keys
from opcollect.runtime.contract import KernelLimit
from opcollect.runtime.dtypes import ceil_div

PAGE_SIZE = 64
LATENT = 576  # kv_lora_rank 512 + qk_rope_head_dim 64
KV_LORA = 512
FP8_LATENT_BYTES = 656  # 512 fp8 + 512 / 128 x 4 scale bytes + 64 x 2 rope bytes (kv_cache_mixin.py:262-271)
INDEX_DIM, INDEX_QUANT = 128, 128  # DSATokenToKVPool: index_head_dim 128, an fp32 scale per 128 (:2493, :2537)
FP8_LOW, FP8_HIGH = 0x20, 0x40  # e4m3 bytes of exponent 4..7: 0.125 .. 1.875, finite
INDEX_SCALE = 2.0**-6  # a power of two, as the indexer's ue8m0 scales are (dsa_indexer.py Indexer scale_fmt)
DENSE_KV_LEN = 2048  # SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD, which serving sets to index_topk
MAX_KV_CHUNK = 128 * 1024  # SGLANG_MAX_KV_CHUNK_CAPACITY (environ.py:566)
SPLIT_LOGITS = 8_000_000  # Indexer._MQA_LOGITS_STATIC_SKIP_ELEMS: larger logits are split within a budget

V32 = checkpoint_keys("DeepseekV32ForCausalLM")
GLM5 = {**checkpoint_keys("GlmMoeDsaForCausalLM"), "rope_interleave": True}
GLM52 = {
    **GLM5,
    "max_position_embeddings": 1048576,
    "rope_parameters": {"rope_theta": 8000000, "rope_type": "default"},
    "index_topk_freq": 4,
    "index_skip_topk_offset": 3,
}
ARCHITECTURES = {"DeepseekV32ForCausalLM": V32, "GlmMoeDsaForCausalLM": GLM5}
MODELS = {
    "deepseek-ai/DeepSeek-V3.2": V32,
    "zai-org/GLM-5": GLM5,
    "zai-org/GLM-5-FP8": GLM5,
    "zai-org/GLM-5.2": GLM52,
    "zai-org/GLM-5.2-FP8": GLM52,
    "nvidia/GLM-5.2-NVFP4": GLM52,
}


def model_keys(case, seq_len: int) -> dict:
    """A fresh copy of the model's config keys with the rank's heads (the module rewrites rope_parameters' rope_type
    in place, models/deepseek_v2.py:1539-1540)."""
    found = MODELS.get(case.model) or ARCHITECTURES.get(case.architecture)
    if found is None or found["architectures"][0] != case.architecture:
        raise KernelLimit(f"the SGLang DSA runner knows no config of {case.model} ({case.architecture})")
    keys = {k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v) for k, v in found.items()}
    keys["max_position_embeddings"] = max(keys["max_position_embeddings"], seq_len)
    keys["num_attention_heads"] = keys["num_key_value_heads"] = case.num_heads
    return keys


def lengths(case, context: bool) -> tuple[int, int]:
    """(new tokens, tokens) per request: isl after `step` cached ones; a decode step's new token after `step` cached
    ones, at position `step` (the reference collector, collect_mla_module.py:2063-2110)."""
    return (case.isl, case.step + case.isl) if context else (1, case.step + 1)


class Layout(NamedTuple):
    """Every request alike, each on its own pages after the pool's padded first page."""

    batch_size: int
    query_len: int
    seq_len: int
    pages_per_seq: int

    @property
    def num_tokens(self) -> int:
        return self.batch_size * self.query_len

    @property
    def pool_size(self) -> int:
        """Tokens in real pages: the pool's size (its buffers hold one padded page more)."""
        return self.batch_size * self.pages_per_seq * PAGE_SIZE


def layout(case, context: bool) -> Layout:
    query_len, seq_len = lengths(case, context)
    if case.batch_size < 1 or query_len < 1 or case.step < 0:
        raise KernelLimit(f"a DSA {'prefill' if context else 'decode'} needs requests with new tokens: {case}")
    return Layout(case.batch_size, query_len, seq_len, ceil_div(seq_len, PAGE_SIZE))


class BatchTensors(NamedTuple):
    req_to_token: object  # int32 [b, seq_len]: each token's slot, rows 1..b of ReqToTokenPool
    out_cache_loc: object  # int64 [b x query_len]: the new tokens' slots
    positions: object  # int64 [b x query_len]
    seq_lens: object  # int32 [b]


def batch_tensors(lay: Layout, device: str) -> BatchTensors:
    import torch

    first = PAGE_SIZE * (1 + torch.arange(lay.batch_size, dtype=torch.int64) * lay.pages_per_seq)
    slots = first[:, None] + torch.arange(lay.seq_len, dtype=torch.int64)
    new = torch.arange(lay.seq_len - lay.query_len, lay.seq_len, dtype=torch.int64)
    return BatchTensors(
        req_to_token=slots.to(device=device, dtype=torch.int32),
        out_cache_loc=slots[:, new].reshape(-1).to(device),
        positions=new.repeat(lay.batch_size).to(device),
        seq_lens=torch.full((lay.batch_size,), lay.seq_len, dtype=torch.int32, device=device),
    )


def fill_latent(buffer, fp8_layout: bool, generator) -> None:
    """Finite values in the latent cache [rows, 1, dim]: FlashMLA's fp8 layout, plain fp8 bytes, or bf16 values."""
    import torch

    if fp8_layout:
        buffer[..., :KV_LORA].random_(FP8_LOW, FP8_HIGH, generator=generator)
        scales = KV_LORA + KV_LORA // INDEX_QUANT * 4
        buffer[..., KV_LORA:scales].view(torch.float32).fill_(1.0)
        buffer[..., scales:].view(torch.bfloat16).uniform_(-1, 1, generator=generator)
    elif buffer.dtype == torch.uint8:
        buffer.random_(FP8_LOW, FP8_HIGH, generator=generator)
    else:
        buffer.uniform_(-1, 1, generator=generator)


def fill_index(buffer, generator) -> None:
    """The indexer's pages [pages, 64 x 132]: 64 x 128 fp8 key values, then 64 fp32 scales."""
    import torch

    values = PAGE_SIZE * INDEX_DIM
    buffer[:, :values].random_(FP8_LOW, FP8_HIGH, generator=generator)
    buffer[:, values:].view(torch.float32).fill_(INDEX_SCALE)


def label(context: bool, use_mha: bool, sm_major: int, skip: bool, impl: str) -> str:
    """The reference's kernel_source (collect_mla_module.py:1786-1792, :2138-2140): the dense MHA SGLang chose for a
    short prefill, else the DSA implementation of the phase, named for the indexer or the layers that skip it."""
    if context and use_mha:
        return "sglang_dsa_dense_mha_" + ("trtllm_ragged" if sm_major >= 10 else "fa3")
    return f"sglang_dsa_{'skip_indexer' if skip else 'indexer'}_{impl}"


def decode_graph_max_bs(total_mib: float) -> int:
    """The largest decode batch SGLang captures in a CUDA graph at TP 1 (server_args.py:3149-3203)."""
    for below, max_bs in ((20 * 1024, 8), (35 * 1024, 24), (60 * 1024, 32), (160 * 1024, 256)):
        if total_mib < below:
            return max_bs
    return 512


def may_run_dense(case, context: bool) -> bool:
    """Whether SGLang may run the prefill as dense MHA (dsa_backend.py:2431-2467), for the footprint."""
    _, seq_len = lengths(case, context)
    return context and seq_len <= DENSE_KV_LEN and case.batch_size * seq_len <= MAX_KV_CHUNK


def weight_bytes(keys: dict, heads: int, gemm_type: str) -> int:
    """The projections (deepseek_v2.py:1543-1631; the indexer's wq_b and wk in gemm_type, its weights_proj in bf16,
    dsa_indexer.py:377-398) and the bf16 absorb weights w_kc and w_vc the loader splits off kv_b_proj."""
    k = keys
    nope, rope, v, hidden = k["qk_nope_head_dim"], k["qk_rope_head_dim"], k["v_head_dim"], k["hidden_size"]
    quantized = (
        hidden * (k["q_lora_rank"] + LATENT)
        + k["q_lora_rank"] * heads * (nope + rope)
        + KV_LORA * heads * (nope + v)
        + heads * v * hidden
        + k["q_lora_rank"] * k["index_n_heads"] * k["index_head_dim"]
        + hidden * k["index_head_dim"]
    )
    stored = quantized + quantized // (128 * 128) * 4 if gemm_type == "fp8_block" else quantized * 2
    return stored + 2 * (hidden * k["index_n_heads"] + heads * KV_LORA * (nope + v))


def footprint(case, context: bool) -> int:
    """Weights, both caches, the token tables, the per-token activations, the indexer's logits (a split bounded by
    its free-memory budget when prepared) and top-k, and the dense prefill's expanded keys and values."""
    from opcollect.backends.sglang.dsa_kernels import score_bytes

    found = MODELS.get(case.model) or ARCHITECTURES.get(case.architecture)
    if found is None:
        return 0  # prepare refuses the model before any allocation
    lay = layout(case, context)
    k, heads, tokens = found, case.num_heads, lay.num_tokens
    latent = FP8_LATENT_BYTES if case.kv_cache_dtype == "fp8" else 2 * LATENT
    rows = lay.pool_size + PAGE_SIZE
    pages = rows * latent + (rows // PAGE_SIZE + 1) * PAGE_SIZE * (INDEX_DIM + INDEX_DIM // INDEX_QUANT * 4)
    tables = (lay.batch_size + 1) * lay.seq_len * 4 * 3
    nope, rope, v = k["qk_nope_head_dim"], k["qk_rope_head_dim"], k["v_head_dim"]
    per_head = nope + rope + LATENT + KV_LORA + v
    per_token = 2 * (3 * k["hidden_size"] + k["q_lora_rank"] + LATENT + heads * per_head)
    per_token += k["index_n_heads"] * (2 * k["index_head_dim"] + 8) + k["index_topk"] * 8
    keys = lay.batch_size * lay.seq_len
    logits = score_bytes(tokens, keys if context else ceil_div(lay.seq_len, PAGE_SIZE) * PAGE_SIZE)
    dense = keys * heads * (2 * nope + rope + v) * 2 if may_run_dense(case, context) else 0
    return weight_bytes(k, heads, case.gemm_type) + pages + tables + tokens * per_token + logits + dense
