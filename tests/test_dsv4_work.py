"""The speed-of-light work of DeepSeek-V4's attention kernels, counted the slow way: every (query, key) pair
enumerated, every byte of the docstrings' inventories added up with the layouts' literal sizes (a cached token is
584 bytes in FlashMLA's fp8_ds_mla layout, an indexer token 128 fp8 values and an fp32 scale). The closed forms in
plans/dsv4_kernels.py must agree for every case."""

from __future__ import annotations

import pytest

from opcollect.plans import dsv4_kernels as k

FLASH = "sgl-project/DeepSeek-V4-Flash-FP8"  # head_dim 512, sliding window 128, 64 index heads of 128


def _case(batch, isl, step, ratio=128, heads=8):
    return k.Dsv4KernelCase(FLASH, "DeepseekV4ForCausalLM", "bfloat16", "fp8", "fp8_block", 64, heads, batch, isl, 1,
                            step, ratio)  # fmt: skip


@pytest.mark.parametrize("ratio", [4, 128])
def test_the_floor_sum_is_the_sum_of_floors(ratio):
    for n in range(0, 600):
        assert k._sum_floor(n, ratio) == sum(j // ratio for j in range(1, n + 1))


@pytest.mark.parametrize(("batch", "isl", "step"), [(1, 1, 0), (2, 4, 0), (3, 7, 2), (2, 1, 1000), (1, 300, 45)])
def test_paged_indexer_work_counts_each_pair_and_byte(batch, isl, step):
    pairs = batch * sum(max(1, (step + j) // 4) for j in range(1, isl + 1))
    assert k.c4_pairs(batch, isl, step) == pairs
    rows = batch * isl
    moved = rows * 64 * (128 + 4) + max(1, (step + isl) // 4) * 132 + pairs * 4
    work = k.paged_work(_case(batch, isl, step, ratio=4))
    assert work.bytes == moved
    assert work.flops == {"fp8": 2.0 * 64 * 128 * pairs}


@pytest.mark.parametrize(("batch", "isl", "step"), [(1, 1, 0), (2, 4, 0), (1, 200, 0), (3, 1, 1000), (2, 130, 300)])
def test_hca_work_counts_each_pair_and_byte(batch, isl, step):
    window, hca, heads = 128, 128, 8
    pairs = 0
    for j in range(1, isl + 1):
        seen = step + j
        pairs += min(seen, window) + seen // hca  # the window's raw tokens and every compressed one
    pairs *= batch
    total = step + isl
    cached = batch * (min(total, window) + total // hca) * 584
    activations = 2 * batch * isl * heads * 512 * 2
    work = k.hca_work(_case(batch, isl, step, heads=heads))
    assert work.bytes == cached + activations
    assert work.flops == {"bfloat16": 2.0 * heads * 2 * 512 * pairs}


def test_a_model_without_dimensions_has_no_work():
    other = _case(1, 1, 0)._replace(model="some/other-model")
    assert k.paged_work(other) is None and k.hca_work(other) is None
