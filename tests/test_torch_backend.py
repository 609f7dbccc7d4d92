"""The torch backend's runners on the CPU: what they compute, route and report."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from opcollect.backends.torch import (  # noqa: E402
    attention,
    encoder_attention,
    footprint,
    free_memory,
    measure,
    mla,
    mla_bmm,
    moe,
    quantize,
)
from opcollect.plans.attention import AttentionCase  # noqa: E402
from opcollect.plans.encoder_attention import EncoderAttentionCase  # noqa: E402
from opcollect.plans.gemm import GemmCase  # noqa: E402
from opcollect.plans.mla import MlaCase  # noqa: E402
from opcollect.plans.mla_bmm import MlaBmmCase  # noqa: E402
from opcollect.plans.moe import MoeCase  # noqa: E402
from opcollect.plans.quantize import QuantizeCase  # noqa: E402
from opcollect.runtime.contract import KernelLimit  # noqa: E402
from opcollect.runtime.harness import TimingConfig  # noqa: E402
from opcollect.runtime.timing import rotation_copies  # noqa: E402

QUICK = TimingConfig(max_noise=0.2, min_samples=3, max_case_seconds=0.02, warmup_seconds=0.001)


def moe_case(distribution, ep=1, tp=1, tokens=64):
    return MoeCase("bfloat16", tokens, 256, 128, 4, 16, tp, ep, distribution)


def test_balanced_routing_spreads_evenly_and_power_law_skews():
    counts, tokens = moe.local_routes(moe_case("balanced"))
    assert counts == [16] * 16 and sorted(tokens.tolist()) == sorted(t for t in range(64) for _ in range(4))
    skewed, _ = moe.local_routes(moe_case("power_law_1.2"))
    assert sum(skewed) == 256 and max(skewed) > 2 * 16  # the hottest expert well above the balanced 16
    assert moe.local_routes(moe_case("power_law_1.2"))[0] == skewed  # deterministic


def test_expert_parallel_rank_keeps_its_share():
    counts, _ = moe.local_routes(moe_case("balanced", ep=4))
    assert len(counts) == 4 and sum(counts) == 64
    assert moe.local_shape(moe_case("balanced", ep=4, tp=2)) == (4, 64)


def test_each_op_measures_on_the_cpu():
    cases = {
        "gemm": GemmCase("bfloat16", 4, 64, 128),
        "attention_context": AttentionCase(2, 16, 4, 2, 64, 1, "float32", "float32", 0, 8),
        "attention_generation": AttentionCase(2, 1, 4, 1, 64, 1, "bfloat16", "bfloat16", 31, 0),
        "moe": moe_case("power_law_1.01"),
        "mla_context": MlaCase("float32", "float32", 4, 1, 16, 32, 0),
        "mla_generation": MlaCase("bfloat16", "bfloat16", 4, 2, 1, 32, 63),
        "compute_scale": QuantizeCase(16, 256, "fp8"),
        "scale_matrix": QuantizeCase(16, 256, "fp8"),
        "mla_bmm": MlaBmmCase("mla_gen_post", "bfloat16", 8, 4),
        "encoder_attention": EncoderAttentionCase(2, 32, 4, 64, "bfloat16"),
    }
    for op, case in cases.items():
        dispatch = "per_expert_loop" if op == "moe" else "torch.mla_absorbed" if op.startswith("mla") else "x"
        [result] = measure(op, dispatch, [case], "cpu", QUICK)
        assert result.stats.latency > 0 and result.stats.timing == "cpu", op
        assert footprint(op, case) > 0
    [sdpa] = measure("attention_context", "x", [cases["attention_context"]], "cpu", QUICK)
    assert sdpa.kernel_source.startswith("sdpa.")


def test_windowed_context_attention_matches_a_reference():
    """The band mask the runner builds gives what an explicit softmax over the window gives."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    pos = torch.arange(8)
    band = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - 3)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=band)
    scores = (q @ k.transpose(-1, -2)) / 4.0
    scores = scores.masked_fill(~band, float("-inf"))
    assert torch.allclose(out, scores.softmax(-1) @ v, atol=1e-5)
    assert attention.kv_length(AttentionCase(1, 1, 4, 1, 64, 1, "bfloat16", "bfloat16", 1000, 128), False) == 128


@pytest.mark.parametrize("queries, causal", [(1, False), (4, True)])
def test_absorbed_mla_attention_equals_per_head_attention(queries, causal):
    """The runner's folded heads over the shared latent cache give per-head attention on that cache."""
    torch.manual_seed(0)
    b, h, keys, d = 2, 3, 4 if causal else 5, mla.KV_LORA + mla.ROPE
    q = torch.randn(b, h, queries, d)
    cache = torch.randn(b, keys, d)
    hidden = torch.triu(torch.ones(queries, keys, dtype=torch.bool), diagonal=1) if causal else None
    folded = mla.attend(q.reshape(b, h * queries, d), cache, h, queries, hidden, 0.1).view(b, h, queries, -1)
    reference = torch.nn.functional.scaled_dot_product_attention(
        q,
        cache[:, None].expand(b, h, keys, d),
        cache[:, None, :, : mla.KV_LORA].expand(b, h, keys, mla.KV_LORA),
        is_causal=causal,
        scale=0.1,
    )
    assert torch.allclose(folded, reference, atol=1e-4)


def test_unsupported_dtypes_are_kernel_limits():
    with pytest.raises(KernelLimit):
        measure("gemm", "torch._scaled_mm", [GemmCase("fp8", 16, 64, 64)], "cpu", QUICK)
    with pytest.raises(KernelLimit):
        measure("attention_generation", "x", [AttentionCase(1, 1, 4, 4, 64, 1, "bfloat16", "fp8", 7, 0)], "cpu", QUICK)


def test_rotation_covers_three_l2_sizes_within_memory():
    assert rotation_copies(10 * 2**20, 50 * 2**20, 100 * 2**30) == 15
    assert rotation_copies(400 * 2**20, 50 * 2**20, 100 * 2**30) == 1
    assert rotation_copies(10 * 2**20, 50 * 2**20, 60 * 2**20) == 3  # only half the free memory
    assert rotation_copies(2**10, 50 * 2**20, 100 * 2**30) == 64  # a tiny footprint: at most 64 copies
    assert free_memory("cpu") > 0


def _sdpa_calls(monkeypatch, case, context: bool) -> list[dict]:
    """The (key shape, mask) of each scaled_dot_product_attention call the runner's prepare makes."""
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def recorder(q, k, v, attn_mask=None, is_causal=False, **kwargs):
        calls.append({"keys": k.shape[2], "mask": attn_mask, "causal": is_causal})
        return real(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recorder)
    attention.prepare(case, "x", "cpu", 1, context)
    assert calls
    return calls


@pytest.mark.parametrize("step, window, keys", [(0, 0, 1), (5, 0, 6), (5, 3, 3), (5, 6, 6), (5, 7, 6)])
def test_decode_attention_reads_step_plus_one_keys_within_the_window(monkeypatch, step, window, keys):
    case = AttentionCase(2, 1, 4, 2, 16, 1, "float32", "float32", step, window)
    assert {c["keys"] for c in _sdpa_calls(monkeypatch, case, context=False)} == {keys}
    assert attention.kv_length(case, False) == keys


def test_a_sliding_window_of_w_lets_each_query_see_w_keys(monkeypatch):
    case = AttentionCase(1, 8, 2, 2, 16, 1, "float32", "float32", 0, 3)
    call = _sdpa_calls(monkeypatch, case, context=True)[0]
    mask = call["mask"]
    assert not call["causal"] and mask.shape == (8, 8)
    assert mask.sum(-1).tolist() == [1, 2, 3, 3, 3, 3, 3, 3]  # query i sees keys i-2 .. i
    assert all(bool(mask[i, i]) and not bool(mask[i, i + 1 :].any()) for i in range(8))  # causal within the band


@pytest.mark.parametrize(
    ("context", "step", "window", "expected"),
    [
        # 2 sequences, 8 query heads over 2 KV heads of 16 in bf16: Q and the output by query heads, K and V by KV heads
        (True, 0, 0, (2 * 2 * 8 * 8 * 16 + 2 * 2 * 2 * 8 * 16) * 2),
        (True, 0, 3, (2 * 2 * 8 * 8 * 16 + 2 * 2 * 2 * 8 * 16) * 2 + 8 * 8),  # and the window's bool mask
        (False, 5, 0, (2 * 2 * 8 * 1 * 16 + 2 * 2 * 2 * 6 * 16) * 2),  # one query over step + 1 keys
    ],
)
def test_attention_footprint_is_the_bytes_of_the_tensors_its_call_holds(monkeypatch, context, step, window, expected):
    case = AttentionCase(2, 8 if context else 1, 8, 2, 16, 1, "bfloat16", "bfloat16", step, window)
    held = []
    real = torch.nn.functional.scaled_dot_product_attention

    def recorder(q, k, v, attn_mask=None, **kwargs):
        out = real(q, k, v, attn_mask=attn_mask, **kwargs)
        mask = attn_mask.nbytes if attn_mask is not None else 0
        held.append(q.nbytes + k.nbytes + v.nbytes + out.nbytes + mask)
        return out

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recorder)
    attention.prepare(case, "x", "cpu", 1, context)
    assert attention.footprint(case, context) == expected == held[0]


# ---- issue 22: quantize, MLA absorb BMM and encoder attention ----


def test_compute_scale_is_per_token_amax_over_the_fp8_max():
    x = torch.randn(6, 96, dtype=torch.bfloat16)
    x[2] = 0  # an all-zero row keeps a positive scale
    scale = quantize.per_token_scale(x)
    fp8_max = torch.finfo(torch.float8_e4m3fn).max
    expected = x.float().abs().max(dim=1, keepdim=True).values / fp8_max
    assert scale.shape == (6, 1) and scale.dtype == torch.float32
    assert torch.allclose(scale[[0, 1, 3, 4, 5]], expected[[0, 1, 3, 4, 5]], rtol=1e-6)
    assert float(scale[2]) > 0


def test_scale_matrix_quantizes_within_fp8_precision():
    x = torch.randn(8, 64, dtype=torch.bfloat16) * 3
    scale = (x.float().abs().max() / torch.finfo(torch.float8_e4m3fn).max).reshape(1)
    out = torch.empty(8, 64, dtype=torch.float8_e4m3fn)
    quantize.quantize_into(out, x, scale)
    back = out.float() * scale
    # e4m3 keeps 3 mantissa bits: a normal value is off by at most half an ulp (2**-4 relative); values below
    # the smallest normal (2**-6 in scaled units) by at most half the subnormal step (2**-10 scaled)
    bound = torch.maximum(x.float().abs() * 2**-4, scale * 2**-10)
    assert bool(((back - x.float()).abs() <= bound * 1.0001).all())
    assert float(out.float().abs().max()) == torch.finfo(torch.float8_e4m3fn).max  # the amax maps to 448
    clipped = torch.empty(1, 2, dtype=torch.float8_e4m3fn)
    quantize.quantize_into(clipped, torch.tensor([[1e4, -1e4]], dtype=torch.bfloat16), torch.ones(1))
    assert clipped.float().tolist() == [[448.0, -448.0]]  # saturates instead of overflowing to NaN


def _recorded(monkeypatch, module, name):
    """Replace module.name by a wrapper that records each call's arguments and result."""
    calls = []
    real = getattr(module, name)

    def recorder(*args, **kwargs):
        result = real(*args, **kwargs)
        calls.append((args, kwargs, result))
        return result

    monkeypatch.setattr(module, name, recorder)
    return calls


@pytest.mark.parametrize("op_name", ["mla_gen_pre", "mla_gen_post"])
def test_mla_bmm_runs_the_absorb_matmul_per_head(monkeypatch, op_name):
    case = MlaBmmCase(op_name, "float32", 5, 3)
    calls = _recorded(monkeypatch, torch, "bmm")
    prepared = mla_bmm.prepare(case, mla_bmm.KERNEL_SOURCE, "cpu", 1)
    prepared.call()
    [(args, kwargs, _)] = calls
    x, w, out = args[0], args[1], kwargs["out"]
    d_in, d_out = mla_bmm.dims(case)
    assert (d_in, d_out) == ((128, 512) if op_name == "mla_gen_pre" else (512, 128))
    assert x.shape == (3, 5, d_in) and w.shape == (3, d_in, d_out) and out.shape == (3, 5, d_out)
    assert torch.allclose(out, torch.einsum("hti,hio->hto", x, w), atol=1e-4)
    # post writes into a token-major [tokens, heads, 128] buffer, pre into a head-major one
    assert out.is_contiguous() == (op_name == "mla_gen_pre")
    touched = x.untyped_storage().nbytes() + w.nbytes + out.untyped_storage().nbytes()
    assert footprint("mla_bmm", case) == touched
    assert footprint("mla_bmm", case._replace(bmm_dtype="bfloat16")) == touched // 2
    assert prepared.kernel_source == "torch.bmm"


def test_mla_bmm_refuses_fp8_and_unknown_names():
    with pytest.raises(KernelLimit, match="fp8"):
        measure("mla_bmm", "torch.bmm", [MlaBmmCase("mla_gen_pre", "fp8", 4, 2)], "cpu", QUICK)
    with pytest.raises(KernelLimit, match="mla_gen_mid"):
        measure("mla_bmm", "torch.bmm", [MlaBmmCase("mla_gen_mid", "bfloat16", 4, 2)], "cpu", QUICK)


def test_encoder_attention_is_full_non_causal_attention(monkeypatch):
    case = EncoderAttentionCase(2, 7, 3, 16, "float32")
    calls = _recorded(monkeypatch, torch.nn.functional, "scaled_dot_product_attention")
    prepared = encoder_attention.prepare(case, "torch.nn.functional.scaled_dot_product_attention", "cpu", 1)
    prepared.call()
    (q, k, v), kwargs, out = calls[-1]
    assert not kwargs.get("is_causal") and kwargs.get("attn_mask") is None
    assert q.shape == k.shape == v.shape == (2, 3, 7, 16)
    weights = ((q @ k.transpose(-1, -2)) / 4.0).softmax(-1)  # every query sees every key of its sequence
    assert torch.allclose(out, weights @ v, atol=1e-5)
    assert footprint("encoder_attention", case) == 4 * q.untyped_storage().nbytes()  # q, k, v and the output
    assert prepared.kernel_source.startswith("sdpa.")


def test_quantize_footprints_count_input_temporaries_and_output():
    case = QuantizeCase(32, 256, "fp8")
    x_bytes = 32 * 256 * torch.bfloat16.itemsize
    assert footprint("compute_scale", case) >= 2 * x_bytes  # x and its |x|
    # x, the float32 quotient and the fp8 output
    assert footprint("scale_matrix", case) >= x_bytes + 32 * 256 * (4 + 1)
    with pytest.raises(KernelLimit, match="int8"):
        measure("scale_matrix", "torch_ops", [case._replace(quant_dtype="int8")], "cpu", QUICK)
