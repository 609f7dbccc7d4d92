"""The VllmConfig the vLLM attention and MLA runners build their layers and metadata builders under, against a
stand-in vllm that records what the real one reads: batch limits, CUDA-graph capture sizes, custom ops, the
RMSNorm IR-op priority, the MLA prefill query's dtype and the projections' quant config. The stand-in builders size,
cap and pick the query dtype as vLLM 0.24.0's do (cited at each)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from opcollect.backends.vllm import attention as attn
from opcollect.backends.vllm import context, mla
from opcollect.plans.attention import AttentionCase
from opcollect.plans.mla_module import MlaModuleCase
from opcollect.runtime.contract import KernelLimit

torch = pytest.importorskip("torch")

SERVING_SIZES = (1, 2, 4, *range(8, 256, 8), *range(256, 513, 16))  # config/vllm.py:1641-1645, largest 512


def round_up(x: int, to: int) -> int:
    return (x + to - 1) // to * to


class Builder:
    """FA3's builder (v1/attention/backends/flash_attn.py:370-393, 447-458; FLASH_ATTN_MLA's alike,
    mla/flashattn_mla.py:137-164, 208-243): a scheduler_metadata buffer sized from max_num_seqs and the largest
    capture size, the build asserting the batch fits, and 32 splits for a batch within the largest capture size."""

    built: list = []
    fake = None  # the FakeVllm installed

    def __init__(self, spec, names, config, device):
        self.config = config
        self.max_num_seqs = config.scheduler_config.max_num_seqs
        self.max_cudagraph_size = config.compilation_config.max_cudagraph_capture_size
        self.buffer = 1 + round_up(max(self.max_num_seqs, self.max_cudagraph_size or 0), 4) * 4
        # MLACommonMetadataBuilder.determine_prefill_query_data_type (mla_attention.py:1452-1493): fp8 with an fp8
        # cache, the config flag and backend_supports_prefill_query_quantization (mla_attention.py:1372-1397)
        fp8_cache = config.cache_config.cache_dtype.startswith("fp8")
        asked = config.attention_config.use_prefill_query_quantization
        quantized = fp8_cache and asked and Builder.fake.supports_prefill_query_quantization()
        if fp8_cache and not asked:
            Builder.fake.supports_prefill_query_quantization()  # its warning branch asks too (:1480-1483)
        self.q_data_type = torch.float8_e4m3fn if quantized else torch.bfloat16
        Builder.built.append(self)

    def build(self, common_prefix_len, common_attn_metadata):
        n = 1 + round_up(common_attn_metadata.num_reqs, 4) * 4
        assert n <= self.buffer, f"Scheduler metadata size {n} exceeds buffer size {self.buffer}"
        tokens = common_attn_metadata.num_actual_tokens
        cap = self.max_cudagraph_size
        splits = 32 if cap is not None and tokens <= cap else 0  # 0: FA3's own heuristic
        # requests longer than the decode threshold (1 here) are prefills (mla_attention.py:1638-1644)
        prefills = common_attn_metadata.num_reqs if getattr(common_attn_metadata, "max_query_len", 1) > 1 else 0
        return SimpleNamespace(max_num_splits=splits, num_prefills=prefills, prefill=None, decode=SimpleNamespace())


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
        self.capability = 100  # the device's compute capability, as major * 10 + minor
        self.modules: list = []  # DeepseekV2MLAAttention's keywords and the attention config it was built under
        self.cache_clears = 0
        self.cached_support: bool | None = None  # backend_supports_prefill_query_quantization's functools.cache

    def vllm_config(self, quant_config=None):
        # VllmConfig() at O2 without a model: custom ops "none" (+quant_fp8 for block weights, config/vllm.py:
        # 1115-1131), native IR ops, no capture sizes (config/vllm.py:1795-1797), max_num_seqs 128
        # (config/scheduler.py:44), AttentionConfig's defaults (config/attention.py:45-50)
        blocked = getattr(quant_config, "weight_block_size", None) is not None
        ops = ["+quant_fp8"] if blocked else []
        return SimpleNamespace(
            quant_config=quant_config,
            model_config=None,
            attention_config=SimpleNamespace(use_prefill_query_quantization=False, mla_prefill_backend=None),
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

    def prefill_backend(self, config) -> str:
        """get_mla_prefill_backend (prefill/selector.py:72-135): the pinned backend, else the first by priority
        (FLASH_ATTN on SM90 and SM100, selector.py:59-69)."""
        pinned = config.attention_config.mla_prefill_backend
        return "FLASH_ATTN" if pinned is None else pinned.name

    def supports_prefill_query_quantization(self) -> bool:
        # mla_attention.py:1372-1397: cached at its first call, for the config current then
        if self.cached_support is None:
            self.cached_support = self.capability // 10 == 10 and self.prefill_backend(self.current) in (
                "FLASHINFER",
                "TRTLLM_RAGGED",
                "TOKENSPEED_MLA",
            )
        return self.cached_support

    def clear_support_cache(self) -> None:
        self.cache_clears += 1
        self.cached_support = None

    def mla_module(self, *, vllm_config, prefix, **kw):
        self.snapshot("mla")
        self.modules.append((kw, SimpleNamespace(**vars(vllm_config.attention_config))))
        # DeepSeek's MLA backend by SM (cases/selection/vllm-0.24.0.yaml): FLASHINFER_MLA on the SM100 family
        backend = Backend("FLASHINFER_MLA" if self.capability // 10 == 10 else "FLASH_ATTN_MLA", 16)
        vllm_config.compilation_config.static_forward_context[f"{prefix}.attn"] = SimpleNamespace(
            attn_backend=backend,
            prefill_backend=Backend(self.prefill_backend(vllm_config), 16),  # mla_attention.py:493-502
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
            "vllm.model_executor.layers.quantization.modelopt": SimpleNamespace(
                ModelOptNvFp4Config=lambda **kw: SimpleNamespace(name="modelopt_fp4", **kw)
            ),
            "vllm.model_executor.layers.attention.mla_attention": SimpleNamespace(
                backend_supports_prefill_query_quantization=SimpleNamespace(cache_clear=self.clear_support_cache)
            ),
            "vllm.platforms": SimpleNamespace(
                current_platform=SimpleNamespace(
                    is_device_capability_family=lambda cap: fake.capability // 10 == cap // 10,
                    fp8_dtype=lambda: torch.float8_e4m3fn,
                )
            ),
            "vllm.v1.attention.backends.mla.prefill.registry": SimpleNamespace(
                MLAPrefillBackendEnum={
                    n: SimpleNamespace(name=n) for n in ("FLASH_ATTN", "FLASHINFER", "TRTLLM_RAGGED", "TOKENSPEED_MLA")
                }
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
        monkeypatch.setattr(Builder, "fake", self)


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


def fp8_prefill(batch=2, isl=4096):
    return mcase(batch, isl=isl, step=0)._replace(mla_dtype="fp8", kv_cache_dtype="fp8")


def test_fp8_prefill_query_built_as_served_at_sm100(fake):
    # a bf16 case first leaves a False in backend_supports_prefill_query_quantization's process-wide cache
    mla.prepare(mcase(2, isl=4096, step=0)._replace(kv_cache_dtype="fp8"), "FLASHINFER_MLA", "cpu", 1, context=True)
    assert Builder.built[0].q_data_type == torch.bfloat16 and fake.cached_support is False
    prepared = mla.prepare(fp8_prefill(), "FLASHINFER_MLA", "cpu", 1, context=True)
    (_, attention_config) = fake.modules[1]
    # set before the module picked its prefill backend (mla_attention.py:493)
    assert attention_config.use_prefill_query_quantization is True
    assert attention_config.mla_prefill_backend.name == "TRTLLM_RAGGED" == mla.FP8_PREFILL_BACKEND
    assert fake.cache_clears == 2  # cleared per case: this case's config decides, as in a fresh serving process
    assert Builder.built[1].q_data_type == torch.float8_e4m3fn
    assert prepared.kernel_source == "TRTLLM_RAGGED"  # read from the prefill backend vLLM built
    one_token = mla.prepare(fp8_prefill(isl=1), "FLASHINFER_MLA", "cpu", 1, context=True)
    assert one_token.kernel_source == "FLASHINFER_MLA"  # no prefill part: the MLA backend runs it


def test_fp8_prefill_query_refused_where_vllm_keeps_bf16(fake):
    fake.capability = 90  # outside the SM100 family vLLM never quantizes the prefill query (mla_attention.py:1385)
    with pytest.raises(KernelLimit, match="SM100"):
        mla.prepare(fp8_prefill(), "FLASH_ATTN_MLA", "cpu", 1, context=True)
    assert not fake.modules
    fake.capability = 100
    fake.prefill_backend = lambda config: "FLASH_ATTN"  # a vLLM that kept the bf16 query despite the flag
    with pytest.raises(KernelLimit, match="prefill query"):
        mla.prepare(fp8_prefill(), "FLASHINFER_MLA", "cpu", 1, context=True)


def test_nvfp4_projections_built_under_a_modelopt_nvfp4_config(fake):
    mla.prepare(mcase(2, gemm="nvfp4"), "FLASHINFER_MLA", "cpu", 1, context=False)
    ((kw, _),) = fake.modules
    quant = kw["quant_config"]
    assert quant.name == "modelopt_fp4" and quant.quant_method == "NVFP4"
    assert quant.is_checkpoint_nvfp4_serialized is True and quant.group_size == 16
    assert quant.exclude_modules == [] and quant.kv_cache_quant_algo is None
    assert Builder.built[0].config.quant_config is quant  # the config the linear kernels and KV method read
    assert fake.layers[0][1] == ["all"]  # no block weights: no +quant_fp8 (config/vllm.py:1115-1131)


def test_weights_filled_as_a_checkpoint_would_give_them(fake):
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.zeros(4, 8, dtype=torch.uint8), requires_grad=False)  # packed e2m1
    layer.weight_scale = torch.nn.Parameter(torch.zeros(4, 1, dtype=torch.float8_e4m3fn), requires_grad=False)
    layer.input_scale = torch.nn.Parameter(torch.zeros(1), requires_grad=False)
    layer.k_scale = torch.nn.Parameter(torch.tensor(-1.0), requires_grad=False)  # kv_cache.py:62-69
    mla.fill_and_process(layer, torch.bfloat16, "cpu")
    assert layer.weight.unique().numel() > 8  # random packed fp4 bytes, not the empty allocation
    # NVFP4's scales as the GEMM runner fills them: unit fp8 block and global scales, none flushed to zero
    assert bool((layer.weight_scale.float() == 1.0).all()) and float(layer.input_scale) == 1.0
    assert float(layer.k_scale) == -1.0  # "not in the checkpoint": the KV method sets 1.0
