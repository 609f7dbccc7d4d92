"""Behaviours of the planning code (plans/, cases/) that no other test held exactly: each test here fails with a
small plausible bug planted in the function its docstring names."""

from __future__ import annotations

from types import SimpleNamespace

from opcollect.cases.grids_sparse import GenerationSweep, ModuleSweep
from opcollect.plans.cost import CaseCost
from opcollect.plans.deal import deal
from opcollect.plans.diff import OpView, _diff_op
from opcollect.plans.sparse_sweeps import generation_shapes, prefill_shapes, rank_heads, sm_major
from opcollect.plans.work import causal_pairs

SWEEP = {
    "backends": ["sglang"],
    "models": [{"model": "m", "profile": "p"}],
    "precisions": [{"mla_dtype": "bfloat16", "kv_cache_dtype": "bfloat16"}],
    "num_heads": [8],
    "batch_size": [1, 2, 4],
    "max_tokens": 16,
}


def _generation(**more) -> GenerationSweep:
    fields = {**SWEEP, "step": [4, 8], "long": {"from_length": 8, "max_batch": 1}, **more}
    return GenerationSweep.model_validate(fields)


# ---- plans/sparse_sweeps.py ------------------------------------------------------------------------------------


def test_generation_shapes_cap_tokens_long_steps_and_context_at_their_edges():
    """generation_shapes: batch x step <= max_tokens, the long cap from from_length on, steps below the context."""
    sweep = _generation(batch_one_steps=[3, 4], step_ceilings=[10, 1])
    # (2, 8): 16 tokens fit but step 8 is long and batch 2 over its cap 1; (4, 4) is 16 tokens, at the cap; (4, 8) 32;
    # extras: 3, 4 (already (1, 4)), 10 - 1 = 9 (not below the context of 9) and 1 - 1 = 0 (no step)
    assert generation_shapes(sweep, 9) == [(1, 3), (1, 4), (1, 8), (2, 4), (4, 4)]
    # with the new token counted, (4, 4) takes 4 x 5 = 20 > 16; with no context bound step 9 is planned
    counted = _generation(batch_one_steps=[3, 4], step_ceilings=[10, 1], cap_counts_new_token=True)
    assert generation_shapes(counted, None) == [(1, 3), (1, 4), (1, 8), (1, 9), (2, 4)]


def test_prefill_shapes_keep_the_context_and_kv_edges_and_order_by_batch_then_prefix():
    """prefill_shapes: p + isl <= context and batch x (p + isl) <= KV cap inclusive, no negative prefix, sorted."""
    base = [(1, 4), (2, 4), (1, 8)]
    # ceilings: 12 - 4 = 8 is a new prefix ((2, 4, 8) holds 24 KV tokens: over), 12 - 8 = 4 is listed; 6 - 4 = 2,
    # and 6 - 8 = -2 is no prefix at all
    assert prefill_shapes(base, [0, 4], [12, 6], 12, 16) == [
        (1, 4, 0),
        (1, 8, 0),
        (1, 4, 2),
        (1, 4, 4),
        (1, 8, 4),
        (1, 4, 8),
        (2, 4, 0),
        (2, 4, 2),
        (2, 4, 4),
    ]


def test_rank_heads_divide_the_model_heads_and_come_most_heads_first():
    """rank_heads: heads / tp where tp divides the heads and the quotient is swept; else num_heads at tp 1."""
    swept = ModuleSweep.model_validate({**SWEEP, "num_heads": [1, 6, 12, 24], "tp_sizes": [1, 2, 4, 16]})
    # 24 / 16 = 1 (rounded down) is swept, but 16 does not divide 24
    assert rank_heads(swept, SimpleNamespace(heads=24)) == [(24, 1), (12, 2), (6, 4)]
    direct = ModuleSweep.model_validate({**SWEEP, "num_heads": [2, 8, 32]})
    assert rank_heads(direct, SimpleNamespace(heads=24)) == [(32, 1), (8, 1), (2, 1)]


def test_sm_major_is_the_compute_capability_major():
    """sm_major: SM90 -> 9, SM100/103 -> 10, SM120 -> 12, a non-numeric SM (the CPU) -> 0."""
    assert [sm_major(sm) for sm in ("80", "90", "100", "103", "120", "cpu")] == [8, 9, 10, 10, 12, 0]


# ---- plans/work.py ---------------------------------------------------------------------------------------------


def test_causal_pairs_under_a_window_narrower_than_the_prefix():
    """causal_pairs: query i sees min(prefix + i, window) keys, a window under the prefix included."""
    # prefix 10, window 5: every one of the 4 queries sees 5 keys
    assert causal_pairs(4, 10, 5) == 20
    # prefix 2, window 5: queries see 3, 4, 5, 5 keys
    assert causal_pairs(4, 2, 5) == 17
    # a window of prefix + queries, or none, keeps the full causal count: 4 x 2 + 4 x 5 / 2 = 18
    assert causal_pairs(4, 2, 6) == causal_pairs(4, 2, 0) == 18


# ---- plans/deal.py ---------------------------------------------------------------------------------------------


def test_deal_hands_out_the_costliest_unit_first_to_the_least_loaded_shard():
    """deal: LPT, costliest unit first, each to the shard with the least seconds so far, ties to the lower shard."""
    units = {
        "gemm": [("g1", CaseCost(1.0, 1)), ("g2", CaseCost(1.0, 1)), ("g3", CaseCost(2.0, 1))],
        "moe": [("m1", CaseCost(3.0, 1))],
    }
    dealt = deal(units, 2)
    # m1 (3 s) to shard 0, g3 (2 s) to shard 1, g1 to shard 1 (2 < 3), g2 to either at 3 s: the lower, shard 0
    assert dealt.owner == {"gemm": [1, 0, 1], "moe": [0]}
    assert dealt.seconds == (4.0, 3.0)
    assert dealt.balance == 4.0 / 3.5


# ---- plans/diff.py ---------------------------------------------------------------------------------------------


def test_diff_of_plan_rows_names_added_removed_then_changed_cases():
    """_diff_op: with rows on both sides, a case whose dispatch or row moved is changed; examples list them in turn."""
    old = OpView(cases=3, rows={"c1": ("x", "r1"), "c2": ("x", "r2"), "c3": ("x", "r3")})
    new = OpView(cases=3, rows={"c2": ("y", "r2"), "c3": ("x", "r3"), "c4": ("x", "r4")})
    d = _diff_op("gemm", old, new)
    assert (d.added, d.removed, d.changed) == (1, 1, 1)
    assert d.examples == ("c4", "c1", "c2")
    assert not _diff_op("gemm", old, old).differs
