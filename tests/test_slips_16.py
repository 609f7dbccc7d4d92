"""Behaviours of the plan's summary, table and terminal text, the plan file's op check, the cost comparison, the
noise verdicts, the failure classes, the profiler helper, the worker's capacity check, the CPU timing helpers and
the comm, quantize, encoder and MLA BMM plans' ranking costs that no earlier test held: each test here fails with a
small plausible bug planted in the function it names."""

from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from opcollect.errors import InputError
from opcollect.plans import comm, encoder_attention, mla_bmm, planfile, predict, quantize, report, skips
from opcollect.plans.cost import CaseCost
from opcollect.plans.ops import OPS
from opcollect.plans.predict import OpCompare, PlanCost
from opcollect.runtime import failures, observe
from opcollect.runtime.contract import KernelLimit, Measured, Prepared, Runner
from opcollect.runtime.harness import Stats, TimingConfig
from opcollect.runtime.worker import check_capacity, run_task
from opcollect.tables import noise
from opcollect.tables.noise import AMBIGUOUS, FASTER, SAME, SLOWER, Thresholds

torch = pytest.importorskip("torch")

from opcollect.runtime import timing  # noqa: E402

# ---- plans/report.py ---------------------------------------------------------------------------------------------


def _plan(shard=None):
    entry = sorted(skips.reasons())[0]
    sel = SimpleNamespace(
        ids=["a", "b", "c"],
        by_dtype={"fp8": 1, "bf16": 2},
        by_dispatch={"z": 1, "y": 2},
        skipped={"zz-unknown": 1, entry: 4},
        op=SimpleNamespace(fields=("m", "n")),
        dispatch=["x", "y", "z"],
        values=[(1, 2), (3, 4), (5, 6)],
    )
    plan = SimpleNamespace(
        backend="vllm",
        sm="90",
        collector_hash="c" * 64,
        plan_hash="p" * 64,
        options=SimpleNamespace(shard=shard),
        total_cases=3,
        ops={"gemm": sel},
        notes=("a note",),
    )
    return plan, entry


def test_summary_names_the_shard_sorts_counts_and_rounds_the_cost_to_milliseconds():
    """report.summary: shard 'i/n', keys sorted, skip reasons ('' if unknown), seconds rounded to 3 places, total."""
    plan, entry = _plan(shard=(1, 3))
    found = report.summary(plan, PlanCost("h200_sxm", {"gemm": 1.23456}, 2.5))
    info = found["ops"]["gemm"]
    assert found["shard"] == "1/3" and found["cases"] == 3 and found["notes"] == ["a note"]
    assert list(info["by_dtype"].items()) == [("bf16", 2), ("fp8", 1)]
    assert list(info["by_dispatch"].items()) == [("y", 2), ("z", 1)]
    assert list(info["skipped"]) == [entry, "zz-unknown"]
    assert info["skipped"][entry] == {"count": 4, "reason": skips.reasons()[entry]}
    assert info["skipped"]["zz-unknown"] == {"count": 1, "reason": ""}
    assert info["cases"] == 3 and info["device_seconds"] == 1.235
    assert found["device_seconds"] == 3.735 and found["cost_system"] == "h200_sxm"
    assert found["worker_start_seconds"] == 2.5
    bare = report.summary(_plan()[0])
    assert bare["shard"] is None and bare["device_seconds"] is None and bare["cost_system"] is None
    assert bare["worker_start_seconds"] is None and bare["ops"]["gemm"]["device_seconds"] is None


def test_plain_render_aligns_columns_sums_skips_and_prints_each_note_once():
    """report.render (piped): aligned cells, skipped summed, '-' without cost, footers, notes deduplicated."""
    costed = {
        "backend": "vllm",
        "sm": "90",
        "cases": 7,
        "plan_hash": "0123456789abcdef" + "9" * 48,
        "device_seconds": 400.0,
        "cost_system": "h200_sxm",
        "worker_start_seconds": 3.0,
        "notes": ["shared", "first only"],
        "ops": {
            "gemm": {
                "cases": 5,
                "skipped": {"x": {"count": 2, "reason": ""}, "y": {"count": 3, "reason": ""}},
                "by_dtype": {"bf16": 3, "fp8": 2},
                "by_dispatch": {"cublas": 3, "cutlass": 2},
                "device_seconds": 12.34,
            },
            "moe": {"cases": 2, "skipped": {}, "by_dtype": {"fp8": 2}, "by_dispatch": {"t": 2}, "device_seconds": None},
        },
    }
    bare = {
        "backend": "torch",
        "sm": "cpu",
        "cases": 1,
        "plan_hash": "f" * 64,
        "device_seconds": None,
        "notes": ["shared"],
        "ops": {"gemm": {"cases": 1, "skipped": {}, "by_dtype": {"float32": 1}, "by_dispatch": {"lin": 1}}},
    }
    assert report.render([costed, bare], terminal=False) == (
        "backend  sm   op    cases  skipped  predicted  by dtype       dispatch\n"
        "vllm     90   gemm  5      5        12.3 s     bf16:3, fp8:2  cublas, cutlass\n"
        "vllm     90   moe   2      0        -          fp8:2          t\n"
        "torch    cpu  gemm  1      0        -          float32:1      lin\n"
        "vllm sm90: 7 cases, plan_hash 0123456789abcdef; predicted 0.11 h on h200_sxm (3.0 s of it a worker's start)\n"
        "torch cpu: 1 cases, plan_hash ffffffffffffffff; no cost predicted (no systems/*.yaml has this SM)\n"
        "note: shared\n"
        "note: first only\n"
    )


def test_write_tables_writes_each_ops_cases_in_run_order(tmp_path):
    """report.write_tables: <op>.csv with case_id, dispatch and the fields, one row per case, paths returned."""
    plan, _ = _plan()
    plan.ops["moe"] = SimpleNamespace(ids=[], op=SimpleNamespace(fields=("e",)), dispatch=[], values=[])
    assert report.write_tables(plan, tmp_path) == [tmp_path / "gemm.csv", tmp_path / "moe.csv"]
    assert (tmp_path / "gemm.csv").read_text() == "case_id,dispatch,m,n\na,x,1,2\nb,y,3,4\nc,z,5,6\n"
    assert list(csv.reader((tmp_path / "moe.csv").open())) == [["case_id", "dispatch", "e"]]


# ---- plans/planfile.py -------------------------------------------------------------------------------------------


def _planned(name, **change):
    op = OPS[name]
    return SimpleNamespace(**{"fields": op.fields, "table": op.table, "family": op.family, **change})


def test_check_ops_refuses_an_unknown_op_and_other_fields_table_or_family():
    """planfile.check_ops: the plan itself when every op matches; InputError naming an unknown or changed op."""
    path = Path("p.json")
    good = SimpleNamespace(ops={"gemm": _planned("gemm"), "comm": _planned("comm")})
    assert planfile.check_ops(path, good) is good
    with pytest.raises(InputError, match=r"p.json: field 'ops.bogus': unknown op; known: gemm, "):
        planfile.check_ops(path, SimpleNamespace(ops={"gemm": _planned("gemm"), "bogus": _planned("gemm")}))
    for change in ({"fields": ("m", "n")}, {"table": "other_perf"}, {"family": "moe"}):
        changed = SimpleNamespace(ops={"gemm": _planned("gemm"), "comm": _planned("comm", **change)})
        with pytest.raises(InputError, match=r"field 'ops.comm.fields': .* re-plan with this collector"):
            planfile.check_ops(path, changed)


# ---- plans/predict.py --------------------------------------------------------------------------------------------


def _costing(units, first=0.5, start=2.0):
    harness = SimpleNamespace(first_case_seconds=first, worker_start_seconds=start)
    return SimpleNamespace(
        units=lambda op, cases, ids, rows: units[op.name],
        op_device_seconds=lambda op, values, ids, rows: units[op.name],
        harness=harness,
        figures=SimpleNamespace(system="toy"),
    )


def _op(rows):
    return SimpleNamespace(rows=[SimpleNamespace(row_id=r, case_ids=c) for r, c in rows], cases=[], ids=[])


def test_compare_run_shares_rows_and_gives_the_first_single_device_op_the_first_cases():
    """predict.compare_run: a row's share per measured case, devices count, one first-case cost per worker, once."""
    plan = SimpleNamespace(
        ops={
            "comm": _op([("r1", ("c1", "c2"))]),
            "mla_bmm": _op([("x", ("x",))]),
            "gemm": _op([("g1", ("g1",)), ("g2", ("g2",))]),
            "moe": _op([("m1", ("m1",))]),
            "scale_matrix": _op([("s", ("s",))]),
        }
    )
    units = {
        "comm": [("r1", CaseCost(3.0, 2))],
        "gemm": [("g1", CaseCost(2.0, 1)), ("g2", CaseCost(4.0, 1))],
        "moe": [("m1", CaseCost(1.0, 1))],
    }
    spent = {"comm": {"c1": 1.5}, "gemm": {"g1": 1.0, "g2": 5.0}, "moe": {"m1": 2.0}, "scale_matrix": {}}
    assert predict.compare_run(plan, spent, _costing(units), workers=3) == [
        OpCompare("comm", 1, 3.0, 3.0),
        OpCompare("gemm", 2, 7.5, 6.0),
        OpCompare("moe", 1, 1.0, 2.0),
    ]


def test_plan_cost_adds_a_worker_start_only_when_some_op_costs_and_ratios_of_nothing_are_infinite():
    """predict.plan_cost / OpCompare.ratio / describe_compare: no cost, no start; a ratio over 0 predicted is inf."""
    plan = SimpleNamespace(ops={"gemm": SimpleNamespace(op=OPS["gemm"], values=[], ids=[], rows=None)})
    cost = predict.plan_cost(plan, _costing({"gemm": 4.0}))
    assert cost == PlanCost("toy", {"gemm": 4.0}, 2.5) and cost.total == 6.5
    assert predict.plan_cost(plan, _costing({"gemm": 0.0})) == PlanCost("toy", {"gemm": 0.0}, 0.0)
    assert OpCompare("gemm", 1, 0.0, 2.0).ratio == math.inf and OpCompare("gemm", 1, 4.0, 2.0).ratio == 0.5
    assert predict.describe_compare([OpCompare("gemm", 1, 0.0, 2.0)], "toy").endswith("total 0.0/2.0 s (xinf)")


# ---- tables/noise.py ---------------------------------------------------------------------------------------------


def test_by_ratio_is_slower_or_faster_at_exactly_the_tolerance():
    """noise.by_ratio: NEW/OLD equal to 1 + t is slower, equal to 1 / (1 + t) faster."""
    assert noise.by_ratio(1.0, 1.05, 0.05) == (SLOWER, "ratio 1.050 >= 1.050, no quartiles")
    assert noise.by_ratio(1.0, 1 / 1.05, 0.05) == (FASTER, "ratio 0.952 <= 0.952, no quartiles")
    assert noise.by_ratio(2.0, 2.0, 0.05) == (SAME, "ratio 1.000 within tolerance 5%, no quartiles")


def test_a_gap_of_exactly_min_gap_is_a_change_measured_from_the_lower_facing_bound():
    """noise.classify: a gap equal to min_gap decides either way; FASTER's gap is relative to NEW's p75."""
    t = Thresholds(min_gap=0.125, max_noise=1.0)
    low, high = noise.Measured(0.875, 0.75, 1.0, 10), noise.Measured(1.25, 1.125, 1.5, 10)
    assert noise.classify(low, high, t) == (SLOWER, "intervals apart by 12.5%")
    assert noise.classify(high, low, t) == (FASTER, "intervals apart by 12.5%")
    wide = Thresholds(min_gap=0.5, max_noise=1.0)
    assert noise.classify(high, low, wide) == (AMBIGUOUS, "intervals apart by 12.50% < 50.0%")
    old, new = noise.Measured(1.2, 1.188, 1.212, 10), noise.Measured(1.0, 0.99, 1.01, 10)
    assert noise.classify(old, new) == (FASTER, "intervals apart by 17.6%")  # (1.188 - 1.01) / 1.01


def test_noise_at_the_ceiling_and_a_shift_of_exactly_an_iqr():
    """noise.classify: noise equal to max_noise is judged; medians apart by exactly the IQR are not the same."""
    row = noise.Measured(1.0, 0.875, 1.125, 10)  # relative IQR exactly 0.25
    assert noise.classify(row, row) == (SAME, "medians 0.0% apart, within both IQRs")
    shifted = noise.Measured(1.25, 1.125, 1.375, 10)  # touching OLD's p75, the medians 0.25 apart
    assert noise.classify(row, shifted) == (AMBIGUOUS, "intervals overlap, medians 25.0% apart: beyond an IQR")


def test_quartiles_may_touch_zero_or_the_median_but_never_be_infinite():
    """noise._valid via classify: p25 of 0 and p75 at the median are valid; an infinite p75 or zero median not."""
    t = Thresholds(max_noise=2.0)
    edge = noise.Measured(1.0, 0.0, 1.0, 10)
    assert noise.classify(edge, edge, t).verdict == SAME
    bad = "quartiles not around a positive median"
    assert noise.classify(noise.Measured(1.0, 0.5, math.inf, 10), edge, t) == (AMBIGUOUS, bad)
    assert noise.classify(edge, noise.Measured(0.0, 0.0, 0.0, 10), t) == (AMBIGUOUS, bad)


def test_thresholds_describe_every_setting():
    """noise.Thresholds.describe: the gap, noise ceiling, sample floor and ratio band of the settings given."""
    assert Thresholds(min_gap=0.01, max_noise=0.3, min_samples=7, tolerance=0.25).describe() == (
        "intervals p25-p75; real change: disjoint by >= 1.0%; ambiguous: noise > 30% or < 7 samples; rows without "
        "quartiles: the same when NEW/OLD is within [0.800, 1.250] (tolerance 25%)"
    )


# ---- runtime/failures.py -----------------------------------------------------------------------------------------


def test_failure_messages_keep_the_first_line_the_type_and_the_traceback_tail():
    """failures.classify: 'Type: first line' cut at 500; KernelLimit as is; unexpected: the last 1500 characters."""
    limit = failures.classify(RuntimeError("x not supported here\nsecond line"))
    assert limit == failures.Failure("kernel_limit", "RuntimeError: x not supported here")
    oom = failures.classify(RuntimeError("CUDA out of memory\nmore"))
    assert oom == failures.Failure("oom", "RuntimeError: CUDA out of memory")
    assert failures.classify(NotImplementedError()).message == "NotImplementedError: "
    long = failures.classify(RuntimeError("unsupported " + "y" * 1000)).message
    assert len(long) == 500 and long.startswith("RuntimeError: unsupported y")
    assert failures.classify(KernelLimit("does not fit\nat all")).message == "does not fit\nat all"
    tail = failures.classify(ValueError("z" * 3000))
    assert tail == failures.Failure("unexpected", "z" * 1500)


@pytest.mark.parametrize(
    "message",
    [
        "CUDA error: uncorrectable ECC error encountered",
        "cudaErrorLaunchFailure: unspecified",
        "CUDA error: an illegal memory access; operation not supported",
    ],
)
def test_ecc_and_launch_failures_are_sticky_even_beside_a_kernel_limit_word(message):
    """failures.classify: the sticky patterns (ECC, launch failure) come before the kernel-limit words."""
    failure = failures.classify(RuntimeError(message))
    assert failure == failures.Failure("unexpected", f"RuntimeError: {message}", fatal=True)


# ---- runtime/observe.py ------------------------------------------------------------------------------------------


def test_observed_records_an_empty_list_or_a_default_reason():
    """observe.Observed.record: no names read is an empty list; unread without a reason says 'not read'."""
    assert observe.Observed(()).record() == {"kernels": []}
    assert observe.Observed(None).record() == {"kernels_unread": "not read"}


def test_observe_names_two_aten_levels_and_keeps_a_bookkeeping_op_called_directly():
    """observe._aten_names: the top op and its direct ATen callees; bookkeeping is dropped below the top only."""
    x, w = torch.rand(4, 8), torch.rand(16, 8)
    assert observe.observe(lambda: torch.empty(4), "cpu").kernels == ("aten::empty",)
    assert observe.observe(lambda: torch.nn.functional.linear(x, w), "cpu").kernels == (
        "aten::linear",
        "aten::t",
        "aten::matmul",
    )


def test_observe_says_why_when_the_profiler_fails_to_start_or_stop(monkeypatch):
    """observe.observe: the call runs once either way; the reason names the step and the first line, cut at 200."""
    import torch.profiler

    class Stuck:
        def __init__(self, **kwargs):
            pass

        def start(self):
            pass

        def stop(self):
            raise RuntimeError("stuck\nmore")

    calls = []
    monkeypatch.setattr(torch.profiler, "profile", Stuck)
    assert observe.observe(lambda: calls.append(1), "cpu") == observe.Observed(
        None, "the profiler did not stop: RuntimeError: stuck"
    )

    def refuse(**kwargs):
        raise RuntimeError("x" * 500)

    monkeypatch.setattr(torch.profiler, "profile", refuse)
    seen = observe.observe(lambda: calls.append(2), "cpu")
    assert seen.why == "the profiler did not start: RuntimeError: " + "x" * 186 and calls == [1, 2]


# ---- runtime/worker.py -------------------------------------------------------------------------------------------


def _backend(need, free, measure=None):
    return SimpleNamespace(footprint=lambda op, case: need, free_memory=lambda device: free, measure=measure)


def test_capacity_admits_exactly_the_share_and_names_need_and_free():
    """worker.check_capacity: a need equal to 90% of the free memory fits; the refusal says GiB and the device."""
    check_capacity(_backend(9, 10), "gemm", None, "cpu")
    with pytest.raises(KernelLimit) as refused:
        check_capacity(_backend(3 * 2**30, 2 * 2**30), "gemm", None, "cuda:1")
    assert str(refused.value) == "does not fit: needs 3.00 GiB, 2.00 GiB free on cuda:1"


def test_run_task_answers_each_case_with_stats_label_and_ran_or_one_failure_for_all():
    """worker.run_task: ok results carry stats, kernel_source and ran/expected_ran; a refusal fails every case."""
    stats = Stats(1.0, 0.9, 1.1, 5, 0.02, "cpu", 8, 0.01, 0.0)
    done = [Measured(stats, "k1", ran="nccl", expected="nccl"), Measured(stats, "k2")]
    task = {"row_id": "r", "op": "gemm", "dispatch": "d", "case_ids": ["a", "b"]}
    task["cases"] = [{"gemm_dtype": "float32", "m": m, "n": 8, "k": 8} for m in (1, 2)]
    answer = run_task(_backend(1, 2**40, lambda *args: done), task, "cpu", TimingConfig())
    assert answer == {
        "row_id": "r",
        "fatal": False,
        "results": [
            {"case_id": "a", "status": "ok", "stats": dataclasses.asdict(stats),
             "kernel_source": "k1", "ran": "nccl", "expected_ran": "nccl"},
            {"case_id": "b", "status": "ok", "stats": dataclasses.asdict(stats), "kernel_source": "k2"},
        ],
    }  # fmt: skip
    refused = run_task(_backend(10, 10, lambda *args: done), task, "cpu", TimingConfig())["results"]
    assert [(r["case_id"], r["error_class"]) for r in refused] == [("a", "kernel_limit"), ("b", "kernel_limit")]


# ---- runtime/timing.py (CPU) -------------------------------------------------------------------------------------


def test_rotation_copies_is_one_without_a_footprint_or_room():
    """timing.rotation_copies: no footprint, or one larger than half the free memory, cycles one input set."""
    assert timing.rotation_copies(0, 50 * 2**20, 2**30) == 1
    assert timing.rotation_copies(-5, 50 * 2**20, 2**30) == 1
    assert timing.rotation_copies(2**20, 2**20, 2**30) == 3  # exactly L2_MULTIPLE x L2 in three copies
    assert timing.rotation_copies(2**20, 50 * 2**20, 3 * 2**20) == 1  # half the free memory holds one


def test_random_tensor_on_the_cpu_is_centred_seeded_and_converted_for_fp8():
    """timing.random_tensor: uniform in [-0.5, 0.5) on the CPU, the same per seed, fp8 drawn in bf16."""
    a = timing.random_tensor((64, 64), torch.float32, "cpu")
    assert a.dtype == torch.float32 and -0.5 <= a.min() < -0.4 and 0.4 < a.max() < 0.5
    assert torch.equal(a, timing.random_tensor((64, 64), torch.float32, "cpu"))
    assert not torch.equal(a, timing.random_tensor((64, 64), torch.float32, "cpu", generator_seed=1))
    f8 = timing.random_tensor((8, 8), torch.float8_e4m3fn, "cpu", generator_seed=3)
    drawn = timing.random_tensor((8, 8), torch.bfloat16, "cpu", generator_seed=3)
    assert f8.dtype == torch.float8_e4m3fn and torch.equal(f8.to(torch.float32), drawn.to(f8.dtype).to(torch.float32))


def test_an_untimed_case_is_written_without_running_under_the_dispatch_label():
    """timing.measure_cases: a case the runner marks untimed gets untimed Stats, the dispatch label, no prepare."""
    prepared = []

    def prepare(case, dispatch, device, copies):
        prepared.append(case)
        return Prepared(lambda: None, "never")

    runner = Runner(lambda c: 0, prepare, untimed=lambda c: True)
    [measured] = timing.measure_cases(runner, "the-dispatch", ["case"], "cpu", TimingConfig())
    assert prepared == [] and measured.kernel_source == "the-dispatch" and measured.observed is None
    assert measured.stats.timing == "none" and measured.stats.latency == 0.0 and measured.stats.samples == 0


# ---- ranking costs of the comm, quantize, encoder and MLA BMM plans ----------------------------------------------


def test_ranking_costs_of_the_comm_quantize_encoder_and_mla_bmm_plans():
    """OpPlan.cost: bytes x GPUs for comm; 5 and 3 x m x k for quantize; the attention square; per-head BMMs."""
    assert comm.PLAN.cost(comm.CommCase("half", "all_reduce", 8, 1024)) == 2048 * 8
    assert comm.CUSTOM_ALLREDUCE.cost(comm.CustomAllreduceCase("float32", 4, 1024, "vllm_graph")) == 4096 * 4
    case = quantize.QuantizeCase(4, 8, "fp8")
    assert quantize.COMPUTE_SCALE.cost(case) == 160 and quantize.SCALE_MATRIX.cost(case) == 96
    enc = encoder_attention.EncoderAttentionCase(2, 10, 3, 64, "bfloat16")
    assert encoder_attention.PLAN.cost(enc) == 4.0 * 2 * 10 * 10 * 3 * 64
    pre = mla_bmm.MlaBmmCase("mla_gen_pre", "bfloat16", 4, 2)
    assert mla_bmm.PLAN.cost(pre) == 2.0 * 4 * 2 * 128 * 512 + 2.0 * 2 * 128 * 512
    post = mla_bmm.MlaBmmCase("mla_gen_post", "bfloat16", 4, 2)
    assert mla_bmm.PLAN.cost(post) == 2.0 * 4 * 2 * 512 * 128 + 2.0 * 2 * 512 * 128


def test_link_bytes_and_the_comm_process_group_keys():
    """comm.link_bytes: nothing over one GPU, the buffer for all_reduce, (n-1)/n of it else; a row per group."""
    assert comm.link_bytes("all_reduce", 1000, 1) == 0.0 and comm.link_bytes("all_gather", 1000, 0) == 0.0
    assert comm.link_bytes("all_reduce", 1000, 2) == 1000.0 and comm.link_bytes("alltoall", 1000, 4) == 750.0
    assert comm._one_process_group(comm.CommCase("half", "all_gather", 8, 64)) == "comm:half:num_gpus=8"
    key = comm._one_custom_process_group(comm.CustomAllreduceCase("bfloat16", 2, 64, "vllm_eager"))
    assert key == "custom_allreduce:bfloat16:num_gpus=2,backend=vllm_eager"
