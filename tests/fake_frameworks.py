"""Stand-ins for framework state the runner tests share (no GPU, no framework installed): vLLM's process-wide config
and forward context as backends/vllm's runners use them. Each test's fake framework subclasses VllmWorld and adds its
own layers, backends and builders."""

from __future__ import annotations

import contextlib
import enum
from types import SimpleNamespace


class CUDAGraphMode(enum.Enum):  # config/compilation.py: the runtime modes set_forward_context carries
    NONE = 0
    PIECEWISE = 1
    FULL = 2


class VllmWorld:
    """VllmConfig() without a model (its attention_config holding ``attention``), set_current_vllm_config, and
    set_forward_context recording what a call runs under in ``forward`` (None outside one)."""

    def __init__(self, **attention):
        self.attention = attention
        self.current = None
        self.forward = None

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
