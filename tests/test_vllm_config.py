"""The VllmConfig the vLLM attention and MLA runners build their layers and metadata builders under, against a
stand-in vllm that records what the real one reads: batch limits, CUDA-graph capture sizes, custom ops and the
RMSNorm IR-op priority. The stand-in builders size and cap as vLLM 0.24.0's do (cited at each)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from opcollect.backends.vllm import attention as attn
from opcollect.backends.vllm import context, mla
from opcollect.plans.attention import AttentionCase
from opcollect.plans.mla_module import MlaModuleCase

torch = pytest.importorskip("torch")

SERVING_SIZES = (1, 2, 4, *range(8, 256, 8), *range(256, 513, 16))  # config/vllm.py:1641-1645, largest 512


def round_up(x: int, to: int) -> int:
    return (x + to - 1) // to * to


class Builder:
    """FA3's builder (v1/attention/backends/flash_attn.py:370-393, 447-458; FLASH_ATTN_MLA's alike,
    mla/flashattn_mla.py:137-164, 208-243): a scheduler_metadata buffer sized from max_num_seqs and the largest
    capture size, the build asserting the batch fits, and 32 splits for a batch within the largest capture size."""

    built: list = []

    def __init__(self, spec, names, config, device):
        self.config = config
        self.max_num_seqs = config.scheduler_config.max_num_seqs
        self.max_cudagraph_size = config.compilation_config.max_cudagraph_capture_size
        self.buffer = 1 + round_up(max(self.max_num_seqs, self.max_cudagraph_size or 0), 4) * 4
        Builder.built.append(self)

    def build(self, common_prefix_len, common_attn_metadata):
        n = 1 + round_up(common_attn_metadata.num_reqs, 4) * 4
        assert n <= self.buffer, f"Scheduler metadata size {n} exceeds buffer size {self.buffer}"
        tokens = common_attn_metadata.num_actual_tokens
        cap = self.max_cudagraph_size
        splits = 32 if cap is not None and tokens <= cap else 0  # 0: FA3's own heuristic
        return SimpleNamespace(max_num_splits=splits, num_prefills=0, prefill=None, decode=SimpleNamespace())


class Backend:
    def __init__(self, name: str, block_size: int):
        self.name, self.block_size = name, block_size

    def get_name(self):
        return self.name

    def get_preferred_block_size(self, default):
        return self.block_size

    def get_builder_cls(self):
        return Builder

    def get_kv_cache_shape(self, num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        if self.name.endswith("MLA"):
            return (num_blocks, block_size, head_size)
        return (num_blocks, 2, block_size, num_kv_heads, head_size)

    def get_kv_cache_stride_order(self):
        raise NotImplementedError


class FakeVllm:
    """The vllm modules the two runners import, recording the config each layer was built under."""

    def __init__(self):
        self.current = None
        self.installed: dict = {}
        self.torch_wrap: list = []
        self.layers: list = []  # (layer kind, custom_ops and installed rms_norm priority when it was built)

    def vllm_config(self, quant_config=None):
        # VllmConfig() at O2 without a model: custom ops "none" (+quant_fp8 for block fp8, config/vllm.py:1129-1155),
        # native IR ops, no capture sizes (config/vllm.py:1795-1797), max_num_seqs 128 (config/scheduler.py:44)
        ops = ["+quant_fp8"] if quant_config is not None else []
        return SimpleNamespace(
            quant_config=quant_config,
            model_config=None,
            scheduler_config=SimpleNamespace(max_num_seqs=128, max_num_batched_tokens=2048),
            compilation_config=SimpleNamespace(
                custom_ops=[*ops, "none"],
                cudagraph_capture_sizes=[],
                max_cudagraph_capture_size=0,
                ir_enable_torch_wrap=True,
                static_forward_context={},
            ),
            kernel_config=SimpleNamespace(ir_op_priority=self.priority_config(["native"])),
            cache_config=SimpleNamespace(cache_dtype="auto", block_size=16),
        )

    def priority_config(self, default, **fields):
        fake = self

        class Priority(SimpleNamespace):
            def set_default(self):
                fake.installed = dict(vars(self))

        return Priority(**{"rms_norm": list(default), "fused_add_rms_norm": list(default), **fields})

    def set_current(self, config, check_compile=True):
        fake = self

        class Current:
            def __enter__(self):
                self.previous, fake.current = fake.current, config

            def __exit__(self, *exc):
                fake.current = self.previous

        return Current()

    def snapshot(self, kind: str) -> None:
        self.layers.append((kind, list(self.current.compilation_config.custom_ops), self.installed.get("rms_norm")))

    def attention_layer(self, **kw):
        self.snapshot("attention")
        return SimpleNamespace(
            attn_backend=Backend("FLASH_ATTN", 16),
            impl=SimpleNamespace(vllm_flash_attn_version=3),
            kv_cache_torch_dtype=torch.bfloat16,
            process_weights_after_loading=lambda dtype: None,
            get_kv_cache_spec=lambda config: SimpleNamespace(dtype=torch.bfloat16),
        )

    def mla_module(self, *, vllm_config, prefix, **kw):
        self.snapshot("mla")
        backend = Backend("FLASH_ATTN_MLA", 16)
        vllm_config.compilation_config.static_forward_context[f"{prefix}.attn"] = SimpleNamespace(
            attn_backend=backend,
            prefill_backend=Backend("FLASH_ATTN", 16),
            get_kv_cache_spec=lambda config: SimpleNamespace(dtype=torch.bfloat16),
        )
        return torch.nn.Module()

    def install(self, monkeypatch) -> None:
        fake = self
        modules = {
            "vllm": SimpleNamespace(),
            "vllm.config": SimpleNamespace(
                VllmConfig=self.vllm_config,
                set_current_vllm_config=self.set_current,
                CacheConfig=SimpleNamespace(DEFAULT_BLOCK_SIZE=16),
            ),
            "vllm.config.kernel": SimpleNamespace(
                IrOpPriorityConfig=SimpleNamespace(with_default=lambda default, **kw: fake.priority_config(default))
            ),
            "vllm.ir": SimpleNamespace(set_default_torch_wrap=self.torch_wrap.append),
            "vllm.forward_context": SimpleNamespace(set_forward_context=None),
            "vllm.model_executor.layers.attention": SimpleNamespace(
                Attention=self.attention_layer, MLAAttention=type("MLAAttention", (), {})
            ),
            "vllm.v1.attention.backend": SimpleNamespace(CommonAttentionMetadata=lambda **kw: SimpleNamespace(**kw)),
            "vllm.model_executor.layers.quantization.fp8": SimpleNamespace(
                Fp8Config=lambda **kw: SimpleNamespace(**kw)
            ),
            "vllm.model_executor.layers.quantization.base_config": SimpleNamespace(
                QuantizeMethodBase=type("QuantizeMethodBase", (), {})
            ),
            "vllm.model_executor.models.deepseek_v2": SimpleNamespace(DeepseekV2MLAAttention=self.mla_module),
        }
        for name, module in modules.items():
            monkeypatch.setitem(sys.modules, name, module)
        monkeypatch.setattr(context, "_initialised", {"cpu"})  # no process group for the stand-in
        monkeypatch.setattr(Builder, "built", [])


@pytest.fixture
def fake(monkeypatch):
    vllm = FakeVllm()
    vllm.install(monkeypatch)
    return vllm


def acase(batch, isl=1, step=15, heads=2, kv=1):
    return AttentionCase(batch, isl, heads, kv, 64, 1, "bfloat16", "bfloat16", step, 0)


def mcase(batch, isl=1, step=15, gemm="bfloat16"):
    return MlaModuleCase(
        "deepseek-ai/DeepSeek-V3", "DeepseekV3ForCausalLM", "bfloat16", "bfloat16", gemm, 16, batch, isl, 1, step
    )


def test_serving_capture_sizes_follow_vllms_defaults():
    assert context.serving_capture_sizes() == SERVING_SIZES
    assert context.serving_capture_sizes(max_num_seqs=4) == (1, 2, 4, 8)  # largest min(2 x 4, 512)
    # few batched tokens: sizes up to them, and the token limit itself captured (config/vllm.py:1735-1739)
    assert context.serving_capture_sizes(max_num_batched_tokens=100) == (1, 2, 4, *range(8, 97, 8), 100)


def test_attention_builder_fits_a_batch_past_128(fake):
    attn.prepare(acase(2048), "FLASH_ATTN", "cpu", 1, context=False)  # raised in the builder with 128
    (builder,) = Builder.built
    assert builder.max_num_seqs == 2048
    assert builder.config.scheduler_config.max_num_batched_tokens >= 2048
    small = context.SERVING_MAX_NUM_SEQS
    attn.prepare(acase(4), "FLASH_ATTN", "cpu", 1, context=False)
    assert Builder.built[1].max_num_seqs == small  # serving's limit where the batch is within it


def test_mla_builder_fits_a_batch_past_128(fake):
    mla.prepare(mcase(2048), "FLASH_ATTN_MLA", "cpu", 1, context=False)
    (builder,) = Builder.built
    assert builder.max_num_seqs == 2048
    ctx = mcase(8, isl=4096, step=0)  # 32768 prompt tokens: more than serving's 8192 batched tokens
    mla.prepare(ctx, "FLASH_ATTN_MLA", "cpu", 1, context=True)
    assert Builder.built[1].config.scheduler_config.max_num_batched_tokens == 8 * 4096


@pytest.mark.parametrize("runner", ["attention", "mla"])
def test_decode_splits_capped_as_serving_caps_them(fake, runner):
    def decode(batch):
        if runner == "attention":
            return attn.prepare(acase(batch), "FLASH_ATTN", "cpu", 1, context=False)
        return mla.prepare(mcase(batch), "FLASH_ATTN_MLA", "cpu", 1, context=False)

    decode(512)
    decode(528)
    at_cap, past_cap = Builder.built
    assert at_cap.max_cudagraph_size == past_cap.max_cudagraph_size == 512
    assert at_cap.config.compilation_config.cudagraph_capture_sizes == list(SERVING_SIZES)
    # serving's builder: 32 splits within the largest capture size, FA3's heuristic beyond it
    assert at_cap.build(0, SimpleNamespace(num_reqs=512, num_actual_tokens=512)).max_num_splits == 32
    assert past_cap.build(0, SimpleNamespace(num_reqs=528, num_actual_tokens=528)).max_num_splits == 0


@pytest.mark.parametrize(
    ("runner", "gemm", "ops"),
    [("attention", "bfloat16", ["all"]), ("mla", "bfloat16", ["all"]), ("mla", "fp8_block", ["all", "+quant_fp8"])],
)
def test_layers_built_with_eager_serving_kernels(fake, runner, gemm, ops):
    if runner == "attention":
        attn.prepare(acase(2), "FLASH_ATTN", "cpu", 1, context=True)
    else:
        mla.prepare(mcase(2, gemm=gemm), "FLASH_ATTN_MLA", "cpu", 1, context=True)
    # custom ops on (CUDA rope, fp8 quant) and RMSNorm on vLLM's C kernel, set before the layer was built
    assert fake.layers == [(runner, ops, ["vllm_c", "native"])]
    assert fake.installed == {"rms_norm": ["vllm_c", "native"], "fused_add_rms_norm": ["vllm_c", "native"]}
    assert fake.torch_wrap == [True]  # the worker's torch-wrap setting from the config (worker_base.py:94-96)
