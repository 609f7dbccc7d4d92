"""The torch backend's DeepSeek-V4 attention and mHC references (backends/torch/dsv4.py, dsv4_kernels.py, mhc.py)
and the zero-latency rows of the top-k calibration.

The math on tiny inputs against naive formulations: sparse attention over every visible compressed entry is dense
attention over the window and the compressed KV; the indexer's top-k keeps the highest visible scores and every one
when no more are visible; the compressor pools each window by its softmax; the mHC combination is doubly stochastic
and pre and post are the per-token sums. Then the CPU smoke writes every sparse_attention and mhc table for torch,
which check and verify pass, with the trivial top-k cases written without running at latency 0 (timing none); and
the value rules admit a 0 on such a case alone.
"""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import ROOT, fake_run, randn, run_cli

from opcollect.backends.torch import RUNNERS, dsv4, dsv4_kernels, mhc, reference
from opcollect.plans.dsv4_kernels import Dsv4TopkCase
from opcollect.plans.ops import OPS
from opcollect.runtime.contract import Runner
from opcollect.runtime.harness import TimingConfig
from opcollect.runtime.timing import measure_cases
from opcollect.tables.compare import compare_tables
from opcollect.tables.rules import check_tables
from opcollect.tables.schema import schema_for_op
from opcollect.tables.values import measured_faults, record_faults, schema_untimed

SLICES = ROOT / "tests" / "data" / "reference" / "dsv4_mhc_slices"
FLASH = "sgl-project/DeepSeek-V4-Flash-FP8"
TOPK = "dsv4_csa_topk_calib"
OPS_HERE = (
    "dsv4_csa_context_module",
    "dsv4_csa_generation_module",
    "dsv4_hca_context_module",
    "dsv4_hca_generation_module",
    "dsv4_paged_mqa_logits_module",
    "dsv4_hca_attn_module",
    TOPK,
    "mhc",
)


# ---- the attention math against naive loops ----


def _dense(q, kv, visible, sink, scale):
    """Per query row, softmax over the kv rows ``visible`` names (a list per (b, s)) with the sink in the
    denominator: p_k = exp(s_k) / (sum exp(s) + exp(sink_h))."""
    b, queries, heads, _ = q.shape
    out = torch.zeros_like(q)
    for i in range(b):
        for s in range(queries):
            keys = kv[i, visible[i][s]]
            for h in range(heads):
                scores = keys @ q[i, s, h] * scale
                weights = torch.exp(scores) / (torch.exp(scores).sum() + math.exp(sink[h]))
                out[i, s, h] = weights @ keys
    return out


@pytest.mark.parametrize("step", [0, 3, 9])
def test_sparse_attention_over_every_visible_entry_is_dense_attention(step):
    """HCA's indices (the window plus every compressed entry a query may see) give dense attention over exactly
    those rows; CSA's top-k with k at least the entries selects the same rows, so the same output."""
    b, queries, heads, dim, window, ratio = 2, 5, 3, 16, 4, 2
    entries = (step + queries) // ratio
    recent = dsv4.recent_length(step, queries, window)
    kv, q, sink = randn(b, recent + entries, dim, seed=1), randn(b, queries, heads, dim, seed=2), randn(heads, seed=3)
    win = dsv4.window_indices(step, queries, window, "cpu")
    every = dsv4.compressed_indices(step, queries, entries, ratio, recent, "cpu")
    got = dsv4.sparse_attention(q, kv, torch.cat((win, every), -1).expand(b, -1, -1), sink, 0.25)
    start = max(0, step - window + 1)
    visible = [
        [
            [p - start for p in range(step + s - window + 1, step + s + 1) if p >= 0]
            + [recent + c for c in range((step + s + 1) // ratio)]
            for s in range(queries)
        ]
    ] * b
    assert torch.allclose(got, _dense(q, kv, visible, sink, 0.25), atol=1e-5)
    # the indexer's selection with k >= entries: every visible entry, the rest -1
    seen = (step + 1 + torch.arange(queries)) // ratio
    chosen = dsv4.select(randn(b, queries, entries, seed=4), seen, k=entries + 3)
    assert [sorted(c for c in row if c >= 0) for row in chosen[0].tolist()] == [list(range(n)) for n in seen]
    picked = torch.cat((win.expand(b, -1, -1), (chosen + recent).masked_fill(chosen < 0, -1)), -1)
    assert torch.allclose(dsv4.sparse_attention(q, kv, picked, sink, 0.25), got, atol=1e-5)


def test_select_keeps_the_k_highest_visible_logits():
    logits, visible = randn(3, 7, 20, seed=5), torch.tensor([1, 4, 5, 8, 12, 19, 20])
    chosen = dsv4.select(logits, visible, k=6)
    for i in range(3):
        for s, n in enumerate(visible.tolist()):
            want = sorted(sorted(range(n), key=lambda c: -logits[i, s, c])[:6])
            assert sorted(c for c in chosen[i, s].tolist() if c >= 0) == want
            assert chosen[i, s].tolist().count(-1) == 6 - len(want)


def test_indexer_logits_are_the_weighted_relu_sum_over_heads():
    q, weights, keys = randn(2, 3, 4, 8, seed=6), randn(2, 3, 4, seed=7), randn(2, 5, 8, seed=8)
    got = dsv4.indexer_logits(q, weights, keys)
    for i in range(2):
        for s in range(3):
            for c in range(5):
                want = sum(weights[i, s, h] * torch.relu(q[i, s, h] @ keys[i, c]) for h in range(4))
                assert torch.isclose(got[i, s, c], want, atol=1e-5)


@pytest.mark.parametrize("ratio", [4, 8])  # 4: overlapping windows of two blocks (coff 2); 8: one block
def test_compress_pools_each_window_by_its_softmax(ratio):
    coff, dim, b, n = (2 if ratio == dsv4.CSA else 1), dsv4.ROPE + 8, 2, 3
    length = (n + coff - 1) * ratio
    kv, score = randn(b, length, coff * dim, seed=9), randn(b, length, coff * dim, seed=10)
    if coff == 2:
        score[:, :ratio] = float("-inf")  # the first entry's older block lies below position 0
    ape, norm = randn(ratio, coff * dim, seed=11), randn(dim, seed=12)
    cos, sin = dsv4.rope_tables(torch.arange(n) * ratio)
    got = dsv4.compress(kv, score, ape, ratio, norm, cos, sin)
    for c in range(n):
        tokens = range(c * ratio, (c + coff) * ratio)  # the window of entry c in the padded sequence
        parts = [slice(0, dim) if coff == 2 and t < (c + 1) * ratio else slice((coff - 1) * dim, coff * dim)
                 for t in tokens]  # fmt: skip
        values = torch.stack([kv[:, t, p] for t, p in zip(tokens, parts)], 1)
        weights = torch.softmax(torch.stack([score[:, t, p] + ape[t % ratio, p] for t, p in zip(tokens, parts)], 1), 1)
        pooled = (values * weights).sum(1)
        want = dsv4.rotate(
            pooled * torch.rsqrt(pooled.square().mean(-1, keepdim=True) + reference.EPS) * norm, cos[c], sin[c]
        )
        assert torch.allclose(got[:, c], want, atol=1e-5)


TINY = "tiny/DeepSeek-V4"  # a model small enough to run every shape of the module in a test


@pytest.fixture
def tiny(monkeypatch):
    from opcollect.plans import dsv4 as plans

    # hidden, q_lora, o_lora, o_groups, head_dim, sliding_window, index heads, index_head_dim, index_topk
    monkeypatch.setitem(plans.DIMS, TINY, plans.Dims(64, 32, 16, 2, dsv4.ROPE + 32, 8, 2, dsv4.ROPE + 16, 3))


@pytest.mark.parametrize("ratio", [4, 128])
@pytest.mark.parametrize("step,isl", [(0, 1), (3, 1), (6, 1), (127, 1), (0, 16), (5, 11), (250, 6), (0, 300)])
def test_the_module_runs_every_kind_of_shape(tiny, ratio, step, isl):
    """Context and decode, with and without a completed block, a window reaching below position 0 or not; the
    compressor completes exactly the blocks the new tokens end."""
    case = OPS["dsv4_csa_context_module"].case_type(
        TINY, "DeepseekV4ForCausalLM", "float32", "float32", "float32", 4, 2, isl, 2, step, ratio
    )
    prepared = RUNNERS.find("dsv4_csa_context_module", "torch_dsv4_attention").prepare(
        case, "torch_dsv4_attention", "cpu", 2
    )
    prepared.call()
    prepared.call()
    assert prepared.kernel_source == "torch_dsv4_attention"
    d = dsv4.model_dims(case)
    compressor = dsv4.Compressor(d.hidden_size, d.head_dim, ratio, 2, step, isl, torch.float32, "cpu", 0)
    made = compressor(randn(2 * isl, d.hidden_size, seed=20), 2)
    done = (step + isl) // ratio - step // ratio
    assert (made is None) == (done == 0) and (made is None or made.shape == (2, done, d.head_dim))
    assert made is None or torch.isfinite(made).all()


def test_rotate_and_its_inverse_undo_each_other():
    x = randn(2, 5, 3, dsv4.ROPE + 4, seed=13)
    cos, sin = dsv4.rope_tables(torch.arange(5) + 7)
    turned = dsv4.rotate(x, cos.unsqueeze(1), sin.unsqueeze(1))
    assert torch.equal(turned[..., :4], x[..., :4]) and not torch.allclose(turned, x)
    assert torch.allclose(dsv4.rotate(turned, cos.unsqueeze(1), sin.unsqueeze(1), inverse=True), x, atol=1e-5)


def test_top_last_scores_put_each_rows_top_k_at_its_causal_tail():
    case = Dsv4TopkCase(
        FLASH, "DeepseekV4ForCausalLM", "float32", "float32", "float32", 64, 2, 4, 1, 4096, 4, "v1_top_last"
    )
    lengths = dsv4_kernels.row_lengths(case, "cpu")
    assert lengths.tolist() == [1024, 1024, 1024, 1025] * 2
    scores = dsv4_kernels.topk_scores(case.score_mode, lengths, 1025, 512, "cpu")
    chosen = dsv4.select(scores, lengths, 512)
    assert [sorted(row) for row in chosen.tolist()] == [list(range(n - 512, n)) for n in lengths.tolist()]
    assert not dsv4_kernels.topk_scores("v2_flat", lengths, 1025, 512, "cpu").any()


# ---- the mHC mixing ----


def test_sinkhorn_makes_the_combination_doubly_stochastic():
    """Columns sum to 1 (the last normalisation); the rows converge to 1 with the iterations (20 in DeepSeek-V4)."""
    logits = randn(6, 4, 4, seed=14) * 3
    errors = []
    for iters in (1, 20, 200):
        comb = mhc.sinkhorn(logits, iters=iters)
        assert (comb > 0).all() and torch.allclose(comb.sum(-2), torch.ones(6, 4), atol=1e-3)
        errors.append((comb.sum(-1) - 1).abs().max().item())
    assert errors[0] > errors[1] > errors[2] and errors[1] < 0.05 and errors[2] < 1e-3


def test_sinkhorn_iters_counts_the_column_normalisation_then_iters_minus_one_row_and_column_rounds():
    """As vLLM's mhc_pre_torch and SGLang's hc_split_sinkhorn: softmax + eps, one column normalisation, then
    sinkhorn_repeat - 1 rounds of row then column; one round more is another matrix."""
    logits = randn(5, 4, 4, seed=18) * 3

    def rows(comb):
        return comb / (comb.sum(dim=-1, keepdim=True) + mhc.EPS)

    def columns(comb):
        return comb / (comb.sum(dim=-2, keepdim=True) + mhc.EPS)

    first = mhc.sinkhorn(logits, iters=1)
    assert torch.allclose(first, columns(torch.softmax(logits, dim=-1) + mhc.EPS), rtol=0, atol=1e-7)
    for iters in (1, 2, 19):  # each iteration more is one row-then-column round more
        after = mhc.sinkhorn(logits, iters=iters + 1)
        assert torch.allclose(after, columns(rows(mhc.sinkhorn(logits, iters=iters))), rtol=0, atol=1e-7), iters
    assert not torch.allclose(first, mhc.sinkhorn(logits, iters=2), atol=1e-4)


def test_mhc_pre_and_post_are_the_per_token_sums():
    tokens, hc, hidden = 3, 4, 8
    residual = randn(tokens, hc, hidden, seed=15).to(torch.bfloat16)
    fn, base, scale = randn(mhc.mixes(hc), hc * hidden, seed=16), randn(mhc.mixes(hc), seed=17), torch.ones(3)
    post_mix, comb, layer_input = mhc.pre(residual, fn, scale, base, iters=20)
    x = residual.float().reshape(tokens, -1)
    for t in range(tokens):
        mixed = fn @ x[t] / torch.sqrt(x[t].square().mean() + mhc.EPS)
        pre_mix = torch.sigmoid(mixed[:hc] + base[:hc]) + mhc.EPS
        want = sum(pre_mix[i] * residual[t, i].float() for i in range(hc))
        assert torch.allclose(layer_input[t].float(), want, rtol=1e-2, atol=1e-2)
        assert torch.allclose(post_mix[t, :, 0], 2 * torch.sigmoid(mixed[hc : 2 * hc] + base[hc : 2 * hc]), atol=1e-5)
        assert torch.allclose(comb[t].sum(0), torch.ones(hc), atol=1e-4)
    out = mhc.post(layer_input, residual, post_mix, comb)
    for t in range(tokens):
        for j in range(hc):
            want = post_mix[t, j, 0] * layer_input[t].float()
            want = want + sum(comb[t, i, j] * residual[t, i].float() for i in range(hc))
            assert torch.allclose(out[t, j].float(), want, rtol=1e-2, atol=1e-2)


# ---- the runners and the untimed rows ----


def test_every_op_here_has_a_runner_and_the_topk_one_knows_the_plans_zero_rule():
    assert set(OPS_HERE) <= RUNNERS.ops()
    runner = RUNNERS.find(TOPK, "torch.topk")
    rule = OPS[TOPK].zero_latency
    for step, isl, trivial in ((0, 16, True), (2047, 4, True), (2050, 2, False), (4096, 1, False)):
        case = Dsv4TopkCase(FLASH, "DeepseekV4ForCausalLM", "float32", "float32", "float32", 64, 2, isl, 1, step, 4,
                            "v1_flat")  # fmt: skip
        assert runner.untimed(case) == rule(case) == trivial, (step, isl)


def test_the_harness_writes_an_untimed_case_without_preparing_it():
    def refuse(*args):
        raise AssertionError("an untimed case was prepared")

    runner = Runner(lambda c: 0, refuse, untimed=lambda c: True)
    [measured] = measure_cases(runner, "topk_transform_v1", ["a case"], "cpu", TimingConfig())
    s = measured.stats
    assert (s.latency, s.latency_p25, s.latency_p75, s.samples, s.noise, s.timing) == (0, 0, 0, 0, 0, "none")
    assert measured.kernel_source == "topk_transform_v1" and measured.observed is None


# ---- the value rules: a zero on a trivial top-k case, and nowhere else ----


def _topk_cases() -> list[Dsv4TopkCase]:
    return [
        Dsv4TopkCase(FLASH, "DeepseekV4ForCausalLM", "fp8_e4m3", "fp8_e4m3", "fp8_block", 64, 1, 1, 1, step, 4, mode)
        for step in (0, 1024, 4096, 8192)
        for mode in ("v1_flat", "v1_top_last")
    ]


def test_a_zero_on_a_trivial_topk_case_is_merged_and_a_zero_elsewhere_refused(tmp_path):
    """Steps 0 and 1024 keep every entry of Flash's 512 (trivial: 0 admitted); 4096 and 8192 select (0 refused)."""
    cases = _topk_cases()
    trivial = {c: OPS[TOPK].zero_latency(c) for c in cases}
    assert sorted(set(trivial.values())) == [False, True]
    run = fake_run(tmp_path / "run", cases, op=TOPK, backend="sglang", version="0.5.14", kernel_source="topk_transform",
                   latency_of=lambda c: 0.0 if c.step != 8192 else 0.5)  # fmt: skip
    tables = tmp_path / "tables"
    done = run_cli("merge", str(run), "--into", str(tables))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "(2 latency not finite and positive)" in done.stdout, done.stdout  # step 4096's two zeros
    [path] = tables.rglob("dsv4_csa_topk_calib_perf.parquet")
    rows = pq.read_table(path).to_pylist()
    want = [(0, 0.0)] * 2 + [(1024, 0.0)] * 2 + [(8192, 0.5)] * 2
    assert sorted((r["step"], r["latency"]) for r in rows) == want
    findings = check_tables(tables)
    assert [f.render() for f in findings if not f.warning and f.rule != "R4"] == []
    # a stored zero on a selecting case, and timing none on one, are R3 violations
    perf = pq.read_table(path)
    latency = [0.0 if s == 8192 else v for s, v in zip(perf["step"].to_pylist(), perf["latency"].to_pylist())]
    perf = perf.set_column(perf.schema.get_field_index("latency"), "latency", pa.array(latency, pa.float64()))
    p25 = [0.0 if s == 8192 else v for s, v in zip(perf["step"].to_pylist(), perf["latency_p25"].to_pylist())]
    perf = perf.set_column(perf.schema.get_field_index("latency_p25"), "latency_p25", pa.array(p25, pa.float64()))
    pq.write_table(perf, path)
    r3 = {f.message: len(f.keys) for f in check_tables(tables) if f.rule == "R3"}
    assert r3 == {"latency not finite and positive": 2}


def test_timing_none_is_a_zero_latency_cases_alone():
    schema = schema_for_op(TOPK)
    cases = _topk_cases()
    table = pa.table(
        {
            **{f: [getattr(c, f) for c in cases] for f in schema.key_fields},
            "latency": [0.0] * 8,
            "latency_p25": [0.0] * 8,
            "latency_p75": [0.0] * 8,
            "samples": [0] * 8,
            "noise": [0.0] * 8,
            "timing": ["none"] * 8,
        }
    )
    untimed = schema_untimed(table, schema)
    assert untimed.to_pylist() == [c.step <= 1024 for c in cases]
    faults = {f.what: f.mask.to_pylist() for f in measured_faults(table, untimed=untimed)}
    selecting = [c.step > 1024 for c in cases]
    assert faults == {
        "latency not finite and positive": selecting,
        "timing none on a case the plan times": selecting,  # no sample is no fault on a row not run
    }
    # timing none with a latency, and shard records: none on a gemm record is refused, on a top-k one admitted
    assert {
        f.what
        for f in measured_faults(
            table.set_column(table.schema.get_field_index("latency"), "latency", pa.array([1.0] * 8)), untimed=True
        )
    } == {
        "timing none with a latency",
        "0 <= p25 <= latency <= p75 broken",
    }
    records = pa.table(
        {
            "op": [TOPK, "gemm"],
            "status": ["ok"] * 2,
            "attempt": [1] * 2,
            "recorded_at": ["2026-11-30T00:00:00.000+00:00"] * 2,
            **{f"stats.{k}": [0.0] * 2 for k in ("latency", "latency_p25", "latency_p75", "noise")},
            "stats.samples": [0] * 2,
            "stats.timing": ["none"] * 2,
        }
    )
    faults = {f.what: f.mask.to_pylist() for f in record_faults(records)}
    assert faults == {
        "latency not finite and positive": [False, True],
        "timing none on a case the plan times": [False, True],
    }


def test_the_references_zero_rows_pass_check_and_compare_leaves_them_out():
    path = SLICES / "sparse_attention/sglang/0.5.14/dsv4_csa_topk_calib_perf.parquet"
    table = pq.read_table(path)
    schema = schema_for_op(TOPK).for_columns(table.column_names)
    assert measured_faults(table, untimed=schema_untimed(table, schema)) == []
    assert [f.what for f in measured_faults(table)] == ["latency not finite and positive"]  # without the rule
    zeros = sum(1 for v in table["latency"].to_pylist() if v == 0)
    c = compare_tables(path, path)
    assert c.left_out == [f"{path}: left out {zeros} rows: latency 0 (a case the plan holds at 0), no ratio"] * 2


# ---- the CPU smoke of these ops ----


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> tuple[Path, object]:
    tmp = tmp_path_factory.mktemp("dsv4smoke")
    tables = tmp / "tables"
    done = run_cli("collect", "torch", "--local", "--device", "cpu", "--smoke", "--ops", ",".join(OPS_HERE),
                   "--out", str(tmp / "run"), "--tables", str(tables), timeout=600)  # fmt: skip
    return tables, done


def test_the_cpu_smoke_writes_every_table_and_check_and_verify_pass(smoke):
    tables, done = smoke
    assert done.returncode == 0, done.stderr[-3000:]
    assert "0 of" in done.stdout and "failures none" in done.stdout, done.stdout
    found = {p.name: p for p in tables.rglob("*_perf.parquet")}
    assert set(found) == {f"{OPS[op].table}.parquet" for op in OPS_HERE}
    assert {p.parent.parent.parent.name for p in found.values()} == {"sparse_attention", "mhc"}
    for name, path in found.items():
        rows = pq.read_table(path).to_pylist()
        assert rows, name
        if name.startswith(TOPK):  # the trivial cases not run, at 0; the selecting ones timed
            op = OPS[TOPK]
            trivial = [op.zero_latency(op.case_type(*(r[f] for f in op.fields))) for r in rows]
            assert sorted(set(trivial)) == [False, True]
            assert [(r["latency"] == 0, r["timing"], r["samples"] == 0) for r in rows] == [
                (t, "none" if t else "cpu", t) for t in trivial
            ]
        else:
            assert all(r["latency"] > 0 and r["timing"] == "cpu" for r in rows), name
    # the reference's columns lead ours, in its order (SGLang's top-k strings are large_string there)
    for ours, theirs in (
        (found["mhc_module_perf.parquet"], "mhc/vllm/0.24.0/mhc_module_perf.parquet"),
        (found["dsv4_csa_topk_calib_perf.parquet"], "sparse_attention/sglang/0.5.14/dsv4_csa_topk_calib_perf.parquet"),
        (found["dsv4_hca_attn_module_perf.parquet"], "sparse_attention/vllm/0.24.0/dsv4_hca_attn_module_perf.parquet"),
        (
            found["dsv4_csa_context_module_perf.parquet"],
            "sparse_attention/vllm/0.24.0/dsv4_csa_context_module_perf.parquet",
        ),
    ):
        mine, ref = pq.read_schema(ours).names, pq.read_schema(SLICES / theirs).names
        assert mine[: len(ref)] == ref, theirs
    check = run_cli("check", str(tables))
    assert check.returncode == 0 and "0 violations" in check.stdout, check.stdout[-3000:]
    assert "kernel table does not know" not in check.stdout  # backends/torch/kernels.py names every label
    assert run_cli("verify", str(tables)).returncode == 0
