"""SGLang's DSA runners against stand-ins for SGLang 0.5.14 up to the kernel call.

GLM-5's kernels (backends/sglang/dsa_kernels.py): the stand-ins check their inputs as the kernels do (DeepGEMM's
fp8_mqa_logits shapes and dtypes, sgl_kernel's top-k reading [row_starts, row_starts + lengths) of each score row and
mapping through the page table row of its query's request, FlashMLA's sparse kernel's head multiple and index range)
and compute what they select, so the tests check which call each timed row runs, with the reference collector's
inputs (the ragged batch, the two score anchors' winners, the sparse indices), how a row is split within SGLang's
budget, the labels, and the refusals. Where .cache/wheels holds SGLang's pinned wheel, the constants, flags and
call signatures the runner relies on are read from it."""

from __future__ import annotations

import ast
import json
import sys
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import ROOT, install_fakes
from fake_frameworks import Recorder
from fake_sglang import Field, pinned_problems, sglang_source, sglang_uses

from opcollect.backends import kernels as kt
from opcollect.backends.sglang import RUNNERS, dsa
from opcollect.backends.sglang import context as sglang_context_module
from opcollect.backends.sglang import dsa_inputs as inputs
from opcollect.backends.sglang import dsa_kernels as dk
from opcollect.plans.dsa import DIMS, DsaModuleCase
from opcollect.plans.dsa_kernels import Glm5Case, Glm5TopkCase
from opcollect.plans.planner import PlanOptions
from opcollect.runtime.contract import KernelLimit

torch = pytest.importorskip("torch")

GLM = "GlmMoeDsaForCausalLM"
TOPK = 2048
GB = 2**30


def kcase(batch=2, isl=3, step=5, mla="fp8_e4m3", heads=64) -> Glm5Case:
    return Glm5Case("zai-org/GLM-5", GLM, mla, "fp8_e4m3", "fp8_block", heads, batch, isl, 1, step, 1)


def tcase(batch=2, isl=3, step=2100, mode="top_last") -> Glm5TopkCase:
    return Glm5TopkCase("zai-org/GLM-5", GLM, "fp8_e4m3", "fp8_e4m3", "fp8_block", 64, batch, isl, 1, step, 1, mode)


def topk_reference(score, lengths, topk, row_starts, table, cu):
    """What sgl_kernel's fused top-k returns (sgl_kernel/top_k.py:45-113): each row's top min(topk, length) of
    score[row, start : start + length], mapped through the page-table row of its query's request, -1 past them."""
    rows = score.shape[0]
    out = torch.full((rows, topk), -1, dtype=torch.int32)
    request = torch.repeat_interleave(torch.arange(cu.numel() - 1), (cu[1:] - cu[:-1]).long())
    assert request.numel() == rows  # every score row is one query of a request (cu_seqlens_q)
    for i in range(rows):
        start = 0 if row_starts is None else int(row_starts[i])
        length = int(lengths[i])
        assert 0 <= start and start + length <= score.shape[1]  # the window lies in the score row
        window = score[i, start : start + length]
        chosen = window.topk(min(topk, length)).indices
        assert int(chosen.max()) < table.shape[1]  # the page table row covers the window
        out[i, : chosen.numel()] = table[request[i], chosen]
    return out


class FakeSgl(Recorder):
    """Stand-ins for what the GLM-5 kernel runner imports (each cites the SGLang source it models)."""

    def __init__(self):
        super().__init__()
        self.sm_major = 9
        self.memory = (100 * GB, 140 * GB)
        self.envs = SimpleNamespace(
            SGLANG_DSA_FUSE_TOPK=Field(True),  # environ.py:582
            SGLANG_DSA_MQA_LOGITS_FREE_MEM_FRACTION=Field(0.2),  # environ.py:594
        )

        class Indexer:  # dsa_indexer.py:326-328
            _MQA_LOGITS_BYTES_PER_ELEM = 4
            _MQA_LOGITS_STATIC_SKIP_ELEMS = 8_000_000
            _MQA_LOGITS_TOTAL_MEM_FRACTION = 0.3

        self.Indexer = Indexer

    def fp8_mqa_logits(self, q, kv, weights, ks, ke, clean_logits=True):
        k, k_scale = kv
        assert q.dtype == k.dtype == torch.float8_e4m3fn and q.dim() == 3 and k.dim() == 2
        assert k_scale.dtype == weights.dtype == torch.float32 and k_scale.shape == (k.shape[0],)
        assert weights.shape == q.shape[:2] and ks.shape == ke.shape == (q.shape[0],)
        assert ks.dtype == ke.dtype == torch.int32 and bool((ks <= ke).all()) and int(ke.max()) <= k.shape[0]
        self.record("mqa", q=q, k=k, k_scale=k_scale, weights=weights, ks=ks, ke=ke, clean=clean_logits)
        return torch.empty(q.shape[0], k.shape[0])

    def fast_topk_transform_fused(self, score, lengths, page_table_size_1, cu_seqlens_q, topk, row_starts=None):
        assert topk == TOPK and score.dim() == 2 and score.dtype == torch.float32
        out = topk_reference(score, lengths, topk, row_starts, page_table_size_1, cu_seqlens_q)
        self.record("fused", score=score, lengths=lengths, table=page_table_size_1, cu=cu_seqlens_q,
                    row_starts=row_starts, out=out)  # fmt: skip
        return out

    def fast_topk_v2(self, score, lengths, topk, row_starts=None):
        self.record("v2", score=score, lengths=lengths, row_starts=row_starts)
        return torch.empty(score.shape[0], topk, dtype=torch.int32)

    def flash_mla_sparse_fwd(self, q, kv, indices, sm_scale, d_v=512):
        heads = q.shape[1]
        assert heads % (128 if self.sm_major >= 10 else 64) == 0  # the kernel's head multiple (dsa_backend.py:1932)
        assert q.dtype == kv.dtype == torch.bfloat16 and q.shape[-1] == kv.shape[-1] == 576 and kv.shape[1] == 1
        assert indices.dtype == torch.int32 and indices.shape == (q.shape[0], 1, TOPK)
        assert int(indices.min()) >= -1 and int(indices.max()) < kv.shape[0]
        self.record("attn", q=q, kv=kv, indices=indices, sm_scale=sm_scale, d_v=d_v)
        return q.new_empty(q.shape[0], heads, d_v), None, None

    def install(self, monkeypatch):
        fake = self

        class TopkTransformMethod:  # dsa_topk_backend.py:16-20
            PAGED, RAGGED = 1, 2

        class DSATopKBackend:  # dsa_topk_backend.py:23-113: the sgl-kernel branch
            def __init__(self, value):
                assert value == "sgl-kernel"

            def topk_transform(self, logits, lengths, topk, topk_transform_method, attn_metadata,
                               cu_seqlens_q_topk=None, topk_indices_offset=None, row_starts=None,
                               batch_idx_list=None, force_unfused_topk=False):  # fmt: skip
                if not fake.envs.SGLANG_DSA_FUSE_TOPK.get() or force_unfused_topk:
                    return fake.fast_topk_v2(logits, lengths, topk, row_starts=row_starts)
                assert topk_transform_method == TopkTransformMethod.PAGED and batch_idx_list is None
                return fake.fast_topk_transform_fused(score=logits, lengths=lengths,
                                                      page_table_size_1=attn_metadata.page_table_1,
                                                      cu_seqlens_q=cu_seqlens_q_topk, topk=topk,
                                                      row_starts=row_starts)  # fmt: skip

        install_fakes(monkeypatch, {
            "sglang.srt.environ": {"envs": self.envs},
            "sglang.srt.layers.attention.dsa.dsa_indexer": {
                "Indexer": self.Indexer, "deep_gemm": SimpleNamespace(fp8_mqa_logits=self.fp8_mqa_logits)},
            "sglang.srt.layers.attention.dsa.dsa_topk_backend": {
                "DSATopKBackend": DSATopKBackend, "TopkTransformMethod": TopkTransformMethod},
            "sgl_kernel.flash_mla": {"flash_mla_sparse_fwd": self.flash_mla_sparse_fwd},
        })  # fmt: skip
        monkeypatch.setattr(dk, "sm_major", lambda device: fake.sm_major)
        monkeypatch.setattr(dk, "device_memory", lambda device: fake.memory)


@pytest.fixture
def sgl(monkeypatch):
    return FakeSgl.installed(monkeypatch)


# --- the indexer's logits ---


def test_mqa_runs_the_indexers_deep_gemm_over_the_ragged_batch(sgl):
    prepared = dk.prepare_mqa(kcase(batch=2, isl=3, step=5), "deep_gemm.fp8_mqa_logits", "cpu", 2)
    assert prepared.kernel_source == "deep_gemm.fp8_mqa_logits" and sgl.calls == []
    prepared.call()
    prepared.call()
    (_, first), (_, second) = sgl.calls
    assert first["q"] is not second["q"] and first["k"] is not second["k"]  # two input sets rotate
    # 6 query rows of GLM-5's 32 index heads x 128 over 2 segments of 8 keys; each row up to and including itself
    assert tuple(first["q"].shape) == (6, 32, 128) and tuple(first["k"].shape) == (16, 128)
    assert first["ks"].tolist() == [0, 0, 0, 8, 8, 8] and first["ke"].tolist() == [6, 7, 8, 14, 15, 16]
    assert bool((first["k_scale"] == 1).all()) and tuple(first["weights"].shape) == (6, 32)
    assert first["clean"] is False  # the causal tail is the top-k's (dsa_indexer.py:892-899)


def test_a_large_logits_row_is_split_within_sglangs_budget(sgl, monkeypatch):
    monkeypatch.setattr(sgl.Indexer, "_MQA_LOGITS_STATIC_SKIP_ELEMS", 50)  # below 6 x 16 rows x keys
    sgl.memory = (16 * 4 * 4 * 5, 10**9)  # 0.2 of free memory: the logits of 4 rows of 16 keys
    dk.prepare_mqa(kcase(batch=2, isl=3, step=5), "x", "cpu", 1).call()
    parts = [c["q"].shape[0] for _, c in sgl.calls]
    assert parts == [4, 2] and [c["ks"].tolist() for _, c in sgl.calls] == [[0, 0, 0, 8], [8, 8]]


@pytest.mark.parametrize(("rows", "keys", "free", "total", "want"), [
    (10, 10, 0, 0, 10),  # below the static threshold: whole, whatever the memory
    (4000, 4000, 4000 * 4 * 100 * 5, 10**15, 100),  # 0.2 of free memory, 100 rows
    (4000, 4000, 10**15, 4000 * 4 * 30 * 10, 3),  # 0.3 of the device's memory, 30 rows / 10
    (4000, 4000, 1, 1, 1),  # at least one row
    (4000, 4000, 10**15, 10**15, 4000),  # at most every row
])  # fmt: skip
def test_split_rows_follows_the_indexers_limits(rows, keys, free, total, want):
    if want == 3:
        want = int(total * 0.3) // (keys * 4)
    assert dk.split_rows(rows, keys, free, total, (8_000_000, 4, 0.3, 0.2)) == want


# --- the top-k ---


def last_visible(out_row, start, length):
    """The page-table entries of a window's last min(TOPK, length) keys (the page table here is the identity)."""
    return set(range(start + length - min(TOPK, length), start + length))


def test_topk_of_a_prefill_reads_each_rows_window_and_picks_its_winners(sgl):
    c = tcase(batch=2, isl=3, step=2100)
    prepared = dk.prepare_topk(c, "fast_topk_transform_fused", "cpu", 1)
    assert prepared.kernel_source == "fast_topk_transform_fused"
    prepared.call()
    ((kind, call),) = sgl.calls
    assert kind == "fused"
    seg = 2103
    assert tuple(call["score"].shape) == (6, 2 * seg) and call["lengths"].tolist() == [2101, 2102, 2103] * 2
    assert call["row_starts"].tolist() == [0] * 3 + [seg] * 3 and call["cu"].tolist() == [0, 3, 6]
    assert call["table"].tolist() == [list(range(seg)), list(range(seg, 2 * seg))]  # one row per request
    for i, row in enumerate(call["out"]):
        start, length = int(call["row_starts"][i]), int(call["lengths"][i])
        assert set(row.tolist()) == last_visible(row, start, length)  # top_last: the clear winners win


def test_flat_scores_are_all_equal(sgl):
    dk.prepare_topk(tcase(batch=1, isl=2, step=3000, mode="flat"), "x", "cpu", 1).call()
    ((_, call),) = sgl.calls
    assert not call["score"].any() and tuple(call["score"].shape) == (2, 3002)


def test_topk_of_a_decode_step_reads_one_compact_row_per_request(sgl):
    dk.prepare_topk(tcase(batch=3, isl=1, step=2500), "x", "cpu", 1).call()
    ((_, call),) = sgl.calls
    assert tuple(call["score"].shape) == (3, 2560)  # 2501 keys padded to 64-token pages
    assert call["lengths"].tolist() == [2501] * 3 and call["row_starts"] is None and call["cu"].tolist() == [0, 1, 2, 3]
    assert tuple(call["table"].shape) == (3, 2501) and call["table"][2].tolist() == list(range(2501))
    for row in call["out"]:
        assert set(row.tolist()) == last_visible(row, 0, 2501)


def test_a_split_prefill_topk_maps_each_query_through_its_requests_page_row(sgl, monkeypatch):
    monkeypatch.setattr(sgl.Indexer, "_MQA_LOGITS_STATIC_SKIP_ELEMS", 100)
    seg = 2100 + 4
    sgl.memory = (4 * 2 * seg * 4 * 5, 10**12)  # four rows a part: each part one request
    dk.prepare_topk(tcase(batch=2, isl=4, step=2100), "x", "cpu", 1).call()
    (_, a), (_, b) = sgl.calls
    assert [tuple(x["score"].shape) for x in (a, b)] == [(4, 2 * seg)] * 2
    assert a["score"].data_ptr() == b["score"].data_ptr()  # one buffer within the budget
    assert a["cu"].tolist() == b["cu"].tolist() == [0, 1, 2, 3, 4]  # each query its own length-one sequence
    assert a["table"].tolist() == [list(range(seg))] * 4 and b["table"].tolist() == [list(range(seg, 2 * seg))] * 4
    assert b["row_starts"].tolist() == [seg] * 4
    for call in (a, b):
        for i, row in enumerate(call["out"]):
            assert set(row.tolist()) == last_visible(row, int(call["row_starts"][i]), int(call["lengths"][i]))


def test_unfused_topk_when_sglang_says_so(sgl):
    sgl.envs.SGLANG_DSA_FUSE_TOPK = Field(False)
    prepared = dk.prepare_topk(tcase(), "fast_topk_transform_fused", "cpu", 1)
    assert prepared.kernel_source == "fast_topk_v2"
    prepared.call()
    ((kind, call),) = sgl.calls
    assert kind == "v2" and call["row_starts"].tolist() == [0] * 3 + [2103] * 3


def test_a_select_all_topk_is_held_at_zero_untimed(sgl):
    runner = RUNNERS.find("glm5_topk_module", "fast_topk_transform_fused")
    assert runner.untimed(tcase(isl=48, step=2000)) and not runner.untimed(tcase(isl=48, step=2001))
    assert runner.footprint(tcase(isl=48, step=2000)) == 0
    with pytest.raises(KernelLimit):
        dk.prepare_topk(tcase(isl=48, step=2000), "x", "cpu", 1)
    with pytest.raises(KernelLimit):
        dk.prepare_topk(tcase(mode="uniform"), "x", "cpu", 1)


# --- the sparse MLA ---


@pytest.mark.parametrize(("major", "heads"), [(9, 64), (10, 128)])
def test_dsa_attn_runs_flashmla_sparse_on_the_first_tokens_of_each_request(sgl, major, heads):
    sgl.sm_major = major
    prepared = dk.prepare_attn(kcase(batch=2, isl=3, step=10, mla="bfloat16"), "flash_mla_sparse_fwd", "cpu", 1)
    assert prepared.kernel_source == "flash_mla_sparse_fwd"
    prepared.call()
    ((_, call),) = sgl.calls
    assert tuple(call["q"].shape) == (6, heads, 576) and tuple(call["kv"].shape) == (26, 1, 576)
    assert call["sm_scale"] == pytest.approx(576**-0.5) and call["d_v"] == 512
    idx = call["indices"][:, 0]
    assert idx[0, :13].tolist() == list(range(13)) and idx[5, :13].tolist() == list(range(13, 26))
    assert bool((idx[:, 13:] == -1).all())


def test_heads_are_padded_as_sglangs_sparse_backend_pads_them():
    assert dk.padded_heads(64, 9) == 64 and dk.padded_heads(16, 9) == 64 and dk.padded_heads(128, 9) == 128
    assert dk.padded_heads(64, 10) == 128 and dk.padded_heads(8, 10) == 128
    with pytest.raises(KernelLimit):
        dk.padded_heads(48, 9)


# --- refusals, footprints, labels, the plan ---


def test_refusals_come_before_any_framework_import():
    bad = [
        (dk.prepare_mqa, kcase(mla="bfloat16")),  # not the reference's label
        (dk.prepare_attn, kcase()),  # dsa_attn's mla_dtype is bfloat16
        (dk.prepare_mqa, kcase()._replace(compress_ratio=4)),
        (dk.prepare_mqa, kcase()._replace(architecture="DeepseekV3ForCausalLM")),
        (dk.prepare_topk, tcase()._replace(kv_cache_dtype="bfloat16")),
    ]
    for prepare, c in bad:
        with pytest.raises(KernelLimit):
            prepare(c, "x", "cpu", 1)
    assert not any(name == "sglang" or name.startswith(("sglang.", "sgl_kernel")) for name in sys.modules)


def test_footprints_grow_with_the_case_and_stay_within_the_split():
    small, big = kcase(batch=2, isl=64, step=128), kcase(batch=8, isl=64, step=128)
    assert 0 < dk.mqa_footprint(small) < dk.mqa_footprint(big)
    assert 0 < dk.attn_footprint(small._replace(mla_dtype="bfloat16")) < dk.attn_footprint(big)
    assert 0 < dk.topk_footprint(tcase(step=4096)) < dk.topk_footprint(tcase(batch=4, step=4096))
    # a one-million-token prefill's scores are split within the device's budget, not counted whole
    huge = kcase(batch=1, isl=16384, step=1_000_000)
    assert dk.mqa_footprint(huge) < 4 * GB < 4 * huge.isl * (huge.step + huge.isl)


@pytest.mark.parametrize(("label", "ran", "lies"), [
    ("deep_gemm.fp8_mqa_logits", "void deep_gemm::sm90_fp8_mqa_logits<32u, 128u, false, 128u, 4u>", False),
    ("deep_gemm.fp8_mqa_logits", "void deep_gemm::sm90_fp8_paged_mqa_logits<64u, 32u, 128u>", True),
    ("fast_topk_transform_fused",
     "(anonymous namespace)::topk_transform_prefill_kernel((anonymous namespace)::FastTopKParams, int*)", False),
    ("fast_topk_transform_fused", "(anonymous namespace)::topk_kernel((anonymous namespace)::FastTopKParams)", True),
    ("fast_topk_v2", "(anonymous namespace)::topk_kernel((anonymous namespace)::FastTopKParams)", False),
    ("fast_topk_v2", "(anonymous namespace)::topk_transform_decode_kernel(FastTopKParams, int*)", True),
    ("flash_mla_sparse_fwd", "void sm90::fwd::sparse_attn_fwd_kernel<sm90::fwd::KernelTemplate<576, false>>", False),
    ("flash_mla_sparse_fwd", "void sm90::flash_fwd_splitkv_mla_kernel<Traits<cutlass::bfloat16_t>>", True),
])  # fmt: skip
def test_the_kernel_labels_name_their_kernels(label, ran, lies):
    assert kt.contradicts_label("sglang", label, [ran], None) is lies


def test_sglangs_glm5_kernel_ops_are_planned_with_the_references_kernels(planner):
    ops = ("glm5_mqa_logits_module", "glm5_topk_module", "glm5_dsa_attn_module")
    plan = planner.plan("sglang", "90", PlanOptions(ops=ops))
    held = {op: set(plan.ops[op].dispatch) for op in ops if op in plan.ops and plan.ops[op].values}
    assert held == {
        "glm5_mqa_logits_module": {"deep_gemm.fp8_mqa_logits"},
        "glm5_topk_module": {"fast_topk_transform_fused"},
        "glm5_dsa_attn_module": {"flash_mla_sparse_fwd"},
    }
    for op in ops:
        assert RUNNERS.find(op, next(iter(held[op]))) is not None


# --- the pinned wheel ---


def _assigned(tree, cls: str) -> dict:
    [node] = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls]
    found = [t for t in node.body if isinstance(t, (ast.Assign, ast.AnnAssign)) and isinstance(t.value, ast.Constant)]
    return {t.target.id if isinstance(t, ast.AnnAssign) else t.targets[0].id: t.value.value for t in found}


def test_the_pinned_wheels_limits_flags_and_calls_are_what_the_runner_models():
    indexer = sglang_source("sglang/srt/layers/attention/dsa/dsa_indexer.py")
    limits = _assigned(ast.parse(indexer), "Indexer")
    fake = FakeSgl().Indexer
    for name in ("_MQA_LOGITS_BYTES_PER_ELEM", "_MQA_LOGITS_STATIC_SKIP_ELEMS", "_MQA_LOGITS_TOTAL_MEM_FRACTION"):
        assert limits[name] == getattr(fake, name) and name in dk.__doc__ + Path(dk.__file__).read_text()
    assert "deep_gemm.fp8_mqa_logits(" in indexer and "clean_logits=False" in indexer
    environ = sglang_source("sglang/srt/environ.py")
    assert "SGLANG_DSA_FUSE_TOPK = EnvBoolWithAlias(True" in environ
    assert "SGLANG_DSA_MQA_LOGITS_FREE_MEM_FRACTION = EnvFloat(0.2)" in environ
    topk = ast.parse(sglang_source("sglang/srt/layers/attention/dsa/dsa_topk_backend.py"))
    [method] = [n for n in ast.walk(topk) if isinstance(n, ast.FunctionDef) and n.name == "topk_transform"]
    params = [a.arg for a in method.args.args]
    assert {"logits", "lengths", "topk", "topk_transform_method", "attn_metadata", "cu_seqlens_q_topk",
            "row_starts"} <= set(params)  # fmt: skip
    body = ast.unparse(method)
    assert (
        "attn_metadata.page_table_1" in body
        and "fast_topk_transform_fused(" in body
        and "fast_topk_v2" in (sglang_source("sglang/srt/layers/attention/dsa/dsa_topk_backend.py"))
    )
    args = sglang_source("sglang/srt/server_args.py")
    assert '] = "sgl-kernel"' in args  # dsa_topk_backend's default
    backend = sglang_source("sglang/srt/layers/attention/dsa_backend.py")
    assert "required_padding = 128 if self.device_sm_major >= 10 else 64" in backend


def test_the_contract_check_covers_every_sglang_symbol_the_kernel_runner_imports():
    uses = sglang_uses("dsa_kernels")
    labels = {u.label for u in uses}
    assert {
        "sglang.srt.environ.envs",
        "sglang.srt.layers.attention.dsa.dsa_indexer",
        "sglang.srt.layers.attention.dsa.dsa_indexer.deep_gemm",  # the module object the indexer calls
        "sglang.srt.layers.attention.dsa.dsa_indexer.Indexer",
        "sglang.srt.layers.attention.dsa.dsa_topk_backend.DSATopKBackend",
        "sglang.srt.layers.attention.dsa.dsa_topk_backend.TopkTransformMethod",
        "sgl_kernel.flash_mla.flash_mla_sparse_fwd",
    } <= labels
    assert pinned_problems(uses) == []


# ======================================================================================================================
# The DSA modules (backends/sglang/dsa.py)
# ======================================================================================================================

V32 = "DeepseekV32ForCausalLM"
MODEL = {V32: "deepseek-ai/DeepSeek-V3.2", GLM: "zai-org/GLM-5"}
CONFIGS = Path(__file__).parent / "data" / "sparse_configs"


def mcase(arch=V32, heads=32, batch=2, isl=100, step=3000, kv="bfloat16", gemm="bfloat16", op="dsa_context_module",
          model=None):  # fmt: skip
    return DsaModuleCase(op, model or MODEL[arch], arch, "bfloat16", kv, gemm, heads, batch, isl, 1, step)


class FakeDsaSgl:
    """Stand-ins for what the DSA module runner imports, each reading what its SGLang original reads."""

    def __init__(self, major=9, total_mib=143771):
        self.major, self.total_mib = major, total_mib
        self.events: list = []  # the build, in order
        self.modules: list = []
        self.backends: list = []
        self.calls: list = []
        self.args: dict = {}  # ServerArgs per server-args fields, as context._args_cache keeps them
        self.contexts = 0
        self.backend = None  # the forward context's
        self.capture = False
        self.attn_inputs = None
        self.envs = SimpleNamespace(SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD=Field(2048),
                                    SGLANG_MAX_KV_CHUNK_CAPACITY=Field(128 * 1024))  # fmt: skip

    @contextmanager
    def sglang_context(self, device, **fields):
        key = repr(sorted(fields.items()))
        if key not in self.args:
            args = SimpleNamespace(dsa_prefill_backend=None, dsa_decode_backend=None, **fields)

            def set_defaults(kv_cache_dtype, major, args=args):  # server_args.py:3431-3479, no hisparse, no HIP
                blackwell = major >= 10
                if kv_cache_dtype == "fp8_e4m3":
                    impl = ("trtllm", "trtllm") if blackwell else ("flashmla_kv", "flashmla_kv")
                else:
                    impl = ("flashmla_sparse", "trtllm" if blackwell else "fa3")
                args.dsa_prefill_backend = args.dsa_prefill_backend or impl[0]
                args.dsa_decode_backend = args.dsa_decode_backend or impl[1]

            args._set_default_dsa_backends = set_defaults
            self.args[key] = args
        self.contexts += 1
        yield self.args[key]

    def install(self, monkeypatch):
        fake = self

        class Module(torch.nn.Module):
            def __init__(self, quant_config=None):
                super().__init__()
                self.quant_method = (
                    None
                    if quant_config is None
                    else SimpleNamespace(
                        process_weights_after_loading=lambda layer: fake.events.append(("process", layer))
                    )
                )

        class DeepseekV2AttentionMLA(torch.nn.Module):  # models/deepseek_v2.py:1484-1690
            def __init__(self, config, hidden_size, num_heads, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
                         q_lora_rank, kv_lora_rank, rope_theta=10000, rope_scaling=None, max_position_embeddings=8192,
                         quant_config=None, reduce_results=True, layer_id=None, prefix="", alt_stream=None,
                         skip_rope=False, is_nextn=False, dsa_enable_prefill_cp=False,
                         mla_enable_prefill_cp=False):  # fmt: skip
                super().__init__()
                self.args = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
                self.default_dtype = torch.get_default_dtype()
                if rope_scaling:
                    rope_scaling["rope_type"] = "deepseek_yarn"  # :1539-1540
                self.kv_b_proj = Module(quant_config)
                self.o_proj = Module(quant_config)
                self.indexer = SimpleNamespace(topk=config.index_topk, heads=config.index_n_heads,
                                               neox=not getattr(config, "indexer_rope_interleave", False))  # fmt: skip
                offset = getattr(config, "index_skip_topk_offset", None)  # configs/model_config.py:180-200
                freq = getattr(config, "index_topk_freq", 1) or 1

                def skips(layer):
                    return max(layer - (offset or 2) + 1, 0) % freq != 0

                self.skip_topk, self.next_skip_topk = skips(layer_id), skips(layer_id + 1)
                fake.events.append("module")
                fake.modules.append(self)

            def prepare_qkv_latent(self, hidden_states, forward_batch):
                return ("latent", hidden_states)

            def forward(self, positions, hidden_states, forward_batch, zero_allocator, layer_scatter_modes=None,
                        llama_4_scaling=None, prev_topk_indices=None):  # fmt: skip
                latent = fake.attn_inputs.fetch_qkv_latent()
                assert latent[1] is hidden_states  # the module's own projection of these hidden states
                fake.calls.append(dict(positions=positions, hidden=hidden_states, batch=forward_batch,
                                       zero=zero_allocator, prev=prev_topk_indices, skip=self.skip_topk,
                                       next_skip=self.next_skip_topk, backend=fake.backend, capture=fake.capture,
                                       grad=torch.is_grad_enabled(), contexts=fake.contexts))  # fmt: skip
                out = hidden_states.new_empty(hidden_states.shape)
                if self.next_skip_topk:  # forward_mla.py:760-766
                    return out, torch.arange(hidden_states.shape[0] * TOPK, dtype=torch.int32).view(-1, TOPK)
                return out, None

        class Mixin:  # deepseek_weight_loader.py:411-623
            def post_load_weights(self, is_nextn=False, weight_names=None):
                assert list(range(self.model.start_layer, self.model.end_layer)) == [0]
                fake.events.append(("post_load", self.model.layers[0].self_attn, self.config, self.quant_config))

        def calculate_mla_kv_cache_dim(runner):  # model_runner_kv_cache_mixin.py:226-271, CUDA
            args = runner.server_args
            if runner.kv_cache_dtype != torch.float8_e4m3fn or "trtllm" in (args.dsa_prefill_backend,
                                                                               args.dsa_decode_backend):  # fmt: skip
                return 576
            return 512 + 512 // 128 * 4 + 64 * 2

        class ReqToTokenPool:  # memory_pool.py:229-255
            def __init__(self, size, max_context_len, device, enable_memory_saver):
                self.size, self.req_to_token = size, torch.zeros(size + 1, max_context_len, dtype=torch.int32)

        class DSATokenToKVPool:  # memory_pool.py:2492-2575 over MLATokenToKVPool, :2102-2167
            def __init__(self, size, page_size, kv_lora_rank, dtype, qk_rope_head_dim, layer_num, device,
                         index_head_dim, enable_memory_saver, kv_cache_dim, start_layer=None, end_layer=None,
                         index_buf_size=None):  # fmt: skip
                assert page_size == 64 and index_head_dim == 128 and layer_num == 1
                self.size, self.page_size, self.dtype, self.kv_cache_dim = size, page_size, dtype, kv_cache_dim
                self.dsa_kv_cache_store_fp8 = dtype == torch.float8_e4m3fn and kv_cache_dim != 576
                store = torch.uint8 if dtype == torch.float8_e4m3fn else dtype
                self.kv_buffer = [torch.zeros(size + page_size, 1, kv_cache_dim, dtype=store)]
                pages = (size + page_size + 1) // page_size
                self.index_k_with_scale_buffer = [torch.zeros(pages, page_size * 132, dtype=torch.uint8)]

        class DeepseekSparseAttnBackend:  # dsa_backend.py:290-409, :620-895, :2431-2467
            def __init__(self, model_runner):
                r = model_runner
                self.runner, self.device_sm_major = r, fake.major
                self.num_q_heads = r.model_config.num_attention_heads
                self.token_to_kv_pool, self.req_to_token_pool = r.token_to_kv_pool, r.req_to_token_pool
                self.dsa_prefill_impl = r.server_args.dsa_prefill_backend
                self.dsa_decode_impl = r.server_args.dsa_decode_backend
                self.use_mha = False
                fake.backends.append(self)

            def init_forward_metadata(self, forward_batch):
                b = forward_batch
                threshold = fake.envs.SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD.get()
                self.metadata = dict(threshold=threshold, backend=fake.backend)
                self.use_mha = (
                    b.forward_mode == "extend"
                    and (fake.major == 9 or 10 <= fake.major < 11)
                    and int(b.seq_lens_cpu.max()) <= threshold
                    and int(sum(b.seq_lens_cpu)) <= fake.envs.SGLANG_MAX_KV_CHUNK_CAPACITY.get()
                )

        class AttentionInputs:  # communicator.py:216-246
            def __init__(self, hidden_states, forward_batch, qkv_latent_func):
                self.hidden, self.batch, self.func, self.cached = hidden_states, forward_batch, qkv_latent_func, None

            def fetch_qkv_latent(self):
                if self.cached is None:
                    self.cached = self.func(self.hidden, self.batch)
                return self.cached

        class TpContext:  # communicator.py:259-325
            def set_attn_inputs(self, attn_inputs):
                fake.attn_inputs = attn_inputs

            def clear_attn_inputs(self):
                fake.attn_inputs = None

        @contextmanager
        def forward_context(ctx):  # forward_context.py:78-85
            previous, fake.backend = fake.backend, ctx.attn_backend
            try:
                yield
            finally:
                fake.backend = previous

        @contextmanager
        def model_capture_mode():  # runner_utils/capture_mode.py:63-69
            fake.capture = True
            try:
                yield
            finally:
                fake.capture = False

        class ForwardBatch:  # forward_batch_info.py:322-339: the required fields, the rest with defaults
            def __init__(self, forward_mode, batch_size, input_ids, req_pool_indices, seq_lens, out_cache_loc,
                         seq_lens_sum, **optional):  # fmt: skip
                self.__dict__.update({k: v for k, v in locals().items() if k not in ("self", "optional")})
                self.__dict__.update(optional)

        install_fakes(monkeypatch, {
            "sglang.srt.environ": {"envs": self.envs},
            "sglang.srt.layers.quantization.fp8": {"Fp8Config": lambda **kw: SimpleNamespace(**kw)},
            "sglang.srt.model_loader.weight_utils": {
                "initialize_dummy_weights": lambda model: fake.events.append(("dummy", model))},
            "sglang.srt.models.deepseek_common.deepseek_weight_loader": {"DeepseekV2WeightLoaderMixin": Mixin},
            "sglang.srt.models.deepseek_v2": {"DeepseekV2AttentionMLA": DeepseekV2AttentionMLA},
            "sglang.srt.mem_cache.memory_pool": {"DSATokenToKVPool": DSATokenToKVPool,
                                                 "ReqToTokenPool": ReqToTokenPool},
            "sglang.srt.model_executor.forward_batch_info": {
                "ForwardBatch": ForwardBatch, "ForwardMode": SimpleNamespace(EXTEND="extend", DECODE="decode")},
            "sglang.srt.layers.attention.dsa_backend": {"DeepseekSparseAttnBackend": DeepseekSparseAttnBackend},
            "sglang.srt.layers.communicator": {"AttentionInputs": AttentionInputs,
                                               "get_attn_tp_context": lambda: TpContext()},
            "sglang.srt.model_executor.forward_context": {
                "ForwardContext": lambda attn_backend: SimpleNamespace(attn_backend=attn_backend),
                "forward_context": forward_context},
            "sglang.srt.model_executor.model_runner_kv_cache_mixin": {
                "ModelRunnerKVCacheMixin": SimpleNamespace(calculate_mla_kv_cache_dim=calculate_mla_kv_cache_dim)},
            "sglang.srt.model_executor.runner": {"model_capture_mode": model_capture_mode},
            "sglang.srt.utils": {"BumpAllocator": lambda buffer_size, dtype, device: SimpleNamespace(
                size=buffer_size, dtype=dtype)},
        })  # fmt: skip
        monkeypatch.setattr(sglang_context_module, "sglang_context", self.sglang_context)
        monkeypatch.setattr(dsa, "device_info", lambda device: (fake.major, fake.total_mib))
        monkeypatch.setattr(dsa, "alt_stream", lambda device: "alt-stream")
        monkeypatch.setattr(dsa, "_built", {})  # no layer from another test


@pytest.fixture
def dsa_fake(monkeypatch):
    fake = FakeDsaSgl()
    fake.install(monkeypatch)
    return fake


@pytest.mark.parametrize("arch", [V32, GLM])
def test_builds_layer_0s_attention_as_the_model_runner_builds_it(dsa_fake, arch):
    prepared = dsa.prepare(mcase(arch, heads=16, batch=2, isl=100, step=3000), "x", "cpu", 1, context=True)
    assert prepared.kernel_source == "sglang_dsa_indexer_flashmla_sparse"  # 3100 tokens: past the dense threshold
    (module,) = dsa_fake.modules
    a, keys = module.args, inputs.MODELS[MODEL[arch]]
    assert a["prefix"] == "model.layers.0.self_attn" and a["layer_id"] == 0 and a["num_heads"] == 16
    assert a["quant_config"] is None and a["alt_stream"] == "alt-stream" and not a["reduce_results"]
    assert module.default_dtype == torch.get_default_dtype()  # the stand-in context sets none here
    for k in ("hidden_size", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "q_lora_rank", "kv_lora_rank"):
        assert a[k] == keys[k]
    assert a["rope_theta"] == keys["rope_parameters"]["rope_theta"] and a["max_position_embeddings"] == 163840 * (
        arch == V32) + 202752 * (arch == GLM)  # fmt: skip
    hf = a["config"]
    if arch == V32:  # yarn: the rope_parameters themselves, which the module renames in place (deepseek_v2.py:1540)
        assert a["rope_scaling"] is hf.rope_parameters and hf.rope_parameters["rope_type"] == "deepseek_yarn"
        assert keys["rope_parameters"]["rope_type"] == "yarn"  # the table is untouched
    else:
        assert a["rope_scaling"] is None and module.indexer.neox is False  # GLM interleaves its indexer's rope
    assert (hf.num_attention_heads, hf.index_topk, hf.architectures) == (16, 2048, [arch])
    # weights as the dummy loader: random, the model's post-load split, then each quant method
    assert dsa_fake.events[:3] == ["module", ("dummy", module), ("post_load", module, hf, None)]
    # the server's DSA choices on SM90 for a bf16 cache (server_args.py:3431-3479)
    (args,) = dsa_fake.args.values()
    assert (args.attention_backend, args.page_size, args.kv_cache_dtype, args.quantization) == (
        "dsa", 64, "bfloat16", None)  # fmt: skip
    assert (args.dsa_prefill_backend, args.dsa_decode_backend) == ("flashmla_sparse", "fa3")
    (backend,) = dsa_fake.backends
    pool, req = backend.token_to_kv_pool, backend.req_to_token_pool
    assert backend.num_q_heads == 16 and backend.runner.page_size == 64 and backend.runner.hisparse_coordinator is None
    assert (pool.size, pool.kv_cache_dim, pool.dtype) == (2 * 49 * 64, 576, torch.bfloat16)  # 3100 tokens: 49 pages
    latent = pool.kv_buffer[0]
    assert torch.isfinite(latent.float()).all() and latent.abs().max() <= 1 and latent.abs().sum() > 0
    index = pool.index_k_with_scale_buffer[0]
    assert torch.isfinite(index[:, : 64 * 128].contiguous().view(torch.float8_e4m3fn).float()).all()
    assert (index[:, 64 * 128 :].contiguous().view(torch.float32) == 2.0**-6).all()
    # each request on its own pages after the padded first one, rows 1 and 2 of the request table
    assert req.req_to_token[1, :3].tolist() == [64, 65, 66] and req.req_to_token[2, 0] == 64 * 50
    assert not req.req_to_token[0].any()
    # the batch: isl new tokens after step cached ones
    assert dsa_fake.calls == []  # nothing runs until the first call
    prepared.call()
    (call,) = dsa_fake.calls
    batch = call["batch"]
    assert batch.forward_mode == "extend" and batch.batch_size == 2 and batch.seq_lens.tolist() == [3100] * 2
    assert batch.extend_prefix_lens_cpu == [3000] * 2 and batch.extend_seq_lens_cpu == [100] * 2
    assert batch.req_pool_indices.tolist() == [1, 2] and batch.seq_lens_sum == 6200
    assert call["positions"].tolist() == list(range(3000, 3100)) * 2
    assert batch.out_cache_loc[:2].tolist() == [64 + 3000, 64 + 3001] and batch.out_cache_loc[100] == 64 * 50 + 3000
    assert tuple(call["hidden"].shape) == (200, keys["hidden_size"]) and call["hidden"].dtype == torch.bfloat16
    assert call["backend"] is backend and not call["capture"] and not call["grad"] and call["prev"] is None
    assert dsa_fake.attn_inputs is None  # cleared after the layer, as the decoder layer does


def test_each_call_projects_its_own_latent(dsa_fake):
    prepared = dsa.prepare(mcase(batch=1, isl=8), "x", "cpu", 2, context=True)
    prepared.call()
    prepared.call()
    prepared.call()
    hidden = [c["hidden"] for c in dsa_fake.calls]
    assert hidden[0] is not hidden[1] and hidden[0] is hidden[2]  # two input sets rotate, each projected afresh


DENSE = [(9, "sglang_dsa_dense_mha_fa3"), (10, "sglang_dsa_dense_mha_trtllm_ragged")]


@pytest.mark.parametrize(("major", "label"), DENSE)
def test_a_short_prefill_is_the_dense_mha_sglang_chose(dsa_fake, major, label):
    dsa_fake.major = major
    c = mcase(batch=4, isl=1024, step=1024)  # 2048 tokens: within the model's index_topk
    assert dsa.prepare(c, "x", "cpu", 1, context=True).kernel_source == label
    assert dsa_fake.backends[0].metadata["threshold"] == 2048
    assert dsa.prepare(c._replace(step=1025), "x", "cpu", 1, True).kernel_source.startswith("sglang_dsa_indexer_")
    many = mcase(batch=128, isl=64, step=1984)  # 128 x 2048 tokens: past the KV chunk capacity
    assert dsa.prepare(many, "x", "cpu", 1, True).kernel_source == "sglang_dsa_indexer_flashmla_sparse"


def test_the_dense_threshold_is_index_topk_unless_the_environment_sets_it(dsa_fake):
    dsa_fake.envs.SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD = Field(4096)  # a default that is not index_topk
    dsa.prepare(mcase(batch=1, isl=16), "x", "cpu", 1, True)
    assert dsa_fake.backends[-1].metadata["threshold"] == 2048
    dsa_fake.envs.SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD = Field(2048, value=8192)
    assert dsa.prepare(mcase(batch=1, isl=16, step=5000), "x", "cpu", 1, True).kernel_source.endswith("dense_mha_fa3")
    assert dsa_fake.backends[-1].metadata["threshold"] == 8192


def test_an_fp8_cache_on_hopper_is_flashmla_kvs_layout_and_fp8_block_projections(dsa_fake):
    prepared = dsa.prepare(mcase(GLM, kv="fp8", gemm="fp8_block", model="zai-org/GLM-5-FP8"), "x", "cpu", 1, True)
    assert prepared.kernel_source == "sglang_dsa_indexer_flashmla_kv"
    (args,) = dsa_fake.args.values()
    assert (args.kv_cache_dtype, args.quantization, args.dsa_prefill_backend) == ("fp8_e4m3", "fp8", "flashmla_kv")
    quant = dsa_fake.modules[0].args["quant_config"]
    assert quant.weight_block_size == [128, 128] and quant.is_checkpoint_fp8_serialized
    post = [e for e in dsa_fake.events if isinstance(e, tuple) and e[0] == "post_load"]
    processed = [e for e in dsa_fake.events if isinstance(e, tuple) and e[0] == "process"]
    assert post[0][3] is quant and len(processed) == 2  # kv_b_proj and o_proj, after the post-load split
    assert dsa_fake.events.index(post[0]) < dsa_fake.events.index(processed[0])
    pool = dsa_fake.backends[0].token_to_kv_pool
    assert pool.kv_cache_dim == 656 and pool.dtype == torch.float8_e4m3fn and pool.dsa_kv_cache_store_fp8
    latent = pool.kv_buffer[0]
    assert latent.dtype == torch.uint8 and (latent[..., 512:528].contiguous().view(torch.float32) == 1.0).all()
    values = latent[..., :512].contiguous().view(torch.float8_e4m3fn).float()
    assert values.min() >= 0.125 and values.max() <= 1.875
    assert latent[..., 528:].contiguous().view(torch.bfloat16).abs().max() <= 1


@pytest.mark.parametrize(("batch", "graphed"), [(256, True), (512, False)])
def test_a_decode_step_after_step_tokens_runs_as_serving_captures_it(dsa_fake, batch, graphed):
    c = mcase(GLM, heads=8, batch=batch, isl=1, step=100, op="dsa_generation_module")
    prepared = dsa.prepare(c, "x", "cpu", 1, context=False)
    assert prepared.kernel_source == "sglang_dsa_indexer_fa3"  # SM90 bf16 decode (server_args.py:3467-3472)
    prepared.call()
    (call,) = dsa_fake.calls
    b = call["batch"]
    assert b.forward_mode == "decode" and b.seq_lens.tolist() == [101] * batch and not hasattr(b, "extend_seq_lens")
    assert call["positions"].tolist() == [100] * batch and b.out_cache_loc[1] == 64 * 3 + 100  # 2 pages a request
    assert call["capture"] is graphed  # H200: decode graphs up to 256 (server_args.py:3187-3195)
    assert not dsa_fake.capture


def test_an_indexer_skipping_layer_reuses_the_top_k_layer_0_hands_on(dsa_fake):
    c = mcase(GLM, heads=64, batch=1, isl=64, step=4096, op="dsa_context_module_skip_indexer", model="zai-org/GLM-5.2")
    prepared = dsa.prepare(c, "x", "cpu", 1, context=True)
    assert prepared.kernel_source == "sglang_dsa_skip_indexer_flashmla_sparse"
    (module,) = dsa_fake.modules
    assert module.args["max_position_embeddings"] == 1048576 and module.args["rope_theta"] == 8000000
    (producer,) = dsa_fake.calls  # layer 0 run once to take the indices it would hand on
    assert producer["next_skip"] and not producer["skip"]
    assert module.skip_topk is True and module.next_skip_topk is False  # layer 1 of GLM-5.2 runs its indexer
    prepared.call()
    timed = dsa_fake.calls[1]
    assert timed["skip"] and tuple(timed["prev"].shape) == (64, TOPK) and timed["prev"].dtype == torch.int32
    # dense: no top-k to hand on, the layer still skips
    dense = dsa.prepare(c._replace(step=1024), "x", "cpu", 1, True)
    assert dense.kernel_source == "sglang_dsa_dense_mha_fa3" and dsa_fake.modules == [module] and module.skip_topk
    assert len(dsa_fake.calls) == 2


def test_a_worker_builds_a_layer_once_for_its_cases_and_resets_its_skip_flags(dsa_fake):
    skip = mcase(GLM, heads=64, batch=1, isl=64, step=4096, op="dsa_context_module_skip_indexer",
                 model="zai-org/GLM-5.2")  # fmt: skip
    dsa.prepare(skip, "x", "cpu", 1, True)
    full = dsa.prepare(skip._replace(op_name="dsa_context_module"), "x", "cpu", 1, True)
    assert full.kernel_source == "sglang_dsa_indexer_flashmla_sparse"
    (module,) = dsa_fake.modules  # one layer for both rows, its flags back to what its config says
    full.call()
    assert dsa_fake.calls[-1]["skip"] is False and dsa_fake.calls[-1]["prev"] is None
    dsa.prepare(skip._replace(num_heads=32), "x", "cpu", 1, True)
    assert len(dsa_fake.modules) == 2 and list(dsa._built) == [next(iter(dsa._built))]  # the last layer only


def test_dsa_module_refusals_come_before_any_framework_import():
    for bad in (
        mcase()._replace(mla_dtype="fp8"),
        mcase(kv="int8"),
        mcase(gemm="nvfp4"),
        mcase()._replace(architecture="DeepseekV3ForCausalLM", model="deepseek-ai/DeepSeek-V3"),
        mcase(GLM, op="dsa_context_module_skip_indexer"),  # GLM-5 runs the indexer on every layer
        mcase(isl=0),
    ):
        with pytest.raises(KernelLimit):
            dsa.prepare(bad, "x", "cpu", 1, True)
    assert not any(name == "sglang" or name.startswith("sglang.") for name in sys.modules)


def test_dsa_module_footprint_grows_with_the_case():
    base = dsa.footprint(mcase(heads=16, batch=2, isl=1024, step=4096), True)
    assert dsa.footprint(mcase(heads=64, batch=2, isl=1024, step=4096), True) > base
    assert dsa.footprint(mcase(heads=16, batch=8, isl=1024, step=4096), True) > base
    assert dsa.footprint(mcase(heads=16, batch=2, isl=1024, step=4096, gemm="fp8_block"), True) < base
    gen = mcase(heads=16, batch=64, isl=1, op="dsa_generation_module")
    assert dsa.footprint(gen._replace(step=65536), False) > dsa.footprint(gen._replace(step=1024), False)
    assert dsa.footprint(mcase(kv="fp8"), True) < dsa.footprint(mcase(), True)  # 656 bytes a token, not 576 x 2
    # a 1M-token GLM-5.2 prefill: the caches dominate (32 x 1M tokens x (576 x 2 + 132) bytes)
    huge = mcase(GLM, heads=8, batch=32, isl=256, step=1048576 - 256, model="zai-org/GLM-5.2")
    assert 40 * GB < dsa.footprint(huge, True) < 60 * GB
    assert dsa.footprint(mcase()._replace(architecture="X", model="y"), True) == 0


def test_the_model_keys_are_the_checkpoints():
    common = ("hidden_size", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
              "rms_norm_eps", "index_topk", "index_n_heads", "index_head_dim", "model_type", "max_position_embeddings",
              "architectures", "num_hidden_layers")  # fmt: skip
    v32 = json.loads((CONFIGS / "deepseek-ai--DeepSeek-V3.2_config.json").read_text())
    glm52 = json.loads((CONFIGS / "zai-org--GLM-5.2-FP8_config.json").read_text())
    for keys, source in ((inputs.V32, v32), (inputs.GLM52, glm52)):
        assert {k: keys[k] for k in common} == {k: source[k] for k in common}
    for k in ("rope_parameters", "indexer_rope_interleave", "rope_interleave", "index_topk_freq",
              "index_skip_topk_offset"):  # fmt: skip
        assert inputs.GLM52[k] == glm52[k]
    rope = {("rope_type" if k == "type" else k): v for k, v in v32["rope_scaling"].items()}  # transformers 5's form
    assert inputs.V32["rope_parameters"] == {**rope, "rope_theta": v32["rope_theta"]}
    profile = yaml.safe_load((ROOT / "cases" / "models" / f"{GLM}.yaml").read_text())
    [glm5] = [m for m in profile["models"] if m["name"] == "GLM-5"]
    assert inputs.GLM5["max_position_embeddings"] == glm5["config"]["max_position_embeddings"]
    d = DIMS[GLM]
    assert (d.hidden, d.q_lora, d.qk_nope, d.index_heads) == (6144, 2048, 192, 32)
    keys = inputs.model_keys(mcase(GLM, model="zai-org/GLM-5.1"), 300000)  # a model not listed: its architecture's
    assert keys["max_position_embeddings"] == 300000 and keys["num_attention_heads"] == 32
    assert keys["rope_parameters"] is not inputs.GLM5["rope_parameters"]


def test_decode_graph_batch_limits_follow_the_gpus_memory():
    assert [inputs.decode_graph_max_bs(gib * 1024) for gib in (16, 24, 48, 80, 141, 180)] == [8, 24, 32, 256, 256, 512]


@pytest.mark.parametrize(("context", "mha", "major", "skip", "impl", "want"), [
    (True, True, 9, True, "flashmla_sparse", "sglang_dsa_dense_mha_fa3"),
    (True, False, 9, True, "flashmla_kv", "sglang_dsa_skip_indexer_flashmla_kv"),
    (False, False, 10, False, "trtllm", "sglang_dsa_indexer_trtllm"),
    (False, True, 9, False, "fa3", "sglang_dsa_indexer_fa3"),  # use_mha is a prefill decision
])  # fmt: skip
def test_labels_are_the_references(context, mha, major, skip, impl, want):
    assert inputs.label(context, mha, major, skip, impl) == want


def test_sglangs_dsa_modules_are_planned_and_their_labels_name_kernels(planner):
    ops = ("dsa_context_module", "dsa_generation_module")
    plan = planner.plan("sglang", "90", PlanOptions(ops=ops))
    for op in ops:
        labels = set(plan.ops[op].dispatch)
        assert labels and all(kt.meaning("sglang", label, op) for label in labels), labels
        assert RUNNERS.find(op, next(iter(labels))) is not None
    assert "sglang_dsa_dense_mha_fa3" in set(plan.ops["dsa_context_module"].dispatch)
    sparse = "void sm90::fwd::sparse_attn_fwd_kernel<sm90::fwd::KernelTemplate<576, false>>"
    fa3 = "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<..>>>"
    assert not kt.contradicts_label("sglang", "sglang_dsa_skip_indexer_flashmla_sparse", [sparse], None)
    assert kt.contradicts_label("sglang", "sglang_dsa_indexer_flashmla_sparse", [fa3], None)
    assert not kt.contradicts_label("sglang", "sglang_dsa_indexer_fa3", ["deep_gemm::fp8_mqa_logits", fa3], None)


def _parameters(tree, cls: str, method: str = "__init__") -> set:
    [node] = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls]
    [func] = [f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == method]
    return {a.arg for a in func.args.args + func.args.kwonlyargs}


def _config_reads(tree, cls: str, name: str = "config") -> set:
    [node] = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls]
    [func] = [f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"]
    direct = {n.attr for n in ast.walk(func) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
              and n.value.id == name}  # fmt: skip
    asked = {n.args[1].value for n in ast.walk(func) if isinstance(n, ast.Call) and getattr(n.func, "id", "") in
             ("getattr", "hasattr") and len(n.args) > 1 and getattr(n.args[0], "id", "") == name}  # fmt: skip
    return direct | asked


def test_the_pinned_wheels_dsa_module_takes_what_the_runner_passes():
    model = ast.parse(sglang_source("sglang/srt/models/deepseek_v2.py"))
    layer = dsa.layer_args(SimpleNamespace(**inputs.model_keys(mcase(GLM), 100)))
    params = _parameters(model, "DeepseekV2AttentionMLA")
    assert set(layer) | {"quant_config", "alt_stream"} <= params
    # the decoder layer passes its attention these keywords and no others (deepseek_v2.py:1982-2003)
    [decoder] = [n for n in ast.walk(model) if isinstance(n, ast.ClassDef) and n.name == "DeepseekV2DecoderLayer"]
    [built] = [n for n in ast.walk(decoder) if isinstance(n, ast.Call) and getattr(n.func, "id", "") ==
               "DeepseekV2AttentionMLA"]  # fmt: skip
    assert {k.arg for k in built.keywords} == set(layer) | {"quant_config", "alt_stream"}
    # every config key the module reads is held (the rest are asked with a default)
    held = set(inputs.GLM52) | {"num_attention_heads", "num_key_value_heads"}
    assert _config_reads(model, "DeepseekV2AttentionMLA") - held <= {"q_lora_rank"} | held
    assert {"rms_norm_eps", "indexer_rope_interleave", "rope_interleave"} <= _config_reads(
        model, "DeepseekV2AttentionMLA")  # fmt: skip
    batch = ast.parse(sglang_source("sglang/srt/model_executor/forward_batch_info.py"))
    [fb] = [n for n in ast.walk(batch) if isinstance(n, ast.ClassDef) and n.name == "ForwardBatch"]
    fields = {n.target.id for n in fb.body if isinstance(n, ast.AnnAssign)}
    assert {"batch_size", "input_ids", "req_pool_indices", "seq_lens", "out_cache_loc", "seq_lens_sum",
            "seq_lens_cpu", "positions", "extend_num_tokens", "extend_seq_lens", "extend_prefix_lens",
            "extend_start_loc", "extend_seq_lens_cpu", "extend_prefix_lens_cpu"} <= fields  # fmt: skip
    args = ast.parse(sglang_source("sglang/srt/server_args.py"))
    assert _parameters(args, "ServerArgs", "_set_default_dsa_backends") == {"self", "kv_cache_dtype", "major"}
    backend = sglang_source("sglang/srt/layers/attention/dsa_backend.py")
    for read in ("model_runner.page_size", "model_runner.server_args.dsa_prefill_backend",
                 "model_runner.token_to_kv_pool.dsa_kv_cache_store_fp8", "model_runner.hisparse_coordinator",
                 "self.device_sm_major = self.device_capability[0]", "self.use_mha = (",
                 "envs.SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD.get()"):  # fmt: skip
        assert read in backend, read
    mla = sglang_source("sglang/srt/models/deepseek_common/attention_forward_methods/forward_mla.py")
    assert "return output, topk_indices" in mla and "prev_topk_indices" in mla
    communicator = sglang_source("sglang/srt/layers/communicator.py")
    assert "if self.qkv_latent_ is not None:\n            return self.qkv_latent_" in communicator


def test_the_contract_check_covers_every_sglang_symbol_the_dsa_runner_imports():
    uses = sglang_uses("/dsa.py")
    assert {
        "sglang.srt.models.deepseek_v2.DeepseekV2AttentionMLA",
        "sglang.srt.layers.attention.dsa_backend.DeepseekSparseAttnBackend",
        "sglang.srt.mem_cache.memory_pool.DSATokenToKVPool",
        "sglang.srt.model_executor.model_runner_kv_cache_mixin.ModelRunnerKVCacheMixin.calculate_mla_kv_cache_dim",
        "sglang.srt.models.deepseek_common.deepseek_weight_loader.DeepseekV2WeightLoaderMixin.post_load_weights",
        "sglang.srt.model_loader.weight_utils.initialize_dummy_weights",
        "sglang.srt.layers.communicator.AttentionInputs",
        "sglang.srt.model_executor.runner.model_capture_mode",
    } <= {u.label for u in uses}
    assert pinned_problems(uses) == []
