"""skips.py: matching rules, reasons, and what the plan reports."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import cases_of

from opcollect.plans import skips
from opcollect.plans.base import make_groups
from opcollect.plans.gemm import GemmCase
from opcollect.plans.ops import OPS
from opcollect.plans.planner import PlanOptions
from opcollect.plans.skips import decide, skip


def gemm_group(dtype="bfloat16", origins=None):
    values = [(dtype, m, n, k) for n, k in [(128, 256), (4096, 4096), (1280, 8192)] for m in (1, 16)]
    return make_groups("gemm", GemmCase, ("gemm_dtype",), {(dtype,): values}, origins or {}, ("n", "k"))[0]


def test_entry_needs_every_key_to_match():
    entries = [skip("x", backend="vllm", op="gemm", sm=["90", "100"], dtype="bfloat16")]
    group = gemm_group()
    assert decide("vllm", "gemm", "90", "cublas", group, {}, entries).skipped == {"x": 6}
    assert decide("vllm", "gemm", "100", "cublas", group, {}, entries).kept == []  # list value: any item
    assert decide("sglang", "gemm", "90", "cublas", group, {}, entries).kept is None
    assert decide("vllm", "gemm", "89", "cublas", group, {}, entries).kept is None
    assert decide("vllm", "gemm", "90", "cublas", gemm_group("fp8"), {}, entries).kept is None


def test_case_field_keys_select_single_cases():
    entries = [skip("big-n", op="gemm", n=[4096, 1280], m=16)]
    decision = decide("torch", "gemm", "cpu", "linear", gemm_group(), {}, entries)
    kept = [gemm_group().values[i] for i in decision.kept]
    assert decision.skipped == {"big-n": 2}
    assert ("bfloat16", 16, 4096, 4096) not in kept and ("bfloat16", 1, 4096, 4096) in kept


def test_dispatch_key_and_unknown_fields():
    group = gemm_group()
    assert decide("vllm", "gemm", "90", "triton", group, {}, [skip("d", dispatch="triton")]).kept == []
    assert decide("vllm", "gemm", "90", "cublas", group, {}, [skip("d", dispatch="triton")]).kept is None
    # an entry keyed on a field this op does not have never matches it
    assert decide("vllm", "gemm", "90", "cublas", group, {}, [skip("h", head_dim=64)]).kept is None


def test_first_matching_entry_takes_the_case():
    entries = [skip("narrow", op="gemm", m=1), skip("wide", op="gemm")]
    decision = decide("torch", "gemm", "cpu", "linear", gemm_group(), {}, entries)
    assert decision.kept == [] and decision.skipped == {"narrow": 3, "wide": 3}


def test_model_key_matches_only_cases_that_only_models_bring():
    origins = {(1280, 8192): frozenset({"Llama-3.1-70B"}), (4096, 4096): frozenset({"Llama-3.1-8B", "Qwen3-8B"})}
    group = gemm_group(origins=origins)
    arch = {"Llama-3.1-70B": "LlamaForCausalLM", "Llama-3.1-8B": "LlamaForCausalLM", "Qwen3-8B": "Qwen3ForCausalLM"}
    by_arch = decide("torch", "gemm", "cpu", "x", group, arch, [skip("m", model="LlamaForCausalLM")])
    assert by_arch.skipped == {"m": 2}  # (4096, 4096) is also Qwen3's, (128, 256) is the base grid's
    both = decide("torch", "gemm", "cpu", "x", group, arch, [skip("m", model=["LlamaForCausalLM", "Qwen3-8B"])])
    assert both.skipped == {"m": 4}


def test_every_entry_has_a_reason_comment_and_known_keys():
    reasons = skips.reasons()
    assert [e.name for e in skips.SKIPS] == list(reasons)
    assert len(set(reasons)) == len(skips.SKIPS)
    known = {"backend", "op", "sm", "model", "dtype", "dispatch"} | {f for op in OPS.values() for f in op.fields}
    for entry in skips.SKIPS:
        assert len(reasons[entry.name]) > 30, entry.name
        assert set(entry.keys) <= known, entry.name
        for op in entry.keys.get("op", ()):
            assert op in OPS, (entry.name, op)


def test_reasons_are_the_comments_above_each_entry():
    source = Path(skips.__file__).read_text()
    assert "# NVFP4 needs the FP4 tensor cores of Blackwell" in source
    assert skips.reasons()["nvfp4-needs-sm100"] == "NVFP4 needs the FP4 tensor cores of Blackwell (SM100 and newer)."
    ast.parse(source)


def test_plan_reports_each_entry_and_capabilities(planner):
    cpu = planner.plan("torch", "cpu")
    assert cpu.ops["attention_context"].skipped.get("torch-sdpa-no-sinks", 0) > 0  # gpt-oss window heads
    assert all(c.window_size != 128 for c in cases_of(cpu.ops["attention_context"]))
    assert set(cpu.ops["gemm"].by_dtype) == {"bfloat16", "float32", "int4_wo"}  # the CPU: no fp8
    sm80 = planner.plan("trtllm", "80", PlanOptions(ops=("gemm",)))
    assert set(sm80.ops["gemm"].by_dtype) == {"bfloat16", "int4_wo"}
    assert sm80.ops["gemm"].skipped["fp8-needs-sm89"] == sm80.ops["gemm"].by_dtype["bfloat16"]
    sm89 = planner.plan("vllm", "89", PlanOptions(ops=("gemm",)))
    assert "fp8" in sm89.ops["gemm"].by_dtype and "fp8_block" in sm89.ops["gemm"].by_dtype  # Triton block fp8
    sm86 = planner.plan("vllm", "86", PlanOptions(ops=("gemm",)))
    assert "fp8_block" not in sm86.ops["gemm"].by_dtype and sm86.ops["gemm"].skipped["fp8-block-needs-sm89"] > 0
    sm90 = planner.plan("sglang", "90", PlanOptions(ops=("gemm",)))
    assert "fp8_block" in sm90.ops["gemm"].by_dtype and "nvfp4" not in sm90.ops["gemm"].by_dtype
    sm100 = planner.plan("vllm", "100", PlanOptions(ops=("gemm",)))
    assert "nvfp4" in sm100.ops["gemm"].by_dtype
    torch90 = planner.plan("torch", "90", PlanOptions(ops=("gemm",)))
    assert set(torch90.ops["gemm"].by_dtype) == {"bfloat16", "fp8", "int4_wo"}
    assert set(torch90.ops["gemm"].by_dispatch) == {
        "torch.nn.functional.linear",
        "torch._scaled_mm",
        "torch._weight_int4pack_mm",
    }
