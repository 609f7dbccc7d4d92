"""The numbers inside summaries and messages, and the boundaries and constants of rules, checked exactly: a count
off by one, a sum over the wrong records, a threshold one step away or a constant changed reads as plausibly as the
right one. Among them: the run summary's kernel sentences, the plan's exactly-once check, the cost comparison and
calls per sample, the Slurm submission line and record bounds, the bump report's moved rows, model notes and refusals,
and SGLang's dense-MHA thresholds for a DSA prefill."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from conftest import fake_run, gemm_plan, llama_config
from crafted_plans import craft, set_column

from opcollect.backends.kernels import describe_observed
from opcollect.cases.profiles import parse_config
from opcollect.cases.sparse import _checkpoint_gemm
from opcollect.cluster.record import parse_record
from opcollect.cluster.status import planned_ids
from opcollect.cluster.submit import Submitted, describe
from opcollect.errors import InputError
from opcollect.images.bump_report import moved_section
from opcollect.plans.cost import calls_for_estimate, efficiency
from opcollect.plans.dsa import DsaModuleCase, _sglang_context
from opcollect.plans.gemm import GemmCase
from opcollect.plans.moe import MoeCase, _sglang_model
from opcollect.plans.planner import Row, check_exactly_once
from opcollect.plans.predict import OpCompare, describe_compare, hours
from opcollect.plans.report import _cost
from opcollect.project import find_project
from opcollect.runtime.harness import calls_for
from opcollect.runtime.observe import bounded
from opcollect.runtime.planfile import read_plan
from opcollect.runtime.run import _dispatch_misses
from opcollect.tables.merge import merge
from opcollect.tables.noise import DEFAULT_THRESHOLDS
from opcollect.tables.rules import _ids

LINEAR = "torch.nn.functional.linear"  # torch's GEMM label: it means aten::linear/addmm/mm/matmul names


def _ok(**fields) -> dict:
    return {"status": "ok", "op": "gemm", **fields}


def test_dispatch_misses_sum_rows_show_the_three_commonest_pairs_and_count_the_rest():
    counts = {"k1": 4, "k2": 3, "k3": 2, "k4": 1, "k5": 1}
    records = [_ok(dispatch="planned", kernel_source=k) for k, n in counts.items() for _ in range(n)]
    records += [_ok(dispatch="planned", kernel_source="planned")] * 6  # ran what the plan named
    records += [{"status": "failed", "dispatch": "planned", "error_class": "oom"}]  # a failure ran nothing
    assert _dispatch_misses(records) == (
        "; 11 rows ran another kernel than the plan named: planned ran k1 (4), planned ran k2 (3), planned ran k3 (2), "
        "2 more pairs"
    )


def test_dispatch_misses_count_what_ran_beneath_a_label_and_show_no_more_for_three_pairs():
    records = [
        _ok(dispatch="d", kernel_source="d", expected_ran="nccl", ran="custom"),
        _ok(dispatch="d", kernel_source="d", expected_ran="nccl", ran="custom"),
        _ok(dispatch="d", kernel_source="d", expected_ran="nccl", ran="nccl"),  # ran what it expected
        _ok(dispatch="d", kernel_source="e"),
        _ok(dispatch="d", kernel_source="f"),
    ]
    said = _dispatch_misses(records)
    assert said == "; 4 rows ran another kernel than the plan named: nccl ran custom (2), d ran e (1), d ran f (1)"


def test_observed_kernels_sentence_counts_rows_pairs_and_unread_rows():
    wrong = {"aten::bmm": 3, "aten::conv2d": 2, "aten::add": 2, "aten::mul": 1, "aten::relu": 1}
    records = [_ok(kernel_source=LINEAR, kernels=[name]) for name, n in wrong.items() for _ in range(n)]
    records += [_ok(kernel_source=LINEAR, kernels=["aten::linear"])] * 2  # matches its label
    records += [_ok(kernel_source=LINEAR, kernels=None, kernels_unread="profiler off")] * 3
    records += [_ok(kernel_source=LINEAR, kernels=None, kernels_unread="no trace")]
    records += [{"status": "failed", "op": "gemm", "kernels": ["aten::bmm"]}]  # not a measured row
    said = describe_observed("torch", records)
    assert said == (
        "; kernels observed on 11 of 15 rows (4 unread: profiler off); 9 rows ran kernels their label does not name: "
        f"{LINEAR} ran aten::bmm (3), {LINEAR} ran aten::conv2d (2), {LINEAR} ran aten::add (2), 2 more pairs"
    )


def test_observed_kernels_sentence_is_empty_without_observations_and_says_when_all_match():
    assert describe_observed("torch", [_ok(kernel_source=LINEAR)]) == ""
    records = [_ok(kernel_source=LINEAR, kernels=["aten::linear"]), _ok(kernel_source=LINEAR, kernels=["aten::mm"])]
    assert describe_observed("torch", records) == "; kernels observed on 2 of 2 rows, each matching its label"


def test_exactly_once_names_each_count_and_the_first_offender():
    ids = ["a", "b", "c", "d"]
    rows = [Row("r1", "x", ("a", "b", "z")), Row("r2", "x", ("a", "b")), Row("r3", "x", ("y",))]
    with pytest.raises(AssertionError) as raised:
        check_exactly_once("gemm", ids, rows)
    assert str(raised.value) == "gemm: batch rows time 2 cases twice, miss 2, add 2 (e.g. a)"
    with pytest.raises(AssertionError) as raised:
        check_exactly_once("gemm", ids, [Row("r1", "x", ("a", "b", "c", "d", "q"))])
    assert str(raised.value) == "gemm: batch rows time 0 cases twice, miss 0, add 1 (e.g. q)"
    check_exactly_once("gemm", ids, [Row("r1", "x", ("d", "c")), Row("r2", "x", ("b", "a"))])  # each once: no error


def test_cost_comparison_totals_each_side_and_the_ratio_of_the_totals():
    rows = [OpCompare("gemm", 3, 2.0, 3.0), OpCompare("moe", 1, 6.0, 3.0)]
    assert describe_compare(rows, "h200_sxm") == (
        "cost on h200_sxm, predicted/measured device-seconds (x measured/predicted): gemm 2.0/3.0 s (x1.50), "
        "moe 6.0/3.0 s (x0.50); total 8.0/6.0 s (x0.75)"
    )
    assert describe_compare([], "h200_sxm") == ""


def test_the_submission_line_names_both_jobs_every_task_and_the_planned_cases():
    said = describe(Submitted(Path("/runs/r"), "101", "102", (0, 2, 5), 37))
    assert said == (
        "submitted array job 101 (tasks 0,2,5) and merge job 102 (after it) for 37 planned cases in /runs/r\n"
        "follow them: squeue -j 101,102; opcollect status /runs/r; logs in /runs/r/logs"
    )


def test_hours_switch_at_six_minutes_and_the_plan_cost_names_the_worker_start():
    assert (hours(359.94), hours(360), hours(7200)) == ("359.9 s", "0.10 h", "2.00 h")
    said = _cost({"device_seconds": 9000, "cost_system": "h200_sxm", "worker_start_seconds": 42})
    assert said == "; predicted 2.50 h on h200_sxm (42.0 s of it a worker's start)"
    assert _cost({"device_seconds": None}) == "; no cost predicted (no systems/*.yaml has this SM)"


def test_a_shards_plan_file_must_be_that_shard(tmp_path):
    plan = gemm_plan(tmp_path / "plan.json", [(1, 8, 8), (2, 8, 8)])
    assert len(planned_ids(plan)) == len(planned_ids(plan, None)) == 2
    with pytest.raises(InputError) as raised:
        planned_ids(plan, (1, 4))
    assert str(raised.value) == (
        f"{plan}: the plan of shard none, not 1/4; give the run directory of `opcollect collect ... --slurm` as it "
        "wrote it"
    )


def test_layer_types_the_plan_does_not_time_are_named_in_a_note(tmp_path):
    kinds = ["full_attention", "chunked_attention", "sliding_attention", "mamba"]
    model = llama_config(tmp_path, _name_or_path="toy", layer_types=kinds, sliding_window=512, num_hidden_layers=4)
    note = "toy: layer_types chunked_attention, mamba are not planned; its full_attention and sliding_attention layers "
    note += "are"
    assert note in model.notes
    plain = llama_config(tmp_path, _name_or_path="toy", layer_types=kinds[::2], sliding_window=512)
    assert not [n for n in plain.notes if "layer_types" in n]


@pytest.mark.parametrize(("field", "value"), [("version", "../elsewhere"), ("nccl_version", "2.26/..")])
def test_merge_names_the_runtime_field_whose_value_would_leave_tables(tmp_path, field, value):
    run = fake_run(tmp_path / "run", [GemmCase("bfloat16", 8, 64, 64)], **{field: value})
    with pytest.raises(InputError) as raised:
        merge([run], tmp_path / "tables", find_project(), say=lambda line: None)
    assert str(raised.value).startswith(f"{run / 'shards'}: runtime field '{field}'")
    assert not (tmp_path / "tables").exists() or not any((tmp_path / "tables").rglob("*.parquet"))


QWEN3_MOE = {
    "hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 4096,
    "num_hidden_layers": 4, "num_experts": 16, "num_experts_per_tok": 2, "moe_intermediate_size": 256,
}  # fmt: skip


@pytest.mark.parametrize(
    ("keys", "why"),
    [
        ({"mlp_only_layers": [0]}, " (mlp_only_layers are dense)"),
        ({"decoder_sparse_step": 2}, " (some layers are dense)"),
        ({"first_k_dense_replace": 3}, " (the first 3 layers are dense)"),
    ],
)
def test_a_moe_model_with_dense_layers_needs_their_width_and_says_why(keys, why):
    with pytest.raises(InputError) as raised:
        parse_config("c.json", "Qwen3MoeForCausalLM", "m", {**QWEN3_MOE, **keys})
    assert str(raised.value).endswith(
        f"missing key 'intermediate_size' required for Qwen3MoeForCausalLM{why}; add it to the config"
    )
    with_dense = parse_config("c.json", "Qwen3MoeForCausalLM", "m", {**QWEN3_MOE, **keys, "intermediate_size": 768})
    assert with_dense.layout.dense.inter == 768
    all_moe = parse_config("c.json", "Qwen3MoeForCausalLM", "m", {**QWEN3_MOE, "intermediate_size": 768})
    assert all_moe.layout.dense is None  # every layer MoE: the dense width is not planned


@pytest.mark.parametrize(
    ("quantization", "gemm"),
    [
        ({"quant_method": "modelopt", "quant_algo": "FP8"}, "fp8_block"),
        ({"quant_method": "modelopt", "quant_algo": "fp8_pb_wo"}, "fp8_block"),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "bfloat16"),
        ({"quant_method": "modelopt", "quant_algo": "W4A8_NVFP4_FP8"}, "bfloat16"),
        ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "fp8_block"),
        ({"quant_method": "fp8"}, "bfloat16"),
        ({"quant_method": "awq", "quant_algo": "FP8"}, "bfloat16"),
        ("fp8", "bfloat16"),
    ],
)
def test_the_dsa_projection_gemm_follows_the_checkpoints_quantization(quantization, gemm):
    assert _checkpoint_gemm(quantization) == gemm


@pytest.mark.parametrize(
    ("sm", "batch", "isl", "step", "label"),
    [
        ("90", 1, 1024, 1024, "sglang_dsa_dense_mha_fa3"),  # the longest request at the threshold, 2048
        ("90", 1, 1025, 1024, "sglang_dsa_indexer_flashmla_sparse"),  # one past it
        ("100", 64, 1024, 1024, "sglang_dsa_dense_mha_trtllm_ragged"),  # 64 x 2048 tokens: the chunk capacity
        ("100", 65, 1024, 1024, "sglang_dsa_indexer_flashmla_sparse"),  # past the capacity
        ("120", 1, 16, 0, "sglang_dsa_indexer_flashmla_sparse"),  # dense MHA on SM90 and SM100-109 only
    ],
)
def test_sglang_runs_a_short_dsa_prefill_as_dense_mha_within_both_thresholds(sm, batch, isl, step, label):
    case = DsaModuleCase("dsa_context_module", "m", "GlmMoeDsaForCausalLM", "bfloat16", "bfloat16", "bfloat16",
                         8, batch, isl, 1, step)  # fmt: skip
    assert _sglang_context(sm, "sglang_dsa_indexer_flashmla_sparse", case) == label


def test_a_slurm_record_holds_1_to_1000_shards_and_tasks_below_its_count():
    def record(shards, tasks):
        return {"shards": shards, "submissions": [{"array_job": "7", "merge_job": "8", "tasks": tasks}]}

    assert parse_record(Path("s.json"), record(1000, [0, 999])).shards == 1000
    assert parse_record(Path("s.json"), record(1, [0])).submissions[0].tasks == (0,)
    for shards, tasks, said in (
        (1001, [0], "field 'shards': 1001 is not a whole number from 1 to 1000"),
        (0, [0], "field 'shards': 0 is not a whole number from 1 to 1000"),
        (4, [4], "field 'submissions[0].tasks': 4 is not a whole number from 0 to 3"),
        (4, [-1], "field 'submissions[0].tasks': -1 is not a whole number from 0 to 3"),
    ):
        with pytest.raises(InputError) as raised:
            parse_record(Path("s.json"), record(shards, tasks))
        assert str(raised.value).startswith(f"s.json: {said}; give the run directory")


@pytest.mark.parametrize("once", [0.0, 2.0**-30, 2.0**-17, 2.0**-8, 2.0])
@pytest.mark.parametrize("target", [2.0**-12, 1.0])
def test_the_cost_models_calls_per_sample_are_the_harnesses(once, target):
    """plans/cost.py predicts calls_for's answer (runtime/harness.py) without running it: the same bound, the same
    floor of 1e-7 s a call, for calls of exactly ``once`` seconds on a clock that only the calls advance."""

    now = [0.0]

    def call():
        now[0] += once

    measured = calls_for(call, target, clock=lambda: now[0])
    assert calls_for_estimate(once, target) == measured
    assert 1 <= measured <= 10_000


def test_an_op_without_an_efficiency_is_costed_at_five_percent():
    assert efficiency("cpu", "no_such_op", "torch") == efficiency("cuda", "no_such_op", "vllm") == 0.05


def test_the_bump_reports_moved_section_lists_50_rows_a_table_and_counts_the_rest(tmp_path):

    cases = [GemmCase("bfloat16", m, 64, 64) for m in range(1, 53)]
    for name, version, latency in (("old", "0.24.0", 1.0), ("new", "0.25.0", 2.0)):
        run = fake_run(tmp_path / f"{name}-run", cases, latency=latency, version=version)
        merge([run], tmp_path / name, find_project(), say=lambda line: None)
    text = moved_section(tmp_path / "old", tmp_path / "new", "vllm", "0.24.0", "0.25.0", DEFAULT_THRESHOLDS)
    listed = [line for line in text.splitlines() if line.startswith("- `")]
    assert len(listed) == 50
    assert "- and 2 more: `opcollect compare` the two tables" in text.splitlines()


@pytest.mark.parametrize(
    ("sm", "hidden", "label"),
    [
        ("100", 7168, "sglang_flashinfer_trtllm_moe"),  # DeepSeek-V3's width on SM100: ServerArgs forces it
        ("103", 7168, "sglang_flashinfer_trtllm_moe"),
        ("100", 6144, "sglang_fused_moe_triton"),
        ("90", 7168, "sglang_fused_moe_triton"),
    ],
)
def test_sglangs_hand_moe_rules_force_flashinfer_trtllm_for_deepseeks_width_on_sm100(sm, hidden, label):
    """The rules for what the selection file does not answer (an SM or entry it lacks): a bf16 MoE of width 7168
    (DeepSeek-V3, Kimi-K2.5) on SM100/103 runs flashinfer_trtllm, any other the Triton runner."""
    case = MoeCase("bfloat16", 16, hidden, 1000, 3, 64, 1, 1, "balanced")
    assert _sglang_model(sm, "bfloat16", case) == label


def test_observed_names_are_cut_to_400_characters_and_64_names():
    long = [f"kernel_{i:03d}_" + "x" * 500 for i in range(70)]
    kept = bounded([*long[:3], long[0], *long[3:]])  # a repeat is kept once, where it first came
    assert len(kept) == 64 and all(len(name) == 400 for name in kept)
    assert kept[:2] == (long[0][:400], long[1][:400]) and kept[-1] == long[63][:400]
    assert bounded(["a  b\n c", "a b c", "d"]) == ("a b c", "d")  # one line each, the same name after that


@pytest.mark.parametrize(("field", "low"), [("m", 1), ("k", 1)])
def test_a_plan_column_holds_integers_up_to_2_to_the_40(tmp_path, field, low):
    top = craft(gemm_plan(tmp_path / "top.json", [(1, 64, 64)]), set_column(field, 2**40))
    assert read_plan(top).ops["gemm"].cases[0]._asdict()[field] == 2**40
    for bad in (2**40 + 1, low - 1):
        path = craft(gemm_plan(tmp_path / "bad.json", [(1, 64, 64)]), set_column(field, bad))
        with pytest.raises(InputError, match=rf"columns\.{field}.*{bad} is not an integer from {low} to 2\*\*40"):
            read_plan(path)


def test_a_finding_names_at_most_10_offending_rows():
    table = pa.table({"case_id": [f"c{i}" for i in range(12)], "latency": [0.0] * 12})
    assert _ids(table, pa.array([True] * 12)) == tuple(f"c{i}" for i in range(10))
    assert _ids(table, pa.array([i % 4 == 0 for i in range(12)])) == ("c0", "c4", "c8")
