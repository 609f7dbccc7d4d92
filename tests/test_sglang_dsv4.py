"""SGLang's DeepSeek-V4 CSA indexer kernels (backends/sglang/dsv4_kernels.py) against stand-ins for SGLang 0.5.14 up
to the kernel call.

The stand-ins model what the runner hands its kernels: PagedIndexerMetadata (dsv4/metadata.py:96-160: page size 256,
DeepGEMM's schedule unless the torch logits are on, the v2 top-k plan where SGLANG_OPT_USE_TOPK_V2), DeepGEMM's
fp8_paged_mqa_logits computing each row's logits from the pages its page-table row names, and the top-k kernels
selecting each row's top index_topk of its visible entries and mapping them through its page-table row. So the tests
check which call each row runs, over which lengths, pages and scores, which label it reports on which device, and
the refusals. Where .cache/wheels holds SGLang's pinned wheel, the constants, flags and calls the runner relies on are
read from it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from conftest import install_fakes
from fake_frameworks import Recorder
from fake_sglang import Field, pinned_problems, sglang_source, sglang_uses

from opcollect.backends import kernels as kt
from opcollect.backends.sglang import RUNNERS
from opcollect.backends.sglang import dsv4_kernels as dk
from opcollect.plans.dsv4_kernels import Dsv4KernelCase, Dsv4TopkCase
from opcollect.plans.planner import PlanOptions
from opcollect.runtime.contract import KernelLimit

torch = pytest.importorskip("torch")

FLASH, PRO = "sgl-project/DeepSeek-V4-Flash-FP8", "sgl-project/DeepSeek-V4-Pro-FP8"
ARCH = "DeepseekV4ForCausalLM"
LABELS = ("fp8_e4m3", "fp8_e4m3", "fp8_block")


def pcase(batch=2, isl=3, step=300, model=FLASH, labels=LABELS, ratio=4) -> Dsv4KernelCase:
    return Dsv4KernelCase(model, ARCH, *labels, 64, 64, batch, isl, 1, step, ratio)


def tcase(batch=2, isl=3, step=2100, mode="v1_top_last", model=FLASH) -> Dsv4TopkCase:
    return Dsv4TopkCase(model, ARCH, *LABELS, 64, batch, isl, 1, step, 4, mode)


def dequantized(cache):
    """The indexer cache [pages, 64, 1, 132] as fp32 keys [pages, 64, 128]: fp8 values x their fp32 scale."""
    flat = cache.view(cache.shape[0], -1)
    values = flat[:, : 64 * 128].view(torch.float8_e4m3fn).float().view(-1, 64, 128)
    scales = flat[:, 64 * 128 :].contiguous().view(torch.float32).view(-1, 64, 1)
    return values * scales


class FakeSgl(Recorder):
    """Stand-ins for what the DeepSeek-V4 kernel runner imports (each cites the SGLang source it models)."""

    def __init__(self):
        super().__init__()
        self.sm120 = self.hip = False
        self.envs = SimpleNamespace(  # environ.py:787-827 defaults
            SGLANG_OPT_USE_TOPK_V2=Field(True),
            SGLANG_TOPK_TRANSFORM_512_TORCH=Field(False),
            SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=Field(False),
            SGLANG_OPT_USE_TILELANG_INDEXER=Field(False),
            SGLANG_OPT_USE_AITER_INDEXER=Field(False),
            SGLANG_OPT_USE_JIT_INDEXER_METADATA=Field(True),
        )
        envs = self.envs

        class PagedIndexerMetadata:  # dsv4/metadata.py:96-160
            def __init__(self, page_size, page_table, c4_seq_lens):
                assert page_size == 256 and page_table.dtype == c4_seq_lens.dtype == torch.int32
                assert page_table.shape[0] == c4_seq_lens.shape[0]
                self.page_size, self.page_table, self.c4_seq_lens = page_size, page_table, c4_seq_lens
                torch_logits = envs.SGLANG_FP8_PAGED_MQA_LOGITS_TORCH.get() or envs.SGLANG_OPT_USE_AITER_INDEXER.get()
                self.deep_gemm_metadata = None if torch_logits else ("schedule", c4_seq_lens.clone())
                self.topk_metadata = ("plan", c4_seq_lens.clone()) if envs.SGLANG_OPT_USE_TOPK_V2.get() else None

            c4_page_size = property(lambda self: self.page_size // 4)
            max_c4_seq_len = property(lambda self: self.page_table.shape[1] * self.c4_page_size)

        self.PagedIndexerMetadata = PagedIndexerMetadata

    def paged_logits(self, name):
        def fn(q, kv, weights, context_lens, block_table, schedule, max_context_len, clean_logits):
            rows, next_n, heads, dim = q.shape
            assert next_n == 1 and q.dtype == torch.float8_e4m3fn and (heads, dim) == (64, 128)
            assert kv.dtype == torch.uint8 and tuple(kv.shape[1:]) == (64, 1, 132)
            assert weights.dtype == torch.float32 and tuple(weights.shape) == (rows, heads)
            assert context_lens.dtype == torch.int32 and tuple(context_lens.shape) == (rows, 1)
            assert block_table.dtype == torch.int32 and block_table.shape[0] == rows
            assert max_context_len == block_table.shape[1] * 64 and clean_logits is False
            assert int(context_lens.max()) <= max_context_len and int(block_table.max()) < kv.shape[0]
            keys = dequantized(kv)
            out = torch.zeros(rows, max_context_len)
            for r in range(rows):
                n = int(context_lens[r, 0])
                k = keys[block_table[r].long()].reshape(-1, 128)[:n]  # the row's pages, in order
                out[r, :n] = (torch.einsum("hd,td->ht", q[r, 0].float(), k).relu() * weights[r, :, None]).sum(0)
            self.record(name, q=q, kv=kv, weights=weights, lens=context_lens, table=block_table, schedule=schedule,
                        width=max_context_len, out=out)  # fmt: skip
            return out

        return fn

    def topk(self, name):
        def fn(scores, seq_lens, page_tables, out, page_size, extra):
            rows, k = out.shape
            assert k in (512, 1024) and page_size == 64 and scores.dtype == torch.float32
            assert seq_lens.dim() == 1 and seq_lens.shape[0] == page_tables.shape[0] == scores.shape[0] == rows
            if name == "v2":
                assert extra[0] == "plan" and torch.equal(extra[1], seq_lens)  # plan_topk_v2 of these lengths
            raw = extra if name != "v2" else None
            for r in range(rows):
                n = int(seq_lens[r])
                chosen = torch.arange(n) if n <= k else scores[r, :n].topk(k).indices
                out[r, : chosen.numel()] = (page_tables[r, chosen // 64] * 64 + chosen % 64).int()
                if raw is not None:
                    raw[r, : chosen.numel()] = chosen.int()
            self.record(name, scores=scores, lens=seq_lens, table=page_tables, out=out, raw=raw)

        return fn

    def install(self, monkeypatch):
        install_fakes(monkeypatch, {
            "sglang.srt.environ": {"envs": self.envs},
            "sglang.srt.utils.common": {"is_hip": lambda: self.hip, "is_sm120_supported": lambda: self.sm120},
            "sglang.srt.layers.attention.dsv4.metadata": {"PagedIndexerMetadata": self.PagedIndexerMetadata},
            "sglang.srt.layers.attention.dsv4.indexer": {
                "fp8_paged_mqa_logits_torch": self.paged_logits("torch"),
                "fp8_paged_mqa_logits_torch_sm120": self.paged_logits("torch_sm120"),
                "topk_transform_512": self.topk("v1"),
                "topk_transform_512_v2": self.topk("v2"),
                "topk_transform_512_pytorch_vectorized": self.topk("pytorch")},
            "sglang.srt.layers.attention.dsa.dsa_indexer": {
                "deep_gemm": SimpleNamespace(fp8_paged_mqa_logits=self.paged_logits("deep_gemm"))},
        })  # fmt: skip


@pytest.fixture
def sgl(monkeypatch):
    return FakeSgl.installed(monkeypatch)


# --- the paged MQA logits ---


def test_paged_logits_run_deepgemm_over_each_requests_own_pages(sgl):
    case = pcase(batch=2, isl=3, step=300)
    prepared = dk.prepare_paged(case, "deep_gemm.fp8_paged_mqa_logits", "cpu", 2)
    assert prepared.kernel_source == "deep_gemm.fp8_paged_mqa_logits" and sgl.calls == []
    prepared.call()
    prepared.call()
    (name, first), (_, second) = sgl.calls
    assert name == "deep_gemm" and first["q"] is not second["q"] and first["kv"] is not second["kv"]
    # positions 300..302 of each request: (position + 1) // 4 compressed entries, unclamped, per request
    assert first["lens"].flatten().tolist() == [75, 75, 75, 75, 75, 75]
    # 303 tokens: 2 pages of 256 a request, each its own; the rows of a request share its row of the table
    assert first["table"].tolist() == [[0, 1]] * 3 + [[2, 3]] * 3 and tuple(first["kv"].shape) == (4, 64, 1, 132)
    assert first["width"] == 128 and first["schedule"][0] == "schedule"  # DeepGEMM's schedule of the metadata
    # a row of the second request scores that request's keys, not the first's
    keys = dequantized(first["kv"])[2:4].reshape(-1, 128)[:75]
    want = (torch.einsum("hd,td->ht", first["q"][4, 0].float(), keys).relu() * first["weights"][4, :, None]).sum(0)
    assert torch.allclose(first["out"][4, :75], want)


def test_paged_logits_rows_see_their_own_causal_lengths(sgl):
    dk.prepare_paged(pcase(batch=1, isl=6, step=1), "x", "cpu", 1).call()
    (_, call) = sgl.calls[0]
    assert call["lens"].flatten().tolist() == [0, 0, 1, 1, 1, 1]  # positions 1..6; serving does not clamp
    assert call["table"].tolist() == [[0]] * 6 and call["width"] == 64


def test_on_sm120_the_hook_picks_the_torch_logits_and_the_flags_are_restored(sgl):
    sgl.sm120 = True
    prepared = dk.prepare_paged(pcase(), "fp8_paged_mqa_logits_torch_sm120", "cpu", 1)
    assert prepared.kernel_source == "fp8_paged_mqa_logits_torch_sm120"
    prepared.call()
    assert sgl.calls[0][0] == "torch_sm120" and sgl.calls[0][1]["schedule"] is None  # no DeepGEMM schedule
    assert sgl.envs.SGLANG_FP8_PAGED_MQA_LOGITS_TORCH.get() is False  # the hook's flags hold for the build only
    sgl.sm120, sgl.envs.SGLANG_FP8_PAGED_MQA_LOGITS_TORCH.value = False, True
    assert dk.prepare_paged(pcase(), "x", "cpu", 1).kernel_source == "fp8_paged_mqa_logits_torch"


def test_an_indexer_the_runner_does_not_model_is_refused(sgl):
    sgl.envs.SGLANG_OPT_USE_TILELANG_INDEXER.value = True
    with pytest.raises(KernelLimit, match="TILELANG"):
        dk.prepare_paged(pcase(), "x", "cpu", 1)


@pytest.mark.parametrize(("case", "why"), [
    (pcase(labels=("bfloat16", "fp8_e4m3", "fp8_block")), "labels"),
    (pcase(ratio=128), "compresses by 4"),
    (pcase(model="someone/DeepSeek-V4-Tiny"), "no dimensions"),
    (pcase(isl=0), "new tokens"),
])  # fmt: skip
def test_what_the_indexer_does_not_run_is_refused_before_any_import(case, why):
    with pytest.raises(KernelLimit, match=why):
        dk.prepare_paged(case, "x", "cpu", 1)  # no fakes installed: the refusal comes before sglang is imported


# --- the top-k ---


def test_prefill_topk_is_v1_with_raw_indices_over_serving_lengths_and_pages(sgl):
    case = tcase(batch=2, isl=3, step=2100, mode="v1_top_last")
    prepared = dk.prepare_topk(case, "topk_transform_v1", "cpu", 1)
    assert prepared.kernel_source == "topk_transform_v1"
    prepared.call()
    (name, call) = sgl.calls[0]
    assert name == "v1" and call["raw"] is not None and tuple(call["out"].shape) == (6, 512)
    assert call["lens"].tolist() == [525, 525, 525, 525, 525, 525]  # (2100 + j + 1) // 4
    assert tuple(call["scores"].shape) == (6, 576)  # 9 pages of 64 compressed entries: serving's width
    # top_last: each row's winners are its last 512 visible entries, mapped through its request's pages
    assert sorted(call["raw"][4].tolist()) == list(range(13, 525))
    assert call["out"][4].min().item() == 9 * 64 + 13 and call["table"][4, 0].item() == 9


def test_decode_topk_is_v2_with_its_plan_and_flat_scores_are_zero(sgl):
    case = tcase(batch=3, isl=1, step=4000, mode="v2_flat")
    prepared = dk.prepare_topk(case, "topk_transform_v2", "cpu", 1)
    assert prepared.kernel_source == "topk_transform_v2"
    prepared.call()
    (name, call) = sgl.calls[0]
    assert name == "v2" and call["raw"] is None and not bool(call["scores"].any())
    assert call["lens"].tolist() == [1000, 1000, 1000] and call["table"][:, 0].tolist() == [0, 16, 32]


def test_where_v2_is_off_decode_runs_v1_and_says_so(sgl):
    sgl.sm120 = True  # the hook turns SGLANG_OPT_USE_TOPK_V2 off (server_args.py:3796)
    prepared = dk.prepare_topk(tcase(isl=1, step=4000, mode="v2_top_last"), "topk_transform_v2", "cpu", 1)
    assert prepared.kernel_source == "topk_transform_v1"
    prepared.call()
    assert sgl.calls[0][0] == "v1" and sgl.calls[0][1]["raw"] is None  # decode passes no raw indices
    sgl.sm120, sgl.envs.SGLANG_TOPK_TRANSFORM_512_TORCH.value = False, True
    assert dk.prepare_topk(tcase(), "x", "cpu", 1).kernel_source == "topk_transform_512_pytorch_vectorized"


def test_a_trivial_topk_is_untimed_and_other_modes_are_refused(sgl):
    small = tcase(isl=3, step=100)  # (103) // 4 = 25 <= 512 entries: every entry kept
    assert dk.trivial_topk(small) and dk.topk_footprint(small) == 0
    with pytest.raises(KernelLimit, match="untimed"):
        dk.prepare_topk(small, "x", "cpu", 1)
    with pytest.raises(KernelLimit, match="score modes"):
        dk.prepare_topk(tcase(mode="flat"), "x", "cpu", 1)
    assert not dk.trivial_topk(tcase(model=PRO, step=4100, isl=1)) and dk.trivial_topk(tcase(model=PRO, step=4000))


def test_footprints_grow_with_the_case():
    assert 0 < dk.paged_footprint(pcase(step=300)) < dk.paged_footprint(pcase(step=30000))
    assert dk.paged_footprint(pcase(batch=1)) < dk.paged_footprint(pcase(batch=4))
    assert 0 < dk.topk_footprint(tcase(step=4096)) < dk.topk_footprint(tcase(batch=4, step=4096))
    # the logits of 8192 rows over a million cached tokens are counted whole: 8192 x 262144 fp32
    assert dk.paged_footprint(pcase(batch=1, isl=8192, step=2**20 - 8192)) >= 8192 * 2**18 * 4


def test_the_ops_are_registered_and_a_trivial_topk_is_untimed():
    paged = RUNNERS.find("dsv4_paged_mqa_logits_module", "deep_gemm.fp8_paged_mqa_logits")
    topk = RUNNERS.find("dsv4_csa_topk_calib", "topk_transform_v1")
    assert paged.prepare is dk.prepare_paged and topk.prepare is dk.prepare_topk
    assert topk.untimed(tcase(step=100)) and not topk.untimed(tcase(step=4000))


@pytest.mark.parametrize(("label", "ran", "lies"), [
    ("deep_gemm.fp8_paged_mqa_logits", "void deep_gemm::sm90_fp8_paged_mqa_logits<64u, 64u, 128u>", False),
    ("deep_gemm.fp8_paged_mqa_logits", "void deep_gemm::sm90_fp8_mqa_logits<64u, 128u, false>", True),
    ("topk_transform_v1", "void (anonymous namespace)::topk_transform_kernel<true>(TopKParams)", False),
    ("topk_transform_v1", "void (anonymous namespace)::topk_transform_prefill_kernel(FastTopKParams, int*)", True),
    ("topk_transform_v2", "void (anonymous namespace)::topk_short_transform(TopKParams)", False),
    ("topk_transform_v2", "void (anonymous namespace)::topk_fused_transform(TopKParams)", False),
    ("topk_transform_v2", "void (anonymous namespace)::topk_transform_kernel<true>(TopKParams)", True),
])  # fmt: skip
def test_the_kernel_labels_name_their_kernels(label, ran, lies):
    assert kt.contradicts_label("sglang", label, [ran], None) is lies
    if label.startswith("topk_transform_v"):
        assert not kt.contradicts_dispatch("sglang", "topk_transform", label)  # each serves the plan's top-k


def test_sglangs_dsv4_kernel_ops_are_planned_and_have_runners(planner):
    ops = ("dsv4_paged_mqa_logits_module", "dsv4_csa_topk_calib")
    plan = planner.plan("sglang", "90", PlanOptions(ops=ops))
    held = {op: set(plan.ops[op].dispatch) for op in ops if op in plan.ops and plan.ops[op].values}
    assert held == {
        "dsv4_paged_mqa_logits_module": {"deep_gemm.fp8_paged_mqa_logits"},
        "dsv4_csa_topk_calib": {"topk_transform_v1", "topk_transform_v2"},
    }
    for op, dispatches in held.items():
        for dispatch in dispatches:
            assert RUNNERS.find(op, dispatch) is not None


# --- the pinned wheel ---


def test_the_pinned_wheels_constants_flags_and_calls_are_what_the_runner_models():
    metadata = sglang_source("sglang/srt/layers/attention/dsv4/metadata.py")
    assert 'assert self.page_size == 256, "the system hardcodes page_size=256"' in metadata
    assert "return self.page_size // 4" in metadata
    assert "self.topk_metadata = plan_topk_v2(self.c4_seq_lens)" in metadata
    indexer = sglang_source("sglang/srt/layers/attention/dsv4/indexer.py")
    assert "block_kv = 64" in indexer and "head_dim_with_sf = 68 if use_fp4_indexer else 132" in indexer
    assert "from deep_gemm import fp8_paged_mqa_logits as fn" in indexer
    assert "fn = fp8_paged_mqa_logits_torch_sm120" in indexer
    assert "indexer_metadata.max_c4_seq_len,\n            False," in indexer  # clean_logits False
    assert "envs.SGLANG_OPT_USE_TOPK_V2.get() and raw_indices is None" in indexer
    kernel = sglang_source("sglang/srt/layers/attention/dsv4/metadata_kernel.py")
    assert "c4_seq_lens_raw = seq_len // 4" in kernel  # the indexer's lengths: unclamped
    backend = sglang_source("sglang/srt/layers/attention/deepseek_v4_backend.py")
    assert "c4_topk_lengths_raw" in backend and "self.c4_sparse_raw_indices = torch.empty_like" in backend
    environ = sglang_source("sglang/srt/environ.py")
    for flag, default in (("SGLANG_OPT_USE_TOPK_V2", True), ("SGLANG_FP8_PAGED_MQA_LOGITS_TORCH", False),
                          ("SGLANG_OPT_USE_TILELANG_INDEXER", False), ("SGLANG_OPT_USE_AITER_INDEXER", False),
                          ("SGLANG_TOPK_TRANSFORM_512_TORCH", False)):  # fmt: skip
        assert f"{flag} = EnvBool({default})" in environ
        assert FakeSgl().envs.__dict__[flag].get() is default
    args = sglang_source("sglang/srt/server_args.py")
    hook = args[args.index("validate_deepseek_v4_cp(self)") :]  # the DeepSeek-V4 branch of the model hook
    sm120 = hook[hook.index("if is_sm120_supported()") : hook.index("elif is_hip()")]
    assert "envs.SGLANG_OPT_USE_TOPK_V2.set(False)" in sm120 and "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH.set(True)" in sm120
    assert dk.hook_flags(True, False) == {dk.TOPK_V2: False, dk.LOGITS_TORCH: True}
    topk = sglang_source("sglang/jit_kernel/dsv4/topk.py")
    assert 'assert topk in (512, 1024), "Only support topk=512 or 1024"' in topk


def test_the_contract_check_covers_every_sglang_symbol_the_runner_imports():
    uses = sglang_uses("dsv4_kernels")
    labels = {u.label for u in uses}
    assert {
        "sglang.srt.environ.envs",
        "sglang.srt.utils.common.is_hip",
        "sglang.srt.utils.common.is_sm120_supported",
        "sglang.srt.layers.attention.dsv4.metadata.PagedIndexerMetadata",
        "sglang.srt.layers.attention.dsv4.indexer",
        "sglang.srt.layers.attention.dsa.dsa_indexer",
    } <= labels
    assert pinned_problems(uses) == []
