"""The SGLang runners of issue 22 (backends/sglang/quantize.py, mla_bmm.py, encoder_attention.py) against a fake
sglang that records what it is given: which SGLang function each timed call runs, with which shapes, strides, dtypes
and arguments, and the kernel_source the runner reports. The real sglang needs a GPU for these paths; its pinned
wheels, where .cache/wheels holds them, check every symbol and keyword the runners use (the contract and the
in-image preflight)."""

from __future__ import annotations

import ast
import sys
import zipfile
from collections import namedtuple
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import ROOT, install_fakes

import opcollect.backends.sglang as sglang_backend
from opcollect.backends.sglang import context, encoder_attention, mla_bmm, quantize
from opcollect.runtime import timing
from opcollect.runtime.contract import KernelLimit, Prepared
from opcollect.runtime.harness import Stats, TimingConfig

torch = pytest.importorskip("torch")

# the case records the runtime hands the runners (runtime/planfile.py case_type: namedtuples of the plan's fields)
QuantizeCase = namedtuple("QuantizeCase", "m k quant_dtype")
MlaBmmCase = namedtuple("MlaBmmCase", "op_name bmm_dtype num_tokens num_heads")
EncoderCase = namedtuple("EncoderCase", "batch_size isl num_heads head_dim attn_dtype")
WHEELS = ROOT / ".cache" / "wheels"
MODULES = (quantize, mla_bmm, encoder_attention)


@pytest.fixture
def calls(monkeypatch):
    """The record of SGLang calls; SGLang's context is a no-op that records its server args."""
    record: list[tuple] = []

    @contextmanager
    def no_context(device, **server_args):
        record.append(("context", server_args))
        yield server_args

    monkeypatch.setattr(context, "sglang_context", no_context)
    return record


def kernel_calls(record, name):
    return [entry[1:] for entry in record if entry[0] == name]


# ---------------------------------------------------------------- quantize: compute_scale and scale_matrix


@pytest.fixture
def fake_quant(monkeypatch, calls):
    flags = {"cutlass": True, "flashinfer_bmm": False, "min_capability": 89}

    def sglang_per_token_quant_fp8(x):
        calls.append(("per_token", x))
        return torch.empty_like(x, dtype=torch.float8_e4m3fn), torch.empty(x.shape[0], 1)

    def static_quant_fp8(x, x_s, repeat_scale=False):
        calls.append(("static", x, x_s, repeat_scale))
        return torch.empty_like(x, dtype=torch.float8_e4m3fn), x_s

    class ModelOptFp8Config:
        def __init__(self, is_checkpoint_fp8_serialized=False, kv_cache_quant_method=None, exclude_modules=None):
            calls.append(("config", is_checkpoint_fp8_serialized))

        @classmethod
        def get_min_capability(cls):
            return flags["min_capability"]

    class ModelOptFp8LinearMethod:
        def __init__(self, quant_config):
            assert isinstance(quant_config, ModelOptFp8Config)
            self.cutlass_fp8_supported = flags["cutlass"]
            self.enable_flashinfer_bmm = flags["flashinfer_bmm"]

    install_fakes(monkeypatch, {
        "sglang.srt.layers.quantization.fp8_kernel": {"sglang_per_token_quant_fp8": sglang_per_token_quant_fp8,
                                                      "static_quant_fp8": static_quant_fp8},
        "sglang.srt.layers.quantization.modelopt_quant": {"ModelOptFp8Config": ModelOptFp8Config,
                                                          "ModelOptFp8LinearMethod": ModelOptFp8LinearMethod},
    })  # fmt: skip
    monkeypatch.setattr(quantize, "device_sm", lambda device: "90")
    return flags


def test_scale_matrix_runs_sglangs_static_quant_with_the_modelopt_scale(fake_quant, calls):
    case = QuantizeCase(6, 256, "fp8")
    prepared = sglang_backend.RUNNERS.find("scale_matrix", "sglang").prepare(case, "sglang", "cpu", 2)
    assert prepared.kernel_source == "sglang" and ("config", True) in calls
    calls.clear()
    prepared.call(), prepared.call(), prepared.call()
    static = kernel_calls(calls, "static")
    assert len(static) == 3 and not kernel_calls(calls, "per_token")
    for x, scale, repeat in static:
        assert tuple(x.shape) == (6, 256) and x.dtype == torch.bfloat16 and x.is_contiguous()
        # ModelOptFp8LinearMethod leaves input_scale the 0-dim maximum (modelopt_quant.py:582)
        assert scale.dim() == 0 and scale.dtype == torch.float32 and scale.item() > 0
        assert repeat is True  # apply_fp8_linear with cutlass_fp8_supported (fp8_utils.py:1596-1601)
    xs = [x for x, _, _ in static]
    assert xs[0] is not xs[1] and xs[0] is xs[2]  # the two copies in turn


@pytest.mark.parametrize(("cutlass", "flashinfer_bmm", "repeat"), [(False, False, False), (True, True, False)])
def test_static_repeat_scale_is_read_from_the_linear_method(fake_quant, calls, cutlass, flashinfer_bmm, repeat):
    fake_quant.update(cutlass=cutlass, flashinfer_bmm=flashinfer_bmm)
    quantize.prepare(QuantizeCase(3, 128, "fp8"), "sglang", "cpu", 1, dynamic=False).call()
    ((_, _, got),) = kernel_calls(calls, "static")
    assert got is repeat


def test_the_dynamic_quant_is_sglangs_per_token_kernel(fake_quant, calls):
    prepared = quantize.prepare(QuantizeCase(5, 64, "fp8"), "sglang", "cpu", 1, dynamic=True)
    prepared.call()
    ((x,),) = kernel_calls(calls, "per_token")
    assert tuple(x.shape) == (5, 64) and x.dtype == torch.bfloat16 and not kernel_calls(calls, "static")
    assert prepared.kernel_source == "sglang"


def test_quantize_refuses_other_dtypes_and_devices(fake_quant, monkeypatch):
    with pytest.raises(KernelLimit, match="fp8 only"):
        quantize.prepare(QuantizeCase(5, 64, "int8"), "sglang", "cpu", 1, dynamic=False)
    for sm in ("86", "cpu"):  # ModelOptFp8Config.get_min_capability: 89, on CUDA
        monkeypatch.setattr(quantize, "device_sm", lambda device, sm=sm: sm)
        with pytest.raises(KernelLimit, match="SM >= 89"):
            quantize.prepare(QuantizeCase(5, 64, "fp8"), "sglang", "cpu", 1, dynamic=True)


def stats(latency, p25, p75, **extra):
    fields = dict(samples=20, noise=(p75 - p25) / latency, timing="graph", calls_per_sample=8, sampled_seconds=0.5,
                  warmup_seconds=0.1, l2="rotate:4", sm_clock_mhz=1980.0)  # fmt: skip
    return Stats(latency, p25, p75, **(fields | extra))


def test_compute_scale_times_dynamic_then_static_and_reports_the_difference(fake_quant, calls, monkeypatch):
    """Each quant is a case the harness times on its own; the row is their difference. The fake harness runs the
    prepared call once and times it by the kernel it ran: per-token 5 ms, static 3 ms."""
    order = []
    latencies = {"per_token": 5.0, "static": 3.0}

    def fake_measure(prepare, footprint, device, config, first_case=False):
        prepared: Prepared = prepare(1)
        before = len(calls)
        prepared.call()
        (kind, *_) = calls[before]
        order.append(kind)
        latency = latencies[kind]
        return stats(latency, latency - 0.1, latency + 0.1), prepared.kernel_source

    monkeypatch.setattr(timing, "measure", fake_measure)
    runner = sglang_backend.RUNNERS.find("compute_scale", "sglang")
    cases = [QuantizeCase(4, 128, "fp8"), QuantizeCase(8, 128, "fp8")]
    measured = runner.measure_row(cases, "cpu", TimingConfig())
    assert order == ["per_token", "static", "per_token", "static"]
    assert [m.kernel_source for m in measured] == ["sglang", "sglang"]
    assert [m.stats.latency for m in measured] == [pytest.approx(2.0)] * 2
    # SGLang's fused static quant slower than the per-token one: the reference's max(0, dynamic - static), a row of
    # latency 0 with its quantiles in order and a finite noise, not a floor and not a failure
    latencies["static"] = 5.05  # IQR 4.95-5.15 against the per-token 4.9-5.1
    (zero,) = runner.measure_row([QuantizeCase(4, 128, "fp8")], "cpu", TimingConfig())
    assert (zero.stats.latency, zero.stats.latency_p25) == (0.0, 0.0) and zero.kernel_source == "sglang"
    assert zero.stats.latency_p75 == pytest.approx(5.1 - 4.95) and zero.stats.noise == pytest.approx(0.15 / 5.0)
    with pytest.raises(KernelLimit):
        runner.measure_row([QuantizeCase(4, 128, "nvfp4")], "cpu", TimingConfig())


def test_quantize_footprint_is_the_bytes_of_its_tensors():
    m, k = 7, 96
    tensors = (torch.empty(m, k, dtype=torch.bfloat16), torch.empty(m, k, dtype=torch.float8_e4m3fn),
               torch.empty(m, 1), torch.empty(()))  # fmt: skip
    assert quantize.footprint(QuantizeCase(m, k, "fp8")) == sum(t.nbytes for t in tensors)


# ---------------------------------------------------------------- mla_bmm


@pytest.fixture
def fake_bmm(monkeypatch, calls):
    flags = {"cublas_ge_129": True}

    def per_tensor_quant_mla_fp8(x, x_s_out, eps=1e-12):
        calls.append(("quant", x, x_s_out, x_s_out.clone()))
        return x.to(torch.float8_e4m3fn), x_s_out

    def bmm_fp8(A, B, A_scale, B_scale, dtype, out=None):
        calls.append(("bmm_fp8", A, B, A_scale, B_scale, dtype))
        return torch.empty((A.shape[0], A.shape[1], B.shape[2]), dtype=dtype)

    real_bmm = torch.bmm

    def spy_bmm(a, b, **kwargs):
        calls.append(("torch.bmm", a, b, kwargs))
        return real_bmm(a, b, **kwargs)

    install_fakes(monkeypatch, {
        "sglang.srt.layers.quantization.fp8_kernel": {"per_tensor_quant_mla_fp8": per_tensor_quant_mla_fp8},
        "sglang.srt.models.deepseek_common.attention_forward_methods.forward_mla": {"bmm_fp8": bmm_fp8},
        "sglang.srt.models.deepseek_common.utils": {"_is_cublas_ge_129": True},
    })  # fmt: skip
    monkeypatch.setattr(torch, "bmm", spy_bmm)
    monkeypatch.setattr(mla_bmm, "device_sm", lambda device: "90")
    return flags


def bmm_case(op="mla_gen_pre", dtype="bfloat16", tokens=3, heads=4):
    return MlaBmmCase(op, dtype, tokens, heads)


def test_bf16_pre_is_torch_bmm_on_the_strided_q_nope(fake_bmm, calls):
    prepared = sglang_backend.RUNNERS.find("mla_bmm", "sglang_torch_bmm").prepare(bmm_case(), "x", "cpu", 2)
    assert prepared.kernel_source == "sglang_torch_bmm"
    prepared.call()
    ((x, w, kwargs),) = kernel_calls(calls, "torch.bmm")
    # q_nope.transpose(0, 1): the first 128 of 192 q features per head (forward_mla.py:278, 305, 397)
    assert tuple(x.shape) == (4, 3, 128) and x.stride() == (192, 4 * 192, 1) and x.dtype == torch.bfloat16
    # W_UK in the loader's column-major layout (deepseek_weight_loader.py:584-587)
    assert tuple(w.shape) == (4, 128, 512) and w.stride() == (512 * 128, 1, 128) and w.dtype == torch.bfloat16
    assert kwargs == {} and not kernel_calls(calls, "bmm_fp8")


def test_bf16_post_writes_into_the_o_proj_input(fake_bmm, calls):
    prepared = mla_bmm.prepare(bmm_case("mla_gen_post"), "x", "cpu", 1)
    prepared.call()
    ((x, w, kwargs),) = kernel_calls(calls, "torch.bmm")
    assert tuple(x.shape) == (4, 3, 512) and x.stride() == (512, 4 * 512, 1)  # attn_output.transpose(0, 1)
    assert tuple(w.shape) == (4, 512, 128) and w.stride() == (512 * 128, 1, 512)  # W_UV (loader :588)
    out = kwargs["out"]  # the (tokens, h * 128) buffer viewed (h, tokens, 128) (forward_mla.py:728-740)
    assert tuple(out.shape) == (4, 3, 128) and out.stride() == (128, 4 * 128, 1) and out.dtype == torch.bfloat16
    assert prepared.kernel_source == "sglang_torch_bmm"


@pytest.mark.parametrize("op", ["mla_gen_pre", "mla_gen_post"])
@pytest.mark.parametrize("fresh_zero", [True, False])
def test_fp8_is_per_tensor_quant_then_sglangs_bmm_fp8(fake_bmm, calls, monkeypatch, op, fresh_zero):
    monkeypatch.setattr(sys.modules["sglang.srt.models.deepseek_common.utils"], "_is_cublas_ge_129", fresh_zero)
    prepared = mla_bmm.prepare(bmm_case(op, "fp8"), "x", "cpu", 1)
    assert prepared.kernel_source == "sglang_sgl_kernel_bmm_fp8"
    prepared.call(), prepared.call()
    quants, bmms = kernel_calls(calls, "quant"), kernel_calls(calls, "bmm_fp8")
    assert len(quants) == len(bmms) == 2 and not kernel_calls(calls, "torch.bmm")
    k, n = (128, 512) if op == "mla_gen_pre" else (512, 128)
    for (x, zero, zero_then), (a, w, a_scale, w_scale, dtype) in zip(quants, bmms):
        assert tuple(x.shape) == (4, 3, k) and x.dtype == torch.bfloat16  # (h, tokens, k): x.transpose(0, 1)
        assert tuple(zero.shape) == (1,) and zero.dtype == torch.float32 and not zero_then.any()
        assert a.dtype == torch.float8_e4m3fn and a_scale is zero
        assert tuple(w.shape) == (4, k, n) and w.dtype == torch.float8_e4m3fn and w.stride()[1] == 1
        assert tuple(w_scale.shape) == (1,) and w_scale.dtype == torch.float32 and dtype == torch.bfloat16
    # cuBLAS >= 12.9: a fresh torch.zeros per call; else the BumpAllocator's pre-zeroed slot (forward_mla.py:385-391)
    assert (quants[0][1] is quants[1][1]) is not fresh_zero


def test_mla_bmm_refuses_before_importing_sglang(monkeypatch):
    monkeypatch.setattr(mla_bmm, "device_sm", lambda device: "86")
    for bad in (bmm_case("mla_gen_pre", "fp8"), bmm_case("mla_ctx_pre"), bmm_case(dtype="float32")):
        with pytest.raises(KernelLimit):
            mla_bmm.prepare(bad, "x", "cpu", 1)
    assert "sglang" not in sys.modules and "sgl_kernel" not in sys.modules


def test_mla_bmm_footprint_is_the_bytes_of_its_tensors():
    t, h = 5, 8

    def nbytes(*shapes_dtypes):
        return sum(torch.empty(s, dtype=d).nbytes for s, d in shapes_dtypes)

    bf16, fp8, f32 = torch.bfloat16, torch.float8_e4m3fn, torch.float32
    pre = nbytes(((t, h, 192), bf16), ((h, 128, 512), bf16), ((h, t, 512), bf16))
    assert mla_bmm.footprint(bmm_case("mla_gen_pre", "bfloat16", t, h)) == pre
    post_fp8 = nbytes(((t, h, 512), bf16), ((h, 512, 128), fp8), ((h, t, 128), bf16), ((h, t, 512), fp8),
                      ((1,), f32), ((1,), f32), ((t, h * 128), bf16))  # fmt: skip
    assert mla_bmm.footprint(bmm_case("mla_gen_post", "fp8", t, h)) == post_fp8


# ---------------------------------------------------------------- encoder_attention


@pytest.fixture
def fake_vision(monkeypatch, calls):
    chosen = {"name": "fa3"}

    def impl(name):
        return type(f"Vision_{name}", (), {"__init__": lambda self, **kwargs: None})

    impls = {name: impl(name) for name in ("triton_attn", "sdpa", "fa3", "fa4", "flashinfer_cudnn")}

    class VisionAttention:
        def __init__(self, embed_dim, num_heads, projection_size, use_qkv_parallel, **kwargs):
            calls.append(("VisionAttention", dict(embed_dim=embed_dim, num_heads=num_heads,
                                                  projection_size=projection_size,
                                                  use_qkv_parallel=use_qkv_parallel, **kwargs)))  # fmt: skip
            self.qkv_backend = impls[chosen["name"]](head_dim=kwargs.get("head_dim"))
            self.softmax_scale = kwargs.get("softmax_scale")

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None,
                               softmax_scale=None, window_size=(-1, -1), ver=3, **kwargs):  # fmt: skip
        calls.append(("flash", q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                      window_size, ver, kwargs))  # fmt: skip

    def context_attention_fwd(q, k, v, o, b_start_loc, b_seq_len, max_input_len, is_causal=True, sm_scale=None):
        calls.append(("triton", q, k, v, o, b_start_loc, b_seq_len, max_input_len, is_causal, sm_scale))

    install_fakes(monkeypatch, {
        "sglang.srt.layers.attention.vision": {"VisionAttention": VisionAttention, "QKV_BACKEND_IMPL": impls,
                                               "flash_attn_varlen_func": flash_attn_varlen_func,
                                               "context_attention_fwd": context_attention_fwd},
    })  # fmt: skip
    return chosen


def ecase(batch=2, isl=5, heads=3, head_dim=16, dtype="bfloat16"):
    return EncoderCase(batch, isl, heads, head_dim, dtype)


def check_qkv(q, k, v, tokens=10, heads=3, head_dim=16):
    for t in (q, k, v):
        assert tuple(t.shape) == (tokens, heads, head_dim) and t.dtype == torch.bfloat16 and t.is_contiguous()
    assert q is not k and k is not v


@pytest.mark.parametrize(
    ("name", "source", "ver"), [("fa3", "flash_attention_v3", 3), ("fa4", "flash_attention_v4", 4)]
)
def test_flash_attention_as_the_vision_backend_calls_it(fake_vision, calls, name, source, ver):
    fake_vision["name"] = name
    runner = sglang_backend.RUNNERS.find("encoder_attention", source)
    prepared = runner.prepare(ecase(), source, "cpu", 2)
    assert prepared.kernel_source == source
    ((built,),) = kernel_calls(calls, "VisionAttention")  # as Qwen3-VL's vision block (qwen3_vl.py:193-206)
    assert built["embed_dim"] == built["projection_size"] == 48 and built["num_heads"] == 3
    assert built["head_dim"] == 16 and built["use_qkv_parallel"] and built["flatten_batch"]
    assert built["quant_config"] is None and built["use_data_parallel"] is False
    prepared.call(), prepared.call()
    flashes = kernel_calls(calls, "flash")
    assert len(flashes) == 2 and not kernel_calls(calls, "triton")
    for q, k, v, cu_q, cu_k, max_q, max_k, scale, window, got_ver, extra in flashes:
        check_qkv(q, k, v)
        assert cu_q is cu_k and cu_q.dtype == torch.int32 and cu_q.tolist() == [0, 5, 10]
        assert max_q == max_k == 5 and scale is None and got_ver == ver and extra == {}
        assert window == (-1, -1)  # fa3 passes it; fa4 leaves the default
    assert flashes[0][0] is not flashes[1][0]  # the copies in turn


def test_triton_attention_as_the_vision_backend_calls_it(fake_vision, calls):
    fake_vision["name"] = "triton_attn"
    prepared = encoder_attention.prepare(ecase(batch=3, isl=4, heads=2, head_dim=8), "triton", "cpu", 1)
    assert prepared.kernel_source == "triton"
    prepared.call()
    ((q, k, v, o, start, lens, max_len, causal, scale),) = kernel_calls(calls, "triton")
    check_qkv(q, k, v, tokens=12, heads=2, head_dim=8)
    assert o.shape == q.shape and o.dtype == q.dtype and o is not q
    assert start.tolist() == [0, 4, 8, 12] and lens.tolist() == [4, 4, 4] and max_len == 4
    assert causal is False and scale is None


def test_encoder_refuses_what_sglang_does_not_run(fake_vision, monkeypatch):
    fake_vision["name"] = "sdpa"  # a non-CUDA device's choice: no reference label, not timed here
    with pytest.raises(KernelLimit, match="sdpa"):
        encoder_attention.prepare(ecase(), "x", "cpu", 1)
    vision = sys.modules["sglang.srt.layers.attention.vision"]
    monkeypatch.setattr(vision, "QKV_BACKEND_IMPL", {})  # SGLang built a class it does not name
    with pytest.raises(RuntimeError, match="does not name"):
        encoder_attention.prepare(ecase(), "x", "cpu", 1)


def test_encoder_refuses_fp8_before_importing_sglang():
    with pytest.raises(KernelLimit, match="bfloat16"):
        encoder_attention.prepare(ecase(dtype="fp8"), "x", "cpu", 1)
    assert "sglang" not in sys.modules


def test_encoder_footprint_is_the_bytes_of_its_tensors():
    b, s, h, d = 2, 7, 3, 16
    qkvo = 4 * torch.empty(b * s, h, d, dtype=torch.bfloat16).nbytes
    lse, offsets = torch.empty(h, b * s).nbytes, torch.empty(2 * b + 1, dtype=torch.int32).nbytes
    assert encoder_attention.footprint(ecase(b, s, h, d)) == qkvo + lse + offsets


# ---------------------------------------------------------------- imports, contract and preflight


def test_no_framework_import_at_module_level():
    for module in MODULES:
        for node in ast.parse(Path(module.__file__).read_text()).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                assert not any(n.split(".")[0] in ("torch", "sglang", "sgl_kernel") for n in names), names


def _pinned_wheels() -> list[Path]:
    found = sorted(WHEELS.glob("sglang-0.5.14-*.whl")) + sorted(WHEELS.glob("sglang_kernel-0.4.4-*.whl"))
    if len(found) < 2:
        pytest.skip("no pinned SGLang wheels in .cache/wheels; `nox -s contract-sglang` downloads them (.ci/run does)")
    return found


def test_the_new_runners_uses_resolve_in_the_pinned_wheels_and_a_doctored_copy_is_caught():
    from opcollect.backends.symbols import Release, check, runner_uses

    release = Release(*_pinned_wheels())
    backends = ROOT / "src" / "opcollect" / "backends"
    files = {f"src/opcollect/backends/sglang/{Path(m.__file__).name}" for m in MODULES}
    uses = [
        u for u in runner_uses(backends / "sglang", ("sglang", "sgl_kernel"), ROOT) if u.where.split(":")[0] in files
    ]
    labels = {u.label for u in uses}
    assert {
        "sglang.srt.layers.quantization.fp8_kernel.static_quant_fp8",
        "sglang.srt.layers.quantization.fp8_kernel.sglang_per_token_quant_fp8",
        "sglang.srt.layers.quantization.modelopt_quant.ModelOptFp8LinearMethod",
        "sglang.srt.layers.quantization.fp8_kernel.per_tensor_quant_mla_fp8",
        "sglang.srt.models.deepseek_common.attention_forward_methods.forward_mla.bmm_fp8",
        "sglang.srt.layers.attention.vision.VisionAttention",
        "sglang.srt.layers.attention.vision.flash_attn_varlen_func",
        "sglang.srt.layers.attention.vision.context_attention_fwd",
    } <= labels
    assert check(uses, release) == []
    kernel, vision, mla = (
        "sglang/srt/layers/quantization/fp8_kernel.py",
        "sglang/jit_kernel/flash_attention.py",
        "sglang/srt/models/deepseek_common/attention_forward_methods/forward_mla.py",
    )
    release.files[kernel] = release.files[kernel].replace(
        "    repeat_scale: bool = False,", "    repeat: bool = False,"
    )
    head, varlen = release.files[vision].split("def flash_attn_varlen_func(")
    release.files[vision] = head + "def flash_attn_varlen_func(" + varlen.replace("    ver=3,\n", "    version=3,\n", 1)
    release.files[mla] = release.files[mla].replace("    def bmm_fp8(A, B,", "    def bmm_fp8_v2(A, B,")
    release._trees.clear()
    lines = [m.render() for m in check(uses, release)]
    assert any("quantize.py" in line and "static_quant_fp8: no parameter 'repeat_scale'" in line for line in lines)
    assert any("encoder_attention.py" in line and "no parameter 'ver'" in line for line in lines), lines
    assert any("mla_bmm.py" in line and "forward_mla.bmm_fp8: not defined" in line for line in lines), lines
    assert len(lines) == 3, lines


def test_the_in_image_preflight_checks_the_new_runners(tmp_path, monkeypatch):
    """preflight("sglang") over the pinned wheels' files as an installed sglang and sgl_kernel: it passes, and a
    release without a keyword the quantize runner passes stops the run naming that runner's line."""
    from opcollect.runtime.preflight import FrameworkMismatch, preflight

    site = tmp_path / "site"
    for wheel in _pinned_wheels():
        with zipfile.ZipFile(wheel) as archive:
            names = [n for n in archive.namelist() if n.startswith(("sglang/", "sgl_kernel/")) and n.endswith(".py")]
            archive.extractall(site, names)
    monkeypatch.syspath_prepend(str(site))
    assert preflight("sglang") > 50 and "sglang" not in sys.modules
    kernel = site / "sglang/srt/layers/quantization/fp8_kernel.py"
    kernel.write_text(kernel.read_text().replace("    repeat_scale: bool = False,", "    repeat: bool = False,"))
    with pytest.raises(FrameworkMismatch, match=r"backends/sglang/quantize\.py:\d+: .*no parameter 'repeat_scale'"):
        preflight("sglang")
