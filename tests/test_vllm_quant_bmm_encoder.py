"""The vLLM runners of the quantize, mla_bmm and encoder_attention tables against a stand-in vllm that records what the
runners hand it: scaled_fp8_quant's arguments and branch, the kv_b_proj and absorb layer MLAAttention derives W_UK_T
and W_UV from, the BMM operands, MMEncoderAttention's construction and call. The stand-ins behave as vLLM 0.24.0's
code does at the cited lines; the real vllm needs a GPU. Where the pinned wheel is at hand (.cache/wheels), the
vLLM methods the MLA runner calls on its stand-in layer are read from it, so a field they need that the stand-in
lacks fails here rather than on the GPU."""

from __future__ import annotations

import ast
import enum
import math
import sys
import time
from collections import namedtuple
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import install_fakes

from opcollect.backends.vllm import context, encoder_attention, mla_bmm, quantize
from opcollect.runtime.contract import KernelLimit
from opcollect.runtime.harness import TimingConfig

torch = pytest.importorskip("torch")

# the case records the planner emits for these ops (issue 22's fixed names), as the runtime builds them
QuantizeCase = namedtuple("QuantizeCase", "m k quant_dtype")
MlaBmmCase = namedtuple("MlaBmmCase", "op_name bmm_dtype num_tokens num_heads")
EncoderAttentionCase = namedtuple("EncoderAttentionCase", "batch_size isl num_heads head_dim attn_dtype")
WHEELS = Path(__file__).resolve().parents[1] / ".cache" / "wheels"
FAST = TimingConfig(max_noise=0.05, min_samples=5, max_case_seconds=0.05, warmup_seconds=0.001)


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class FakeVllm:
    """The vllm modules the three runners import, recording what they are given."""

    def __init__(self):
        self.quant_calls: list[dict] = []
        self.cost = {"static": 20e-6, "dynamic": 80e-6}  # seconds a fake kernel takes: per-token does more work
        self.per_tensor_dynamic = False  # scaled_fp8_quant taking its dynamic per-tensor branch
        self.current = None
        self.linears: list = []
        self.processed: list = []  # layers whose quant method post-processed their weights
        self.absorbed: list = []  # (layer, act_dtype) MLAAttention.process_weights_after_loading was run on
        self.v_up: list = []  # (layer, x, out) of MLAAttention._v_up_proj
        self.aiter = {"fp8": False, "fp4": False}
        self.encoders: list = []
        self.encoder_calls: list[dict] = []
        self.fa_version = 3
        self.recomputed: list = []

    # --- vllm._custom_ops.scaled_fp8_quant (_custom_ops.py:1885-1951) ---
    def scaled_fp8_quant(
        self, input, scale=None, num_token_padding=None, scale_ub=None, use_per_token_if_dynamic=False, output=None,
        group_shape=None,
    ):  # fmt: skip
        self.quant_calls.append(
            dict(input=input, scale=scale, num_token_padding=num_token_padding, scale_ub=scale_ub,
                 use_per_token_if_dynamic=use_per_token_if_dynamic, output=output, group_shape=group_shape)
        )  # fmt: skip
        assert input.ndim == 2
        out = torch.empty(input.shape, dtype=torch.float8_e4m3fn)
        if scale is None:
            busy(self.cost["dynamic"])
            if use_per_token_if_dynamic and not self.per_tensor_dynamic:
                scale = input.abs().amax(dim=1, keepdim=True).float() / 448
            else:
                scale = input.abs().amax().float().reshape(1) / 448
        else:
            busy(self.cost["static"])
        out.copy_((input.float() / scale).clamp(-448, 448))
        return out, scale

    # --- vllm.config ---
    def vllm_config(self, quant_config=None):
        return SimpleNamespace(quant_config=quant_config, model_config=None)

    def set_current(self, config, check_compile=True):
        fake = self

        class Current:
            def __enter__(self):
                self.previous, fake.current = fake.current, config

            def __exit__(self, *exc):
                fake.current = self.previous

        return Current()

    # --- the kv_b_proj DeepseekV2MLAAttention builds (deepseek_v2.py:961-967) under block-fp8 Fp8Config ---
    def column_parallel_linear(self, input_size, output_size, bias=True, quant_config=None, prefix=""):
        fake = self
        layer = torch.nn.Module()
        block = quant_config.weight_block_size
        layer.register_parameter(
            "weight", torch.nn.Parameter(torch.empty(output_size, input_size, dtype=torch.float8_e4m3fn), False)
        )
        scales = torch.empty(output_size // block[0], input_size // block[1], dtype=torch.float32)
        layer.register_parameter("weight_scale_inv", torch.nn.Parameter(scales, False))

        class Method(self.QuantizeMethodBase):
            def process_weights_after_loading(self, module):
                fake.processed.append((module, module.weight.float().abs().max().item()))

        layer.quant_method = Method()
        self.linears.append(dict(input_size=input_size, output_size=output_size, bias=bias,
                                 quant_config=quant_config, prefix=prefix, layer=layer,
                                 default_dtype=torch.get_default_dtype(), config=self.current))  # fmt: skip
        return layer

    QuantizeMethodBase = type("QuantizeMethodBase", (), {})

    def mla_attention_class(self):
        fake = self

        class MLAAttention(torch.nn.Module):
            def process_weights_after_loading(layer, act_dtype):
                # the non-AITER branch (mla_attention.py:881-901, 958-962) and the default scales (:964-970)
                fake.absorbed.append((layer, act_dtype))
                w = layer.kv_b_proj.weight.to(act_dtype).T  # an unquantized kv_b_proj's [out, in] weight
                w = w.view(layer.kv_lora_rank, layer.num_heads, layer.qk_nope_head_dim + layer.v_head_dim)
                w_uk, w_uv = w.split([layer.qk_nope_head_dim, layer.v_head_dim], dim=-1)
                layer.W_UV = w_uv.transpose(0, 1)
                layer.W_UK_T = w_uk.permute(1, 2, 0)
                for name in ("_k_scale", "_v_scale", "_q_scale", "_prob_scale"):
                    getattr(layer, name).fill_(1.0)

            def _v_up_proj(layer, x, out):
                # mla_attention.py:1012-1034, the torch.bmm branch
                fake.v_up.append((layer, x, out))
                assert not layer.is_aiter_triton_fp8_bmm_enabled and not layer.is_aiter_triton_fp4_bmm_enabled
                x = x.view(-1, layer.num_heads, layer.kv_lora_rank).transpose(0, 1)
                out = out.view(-1, layer.num_heads, layer.v_head_dim)
                torch.bmm(x, layer.W_UV, out=out.transpose(0, 1))

        return MLAAttention

    # --- MMEncoderAttention (mm_encoder_attention.py:317-383), the CUDA ViT selector (platforms/cuda.py:493-546) ---
    def encoder_class(self):
        fake = self
        Backend = enum.Enum("AttentionBackendEnum", ["FLASH_ATTN", "TRITON_ATTN", "TORCH_SDPA", "FLASHINFER"])

        class MMEncoderAttention:
            def __init__(self, num_heads, head_size, scale=None, num_kv_heads=None, prefix=""):
                self.num_heads, self.head_size, self.scale, self.layer_name = num_heads, head_size, scale, prefix
                self.dtype = torch.get_default_dtype()
                mm = fake.current.model_config.multimodal_config
                override = mm.mm_encoder_attn_backend if mm is not None else None
                # FLASH_ATTN takes head sizes that are multiples of 8 in bf16/fp16 (flash_attn.py:173-180)
                fits = head_size % 8 == 0 and self.dtype in (torch.bfloat16, torch.float16)
                self.attn_backend = override or (Backend.FLASH_ATTN if fits else Backend.TORCH_SDPA)
                self._fa_version = fake.fa_version if self.attn_backend == Backend.FLASH_ATTN else None
                self.processed = None
                fake.encoders.append(self)

            def process_weights_after_loading(self, act_dtype):
                self.processed = act_dtype

            @classmethod
            def compute_max_seqlen(cls, attn_backend, cu_seqlens):
                if attn_backend in (Backend.FLASH_ATTN, Backend.TRITON_ATTN, Backend.FLASHINFER):
                    return int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
                return 0

            @classmethod
            def maybe_compute_seq_lens(cls, attn_backend, cu_seqlens, device):
                return None if attn_backend != Backend.FLASHINFER else torch.tensor(cu_seqlens[1:] - cu_seqlens[:-1])

            @classmethod
            def maybe_recompute_cu_seqlens(cls, attn_backend, cu_seqlens, hidden_size, tp_size, device, **kw):
                fake.recomputed.append((attn_backend, cu_seqlens.tolist(), hidden_size, tp_size))
                return torch.from_numpy(cu_seqlens).to(device)

            def __call__(self, query, key, value, cu_seqlens=None, max_seqlen=None, sequence_lengths=None):
                fake.encoder_calls.append(dict(query=query, key=key, value=value, cu_seqlens=cu_seqlens,
                                               max_seqlen=max_seqlen, sequence_lengths=sequence_lengths,
                                               config=fake.current))  # fmt: skip
                return torch.empty_like(query)

        return MMEncoderAttention, Backend

    def install(self, monkeypatch) -> None:
        fake = self
        MultiModalConfig = type(
            "MultiModalConfig", (), {"mm_encoder_attn_backend": None, "mm_encoder_attn_dtype": None}
        )
        self.MLAAttention = self.mla_attention_class()
        self.MMEncoderAttention, self.Backend = self.encoder_class()
        install_fakes(
            monkeypatch,
            {
                "vllm._custom_ops": {"scaled_fp8_quant": self.scaled_fp8_quant},
                "vllm.model_executor.layers.quantization.utils.quant_utils": {
                    # quant_utils.py:59-70
                    "GroupShape": SimpleNamespace(
                        PER_TENSOR=SimpleNamespace(row=-1, col=-1), PER_TOKEN=SimpleNamespace(row=1, col=-1)
                    )
                },
                "vllm.config": {
                    "VllmConfig": self.vllm_config,
                    "set_current_vllm_config": self.set_current,
                    "MultiModalConfig": MultiModalConfig,
                },
                "vllm._aiter_ops": {
                    "rocm_aiter_ops": SimpleNamespace(
                        is_fp8bmm_enabled=lambda: fake.aiter["fp8"], is_fp4bmm_enabled=lambda: fake.aiter["fp4"]
                    )
                },
                "vllm.model_executor.layers.attention": {"MLAAttention": self.MLAAttention},
                "vllm.model_executor.layers.linear": {"ColumnParallelLinear": self.column_parallel_linear},
                "vllm.model_executor.layers.quantization.fp8": {"Fp8Config": lambda **kw: SimpleNamespace(**kw)},
                "vllm.model_executor.layers.quantization.base_config": {"QuantizeMethodBase": self.QuantizeMethodBase},
                "vllm.model_executor.layers.attention.mm_encoder_attention": {
                    "MMEncoderAttention": self.MMEncoderAttention
                },
            },
        )
        monkeypatch.setattr(context, "_initialised", {"cpu"})  # no process group for the stand-in


@pytest.fixture
def fake(monkeypatch):
    vllm = FakeVllm()
    vllm.install(monkeypatch)
    return vllm


# ---------------------------------------------------------------- quantize


def test_scale_matrix_calls_the_static_per_tensor_quant_serving_calls(fake):
    prepared = quantize.prepare_static(QuantizeCase(48, 256, "fp8"), "static_scaled_fp8_quant", "cpu", 2)
    assert prepared.kernel_source == "static_scaled_fp8_quant"
    prepared.call()
    prepared.call()
    first, *timed = fake.quant_calls
    assert len(timed) == 2 and timed[0]["input"] is not timed[1]["input"]  # the two input sets rotate
    for call in fake.quant_calls:
        x, scale = call["input"], call["scale"]
        assert tuple(x.shape) == (48, 256) and x.dtype == torch.bfloat16
        assert tuple(scale.shape) == (1,) and scale.dtype == torch.float32 and scale.item() == 1.0
        # QuantFP8(static=True, PER_TENSOR).forward_cuda's arguments (input_quant_fp8.py:124-134)
        assert call["group_shape"] == (-1, -1) and call["use_per_token_if_dynamic"] is False
        assert call["num_token_padding"] is None and call["scale_ub"] is None and call["output"] is None
    assert timed[0]["scale"] is timed[1]["scale"]  # one checkpoint scale


def test_the_dynamic_quant_is_per_token_and_reported_from_the_branch_that_ran(fake):
    prepared = quantize.prepare_dynamic(QuantizeCase(32, 128, "fp8"), "x", "cpu", 1)
    assert prepared.kernel_source == "dynamic_per_token_scaled_fp8_quant"
    (call,) = fake.quant_calls
    assert call["scale"] is None and call["use_per_token_if_dynamic"] is True and call["group_shape"] is None
    # a vLLM that took the per-tensor branch returns a (1,) scale: the runner names that kernel, not the planned one
    fake.per_tensor_dynamic = True
    assert (
        quantize.prepare_dynamic(QuantizeCase(32, 128, "fp8"), "x", "cpu", 1).kernel_source
        == "dynamic_scaled_fp8_quant"
    )


def test_compute_scale_times_both_quants_in_the_row_and_reports_their_difference(fake, monkeypatch):
    measured = []
    real = quantize.timing.measure_cases

    def spy(runner, dispatch, cases, device, config):
        out = real(runner, dispatch, cases, device, config)
        measured.append((runner, out[0]))
        return out

    monkeypatch.setattr(quantize.timing, "measure_cases", spy)
    cases = [QuantizeCase(16, 64, "fp8"), QuantizeCase(8, 128, "fp8")]
    results = quantize.measure_compute_scale(cases, "cpu", FAST)
    assert len(results) == 2 and len(measured) == 4
    for n, result in enumerate(results):
        (dyn_runner, dyn), (st_runner, st) = measured[2 * n : 2 * n + 2]
        assert dyn_runner is quantize.DYNAMIC_RUNNER and st_runner is quantize.STATIC_RUNNER
        assert result.kernel_source == "dynamic_per_token_scaled_fp8_quant_minus_static_scaled_fp8_quant"
        assert result.stats.latency == pytest.approx(dyn.stats.latency - st.stats.latency)
        assert 0 <= result.stats.latency_p25 <= result.stats.latency <= result.stats.latency_p75
        assert result.stats.timing == "cpu"
    shapes = {(tuple(c["input"].shape), c["scale"] is None) for c in fake.quant_calls}
    assert shapes == {((16, 64), True), ((16, 64), False), ((8, 128), True), ((8, 128), False)}
    # a dynamic quant no slower than the static one: the reference's max(0, dynamic - static), a row of latency 0
    # whose quantiles stay in order and whose noise is finite (relative to the dynamic quant's median)
    fake.cost = {"static": 80e-6, "dynamic": 20e-6}
    (row,) = quantize.measure_compute_scale([QuantizeCase(16, 64, "fp8")], "cpu", FAST)
    assert row.stats.latency == 0.0 and 0 <= row.stats.latency_p25 <= row.stats.latency <= row.stats.latency_p75
    assert math.isfinite(row.stats.noise) and row.stats.noise >= 0


def test_quantize_footprints_and_refusals():
    case = QuantizeCase(1000, 4096, "fp8")
    assert quantize.static_footprint(case) == 1000 * 4096 * 3 + 4  # bf16 in, fp8 out, one scale
    assert quantize.dynamic_footprint(case) == 1000 * 4096 * 3 + 1000 * 4
    assert quantize.compute_scale_footprint(case) == quantize.dynamic_footprint(case)
    with pytest.raises(KernelLimit):
        quantize.prepare_static(QuantizeCase(8, 8, "int8"), "x", "cpu", 1)
    with pytest.raises(KernelLimit):
        quantize.measure_compute_scale([QuantizeCase(8, 8, "fp4")], "cpu", FAST)
    assert "vllm" not in sys.modules


# ---------------------------------------------------------------- mla_bmm


@pytest.fixture
def bmm_spy(monkeypatch):
    calls = []
    real = torch.bmm

    def spy(a, b, *, out=None):
        calls.append((a, b, out))
        return real(a, b, out=out)

    monkeypatch.setattr(torch, "bmm", spy)
    return calls


def test_mla_gen_pre_multiplies_the_query_by_vllms_w_uk_t(fake, bmm_spy):
    n, t = 4, 3
    prepared = mla_bmm.prepare(MlaBmmCase("mla_gen_pre", "bfloat16", t, n), "vllm_torch_bmm", "cpu", 2)
    assert prepared.kernel_source == "vllm_torch_bmm"
    assert torch.get_default_dtype() == torch.float32  # restored
    # kv_b_proj as DeepseekV2MLAAttention builds it, under DeepSeek-V3's block-fp8 checkpoint config
    assert len(fake.linears) == 2
    for built in fake.linears:
        assert (built["input_size"], built["output_size"], built["bias"]) == (512, n * 256, False)
        assert built["quant_config"].weight_block_size == [128, 128]
        assert built["quant_config"].is_checkpoint_fp8_serialized is True
        assert built["default_dtype"] == torch.bfloat16 and built["config"].quant_config is built["quant_config"]
    assert [m for m, _ in fake.processed] == [b["layer"] for b in fake.linears]
    assert all(peak > 0 for _, peak in fake.processed)  # filled before the quant method's post-processing
    layers = [layer for layer, _ in fake.absorbed]
    assert [dtype for _, dtype in fake.absorbed] == [torch.bfloat16] * 2
    for layer in layers:
        assert (layer.num_heads, layer.kv_lora_rank, layer.qk_nope_head_dim, layer.v_head_dim) == (n, 512, 128, 128)
        assert layer.kv_b_proj is None  # released once W_UK_T and W_UV are derived
    prepared.call()
    prepared.call()
    assert len(bmm_spy) == 2
    used = []
    for q_nope, w, out in bmm_spy:
        # forward_impl's operands (mla_attention.py:743-789): the no-rope part of a [t, n, 192] query, head-major
        assert tuple(q_nope.shape) == (n, t, 128) and q_nope.stride() == (192, n * 192, 1)
        assert q_nope.dtype == torch.bfloat16
        assert tuple(out.shape) == (n, t, 512) and out.dtype == torch.bfloat16
        used.append(next(i for i, layer in enumerate(layers) if layer.W_UK_T is w))
    assert sorted(used) == [0, 1]  # each copy's own W_UK_T, as vLLM derived it


def test_absorb_pre_is_the_head_wise_product():
    q = torch.randn(5, 3, 192, dtype=torch.bfloat16)
    w = torch.randn(3, 128, 512, dtype=torch.bfloat16)
    got = mla_bmm.absorb_pre(q, w)
    assert tuple(got.shape) == (5, 3, 512)
    want = torch.einsum("thp,hpl->thl", q[..., :128].float(), w.float())
    assert torch.allclose(got.float(), want, rtol=2e-2, atol=2e-1)


def test_mla_gen_post_runs_vllms_v_up_proj(fake, bmm_spy):
    n, t = 2, 5
    prepared = mla_bmm.prepare(MlaBmmCase("mla_gen_post", "bfloat16", t, n), "vllm_torch_bmm", "cpu", 1)
    prepared.call()
    (layer, x, out), *_ = fake.v_up
    assert layer is fake.absorbed[0][0]
    assert tuple(x.shape) == (t, n, 512) and x.dtype == torch.bfloat16
    assert tuple(out.shape) == (t, n * 128) and out.dtype == torch.bfloat16
    ((a, w, written),) = bmm_spy
    assert w is layer.W_UV and tuple(a.shape) == (n, t, 512)
    want = torch.einsum("thl,hlv->thv", x.float(), layer.W_UV.float()).reshape(t, n * 128)
    assert torch.allclose(out.float(), want, rtol=2e-2, atol=5e-1)


def test_mla_bmm_refuses_what_vllm_does_not_run_on_cuda(fake):
    with pytest.raises(KernelLimit, match="bf16"):
        mla_bmm.prepare(MlaBmmCase("mla_gen_pre", "fp8", 4, 8), "x", "cpu", 1)
    with pytest.raises(KernelLimit):
        mla_bmm.prepare(MlaBmmCase("mla_ctx_pre", "bfloat16", 4, 8), "x", "cpu", 1)
    fake.aiter["fp8"] = True
    with pytest.raises(KernelLimit, match="AITER"):
        mla_bmm.prepare(MlaBmmCase("mla_gen_pre", "bfloat16", 4, 8), "x", "cpu", 1)
    assert fake.linears == []


def test_mla_bmm_footprint():
    weights = 512 * 16 * 256 * 2
    assert (
        mla_bmm.footprint(MlaBmmCase("mla_gen_pre", "bfloat16", 10, 16))
        == weights + (10 * 16 * 192 + 16 * 10 * 512) * 2
    )
    assert (
        mla_bmm.footprint(MlaBmmCase("mla_gen_post", "bfloat16", 10, 16))
        == weights + (10 * 16 * 512 + 10 * 16 * 128) * 2
    )


def _method_reads(tree: ast.Module, cls: str, method: str, name: str = "self") -> set[str]:
    """Attributes ``method`` of ``cls`` reads off ``name`` before (or without) assigning them."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == method:
                    return _reads(item, name)
    raise AssertionError(f"{cls}.{method} is gone")


def _reads(func: ast.FunctionDef, name: str) -> set[str]:
    """Reads on the CUDA path: an ``if self.is_aiter_...`` branch (ROCm, refused by the runner) is left out."""
    loads, stores = set(), set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "is_aiter_triton" in ast.unparse(node.test):
            loads.update(a.attr for a in ast.walk(node.test) if isinstance(a, ast.Attribute))
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == name:
            (stores if isinstance(node.ctx, ast.Store) else loads).add(node.attr)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(func)
    return loads - stores


def test_the_pinned_wheels_mla_methods_read_only_what_the_stand_in_holds():
    found = sorted(WHEELS.glob("vllm-0.24.0-*.whl"))
    if not found:
        pytest.skip("no pinned vLLM wheel in .cache/wheels; `nox -s contract-vllm` downloads it (.ci/run does)")
    from opcollect.backends.symbols import Release

    release = Release(found[-1])
    mla_src = ast.parse(release.files["vllm/model_executor/layers/attention/mla_attention.py"])
    held = set(mla_bmm.AbsorbLayer.__dataclass_fields__)
    for method in ("process_weights_after_loading", "_v_up_proj"):
        needed = _method_reads(mla_src, "MLAAttention", method)
        assert needed <= held | {"W_UK_T", "W_UV"}, (method, needed - held)
    attn_src = ast.parse(release.files["vllm/model_executor/layers/attention/attention.py"])
    for node in attn_src.body:  # set_default_quant_scales(self, register_buffer=False), which the method ends with
        if isinstance(node, ast.FunctionDef) and node.name == "set_default_quant_scales":
            fills = {a for a in _reads(node, "layer") if a.startswith("_")}
            assert fills == set(mla_bmm.SCALE_NAMES), fills
    enc_src = ast.parse(release.files["vllm/model_executor/layers/attention/mm_encoder_attention.py"])
    assert {"attn_backend", "_fa_version"} <= {
        n.attr for n in ast.walk(enc_src) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
    }


# ---------------------------------------------------------------- encoder_attention


def test_encoder_attention_builds_serving_layer_and_calls_it_as_qwen3_vl_does(fake):
    b, s, h, d = 3, 10, 4, 72
    prepared = encoder_attention.prepare(EncoderAttentionCase(b, s, h, d, "bfloat16"), "x", "cpu", 2)
    assert prepared.kernel_source == "vllm_vit_flash_attn_fa3"
    (layer,) = fake.encoders
    assert (layer.num_heads, layer.head_size, layer.scale) == (h, d, d**-0.5)
    assert layer.dtype == torch.bfloat16 and layer.processed == torch.bfloat16
    assert torch.get_default_dtype() == torch.float32
    assert fake.recomputed == [(layer.attn_backend, [0, 10, 20, 30], h * d, 1)]
    prepared.call()
    prepared.call()
    first, second = fake.encoder_calls
    assert first["query"] is not second["query"]  # two input sets
    for call in fake.encoder_calls:
        q, k, v = call["query"], call["key"], call["value"]
        for t in (q, k, v):
            assert tuple(t.shape) == (1, b * s, h, d) and t.dtype == torch.bfloat16
        assert q.is_contiguous() and k.is_contiguous()
        assert v.stride(1) == 3 * h * d and v.stride(2) == d  # a view of the fused qkv projection
        assert call["cu_seqlens"].tolist() == [0, 10, 20, 30]
        assert call["max_seqlen"].device.type == "cpu" and call["max_seqlen"].item() == s
        assert call["sequence_lengths"] is None and call["config"] is not None


def test_encoder_attention_reports_the_backend_vllm_chose(fake):
    fake.fa_version = 2
    assert encoder_attention.prepare(EncoderAttentionCase(1, 16, 2, 64, "bfloat16"), "x", "cpu", 1).kernel_source == (
        "vllm_vit_flash_attn_fa2"
    )
    # no FLASH_ATTN for a head size that is no multiple of 8: vLLM falls to torch SDPA, and the row says so
    sdpa = encoder_attention.prepare(EncoderAttentionCase(1, 16, 2, 36, "bfloat16"), "x", "cpu", 1)
    assert sdpa.kernel_source == "vllm_vit_torch_sdpa"


def test_encoder_attention_footprint_and_refusal():
    case = EncoderAttentionCase(2, 100, 16, 72, "bfloat16")
    assert encoder_attention.footprint(case) == 200 * 16 * 72 * 2 * 6 + 3 * 4
    with pytest.raises(KernelLimit):
        encoder_attention.prepare(case._replace(attn_dtype="float16"), "x", "cpu", 1)
    assert "vllm" not in sys.modules
