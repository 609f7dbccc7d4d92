"""The cost model: the predicted wall seconds one case holds its worker, from the harness's rules and the bound.

A case costs what the harness spends on it (runtime/timing.py, runtime/harness.py), its calls predicted from the
speed-of-light bound of rule R8 (tables/physics.py over the op's plans/work.py Work):

  call     t = floor + bound / efficiency: the efficiency the median fraction of speed of light of the op's rows
           (GPU_EFFICIENCY, CPU_EFFICIENCY, each with its source); an op without a bound costs the floor
  timing   the calls before sampling (CPU: calls_for, one call and up to 3 more; CUDA: 3 eager calls, calls_for, a
           graph of the sample's calls captured and replayed once), the warm-up (samples until warmup_seconds, at
           least one) and the samples until the stopping rule ends them: the noise stop at min_samples when a
           sample's predicted spread (jitter_seconds / its timed seconds + jitter_share) is within max_noise,
           else the cap (max_case_seconds and CAP_MIN_SAMPLES samples, or HARD_CAP_FACTOR x it and one)
  case     set-up (round trip, prepare) + the inputs filled (the Work's bytes; a MoE's every local expert) + the
           timings (two for a framework's compute_scale) + one more call under the profiler (runtime/observe.py)
  ranks    a collective's samples run on its own clock (the sum of the timed calls, backends/torch/comm.py), each
           with a barrier and an all-reduce of the maximum around it; its row adds the start of its ranks
Device-seconds are a case's seconds x the devices it spans (num_gpus of a collective, else 1). A worker's start and
its first case's one-time costs (the profiler's first start, the first case's clock warm-up) come once per worker.

Planning never imports torch: the harness's rules are read from their modules, the system's figures from
systems/*.yaml; tables/physics.py (pyarrow) is imported when a cost is computed. plans/predict.py applies the model
to plans and runs, plans/deal.py deals shards by it.
"""

from __future__ import annotations

import inspect
import math
import statistics
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Callable, Literal, Mapping, NamedTuple

from opcollect.plans.base import OpPlan
from opcollect.plans.quantize import scale_matrix_work
from opcollect.plans.work import Work, format_of
from opcollect.runtime.harness import CAP_MIN_SAMPLES, HARD_CAP_FACTOR, TimingConfig, measure_cpu
from opcollect.runtime.timing import GRAPH_MAX_CALLS, GRAPH_SAMPLE_SECONDS, L2_MULTIPLE, rotation_copies

if TYPE_CHECKING:
    from opcollect.cases.systems import System
    from opcollect.plans.bound import Figures

Kind = Literal["cpu", "cuda"]
# measure_cpu sizes a sample to about this many seconds of calls (its default, read so the two cannot drift)
CPU_SAMPLE_SECONDS: float = inspect.signature(measure_cpu).parameters["sample_target_seconds"].default
CALLS_FOR_MAX = 10_000  # calls_for's bound on calls per sample (runtime/harness.py)


@dataclass(frozen=True)
class Harness:
    """What the harness spends on one device kind beyond the op's own calls."""

    setup_seconds: float  # per case: the task's round trip, the runner's prepare, the record
    fill_bytes_per_s: float  # input bytes prepare fills per second (random_tensor, a MoE's expert weights)
    floor_seconds: float  # least time of one call: dispatch (CPU), launch and a tiny kernel (CUDA)
    sync_seconds: float  # one eager call's host round trip beyond the call (launch, synchronize); CPU 0
    sample_gap_seconds: float  # wall time per sample outside the timed calls (loop, events, synchronize)
    jitter_seconds: float  # absolute spread (p75 - p25) of one sample's timed seconds
    jitter_share: float  # relative spread of a sample on top of it
    observe_seconds: float  # the profiler's start and stop around the one more call after the samples
    rank_sync_seconds: float  # per sample of a collective: its barrier and the all-reduce of the ranks' maximum
    row_start_seconds: float  # a multi-rank row: spawning its ranks, their imports and process group
    worker_start_seconds: float  # a worker: spawn, imports, device context, the host probe
    first_case_seconds: float  # a worker's first case: the profiler's first start; FIRST_CASE_WARMUP_SECONDS


# CPU: measured by `nox -s bench -- cost` (bench/bench_cost.py) on the 2-core dev host shared with other jobs, whose
# noise keeps a CPU row's relative IQR over 1%, so CPU cases sample to the cap (jitter_share 0.05): rows of 2 ms
# and more still stop early now and then, when the host's 8 ms scheduling quantum makes every sample alike. The
# profiler's first start in a process takes 1.1 s there, a later one 1-10 ms; a gloo collective's barrier and
# all-reduce about 5 ms a sample; a comm row's 2 ranks 2.5 to 4 s to spawn and import torch.
# CUDA: NOT measured (the session that wrote this had no GPU): launch, synchronize and CUDA-event figures of
# H100/H200-class GPUs, a framework worker's start of about half a minute, CUPTI's first start, and the first
# case's FIRST_CASE_WARMUP_SECONDS (runtime/timing.py). Re-derive them from a GPU run's records (wall_seconds).
HARNESS: dict[Kind, Harness] = {
    "cpu": Harness(
        setup_seconds=0.02,
        fill_bytes_per_s=0.2e9,
        floor_seconds=10e-6,
        sync_seconds=0.0,
        sample_gap_seconds=1e-6,
        jitter_seconds=2e-6,
        jitter_share=0.05,
        observe_seconds=0.005,
        rank_sync_seconds=5e-3,
        row_start_seconds=3.0,
        worker_start_seconds=3.0,
        first_case_seconds=1.1,
    ),
    "cuda": Harness(
        setup_seconds=0.05,
        fill_bytes_per_s=100e9,
        floor_seconds=4e-6,
        sync_seconds=10e-6,
        sample_gap_seconds=30e-6,
        jitter_seconds=1e-6,
        jitter_share=0.002,
        observe_seconds=0.02,
        rank_sync_seconds=100e-6,
        row_start_seconds=20.0,
        worker_start_seconds=30.0,
        first_case_seconds=3.0,
    ),
}
# an op's own least time of one call where the device's floor is too low: a gloo collective's round trip between
# CPU processes (0.3 ms and more in the smoke rows), an NCCL one's launch and handshake, the torch MoE's loop over
# every local expert on the CPU (backends/torch/moe.py: 6 to 48 ms in smoke rows whose bound is near 0)
FLOORS: dict[tuple[Kind, str], float] = {
    ("cpu", "comm"): 3e-4,
    ("cpu", "moe"): 0.03,
    ("cuda", "comm"): 20e-6,
    ("cuda", "custom_allreduce"): 8e-6,
}

# Fraction of speed of light per op and framework on a GPU: the medians rule R8 prints for the consumer's own H200
# tables (`opcollect check --against-physics /work/shared/reference/aiconfigurator-h200-pinned`: vLLM 0.24.0,
# SGLang 0.5.14, TensorRT-LLM 1.3.0rc20; comm: NCCL 2.29.2's nccl_perf, which every backend's comm is). A backend
# or op without a reference table takes the median of the op's frameworks. Medians include the launch-bound small
# rows, so a large case's call is predicted slower than it runs.
GPU_EFFICIENCY: dict[str, dict[str, float]] = {
    "gemm": {"vllm": 0.243, "sglang": 0.358, "trtllm": 0.332},
    "scale_matrix": {"vllm": 0.144, "sglang": 0.041, "trtllm": 0.241},
    "attention_context": {"vllm": 0.142, "sglang": 0.169, "trtllm": 0.094},
    "attention_generation": {"vllm": 0.029, "sglang": 0.058, "trtllm": 0.046},
    "moe": {"vllm": 0.047, "sglang": 0.037, "trtllm": 0.048},
    "mla_context": {"sglang": 0.102, "trtllm": 0.151},
    "mla_generation": {"sglang": 0.051, "trtllm": 0.104},
    "mla_context_module": {"vllm": 0.321, "trtllm": 0.376},
    "mla_generation_module": {"vllm": 0.178, "trtllm": 0.288},
    "mla_bmm": {"vllm": 0.400, "sglang": 0.095, "trtllm": 0.105},
    "encoder_attention": {"vllm": 0.289, "sglang": 0.296, "trtllm": 0.212},
    # DeepSeek-V4: R8's medians over the H200 reference with plans/dsv4*.py's bounds (projections alone for the modules)
    "dsv4_csa_context_module": {"vllm": 0.115, "sglang": 0.138},
    "dsv4_csa_generation_module": {"vllm": 0.134, "sglang": 0.169},
    "dsv4_hca_context_module": {"vllm": 0.199, "sglang": 0.237},
    "dsv4_hca_generation_module": {"vllm": 0.178, "sglang": 0.244},
    "dsv4_paged_mqa_logits_module": {"vllm": 0.140, "sglang": 0.207},
    "dsv4_hca_attn_module": {"vllm": 0.202},
    "dsv4_csa_topk_calib": {"sglang": 0.059},
    "mhc": {"vllm": 0.443, "sglang": 0.429, "trtllm": 0.443},
    # the sparse-attention modules (plans/dsa.py, dsa_kernels.py, msa.py; MSA's TensorRT-LLM table is rc23's)
    "dsa_context_module": {"vllm": 0.077, "sglang": 0.086, "trtllm": 0.051},
    "dsa_generation_module": {"vllm": 0.107, "sglang": 0.218, "trtllm": 0.083},
    "glm5_mqa_logits_module": {"sglang": 0.341},
    "glm5_topk_module": {"sglang": 0.197},
    "glm5_dsa_attn_module": {"sglang": 0.213},
    "msa_context_module": {"vllm": 0.238, "trtllm": 0.013},
    "msa_generation_module": {"vllm": 0.336, "trtllm": 0.019},
    # linear attention (plans/linear_attention.py): the medians over the H200 reference with each row's stage read from
    # its kernel_source (the reference has no stage column); mamba2's are its conv rows', the only ones it holds
    "gdn": {"vllm": 0.068, "sglang": 0.028, "trtllm": 0.071},
    "mamba2": {"trtllm": 0.110},
    "comm": {"nccl": 0.073},
    "custom_allreduce": {"vllm": 0.094, "sglang": 0.078, "trtllm": 0.151},
}
# Fraction of speed of light per op of the torch backend on the CPU against systems/cpu.yaml's nominal figures (what
# a plan knows of a CPU; the host's own are often higher): medians over the rows of a CPU smoke collection as
# bench/bench_cost.py's calibration lines print them, two runs of 3 on the 2-core dev host (2026-12-02), taken
# between the two where they differ (the host's load moves them up to 50x: a contended row waits out an 8 ms time
# slice). gemm: of the bench's GEMM ladder, whose rows outlast the cap (0.46, 0.66, 0.59); comm: beyond gloo's
# floor. An op whose rows all stay under the cap costs the cap whatever its efficiency.
CPU_EFFICIENCY: dict[str, float] = {
    "gemm": 0.59,
    "scale_matrix": 0.032,  # 0.0328, 0.0322
    "attention_context": 0.01,  # 0.0042, 0.0219
    "attention_generation": 0.007,  # 0.0051, 0.0085
    "moe": 0.0015,  # 0.0016, 0.0015 (and FLOORS: its loop over every local expert)
    "mla_context": 0.004,  # 0.0147, 0.0009
    "mla_generation": 0.003,  # 0.0041, 0.0016
    "mla_bmm": 0.2,  # 1.51, 0.0265
    "encoder_attention": 0.0065,  # 0.0017, 0.0250
    "comm": 0.05,
}
DEFAULT_EFFICIENCY = 0.05  # an op neither table names

# compute_scale has no bound (its latency is a difference of two timings); its calls quantize x as scale_matrix does
WORK_PROXY: dict[str, Callable[[NamedTuple], Work | None]] = {"compute_scale": scale_matrix_work}
EFFICIENCY_PROXY = {"compute_scale": "scale_matrix"}
# timings per case beyond one: the frameworks' compute_scale times the dynamic and the static quant, each sampled to
# its own stop (backends/{vllm,sglang,trtllm}/quantize.py: difference()); torch times its scale kernels once
TIMINGS: dict[tuple[str, str], int] = {("compute_scale", b): 2 for b in ("vllm", "sglang", "trtllm")}


def moe_weights(c: NamedTuple) -> float:
    """Every local expert's weights, which a MoE runner builds whether tokens reach them or not (gate, up, down)."""
    local = c.num_experts // c.moe_ep_size
    return local * 3 * c.hidden_size * (c.inter_size // c.moe_tp_size) * format_of(c.moe_dtype).weight


# bytes a runner's prepare fills beyond the Work's (which counts only what a call must move)
PREPARED: dict[str, Callable[[NamedTuple], float]] = {"moe": moe_weights}


def efficiency(kind: Kind, op: str, backend: str) -> float:
    op = EFFICIENCY_PROXY.get(op, op)
    if kind == "cpu":
        return CPU_EFFICIENCY.get(op, DEFAULT_EFFICIENCY)
    table = GPU_EFFICIENCY.get(op)
    if not table:
        return DEFAULT_EFFICIENCY
    return table.get(backend) or statistics.median(table.values())


def system_for_sm(systems: Mapping[str, System], sm: str) -> System | None:
    """The system an SM's plan is costed on: of the systems/*.yaml with that SM, the one with the least memory
    bandwidth (the slower prediction), then by name; None when none has it (SM 86 has no system yet)."""
    found = sorted((s for s in systems.values() if s.sm == sm), key=lambda s: (s.bandwidth_bytes_per_s, s.name))
    return found[0] if found else None


def ranked(op: OpPlan) -> bool:
    """A collective: its cases span num_gpus devices, timed by ranks in their own processes."""
    return "num_gpus" in op.fields


def devices_of(op: OpPlan, case: tuple) -> int:
    """Devices a case spans: a collective's num_gpus, else 1."""
    return int(case[op.fields.index("num_gpus")]) if ranked(op) else 1


def calls_for_estimate(once: float, target: float, most: int = CALLS_FOR_MAX) -> int:
    """calls_for's answer for calls of ``once`` seconds (runtime/harness.py: target / once, within 1..10,000)."""
    return max(1, min(most, int(target / max(once, 1e-7))))


class CaseCost(NamedTuple):
    seconds: float  # wall seconds the case holds its worker
    devices: int  # devices it spans

    @property
    def device_seconds(self) -> float:
        return self.seconds * self.devices


@dataclass(frozen=True)
class Costing:
    """The cost model of one backend on one system under one TimingConfig."""

    backend: str
    kind: Kind
    figures: Figures
    memory_bytes: int
    config: TimingConfig
    harness: Harness = field(repr=False)
    # op -> case -> (bound seconds, bytes the call moves, bytes prepare fills) on this system: filled as cases are
    # costed, and shareable between the backends costed on one system
    bounds: dict[str, dict[tuple, tuple[float, float, float]]] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(
        cls, backend: str, system: System, config: TimingConfig | None = None, bounds: dict | None = None
    ) -> Costing:
        from opcollect.plans.bound import datasheet

        kind: Kind = "cpu" if system.sm == "cpu" else "cuda"
        config = config or TimingConfig.for_device(kind)
        shared = bounds if bounds is not None else {}
        return cls(backend, kind, datasheet(system), system.memory_bytes, config, HARNESS[kind], shared)

    @cached_property
    def timing(self) -> Callable[[float, float], tuple[float, int]]:
        """(seconds, input copies) of one timing of a call of t seconds moving ``footprint`` bytes: cpu_timing or
        cuda_timing with their constants bound once (a plan holds 10^5 cases)."""
        return (cpu_timing if self.kind == "cpu" else cuda_timing)(self)

    @cached_property
    def ranks_timing(self) -> Callable[[float, float], tuple[float, int]]:
        return ranks_timing(self)

    def floor(self, op: str) -> float:
        return FLOORS.get((self.kind, op), self.harness.floor_seconds)

    def call_seconds(self, op: OpPlan, bound_seconds: float) -> float:
        """The predicted seconds of one call: the floor, plus the bound over the op's efficiency."""
        return self.floor(op.name) + bound_seconds / efficiency(self.kind, op.name, self.backend)

    def seconds_of(self, op: OpPlan) -> Callable[[tuple], float]:
        """The predicted wall seconds of one case of ``op`` (its raw values or its case type), with the op's
        constants bound."""
        from opcollect.plans.bound import bound

        h, figures, make = self.harness, self.figures, op.case_type._make
        work_of = op.work or WORK_PROXY.get(op.name)
        prepared = PREPARED.get(op.name)
        floor, eff = self.floor(op.name), efficiency(self.kind, op.name, self.backend)
        timings = TIMINGS.get((op.name, self.backend), 1)
        timing = self.ranks_timing if ranked(op) else self.timing
        # a collective's ranks time it in their own processes, unobserved (backends/torch/comm.py)
        observe = 0.0 if ranked(op) else h.observe_seconds
        known = self.bounds.setdefault(op.name, {})

        def seconds(values: tuple) -> float:
            found = known.get(values)
            if found is None:
                case = make(values)
                work = work_of(case) if work_of is not None else None
                b, moved = (0.0, 0.0) if work is None else (bound(work, figures)[0], work.bytes)
                found = known[values] = (b, moved, max(moved, prepared(case)) if prepared else moved)
            t = floor + found[0] / eff
            spent, copies = timing(t, found[1])
            return h.setup_seconds + copies * found[2] / h.fill_bytes_per_s + timings * spent + observe + t

        return seconds

    def case(self, op: OpPlan, case: tuple) -> CaseCost:
        return CaseCost(self.seconds_of(op)(case), devices_of(op, case))

    def units(self, op: OpPlan, cases: list[tuple], ids: list[str], rows) -> list[tuple[str, CaseCost]]:
        """The op's units as a worker is handed them: (case ID, cost) per case, or (row ID, cost) per batch row,
        a row of several ranks with the start of its ranks."""
        seconds = self.seconds_of(op)
        if rows is None:
            return [(case_id, CaseCost(seconds(c), devices_of(op, c))) for case_id, c in zip(ids, cases)]
        costs = {case_id: CaseCost(seconds(c), devices_of(op, c)) for case_id, c in zip(ids, cases)}
        found = []
        for row in rows:
            members = [costs[c] for c in row.case_ids]
            devices = max((m.devices for m in members), default=1)
            start = self.harness.row_start_seconds if devices > 1 else 0.0
            found.append((row.row_id, CaseCost(start + sum(m.seconds for m in members), devices)))
        return found

    def op_device_seconds(self, op: OpPlan, cases: list[tuple], ids: list[str], rows) -> float:
        """The device-seconds of an op's cases (raw values, in ``ids`` order), multi-rank rows' starts included."""
        if rows is None and not ranked(op):
            return sum(map(self.seconds_of(op), cases))
        return sum(cost.device_seconds for _, cost in self.units(op, cases, ids, rows))


def sampler(costing: Costing, own_clock: bool = False) -> Callable[[float, float], float]:
    """Seconds of sample_until_stable when a sample lasts ``wall`` seconds, ``timed`` of them inside the calls:
    warm-up samples until warmup_seconds (at least one), then samples until the noise stop or the cap. The cap's
    clock is the wall, or with ``own_clock`` the timed seconds alone (a collective's, backends/torch/comm.py)."""
    c, h, ceil = costing.config, costing.harness, math.ceil
    cap, hard, least, warmup = c.max_case_seconds, HARD_CAP_FACTOR * c.max_case_seconds, c.min_samples, c.warmup_seconds
    at_least = min(CAP_MIN_SAMPLES, least)
    share = c.max_noise - h.jitter_share  # the spread meets the target when jitter / timed <= this,
    quiet = h.jitter_seconds / share if share > 0 else math.inf  # i.e. when timed >= quiet

    def sampling(timed: float, wall: float) -> float:
        clock = timed if own_clock else wall
        n = min(max(ceil(cap / clock), at_least), max(1, ceil(hard / clock)))
        if timed >= quiet and n > least:
            n = least
        return (max(1, ceil(warmup / clock)) + n) * wall

    return sampling


def cpu_timing(costing: Costing) -> Callable[[float, float], tuple[float, int]]:
    """measure_cpu: calls_for (one call, 3 more unless one outlasts a sample), then samples of K calls lasting about
    CPU_SAMPLE_SECONDS; one input set."""
    sampling, gap = sampler(costing), costing.harness.sample_gap_seconds

    def timing(t: float, footprint: float) -> tuple[float, int]:
        timed = calls_for_estimate(t, CPU_SAMPLE_SECONDS) * t
        return (2 if t > CPU_SAMPLE_SECONDS else 4) * t + sampling(timed, timed + gap), 1

    return timing


def cuda_timing(costing: Costing) -> Callable[[float, float], tuple[float, int]]:
    """_measure_cuda: 3 eager calls, calls_for, a graph of ``calls`` calls captured and replayed once, then samples:
    replays over rotating input sets when they exceed L2_MULTIPLE x L2 (rotation_copies, the footprint the op's
    Work.bytes), else one call after an L2 flush (zeroing L2_MULTIPLE x L2 bytes, outside the timed events)."""
    sampling, h, l2 = sampler(costing), costing.harness, costing.figures.cache_bytes
    sync, gap, memory = h.sync_seconds, h.sample_gap_seconds, costing.memory_bytes
    flush = L2_MULTIPLE * l2 / costing.figures.memory

    def timing(t: float, footprint: float) -> tuple[float, int]:
        synced = t + sync
        copies = rotation_copies(int(footprint), l2, memory)
        if copies * footprint >= L2_MULTIPLE * l2:
            calls = max(copies, calls_for_estimate(synced, GRAPH_SAMPLE_SECONDS, GRAPH_MAX_CALLS))
            timed = calls * t
            wall = timed + gap
        else:
            calls, timed = 1, t
            wall = t + gap + flush
        before = 3 * synced + (2 if synced > GRAPH_SAMPLE_SECONDS else 4) * synced + 2 * calls * t
        return before + sampling(timed, wall), copies

    return timing


def ranks_timing(costing: Costing) -> Callable[[float, float], tuple[float, int]]:
    """A collective's timing in its ranks (backends/torch/comm.py _time_one; the frameworks' all-reduce runners
    share its sample size): two single calls, then samples of K calls lasting about SAMPLE_SECONDS, each with a
    barrier and an all-reduce of the maximum, on the clock of the timed calls alone."""
    from opcollect.backends.torch.comm import MAX_CALLS_PER_SAMPLE, SAMPLE_SECONDS

    sampling, sync = sampler(costing, own_clock=True), costing.harness.rank_sync_seconds

    def timing(t: float, footprint: float) -> tuple[float, int]:
        timed = calls_for_estimate(t, SAMPLE_SECONDS, MAX_CALLS_PER_SAMPLE) * t
        return 2 * (t + sync) + sampling(timed, timed + sync), 1

    return timing
