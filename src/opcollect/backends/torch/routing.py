"""Token-to-expert routing of a MoE case, drawn as the reference collector draws it.

The reference is ai-dynamo/aiconfigurator at 095f58a5 (AIC below), collector/helper.py, which the vLLM, SGLang and
TensorRT-LLM collectors all call with (num_tokens, num_experts, topk, moe_ep_size, alpha):

- ``balanced``: ``balanced_logits`` (helper.py:1051-1067): token t takes experts t + k * ceil(E / topk) (mod E),
  or t * stride / num_tokens + k * stride when there are fewer tokens than the stride, so every EP rank gets its
  share even at batch 1.
- ``power_law_<alpha>``: ``_generate_power_law_distribution`` (helper.py:1343-1442): per-expert counts drawn from a
  power law truncated to [1, 0.8 * num_tokens] (to [0.01, 2] when num_tokens * topk <= E; ``sample_power_law``,
  helper.py:1070-1085), scaled and rounded to num_tokens * topk pairs, clamped to num_tokens per expert with the
  overflow and the rounding remainder spread rank by rank (``_round_robin_adjust_per_rank``, helper.py:1314-1340),
  then the busiest EP rank's experts swapped into rank 0, the timed rank. ``_assign_experts_from_counts``
  (helper.py:1288-1311) turns the counts into ids: experts by count descending, each repeated by its count,
  filled column by column into [topk, num_tokens] and transposed, so no token takes an expert twice.

The reference times five such draws per case and reports the mean (vllm/collect_moe.py:729-772,
trtllm/collect_moe.py:711-754, sglang/collect_moe.py:745-769, five rank-0 workloads at EP > 1 :1115-1126). One
routing is timed here, so of DRAWS draws seeded from the case we take the one whose load on rank 0 is nearest the
mean over them: the expectation that the reference's five-draw mean estimates, met by a real draw's shape.
Everything is drawn on the CPU from generators of our own (no global RNG state, no device), so a case routes alike
in every process and under any ``torch.device`` context.
"""

from __future__ import annotations

import math
import random
from functools import lru_cache

DRAWS = 64  # draws per power-law case: their mean rank-0 load is within about 0.01 of the expectation


def alpha_of(distribution: str) -> float | None:
    """The power-law exponent of ``power_law_<alpha>``; None for ``balanced``."""
    if distribution == "balanced":
        return None
    prefix, _, value = distribution.rpartition("_")
    if prefix != "power_law":
        raise ValueError(f"unknown token distribution {distribution!r}")
    alpha = float(value)
    if alpha == 1.0:
        raise ValueError("a power law needs alpha != 1 (the reference's inverse CDF divides by 1 - alpha)")
    return alpha


def sample_power_law(rng: random.Random, size: int, alpha: float, xmin: float, xmax: float) -> list[float]:
    """Inverse-CDF draws from x^-alpha on [xmin, xmax] (helper.py:1070-1085)."""
    lo, hi = xmin ** (1 - alpha), xmax ** (1 - alpha)
    return [((hi - lo) * rng.random() + lo) ** (1 / (1 - alpha)) for _ in range(size)]


def _level(values: list[int], n: int) -> list[int]:
    """``values`` after n times "add 1 to the first minimum" (callers keep n within what the bound allows): the
    lowest entries rise to a common level, and what is left over goes to the entries at that level in index order,
    as repeated ``torch.argmin`` (first minimum) picks them."""
    order = sorted(range(len(values)), key=lambda i: (values[i], i))
    level, used, group = values[order[0]], 0, 1
    while group < len(order) and used + (values[order[group]] - level) * group <= n:
        used += (values[order[group]] - level) * group
        level = values[order[group]]
        group += 1
    rise, extra = divmod(n - used, group)
    level += rise
    out = list(values)
    for rank_in_level, i in enumerate(sorted(order[:group])):
        out[i] = level + (rank_in_level < extra)
    return out


def _round_robin(ranks: list[list[int]], remaining: int, bound: int, step: int) -> None:
    """``_round_robin_adjust_per_rank`` (helper.py:1314-1340) in closed form: pass over the ranks in order, each
    rank that still can moving one count by ``step`` (+1: its first smallest count below ``bound``; -1: its first
    largest count above 0), until ``remaining`` moves are made."""
    room = [sum(bound - c for c in local) if step > 0 else sum(local) for local in ranks]
    given = [0] * len(ranks)
    while remaining > 0:
        active = [r for r in range(len(ranks)) if room[r] > given[r]]
        if not active:
            break
        passes = min(min(room[r] - given[r] for r in active), remaining // len(active))
        if passes == 0:
            for r in active[:remaining]:
                given[r] += 1
            break
        for r in active:
            given[r] += passes
        remaining -= passes * len(active)
    for r, moves in enumerate(given):
        if moves and step > 0:
            ranks[r][:] = _level(ranks[r], moves)
        elif moves:  # lower the largest counts: raise the negated ones, same first-index ties
            ranks[r][:] = [-c for c in _level([-c for c in ranks[r]], moves)]


def power_law_counts(tokens: int, experts: int, topk: int, ep: int, alpha: float, rng: random.Random) -> list[int]:
    """Pairs per expert, summing to tokens * topk, none above tokens, the busiest EP rank's experts first
    (helper.py:1343-1436)."""
    if tokens * topk > experts:
        samples = sample_power_law(rng, experts, alpha, 1.0, tokens * 0.8)
    else:
        samples = sample_power_law(rng, experts, alpha, 0.01, 2.0)
    target, total = tokens * topk, sum(samples)
    counts = [round(s / total * target) for s in samples]  # round half to even, as torch.round
    overflow = sum(max(c - tokens, 0) for c in counts)
    per_rank = experts // ep
    ranks = [[min(c, tokens) for c in counts[r * per_rank : (r + 1) * per_rank]] for r in range(ep)]
    if overflow:
        _round_robin(ranks, overflow, tokens, +1)
    delta = target - sum(map(sum, ranks))
    if delta:
        _round_robin(ranks, abs(delta), tokens, 1 if delta > 0 else -1)
    busiest = max(range(ep), key=lambda r: (sum(ranks[r]), -r))  # first maximum, as torch.argmax
    ranks[0], ranks[busiest] = ranks[busiest], ranks[0]
    return [c for local in ranks for c in local]


@lru_cache(maxsize=256)
def case_counts(tokens: int, experts: int, topk: int, ep: int, distribution: str) -> tuple[int, ...]:
    """The power-law counts this case times: of DRAWS draws seeded from the case, the one whose rank-0 pairs are
    nearest their mean (the first such)."""
    alpha = alpha_of(distribution)
    if alpha is None:
        raise ValueError("balanced routing has no drawn counts")
    per_rank = experts // ep
    draws = []
    for i in range(DRAWS):
        # a str seed goes through SHA-512 (random.seed version 2): the same stream in every process and platform
        rng = random.Random(f"opcollect.moe.routing:{tokens}:{experts}:{topk}:{ep}:{distribution}:{i}")
        draws.append(power_law_counts(tokens, experts, topk, ep, alpha, rng))
    loads = [sum(d[:per_rank]) for d in draws]
    mean = sum(loads) / len(loads)
    return tuple(draws[min(range(DRAWS), key=lambda i: (abs(loads[i] - mean), i))])


def expert_ids(case):
    """[num_tokens, topk] int64 expert ids on the CPU, whatever the default device."""
    import torch

    tokens, topk, experts = case.num_tokens, case.topk, case.num_experts
    cpu = torch.device("cpu")
    if alpha_of(case.distribution) is None:
        stride = math.ceil(experts / topk)
        t = torch.arange(tokens, dtype=torch.int64, device=cpu).unsqueeze(1)
        k = torch.arange(topk, dtype=torch.int64, device=cpu).unsqueeze(0)
        first = t if tokens >= stride else t * stride // tokens  # the reference's float t*stride/n, truncated
        return (first + k * stride) % experts
    counts = case_counts(tokens, experts, topk, case.moe_ep_size, case.distribution)
    order = sorted(range(experts), key=lambda e: (-counts[e], e))  # count descending; ties by id (AIC: unstable)
    flat = torch.repeat_interleave(
        torch.tensor(order, dtype=torch.int64, device=cpu),
        torch.tensor([counts[e] for e in order], dtype=torch.int64, device=cpu),
    )
    return flat.view(topk, tokens).t().contiguous()
