"""The TensorRT-LLM runners of compute_scale, scale_matrix, mla_bmm and encoder_attention against stand-ins for
tensorrt_llm and its torch ops (no tensorrt_llm can be installed here): the stand-ins record every call and compute
with torch on the CPU, so the tests check which TensorRT-LLM op each runner calls, with which shapes, strides, dtypes
and arguments, the label it reports, and what the source preflight (torch_ops.check_installed) refuses."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from opcollect.backends.trtllm import encoder_attention as enc
from opcollect.backends.trtllm import mla_bmm, quantize, torch_ops
from opcollect.plans.encoder_attention import EncoderAttentionCase
from opcollect.plans.mla_bmm import MlaBmmCase
from opcollect.plans.quantize import QuantizeCase
from opcollect.runtime.contract import KernelLimit, Measured
from opcollect.runtime.harness import Stats

torch = pytest.importorskip("torch")

# ---- the parts of the installed sources the runners rely on (as read in the copies torch_ops.py names)

KEPT = {
    "_torch/modules/linear.py": (
        "class FP8QDQLinearMethod(UnquantizedLinearMethod):\n"
        "    def apply(self, module, input, bias):\n"
        "        if module.input_scale is not None and not module.force_dynamic_quantization:\n"
        "            qinput, _ = torch.ops.tensorrt_llm.static_quantize_e4m3_per_tensor(input, module.input_scale)\n"
        "        else:\n"
        "            qinput, cur_input_scale = torch.ops.tensorrt_llm.quantize_e4m3_per_tensor(input)\n"
    ),
    "_torch/modules/attention.py": (
        "def fp8_block_scaling_bmm_out(mat1, mat2_fp8, mat2_scale, out, mat2_dequant=None):\n"
        "    sm_version = get_sm_version()\n"
        "    if sm_version == 90 or sm_version == 89:\n"
        "        mat1_fp8, mat1_scale = torch.ops.trtllm.fp8_batched_quantize_1x128_permute102(mat1)\n"
        "        output = out.new_empty(out.shape, dtype=out.dtype, device=out.device)\n"
        "        torch.ops.trtllm.fp8_block_scaling_bmm_out(mat1_fp8, mat2_fp8, mat1_scale, mat2_scale, output)\n"
        "        out.copy_(output)\n"
        "    elif sm_version == 120:\n"
        "        mat1_fp8, mat1_scale = fp8_utils.per_token_quant_and_transform(mat1, need_permute102=True)\n"
        "    elif is_sm_100f(sm_version):\n"
        "        torch.bmm(mat1.transpose(0, 1), mat2_dequant.transpose(1, 2), out=out)\n\n"
        "class MLA(nn.Module):\n"
        "    def forward_absorption_generation(self, q):\n"
        "        torch.ops.trtllm.bmm_out(q_nope_t, self.k_b_proj_trans.transpose(1, 2), q_nope_out)\n"
        "        fp8_block_scaling_bmm_out(attn_out_latent, self.v_b_proj, self.v_b_proj_scale, out)\n"
    ),
    "_torch/attention_backend/trtllm.py": (
        "class TrtllmAttentionMetadata(AttentionMetadata):\n"
        "    _max_seq_len_storage: Optional[int] = field(default=None, init=True, repr=False)\n"
        "    def prepare(self):\n"
        "        if not self.is_dummy_attention and self.kv_cache_manager is None:\n"
        "            assert self._max_seq_len_storage is not None\n"
    ),
    "_torch/attention_backend/interface.py": (
        'class PredefinedAttentionMask(str, Enum):\n    CAUSAL = "causal"\n    FULL = "full"\n'
    ),
}


def _tree(root, changes=(), moved=False):
    """A tensorrt_llm package keeping KEPT; ``moved``: MLA and its wrapper in modules/mla.py, as after PR #15648."""
    files = dict(KEPT)
    if moved:
        files["_torch/modules/mla.py"] = files.pop("_torch/modules/attention.py")
        files["_torch/modules/attention.py"] = "class Attention(nn.Module):\n    pass\n"
    for rel, old, new in changes:
        assert old in files[rel]
        files[rel] = files[rel].replace(old, new)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """The sources torch_ops reads as the installed tensorrt_llm; its per-process caches cleared around the test."""
    root = _tree(tmp_path / "tensorrt_llm")
    monkeypatch.setattr(torch_ops, "installed_root", lambda: root)
    torch_ops._installed_problems.cache_clear()
    torch_ops.installed_fp8_bmm_wrapper.cache_clear()
    yield root
    torch_ops._installed_problems.cache_clear()
    torch_ops.installed_fp8_bmm_wrapper.cache_clear()


def _fake_release(monkeypatch, calls: list, sm: int = 90, **modules) -> None:
    """tensorrt_llm's modules as stand-ins, and torch.ops.tensorrt_llm / torch.ops.trtllm ops that record calls."""

    def record(name, fn):
        def op(*args, **kwargs):
            calls.append((name, args, kwargs))
            return fn(*args, **kwargs)

        return op

    def static(x, scale):
        return (x.float() / scale).to(torch.float8_e4m3fn), scale  # the scale it was given, as fp8Op.cpp returns it

    def dynamic(x):
        scale = (x.float().abs().amax() / 448).reshape(1, 1).to(x.dtype)
        return (x.float() / scale.float()).to(torch.float8_e4m3fn), scale

    def quantize_1x128(mat1):  # [t, h, k] -> fp8 [h, t, k] and its 1x128 scales
        h, t, k = mat1.shape[1], mat1.shape[0], mat1.shape[2]
        return mat1.transpose(0, 1).contiguous().to(torch.float8_e4m3fn), torch.ones(h * -(-t // 4) * 4 * k // 128)

    def block_bmm(mat1, mat2, mat1_scale, mat2_scale, out):
        out.copy_(torch.bmm(mat1.float(), mat2.float().transpose(1, 2)).to(out.dtype))
        return out

    monkeypatch.setattr(
        torch.ops,
        "tensorrt_llm",
        SimpleNamespace(
            static_quantize_e4m3_per_tensor=record("static", static),
            quantize_e4m3_per_tensor=record("dynamic", dynamic),
        ),
        raising=False,
    )
    monkeypatch.setattr(
        torch.ops,
        "trtllm",
        SimpleNamespace(
            bmm_out=record("bmm_out", lambda a, b, out: torch.bmm(a, b, out=out)),
            fp8_batched_quantize_1x128_permute102=record("quantize_1x128", quantize_1x128),
            fp8_block_scaling_bmm_out=record("fp8_block_scaling_bmm_out", block_bmm),
        ),
        raising=False,
    )
    fake = {
        "tensorrt_llm": SimpleNamespace(),
        "tensorrt_llm._torch": SimpleNamespace(),
        "tensorrt_llm._torch.custom_ops": SimpleNamespace(),
        "tensorrt_llm._utils": SimpleNamespace(get_sm_version=lambda: sm, is_sm_100f=lambda s=None: s in (100, 103)),
        **modules,
    }
    for name, module in fake.items():
        monkeypatch.setitem(sys.modules, name, module)


# ---- compute_scale and scale_matrix


def test_quantize_footprint_and_refusals_before_any_import():
    assert quantize.footprint(QuantizeCase(4, 1024, "fp8")) == 4 * 1024 * (2 + 1) + 4
    with pytest.raises(KernelLimit, match="fp8 only"):
        quantize.prepare_static(QuantizeCase(4, 1024, "int8"), "torch_ops", "cpu", 1)
    with pytest.raises(KernelLimit, match="empty"):
        quantize.measure_compute_scale([QuantizeCase(0, 1024, "fp8")], "cpu", None)
    assert "tensorrt_llm" not in sys.modules


@pytest.mark.parametrize("dynamic", [False, True])
def test_each_quantize_runner_calls_its_op_as_the_fp8_linear_does(monkeypatch, installed, dynamic):
    calls = []
    _fake_release(monkeypatch, calls)
    case = QuantizeCase(3, 256, "fp8")
    prepare = quantize.prepare_dynamic if dynamic else quantize.prepare_static
    prepared = prepare(case, "torch_ops", "cpu", 2)
    prepared.call()
    prepared.call()
    assert prepared.kernel_source == "torch_ops"
    assert [name for name, _, _ in calls] == ["dynamic" if dynamic else "static"] * 3  # the dry run, two calls
    xs = [args[0] for _, args, _ in calls]
    assert all(x.dtype == torch.bfloat16 and tuple(x.shape) == (3, 256) and x.is_contiguous() for x in xs)
    assert xs[1] is not xs[2] and xs[0] is xs[2]  # two input sets, cycled
    if dynamic:
        assert all(len(args) == 1 and not kwargs for _, args, kwargs in calls)  # no scale: it computes one
    else:
        scale = calls[0][1][1]
        assert scale.dtype == torch.float32 and scale.dim() == 0 and float(scale) == 1.0  # the checkpoint's scalar
        assert all(args[1] is scale for _, args, _ in calls)


def test_kernel_ran_refuses_what_the_op_did_not_do():
    x = torch.zeros(2, 8, dtype=torch.bfloat16)
    given = torch.tensor(1.0)
    fp8 = x.to(torch.float8_e4m3fn)
    assert quantize.kernel_ran(fp8, given, given, (2, 8), dynamic=False) == "torch_ops"
    with pytest.raises(RuntimeError, match="did not return the scale"):
        quantize.kernel_ran(fp8, torch.tensor(1.0), given, (2, 8), dynamic=False)
    with pytest.raises(RuntimeError, match="not \\(1, 1\\)"):
        quantize.kernel_ran(fp8, torch.ones(2, 1), None, (2, 8), dynamic=True)
    with pytest.raises(RuntimeError, match="wrote"):
        quantize.kernel_ran(x, given, given, (2, 8), dynamic=False)


def _stats(latency, p25, p75, timing="graph", l2="flush"):
    return Stats(latency, p25, p75, 10, (p75 - p25) / latency, timing, 1, 0.1, 0.01, l2=l2, sm_clock_mhz=1980.0)


def test_compute_scale_times_the_dynamic_op_minus_the_static_one(monkeypatch, installed):
    calls, timed = [], []
    _fake_release(monkeypatch, calls)
    latencies = {"dynamic": _stats(0.009, 0.0085, 0.0095), "static": _stats(0.0012, 0.0011, 0.0013)}

    def measure_cases(runner, dispatch, cases, device, config):
        (case,) = cases
        prepared = runner.prepare(case, dispatch, device, 1)
        prepared.call()
        timed.append(calls[-1][0])  # which op the timed call ran
        return [Measured(latencies[calls[-1][0]], prepared.kernel_source)]

    monkeypatch.setattr(quantize.timing, "measure_cases", measure_cases)
    (row,) = quantize.measure_compute_scale([QuantizeCase(1, 768, "fp8")], "cpu", None)
    assert timed == ["dynamic", "static"]
    assert row.kernel_source == "torch_ops" and row.stats.latency == pytest.approx(0.0078)
    # a dynamic op no slower than the static one: the collector's max(0, dynamic - static), a row of latency 0 with
    # its quantiles in order and a noise relative to the dynamic op's median, not a failed case
    latencies["dynamic"] = _stats(0.0012, 0.0010, 0.0014)
    (zero,) = quantize.measure_compute_scale([QuantizeCase(1, 768, "fp8")], "cpu", None)
    assert (zero.stats.latency, zero.stats.latency_p25) == (0.0, 0.0) and zero.kernel_source == "torch_ops"
    assert zero.stats.latency_p75 == pytest.approx(0.0014 - 0.0011)
    assert zero.stats.noise == pytest.approx((0.0014 - 0.0011) / 0.0012)


def test_the_quantize_preflight_refuses_a_linear_that_stopped_calling_the_ops(tmp_path):
    assert torch_ops.problems(_tree(tmp_path / "ok"), "scale_matrix") == []
    changed = ("_torch/modules/linear.py", "tensorrt_llm.quantize_e4m3", "trtllm.fp8_quantize")
    root = _tree(tmp_path / "broken", [changed])
    with pytest.raises(KernelLimit, match="FP8QDQLinearMethod.apply no longer uses torch.ops.tensorrt_llm.quantize"):
        torch_ops.check_installed("compute_scale", root)
    assert torch_ops.problems(root, "mla_bmm") == []  # each op is held to its own assumptions


# ---- mla_bmm


def test_mla_bmm_layouts_and_footprint_by_hand():
    pre = mla_bmm.bmm_layout(MlaBmmCase("mla_gen_pre", "bfloat16", 3, 16))
    assert (pre.act_shape, pre.out_shape, pre.weight_shape) == ((3, 16 * 192), (3, 16, 576), (16, 512, 128))
    post = mla_bmm.bmm_layout(MlaBmmCase("mla_gen_post", "fp8", 3, 16))
    assert (post.act_shape, post.out_shape, post.weight_shape, post.scale_shape) == (
        (3, 16 * 512),
        (3, 16, 128),
        (16, 128, 512),
        (16, 1, 4),
    )
    assert (
        mla_bmm.footprint(MlaBmmCase("mla_gen_pre", "bfloat16", 3, 16)) == (3 * 16 * (192 + 576) + 16 * 512 * 128) * 2
    )
    fp8 = mla_bmm.footprint(MlaBmmCase("mla_gen_post", "fp8", 3, 16))
    buffers, weight, scales = 3 * 16 * (512 + 128) * 2, 16 * 128 * 512, 16 * 4 * 4
    act_quant = 16 * 3 * 512 + 16 * 4 * 4 * 4  # fp8 [h, t, k] and 1x128 scales with rows padded to 4
    assert fp8 == buffers + weight + scales + act_quant + 16 * 3 * 128 * 2 + 16 * 128 * 512 * 2


def test_mla_bmm_fp8_path_follows_the_wrapper_and_refusals():
    assert [mla_bmm.fp8_path(sm, sm in (100, 103)) for sm in (89, 90, 120, 100, 103)] == [
        "quantize_1x128",
        "quantize_1x128",
        "per_token_transform",
        "dequant",
        "dequant",
    ]
    for sm in (80, 86, 121):
        with pytest.raises(KernelLimit, match=f"SM{sm}"):
            mla_bmm.fp8_path(sm, False)
    assert [
        mla_bmm.kernel_label(d, p) for d, p in (("bfloat16", None), ("fp8", "quantize_1x128"), ("fp8", "dequant"))
    ] == ["trtllm_bmm_out", "trtllm_fp8_block_scaling_bmm_out", "trtllm_bmm_out_dequant_bf16"]
    for bad in (MlaBmmCase("mla_gen_pre", "nvfp4", 1, 16), MlaBmmCase("mla_ctx", "bfloat16", 1, 16)):
        with pytest.raises(KernelLimit):
            mla_bmm.prepare(bad, "trtllm_bmm_out", "cpu", 1)
    assert "tensorrt_llm" not in sys.modules


@pytest.mark.parametrize("op_name", ["mla_gen_pre", "mla_gen_post"])
def test_bf16_bmm_out_gets_serving_views(monkeypatch, installed, op_name):
    calls = []
    _fake_release(monkeypatch, calls)
    t, h = 3, 2
    prepared = mla_bmm.prepare(MlaBmmCase(op_name, "bfloat16", t, h), "trtllm_bmm_out", "cpu", 1)
    prepared.call()
    assert prepared.kernel_source == "trtllm_bmm_out"
    ((name, (a, b, out), _),) = calls
    assert name == "bmm_out" and a.dtype == b.dtype == out.dtype == torch.bfloat16
    if op_name == "mla_gen_pre":
        # q_nope^T of q [t, h * 192]; k_b_proj_trans [h, 512, 128] transposed; fused_q[..., :512] of [t, h, 576]
        assert (tuple(a.shape), a.stride()) == ((h, t, 128), (192, h * 192, 1))
        assert (tuple(b.shape), b.stride()) == ((h, 128, 512), (512 * 128, 1, 128))
        assert (tuple(out.shape), out.stride()) == ((h, t, 512), (576, h * 576, 1))
    else:
        assert (tuple(a.shape), a.stride()) == ((h, t, 512), (512, h * 512, 1))
        assert (tuple(b.shape), b.stride()) == ((h, 512, 128), (128 * 512, 1, 512))
        assert (tuple(out.shape), out.stride()) == ((h, t, 128), (128, h * 128, 1))
    assert torch.equal(out, torch.bmm(a, b))


@pytest.mark.parametrize("copies_output", [True, False])
@pytest.mark.parametrize("op_name", ["mla_gen_pre", "mla_gen_post"])
def test_fp8_on_sm90_quantizes_1x128_then_runs_the_block_scaled_bmm(monkeypatch, installed, op_name, copies_output):
    if not copies_output:  # a wrapper that writes the BMM into the output view itself (attention.py @c6d3bb2a)
        _tree(installed, [("_torch/modules/attention.py", "        out.copy_(output)\n", "")])
    calls, buffers = [], []
    _fake_release(monkeypatch, calls, sm=90)
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: buffers.append(real_empty(*a, **k)) or buffers[-1])
    t, h = 5, 2
    prepared = mla_bmm.prepare(MlaBmmCase(op_name, "fp8", t, h), "trtllm_fp8_block_scaling_bmm_out", "cpu", 1)
    prepared.call()
    assert prepared.kernel_source == "trtllm_fp8_block_scaling_bmm_out"
    (quant_name, (mat1,), _), (bmm_name, (a, w, a_scale, w_scale, out), _) = calls
    assert (quant_name, bmm_name) == ("quantize_1x128", "fp8_block_scaling_bmm_out")
    n, k = (512, 128) if op_name == "mla_gen_pre" else (128, 512)
    width = 192 if op_name == "mla_gen_pre" else 512
    assert (tuple(mat1.shape), mat1.stride(), mat1.dtype) == ((t, h, k), (h * width, width, 1), torch.bfloat16)
    assert a.dtype == w.dtype == torch.float8_e4m3fn and tuple(w.shape) == (h, n, k) and w.is_contiguous()
    assert w_scale.dtype == torch.float32 and tuple(w_scale.shape) == (h, n // 128, k // 128)
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == (h, t, n)
    (serving,) = [b for b in buffers if b.dim() == 3]  # fused_q [t, h, 576] or the output [t, h, 128]
    view = serving[..., :n].transpose(0, 1)
    if copies_output:  # the BMM into a fresh buffer, then copied into serving's view, as the installed wrapper does
        assert out.is_contiguous() and out.data_ptr() != view.data_ptr() and torch.equal(view, out)
    else:
        assert out.data_ptr() == view.data_ptr() and out.stride() == view.stride()
    assert torch.equal(view, torch.bmm(a.float(), w.float().transpose(1, 2)).to(torch.bfloat16))


def test_fp8_on_sm100_runs_torch_bmm_on_the_dequantized_weight(monkeypatch, installed):
    calls, bmms = [], []
    _fake_release(monkeypatch, calls, sm=100)
    real = torch.bmm
    monkeypatch.setattr(torch, "bmm", lambda a, b, out=None: bmms.append((a, b, out)) or real(a, b, out=out))
    prepared = mla_bmm.prepare(MlaBmmCase("mla_gen_post", "fp8", 4, 2), "trtllm_bmm_out_dequant_bf16", "cpu", 1)
    prepared.call()
    assert prepared.kernel_source == "trtllm_bmm_out_dequant_bf16" and calls == []  # no fp8 kernel on SM100f
    ((a, b, out),) = bmms
    assert a.dtype == b.dtype == out.dtype == torch.bfloat16 and tuple(b.shape) == (2, 512, 128)
    assert tuple(out.shape) == (2, 4, 128) and out.stride() == (128, 2 * 128, 1)


def test_fp8_on_sm120_transforms_the_activation_and_resmooths_the_weight(monkeypatch, installed):
    calls, utils = [], []

    def per_token(mat1, **kwargs):
        utils.append(("quant", tuple(mat1.shape), kwargs))
        return mat1.transpose(0, 1).contiguous().to(torch.float8_e4m3fn), torch.ones(1, dtype=torch.int32)

    def resmooth(weight, scale):
        utils.append(("resmooth", weight.dtype, scale.dtype))
        return weight, scale

    def transform(scale, **kwargs):
        utils.append(("transform", kwargs))
        return scale

    fp8_utils = SimpleNamespace(
        per_token_quant_and_transform=per_token,
        resmooth_to_fp8_e8m0=resmooth,
        transform_sf_into_required_layout=transform,
    )
    _fake_release(monkeypatch, calls, sm=120, **{"tensorrt_llm.quantization.utils.fp8_utils": fp8_utils})
    prepared = mla_bmm.prepare(MlaBmmCase("mla_gen_pre", "fp8", 4, 2), "x", "cpu", 1)
    prepared.call()
    assert prepared.kernel_source == "trtllm_fp8_block_scaling_bmm_out"
    assert utils[0] == ("resmooth", torch.float8_e4m3fn, torch.float32)
    assert utils[1] == ("transform", {"mn": 512, "k": 128, "recipe": (1, 128, 128), "num_groups": 2, "is_sfa": False})
    assert utils[2] == ("quant", (4, 2, 128), {"need_permute102": True})
    assert [name for name, _, _ in calls] == ["fp8_block_scaling_bmm_out"]


def test_fp8_without_a_path_on_the_sm_builds_nothing(monkeypatch, installed):
    calls = []
    _fake_release(monkeypatch, calls, sm=86)
    with pytest.raises(KernelLimit, match="SM86"):
        mla_bmm.prepare(MlaBmmCase("mla_gen_pre", "fp8", 4, 2), "x", "cpu", 1)
    assert calls == []


@pytest.mark.parametrize("moved", [False, True])
def test_the_mla_preflight_reads_either_layout_and_refuses_a_changed_wrapper(tmp_path, moved):
    root = _tree(tmp_path / "ok", moved=moved)
    assert torch_ops.problems(root, "mla_bmm") == []
    assert torch_ops.fp8_bmm_wrapper(root).path.endswith("mla.py" if moved else "attention.py")
    changed = ("_torch/modules/attention.py", "fp8_batched_quantize_1x128_permute102", "fp8_quantize_1x128")
    with pytest.raises(KernelLimit, match="fp8_block_scaling_bmm_out no longer uses .*permute102"):
        torch_ops.check_installed("mla_bmm", _tree(tmp_path / "broken", [changed]))
    gone = _tree(tmp_path / "gone")
    (gone / "_torch/modules/attention.py").unlink()
    found = torch_ops.problems(gone, "mla_bmm")
    assert found and "attention.py or tensorrt_llm/_torch/modules/mla.py: missing" in found[0]


# ---- encoder_attention


def test_encoder_refusals_and_footprint():
    ok = EncoderAttentionCase(2, 49152, 32, 80, "bfloat16")  # the reference's largest: just under 2^31 bytes
    enc.check_case(ok)
    with pytest.raises(KernelLimit, match="2\\^31"):
        enc.check_case(ok._replace(batch_size=4))
    with pytest.raises(KernelLimit, match="bfloat16 only"):
        enc.check_case(ok._replace(attn_dtype="fp8"))
    with pytest.raises(KernelLimit, match="head_dim 512"):
        enc.check_case(EncoderAttentionCase(1, 16, 2, 512, "bfloat16"))
    case = EncoderAttentionCase(2, 16, 4, 64, "bfloat16")
    assert enc.qkv_shape(case) == (32, 3 * 4 * 64)
    assert enc.footprint(case) == 2 * 32 * 768 * 2 + 32 * 256 * 2 + 2 * 16


def _fake_attention(monkeypatch, events, backend_class="TrtllmAttention"):
    class Metadata:
        __dataclass_fields__ = {"workspace": None}

        def __init__(self, **kwargs):
            self.kwargs = kwargs
            events.append(("metadata", kwargs))

        def prepare(self):
            events.append("prepare")

    backend = type(backend_class, (), {"Metadata": Metadata})
    backend.forward = lambda self, *args, **kwargs: events.append(("forward", args, kwargs))
    record = lambda **kw: SimpleNamespace(**kw)  # noqa: E731

    def create_attention(**kwargs):
        events.append(("create", kwargs))
        return backend()

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: events.append("sync"))
    fake = {
        "tensorrt_llm": SimpleNamespace(),
        "tensorrt_llm._torch.attention_backend.interface": SimpleNamespace(
            PredefinedAttentionMask=SimpleNamespace(FULL="full", CAUSAL="causal"), AttentionRuntimeFeatures=record
        ),
        "tensorrt_llm._torch.attention_backend.utils": SimpleNamespace(create_attention=create_attention),
        "tensorrt_llm._torch.metadata": SimpleNamespace(KVCacheParams=record),
        "tensorrt_llm.models.modeling_utils": SimpleNamespace(QuantAlgo={}, QuantConfig=record),
        "tensorrt_llm.mapping": SimpleNamespace(Mapping=record),
    }
    for name, module in fake.items():
        monkeypatch.setitem(sys.modules, name, module)


def test_encoder_runs_the_trtllm_backend_without_cache_and_with_a_full_mask(monkeypatch, installed):
    events = []
    _fake_attention(monkeypatch, events)
    case = EncoderAttentionCase(2, 16, 4, 80, "bfloat16")
    prepared = enc.prepare(case, "torch_flow", "cpu", 2)
    prepared.call()
    assert prepared.kernel_source == "torch_flow"
    (created,) = [e[1] for e in events if e[0] == "create"]
    assert created["backend_name"] == "TRTLLM" and created["num_kv_heads"] == created["num_heads"] == 4
    assert created["head_dim"] == 80 and created["pos_embd_params"] is None and created["is_mla_enable"] is False
    assert vars(created["quant_config"]) == {}  # no quantization
    (meta,) = [e[1] for e in events if e[0] == "metadata"]
    assert meta["kv_cache_manager"] is None and meta["_max_seq_len_storage"] == 16 and meta["num_contexts"] == 2
    assert meta["seq_lens"].tolist() == [16, 16] and meta["prompt_lens"] == [16, 16]
    assert meta["kv_cache_params"].use_cache is False and meta["max_num_tokens"] == 32
    forwards = [e for e in events if isinstance(e, tuple) and e[0] == "forward"]
    assert len(forwards) == 3 and events.count("prepare") == 1  # one warm forward per input set, then the call
    for _, (qkv, k, v, metadata), kwargs in forwards:
        assert tuple(qkv.shape) == (32, 3 * 4 * 80) and qkv.dtype == torch.bfloat16 and k is None and v is None
        assert kwargs == {"attention_mask": "full"} and metadata.kwargs is meta
    assert forwards[0][1][0] is not forwards[1][1][0] and forwards[2][1][0] is forwards[1][1][0]


def test_encoder_reports_another_backend_by_its_name(monkeypatch, installed):
    _fake_attention(monkeypatch, [], backend_class="VanillaAttention")
    prepared = enc.prepare(EncoderAttentionCase(1, 4, 2, 64, "bfloat16"), "torch_flow", "cpu", 1)
    assert prepared.kernel_source == "torch_flow_vanillaattention"


def test_the_encoder_preflight_needs_the_no_cache_metadata_and_the_full_mask(tmp_path):
    assert torch_ops.problems(_tree(tmp_path / "ok"), "encoder_attention") == []
    no_full = ("_torch/attention_backend/interface.py", '    FULL = "full"\n', "")
    with pytest.raises(KernelLimit, match="PredefinedAttentionMask no longer uses FULL"):
        torch_ops.check_installed("encoder_attention", _tree(tmp_path / "a", [no_full]))
    renamed = ("_torch/attention_backend/trtllm.py", "class TrtllmAttentionMetadata", "class TrtllmMetadata")
    with pytest.raises(KernelLimit, match="no TrtllmAttentionMetadata"):
        torch_ops.check_installed("encoder_attention", _tree(tmp_path / "b", [renamed]))


# ---- registration and the op lookup


def test_the_runners_are_registered_for_both_pins_and_import_no_framework():
    import opcollect.backends.trtllm as trtllm

    for version in ("1.3.0rc20", "1.3.0rc23"):
        assert trtllm.RUNNERS.find("compute_scale", "torch_ops", version).measure_row is quantize.measure_compute_scale
        assert trtllm.RUNNERS.find("scale_matrix", "torch_ops", version).prepare is quantize.prepare_static
        assert trtllm.RUNNERS.find("mla_bmm", "trtllm_fp8_block_scaling_bmm_out", version).prepare is mla_bmm.prepare
        assert trtllm.RUNNERS.find("encoder_attention", "torch_flow", version).prepare is enc.prepare
    assert "tensorrt_llm" not in sys.modules


def test_an_op_the_release_does_not_register_is_a_kernel_limit(monkeypatch):
    _fake_release(monkeypatch, [])
    assert torch_ops.torch_op("trtllm", "bmm_out") is torch.ops.trtllm.bmm_out
    with pytest.raises(KernelLimit, match="no torch.ops.trtllm.cute_dsl_fp8_bmm_blackwell"):
        torch_ops.torch_op("trtllm", "cute_dsl_fp8_bmm_blackwell")


def test_without_tensorrt_llm_the_preflight_refuses(monkeypatch):
    monkeypatch.setattr(torch_ops, "installed_root", lambda: None)
    torch_ops._installed_problems.cache_clear()
    with pytest.raises(KernelLimit, match="not installed"):
        torch_ops.check_installed("mla_bmm")
    torch_ops._installed_problems.cache_clear()
