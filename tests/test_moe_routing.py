"""MoE token routing (opcollect.backends.torch.routing, through moe.routing that every backend calls): the
reference collector's balanced and power-law distributions, deterministic per case, built on the CPU."""

from __future__ import annotations

import math
import random
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from opcollect.backends.torch import routing as R  # noqa: E402
from opcollect.backends.torch.moe import local_routes, routing  # noqa: E402
from opcollect.plans.moe import MoeCase  # noqa: E402


def case(tokens, experts, topk, ep, distribution):
    return MoeCase("bfloat16", tokens, 1024, 512, topk, experts, 1, ep, distribution)


def rank0_share(ids, experts, ep) -> float:
    """Share of the (token, k) pairs whose expert is EP rank 0's (experts [0, E / ep)): the timed rank's load."""
    return (ids < experts // ep).double().mean().item()


# Issue 20 item 9: the reference generator (aiconfigurator collector/helper.py:1343-1442, five draws averaged) puts
# about these shares on the timed rank, at 4096 tokens and top-8; index-weighted routing put 0.61, 0.71 and 0.77.
REFERENCE_SHARES = [(256, 8, "power_law_1.01", 0.19), (256, 8, "power_law_1.2", 0.21), (128, 4, "power_law_1.2", 0.38)]


@pytest.mark.parametrize(("experts", "ep", "distribution", "reference"), REFERENCE_SHARES)
def test_timed_rank_share_matches_the_reference_generator(experts, ep, distribution, reference):
    ids = routing(case(4096, experts, 8, ep, distribution))
    assert abs(rank0_share(ids, experts, ep) - reference) <= 0.03


def test_the_timed_rank_is_the_busiest():
    for tokens, experts, topk, ep in [(1, 256, 8, 8), (16, 128, 8, 4), (4096, 256, 8, 8), (16384, 128, 8, 4),
                                      (512, 512, 10, 64), (1024, 16, 1, 4)]:  # fmt: skip
        for distribution in ("power_law_1.01", "power_law_1.2"):
            counts = R.case_counts(tokens, experts, topk, ep, distribution)
            per_rank = experts // ep
            loads = [sum(counts[r * per_rank : (r + 1) * per_rank]) for r in range(ep)]
            assert loads[0] == max(loads), (tokens, experts, ep, distribution)


CASES = [
    case(1, 256, 8, 8, "power_law_1.2"),
    case(3, 16, 4, 1, "power_law_1.01"),
    case(64, 512, 10, 64, "power_law_1.2"),
    case(700, 16, 1, 2, "power_law_1.2"),
    case(16384, 128, 8, 4, "power_law_1.2"),  # the overflow above num_tokens per expert is spread back
    case(5, 256, 8, 8, "balanced"),
    case(100, 512, 10, 16, "balanced"),
]


@pytest.mark.parametrize("c", CASES, ids=lambda c: f"{c.num_tokens}x{c.num_experts}k{c.topk}ep{c.moe_ep_size}")
def test_every_token_takes_topk_distinct_experts(c):
    ids = routing(c)
    assert ids.shape == (c.num_tokens, c.topk) and ids.dtype == torch.int64 and ids.device.type == "cpu"
    assert 0 <= ids.min() and ids.max() < c.num_experts
    assert (ids.sort(-1).values.diff(dim=-1) > 0).all()  # topk distinct experts per token
    counts = torch.bincount(ids.flatten(), minlength=c.num_experts)
    assert counts.sum() == c.num_tokens * c.topk and counts.max() <= c.num_tokens


def test_routing_is_deterministic_per_case_and_leaves_global_rng_alone():
    c = case(2048, 256, 8, 8, "power_law_1.2")
    first = routing(c)
    saved = torch.get_rng_state(), random.getstate()
    try:
        R.case_counts.cache_clear()
        torch.manual_seed(1234)
        random.seed(99)
        assert torch.equal(routing(c), first)  # drawn afresh under other global seeds
        torch_state, python_state = torch.get_rng_state(), random.getstate()
        routing(c._replace(num_tokens=2049))
        assert torch.equal(torch.get_rng_state(), torch_state) and random.getstate() == python_state
    finally:
        torch.set_rng_state(saved[0])
        random.setstate(saved[1])
    # the same routing for every dtype and expert shape of a case: only tokens, experts, topk, ep and distribution
    assert torch.equal(routing(c._replace(moe_dtype="fp8", hidden_size=7168, inter_size=2048, moe_tp_size=2)), first)
    assert not torch.equal(routing(c._replace(distribution="power_law_1.01")), first)


def test_routing_is_the_same_in_another_process():
    """Seeds go through SHA-512, not hash(): a fresh interpreter with another hash seed draws the same counts."""
    code = "from opcollect.backends.torch.routing import case_counts; print(sum(case_counts(4096, 256, 8, 8, 'power_law_1.2')[:32]))"  # noqa: E501
    here = sum(R.case_counts(4096, 256, 8, 8, "power_law_1.2")[:32])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "12345", "PYTHONPATH": ":".join(sys.path)})  # fmt: skip
    assert int(out.stdout) == here


@pytest.mark.parametrize("distribution", ["balanced", "power_law_1.01"])
def test_routing_is_built_on_the_cpu_under_a_device_context(distribution):
    """Runners build inside ``torch.device(device)`` (issue 20 item 2): nothing may land on that device until the
    end, where ``device`` moves the result."""
    c = case(64, 128, 8, 4, distribution)
    plain = routing(c)
    R.case_counts.cache_clear()  # draw again inside the context
    with torch.device("meta"):
        inside = routing(c)
        moved = routing(c, device="meta")
    assert inside.device.type == "cpu" and torch.equal(inside, plain)
    assert moved.device.type == "meta" and moved.shape == plain.shape


def test_balanced_routing_stays_balanced():
    # aiconfigurator balanced_logits: token t takes t + k * ceil(E / topk), so each token has one pair per rank of 8
    for tokens in (1, 2, 3, 8, 64, 100, 4096):
        ids = routing(case(tokens, 256, 8, 8, "balanced"))
        per_rank = torch.bincount(ids.flatten() // 32, minlength=8)
        assert per_rank.tolist() == [tokens] * 8, tokens
    ids = routing(case(4096, 256, 8, 8, "balanced"))
    assert torch.bincount(ids.flatten(), minlength=256).tolist() == [128] * 256
    counts, _ = local_routes(case(1, 256, 8, 8, "balanced"))
    assert sum(counts) == 1  # one of the token's eight pairs on the timed rank, not all eight


def test_power_law_samples_follow_the_truncated_law():
    alpha, xmin, xmax = 1.2, 1.0, 1000.0
    samples = R.sample_power_law(random.Random(7), 20000, alpha, xmin, xmax)
    assert xmin <= min(samples) and max(samples) <= xmax
    lo, hi = xmin ** (1 - alpha), xmax ** (1 - alpha)
    for x in (1.5, 3.0, 10.0, 50.0, 300.0):
        cdf = (x ** (1 - alpha) - lo) / (hi - lo)
        assert abs(sum(s <= x for s in samples) / len(samples) - cdf) < 0.015, x


def test_counts_are_the_scaled_samples_up_to_the_remainder():
    tokens, experts, topk, ep, alpha = 1024, 256, 8, 8, 1.2
    rng = random.Random(3)
    state = rng.getstate()
    counts = R.power_law_counts(tokens, experts, topk, ep, alpha, rng)
    rng.setstate(state)
    samples = R.sample_power_law(rng, experts, alpha, 1.0, tokens * 0.8)
    scaled = [round(s / sum(samples) * tokens * topk) for s in samples]
    assert max(scaled) <= tokens  # no clamping in this draw: only the rounding remainder is spread
    per_rank = experts // ep
    # the busiest rank swapped into rank 0 permutes whole ranks: compare rank by rank, as multisets of ranks
    ours = sorted(tuple(counts[r * per_rank : (r + 1) * per_rank]) for r in range(ep))
    theirs = sorted(tuple(scaled[r * per_rank : (r + 1) * per_rank]) for r in range(ep))
    moved = sum(abs(a - b) for x, y in zip(ours, theirs) for a, b in zip(x, y))
    assert sum(counts) == tokens * topk and moved == abs(tokens * topk - sum(scaled))


def step_by_step(ranks, remaining, bound, step):
    """aiconfigurator's _round_robin_adjust_per_rank (helper.py:1314-1340) one move at a time."""
    ranks = [list(r) for r in ranks]
    while remaining > 0:
        progressed = False
        for local in ranks:
            valid = [i for i, c in enumerate(local) if (c < bound if step > 0 else c > 0)]
            if not valid:
                continue
            pick = min if step > 0 else max
            chosen = pick(valid, key=lambda i: local[i])  # first extreme, as torch.argmin / argmax
            local[chosen] += step
            remaining -= 1
            progressed = True
            if remaining == 0:
                break
        if not progressed:
            break
    return ranks


def test_round_robin_closed_form_matches_the_step_by_step_loop():
    rng = random.Random(11)
    for _ in range(400):
        ep, per_rank, bound = rng.randint(1, 6), rng.randint(1, 9), rng.randint(1, 12)
        ranks = [[rng.randint(0, bound) for _ in range(per_rank)] for _ in range(ep)]
        step = rng.choice((1, -1))
        room = sum(bound - c for r in ranks for c in r) if step > 0 else sum(map(sum, ranks))
        remaining = rng.randint(0, room)
        fast = [list(r) for r in ranks]
        R._round_robin(fast, remaining, bound, step)
        assert fast == step_by_step(ranks, remaining, bound, step), (ranks, remaining, bound, step)


def test_unknown_distribution_is_refused():
    for bad in ("uniform", "power_law_1", "zipf_1.2"):
        with pytest.raises(ValueError):
            routing(case(8, 16, 2, 1, bad))
    assert math.isclose(R.alpha_of("power_law_1.01"), 1.01) and R.alpha_of("balanced") is None
