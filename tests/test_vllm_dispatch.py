"""The vLLM plan's dispatch follows vLLM 0.24.0's own selection per SM, dtype and shape (its agreement with
the reference tables: tests/test_dispatch_vs_reference.py), and vLLM times MLA as its whole module."""

from __future__ import annotations

from pathlib import Path

import pytest

from opcollect.plans import attention, comm, gemm, mla, moe
from opcollect.plans.attention import AttentionCase
from opcollect.plans.coverage import table_coverage
from opcollect.plans.gemm import GemmCase
from opcollect.plans.mla import MlaCase
from opcollect.plans.moe import MoeCase
from opcollect.plans.ops import OPS

REFERENCE = Path(__file__).parent / "data" / "reference"
TABLES = {
    "gemm": REFERENCE / "aiconfigurator-h200/gemm/vllm/0.24.0/gemm_perf.parquet",
    "attention_context": REFERENCE / "attention_slices/vllm/0.24.0/context_attention_perf.parquet",
    "attention_generation": REFERENCE / "attention_slices/vllm/0.24.0/generation_attention_perf.parquet",
    "moe": REFERENCE / "moe_slices/vllm/0.24.0/moe_perf.parquet",
    "comm": REFERENCE / "aiconfigurator-h200/comm/nccl/2.29.2/nccl_perf.parquet",
    "mla_context_module": REFERENCE / "mla_slices/vllm/0.24.0/mla_context_module_perf.parquet",
    "mla_generation_module": REFERENCE / "mla_slices/vllm/0.24.0/mla_generation_module_perf.parquet",
}


@pytest.fixture(scope="module")
def sm90(planner):
    return planner.plan("vllm", "90")


def test_fp8_block_gemm_by_shape():
    rule = gemm._vllm_case
    assert rule("90", "fp8_block", GemmCase("fp8_block", 31, 4096, 7168)) == "FlashInferFp8BlockScaledMMKernel"
    assert rule("90", "fp8_block", GemmCase("fp8_block", 32, 4096, 7168)) == "DeepGemmFp8BlockScaledMMKernel"
    # N % 64 or K % 128 not zero: neither FlashInfer nor DeepGEMM can implement it
    assert rule("90", "fp8_block", GemmCase("fp8_block", 1, 4096, 7200)) == "CutlassFp8BlockScaledMMKernel"
    assert rule("90", "fp8_block", GemmCase("fp8_block", 64, 4160 + 32, 7168)) == "CutlassFp8BlockScaledMMKernel"
    # FlashInfer's block-scale GEMM is gated on exactly SM 9.0: Blackwell runs DeepGEMM for every M
    assert rule("100", "fp8_block", GemmCase("fp8_block", 1, 4096, 7168)) == "DeepGemmFp8BlockScaledMMKernel"
    assert rule("89", "fp8_block", GemmCase("fp8_block", 1, 4096, 7168)) == "TritonFp8BlockScaledMMKernel"
    assert rule("90", "int4_wo", GemmCase("int4_wo", 8, 4096, 4096)) == "MacheteLinearKernel"
    assert rule("90", "int4_wo", GemmCase("int4_wo", 8, 4160, 4096)) == "MarlinLinearKernel"
    assert rule("100", "int4_wo", GemmCase("int4_wo", 8, 4096, 4096)) == "MarlinLinearKernel"


def _attention(head_dim: int, kv: str = "bfloat16", step: int = 0) -> AttentionCase:
    return AttentionCase(1, 1024, 16, 2, head_dim, 1, "bfloat16", kv, step, 0)


def test_attention_kernel_by_sm_and_head():
    rule = attention._vllm_case
    assert rule("90", "FLASH_ATTN", _attention(256)) == "vllm_flash_attn_fa3"
    assert rule("90", "FLASH_ATTN", _attention(512)) == "vllm_flash_attn_fa4"
    assert rule("86", "FLASH_ATTN", _attention(128)) == "vllm_flash_attn_fa2"
    assert attention._vllm("100", None) == "FLASHINFER" and attention._vllm("90", None) == "FLASH_ATTN"
    assert rule("100", "FLASHINFER", _attention(128)) == "vllm_flashinfer_trtllmprefill"
    assert rule("100", "FLASHINFER", _attention(128, step=127)) == "vllm_flashinfer_trtllmdecode"
    one_token = AttentionCase(4, 1, 16, 2, 128, 1, "bfloat16", "bfloat16", 0, 0)  # a prefill of one token
    assert rule("100", "FLASHINFER", one_token) == "vllm_flashinfer_trtllmdecode"
    assert rule("100", "FLASHINFER", _attention(192)) == "vllm_flash_attn_fa4"
    assert rule("100", "FLASHINFER", _attention(192, kv="fp8")) == "vllm_triton_attn"


def test_mla_context_runs_the_prefill_backend_past_the_decode_threshold():
    rule = mla._vllm_context
    case = lambda isl: MlaCase("bfloat16", "bfloat16", 16, 1, isl, 1, 0)  # noqa: E731
    assert rule("90", "FLASH_ATTN_MLA", case(512)) == "FLASH_ATTN_MLA"
    assert rule("90", "FLASH_ATTN_MLA", case(513)) == "FLASH_ATTN"
    assert rule("90", "FLASHMLA", case(128)) == "FLASHMLA" and rule("90", "FLASHMLA", case(129)) == "FLASH_ATTN"
    assert rule("100", "FLASHINFER_MLA", case(1)) == "FLASHINFER_MLA"
    assert rule("100", "FLASHINFER_MLA", case(2)) == "FLASH_ATTN"


def test_mla_fp8_prefill_query_names_the_prefill_backend_vllm_serves_it_with():
    from opcollect.backends.vllm.mla import FP8_PREFILL_BACKEND

    rule = mla._vllm_context
    fp8 = lambda isl: MlaCase("fp8", "fp8", 16, 1, isl, 1, 0)  # noqa: E731
    # the SM100 family pins TRTLLM_RAGGED for the fp8 query (the runner sets it: backends/vllm/mla.py)
    assert rule("100", "FLASHINFER_MLA", fp8(2)) == rule("103", "FLASHINFER_MLA", fp8(4096)) == "TRTLLM_RAGGED"
    assert FP8_PREFILL_BACKEND == "TRTLLM_RAGGED"
    assert rule("100", "FLASHINFER_MLA", fp8(1)) == "FLASHINFER_MLA"  # within the decode threshold
    assert rule("100", "FLASHINFER_MLA", fp8(2)._replace(mla_dtype="bfloat16")) == "FLASH_ATTN"
    assert rule("90", "FLASHMLA", fp8(129)) == "FLASH_ATTN"  # SM90 unchanged


def test_sm100_plan_labels_the_fp8_prefill_and_nvfp4_module_cases(planner):
    from opcollect.plans.mla_module import MlaModuleCase

    found = planner.plan("vllm", "100").ops["mla_context_module"]
    labels = {}
    for raw, dispatch in zip(found.values, found.dispatch):
        case = MlaModuleCase._make(raw)
        labels.setdefault((case.mla_dtype, case.gemm_type, case.isl > 1), set()).add(dispatch)
    assert labels[("fp8", "fp8_block", True)] == {"TRTLLM_RAGGED"}
    assert labels[("bfloat16", "nvfp4", True)] == {"FLASH_ATTN"}
    assert labels.get(("fp8", "fp8_block", False), {"FLASHINFER_MLA"}) == {"FLASHINFER_MLA"}


def test_moe_fp8_block_by_expert_split_and_mxfp4_by_model():
    rule = moe._vllm_case
    tp = MoeCase("fp8_block", 64, 7168, 2048, 8, 256, 8, 1, "balanced")
    ep = MoeCase("fp8_block", 64, 7168, 2048, 8, 256, 1, 8, "balanced")
    assert rule("90", "fp8_block", tp) == "vllm_fp8moe_triton_tritonexperts"
    assert rule("90", "fp8_block", ep) == "vllm_fp8moe_flashinfer_cutlass_flashinferexperts"
    gpt_oss = MoeCase("w4a16_mxfp4", 64, 2880, 2880, 4, 128, 1, 1, "balanced")
    assert rule("90", "w4a16_mxfp4", gpt_oss) == "vllm_gptossmxfp4moe_triton_oaitritonmxfp4expertsmonolithic"


def test_nccl_is_named_as_the_reference_names_it():
    assert comm._dispatch("90", None) == "NCCL" and comm._dispatch("cpu", None) == "gloo"


@pytest.mark.parametrize("op", ["mla_context_module", "mla_generation_module"])
def test_vllm_times_mla_as_its_module_into_the_reference_module_tables(sm90, op):
    import pyarrow.parquet as pq

    from opcollect.tables.schema import schema_for_op

    reference = pq.read_table(TABLES[op]).schema
    ours = schema_for_op(op, "vllm").perf
    assert ours.names[: len(reference.names)] == reference.names
    assert all(ours.field(n).type == reference.field(n).type for n in reference.names)
    found = table_coverage(OPS[op], sm90.ops[op].values, TABLES[op], "vllm")
    assert found["percent"] == 100.0, found["patterns"]
    assert not sm90.ops["mla_context"].ids and not sm90.ops["mla_generation"].ids  # vLLM writes no kernel tables


def test_the_mla_module_is_planned_where_the_reference_has_its_tables(planner):
    for backend in ("torch", "sglang"):
        plan = planner.plan(backend, "90" if backend != "torch" else "cpu")
        assert not plan.ops["mla_context_module"].ids and not plan.ops["mla_generation_module"].ids, backend
        assert plan.ops["mla_context"].ids, backend
    trtllm = planner.plan("trtllm", "90")
    assert trtllm.ops["mla_context_module"].ids and trtllm.ops["mla_context"].ids  # TensorRT-LLM has both
