"""Each framework's SM90 plan names, as dispatch, the kernel_source its reference tables record at the keys
both have (fixture slices of the H200 tables of vLLM 0.24.0, SGLang 0.5.14 and TensorRT-LLM 1.3.0rc20)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import runner_pending_lifted

from opcollect.plans.coverage import table_coverage
from opcollect.plans.ops import OPS
from opcollect.plans.planner import PlanOptions

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
    "encoder_attention": "encoder_attention_slices/{b}/{v}/encoder_attention_perf.parquet",
    "compute_scale": "quant_bmm_tables/quantize/{b}/{v}/computescale_perf.parquet",
    "scale_matrix": "quant_bmm_tables/quantize/{b}/{v}/scale_matrix_perf.parquet",
    "mla_bmm": "quant_bmm_tables/mla_bmm/{b}/{v}/mla_bmm_perf.parquet",
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


RULES = [(op, backend) for op in OPS for backend in ("vllm", "sglang", "trtllm") if backend in OPS[op].case_dispatch]


@pytest.mark.parametrize(("op", "backend"), RULES, ids=[f"{b}-{op}" for op, b in RULES])
def test_each_case_rule_reads_only_the_fields_it_declares(planner, op, backend):
    """The planner asks a rule once per distinct value of its declared fields, and never for other dispatches:
    changing any other field of a planned case, or asking for another dispatch, must not change its answer."""
    rule, plan_op = OPS[op].case_dispatch[backend], OPS[op]
    assert rule.reads and set(rule.reads) <= set(plan_op.fields)
    checked = 0
    for sm in ("90", "100", "120"):
        with runner_pending_lifted():  # conftest.py: the rules the frameworks get once their runners land
            found = planner.plan(backend, sm, PlanOptions(ops=(op,))).ops[op]
        values = found.values[:: max(1, len(found.values) // 150)]
        seen = {f: sorted({v[i] for v in found.values}, key=str) for i, f in enumerate(plan_op.fields)}
        for group_dispatch in {plan_op.dispatch[backend](sm, g) for g in planner.groups(op, sm)}:
            for raw in values:
                case = plan_op.case_type._make(raw)
                if rule.dispatches is not None and group_dispatch not in rule.dispatches:
                    assert rule(sm, group_dispatch, case) == group_dispatch
                    continue
                answer = rule(sm, group_dispatch, case)
                for name in set(plan_op.fields) - set(rule.reads):
                    for other in seen[name][:3]:
                        assert rule(sm, group_dispatch, case._replace(**{name: other})) == answer, (name, other)
                checked += 1
    assert checked
