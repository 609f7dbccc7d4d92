"""Each framework's SM90 plan names, as dispatch, the kernel_source its reference tables record at the keys
both have (fixture slices of the H200 tables of vLLM 0.24.0, SGLang 0.5.14 and TensorRT-LLM 1.3.0rc20)."""

from __future__ import annotations

from pathlib import Path

import pytest

from opcollect.plans.coverage import table_coverage
from opcollect.plans.ops import OPS

REFERENCE = Path(__file__).parent / "data" / "reference"
VERSIONS = {"vllm": "0.24.0", "sglang": "0.5.14", "trtllm": "1.3.0rc20"}
# (backend, op) -> the fixture file, relative to tests/data/reference with {b}/{v} for backend and version
FILES = {
    "gemm": "gemm_slices/{b}/{v}/gemm_perf.parquet",
    "attention_context": "attention_slices/{b}/{v}/context_attention_perf.parquet",
    "attention_generation": "attention_slices/{b}/{v}/generation_attention_perf.parquet",
    "moe": "moe_slices/{b}/{v}/moe_perf.parquet",
    "mla_context": "mla_slices/{b}/{v}/context_mla_perf.parquet",
    "mla_generation": "mla_slices/{b}/{v}/generation_mla_perf.parquet",
    "mla_context_module": "mla_slices/{b}/{v}/mla_context_module_perf.parquet",
    "mla_generation_module": "mla_slices/{b}/{v}/mla_generation_module_perf.parquet",
    "comm": "aiconfigurator-h200/comm/nccl/2.29.2/nccl_perf.parquet",
}
VLLM_GEMM = "aiconfigurator-h200/gemm/vllm/0.24.0/gemm_perf.parquet"  # the same n == 4096 cut, older fixture
ROWS = [
    (backend, op, REFERENCE / (VLLM_GEMM if (backend, op) == ("vllm", "gemm") else path.format(b=backend, v=v)))
    for backend, v in VERSIONS.items()
    for op, path in FILES.items()
]
ROWS = [row for row in ROWS if row[2].is_file()]


@pytest.fixture(scope="module")
def plans(planner):
    return {backend: planner.plan(backend, "90") for backend in VERSIONS}


def test_every_framework_has_its_tables_here():
    held = {(b, op) for b, op, _ in ROWS}
    assert len(held) >= 22  # vLLM: no kernel MLA tables; SGLang: no module tables
    assert {op for b, op in held if b == "trtllm"} == set(FILES)


@pytest.mark.parametrize(("backend", "op", "path"), ROWS, ids=[f"{b}-{op}" for b, op, _ in ROWS])
def test_sm90_dispatch_names_the_reference_kernel_source(plans, backend, op, path):
    selection = plans[backend].ops[op]
    found = table_coverage(OPS[op], selection.values, path, backend, selection.dispatch)["dispatch"]
    assert found["rows"] > 0 and found["percent"] >= 99.0, found
