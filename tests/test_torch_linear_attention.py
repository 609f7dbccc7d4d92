"""The plain-PyTorch references of Gated DeltaNet and Mamba2: the chunked forms agree with the recurrent steps on
small inputs (the conv over a prompt with its token-by-token update, the GDN chunked scan with the delta-rule step,
the SSD chunked scan with the selective state update), each step agrees with its formula written out, the runners
prepare every kernel of the CPU grid, and the CPU collection writes linear_attention tables that check and verify."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F
from conftest import randn, run_cli

from opcollect.backends.torch import linear_attention as la
from opcollect.backends.torch import linear_runners
from opcollect.plans.linear_attention import GdnCase, Mamba2Case
from opcollect.runtime.contract import KernelLimit
from opcollect.runtime.rundir import read_records

OPS = ("gdn", "mamba2")


@pytest.mark.parametrize(("seq", "width", "bias"), [(1, 4, False), (3, 4, True), (37, 4, False), (20, 2, True)])
def test_the_conv_over_a_prompt_is_its_token_by_token_update(seq, width, bias):
    x, weight = randn(2, 5, seq, seed=1), randn(5, width, seed=2)
    b = randn(5, seed=3) if bias else None
    out, final = la.causal_conv1d(x, weight, b)
    state = torch.zeros(2, 5, width - 1)
    steps = torch.stack([la.causal_conv1d_update(x[:, :, t], state, weight, b) for t in range(seq)], dim=-1)
    torch.testing.assert_close(out, steps, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(final, state)
    # each output sees its own token and the width - 1 before it, SiLU after
    t = seq - 1
    window = F.pad(x, (width - 1, 0))[:, :, t : t + width]
    expected = (window * weight).sum(-1) + (b if bias else 0)
    torch.testing.assert_close(out[:, :, t], F.silu(expected), rtol=1e-5, atol=1e-5)


def _gdn_inputs(b, s, nk, hv, dk, dv, seed):
    q = la.l2_normalize(randn(b, s, nk, dk, seed=seed))
    k = la.l2_normalize(randn(b, s, nk, dk, seed=seed + 1))
    v = randn(b, s, hv, dv, seed=seed + 2)
    g = F.logsigmoid(randn(b, s, hv, seed=seed + 3))
    beta = torch.sigmoid(randn(b, s, hv, seed=seed + 4))
    return q, k, v, g, beta


@pytest.mark.parametrize(("seq", "chunk", "nk", "hv"), [(1, 64, 2, 2), (64, 64, 1, 2), (150, 64, 2, 4), (19, 8, 2, 6)])
def test_the_gdn_chunked_scan_is_the_recurrent_steps(seq, chunk, nk, hv):
    """Over one prompt from a nonzero state: the same outputs and final state as one decode step per token, with
    a prompt shorter, as long as and longer than a chunk, not a multiple of it, value heads sharing key heads."""
    b, dk, dv = 2, 16, 8
    q, k, v, g, beta = _gdn_inputs(b, seq, nk, hv, dk, dv, seed=10)
    start = 0.1 * randn(b, hv, dk, dv, seed=20)
    chunked, stepped = start.clone(), start.clone()
    out = la.gdn_chunked(q, k, v, g, beta, chunked, dk**-0.5, chunk=chunk)
    steps = [la.gdn_step(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], stepped, dk**-0.5) for t in range(seq)]
    torch.testing.assert_close(out, torch.stack(steps, dim=1), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(chunked, stepped, rtol=1e-4, atol=1e-5)


def test_the_gdn_step_is_the_gated_delta_rule():
    """S' = exp(g) (I - beta k k^T) S + beta k v^T and o = S'^T q scale, per value head; value head h reads key
    head h // (hv / nk)."""
    b, nk, hv, dk, dv = 2, 2, 4, 8, 4
    q, k, v, g, beta = (x[:, 0] for x in _gdn_inputs(b, 1, nk, hv, dk, dv, seed=30))
    state = randn(b, hv, dk, dv, seed=31)
    expected_state, expected_out = state.clone(), torch.empty(b, hv, dv)
    for i in range(b):
        for h in range(hv):
            kh, qh = k[i, h // 2], q[i, h // 2]
            decay = torch.eye(dk) - beta[i, h] * torch.outer(kh, kh)
            new = g[i, h].exp() * decay @ state[i, h] + beta[i, h] * torch.outer(kh, v[i, h])
            expected_state[i, h], expected_out[i, h] = new, new.T @ qh * 0.5
    out = la.gdn_step(q, k, v, g, beta, state, 0.5)
    torch.testing.assert_close(state, expected_state, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, expected_out, rtol=1e-5, atol=1e-5)


def _ssd_inputs(b, s, h, p, groups, n, seed):
    x, dt = randn(b, s, h, p, seed=seed), randn(b, s, h, seed=seed + 1)
    a = -torch.rand(h, generator=torch.Generator().manual_seed(seed + 2)) - 0.5
    bmat, cmat = randn(b, s, groups, n, seed=seed + 3), randn(b, s, groups, n, seed=seed + 4)
    return x, dt, a, bmat, cmat, randn(h, seed=seed + 5), randn(h, seed=seed + 6)


@pytest.mark.parametrize(
    ("seq", "chunk", "h", "groups"), [(1, 16, 4, 2), (32, 32, 4, 4), (150, 32, 6, 2), (9, 4, 4, 1)]
)
def test_the_ssd_chunked_scan_is_the_selective_state_updates(seq, chunk, h, groups):
    """Over one prompt from a nonzero state: the same outputs and final state as one selective state update per
    token, for prompts within, at and beyond a chunk, heads sharing B and C by group."""
    b, p, n = 2, 8, 5
    x, dt, a, bmat, cmat, d, dt_bias = _ssd_inputs(b, seq, h, p, groups, n, seed=40)
    start = 0.1 * randn(b, h, p, n, seed=50)
    chunked, stepped = start.clone(), start.clone()
    out = la.ssd_chunked(x, dt, a, bmat, cmat, d, dt_bias, chunked, chunk)
    steps = [la.ssd_step(x[:, t], dt[:, t], a, bmat[:, t], cmat[:, t], d, dt_bias, stepped) for t in range(seq)]
    torch.testing.assert_close(out, torch.stack(steps, dim=1), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(chunked, stepped, rtol=1e-4, atol=1e-4)


def test_the_selective_state_update_is_mamba2s_recurrence():
    """dt = softplus(dt + bias), S' = exp(dt A) S + dt x B^T, y = S' C + D x, head h reading group h // (h / g)."""
    b, h, p, groups, n = 2, 4, 3, 2, 5
    x, dt, a, bmat, cmat, d, dt_bias = (t[:, 0] if t.dim() > 1 else t for t in _ssd_inputs(b, 1, h, p, groups, n, 60))
    state = randn(b, h, p, n, seed=61)
    expected_state, expected = state.clone(), torch.empty(b, h, p)
    for i in range(b):
        for j in range(h):
            step = F.softplus(dt[i, j] + dt_bias[j])
            new = (step * a[j]).exp() * state[i, j] + step * torch.outer(x[i, j], bmat[i, j // 2])
            expected_state[i, j], expected[i, j] = new, new @ cmat[i, j // 2] + d[j] * x[i, j]
    out = la.ssd_step(x, dt, a, bmat, cmat, d, dt_bias, state)
    torch.testing.assert_close(state, expected_state, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


GDN = GdnCase("conv", "context", 2, 70, 140, 2048, 4, 1, 32, 2, 16, "m")
MAMBA2 = Mamba2Case("conv", "context", 2, 40, 80, 1024, 8, 4, 4, 8, 2, 16, "m")


@pytest.mark.parametrize("stage", ["conv", "core"])
@pytest.mark.parametrize("phase", ["context", "generation"])
def test_the_runners_prepare_every_kernel_and_run_it(stage, phase):
    for case, prepare, footprint in (
        (GDN, linear_runners.prepare_gdn, linear_runners.gdn_footprint),
        (MAMBA2, linear_runners.prepare_mamba2, linear_runners.mamba2_footprint),
    ):
        if phase == "generation":
            case = case._replace(seq_len=1, num_tokens=case.batch_size)
        case = case._replace(stage=stage, phase=phase)
        prepared = prepare(case, f"torch_{stage}", "cpu", 2)
        assert prepared.kernel_source == f"torch_{stage}"
        prepared.call()
        prepared.call()
        assert footprint(case) > 0


def test_the_runners_refuse_a_conv_without_a_state():
    with pytest.raises(KernelLimit):
        linear_runners.prepare_gdn(GDN._replace(d_conv=1), "torch_causal_conv1d", "cpu", 1)
    with pytest.raises(KernelLimit):
        linear_runners.prepare_gdn(GDN._replace(num_v_heads=3, num_k_heads=2), "torch_gdn_chunked_scan", "cpu", 1)


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    """`collect torch --local --device cpu --ops gdn,mamba2` (the CPU grid: every kernel of both ops) into a
    temporary TABLES: (run dir, TABLES, process)."""
    tmp = tmp_path_factory.mktemp("linear_cpu")
    run_dir, tables = tmp / "run", tmp / "tables"
    done = run_cli(
        *("collect", "torch", "--local", "--device", "cpu", "--ops", ",".join(OPS)),
        *("--out", str(run_dir), "--tables", str(tables)),
        timeout=900,
    )
    return run_dir, tables, done


def test_the_cpu_collection_writes_the_linear_attention_tables_and_they_check_and_verify(collected):
    run_dir, tables, done = collected
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    records = read_records(run_dir)
    assert {r["op"] for r in records} == set(OPS)
    assert all(r["status"] == "ok" for r in records), [r for r in records if r["status"] != "ok"][:2]
    labels = {
        "gdn": {"torch_causal_conv1d", "torch_causal_conv1d_update", "torch_gdn_chunked_scan"}
        | {"torch_gdn_recurrent_step"},
        "mamba2": {"torch_causal_conv1d", "torch_causal_conv1d_update", "torch_ssd_chunked_scan"}
        | {"torch_selective_state_update"},
    }
    for op in OPS:
        [path] = list((tables / "cpu" / "linear_attention" / "torch").glob(f"*/{op}_perf.parquet"))
        rows = pq.read_table(path).to_pylist()
        assert {r["kernel_source"] for r in rows} == labels[op]
        assert all(r["latency"] > 0 and r["op_name"] == op for r in rows)
        for r in rows:  # the stage column names the kernel the label does
            assert (r["stage"] == "conv") == ("conv1d" in r["kernel_source"]), r
            assert r["num_tokens"] == r["batch_size"] * r["seq_len"]
    assert "each matching its label" in done.stdout  # the ATen ops each row ran are those its label names
    checked = run_cli("check", str(tables))
    assert checked.returncode == 0 and "R9" not in checked.stdout + checked.stderr, checked.stdout[-2000:]
    assert run_cli("verify", str(tables)).returncode == 0
