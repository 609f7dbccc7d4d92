"""What vLLM 0.24.0's DSA attention module (backends/vllm/dsa.py) is built and fed with: each architecture's config
keys, the batch both of its caches share, the caches in vLLM's own byte layouts, and the bytes a case needs. No vllm
import; torch only inside the functions that build tensors.

- Config: the keys DeepseekV2MLAAttention, its Indexer and the sparse metadata builders read (models/deepseek_v2.py:
  603-676, 887-1085; v1/attention/backends/mla/flashmla_sparse.py:253-263; get_mla_dims, model_executor/layers/
  attention/mla_attention.py:1345-1368), as the config.json files aiconfigurator-core 0.12.0 ships hold them
  (aiconfigurator_core/model_configs/deepseek-ai--DeepSeek-V3.2_config.json, zai-org--GLM-5_config.json), with
  DeepSeek-V3.2's rope_scaling as vLLM reads it (rope_parameters, rope_type yarn, rope_theta inside).
- Pages: 64 tokens, the only kernel page size of the indexer's backend (v1/attention/backends/mla/indexer.py:123-125)
  and of FLASHMLA_SPARSE (flashmla_sparse.py:99-101). Both caches share one page table: their specs are both
  MLAAttentionSpec of one page size, one KV cache group (v1/kv_cache_interface.py:744-778). The table is as wide as
  serving's, cdiv(max_model_len, 64) rounded up to a multiple of 2 (v1/worker/block_table.py:248-264), its unused
  entries on the null block 0; each sequence's pages follow the null block in turn.
- The latent cache: 576 bf16 values a token, or FlashMLA's fp8_ds_mla, 656 bytes a token (512 fp8 values, 4 fp32
  scales, 64 bf16 rope values; flashmla_sparse.py:65-73). The indexer's key cache: per page, 64 x index_head_dim fp8
  values, then 64 fp32 scales, one per 128 values (the layout the indexer's quant-and-cache writes,
  v1/attention/ops/rocm_aiter_mla_sparse.py:94-118, the Triton twin of the CUDA op). Every byte is a finite value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from opcollect.backends.mla_configs import DSA, checkpoint_keys
from opcollect.backends.vllm.gemm import NVFP4_GROUP
from opcollect.runtime.contract import KernelLimit
from opcollect.runtime.dtypes import ceil_div

# DeepSeek-V3.2 and GLM-5 (config.json, see the module docstring; mla_configs): the indexer's rope is NeoX style
# without indexer_rope_interleave (deepseek_v2.py:1030-1035); num_hidden_layers only decides that layer 0 is no MTP
# layer (deepseek_v2.py:1019-1027)
MODELS: dict[str, dict] = {arch: checkpoint_keys(arch) for arch in DSA}
BLOCK_SIZE = 64
TABLE_ALIGN = 2  # 128 // BLOCK_SIZE: block_table.py:260-264
NULL_BLOCK = 0
INDEX_QUANT_BLOCK = 128  # Indexer.quant_block_size: one fp32 scale per 128 key values (deepseek_v2.py:647-658)
DS_MLA_BYTES = 656  # fp8_ds_mla: 512 fp8 + 16 scale + 128 rope bytes (flashmla_sparse.py:65-73, :139-141)
DS_MLA_NOPE, DS_MLA_SCALES = 512, 4
# e4m3 bytes 0x20..0x3f: exponent 4..7, the values 0.125 .. 1.875 (finite, none a NaN pattern)
FP8_LOW, FP8_HIGH = 0x20, 0x40
INDEX_SCALE = 2.0**-6  # a power of two, as the indexer's ue8m0 scales are (rocm_aiter_mla_sparse.py:72-73)
LATENT_SCALE = 1.0
# serving's prefill workspaces per max_model_len token: FlashMLA sparse's bf16 upconversion (flashmla_sparse.py:
# 221-228), the indexer's key gather (v1/attention/backends/mla/indexer.py:219-230)
FLASHMLA_PREFILL_TOKENS, INDEXER_PREFILL_TOKENS = 5, 40
MAX_LOGITS_BYTES = 512 * 2**20  # VLLM_SPARSE_INDEXER_MAX_LOGITS_MB's default (envs.py:995-997)


def model_keys(architecture: str) -> dict:
    """A fresh copy of the architecture's config keys (the module rewrites rope_parameters' rope_type in place)."""
    found = MODELS.get(architecture)
    if found is None:
        raise KernelLimit(f"the vLLM DSA runner knows no config of {architecture} (backends/vllm/dsa_inputs.py MODELS)")
    return {k: dict(v) if isinstance(v, dict) else v for k, v in found.items()}


def indexer_entry_bytes(head_dim: int) -> int:
    """Bytes a token takes in the indexer's key cache: fp8 values, an fp32 scale per 128 (deepseek_v2.py:654-658)."""
    return head_dim + head_dim // INDEX_QUANT_BLOCK * 4


@dataclass(frozen=True)
class DsaLayout:
    """The batch one call runs: every sequence alike, query_len new tokens ending a sequence of seq_len."""

    batch_size: int
    query_len: int
    seq_len: int
    blocks_per_seq: int
    table_width: int  # page-table columns: serving's width for max_model_len
    num_blocks: int  # the null block plus every sequence's pages
    block_size: int = BLOCK_SIZE

    @property
    def num_tokens(self) -> int:
        return self.batch_size * self.query_len


def lengths(case, context: bool) -> tuple[int, int]:
    """(new tokens, tokens) per sequence: a prompt of isl tokens after `step` cached ones; a decode step counts its
    own token in `step`, as the reference collector does (collector/vllm/collect_mla_module.py:644-647, 873-879)."""
    return (case.isl, case.step + case.isl) if context else (1, case.step)


def max_model_len(case, context: bool) -> int:
    """Serving's: the model's max_position_embeddings, or the case's sequence if it is longer."""
    return max(MODELS[case.architecture]["max_position_embeddings"], lengths(case, context)[1])


def dsa_layout(case, context: bool) -> DsaLayout:
    query_len, seq_len = lengths(case, context)
    if query_len < 1 or seq_len < query_len:
        raise KernelLimit(f"a DSA {'prefill' if context else 'decode'} needs its new tokens in the sequence: {case}")
    per_seq = ceil_div(seq_len, BLOCK_SIZE)
    width = ceil_div(ceil_div(max_model_len(case, context), BLOCK_SIZE), TABLE_ALIGN) * TABLE_ALIGN
    b = case.batch_size
    return DsaLayout(b, query_len, seq_len, per_seq, width, 1 + b * per_seq)


class BatchTensors(NamedTuple):
    """The batch as vLLM's CommonAttentionMetadata holds it, on the CPU."""

    query_start_loc: object  # int32 [b + 1]
    seq_lens: object  # int32 [b]
    page_table: object  # int32 [b, table_width]
    slot_mapping: object  # int64 [b * query_len]: each new token's cache slot
    positions: object  # int64 [b * query_len]: each new token's rope position


def batch_tensors(layout: DsaLayout) -> BatchTensors:
    import torch

    b, per_seq = layout.batch_size, layout.blocks_per_seq
    first = 1 + torch.arange(b, dtype=torch.int64) * per_seq  # each sequence's first page, after the null block
    table = torch.full((b, layout.table_width), NULL_BLOCK, dtype=torch.int32)
    table[:, :per_seq] = (first[:, None] + torch.arange(per_seq)).to(torch.int32)
    new = torch.arange(layout.seq_len - layout.query_len, layout.seq_len, dtype=torch.int64)
    return BatchTensors(
        query_start_loc=torch.arange(b + 1, dtype=torch.int32) * layout.query_len,
        seq_lens=torch.full((b,), layout.seq_len, dtype=torch.int32),
        page_table=table,
        slot_mapping=(first[:, None] * layout.block_size + new).reshape(-1),
        positions=new.repeat(b),
    )


def fill_latent_cache(cache, cache_dtype: str, generator) -> None:
    """Finite values in the latent cache's layout: fp8_ds_mla's fp8 values, fp32 scales and bf16 rope per token; an
    fp8 cache's bytes (FlashInfer's plain fp8 layout); or bf16 values."""
    import torch

    if cache_dtype == "fp8_ds_mla":
        cache[..., :DS_MLA_NOPE].random_(FP8_LOW, FP8_HIGH, generator=generator)
        scales = DS_MLA_NOPE + DS_MLA_SCALES * 4
        cache[..., DS_MLA_NOPE:scales].view(torch.float32).fill_(LATENT_SCALE)
        cache[..., scales:].view(torch.bfloat16).uniform_(-1, 1, generator=generator)
    elif cache.dtype == torch.uint8:
        cache.random_(FP8_LOW, FP8_HIGH, generator=generator)
    else:
        cache.uniform_(-1, 1, generator=generator)


def fill_indexer_cache(cache, head_dim: int, generator) -> None:
    """The indexer's pages: block_size x head_dim fp8 values, then one fp32 scale per token and 128 values."""
    import torch

    pages = cache.view(cache.shape[0], -1)
    values = cache.shape[1] * head_dim
    pages[:, :values].random_(FP8_LOW, FP8_HIGH, generator=generator)
    pages[:, values:].view(torch.float32).fill_(INDEX_SCALE)


def weight_bytes(keys: dict, heads: int, gemm_type: str) -> int:
    """The module's projections (deepseek_v2.py:924-971; the indexer's wq_b in gemm_type, :627-633, its fused wk and
    head-weight projection in bf16, :636-643) and MLAAttention's bf16 W_UK_T/W_UV."""
    k = keys
    nope, rope, v = k["qk_nope_head_dim"], k["qk_rope_head_dim"], k["v_head_dim"]
    latent = k["kv_lora_rank"] + rope
    quantized = (
        k["hidden_size"] * (k["q_lora_rank"] + latent)
        + k["q_lora_rank"] * heads * (nope + rope)
        + k["kv_lora_rank"] * heads * (nope + v)
        + heads * v * k["hidden_size"]
        + k["q_lora_rank"] * k["index_n_heads"] * k["index_head_dim"]
    )
    if gemm_type == "fp8_block":
        stored = quantized + quantized // (128 * 128) * 4
    elif gemm_type == "nvfp4":
        stored = quantized // 2 + quantized // NVFP4_GROUP
    else:
        stored = quantized * 2
    bf16 = k["hidden_size"] * (k["index_head_dim"] + k["index_n_heads"]) + heads * k["kv_lora_rank"] * (nope + v)
    return stored + 2 * bf16


def footprint_bytes(case, context: bool, max_batched_tokens: int) -> int:
    """Weights, both caches at serving's page size, the per-token activations, and the buffers serving sizes by its
    batch limits and max_model_len: the top-k indices (deepseek_v2.py:1244-1251), FlashMLA sparse's query workspace
    and fp8 prefill upconversion (flashmla_sparse.py:584-608), the indexer's key gather and its logits (its decode
    rows are max_model_len wide, sparse_attn_indexer.py:324-332), its builder's page tables (indexer.py:311-322)."""
    k = MODELS.get(case.architecture)
    if k is None:
        return 0  # prepare refuses the architecture before any allocation
    layout = dsa_layout(case, context)
    heads, tokens, length = case.num_heads, layout.num_tokens, max_model_len(case, context)
    latent = DS_MLA_BYTES if case.kv_cache_dtype == "fp8" else 2 * (k["kv_lora_rank"] + k["qk_rope_head_dim"])
    pages = layout.num_blocks * BLOCK_SIZE * (latent + indexer_entry_bytes(k["index_head_dim"]))
    query = heads * (k["qk_nope_head_dim"] + k["qk_rope_head_dim"] + 576 + k["kv_lora_rank"] + k["v_head_dim"])
    index = k["index_n_heads"] * (3 * k["index_head_dim"] + 8) + k["index_head_dim"] * 4
    per_token = 2 * (2 * k["hidden_size"] + k["q_lora_rank"] + 2 * 576 + query) + index + 4 * k["index_topk"] * 2
    logits = MAX_LOGITS_BYTES if layout.query_len > 1 else layout.batch_size * length * 4
    buffers = (
        max_batched_tokens * (k["index_topk"] * 4 + heads * 576 * 2 + layout.table_width * 4)
        + INDEXER_PREFILL_TOKENS * length * indexer_entry_bytes(k["index_head_dim"])
        + (FLASHMLA_PREFILL_TOKENS * length * 576 * 2 if case.kv_cache_dtype == "fp8" else 0)
    )
    return weight_bytes(k, heads, case.gemm_type) + pages + tokens * per_token + logits + buffers
