"""Behaviours of the plain-PyTorch references (backends/torch: the DSA, MSA, DeepSeek-V4 and mHC math, their
chunking) that no earlier test held: each test here fails with a small plausible bug planted in the function it
names. Values come from formulas written out here, on tiny CPU tensors."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from conftest import randn  # noqa: E402

from opcollect.backends.torch import dsa, dsv4, linear_runners, mhc, msa, reference  # noqa: E402
from opcollect.backends.torch import linear_attention as la  # noqa: E402
from opcollect.plans.linear_attention import GdnCase, Mamba2Case  # noqa: E402
from opcollect.runtime.contract import KernelLimit  # noqa: E402
from opcollect.runtime.timing import random_tensor  # noqa: E402

# ---- reference.py: the chunking every reference shares ---------------------------------------------------------


def test_chunk_is_the_rows_whose_intermediate_fits_in_chunk_elements():
    """reference.chunk: rows per chunk = CHUNK_ELEMENTS // per_row, at least 1, at most the total."""
    assert reference.chunk(10, 2**20) == 10 and reference.chunk(1000, 2**20) == 16
    assert reference.chunk(1000, 2**24) == 1 and reference.chunk(1000, 2**24 + 1) == 1
    assert reference.chunk(1000, 2**23) == 2 and reference.chunk(3, 0) == 3


def _chunked_vs_whole(monkeypatch, run):
    whole = run()
    monkeypatch.setattr(reference, "CHUNK_ELEMENTS", 1)  # one query row per chunk
    torch.testing.assert_close(run(), whole, rtol=1e-5, atol=1e-5)


def test_dsa_scores_and_sparse_mla_are_the_same_chunk_by_chunk(monkeypatch):
    """dsa.index_scores, dsa.sparse_mla: query rows chunk by chunk give what one chunk gives."""
    q, weights, keys = randn(2, 5, 3, 8, seed=1), randn(2, 5, 3, seed=2), randn(2, 9, 8, seed=3)
    qm, cache = randn(2, 5, 2, 576, seed=4), randn(2, 9, 576, seed=5)
    indices = dsa.recent_indices(4, 5, 3, "cpu").expand(2, -1, -1)
    _chunked_vs_whole(
        monkeypatch, lambda: (dsa.index_scores(q, weights, keys), dsa.sparse_mla(qm, cache, indices, 0.1))
    )


def test_msa_block_scores_and_attention_are_the_same_chunk_by_chunk(monkeypatch):
    """msa.block_scores, msa.block_sparse_attention: each chunk's queries keep their own positions (step + s + j)."""
    step, queries, block, b = 6, 5, 4, 2
    iq, ikeys = randn(b, queries, 2, 8, seed=6), randn(b, step + queries, 8, seed=7)
    q = randn(b, queries, 4, 16, seed=8)
    k, v = randn(b, step + queries, 2, 16, seed=9), randn(b, step + queries, 2, 16, seed=10)
    geometry = msa.Geometry(hidden=48, head_dim=16, group=2, index_dim=8, block=block, topk_blocks=2, rotary=8)

    def run():
        scores = msa.block_scores(iq, ikeys, step, block)
        chosen = msa.block_topk(scores, step, geometry)
        return scores, msa.block_sparse_attention(q, k, v, chosen, step, block, 0.25)

    _chunked_vs_whole(monkeypatch, run)


def test_dsv4_logits_and_sparse_attention_are_the_same_chunk_by_chunk(monkeypatch):
    """dsv4.indexer_logits, dsv4.sparse_attention: chunk by chunk as in one chunk."""
    q, weights, keys = randn(2, 5, 3, 8, seed=11), randn(2, 5, 3, seed=12), randn(2, 7, 8, seed=13)
    qa, kv, sink = randn(2, 5, 3, 16, seed=14), randn(2, 10, 16, seed=15), randn(3, seed=16)
    recent = dsv4.recent_length(3, 5, 4)
    indices = torch.cat(
        (dsv4.window_indices(3, 5, 4, "cpu"), dsv4.compressed_indices(3, 5, 10 - recent, 2, recent, "cpu")), -1
    ).expand(2, -1, -1)
    _chunked_vs_whole(
        monkeypatch,
        lambda: (dsv4.indexer_logits(q, weights, keys), dsv4.sparse_attention(qa, kv, indices, sink, 0.25)),
    )


# ---- dsa.py: RoPE, the recent tokens, GLM-5's top-k scores -----------------------------------------------------


def test_dsa_rope_turns_interleaved_pairs_or_halves_by_each_positions_angle():
    """dsa.rope: GPT-J turns (x[2i], x[2i+1]), NeoX turns (x[i], x[i + D/2]), each by position x theta^(-2i/D)."""
    dim, positions = 8, torch.tensor([0, 2, 5])
    cos, sin = dsa.rope_tables(positions, dim)
    x = randn(3, dim, seed=20)
    gptj, neox = dsa.rope(x, cos, sin, True), dsa.rope(x, cos, sin, False)
    for row, p in enumerate(positions.tolist()):
        for i in range(dim // 2):
            angle = p * 10000.0 ** (-2 * i / dim)
            c, s = math.cos(angle), math.sin(angle)
            for got, (a, b) in ((gptj, (2 * i, 2 * i + 1)), (neox, (i, i + dim // 2))):
                xa, xb = x[row, a].item(), x[row, b].item()
                assert got[row, a].item() == pytest.approx(xa * c - xb * s, abs=1e-5)
                assert got[row, b].item() == pytest.approx(xb * c + xa * s, abs=1e-5)


def test_recent_indices_are_each_querys_latest_k_visible_tokens():
    """dsa.recent_indices: query j (step + j + 1 visible) keeps tokens visible - min(k, step + S) .. visible - 1."""
    got = dsa.recent_indices(2, 4, 3, "cpu")
    assert got.tolist() == [[0, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 5]]
    few = dsa.recent_indices(0, 3, 5, "cpu")  # width 3: fewer visible than k at first
    assert few.tolist() == [[-1, -1, 0], [-1, 0, 1], [0, 1, 2]]


@pytest.mark.parametrize(("step", "queries", "k"), [(3, 4, 2), (0, 5, 3), (1, 2, 8)])
def test_glm5_top_last_scores_put_each_rows_top_k_at_its_causal_tail(step, queries, k):
    """dsa.topk_scores: top_last lifts each row's last min(k, visible) visible tokens; flat is all zeros."""
    scores = dsa.topk_scores("top_last", step, queries, 2, k, "cpu")
    assert scores.shape == (2, queries, step + queries)
    for j in range(queries):
        visible = step + j + 1
        tail = set(range(max(0, visible - k), visible))
        for b in range(2):
            high = {n for n in range(step + queries) if scores[b, j, n] > 0}
            assert high == tail, (j, high, tail)
    chosen = dsa.causal_topk(scores, step, k)
    for j in range(queries):
        visible = step + j + 1
        assert set(chosen[0, j].tolist()) - {-1} == set(range(max(0, visible - k), visible))
    flat = dsa.topk_scores("flat", step, queries, 2, k, "cpu")
    assert flat.shape == (2, queries, step + queries) and not flat.any()
    with pytest.raises(KernelLimit, match="flat and top_last"):
        dsa.topk_scores("v1_flat", step, queries, 2, k, "cpu")


# ---- msa.py: the norm and RoPE of each head --------------------------------------------------------------------


def test_gemma_norm_scales_by_one_plus_the_weight():
    """msa.gemma_norm: x / sqrt(mean x^2 + eps) x (1 + w) over the last dim."""
    x, w = randn(3, 2, 6, seed=21), randn(6, seed=22)
    want = x / torch.sqrt(x.square().mean(-1, keepdim=True) + msa.EPS) * (1 + w)
    torch.testing.assert_close(msa.gemma_norm(x, w), want, rtol=1e-5, atol=1e-6)


def test_partial_rope_turns_the_first_rotary_dims_by_halves_at_theta_5e6():
    """msa.partial_rope and MsaModule's tables: NeoX halves over the first rotary dims at 5e6, the rest kept."""
    g = msa.Geometry(hidden=16, head_dim=8, group=2, index_dim=8, block=4, topk_blocks=2, rotary=4)
    module = msa.MsaModule(g, 2, 1, 3, 2, torch.float32, torch.float32, torch.float32, "cpu")
    for j, p in enumerate((3, 4)):
        for i in range(2):
            angle = p * 5e6 ** (-2 * i / 4)
            assert module.cos[j, i].item() == pytest.approx(math.cos(angle), abs=1e-6)
            assert module.sin[j, i].item() == pytest.approx(math.sin(angle), abs=1e-6)
    x = randn(2, 8, seed=23)
    got = msa.partial_rope(x, module.cos, module.sin)
    torch.testing.assert_close(got[:, 4:], x[:, 4:])
    for j in range(2):
        for i in range(2):
            c, s = module.cos[j, i].item(), module.sin[j, i].item()
            assert got[j, i].item() == pytest.approx(x[j, i].item() * c - x[j, i + 2].item() * s, abs=1e-5)
            assert got[j, i + 2].item() == pytest.approx(x[j, i + 2].item() * c + x[j, i].item() * s, abs=1e-5)


def test_block_topk_forces_the_init_blocks_in():
    """msa.block_topk: the first init_blocks blocks are kept whatever their scores, the local one too."""
    g = msa.Geometry(hidden=16, head_dim=8, group=2, index_dim=8, block=4, topk_blocks=3, rotary=4, init_blocks=1)
    scores = torch.tensor([-9.0, 5.0, 4.0, -8.0, 3.0, 1.0]).view(1, 1, 1, 6)
    chosen = msa.block_topk(scores, 20, g)  # position 20: blocks 0..5 visible, the local one 5
    assert sorted(chosen[0, 0, 0].tolist()) == [0, 1, 5]
    assert sorted(msa.block_topk(scores, 20, g._replace(init_blocks=0))[0, 0, 0].tolist()) == [1, 2, 5]


# ---- mhc.py: the scales and the combination's layout -----------------------------------------------------------


def test_mhc_pre_scales_each_part_by_its_own_factor_and_lays_the_combination_out_by_row():
    """mhc.pre: scale[0] pre, scale[1] post, scale[2] combination logits, mixed[2hc + i*hc + j] at comb[i, j]."""
    tokens, hc, hidden = 2, 3, 4
    residual = randn(tokens, hc, hidden, seed=30).to(torch.bfloat16)
    fn, base, scale = (
        randn(mhc.mixes(hc), hc * hidden, seed=31),
        randn(mhc.mixes(hc), seed=32),
        torch.tensor([0.5, 1.5, 2.5]),
    )
    post_mix, comb, layer_input = mhc.pre(residual, fn, scale, base, iters=3)
    x = residual.float().reshape(tokens, -1)
    for t in range(tokens):
        mixed = fn @ x[t] / torch.sqrt(x[t].square().mean() + mhc.EPS)
        pre_mix = torch.sigmoid(mixed[:hc] * 0.5 + base[:hc]) + mhc.EPS
        want = sum(pre_mix[i] * residual[t, i].float() for i in range(hc))
        torch.testing.assert_close(layer_input[t].float(), want, rtol=1e-2, atol=1e-2)
        post = 2 * torch.sigmoid(mixed[hc : 2 * hc] * 1.5 + base[hc : 2 * hc])
        torch.testing.assert_close(post_mix[t, :, 0], post, rtol=1e-5, atol=1e-5)
        logits = torch.tensor(
            [[mixed[2 * hc + i * hc + j] * 2.5 + base[2 * hc + i * hc + j] for j in range(hc)] for i in range(hc)]
        )
        torch.testing.assert_close(comb[t], mhc.sinkhorn(logits, 3), rtol=1e-5, atol=1e-5)


def test_mhc_check_case_wants_pre_or_post_with_tokens_and_sites():
    """mhc.check_case: refuses an op other than pre/post, and a row without tokens or without sites."""
    mhc.check_case(SimpleNamespace(op_name="post", num_tokens=1, num_sites=1), "torch")
    for op, tokens, sites in (("mid", 4, 2), ("pre", 0, 2), ("pre", 4, 0), ("post", 0, 0)):
        with pytest.raises(KernelLimit):
            mhc.check_case(SimpleNamespace(op_name=op, num_tokens=tokens, num_sites=sites), "torch")


# ---- linear_attention.py and linear_runners.py: the GDN and Mamba2 inputs as serving hands them ----------------


def test_l2_normalize_divides_by_the_root_of_the_sum_of_squares_plus_eps():
    """la.l2_normalize: x / sqrt(sum x^2 + eps) over the last dim."""
    x = randn(2, 3, 5, seed=40) * 0.01  # small rows: eps shows
    want = x / torch.sqrt(x.square().sum(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(la.l2_normalize(x), want, rtol=1e-5, atol=1e-7)


def _recorded_call(monkeypatch, name):
    calls = []
    real = getattr(la, name)

    def recorder(*args, **kwargs):
        calls.append([a.clone() if isinstance(a, torch.Tensor) else a for a in args] + [kwargs])
        return real(*args, **kwargs)

    monkeypatch.setattr(la, name, recorder)
    return calls


def test_the_gdn_decode_splits_q_k_v_and_gates_as_serving(monkeypatch):
    """linear_runners.prepare_gdn, core decode: q | k | v of the mixed row, q and k L2-normalized,
    g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b), scale head_k_dim^-0.5, a zero fp32 state."""
    b, nk, dk, hv, dv = 2, 1, 4, 2, 3
    case = GdnCase("core", "generation", b, 1, b, 64, 4, nk, dk, hv, dv, "m")
    calls = _recorded_call(monkeypatch, "gdn_step")
    linear_runners.prepare_gdn(case, "torch_gdn_recurrent_step", "cpu", 1).call()
    [(q, k, v, g, beta, state, scale, _)] = calls
    mixed = random_tensor((b, 2 * nk * dk + hv * dv), torch.bfloat16, "cpu", 10).float()
    a, gate = (random_tensor((b, hv), torch.bfloat16, "cpu", seed).float() for seed in (20, 30))
    a_log, dt_bias = random_tensor((hv,), torch.float32, "cpu", 3), random_tensor((hv,), torch.bfloat16, "cpu", 4)

    def unit(t):
        return t / t.norm(dim=-1, keepdim=True)

    torch.testing.assert_close(q, unit(mixed[:, : nk * dk].view(b, nk, dk)), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(k, unit(mixed[:, nk * dk : 2 * nk * dk].view(b, nk, dk)), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(v, mixed[:, 2 * nk * dk :].view(b, hv, dv))
    torch.testing.assert_close(g, -a_log.exp() * torch.log1p(torch.exp(a + dt_bias.float())), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(beta, 1 / (1 + torch.exp(-gate)), rtol=1e-5, atol=1e-6)
    assert scale == pytest.approx(0.5) and state.dtype == torch.float32 and not state.any()


def test_the_gdn_prompt_scans_from_a_zero_state_every_call(monkeypatch):
    """linear_runners.prepare_gdn, core context: unit q and k, g = logsigmoid < 0, beta in (0, 1), scale
    head_k_dim^-0.5, and the state zeroed before every call (each call a new prompt)."""
    case = GdnCase("core", "context", 2, 5, 10, 64, 4, 1, 16, 2, 3, "m")
    calls = _recorded_call(monkeypatch, "gdn_chunked")
    prepared = linear_runners.prepare_gdn(case, "torch_gdn_chunked_scan", "cpu", 1)
    prepared.call()
    prepared.call()
    assert len(calls) == 2
    for q, k, v, g, beta, state, scale, _ in calls:
        assert q.shape == k.shape == (2, 5, 1, 16) and v.shape == (2, 5, 2, 3)
        torch.testing.assert_close(q.float().norm(dim=-1), torch.ones(2, 5, 1), rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(k.float().norm(dim=-1), torch.ones(2, 5, 1), rtol=1e-2, atol=1e-2)
        assert (g < 0).all() and ((beta > 0) & (beta < 1)).all() and scale == pytest.approx(0.25)
        assert state.shape == (2, 2, 16, 3) and not state.any()


def test_the_mamba2_prompt_scans_with_negative_a_and_the_cases_chunk_from_a_zero_state(monkeypatch):
    """linear_runners.prepare_mamba2, core context: A in [-1.5, -0.5), the case's chunk_size, a zero state per call."""
    case = Mamba2Case("core", "context", 2, 6, 12, 64, 4, 4, 2, 3, 1, 4, "m")
    calls = _recorded_call(monkeypatch, "ssd_chunked")
    prepared = linear_runners.prepare_mamba2(case, "torch_ssd_chunked_scan", "cpu", 1)
    prepared.call()
    prepared.call()
    assert len(calls) == 2
    for x, _dt, a, bmat, cmat, _d, _bias, state, chunk, _ in calls:
        assert x.shape == (2, 6, 2, 3) and bmat.shape == cmat.shape == (2, 6, 1, 4) and chunk == 4
        assert ((a < -0.5) & (a >= -1.5)).all() and state.shape == (2, 2, 3, 4) and not state.any()
