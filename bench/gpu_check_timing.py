"""The GPU checks of runtime/timing.py: the harness against torch.profiler's kernel durations, a two-kernel
op with host time between its kernels, the eager fallback of an op that syncs, and bf16 GEMM against the
carried vLLM 0.24.0 H200 reference rows.

The profiler side is taken eagerly under the regime the harness reported: for ``rotate:N`` the op cycles
through N input copies back to back, for ``flush`` the same L2 flush (runtime/timing.py's buffer of
L2_MULTIPLE x L2 bytes, zeroed) precedes each call and its kernels are left out of the sum. Kernel
durations do not include host time, so a harness that let a host gap into its events reads slower.
"""

from __future__ import annotations

import statistics
import time

from gpu_check_common import CheckResult, Context, median_or_none, needs_cuda, reference_rows, within

ROTATE_TOLERANCE, FLUSH_TOLERANCE = 0.03, 0.05
# (m, n, k): three that rotate input copies (footprints 96, 36 and 160 MiB) and three small enough to be
# timed with an L2 flush (1.4, 2.0 and 1.2 MiB; the threshold is 3 x L2 / 64, about 2.3 MiB at 50 MiB)
HARNESS_GEMMS = (
    (4096, 4096, 4096),
    (256, 4096, 4096),
    (16, 16384, 5120),
    (128, 1024, 512),
    (1, 1024, 1024),
    (64, 512, 1024),
)
GAP_SECONDS = 200e-6  # Python between the two kernels of the two-kernel op
GAP_GEMMS = {"rotate": (2048, 4096, 4096), "flush": (32, 1024, 512)}
PROFILED_CALLS = 20
# the reference builds 6 weight copies and times one graph of 6 forwards on the same x (aiconfigurator
# collector/vllm/collect_gemm.py run_gemm: outside_loop_count = 6, latency / outside_loop_count), so its
# inputs come from HBM only when the 6 weights exceed the L2 several times over
REFERENCE_WEIGHT_COPIES = 6
REFERENCE_BAND = (0.9, 1.1)


def tolerance(l2: str) -> float:
    return FLUSH_TOLERANCE if l2 == "flush" else ROTATE_TOLERANCE


def gemm_case(m: int, n: int, k: int):
    from opcollect.runtime.planfile import case_type

    return case_type("gemm", ("gemm_dtype", "m", "n", "k"))("bfloat16", m, n, k)


def gemm_footprint(m: int, n: int, k: int) -> int:
    return (m * k + n * k + m * n) * 2


def kernel_time(prepared, device: str, flush: bool, calls: int) -> dict:
    """Median over ``calls`` eager calls of the summed CUDA kernel durations of one call, from torch.profiler."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from opcollect.runtime.timing import L2_MULTIPLE, l2_bytes

    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]

    def device_events(prof) -> list:
        events = prof.profiler.kineto_results.events()
        # kernels, memsets and copies on the device; user annotations (record_function ranges) are not work
        return [
            e
            for e in events
            if e.device_type() == DeviceType.CUDA and not getattr(e, "is_user_annotation", lambda: False)()
        ]

    stream = torch.cuda.Stream(device=device)
    buffer = torch.empty(L2_MULTIPLE * l2_bytes(device), dtype=torch.int8, device=device) if flush else None
    ignore: set[str] = set()
    with torch.cuda.stream(stream):
        for _ in range(3):
            prepared.call()
        stream.synchronize()
        if buffer is not None:  # learn the flush's own kernels, to leave them out
            with profile(activities=activities) as prof:
                buffer.zero_()
                stream.synchronize()
            ignore = {e.name() for e in device_events(prof)}
        with profile(activities=activities) as prof:
            for _ in range(calls):
                if buffer is not None:
                    buffer.zero_()
                prepared.call()
            stream.synchronize()
    events = sorted((e for e in device_events(prof) if e.name() not in ignore), key=lambda e: e.start_ns())
    durations = [e.duration_ns() / 1e6 for e in events]
    if events and len(events) % calls == 0:
        per = len(events) // calls
        per_call = statistics.median(sum(durations[i * per : (i + 1) * per]) for i in range(calls))
    else:  # a call whose kernel count varies: the mean is what is left
        per_call = sum(durations) / calls
    return {
        "profiler_ms": per_call,
        "kernels_per_call": len(events) / calls,
        "kernels": sorted({e.name()[:80] for e in events}),
    }


def harness_and_profiler(prepare, footprint: int, ctx: Context, first: bool = False) -> dict:
    """Time ``prepare`` with runtime/timing.py, then profile it eagerly under the regime the harness used."""
    import torch

    from opcollect.runtime import timing
    from opcollect.runtime.harness import TimingConfig

    stats, _ = timing.measure(prepare, footprint, ctx.device, TimingConfig.for_device("cuda"), first_case=first)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    copies = int(stats.l2.split(":")[1]) if stats.l2.startswith("rotate:") else 1
    profiled = kernel_time(prepare(copies), ctx.device, stats.l2 == "flush", max(PROFILED_CALLS, 2 * copies))
    torch.cuda.empty_cache()
    ratio = stats.latency / profiled["profiler_ms"] if profiled["profiler_ms"] > 0 else float("inf")
    return {
        "harness_ms": stats.latency,
        **profiled,
        "ratio": ratio,
        "diff_us": (stats.latency - profiled["profiler_ms"]) * 1e3,
        "l2": stats.l2,
        "regime": "flush" if stats.l2 == "flush" else "rotate",
        "timing": stats.timing,
        "calls_per_sample": stats.calls_per_sample,
        "noise": stats.noise,
        "samples": stats.samples,
    }


def _gemm_prepare(m: int, n: int, k: int, device: str):
    from functools import partial

    from opcollect.backends.torch import gemm

    return partial(gemm.prepare, gemm_case(m, n, k), "torch.nn.functional.linear", device)


def check_harness_vs_profiler(ctx: Context) -> CheckResult:
    """bf16 GEMM: harness latency vs the profiler's kernel time, rotate within 3%, flush within 5%."""
    if skip := needs_cuda("harness_vs_profiler", ctx):
        return skip
    rows = []
    for i, (m, n, k) in enumerate(HARNESS_GEMMS):
        row = {
            "m": m,
            "n": n,
            "k": k,
            **harness_and_profiler(_gemm_prepare(m, n, k, ctx.device), gemm_footprint(m, n, k), ctx, i == 0),
        }
        row["ok"] = within(row["harness_ms"], row["profiler_ms"], tolerance(row["l2"]))
        rows.append(row)
    regimes = {r["regime"] for r in rows}
    bad = [r for r in rows if not r["ok"]]
    worst = {g: max((abs(r["ratio"] - 1) for r in rows if r["regime"] == g), default=None) for g in ("rotate", "flush")}
    summary = ", ".join(f"{g} worst {w:.1%}" for g, w in worst.items() if w is not None)
    if regimes != {"rotate", "flush"}:
        return CheckResult(
            "", "fail", f"covered regimes {sorted(regimes)}, need rotate and flush; {summary}", {"rows": rows}
        )
    if bad:
        shown = "; ".join(f"{r['m']}x{r['n']}x{r['k']} {r['l2']} {r['ratio']:.3f}" for r in bad)
        return CheckResult("", "fail", f"outside tolerance: {shown}", {"rows": rows, "worst": worst})
    return CheckResult("", "pass", summary, {"rows": rows, "worst": worst})


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _two_kernel_prepare(m: int, n: int, k: int, device: str, sync: bool = False):
    """A GEMM, host time, then a ReLU on its output; with ``sync``, an .item() in between instead."""

    def prepare(copies: int):
        import torch
        import torch.nn.functional as F

        from opcollect.runtime.contract import Prepared
        from opcollect.runtime.timing import random_tensor

        xs = [random_tensor((m, k), torch.bfloat16, device, i) for i in range(copies)]
        ws = [random_tensor((n, k), torch.bfloat16, device, 1000 + i) for i in range(copies)]
        state = {"i": 0}

        def call() -> None:
            i = state["i"] = (state["i"] + 1) % copies
            y = F.linear(xs[i], ws[i])
            if sync:
                y[0, 0].item()  # waits for the GEMM: a capture of this call fails
            else:
                _spin(GAP_SECONDS)
            torch.relu_(y)

        # graph_safe stays True on purpose: the harness must try the capture and fall back on its own
        return Prepared(call, "gpu_check.gemm_then_relu")

    return prepare


def check_two_kernel_gap(ctx: Context) -> CheckResult:
    """GEMM, 200 us of Python, ReLU: a graph in both regimes, equal to the profiler's kernel sum."""
    if skip := needs_cuda("two_kernel_gap", ctx):
        return skip
    rows = []
    for wanted, (m, n, k) in GAP_GEMMS.items():
        row = {"wanted": wanted, "m": m, "n": n, "k": k}
        row |= harness_and_profiler(_two_kernel_prepare(m, n, k, ctx.device), gemm_footprint(m, n, k), ctx)
        row["ok"] = (
            row["regime"] == wanted
            and row["timing"] == "graph"
            and within(row["harness_ms"], row["profiler_ms"], tolerance(row["l2"]))
        )
        rows.append(row)
    summary = "; ".join(
        f"{r['regime']} {r['timing']} {r['harness_ms'] * 1e3:.1f} us vs kernels "
        f"{r['profiler_ms'] * 1e3:.1f} us ({r['ratio']:.3f})"
        for r in rows
    )
    return CheckResult(
        "", "pass" if all(r["ok"] for r in rows) else "fail", summary, {"gap_us": GAP_SECONDS * 1e6, "rows": rows}
    )


def check_eager_fallback(ctx: Context) -> CheckResult:
    """An op that syncs (.item()) fails capture, is timed eagerly; graphs work again after it."""
    if skip := needs_cuda("eager_fallback", ctx):
        return skip
    rows = []
    for wanted, (m, n, k) in GAP_GEMMS.items():
        row = {"wanted": wanted, "m": m, "n": n, "k": k}
        row |= harness_and_profiler(_two_kernel_prepare(m, n, k, ctx.device, sync=True), gemm_footprint(m, n, k), ctx)
        # eager time holds the host round trip of .item() too: never less than the kernels
        row["ok"] = row["timing"] == "eager" and row["harness_ms"] >= row["profiler_ms"] * (1 - tolerance(row["l2"]))
        rows.append(row)
    m, n, k = HARNESS_GEMMS[0]
    after = harness_and_profiler(_gemm_prepare(m, n, k, ctx.device), gemm_footprint(m, n, k), ctx)
    after_ok = after["timing"] == "graph" and within(after["harness_ms"], after["profiler_ms"], tolerance(after["l2"]))
    summary = "; ".join(f"{r['regime']} {r['timing']} {r['harness_ms'] * 1e3:.1f} us" for r in rows)
    summary += f"; next GEMM timed as {after['timing']} ({after['ratio']:.3f} of its kernels)"
    ok = all(r["ok"] for r in rows) and after_ok
    return CheckResult("", "pass" if ok else "fail", summary, {"rows": rows, "after": after})


def check_gemm_reference(ctx: Context) -> CheckResult:
    """bf16 GEMM vs the vLLM 0.24.0 H200 reference rows, split by L2 regime (rotate, ref cold: 0.9-1.1)."""
    if skip := needs_cuda("gemm_reference", ctx):
        return skip
    from opcollect.backends.torch import measure
    from opcollect.runtime.harness import TimingConfig
    from opcollect.runtime.timing import L2_MULTIPLE, l2_bytes

    reference = reference_rows()
    if not reference:
        return CheckResult("", "fail", "no reference rows: bench/data/ is missing from this checkout")
    config = TimingConfig.for_device("cuda")
    cache = l2_bytes(ctx.device)
    rows, failures = [], []
    for ref in reference:
        m, n, k = ref["m"], ref["n"], ref["k"]
        try:
            [result] = measure("gemm", "torch.nn.functional.linear", [gemm_case(m, n, k)], ctx.device, config)
        except Exception as exc:  # one shape failing is a finding, not the end of the check
            failures.append({"m": m, "n": n, "k": k, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
            continue
        ref_cold = REFERENCE_WEIGHT_COPIES * n * k * 2 >= L2_MULTIPLE * cache
        regime = "flush" if result.stats.l2 == "flush" else ("rotate, ref cold" if ref_cold else "rotate, ref warm")
        rows.append(
            {
                "m": m,
                "n": n,
                "k": k,
                "ms": result.stats.latency,
                "ref_ms": ref["latency"],
                "ratio": result.stats.latency / ref["latency"],
                "l2": result.stats.l2,
                "timing": result.stats.timing,
                "bucket": regime,
            }
        )
    buckets = {}
    for name in ("flush", "rotate, ref warm", "rotate, ref cold"):
        ratios = sorted(r["ratio"] for r in rows if r["bucket"] == name)
        buckets[name] = {
            "rows": len(ratios),
            "median": median_or_none(ratios),
            "p10": ratios[len(ratios) // 10] if ratios else None,
            "p90": ratios[(len(ratios) * 9) // 10] if ratios else None,
        }
    gate = buckets["rotate, ref cold"]["median"]
    ok = not failures and gate is not None and REFERENCE_BAND[0] <= gate <= REFERENCE_BAND[1]
    summary = "; ".join(
        f"{name}: {b['rows']} rows, median {b['median']:.3f}" for name, b in buckets.items() if b["median"] is not None
    )
    summary += f"; {len(failures)} shapes failed" if failures else ""
    figures = {"band": REFERENCE_BAND, "buckets": buckets, "failures": failures, "rows": rows}
    return CheckResult("", "pass" if ok else "fail", summary, figures)
