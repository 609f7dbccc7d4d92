"""The CUDA timing path's order of work, with torch.cuda's stream, event and graph objects replaced by fakes
that log what happens (this machine has no GPU): what lies between the start and end events of a sample."""

from __future__ import annotations

import contextlib

import pytest

torch = pytest.importorskip("torch")

from opcollect.runtime import timing  # noqa: E402
from opcollect.runtime.contract import Prepared  # noqa: E402
from opcollect.runtime.harness import TimingConfig  # noqa: E402

L2 = 50 * 2**20


class _Log:
    def __init__(self):
        self.events: list[str] = []
        self.capturing = False


@pytest.fixture
def fake_cuda(monkeypatch):
    log = _Log()

    class Stream:
        def __init__(self, device=None):
            pass

        def synchronize(self):
            pass

    class Event:
        count = 0

        def __init__(self, enable_timing=False):
            Event.count += 1
            self.name = "start" if Event.count % 2 else "end"

        def record(self, stream=None):
            log.events.append(self.name)

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return 0.01

    class Graph:
        def replay(self):
            log.events.append("replay")

    @contextlib.contextmanager
    def graph(g, stream=None):
        log.capturing = True
        try:
            yield
        finally:
            log.capturing = False

    class Flush:
        def zero_(self):
            log.events.append("flush")

    class Props:
        L2_cache_size = L2

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: Props())
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d: (2**36, 2**37))
    monkeypatch.setattr(timing, "_flush_buffer", lambda device: Flush())
    return log


def _op(log: _Log, graph_safe: bool = True, syncs: bool = False):
    """Two kernels with host work between them, as a framework op launches them."""

    def call():
        if syncs and log.capturing:
            raise RuntimeError("operation not permitted when stream is capturing")
        log.events.append("captured" if log.capturing else "call")

    return lambda copies: Prepared(call, "two_kernels", graph_safe=graph_safe)


def _timed_regions(events: list[str]) -> list[list[str]]:
    regions, inside = [], None
    for event in events:
        if event == "start":
            inside = []
        elif event == "end":
            regions.append(inside)
            inside = None
        elif inside is not None:
            inside.append(event)
    return regions


CONFIG = TimingConfig(max_noise=1.0, min_samples=3, max_case_seconds=0.01, warmup_seconds=0.0)


def test_flush_regime_replays_a_captured_call_between_the_events(fake_cuda):
    # a small footprint cannot fill 3 x L2 within MAX_ROTATION input sets: the L2 is flushed before each sample
    stats, kernel = timing.measure(_op(fake_cuda), 1024, "cuda:0", CONFIG)
    assert stats.l2 == "flush" and stats.timing == "graph" and stats.calls_per_sample == 1
    regions = _timed_regions(fake_cuda.events)
    assert regions and all(region == ["replay"] for region in regions)
    # the flush comes right before each sample's start event, outside it
    starts = [i for i, e in enumerate(fake_cuda.events) if e == "start"]
    assert all(fake_cuda.events[i - 1] == "flush" for i in starts)
    assert kernel == "two_kernels"


def test_rotate_regime_replays_a_graph_of_several_calls(fake_cuda):
    stats, _ = timing.measure(_op(fake_cuda), 2 * L2, "cuda:0", CONFIG)
    assert stats.l2.startswith("rotate:") and stats.timing == "graph"
    assert all(region == ["replay"] for region in _timed_regions(fake_cuda.events))
    assert fake_cuda.events.count("captured") == stats.calls_per_sample


@pytest.mark.parametrize("footprint", [1024, 2 * L2])
def test_an_op_that_syncs_falls_back_to_eager_calls(fake_cuda, footprint):
    stats, _ = timing.measure(_op(fake_cuda, syncs=True), footprint, "cuda:0", CONFIG)
    assert stats.timing == "eager"
    regions = _timed_regions(fake_cuda.events)
    assert regions and all(region == ["call"] * stats.calls_per_sample for region in regions)


def test_an_op_marked_not_graph_safe_is_never_captured(fake_cuda):
    stats, _ = timing.measure(_op(fake_cuda, graph_safe=False), 1024, "cuda:0", CONFIG)
    assert stats.timing == "eager" and "captured" not in fake_cuda.events
