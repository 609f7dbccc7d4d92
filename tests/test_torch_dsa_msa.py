"""The plain-PyTorch references of DSA (the module and GLM-5's kernels) and MiniMax-M3's MSA: their math on tiny
inputs against dense attention and brute force, and the CPU smoke collection of their tables end to end."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import torch
from conftest import randn, run_cli

from opcollect.backends.torch import dsa, mla, msa
from opcollect.plans.dsa import DIMS, Dims, DsaModuleCase
from opcollect.plans.mla_module import MlaModuleCase
from opcollect.runtime.contract import KernelLimit
from opcollect.runtime.rundir import read_records

OPS = (
    "dsa_context_module",
    "dsa_generation_module",
    "glm5_mqa_logits_module",
    "glm5_topk_module",
    "glm5_dsa_attn_module",
    "msa_context_module",
    "msa_generation_module",
)
TINY = Dims(hidden=64, q_lora=32, qk_nope=16, qk_rope=8, v_head=16, index_heads=4, index_dim=16, index_topk=1000)


@pytest.mark.parametrize(("step", "queries"), [(0, 6), (5, 4), (9, 1)])
def test_sparse_mla_over_every_visible_token_is_dense_causal_mla(step, queries):
    b, heads, keys = 2, 3, step + queries
    q, cache = randn(b, queries, heads, 576, seed=1), randn(b, keys, 576, seed=2)
    indices = dsa.recent_indices(step, queries, keys + 3, "cpu").expand(b, -1, -1)
    assert sorted(indices[0, -1].tolist()) == list(range(keys))  # the last query sees every token
    sparse = dsa.sparse_mla(q, cache, indices, 0.1)
    # the torch MLA runner's dense attention: heads folded into the query rows, query j hides keys past step + j
    folded = q.permute(0, 2, 1, 3).reshape(b, heads * queries, 576)
    hidden = torch.triu(torch.ones(queries, keys, dtype=torch.bool), diagonal=step + 1)
    dense = mla.attend(folded, cache, heads, queries, hidden, 0.1).view(b, heads, queries, 512).permute(0, 2, 1, 3)
    torch.testing.assert_close(sparse, dense, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("step", "queries", "k"), [(0, 9, 4), (6, 5, 3), (2, 3, 40)])
def test_causal_topk_picks_the_highest_scores_a_query_may_see(step, queries, k):
    scores = randn(2, queries, step + queries, seed=3)
    chosen = dsa.causal_topk(scores, step, k)
    assert chosen.shape[-1] == min(k, step + queries)
    for b in range(2):
        for j in range(queries):
            visible = step + j + 1
            row = chosen[b, j]
            expected = set(scores[b, j, :visible].argsort(descending=True)[: min(k, visible)].tolist())
            assert set(row[row >= 0].tolist()) == expected
            assert int((row < 0).sum()) == chosen.shape[-1] - len(expected)


def test_index_scores_sum_each_heads_weighted_relu_logits():
    q, weights, keys = randn(2, 3, 4, 8, seed=4), randn(2, 3, 4, seed=5), randn(2, 7, 8, seed=6)
    got = dsa.index_scores(q, weights, keys)
    expected = torch.zeros(2, 3, 7)
    for h in range(4):
        expected += weights[..., h, None] * torch.relu(torch.einsum("bsd,bnd->bsn", q[:, :, h], keys))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def _dense_mla(module: dsa.DsaModule, x):
    """The layer's output without absorption: per-head keys and values expanded from the cached latents, dense
    causal softmax attention, o_proj."""
    d, b, s, h, step = module.d, module.batch, module.queries, module.heads, module.step
    qkv = x @ module.w_a
    q = (dsa.rms_norm(qkv[:, : d.q_lora], module.q_norm) @ module.w_qb).view(b, s, h, -1)
    q_pe = dsa.rope(q[..., d.qk_nope :], module.cos.unsqueeze(1), module.sin.unsqueeze(1), True)
    latent, k_pe = module.cache[..., : dsa.KV_LORA], module.cache[..., dsa.KV_LORA :]
    k_nope = torch.einsum("bnl,hpl->bnhp", latent, module.w_uk)
    v = torch.einsum("bnl,hlv->bnhv", latent, module.w_uv)
    scores = torch.einsum("bshp,bnhp->bhsn", q[..., : d.qk_nope], k_nope)
    scores = (scores + torch.einsum("bshr,bnr->bhsn", q_pe, k_pe)) * module.scale
    hidden = torch.triu(torch.ones(s, step + s, dtype=torch.bool), diagonal=step + 1)
    probs = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
    return torch.einsum("bhsn,bnhv->bshv", probs, v).reshape(b * s, -1) @ module.w_o


@pytest.mark.parametrize("path", ["keeps_all", "scores", "skip_indexer"])
def test_the_dsa_module_with_topk_over_every_token_is_dense_mla(path):
    f32 = torch.float32
    module = dsa.DsaModule(TINY, 3, 2, 5, 4, f32, f32, f32, "cpu", indexer=path != "skip_indexer")
    assert module.keeps_all  # 9 tokens, up to 1000 kept
    if path == "scores":
        module = dsa.DsaModule(TINY, 3, 2, 5, 4, f32, f32, f32, "cpu", indexer=True, prefill=False)
        assert not module.keeps_all  # scores every query and takes its top-k, as a decode step does
    x = randn(2 * 4, TINY.hidden, seed=7)
    with torch.no_grad():
        out = module.forward(x)
        torch.testing.assert_close(out, _dense_mla(module, x), rtol=1e-4, atol=1e-4)


def test_the_dsa_indexer_selects_each_querys_top_visible_tokens_by_its_weighted_relu_logits():
    f32, d, step, s = torch.float32, TINY._replace(index_topk=3), 6, 4
    module = dsa.DsaModule(d, 2, 1, step, s, f32, f32, f32, "cpu", indexer=True)
    assert not module.keeps_all  # 10 tokens, 3 kept
    x = randn(s, d.hidden, seed=8)
    q_c = dsa.rms_norm((x @ module.w_a)[:, : d.q_lora], module.q_norm)
    with torch.no_grad():
        chosen = module._index(x, q_c)
    keys = module.index_cache[0]  # the cached tokens' keys and the 4 new ones the indexer just stored
    new = torch.nn.functional.layer_norm(x @ module.wk_i, (d.index_dim,), *module.k_norm, eps=dsa.EPS)
    new_pe = dsa.rope(new[:, : d.qk_rope], module.cos, module.sin, False)
    torch.testing.assert_close(keys[step:], torch.cat((new_pe, new[:, d.qk_rope :]), dim=-1))
    q = (q_c @ module.wq_i).view(s, d.index_heads, d.index_dim)
    q = torch.cat(
        (dsa.rope(q[..., : d.qk_rope], module.cos[:, None], module.sin[:, None], False), q[..., d.qk_rope :]), -1
    )
    weights = (x @ module.ww_i) * d.index_heads**-0.5 * d.index_dim**-0.5
    for j in range(s):
        logits = sum(weights[j, h] * torch.relu(keys @ q[j, h]) for h in range(d.index_heads))
        visible = step + j + 1
        assert set(chosen[0, j].tolist()) == set(logits[:visible].argsort(descending=True)[:3].tolist())


def test_the_torch_references_refuse_fp8_and_unknown_architectures():
    fp8 = DsaModuleCase("dsa_context_module", "m", "GlmMoeDsaForCausalLM", "bfloat16", "fp8", "bfloat16", 4, 1, 4, 1, 0)
    with pytest.raises(KernelLimit, match="fp8"):
        dsa.prepare_module(fp8, "torch.dsa_reference", "cpu", 1)
    other = MlaModuleCase("m", "DeepseekV3ForCausalLM", "bfloat16", "bfloat16", "bfloat16", 4, 1, 4, 1, 0)
    with pytest.raises(KernelLimit, match="DeepseekV3ForCausalLM"):
        msa.prepare(other, "torch.msa_reference", "cpu", 1)
    assert "GlmMoeDsaForCausalLM" in DIMS


TINY_MSA = msa.Geometry(hidden=48, head_dim=16, group=2, index_dim=8, block=4, topk_blocks=2, rotary=8)


@pytest.mark.parametrize(("step", "queries"), [(0, 7), (9, 5), (13, 1)])
def test_block_sparse_attention_over_every_block_is_dense_causal_gqa(step, queries):
    b, kv_heads, group, dim, block, keys = 2, 2, 3, 16, 4, step + queries
    q = randn(b, queries, kv_heads * group, dim, seed=9)
    k, v = randn(b, keys, kv_heads, dim, seed=10), randn(b, keys, kv_heads, dim, seed=11)
    blocks = -(-keys // block)
    geometry = TINY_MSA._replace(topk_blocks=blocks + 1)
    chosen = msa.block_topk(randn(b, queries, kv_heads, blocks, seed=12), step, geometry)
    sparse = msa.block_sparse_attention(q, k, v, chosen, step, block, 0.25)
    hidden = torch.triu(torch.ones(queries, keys, dtype=torch.bool), diagonal=step + 1)
    dense = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=~hidden, scale=0.25, enable_gqa=True
    ).transpose(1, 2)
    torch.testing.assert_close(sparse, dense, rtol=1e-5, atol=1e-5)


def test_block_scores_are_the_max_over_each_blocks_visible_tokens():
    step, queries, block = 5, 4, 4
    iq, keys = randn(1, queries, 2, 8, seed=13), randn(1, step + queries, 8, seed=14)
    scores = msa.block_scores(iq, keys, step, block)
    for j in range(queries):
        for h in range(2):
            for n in range(scores.shape[-1]):
                tokens = [t for t in range(n * block, min((n + 1) * block, step + queries)) if t <= step + j]
                expected = max((float(iq[0, j, h] @ keys[0, t]) for t in tokens), default=float("-inf"))
                assert float(scores[0, j, h, n]) == pytest.approx(expected, rel=1e-5, abs=1e-5)


def test_block_topk_keeps_the_local_block_and_the_highest_others():
    step, queries, geometry = 20, 3, TINY_MSA._replace(topk_blocks=3)
    scores = randn(1, queries, 1, 6, seed=15)
    chosen = msa.block_topk(scores, step, geometry)
    for j in range(queries):
        visible = (step + j + geometry.block) // geometry.block
        local = visible - 1  # sparse_local_block 1: the query's own block
        others = scores[0, j, 0, :local].argsort(descending=True)[: geometry.topk_blocks - 1].tolist()
        assert set(chosen[0, j, 0].tolist()) == {local, *others}
    few = msa.block_topk(randn(1, 2, 1, 2, seed=16), 0, geometry)  # 1 block visible of 2: the rest -1
    assert sorted(few[0, 0, 0].tolist()) == [-1, 0]


def test_the_msa_module_with_topk_over_every_block_is_dense_gqa():
    f32, g = torch.float32, TINY_MSA._replace(topk_blocks=10)
    b, s, step, heads = 2, 3, 6, 4
    module = msa.MsaModule(g, heads, b, step, s, f32, f32, f32, "cpu")
    x = randn(b * s, g.hidden, seed=17)
    with torch.no_grad():
        out = module.forward(x)
    q = (x @ module.w_qkv)[:, : heads * g.head_dim].view(b, s, heads, g.head_dim)
    q = msa.partial_rope(msa.gemma_norm(q, module.norms[0]), module.cos.unsqueeze(1), module.sin.unsqueeze(1))
    hidden = torch.triu(torch.ones(s, step + s, dtype=torch.bool), diagonal=step + 1)
    o = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2),
        module.k_cache.transpose(1, 2),
        module.v_cache.transpose(1, 2),
        attn_mask=~hidden,
        scale=g.head_dim**-0.5,
        enable_gqa=True,
    ).transpose(1, 2)
    torch.testing.assert_close(out, o.reshape(b * s, -1) @ module.w_o, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """`collect torch --local --device cpu --smoke` of these ops into a temporary TABLES: (run dir, TABLES, process)."""
    tmp = tmp_path_factory.mktemp("dsa_msa_smoke")
    run_dir, tables = tmp / "run", tmp / "tables"
    done = run_cli(
        *("collect", "torch", "--local", "--device", "cpu", "--smoke", "--ops", ",".join(OPS)),
        *("--out", str(run_dir), "--tables", str(tables)),
        timeout=900,
    )
    return run_dir, tables, done


def test_the_cpu_smoke_collection_writes_the_sparse_tables_and_they_check_and_verify(smoke):
    run_dir, tables, done = smoke
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    records = read_records(run_dir)
    assert {r["op"] for r in records} == set(OPS)
    assert all(r["status"] == "ok" for r in records), [r for r in records if r["status"] != "ok"][:2]
    for family, op in [("sparse_attention", op) for op in OPS[:5]] + [("msa", op) for op in OPS[5:]]:
        [path] = list((tables / "cpu" / family / "torch").glob(f"*/{op}_perf.parquet"))
        rows = pq.read_table(path).to_pylist()
        assert rows, path
        for row in rows:
            # the top-k of a request whose tokens all fit in index_topk is held at 0, unrun; every other row timed
            zero = op == "glm5_topk_module" and row["step"] + row["isl"] <= 2048
            assert (row["latency"] == 0) if zero else (row["latency"] > 0), (op, row)
            assert row["kernel_source"].startswith("torch.")
    assert any(
        r["latency"] == 0 for r in pq.read_table(next(tables.rglob("glm5_topk_module_perf.parquet"))).to_pylist()
    )
    assert "each matching its label" in done.stdout  # the ATen ops each row ran are those its label names
    checked = run_cli("check", str(tables))
    assert checked.returncode == 0 and "R9" not in checked.stdout + checked.stderr, checked.stdout[-2000:]
    assert run_cli("verify", str(tables)).returncode == 0
