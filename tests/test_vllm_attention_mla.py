"""The vLLM attention and MLA runners' input builders, checked against values computed by hand. No vllm import."""

from __future__ import annotations

import sys

import pytest

from opcollect.backends.vllm import attention as attn
from opcollect.backends.vllm import mla
from opcollect.plans.attention import AttentionCase
from opcollect.plans.mla_module import MlaModuleCase
from opcollect.runtime.contract import KernelLimit


def acase(batch=2, isl=20, heads=4, kv=4, head_dim=64, kv_dtype="bfloat16", step=0, window=0):
    return AttentionCase(batch, isl, heads, kv, head_dim, 1, "bfloat16", kv_dtype, step, window)


def mcase(batch=2, isl=100, heads=128, kv_dtype="bfloat16", gemm="bfloat16", step=0, mla_dtype="bfloat16"):
    return MlaModuleCase(
        "deepseek-ai/DeepSeek-V3", "DeepseekV3ForCausalLM", mla_dtype, kv_dtype, gemm, heads, batch, isl, 1, step
    )


def test_context_mha_layout():
    lay = attn.attention_layout(acase(), context=True, block_size=16)
    assert (lay.query_len, lay.seq_len, lay.blocks_per_seq, lay.num_blocks) == (20, 20, 2, 5)
    assert lay.page_table == ((1, 2), (3, 4))  # block 0 is the null block
    assert lay.slot_mapping == tuple(range(16, 36)) + tuple(range(48, 68))
    assert lay.query_start_loc == (0, 20, 40) and lay.seq_lens == (20, 20)
    assert lay.kv_cache_shape == (5, 2, 16, 4, 64)
    assert lay.num_tokens == 40


def test_generation_gqa_layout_full_and_past_a_block_boundary():
    lay = attn.attention_layout(acase(batch=3, isl=1, heads=8, kv=2, head_dim=128, step=31), False, 16)
    assert (lay.query_len, lay.seq_len, lay.blocks_per_seq, lay.num_blocks) == (1, 32, 2, 7)
    assert lay.slot_mapping == (47, 79, 111)  # position 31: last slot of each sequence's second page
    assert lay.kv_cache_shape == (7, 2, 16, 2, 128)
    assert lay.query_start_loc == (0, 1, 2, 3)
    nxt = attn.attention_layout(acase(batch=3, isl=1, heads=8, kv=2, head_dim=128, step=32), False, 16)
    assert (nxt.seq_len, nxt.blocks_per_seq, nxt.num_blocks) == (33, 3, 10)
    assert nxt.slot_mapping == (48, 96, 144)  # position 32 opens a third page


def test_generation_window_frees_pages_before_the_window():
    lay = attn.attention_layout(acase(batch=2, isl=1, step=99, window=32), False, 16)
    # keys 68..99 in the window: pages 4..6 kept, pages 0..3 point at the null block
    assert (lay.seq_len, lay.first_block, lay.blocks_per_seq, lay.num_blocks) == (100, 4, 7, 7)
    assert lay.page_table == ((0, 0, 0, 0, 1, 2, 3), (0, 0, 0, 0, 4, 5, 6))
    assert lay.slot_mapping == (51, 99)
    ctx = attn.attention_layout(acase(isl=100, window=32), True, 16)
    assert ctx.first_block == 0 and ctx.num_blocks == 1 + 2 * 7  # a prompt's queries see every page


def test_attention_footprint_grows_with_the_case():
    base = attn.footprint(acase(), True)
    assert attn.footprint(acase(isl=40), True) > base
    assert attn.footprint(acase(batch=4), True) > base
    assert attn.footprint(acase(kv=1), True) < base  # GQA keeps fewer KV heads
    assert attn.footprint(acase(kv_dtype="fp8"), True) < base
    assert attn.footprint(acase(isl=1, step=1000), False) > attn.footprint(acase(isl=1, step=10), False)
    # q, k, v, out of 40 tokens x 4 heads x 64 in bf16, 5 pages of K and V, page table and slots
    assert base == 40 * 16 * 64 * 2 + 5 * 2 * 16 * 4 * 64 * 2 + 2 * 2 * 4 + 40 * 8


def test_mla_context_layout():
    lay = mla.mla_layout(mcase(), True, 64)
    assert (lay.query_len, lay.seq_len, lay.blocks_per_seq, lay.num_blocks) == (100, 100, 2, 5)
    assert lay.kv_cache_shape == (5, 64, 576)
    assert lay.hidden_shape == (200, 7168)
    assert lay.positions == tuple(range(100)) * 2
    assert lay.slot_mapping[:64] == tuple(range(64, 128)) and lay.slot_mapping[99] == 163
    assert lay.slot_mapping[100] == 3 * 64
    assert lay.query_start_loc == (0, 100, 200)


def test_mla_generation_layout():
    lay = mla.mla_layout(mcase(isl=1, step=127), False, 64)
    assert (lay.seq_len, lay.blocks_per_seq, lay.num_blocks) == (128, 2, 5)
    assert lay.positions == (127, 127) and lay.slot_mapping == (191, 319)
    small = mla.mla_layout(mcase(batch=1, isl=1, step=16), False, 16)
    assert (small.seq_len, small.blocks_per_seq, small.slot_mapping) == (17, 2, (32,))
    assert small.seq_lens == (17,) and small.hidden_shape == (1, 7168)


def test_mla_dims_and_weights():
    assert mla.LATENT == 576
    assert mla.DEEPSEEK_V3["q_lora_rank"] == 1536 and mla.DEEPSEEK_V3["hidden_size"] == 7168
    # 7168 x 2112 + 1536 x 128*192 + 512 x 128*256 + 128*128 x 7168: DeepSeek-V3's ~187M attention weights
    assert mla.weight_elements(128) == 187_105_280
    assert mla.MLA_BLOCK_SIZE["FLASHMLA"] == 64 and mla.MLA_BLOCK_SIZE["FLASH_ATTN_MLA"] == 16


def test_mla_footprint_grows_with_the_case():
    base = mla.footprint(mcase(heads=16), True)
    assert mla.footprint(mcase(heads=32), True) > base
    assert mla.footprint(mcase(heads=16, isl=400), True) > base
    assert mla.footprint(mcase(heads=16, gemm="nvfp4"), True) < mla.footprint(mcase(heads=16, gemm="fp8_block"), True)
    assert mla.footprint(mcase(heads=16, gemm="fp8_block"), True) < base
    assert mla.footprint(mcase(heads=16, isl=1, step=8000), False) > mla.footprint(
        mcase(heads=16, isl=1, step=8), False
    )
    assert base > mla.weight_elements(16) * 2


def test_kernel_limits_before_any_framework_import():
    with pytest.raises(KernelLimit):
        attn.prepare(acase()._replace(attn_dtype="float32"), "FLASH_ATTN", "cpu", 1, True)
    with pytest.raises(KernelLimit):
        attn.prepare(acase(kv_dtype="float32"), "FLASH_ATTN", "cpu", 1, True)
    # vLLM's fp8 query is a prefill setting over an fp8 cache (mla_attention.py:1462-1466)
    with pytest.raises(KernelLimit):
        mla.prepare(mcase(mla_dtype="fp8"), "FLASH_ATTN_MLA", "cpu", 1, True)
    with pytest.raises(KernelLimit):
        mla.prepare(mcase(mla_dtype="fp8", kv_dtype="fp8", isl=1, step=100), "FLASHINFER_MLA", "cpu", 1, False)
    with pytest.raises(KernelLimit):
        mla.prepare(mcase(gemm="int4_wo"), "FLASH_ATTN_MLA", "cpu", 1, True)
    assert "vllm" not in sys.modules


class _Backend:
    def __init__(self, order):
        self.order = order

    def get_kv_cache_shape(self, num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        return (num_blocks, 2, block_size, num_kv_heads, head_size)

    def get_kv_cache_stride_order(self):
        if self.order is None:
            raise NotImplementedError
        return self.order


def test_cache_allocation_follows_the_stride_order():
    torch = pytest.importorskip("torch")
    lay = attn.attention_layout(acase(), True, 16)
    nhd = attn.allocate_cache(_Backend(None), lay, 4, 64, "auto", torch.bfloat16, "cpu")
    assert tuple(nhd.shape) == lay.kv_cache_shape and nhd.is_contiguous()
    hnd = attn.allocate_cache(_Backend((0, 1, 3, 2, 4)), lay, 4, 64, "fp8", torch.uint8, "cpu")
    assert tuple(hnd.shape) == lay.kv_cache_shape and hnd.dtype == torch.uint8
    assert hnd.stride(3) == 16 * 64 and hnd.stride(2) == 64  # heads outside tokens: HND in memory
    assert hnd.view(torch.float8_e4m3fn).float().abs().max() > 0  # fp8 values, not a cast to integers
