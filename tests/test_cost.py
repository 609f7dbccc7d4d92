"""The cost model (plans/cost.py): the harness's own costs plus samples x bound / efficiency, by hand; shards dealt
by predicted time (plans/deal.py); the plan's --json costs; a run's summary setting predicted against measured."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from conftest import ROOT, run_cli

from opcollect.plans.bound import Figures
from opcollect.plans.cost import (
    CPU_EFFICIENCY,
    GPU_EFFICIENCY,
    Costing,
    Harness,
    cpu_timing,
    cuda_timing,
    efficiency,
    ranks_timing,
)
from opcollect.plans.deal import deal, deal_plan
from opcollect.plans.gemm import GemmCase
from opcollect.plans.hashes import collector_hash
from opcollect.plans.ops import OPS
from opcollect.plans.planfile import to_json, write_plan
from opcollect.plans.planner import PlanOptions, plan_of_cases, shard_of
from opcollect.plans.predict import compare_run, plan_units, run_cost
from opcollect.plans.quantize import QuantizeCase
from opcollect.runtime.harness import TimingConfig
from opcollect.runtime.planfile import read_plan

# a toy system and harness whose figures make the arithmetic below exact
FIGURES = Figures(
    system="toy",
    rates={"float32": 1e12, "bfloat16": 1e12},
    memory=1e10,
    cache_bytes=2**20,
    warm=False,
    nvlink=None,
    nvlink_gpus=1,
    pcie=1e10,
    network=1e9,
    gpus_per_node=1,
)
QUIET = Harness(
    setup_seconds=0.01,
    fill_bytes_per_s=1e9,
    floor_seconds=1e-5,
    sync_seconds=1e-5,
    sample_gap_seconds=2e-5,
    jitter_seconds=1e-6,
    jitter_share=0.002,  # a sample of 125 us or more meets a 1% noise target: 1e-6 / 1.25e-4 + 0.002 = 0.01
    observe_seconds=0.003,
    rank_sync_seconds=1e-3,
    row_start_seconds=5.0,
    worker_start_seconds=2.0,
    first_case_seconds=1.0,
)
NOISY = replace(QUIET, jitter_share=0.05)  # no sample meets 1%: every case samples to the cap
CPU = TimingConfig(max_noise=0.01, min_samples=5, max_case_seconds=0.25, warmup_seconds=0.002)
GPU = TimingConfig(max_noise=0.01, min_samples=10, max_case_seconds=1.0, warmup_seconds=0.1)


def toy(kind: str, config: TimingConfig, harness: Harness = QUIET, backend: str = "torch") -> Costing:
    return Costing(backend, kind, FIGURES, 10**11, config, harness)


# -- the stopping rule and one timing, by hand -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("t", "expected"),
    [
        # one call outlasts a 0.2 ms sample: calls_for makes 2 calls, a sample is 1 call + 20 us; 1 warm-up sample
        (0.01, 2 * 0.01 + (1 + 25) * 0.01002),  # the cap: ceil(0.25 / 0.01002) = 25 samples
        (0.2, 2 * 0.2 + (1 + 3) * 0.20002),  # the cap wants 2 samples, CAP_MIN_SAMPLES 3
        (0.5, 2 * 0.5 + (1 + 2) * 0.50002),  # 4 x the cap (1 s) ends it after 2 samples, under CAP_MIN_SAMPLES
    ],
)
def test_cpu_timing_samples_to_the_cap(t, expected):
    seconds, copies = cpu_timing(toy("cpu", CPU, NOISY))(t, 0.0)
    assert copies == 1 and seconds == pytest.approx(expected, rel=1e-12)


def test_cpu_timing_of_a_small_call_fills_a_sample_and_stops_on_noise():
    # t = 50 us: calls_for makes 4 calls; a sample holds int(2e-4 / 5e-5) = 4 calls = 200 us, quiet enough
    # (1e-6 / 2e-4 + 0.002 = 0.007 <= 0.01): min_samples 5 after 1 warm-up sample (0.002 s > 220 us: 10 of them)
    seconds, _ = cpu_timing(toy("cpu", CPU))(5e-5, 0.0)
    wall = 4 * 5e-5 + 2e-5
    assert seconds == pytest.approx(4 * 5e-5 + (math.ceil(0.002 / wall) + 5) * wall, rel=1e-12)
    assert math.ceil(0.002 / wall) == 10


def test_cuda_timing_rotating_inputs_stops_on_noise():
    # footprint 10 MB >= 3 x the 1 MiB L2: one input set rotates; calls per replay int(1 ms / (t + sync)) = 9
    t = 1e-4
    seconds, copies = cuda_timing(toy("cuda", GPU))(t, 1e7)
    synced, wall = t + 1e-5, 9 * t + 2e-5
    before = 3 * synced + 4 * synced + 2 * 9 * t  # eager calls, calls_for, capture and one replay
    assert copies == 1
    assert seconds == pytest.approx(before + (109 + 10) * wall, rel=1e-12)  # ceil(0.1 / 9.2e-4) = 109 warm-up


def test_cuda_timing_of_a_tiny_footprint_flushes_the_l2_and_samples_to_the_cap():
    # 1000 bytes: 64 input sets are still under 3 x L2, so each sample flushes 3 MiB (3.1e-4 s at 10 GB/s) and
    # times one call of 10 us: too short for a 1% spread, so the 1 s cap ends it
    t = 1e-5
    seconds, copies = cuda_timing(toy("cuda", GPU))(t, 1000.0)
    wall = t + 2e-5 + 3 * 2**20 / 1e10
    assert copies == 64
    assert seconds == pytest.approx(7 * (t + 1e-5) + 2 * t + (291 + 2903) * wall, rel=1e-12)


def test_a_collective_samples_on_its_own_clock():
    # t = 1 ms: 2 calls per sample (SAMPLE_SECONDS 2 ms); the cap counts the 2 ms of calls, not the 1 ms barrier
    seconds, _ = ranks_timing(toy("cpu", CPU, NOISY))(1e-3, 0.0)
    assert seconds == pytest.approx(2 * (1e-3 + 1e-3) + (1 + 125) * 3e-3, rel=1e-12)


# -- a case: harness + samples x bound / efficiency ------------------------------------------------------------------
def test_a_gemm_case_is_its_setup_fill_timing_and_observed_call():
    costing = toy("cpu", CPU)
    op = OPS["gemm"]
    case = GemmCase("float32", 1000, 1000, 1000)
    bound = 2 * 1000**3 / 1e12  # compute-bound: 2 ms of FLOPs against 1.2 ms of bytes (12 MB at 10 GB/s)
    t = 1e-5 + bound / CPU_EFFICIENCY["gemm"]
    timing = 2 * t + (1 + 5) * (t + 2e-5)  # calls_for, 1 warm-up sample, min_samples (quiet: a sample of 4 ms)
    expected = 0.01 + 12e6 / 1e9 + timing + 0.003 + t
    assert costing.case(op, case).seconds == pytest.approx(expected, rel=1e-12)
    assert costing.case(op, case).devices == 1


def test_gpu_efficiency_is_the_backends_reference_median_and_torch_takes_their_median():
    assert efficiency("cuda", "gemm", "vllm") == GPU_EFFICIENCY["gemm"]["vllm"] == 0.243
    assert efficiency("cuda", "gemm", "torch") == 0.332  # median of 0.243, 0.332, 0.358
    assert efficiency("cuda", "comm", "sglang") == GPU_EFFICIENCY["comm"]["nccl"]
    assert efficiency("cuda", "compute_scale", "vllm") == GPU_EFFICIENCY["scale_matrix"]["vllm"]


def test_a_frameworks_compute_scale_times_two_quantizations():
    op, case = OPS["compute_scale"], QuantizeCase(4096, 4096, "fp8")
    torch_cost, vllm_cost = toy("cuda", GPU), toy("cuda", GPU, backend="vllm")
    # both at scale_matrix's efficiency 0.144 (torch: the median of the frameworks'); bytes 4096^2 x (2 + 1)
    moved = 4096 * 4096 * 3
    t = 1e-5 + moved / 1e10 / 0.144
    one = cuda_timing(torch_cost)(t, moved)[0]
    assert vllm_cost.case(op, case).seconds - torch_cost.case(op, case).seconds == pytest.approx(one, rel=1e-9)


def test_a_collective_row_adds_its_ranks_start_and_counts_its_devices():
    whole = plan_of_cases(
        "torch",
        "cpu",
        "comm",
        [OPS["comm"].case_type("half", "all_reduce", 2, 1024), OPS["comm"].case_type("half", "all_gather", 2, 1024)],
        "gloo",
        "x" * 64,
    )
    sel = whole.ops["comm"]
    costing = toy("cpu", CPU, NOISY)
    [(row_id, cost)] = costing.units(sel.op, sel.values, sel.ids, sel.rows)
    each = [costing.case(sel.op, c).seconds for c in sel.values]
    assert row_id == sel.rows[0].row_id and cost.devices == 2
    assert cost.seconds == pytest.approx(5.0 + sum(each), rel=1e-12)
    assert cost.device_seconds == pytest.approx(2 * (5.0 + sum(each)), rel=1e-12)


def test_a_collective_rows_measured_seconds_count_every_device_it_held(tmp_path):
    """compare_run sets device-seconds against device-seconds: a 2-GPU case's wall seconds count twice."""
    cases = [OPS["comm"].case_type("half", "all_reduce", 2, 1024), OPS["comm"].case_type("half", "all_gather", 2, 1024)]
    write_plan(plan_of_cases("torch", "cpu", "comm", cases, "gloo", "x" * 64), tmp_path / "p.json")
    plan = read_plan(tmp_path / "p.json")
    ids = plan.ops["comm"].ids
    costing = toy("cpu", CPU, NOISY)
    [whole] = compare_run(plan, {"comm": {ids[0]: 1.5, ids[1]: 0.5}}, costing)
    [(_, cost)] = costing.units(OPS["comm"], plan.ops["comm"].cases, ids, plan.ops["comm"].rows)
    assert whole.cases == 2 and whole.measured == pytest.approx(2 * (1.5 + 0.5))
    assert whole.predicted == pytest.approx(cost.device_seconds)  # a collective carries no first-case cost
    [half] = compare_run(plan, {"comm": {ids[1]: 0.5}}, costing)  # one case of the row: half its prediction
    assert half.measured == pytest.approx(1.0) and half.predicted == pytest.approx(cost.device_seconds / 2)


# -- shards dealt by predicted time ----------------------------------------------------------------------------------
def _skewed():
    """Light and heavy GEMMs alternating in case-ID order ('n=16,' sorts before 'n=16384'), so that round-robin
    over the IDs gives one shard every light case and the other every heavy one."""
    cases = []
    for j in range(12):
        cases += [GemmCase("bfloat16", 32768 + j, 16, 16), GemmCase("bfloat16", 32768 + j, 16384, 65536)]
    return plan_of_cases("torch", "90", "gemm", cases, "torch.nn.functional.linear", collector_hash(ROOT))


def test_dealing_by_predicted_time_balances_a_skewed_plan_that_count_does_not(project):
    whole = _skewed()
    seconds = dict((case_id, cost.seconds) for case_id, cost in plan_units(whole, _h100(project))["gemm"])
    ids = sorted(seconds)
    by_count = [sum(seconds[i] for i in ids[k::2]) for k in range(2)]  # the former dealing: round-robin by ID
    assert max(by_count) / (sum(by_count) / 2) > 1.4  # 12 x 3.1 s against 12 x 1.2 s
    dealt = deal_plan(whole, 2, project.systems)
    assert dealt.balance < 1.02
    assert sum(dealt.seconds) == pytest.approx(sum(by_count), rel=1e-9)
    counts = [dealt.owner["gemm"].count(shard) for shard in range(2)]
    assert counts == [12, 12]  # here balance by time is also balance by count: 6 heavy + 6 light each


def _h100(project):
    from opcollect.plans.predict import costing_for

    return costing_for("torch", "90", project.systems)


def test_dealing_is_deterministic_disjoint_and_complete(project):
    whole = _skewed()
    dealt = deal_plan(whole, 3, project.systems)
    assert dealt == deal_plan(whole, 3, project.systems)
    shards = [shard_of(whole, i, 3, dealt) for i in range(3)]
    seen = [case_id for s in shards for case_id in s.ops["gemm"].ids]
    assert sorted(seen) == sorted(whole.ops["gemm"].ids) and len(seen) == len(set(seen))
    assert {s.plan_hash for s in shards} == {whole.plan_hash}  # the whole selection's hash
    assert len({to_json(s)["content_hash"] for s in shards}) == 3  # each shard its own content
    # without a dealing given, shard_of deals the same way on this checkout's systems
    assert shard_of(whole, 1, 3).ops["gemm"].ids == shards[1].ops["gemm"].ids
    for s in shards:  # each shard keeps the plan's run order
        order = [whole.ops["gemm"].ids.index(c) for c in s.ops["gemm"].ids]
        assert order == sorted(order)


def test_lpt_puts_each_unit_on_the_least_loaded_shard_and_breaks_ties_by_place():
    from opcollect.plans.cost import CaseCost

    units = {"a": [("a1", CaseCost(5.0, 1)), ("a2", CaseCost(1.0, 1))], "b": [("b1", CaseCost(4.0, 1))]}
    dealt = deal({**units, "c": [("c1", CaseCost(4.0, 1)), ("c2", CaseCost(2.0, 1))]}, 2)
    # 5 -> 0; 4 (b1, the earlier op) -> 1; 4 (c1) -> 1 (4 < 5); 2 -> 0; 1 -> 0 (7 < 8)
    assert dealt.owner == {"a": [0, 0], "b": [1], "c": [1, 0]}
    assert dealt.seconds == (8.0, 8.0) and dealt.balance == 1.0


def test_planner_shards_are_dealt_by_predicted_time(planner, project):
    ops = ("gemm", "comm")
    whole = planner.plan("vllm", "90", PlanOptions(ops=ops, smoke=True))
    dealt = deal_plan(whole, 3, project.systems)
    for i in range(3):
        part = planner.plan("vllm", "90", PlanOptions(ops=ops, smoke=True, shard=(i, 3)))
        assert part.ops["gemm"].ids == shard_of(whole, i, 3, dealt).ops["gemm"].ids


# -- what plan and run report ----------------------------------------------------------------------------------------
def test_plan_json_reports_device_seconds_per_op_and_in_all():
    done = run_cli("plan", "--backend", "torch", "--sm", "cpu", "--smoke", "--json")
    assert done.returncode == 0, done.stderr
    s = json.loads(done.stdout)
    per_op = {name: info["device_seconds"] for name, info in s["ops"].items()}
    assert s["cost_system"] == "cpu" and per_op["gemm"] > 0 and per_op["custom_allreduce"] == 0
    assert s["device_seconds"] == pytest.approx(sum(per_op.values()) + s["worker_start_seconds"], abs=0.01)
    # an SM no system lists is planned all the same, its cost unknown
    none = json.loads(run_cli("plan", "--backend", "torch", "--sm", "86", "--ops", "gemm", "--smoke", "--json").stdout)
    assert none["cases"] > 0 and none["device_seconds"] is None and none["ops"]["gemm"]["device_seconds"] is None
    table = run_cli("plan", "--backend", "torch", "--sm", "cpu", "--smoke")
    assert "predicted" in table.stdout and "on cpu" in table.stdout


def test_run_cost_costs_on_the_system_of_the_device_that_ran(tmp_path):
    cases = [GemmCase("bfloat16", 128, 4096, 4096)]
    write_plan(plan_of_cases("vllm", "90", "gemm", cases, "x", "y" * 64), tmp_path / "p.json")
    plan = read_plan(tmp_path / "p.json")
    spent = {"gemm": {plan.ops["gemm"].ids[0]: 2.0}}
    line = run_cost(plan, spent, GPU, "NVIDIA H200")
    assert line.startswith("cost on h200_sxm") and "gemm" in line and "/2.0 s" in line
    assert run_cost(plan, spent, GPU, "an unknown GPU").startswith("cost on h100_sxm")  # the SM's system
    [compared] = compare_run(plan, spent, toy("cuda", GPU), workers=2)
    alone = toy("cuda", GPU).case(OPS["gemm"], cases[0]).seconds
    assert compared.predicted == pytest.approx(alone + 2 * 1.0) and compared.measured == 2.0  # + 2 first cases


def test_a_cpu_run_records_wall_seconds_and_its_summary_sets_predicted_against_measured(tmp_path):
    cases = [GemmCase("float32", 1, 32, 32), GemmCase("float32", 4, 64, 64)]
    plan = plan_of_cases("torch", "cpu", "gemm", cases, "torch.nn.functional.linear", collector_hash(ROOT))
    write_plan(plan, tmp_path / "plan.json")
    args = ("--plan", str(tmp_path / "plan.json"), "--out", str(tmp_path / "run"), "--device", "cpu")
    done = run_cli("run", *args, "--max-case-seconds", "0.02", "--min-samples", "3")
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("cost on cpu"))
    assert "gemm " in line and "(x" in line and "total" in line
    records = [json.loads(x) for p in (tmp_path / "run" / "shards").glob("*.jsonl") for x in p.read_text().splitlines()]
    walls = [r["wall_seconds"] for r in records if "case_id" in r]
    assert len(walls) == 2 and all(w > 0 for w in walls)


def test_an_sm_without_a_system_is_dealt_by_case_count(planner, project):
    """No systems/*.yaml has SM 8.6: each case costs 1 and a batch row its case count. torch's smoke GEMM (4 cases)
    and NCCL rows of 1, 2 and 1 cases: the 2-case row goes first, then the single units fill the lighter shard."""
    whole = planner.plan("torch", "86", PlanOptions(ops=("gemm", "comm"), smoke=True))
    assert [len(row.case_ids) for row in whole.ops["comm"].rows] == [1, 2, 1] and len(whole.ops["gemm"].ids) == 4
    dealt = deal_plan(whole, 2, project.systems)
    assert dealt.seconds == (4.0, 4.0) and dealt.balance == 1.0
    assert dealt.owner == {"gemm": [1, 1, 0, 1], "comm": [0, 0, 1]}
    dealt = deal_plan(whole, 3, project.systems)
    assert sorted(dealt.seconds) == [2.0, 3.0, 3.0] and dealt.owner["comm"][1] == 0
