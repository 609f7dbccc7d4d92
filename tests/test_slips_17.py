"""The sparse-attention and mHC plans' least-work formulas, ranking costs and per-case dispatch edges that no earlier
test held exactly: DSA's sparse pairs and module work, GLM-5's kernel work, MSA's module work, mHC's work and cost,
and SGLang's dense-prefill thresholds: each test here fails with a small plausible bug planted in the function it
names."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from opcollect.plans import dsa, dsa_kernels, mhc, mla, msa
from opcollect.plans.mla_module import MlaModuleCase

V32, GLM = "DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM"


def _brute_pairs(queries: int, prefix: int, topk: int) -> int:
    return sum(min(topk, prefix + i) for i in range(1, queries + 1))


def _brute_causal(queries: int, prefix: int) -> int:
    return sum(prefix + i for i in range(1, queries + 1))


# ---- plans/dsa.py ------------------------------------------------------------------------------------------------


def test_sparse_pairs_caps_each_query_at_topk():
    """dsa.sparse_pairs: query i after prefix cached tokens reads min(topk, prefix + i) keys."""
    assert dsa.sparse_pairs(5, 2, 4) == 3 + 4 + 4 + 4 + 4
    assert dsa.sparse_pairs(3, 0, 10) == 6
    assert dsa.sparse_pairs(3, 10, 4) == 12
    assert dsa.sparse_pairs(3, 4, 5) == 15  # the first query already sees exactly topk
    assert dsa.sparse_pairs(4, 3, 5) == 4 + 5 + 5 + 5
    for q in (1, 2, 7):
        for p in (0, 1, 5, 9):
            assert dsa.sparse_pairs(q, p, 6) == _brute_pairs(q, p, 6), (q, p)


def _dsa(**kw):
    base = dict(
        op_name="dsa_generation_module",
        model="m",
        architecture=V32,
        mla_dtype="bfloat16",
        kv_cache_dtype="fp8",
        gemm_type="bfloat16",
        num_heads=16,
        batch_size=2,
        isl=1,
        tp_size=1,
        step=100,
    )
    return dsa.DsaModuleCase(**{**base, **kw})


# DeepSeek-V3.2: hidden 7168, q_lora 1536, nope 128, rope 64, v 128; latent 576, kv_lora 512
_V32_WEIGHTS = 7168 * (1536 + 576) + 1536 * 16 * 192 + 512 * 16 * 256 + 16 * 128 * 7168


def test_dsa_decode_within_topk_has_no_indexer_scoring():
    """dsa.work: a short decode counts weights (+wk), MLA pairs over step keys and the fp8 latents read, no scoring."""
    w = dsa.work(_dsa())
    weights = _V32_WEIGHTS + 7168 * 128  # wk
    assert w.flops == {"bfloat16": 2.0 * 2 * weights + 2.0 * 16 * 320 * (2 * 100)}
    assert w.bytes == weights * 2 + 2 * 7168 * 4 + 2 * 100 * 576 * 1
    skip = dsa.work(_dsa(op_name="dsa_generation_module_skip_indexer"))
    assert skip.flops == {"bfloat16": 2.0 * 2 * _V32_WEIGHTS + 2.0 * 16 * 320 * 200}
    assert skip.bytes == _V32_WEIGHTS * 2 + 2 * 7168 * 4 + 2 * 100 * 576


def test_dsa_long_decode_scores_every_key_with_the_indexer():
    """dsa.work: a decode past index_topk pays the indexer's projections, fp8 scoring of every key, and its keys."""
    w = dsa.work(_dsa(step=3000))
    weights = _V32_WEIGHTS + 7168 * 128
    score_weights = 1536 * 64 * 128 + 7168 * 64
    assert w.flops["bfloat16"] == 2.0 * 2 * weights + 2.0 * 16 * 320 * (2 * 2048) + 2.0 * 2 * score_weights
    assert w.flops["fp8"] == 2.0 * 64 * 128 * (2 * 3000)
    read = 2 * 2048 * 576
    assert w.bytes == weights * 2 + 2 * 7168 * 4 + read + score_weights * 2 + 2 * 3000 * 128
    skip = dsa.work(_dsa(step=3000, op_name="dsa_generation_module_skip_indexer"))
    assert set(skip.flops) == {"bfloat16"}
    assert skip.bytes == _V32_WEIGHTS * 2 + 2 * 7168 * 4 + read


def test_dsa_prefill_straddling_topk_scores_only_the_queries_past_it():
    """dsa.work: isl 4 after 2046 cached: 2 queries keep every key, 2 are scored over 2049 and 2050 keys."""
    w = dsa.work(_dsa(op_name="dsa_context_module", batch_size=1, isl=4, step=2046, mla_dtype="fp8", gemm_type="fp8"))
    weights = _V32_WEIGHTS + 7168 * 128
    score_weights = 1536 * 64 * 128 + 7168 * 64
    pairs = 2047 + 2048 + 2048 + 2048
    gemm = 2.0 * 4 * weights + 2.0 * 2 * score_weights
    assert w.flops == {"fp8": gemm + 2.0 * 16 * 320 * pairs + 2.0 * 64 * 128 * (2049 + 2050)}
    assert w.bytes == weights + 4 * 7168 * 4 + 2048 * 576 + score_weights + 2050 * 128


def test_dsa_cost_sums_work_or_falls_back_to_tokens_and_keys():
    """dsa.cost: FLOPs plus bytes; batch x isl x (step + isl) x heads for an architecture without dimensions."""
    c = _dsa()
    w = dsa.work(c)
    assert dsa.cost(c) == sum(w.flops.values()) + w.bytes
    assert dsa.work(c._replace(architecture="Other")) is None
    assert dsa.cost(c._replace(architecture="Other", isl=3, step=5)) == 2 * 3 * 8 * 16


def test_sglang_dense_prefill_thresholds_are_inclusive():
    """dsa._sglang_context: dense MHA while step + isl <= 2048 and batch x (step + isl) <= 128Ki, on 90 and 10x."""
    impl = "sglang_dsa_indexer_flashmla_sparse"
    at = _dsa(op_name="dsa_context_module", batch_size=64, isl=48, step=2000)  # 2048 keys, 131072 tokens
    assert dsa._sglang_context("90", impl, at) == "sglang_dsa_dense_mha_fa3"
    assert dsa._sglang_context("103", impl, at) == "sglang_dsa_dense_mha_trtllm_ragged"
    assert dsa._sglang_context("100", impl, at) == "sglang_dsa_dense_mha_trtllm_ragged"
    assert dsa._sglang_context("120", impl, at) == impl
    assert dsa._sglang_context("90", impl, at._replace(step=2001)) == impl
    assert dsa._sglang_context("90", impl, at._replace(batch_size=65)) == impl
    skip = at._replace(op_name="dsa_context_module_skip_indexer", step=2001)
    assert dsa._sglang_context("90", impl, skip) == "sglang_dsa_skip_indexer_flashmla_sparse"
    assert dsa._sglang_context("90", "FLASHMLA_SPARSE", at) == "FLASHMLA_SPARSE"


def test_sglang_impl_and_vllm_heads_per_sm_and_cache():
    """dsa._sglang_impl by cache, phase and SM; dsa._vllm_heads at 16 heads or fewer on SM100 only."""
    group = lambda kv: SimpleNamespace(constants={"kv_cache_dtype": kv})  # noqa: E731
    assert dsa._sglang_impl("90", group("fp8"), True) == "sglang_dsa_indexer_flashmla_kv"
    assert dsa._sglang_impl("100", group("fp8"), False) == "sglang_dsa_indexer_trtllm"
    assert dsa._sglang_impl("120", group("bfloat16"), True) == "sglang_dsa_indexer_flashmla_sparse"
    assert dsa._sglang_impl("120", group("fp8"), True) == "sglang_dsa_indexer_trtllm"  # major 10 and up
    assert dsa._sglang_impl("90", group("bfloat16"), False) == "sglang_dsa_indexer_fa3"
    assert dsa._sglang_impl("100", group("bfloat16"), False) == "sglang_dsa_indexer_trtllm"
    c = _dsa(num_heads=16)
    assert dsa._vllm_heads("100", "FLASHMLA_SPARSE", c) == "FLASHINFER_MLA_SPARSE"
    assert dsa._vllm_heads("103", "FLASHMLA_SPARSE", c) == "FLASHINFER_MLA_SPARSE"
    assert dsa._vllm_heads("100", "FLASHMLA_SPARSE", c._replace(num_heads=17)) == "FLASHMLA_SPARSE"
    assert dsa._vllm_heads("90", "FLASHMLA_SPARSE", c) == "FLASHMLA_SPARSE"


# ---- plans/dsa_kernels.py ----------------------------------------------------------------------------------------


def _glm5(**kw):
    base = dict(
        model="glm",
        architecture=GLM,
        mla_dtype="fp8_e4m3",
        kv_cache_dtype="fp8_e4m3",
        gemm_type="fp8_e4m3",
        num_heads=64,
        batch_size=2,
        isl=3,
        tp_size=1,
        step=2046,
        compress_ratio=1,
    )
    return dsa_kernels.Glm5Case(**{**base, **kw})


def test_glm5_mqa_logits_work():
    """dsa_kernels.mqa_work: 2 x 128 fp8 FLOPs per index head (32) per causal pair; queries, keys, fp32 logits."""
    c = _glm5()
    pairs = 2 * _brute_causal(3, 2046)
    w = dsa_kernels.mqa_work(c)
    assert w.flops == {"fp8": 2.0 * 32 * 128 * pairs}
    assert w.bytes == 6 * 32 * (128 + 4) + 2 * 2049 * 128 + pairs * 4
    assert dsa_kernels.mqa_work(c._replace(architecture="Other")) is None
    assert dsa_kernels.MQA_LOGITS.cost(c._replace(architecture="Other")) == 2 * 3 * 2049


def test_glm5_topk_and_sparse_attention_work():
    """dsa_kernels.topk_work reads every score and writes the chosen indices; attn_work over the top 2048 keys."""
    c = _glm5()
    pairs, chosen = 2 * _brute_causal(3, 2046), 2 * (2047 + 2048 + 2048)
    topk = dsa_kernels.topk_work(dsa_kernels.Glm5TopkCase(*c, score_mode="flat"))
    assert topk.flops == {} and topk.bytes == pairs * 4.0 + chosen * 4.0
    attn = dsa_kernels.attn_work(c)
    assert attn.flops == {"bfloat16": 2.0 * 64 * (192 + 64 + 256) * chosen}
    assert attn.bytes == 6 * 64 * (576 + 512) * 2 + 2 * 2048 * 576 * 2 + chosen * 4
    short = dsa_kernels.attn_work(c._replace(step=10))
    assert short.bytes == 6 * 64 * 1088 * 2 + 2 * 13 * 576 * 2 + 2 * (11 + 12 + 13) * 4


def test_glm5_topk_zero_latency_is_inclusive_of_topk():
    """dsa_kernels.TOPK.zero_latency: a request of at most 2048 tokens selects them all."""
    c = dsa_kernels.Glm5TopkCase(*_glm5(), score_mode="flat")
    assert dsa_kernels.TOPK.zero_latency(c._replace(step=2045))
    assert not dsa_kernels.TOPK.zero_latency(c._replace(step=2046))


# ---- plans/msa.py ------------------------------------------------------------------------------------------------


def _msa(**kw):
    base = dict(
        model="m3",
        architecture="MiniMaxM3ForCausalLM",
        mla_dtype="bfloat16",
        kv_cache_dtype="fp8",
        gemm_type="bfloat16",
        num_heads=32,
        batch_size=2,
        isl=3,
        tp_size=1,
        step=2046,
    )
    return MlaModuleCase(**{**base, **kw})


@pytest.mark.parametrize("heads", [32, 8])
def test_msa_module_work(heads):
    """msa.work: KV heads max(1, heads / 16), top 2048 tokens attended, every token scored by the index heads."""
    kv = max(1, heads // 16)
    c = _msa(num_heads=heads)
    weights = 6144 * (heads + 3 * kv + 1) * 128 + heads * 128 * 6144
    pairs, scored = 2 * (2047 + 2048 + 2048), 2 * _brute_causal(3, 2046)
    w = msa.work(c)
    assert w.flops == {"bfloat16": 2.0 * 6 * weights + 2.0 * heads * 256 * pairs + 2.0 * kv * 128 * scored}
    read = 2 * (2048 * kv * 256 * 1 + 2049 * 128 * 2)
    assert w.bytes == weights * 2 + 6 * 6144 * 4 + read
    assert msa.cost(c) == sum(w.flops.values()) + w.bytes
    assert msa.work(c._replace(architecture="Other")) is None
    assert msa.cost(c._replace(architecture="Other")) == 2 * 3 * 2049 * heads


# ---- plans/mhc.py ------------------------------------------------------------------------------------------------


def test_mhc_work_and_cost_per_op():
    """mhc.work: pre 2 x wide x (2 + hc) x hc FLOPs, post 2 x wide x (1 + hc); times num_sites; mhc._cost."""
    pre = mhc.MhcCase("pre", "DeepseekV4ForCausalLM", 3, 2, 4, 16, 20)
    wide = 3 * 4 * 16
    assert mhc.mixes(pre) == 24
    assert mhc.work(pre).flops == {None: 2 * 2.0 * wide * 24}
    assert mhc.work(pre).bytes == 2 * 2 * (wide + 3 * 16)
    post = pre._replace(op_name="post")
    assert mhc.work(post).flops == {None: 2 * 2.0 * wide * 5}
    assert mhc.work(post).bytes == 2 * 2 * (2 * wide + 3 * 16)
    assert mhc._cost(pre) == 2 * wide * (1 + 20 / 64)


def test_mhc_sglang_and_trtllm_group_dispatch():
    """mhc._sglang: torch pre on SM120 only; mhc._trtllm: post's one kernel, pre tuned only where DeepGEMM runs."""
    group = lambda op: SimpleNamespace(constants={"op_name": op})  # noqa: E731
    assert mhc._sglang("120", group("pre")) == "sglang_torch_mhc_pre"
    assert mhc._sglang("120", group("post")) == "sglang_tilelang_mhc_post"
    assert mhc._sglang("100", group("pre")) == "sglang_tilelang_mhc_pre"
    assert mhc._trtllm("90", group("post")) == "trtllm_mhc_post_mapping"
    assert mhc._trtllm("103", group("pre")) == mhc.TUNED
    assert mhc._trtllm("120", group("pre")) == "trtllm_mhc_pre_fma"
    c = mhc.MhcCase("pre", "DeepseekV4ForCausalLM", 128, 2, 4, 4096, 20)  # 128 x 16384 = 2^21
    assert mhc._trtllm_pre("90", mhc.TUNED, c) == "trtllm_mhc_pre_fma"
    assert mhc._trtllm_pre("90", mhc.TUNED, c._replace(num_tokens=2048)) == "trtllm_mhc_pre_dg_splitk"  # 8x = K


# ---- plans/mla.py ------------------------------------------------------------------------------------------------


def test_mla_rank_labels_keep_the_smallest_tp_whatever_the_order():
    """mla.rank_labels: a head count reached again at a larger tp keeps the smaller tp, totals in any order."""
    assert mla.rank_labels([64, 128], [1, 2]) == {64: 1, 32: 2, 128: 1}
    assert mla.rank_labels([64, 128], [2, 1]) == {32: 2, 64: 1, 128: 1}
    assert mla.rank_labels([96], [1, 5]) == {96: 1}  # 5 does not divide 96


def test_mla_ranking_costs_per_phase():
    """mla._context_cost: 2 x b x isl^2 x heads x 1088; _generation_cost: 2 x b x (step + 1) x (heads x 1088 + 576)."""
    c = mla.MlaCase("bfloat16", "fp8", 16, 2, 3, 1, 0)
    assert mla._context_cost(c) == 2.0 * 2 * 9 * 16 * 1088
    g = c._replace(isl=1, step=7)
    assert mla._generation_cost(g) == 2.0 * 2 * 8 * (16 * 1088 + 576)
