"""Stand-ins for framework state the runner tests share (no GPU, no framework installed): a recorder of the calls a
stand-in is handed, and vLLM's process-wide config, forward context and breakable capture as backends/vllm's runners
use them. Each test's fake vLLM subclasses VllmWorld and adds its own layers, backends and builders."""

from __future__ import annotations

import contextlib
import enum
import functools
from types import SimpleNamespace

from conftest import install_fakes

from opcollect.backends.vllm import context
from opcollect.backends.vllm.msa import BREAKABLE


class Recorder:
    """A stand-in framework that records each call it is handed in ``calls`` as (kind, what it was handed); a
    subclass's install(monkeypatch) puts its modules in place."""

    def __init__(self):
        self.calls: list = []

    def record(self, kind: str, **seen) -> None:
        self.calls.append((kind, seen))

    def of(self, kind: str) -> list:
        return [c[1] for c in self.calls if c[0] == kind]

    def install(self, monkeypatch) -> None:
        raise NotImplementedError

    @classmethod
    def installed(cls, monkeypatch, *args, **kw):
        """A fresh stand-in, installed for the test's length."""
        fake = cls(*args, **kw)
        fake.install(monkeypatch)
        return fake


class CUDAGraphMode(enum.Enum):  # config/compilation.py: the runtime modes set_forward_context carries
    NONE = 0
    PIECEWISE = 1
    FULL = 2


class VllmWorld:
    """VllmConfig() without a model (its attention_config holding ``attention``), set_current_vllm_config,
    set_forward_context recording what a call runs under in ``forward`` (None outside one), and the breakable capture
    recording each capture in ``captures``."""

    def __init__(self, **attention):
        self.attention = attention
        self.current = None
        self.forward = None
        self.captures: list = []

    @classmethod
    def installed(cls, monkeypatch, **kw):
        """A fresh stand-in installed, the worker's env without VLLM_USE_BREAKABLE_CUDAGRAPH, as a worker starts."""
        monkeypatch.delenv(BREAKABLE, raising=False)
        fake = cls(**kw)
        fake.install(monkeypatch)
        return fake

    def vllm_config(self, quant_config=None):  # VllmConfig() without a model
        return SimpleNamespace(
            quant_config=quant_config,
            model_config=None,
            parallel_config=SimpleNamespace(),
            attention_config=SimpleNamespace(**self.attention),
            scheduler_config=SimpleNamespace(max_num_seqs=128, max_num_batched_tokens=2048),
            compilation_config=SimpleNamespace(
                custom_ops=["none"], cudagraph_capture_sizes=[], max_cudagraph_capture_size=0,
                ir_enable_torch_wrap=True, static_forward_context={},
            ),
            kernel_config=SimpleNamespace(ir_op_priority=None),
            cache_config=SimpleNamespace(cache_dtype="auto", block_size=16),
        )  # fmt: skip

    @contextlib.contextmanager
    def set_current(self, config, check_compile=True):
        previous, self.current = self.current, config
        try:
            yield
        finally:
            self.current = previous

    @contextlib.contextmanager
    def set_forward_context(self, attn_metadata, vllm_config, num_tokens=None, cudagraph_runtime_mode=None,
                            slot_mapping=None, **kw):  # fmt: skip
        self.forward = SimpleNamespace(attn_metadata=attn_metadata, num_tokens=num_tokens, slot_mapping=slot_mapping,
                                       mode=cudagraph_runtime_mode, config=self.current)  # fmt: skip
        try:
            yield
        finally:
            self.forward = None

    def install_world(self, monkeypatch, modules: dict) -> None:
        """install_fakes with vllm_modules and ``modules`` (the test's own), the process group taken as set up."""
        install_fakes(monkeypatch, {**self.vllm_modules(), **modules})
        monkeypatch.setattr(context, "_initialised", {"cpu"})  # no process group for the stand-in

    def vllm_modules(self) -> dict:
        """install_fakes' entries for what context.vllm_context, context.serve_batch, set_forward_context and the
        CommonAttentionMetadata the runners build import."""
        return {
            "vllm.config": {
                "VllmConfig": self.vllm_config,
                "set_current_vllm_config": self.set_current,
                "CUDAGraphMode": CUDAGraphMode,
            },
            "vllm.config.kernel": {
                "IrOpPriorityConfig": SimpleNamespace(
                    with_default=lambda default, **kw: SimpleNamespace(set_default=lambda: None)
                )
            },
            "vllm.ir": {"set_default_torch_wrap": lambda wrap: None},
            "vllm.forward_context": {"set_forward_context": self.set_forward_context},
            "vllm.v1.attention.backend": {"CommonAttentionMetadata": lambda **kw: SimpleNamespace(**kw)},
        }

    def breakable_capture(self, breakable):
        """BreakableCUDAGraphCapture (compilation/breakable_cudagraph.py:125-230): the kinds of piece it captured and
        the eager calls its replay runs again; and eager_break_during_capture (:59-117), which breaks the capture
        around a call unless the forward runs as one FULL graph, when ``breakable()`` held as the module was made."""
        world = self

        class Capture:
            active = None

            def __init__(self, pool=None):
                self.kinds, self.eager = [], []
                world.captures.append(self)

            def __enter__(self):
                Capture.active = self
                self.kinds.append("graph")
                return self

            def __exit__(self, *exc):
                Capture.active = None

            def add_eager(self, fn):
                self.kinds += ["eager", "graph"]
                self.eager.append(fn)
                return fn()

            def replay(self):
                for fn in self.eager:
                    fn()

        def eager_break_during_capture(fn):
            if not breakable():
                return fn

            @functools.wraps(fn)
            def wrapper(*args):
                if Capture.active is None or world.forward.mode == CUDAGraphMode.FULL:
                    return fn(*args)
                return Capture.active.add_eager(lambda: fn(*args))

            return wrapper

        return Capture, eager_break_during_capture
