"""The SGLang attention and MLA runners' input builders, checked against values computed by hand. No sglang import."""

from __future__ import annotations

import sys

import pytest

from opcollect.backends.sglang import attention as attn
from opcollect.backends.sglang import mla
from opcollect.plans.attention import AttentionCase
from opcollect.plans.mla import MlaCase
from opcollect.runtime.contract import KernelLimit


def acase(batch=2, isl=20, heads=4, kv=4, head_dim=64, attn_dtype="bfloat16", kv_dtype="bfloat16", step=0, window=0):
    return AttentionCase(batch, isl, heads, kv, head_dim, 1, attn_dtype, kv_dtype, step, window)


def mcase(batch=2, isl=100, heads=16, mla_dtype="bfloat16", kv_dtype="bfloat16", step=0):
    return MlaCase(mla_dtype, kv_dtype, heads, batch, isl, 1, step)


def test_page_sizes_follow_the_backend():
    assert [attn.page_size_for(b) for b in ("fa3", "flashinfer", "triton")] == [1, 1, 1]
    assert attn.page_size_for("trtllm_mha") == 64 and attn.page_size_for("trtllm_mla") == 64


def test_context_layout_page_size_one():
    lay = attn.attention_layout(acase(), context=True, page_size=1)
    assert (lay.query_len, lay.seq_len, lay.pages_per_seq, lay.pool_size, lay.buffer_rows) == (20, 20, 20, 40, 41)
    assert lay.req_pool_indices == (1, 2)  # row 0 of ReqToTokenPool is its padding row
    assert lay.req_to_token == (tuple(range(1, 21)), tuple(range(21, 41)))  # slot 0 is the padded first page
    assert lay.out_cache_loc == tuple(range(1, 41))
    assert lay.positions == tuple(range(20)) * 2
    assert lay.seq_lens == (20, 20) and lay.prefix_lens == (0, 0) and lay.num_tokens == 40


def test_context_layout_page_size_64_starts_each_sequence_on_a_page():
    lay = attn.attention_layout(acase(isl=100), True, 64)
    assert (lay.pages_per_seq, lay.pool_size, lay.buffer_rows) == (2, 256, 320)
    assert lay.req_to_token[0][0] == 64 and lay.req_to_token[0][99] == 163
    assert lay.req_to_token[1][0] == 192 and lay.req_to_token[1][99] == 291
    assert lay.out_cache_loc[100] == 192


def test_generation_layout():
    lay = attn.attention_layout(acase(batch=3, isl=1, step=31), False, 1)
    assert (lay.query_len, lay.seq_len, lay.pool_size, lay.buffer_rows) == (1, 32, 96, 97)
    assert lay.out_cache_loc == (32, 64, 96) and lay.positions == (31, 31, 31)
    assert lay.prefix_lens == (31, 31, 31) and lay.req_pool_indices == (1, 2, 3)
    paged = attn.attention_layout(acase(batch=3, isl=1, step=64), False, 64)
    assert (paged.seq_len, paged.pages_per_seq, paged.pool_size) == (65, 2, 384)
    assert paged.out_cache_loc == (128, 256, 384)  # position 64 opens each sequence's second page


def test_attention_footprint():
    base = attn.footprint(acase(), True)
    assert attn.footprint(acase(isl=40), True) > base
    assert attn.footprint(acase(kv=1), True) < base
    assert attn.footprint(acase(kv_dtype="fp8"), True) < base
    # qkvo 40 x 16 x 64 x 2; K and V of 128 + 64 rows (page 64) x 4 x 64 x 2; tables 3 x 20 x 4; 40 x 16
    assert base == 40 * 16 * 64 * 2 + 192 * 2 * 4 * 64 * 2 + 3 * 20 * 4 + 40 * 16


def test_mla_layouts_and_latent_cache():
    assert mla.LATENT == 576
    ctx = mla.mla_layout(mcase(), True, 1)
    assert (ctx.num_tokens, ctx.pool_size) == (200, 200) and mla.latent_cache_shape(ctx) == (201, 1, 576)
    assert ctx.positions == tuple(range(100)) * 2
    gen = mla.mla_layout(mcase(isl=1, step=127), False, 64)
    assert (gen.seq_len, gen.pages_per_seq, gen.pool_size) == (128, 2, 256)
    assert mla.latent_cache_shape(gen) == (320, 1, 576)
    assert gen.out_cache_loc == (64 + 127, 192 + 127) and gen.positions == (127, 127)


def test_mla_dims_and_fp8_switch():
    assert mla.dims("fa3", True) == (576, 512) and mla.dims("triton", False) == (576, 512)
    assert mla.dims("trtllm_mla", False) == (576, 512) and mla.dims("trtllm_mla", True) == (192, 128)
    assert mla.fp8_cache(mcase(mla_dtype="fp8")) and mla.fp8_cache(mcase(kv_dtype="fp8"))
    assert not mla.fp8_cache(mcase())
    assert mla.MLA_SOURCE["FlashAttentionBackend"] == "flash_attention"


def test_mla_footprint():
    base = mla.footprint(mcase(), True)
    assert mla.footprint(mcase(heads=32), True) > base
    assert mla.footprint(mcase(mla_dtype="fp8"), True) < base
    assert mla.footprint(mcase(isl=1, step=8000), False) > mla.footprint(mcase(isl=1, step=8), False)


def test_kernel_limits_before_any_framework_import():
    with pytest.raises(KernelLimit):
        attn.prepare(acase(attn_dtype="float32"), "fa3", "cpu", 1, True)
    with pytest.raises(KernelLimit):
        attn.prepare(acase(kv_dtype="int8"), "fa3", "cpu", 1, True)
    with pytest.raises(KernelLimit):
        attn.prepare(acase(attn_dtype="fp8"), "fa3", "cpu", 1, True)  # fp8 compute needs an fp8 cache
    with pytest.raises(KernelLimit):
        attn.prepare(acase(isl=1, step=5, attn_dtype="fp8", kv_dtype="fp8"), "fa3", "cpu", 1, False)
    with pytest.raises(KernelLimit):
        attn.prepare(acase()._replace(beam_width=2), "fa3", "cpu", 1, True)
    with pytest.raises(KernelLimit):
        mla.prepare(mcase(mla_dtype="float32"), "flash_attention", "cpu", 1, True)
    assert "sglang" not in sys.modules and "sgl_kernel" not in sys.modules


def test_absorb_weights_layout():
    torch = pytest.importorskip("torch")
    w_kc, w_vc, scale = mla.absorb_weights(4, False, "cpu")
    assert tuple(w_kc.shape) == (4, 128, 512) and w_kc.stride() == (128 * 512, 1, 128)  # column-major
    assert tuple(w_vc.shape) == (4, 512, 128) and w_vc.stride() == (128 * 512, 1, 512)
    assert scale is None
    x = torch.rand(3, 4, 128, dtype=torch.bfloat16)
    assert tuple(mla.absorb_bmm(x, w_kc, None).shape) == (3, 4, 512)
    _, _, fp8_scale = mla.absorb_weights(4, True, "cpu")
    assert fp8_scale.dtype == torch.float32


def test_mla_call_times_the_attention_alone(monkeypatch):
    """The absorb BMMs run once per copy when the inputs are built; the timed call is the attention alone (the
    reference times them as their own op, mla_bmm_perf)."""
    torch = pytest.importorskip("torch")
    w_kc, _, scale = mla.absorb_weights(4, False, "cpu")
    raw = [tuple(torch.rand(3, *shape, dtype=torch.bfloat16) for shape in ((4, 128), (4, 64), (1, 512), (1, 64)))
           for _ in range(2)]  # fmt: skip
    inputs = mla.attention_inputs(raw, w_kc, scale)
    for (q, *rest), (q_nope, *raw_rest) in zip(inputs, raw):
        assert torch.equal(q, mla.absorb_bmm(q_nope, w_kc, None)) and tuple(q.shape) == (3, 4, 512)
        assert all(a is b for a, b in zip(rest, raw_rest))
    assert mla.attention_inputs(raw, None, None)[0][0] is raw[0][0]  # trtllm_mla prefill: q_nope as it is

    def no_bmm(*args):
        raise AssertionError("a BMM ran inside the timed call")

    monkeypatch.setattr(mla, "absorb_bmm", no_bmm)
    seen = []
    call = mla.rotating_call(lambda *args: seen.append(args), inputs)
    call(), call(), call()
    assert [args[0] is inputs[i][0] for args, i in zip(seen, (1, 0, 1))] == [True] * 3  # copies in turn
