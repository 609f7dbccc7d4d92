"""Attention plans: head dims and windows, the dtype pairs each framework runs, fp8 KV caches from SM89, the
context and generation caps, and coverage of the reference H200 tables (slices in tests/data/reference)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import cases_of
from pydantic import ValidationError

from opcollect.cases.grids import GenerationAttentionGrid, ModelHeads
from opcollect.plans import skips
from opcollect.plans.attention import AttentionCase, generation_steps, head_configs
from opcollect.plans.planner import PlanOptions

REFERENCE = Path(__file__).parent / "data" / "reference" / "attention_slices"
VERSIONS = {"vllm": "0.24.0", "sglang": "0.5.14", "trtllm": "1.3.0rc20"}
FRAMEWORKS = tuple(VERSIONS)
ATTENTION = ("attention_context", "attention_generation")
# head_dim -> the windows planned with it (GPU grids)
WINDOWS = {64: {0, 128}, 128: {0, 128, 512, 8192}, 192: {0, 128}, 256: {0, 1024}, 512: {0}}


@pytest.fixture(scope="module")
def plans(planner):
    """The attention plan of one (backend, SM), planned once per module."""
    cache: dict = {}

    def get(backend: str, sm: str):
        if (backend, sm) not in cache:
            cache[(backend, sm)] = planner.plan(backend, sm, PlanOptions(ops=ATTENTION))
        return cache[(backend, sm)]

    return get


def cases(plans, backend, sm, op):
    return cases_of(plans(backend, sm).ops[op])


def pairs(found) -> set[tuple[str, str]]:
    return {(c.attn_dtype, c.kv_cache_dtype) for c in found}


# -- head dims and windows -------------------------------------------------------------------------


@pytest.mark.parametrize("backend", FRAMEWORKS)
@pytest.mark.parametrize("op", ATTENTION)
def test_head_dims_and_their_windows_at_sm90(plans, backend, op):
    found: dict[int, set[int]] = {}
    for c in cases(plans, backend, "90", op):
        found.setdefault(c.head_dim, set()).add(c.window_size)
    # model profiles may add more; these are the reference's and the serving models' of the grid, but for TensorRT-LLM's
    # head_dim 512, which its TRTLLM backend cannot run on SM90 (skip trtllm-attention-head-dim-over-256)
    wanted = {h: w for h, w in WINDOWS.items() if not (backend == "trtllm" and h == 512)}
    assert all(windows <= found.get(head_dim, set()) for head_dim, windows in wanted.items()), found
    assert backend != "trtllm" or 512 not in found


def test_model_heads_split_per_rank(planner):
    grid = planner.sources.grids["attention_generation"].grid
    configs, origins = head_configs(grid, {})
    # Gemma-4-31B sliding layers (32 heads, 16 kv heads): kv heads replicate once there are more ranks than kv heads
    assert {(32, 16, 256, 1024), (2, 1, 256, 1024), (1, 1, 256, 1024)} <= set(configs)
    assert origins[(1, 1, 256, 1024)] >= {"Gemma-4-31B sliding layers"}
    assert (8, 1, 192, 0) in configs and (16, 2, 512, 0) in configs  # MiMo-V2-Flash at tp 8, gemma-4 global at tp 1
    assert (64, 8, 128, 0) not in origins  # a config of the generic sweep has no model origin
    # the sweep crosses 12 and 40 heads with 8 kv heads; only kv heads that divide the query heads are kept
    assert all(heads % kv == 0 for heads, kv, _, _ in configs)
    assert (12, 4, 128, 0) in configs and (12, 8, 128, 0) not in configs and (40, 8, 128, 0) in configs
    with pytest.raises(ValidationError, match="kv_heads 3 must divide num_heads 8"):
        ModelHeads(model="x", num_heads=8, kv_heads=3, head_dim=128, tp_sizes=[1])


# -- dtype pairs per framework ---------------------------------------------------------------------


def test_vllm_plans_no_fp8_query_and_no_fp8_kv_on_fa4(plans):
    plan = plans("vllm", "90")
    for op in ATTENTION:
        found = cases(plans, "vllm", "90", op)
        assert pairs(found) == {("bfloat16", "bfloat16"), ("bfloat16", "fp8")}, op
        assert {c.kv_cache_dtype for c in found if c.head_dim == 512} == {"bfloat16"}, op
        assert {c.kv_cache_dtype for c in found if c.head_dim == 256} == {"bfloat16", "fp8"}, op
        assert plan.ops[op].skipped["vllm-fa4-no-fp8-kv-on-sm90"] > 0
    assert plan.ops["attention_context"].skipped["vllm-no-fp8-query-input"] > 0
    # on SM100 vLLM serves head_dim 512 through FLASHINFER, which takes an fp8 cache
    sm100 = cases(plans, "vllm", "100", "attention_generation")
    assert {c.kv_cache_dtype for c in sm100 if c.head_dim == 512} == {"bfloat16", "fp8"}


def test_sglang_fa3_keeps_bf16_query_on_fp8_cache_only_on_triton_configs(plans):
    context = cases(plans, "sglang", "90", "attention_context")
    assert pairs(context) == {("bfloat16", "bfloat16"), ("bfloat16", "fp8"), ("fp8", "fp8")}
    triton = {(c.head_dim, c.window_size) for c in context if (c.attn_dtype, c.kv_cache_dtype) == ("bfloat16", "fp8")}
    assert triton == {(256, 1024), (512, 0)}  # Gemma-4's layers
    assert any(c.head_dim == 128 and c.attn_dtype == "fp8" for c in context)
    assert plans("sglang", "90").ops["attention_context"].skipped["sglang-fa3-casts-query-to-fp8"] > 0
    # decode keeps the bf16 label with an fp8 cache, as the reference does
    generation = cases(plans, "sglang", "90", "attention_generation")
    assert pairs(generation) == {("bfloat16", "bfloat16"), ("bfloat16", "fp8")}
    assert any(c.head_dim == 128 and c.kv_cache_dtype == "fp8" for c in generation)


def test_sglang_other_backends_keep_the_pair_they_run(plans):
    flashinfer = cases(plans, "sglang", "89", "attention_context")  # bf16 query against the fp8 cache
    assert pairs(flashinfer) == {("bfloat16", "bfloat16"), ("bfloat16", "fp8")}
    trtllm_mha = cases(plans, "sglang", "100", "attention_context")  # quantizes the query itself
    assert pairs(trtllm_mha) == {("bfloat16", "bfloat16"), ("fp8", "fp8")}


def test_trtllm_context_runs_all_three_pairs(plans):
    assert pairs(cases(plans, "trtllm", "90", "attention_context")) == {
        ("bfloat16", "bfloat16"),
        ("bfloat16", "fp8"),
        ("fp8", "fp8"),
    }


@pytest.mark.parametrize("backend", [*FRAMEWORKS, "torch"])
@pytest.mark.parametrize("sm", ["80", "86"])
def test_fp8_kv_cache_is_skipped_below_sm89(plans, backend, sm):
    plan = plans(backend, sm)
    for op in ATTENTION:
        assert {c.kv_cache_dtype for c in cases(plans, backend, sm, op)} == {"bfloat16"}, op
        # the whole bf16/fp8 group goes to this entry: it precedes the torch and framework entries
        # (SGLang at SM89 keeps every bf16/fp8 case: its flashinfer skip is of fp8 queries only)
        assert plan.ops[op].skipped["fp8-kv-cache-needs-sm89"] == plans("sglang", "89").ops[op].by_dtype["bfloat16/fp8"]


@pytest.mark.parametrize("backend", FRAMEWORKS)
@pytest.mark.parametrize("sm", ["89", "90"])
def test_fp8_kv_cache_is_kept_from_sm89(plans, backend, sm):
    for op in ATTENTION:
        assert "fp8" in {c.kv_cache_dtype for c in cases(plans, backend, sm, op)}, op
        assert "fp8-kv-cache-needs-sm89" not in plans(backend, sm).ops[op].skipped


def test_framework_attention_skips_cite_their_source():
    reasons = skips.reasons()
    for entry in skips.SKIPS:
        if set(entry.keys.get("op", ())) & set(ATTENTION) and set(entry.keys.get("backend", ())) <= set(FRAMEWORKS):
            assert ".py:" in reasons[entry.name], entry.name


# -- caps ------------------------------------------------------------------------------------------


def small_generation_grid(**change) -> GenerationAttentionGrid:
    data = dict(
        precisions=[{"attn_dtype": "bfloat16", "kv_cache_dtype": "bfloat16"}],
        batch_size=[1, 2, 4, 8, 256, 512],
        step=[1023, 2047, 4095],
        heads=[{"num_heads": [16], "kv_heads": [2], "head_dim": [256]}],
        max_tokens_mha=2**23,
        max_tokens_gqa=2**24,
        model_tp_sizes=[1],
        min_batch_sizes_per_step=4,
        drop_longest_step_from_batch=256,
    )
    return GenerationAttentionGrid.model_validate({**data, **change})


def test_generation_cap_rule_by_hand():
    small = [(b, s) for b in (1, 2, 4, 8) for s in (1023, 2047, 4095)]
    # head_elements (vLLM, SGLang): 16 heads x head_dim 256 / 128 = 32 per cached token, so b x (step + 1) <= 2**24 / 32
    # = 524288: step 1023 fits b <= 512, 2047 b <= 256, 4095 b <= 128 (still 4 batch sizes); 256 and 512 then leave
    # out their longest step (2047 and 1023)
    head_elements = generation_steps(small_generation_grid(cap_rules=["head_elements"]), 16, 2, 256)
    assert sorted(head_elements) == sorted(small + [(256, 1023)])
    # heads (TRT-LLM, no head_dim term): b x (step + 1) <= 2**24 / 16 = 2**20
    heads = generation_steps(small_generation_grid(cap_rules=["heads"]), 16, 2, 256)
    assert sorted(heads) == sorted(small + [(256, 1023), (256, 2047), (512, 1023)])
    both = generation_steps(small_generation_grid(cap_rules=["head_elements", "heads"]), 16, 2, 256)
    assert set(both) == set(heads) | set(head_elements) and len(both) == len(set(both))
    # MHA halves the cap: 2**23 / 32 = 2**18, so step 1023 fits b <= 256 and 256 drops its only step
    assert sorted(generation_steps(small_generation_grid(cap_rules=["head_elements"]), 16, 16, 256)) == sorted(small)
    # without a cap rule the cap counts tokens only: b x (step + 1) <= 2**24 fits every pair here
    flat = small_generation_grid(min_batch_sizes_per_step=1, drop_longest_step_from_batch=None)
    assert len(generation_steps(flat, 16, 2, 256)) == 18


def test_generation_cap_scales_with_heads_and_head_dim(plans):
    found = cases(plans, "vllm", "90", "attention_generation")

    def steps(heads, kv, head_dim, batch):
        config = (batch, heads, kv, head_dim, 0)
        return {c.step for c in found if (c.batch_size, *c[2:5], c.window_size) == config}

    # 64 heads x 128 / 128: b x (step + 1) <= 2**24 / 64 = 262144; 4 batch sizes (1..8) fit up to step 32767
    assert max(steps(64, 8, 128, 1)) == 32767
    # b = 2048 fits up to step 127, which it leaves out as its longest
    assert max(steps(64, 8, 128, 2048)) == 63
    # head_dim 64 doubles the cap
    assert max(steps(64, 8, 64, 1)) == 65535 and max(steps(64, 8, 64, 2048)) == 127


def test_context_caps(plans):
    found = cases(plans, "trtllm", "90", "attention_context")
    assert max(c.batch_size for c in found if c.num_heads == c.num_key_value_heads) == 128
    assert max(c.batch_size for c in found if c.num_heads != c.num_key_value_heads) == 256

    def most_tokens(*config):
        return max(c.batch_size * c.isl for c in found if (c.num_heads, c.num_key_value_heads, c.head_dim) == config)

    assert most_tokens(8, 1, 128) == 131072 and most_tokens(8, 8, 128) == 65536
    # 96 MHA heads x head_dim 256 x 2 (K and V) x tokens stays below 2**31 - 1: at most 43690 tokens, so 4 x 10240
    assert most_tokens(96, 96, 256) == 40960


def test_cpu_grids_stay_tiny(plans):
    for op in ATTENTION:
        found = cases(plans, "torch", "cpu", op)
        assert 0 < len(found) <= 200, op
        assert max(c.batch_size * (c.isl + c.step) for c in found) <= 32768, op


# -- coverage of the reference ---------------------------------------------------------------------


@pytest.mark.parametrize("backend", FRAMEWORKS)
@pytest.mark.parametrize("op", ATTENTION)
def test_sm90_plans_cover_the_reference_slices(plans, backend, op):
    kind = op.split("_")[1]
    table = pq.read_table(REFERENCE / backend / VERSIONS[backend] / f"{kind}_attention_perf.parquet")
    reference = set(zip(*(table.column(name).to_pylist() for name in AttentionCase._fields)))
    planned = set(map(tuple, plans(backend, "90").ops[op].values))
    covered = len(reference & planned) / len(reference)
    assert len(reference) > 2000 and covered >= 0.99, (backend, op, covered, sorted(reference - planned)[:5])
