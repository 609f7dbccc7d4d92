"""The vLLM plans' dispatch follows vLLM 0.24.0's own selection code, as scripts/selection_tables.py records it.

The regeneration test runs the pinned wheel's MoE oracles and attention selector on this CPU for SM90, SM100,
SM103 and SM120 (in a subprocess: the planner's process never imports vLLM) and compares with the committed
cases/selection/vllm-0.24.0.yaml.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from opcollect.plans import attention, mla_module, moe, selection
from opcollect.plans.attention import AttentionCase
from opcollect.plans.base import Group
from opcollect.plans.moe import MoeCase

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / ".cache" / "wheels"  # .ci/run's `nox -s contract-vllm` fills it


def _group(op: str, **constants) -> Group:
    return Group(op=op, label="/".join(map(str, constants.values())), constants=constants, case_type=tuple, values=[])


def _moe(dtype: str, ep: int = 1, hidden: int = 7168, inter: int = 2048) -> MoeCase:
    return MoeCase(dtype, 128, hidden, inter, 8, 256, 1, ep, "balanced")


def _attn(head_dim: int, kv: str, isl: int = 1024, step: int = 0) -> AttentionCase:
    return AttentionCase(1, isl, 32, 8, head_dim, 1, "bfloat16", kv, step, 0)


def _vllm_moe(sm: str, case: MoeCase) -> str:
    dispatch = moe._vllm(sm, _group("moe", moe_dtype=case.moe_dtype))
    return moe._vllm_case(sm, dispatch, case)


def test_the_committed_file_is_what_the_pinned_wheel_selects():
    wheels = sorted(WHEELS.glob("vllm-0.24.0-*.whl"))
    if not wheels:
        pytest.skip("no pinned vLLM wheel in .cache/wheels; `nox -s contract-vllm` downloads it (.ci/run does)")
    pytest.importorskip("torch", reason="the selection modules import torch (CPU torch is enough)")
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "selection_tables.py"), "--check", "--wheel", str(wheels[-1])],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]


def test_the_committed_file_covers_sm90_and_sm100():
    data = selection.table()
    for sm in ("90", "100"):
        assert set(data[sm]) == {"moe", "attention", "mla"}
        assert data[sm]["moe"]["bfloat16"]["tp"].startswith("vllm_unquantizedfusedmoe_")


def test_moe_dispatch_is_the_oracles_answer(monkeypatch):
    fake = {"100": {"moe": {"fp8": {"tp": "vllm_a", "ep": "vllm_a"}, "fp8_block": {"tp": "vllm_tp", "ep": "vllm_ep"}}}}
    monkeypatch.setattr(selection, "table", lambda name=selection.VLLM: fake)
    assert _vllm_moe("100", _moe("fp8")) == "vllm_a"
    assert _vllm_moe("100", _moe("fp8_block", ep=1)) == "vllm_tp"
    assert _vllm_moe("100", _moe("fp8_block", ep=4)) == "vllm_ep"
    # gpt-oss's MXFP4 follows the oracle, other MXFP4 checkpoints keep the collector's Marlin path
    fake["100"]["moe"]["w4a16_mxfp4"] = {"tp": "vllm_gptoss", "ep": "vllm_gptoss"}
    assert _vllm_moe("100", _moe("w4a16_mxfp4", hidden=2880, inter=2880)) == "vllm_gptoss"
    assert _vllm_moe("100", _moe("w4a16_mxfp4")).endswith("marlinexperts_situ_as_silu")
    # an SM the file does not cover keeps the hand-written rule
    assert _vllm_moe("89", _moe("bfloat16")) == "vllm_unquantizedfusedmoe_triton_tritonexperts"


def test_a_refused_selection_is_no_label(monkeypatch):
    """scripts/selection_tables.py records a selector's refusal as "unsupported: <its message>": that is no kernel
    label, so the answer is None and the plan keeps its hand-written rule, never dispatching to the message."""
    refused = "unsupported: no attention backend supports head size 512"
    fake = {
        "100": {
            "moe": {"fp8": {"tp": refused, "ep": refused}, "nvfp4": {"tp": "vllm_tp", "ep": refused}},
            "attention": {"bfloat16": {512: refused, 128: "FLASH_ATTN"}},
            "mla": {"fp8": refused, "bfloat16": "FLASHMLA"},
        }
    }
    monkeypatch.setattr(selection, "table", lambda name=selection.VLLM: fake)
    assert selection.vllm_moe("100", "fp8") is None and selection.vllm_moe("100", "fp8", True) is None
    assert selection.vllm_moe("100", "nvfp4", False) == "vllm_tp" and selection.vllm_moe("100", "nvfp4", True) is None
    assert selection.vllm_attention("100", "bfloat16", 512) is None
    assert selection.vllm_attention("100", "bfloat16", 128) == "FLASH_ATTN"
    assert selection.vllm_mla("100", "fp8") is None and selection.vllm_mla("100", "bfloat16") == "FLASHMLA"
    refused_dispatch = _vllm_moe("100", _moe("fp8"))
    monkeypatch.setattr(selection, "table", lambda name=selection.VLLM: {})
    assert refused_dispatch == _vllm_moe("100", _moe("fp8"))  # the hand rule, as with no file at all


def test_sm100_moe_follows_the_oracle_where_the_fitted_rule_did_not():
    # group-128 int4 experts with SiLU: FlashInfer's TRT-LLM MxInt4 takes group 32 and SwiGLU-OAI only
    # (fused_moe/experts/trtllm_mxint4_moe.py:63-72), so the oracle falls to Marlin (oracle/int_wna16.py:79-93)
    assert _vllm_moe("100", _moe("int4_wo")) == "vllm_compressedtensorswna16marlinmoe_marlin_marlinexperts"
    # SM90 keeps the reference's split: Triton for TP, FlashInfer CUTLASS for EP (oracle/fp8.py:105-115)
    assert _vllm_moe("90", _moe("fp8_block", ep=1)) == "vllm_fp8moe_triton_tritonexperts"
    assert _vllm_moe("90", _moe("fp8_block", ep=8)) == "vllm_fp8moe_flashinfer_cutlass_flashinferexperts"


def test_attention_dispatch_is_the_selectors_answer(monkeypatch):
    fake = {"100": {"attention": {"bfloat16": {128: "FLASHINFER", 96: "vllm_flash_attn_fa4"}, "fp8": {96: "vllm_x"}}}}
    monkeypatch.setattr(selection, "table", lambda name=selection.VLLM: fake)
    rule = attention._vllm_case
    assert rule("100", "FLASHINFER", _attn(96, "bfloat16")) == "vllm_flash_attn_fa4"
    assert rule("100", "FLASHINFER", _attn(96, "fp8")) == "vllm_x"
    # FlashInfer's TRT-LLM-gen kernels are picked per batch: prefill or decode
    assert rule("100", "FLASHINFER", _attn(128, "bfloat16")) == "vllm_flashinfer_trtllmprefill"
    assert rule("100", "FLASHINFER", _attn(128, "bfloat16", isl=1, step=100)) == "vllm_flashinfer_trtllmdecode"


def test_mla_module_dispatch_is_the_selectors_answer(monkeypatch):
    monkeypatch.setattr(selection, "table", lambda name=selection.VLLM: {"100": {"mla": {"fp8": "CUTLASS_MLA"}}})
    group = _group("mla_generation_module", mla_dtype="bfloat16", kv_cache_dtype="fp8", gemm_type="bfloat16")
    assert mla_module.GENERATION.dispatch["vllm"]("100", group) == "CUTLASS_MLA"
    # no answer: plans/mla.py's rule
    group = _group("mla_generation_module", mla_dtype="bfloat16", kv_cache_dtype="bfloat16", gemm_type="bfloat16")
    assert mla_module.GENERATION.dispatch["vllm"]("100", group) == "FLASHINFER_MLA"


def test_planning_imports_no_framework():
    code = "import sys, opcollect.plans.selection as s; s.table(); print('vllm' in sys.modules, 'torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["False", "False"], done.stderr
