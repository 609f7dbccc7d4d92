"""The mHC runners of vLLM, SGLang and TensorRT-LLM (backends/{vllm,sglang,trtllm}/mhc.py) against stand-ins for the
frameworks up to their mHC calls: each stand-in checks its inputs as the framework function does (the cited asserts),
computes with the torch reference (backends/torch/mhc.py) and records what it was given. The tests check which
framework function each timed call runs, with which shapes, dtypes and arguments, that a row calls both sites, the
pre/post labels, and for TensorRT-LLM the autotuning and the tactic read back. Where .cache/wheels holds SGLang's
pinned wheel, the layer methods the SGLang runner calls on its stand-in layer, the flags and the server's hook are
read from it."""

from __future__ import annotations

import ast
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import ROOT, install_fakes

from opcollect.backends import kernels as kt
from opcollect.backends.sglang import context as sglang_context_module
from opcollect.backends.sglang import mhc as sgl
from opcollect.backends.torch import mhc as ref
from opcollect.backends.trtllm import mhc as trt
from opcollect.backends.trtllm import torch_ops
from opcollect.backends.vllm import mhc as vll
from opcollect.plans.mhc import MhcCase
from opcollect.runtime.contract import KernelLimit

torch = pytest.importorskip("torch")

HC, HIDDEN, T, ITERS = 4, 64, 5, 20
VLLM_PRE = "vllm.model_executor.kernels.mhc.tilelang.mhc_pre_tilelang"
VLLM_POST = "vllm.model_executor.kernels.mhc.tilelang.mhc_post_tilelang"
WHEELS = ROOT / ".cache" / "wheels"


def case(op: str, tokens: int = T, hidden: int = HIDDEN, sites: int = 2) -> MhcCase:
    return MhcCase(op, "DeepseekV4ForCausalLM", tokens, sites, HC, hidden, ITERS)


def check_site(residual, fn, scale, base, hidden=HIDDEN):
    """vLLM kernels/mhc/tilelang.py:123-137, SGLang layers/mhc.py:800-815, TensorRT-LLM mHC.__init__'s parameters."""
    assert residual.dtype == torch.bfloat16 and tuple(residual.shape) == (T, HC, hidden) and residual.is_contiguous()
    assert fn.dtype == torch.float32 and tuple(fn.shape) == ((2 + HC) * HC, HC * hidden)
    assert scale.dtype == torch.float32 and tuple(scale.shape) == (3,) and scale.tolist() == [1.0, 1.0, 1.0]
    assert base.dtype == torch.float32 and tuple(base.shape) == ((2 + HC) * HC,)
    assert fn.abs().sum() > 0 and base.abs().sum() > 0  # drawn, not left empty


# ---------------------------------------------------------------- vLLM


@pytest.fixture
def vllm_calls(monkeypatch):
    calls: list[tuple] = []

    def mhc_pre_tilelang(residual, fn, hc_scale, hc_base, rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value,
                         sinkhorn_repeat, n_splits=1, norm_weight=None, norm_eps=1e-6):  # fmt: skip
        args = (rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat, n_splits, norm_weight)
        calls.append(("pre", (residual, fn, hc_scale, hc_base), args, torch.is_grad_enabled()))
        check_site(residual, fn, hc_scale, hc_base)
        return ref.pre(residual, fn, hc_scale, hc_base, sinkhorn_repeat, hc_sinkhorn_eps, hc_post_mult_value)

    def mhc_post_tilelang(x, residual, post_layer_mix, comb_res_mix):
        calls.append(("post", (x, residual, post_layer_mix, comb_res_mix), (), torch.is_grad_enabled()))
        return ref.post(x, residual, post_layer_mix, comb_res_mix)

    install_fakes(monkeypatch, {"vllm.model_executor.kernels.mhc.tilelang": {
        "mhc_pre_tilelang": mhc_pre_tilelang, "mhc_post_tilelang": mhc_post_tilelang}})  # fmt: skip
    return calls


def test_vllm_pre_calls_mhc_pre_tilelang_on_both_sites_as_the_collector(vllm_calls):
    prepared = vll.prepare(case("pre"), VLLM_PRE, "cpu", 2)
    assert prepared.kernel_source == VLLM_PRE
    assert vllm_calls == []  # nothing runs before the timed calls
    for _ in range(3):
        prepared.call()
    assert [c[0] for c in vllm_calls] == ["pre"] * 6  # two sites a call
    for _, tensors, args, grad in vllm_calls:
        check_site(*tensors)
        # eps 1e-6 three times, hc_post_alpha 2.0, the iterations; no split override, no fused RMSNorm weight
        assert args == (1e-6, 1e-6, 1e-6, 2.0, ITERS, 1, None) and grad is False
    residuals = [c[1][0] for c in vllm_calls]
    assert residuals[0] is not residuals[1]  # each site its own inputs
    assert residuals[2] is not residuals[0] and residuals[4] is residuals[0]  # two input sets, cycled
    assert vllm_calls[0][1][1] is not vllm_calls[1][1][1]  # the attention's and the FFN's hc_fn


def test_vllm_post_mixes_what_pre_made_of_each_site(vllm_calls):
    prepared = vll.prepare(case("post"), "x", "cpu", 1)
    assert prepared.kernel_source == VLLM_POST
    made = [c for c in vllm_calls if c[0] == "pre"]
    assert len(made) == 2 and all(grad is False for *_, grad in made)
    outputs = [ref.pre(c[1][0], c[1][1], c[1][2], c[1][3], ITERS) for c in made]
    vllm_calls.clear()
    prepared.call()
    assert [c[0] for c in vllm_calls] == ["post", "post"]
    for (_, (x, residual, post_mix, comb), _, grad), pre_call, (want_post, want_comb, want_x) in zip(
        vllm_calls, made, outputs
    ):
        assert residual is pre_call[1][0] and grad is False  # the site's own residual
        assert x.dtype == torch.bfloat16 and tuple(x.shape) == (T, HIDDEN) and torch.equal(x, want_x)
        assert post_mix.dtype == torch.float32 and tuple(post_mix.shape) == (T, HC, 1)  # pre's [T, hc, 1]
        assert torch.equal(post_mix, want_post) and torch.equal(comb, want_comb) and tuple(comb.shape) == (T, HC, HC)


# ---------------------------------------------------------------- SGLang


class EnvBool:
    """SGLang's EnvBool as environ.py:38-126 has it: read from os.environ at each get, override sets and restores."""

    def __init__(self, name: str, default: bool = True):
        self.name, self.default = name, default

    def get(self) -> bool:
        value = os.environ.get(self.name)
        return self.default if value is None else value.lower() in ("true", "1", "yes", "y")

    @contextmanager
    def override(self, value):
        before = os.environ.get(self.name)
        os.environ[self.name] = str(value)
        try:
            yield
        finally:
            if before is None:
                os.environ.pop(self.name, None)
            else:
                os.environ[self.name] = before


FLAGS = (sgl.TILELANG_PRE, sgl.DEEPGEMM_PRENORM, sgl.TILELANG_POST, sgl.PREWARM)


@pytest.fixture
def sglang_fake(monkeypatch):
    for name in FLAGS:
        monkeypatch.delenv(name, raising=False)
    state = SimpleNamespace(calls=[], norms=[], contexts=0, sm120=False, hip=False)
    envs = SimpleNamespace(**{name: EnvBool(name) for name in FLAGS})

    @contextmanager
    def no_context(device, **server_args):
        state.contexts += 1
        yield server_args

    class RMSNorm(torch.nn.Module):
        def __init__(self, hidden_size, eps=1e-6, **kwargs):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(hidden_size))
            self.variance_epsilon = eps
            state.norms.append((self, hidden_size, eps, kwargs))

    class DeepseekV4DecoderLayer:
        def hc_pre(self, x, hc_fn, hc_scale, hc_base, norm=None, forward_batch=None):
            flags = {name: getattr(envs, name).get() for name in FLAGS}
            state.calls.append(("pre", self, (x, hc_fn, hc_scale, hc_base), norm, flags, torch.is_grad_enabled()))
            check_site(x, hc_fn, hc_scale, hc_base)
            post, comb, y = ref.pre(x, hc_fn, hc_scale, hc_base, self.hc_sinkhorn_iters, self.hc_eps)
            fused = flags[sgl.TILELANG_PRE] and norm is not None  # models/deepseek_v4.py:1323-1340
            return y, post.squeeze(-1), comb, fused

        def hc_post(self, x, residual, post, comb):
            flags = {name: getattr(envs, name).get() for name in FLAGS}
            state.calls.append(("post", self, (x, residual, post, comb), None, flags, torch.is_grad_enabled()))
            return ref.post(x, residual, post.unsqueeze(-1), comb)

    install_fakes(monkeypatch, {
        "sglang.srt.environ": {"envs": envs},
        "sglang.srt.layers.layernorm": {"RMSNorm": RMSNorm},
        "sglang.srt.models.deepseek_v4": {"DeepseekV4DecoderLayer": DeepseekV4DecoderLayer},
        "sglang.srt.utils.common": {"is_sm120_supported": lambda: state.sm120, "is_hip": lambda: state.hip},
    })  # fmt: skip
    monkeypatch.setattr(sglang_context_module, "sglang_context", no_context)
    return state


def test_sglang_pre_runs_the_layers_hc_pre_with_each_sites_norm(sglang_fake):
    prepared = sgl.prepare(case("pre"), "sglang_tilelang_mhc_pre", "cpu", 2)
    assert prepared.kernel_source == "sglang_tilelang_mhc_pre" and sglang_fake.calls == []
    (attn_norm, *_), (ffn_norm, *_) = sglang_fake.norms
    assert [n[1:] for n in sglang_fake.norms] == [(HIDDEN, 1e-6, {})] * 2 and attn_norm is not ffn_norm
    contexts = sglang_fake.contexts
    prepared.call()
    prepared.call()
    assert sglang_fake.contexts == contexts + 2  # SGLang's server args installed around each call
    pres = sglang_fake.calls
    assert [c[0] for c in pres] == ["pre"] * 4
    for _, layer, tensors, _, flags, grad in pres:
        assert isinstance(layer, sgl.HcLayer) and (layer.hc_mult, layer.hc_sinkhorn_iters) == (HC, ITERS)
        assert (layer.hc_eps, layer.rms_norm_eps) == (1e-6, 1e-6) and grad is False
        check_site(*tensors)
        # the defaults stand on SM90, the start-up prewarm is off for the call
        assert flags == {**dict.fromkeys(FLAGS[:3], True), sgl.PREWARM: False}
    assert [c[3] for c in pres] == [attn_norm, ffn_norm] * 2  # input_layernorm, then post_attention_layernorm
    assert pres[0][2][0] is not pres[2][2][0]  # two input sets
    assert not any(name in os.environ for name in FLAGS)  # every flag restored after the call


def test_sglang_on_sm120_times_the_hooks_torch_pre_and_labels_it(sglang_fake):
    sglang_fake.sm120 = True
    prepared = sgl.prepare(case("pre"), "sglang_torch_mhc_pre", "cpu", 1)
    assert prepared.kernel_source == "sglang_torch_mhc_pre"
    prepared.call()
    flags = sglang_fake.calls[0][4]
    assert flags[sgl.TILELANG_PRE] is False and flags[sgl.DEEPGEMM_PRENORM] is False and flags[sgl.TILELANG_POST]
    assert sgl.prepare(case("post"), "x", "cpu", 1).kernel_source == "sglang_tilelang_mhc_post"
    assert not any(name in os.environ for name in FLAGS)


def test_sglang_keeps_a_flag_the_hook_does_not_touch(sglang_fake, monkeypatch):
    monkeypatch.setenv(sgl.TILELANG_POST, "0")  # a deployment's own setting: no hook overrides it on SM90
    assert sgl.prepare(case("post"), "x", "cpu", 1).kernel_source == "sglang_torch_mhc_post"
    monkeypatch.setenv(sgl.TILELANG_PRE, "0")
    assert sgl.prepare(case("pre"), "x", "cpu", 1).kernel_source == "sglang_deepgemm_mhc_pre"
    assert os.environ[sgl.TILELANG_PRE] == "0" and sgl.PREWARM not in os.environ


def test_sglang_post_runs_hc_post_on_what_hc_pre_made(sglang_fake):
    prepared = sgl.prepare(case("post"), "sglang_tilelang_mhc_post", "cpu", 1)
    made = list(sglang_fake.calls)
    assert [c[0] for c in made] == ["pre", "pre"] and all(c[5] is False for c in made)
    sglang_fake.calls.clear()
    prepared.call()
    posts = sglang_fake.calls
    assert [c[0] for c in posts] == ["post", "post"]
    for (_, layer, (x, residual, post, comb), _, flags, grad), pre_call in zip(posts, made):
        want_post, want_comb, want_x = ref.pre(*pre_call[2], ITERS)
        assert residual is pre_call[2][0] and isinstance(layer, sgl.HcLayer) and grad is False
        assert tuple(x.shape) == (T, HIDDEN) and torch.equal(x, want_x)
        assert tuple(post.shape) == (T, HC) and torch.equal(post, want_post.squeeze(-1))  # hc_pre's squeezed post
        assert tuple(comb.shape) == (T, HC, HC) and torch.equal(comb, want_comb)
        assert flags[sgl.TILELANG_POST] is True


def test_sglang_hook_flags_and_labels():
    assert sgl.hook_flags(False, False) == {sgl.PREWARM: False}
    assert sgl.hook_flags(True, False) == {sgl.PREWARM: False, sgl.TILELANG_PRE: False, sgl.DEEPGEMM_PRENORM: False}
    hip = sgl.hook_flags(False, True)
    assert hip[sgl.TILELANG_POST] is False and hip[sgl.TILELANG_PRE] is False and hip[sgl.DEEPGEMM_PRENORM] is False
    assert sgl.kernel_label("pre", False, False, True) == "sglang_torch_mhc_pre"
    assert sgl.kernel_label("post", False, False, True) == "sglang_tilelang_mhc_post"


def _self_reads(func: ast.FunctionDef) -> set[str]:
    loads, stores = set(), set()
    for node in ast.walk(func):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            (stores if isinstance(node.ctx, ast.Store) else loads).add(node.attr)
    return loads - stores


def _sglang_source(rel: str) -> str:
    unpacked = sorted(WHEELS.glob("sglang-0.5.14-*.unpacked"))
    if unpacked and (unpacked[-1] / rel).is_file():
        return (unpacked[-1] / rel).read_text()
    wheels = sorted(WHEELS.glob("sglang-0.5.14-*.whl"))
    if not wheels:
        pytest.skip("no pinned SGLang wheel in .cache/wheels; `nox -s contract-sglang` downloads it (.ci/run does)")
    from opcollect.backends.symbols import Release

    return Release(wheels[-1]).files[rel]


def test_the_pinned_sglang_layer_methods_flags_and_hook_are_what_the_runner_models():
    model = ast.parse(_sglang_source("sglang/srt/models/deepseek_v4.py"))
    layer = next(n for n in model.body if isinstance(n, ast.ClassDef) and n.name == "DeepseekV4DecoderLayer")
    methods = {n.name: n for n in layer.body if isinstance(n, ast.FunctionDef)}
    held = set(sgl.HcLayer.__dataclass_fields__)
    for name in ("hc_pre", "hc_post"):
        assert _self_reads(methods[name]) <= held, (name, _self_reads(methods[name]) - held)
    assert [a.arg for a in methods["hc_pre"].args.args][:6] == ["self", "x", "hc_fn", "hc_scale", "hc_base", "norm"]
    assert [a.arg for a in methods["hc_post"].args.args] == ["self", "x", "residual", "post", "comb"]
    environ = _sglang_source("sglang/srt/environ.py")
    for name in FLAGS:
        assert f"    {name} = EnvBool(True)" in environ, name
    # the DeepSeek-V4 hook's SM120 and HIP branches set exactly the flags hook_flags models (beside the prewarm)
    server = ast.parse(_sglang_source("sglang/srt/server_args.py"))
    branches = {}
    for node in ast.walk(server):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Call):
            test = ast.unparse(node.test)
            if test in ("is_sm120_supported()", "is_hip()") and sgl.TILELANG_PRE in ast.unparse(node):
                branches.setdefault(test, node)
    for test, (sm120, hip) in (("is_sm120_supported()", (True, False)), ("is_hip()", (False, True))):
        text = "\n".join(ast.unparse(s) for s in branches[test].body)
        set_off = {f for f in FLAGS if f"envs.{f}.set(False)" in text}
        assert set_off == set(sgl.hook_flags(sm120, hip)) - {sgl.PREWARM}, test


# ---------------------------------------------------------------- TensorRT-LLM

TRT_KEPT = {
    "_torch/modules/mhc/hyper_connection.py": (
        "class mHC(nn.Module):\n"
        "    def pre_mapping(self, x):\n"
        "        post_mix, comb_mix, layer_input = mhc_pre_mapping_fused_cuda(x, self.fn)\n"
        "    def post_mapping(self, x, residual, post_layer_mix, comb_res_mix):\n"
        "        out = mhc_post_mapping_cuda(residual, x, post_layer_mix, comb_res_mix, n)\n"
    ),
    "_torch/modules/mhc/mhc_cuda.py": (
        "class MhcPreMappingRunner(TunableRunner):\n"
        "    def forward(self, inputs, *, tactic=-1, **kwargs):\n"
        "        if backend == 'dg_splitk':\n"
        "            y_acc, r_acc, num_splits = mhc_gemm_rms_dg_cuda(x, w_t, M, N, K, num_splits=_DG_NUM_SPLITS)\n"
        "        else:\n"
        "            y_acc, r_acc = mhc_gemm_rms_fma_cuda(x, None, M, N, K, w_t=w_t, tile_n=tile_n, tile_m=tile_m)\n"
        "        mhc_big_fuse_cuda(y_acc, r_acc, residual_3d)\n"
        "def mhc_pre_mapping_fused(x, w_t, residual, n):\n"
        "    _, best = tuner.choose_one('trtllm::mhc_pre_mapping', [runner], MhcPreMappingRunner.tuning_config)\n"
    ),
}


def _trt_tree(root: Path, changes=()) -> Path:
    for rel, text in TRT_KEPT.items():
        for old, new in (c[1:] for c in changes if c[0] == rel):
            assert old in text
            text = text.replace(old, new)
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.fixture
def trt_fake(tmp_path, monkeypatch):
    """tensorrt_llm's mHC module, its mhc_cuda entry points, the AutoTuner's autotune() and the torch ops, as stand-ins
    that behave as the cited sources do: pre_mapping takes the tuned tactic (the fallback on a cache miss) and runs
    its GEMM + square sum through the entry point looked up in mhc_cuda at the call."""
    root = _trt_tree(tmp_path / "tensorrt_llm")
    monkeypatch.setattr(torch_ops, "installed_root", lambda: root)
    torch_ops._installed_problems.cache_clear()
    state = SimpleNamespace(calls=[], tuning=False, best=("dg_splitk", 0, 0, 256), cache={}, sites=[])
    entries = {}

    def mhc_gemm_rms_dg_cuda(x, w_nk, M, N, K, num_splits=16):
        state.calls.append(("dg", num_splits))

    def mhc_gemm_rms_fma_cuda(x, w, M, N, K, w_t=None, tile_n=0, tile_m=0):
        state.calls.append(("fma", tile_n))

    @contextmanager
    def autotune(tune_mode=True, cache_path=None):
        state.tuning = True
        try:
            yield
        finally:
            state.tuning = False

    class mHC(torch.nn.Module):  # hyper_connection.py: its parameters, pre_mapping's asserts and calls
        def __init__(self, mult, hidden_size, sinkhorn_iters, dtype=None, eps=1e-6, norm_eps=1e-6, sinkhorn_eps=1e-6,
                     post_mult_value=1.0, n_splits=1):  # fmt: skip
            super().__init__()
            self.mult, self.hidden_size, self.sinkhorn_iters, self.eps = mult, hidden_size, sinkhorn_iters, eps
            mix = (2 + mult) * mult
            self.fn = torch.nn.Parameter(torch.empty(mix, mult * hidden_size), requires_grad=False)
            self.base = torch.nn.Parameter(torch.empty(mix), requires_grad=False)
            self.scale = torch.nn.Parameter(torch.empty(3), requires_grad=False)
            state.sites.append(self)

        def pre_mapping(self, x):
            assert x.dtype == torch.bfloat16 and x.shape[-2:] == (self.mult, self.hidden_size)
            check_site(x, self.fn, self.scale, self.base, self.hidden_size)
            bucket = x.shape[0]
            if state.tuning:
                state.calls.append(("tune", self, x))
                state.cache[bucket] = state.best
            backend, tile_n, _, _ = state.cache.get(bucket, ("fma", 0, 0, 0))
            cuda = entries["module"]
            m, k = x.shape[0], self.mult * self.hidden_size
            if backend == "fma":
                cuda.mhc_gemm_rms_fma_cuda(x, None, m, self.fn.shape[0], k, w_t=self.fn, tile_n=tile_n, tile_m=1)
            else:
                splits = 16 if backend == "dg_splitk" else 1
                cuda.mhc_gemm_rms_dg_cuda(x, self.fn, m, self.fn.shape[0], k, num_splits=splits)
            state.calls.append(("pre", self, x, torch.is_grad_enabled()))
            return ref.pre(x, self.fn, self.scale, self.base, self.sinkhorn_iters, self.eps, 1.0)

        def post_mapping(self, x, residual, post_layer_mix, comb_res_mix):
            state.calls.append(("post", self, (x, residual, post_layer_mix, comb_res_mix), torch.is_grad_enabled()))
            return ref.post(x, residual, post_layer_mix, comb_res_mix)

    install_fakes(monkeypatch, {
        "tensorrt_llm._torch.custom_ops": {},
        "tensorrt_llm._torch.autotuner": {"autotune": autotune},
        "tensorrt_llm._torch.modules.mhc.hyper_connection": {"mHC": mHC},
        "tensorrt_llm._torch.modules.mhc.mhc_cuda": {
            "mhc_gemm_rms_dg_cuda": mhc_gemm_rms_dg_cuda, "mhc_gemm_rms_fma_cuda": mhc_gemm_rms_fma_cuda},
    })  # fmt: skip
    entries["module"] = sys.modules["tensorrt_llm._torch.modules.mhc.mhc_cuda"]
    state.originals = (mhc_gemm_rms_fma_cuda, mhc_gemm_rms_dg_cuda)
    ops = {name: object() for name in ("mhc_gemm_sqrsum_fma", "mhc_big_fuse", "mhc_post_mapping")}
    monkeypatch.setattr(torch.ops, "trtllm", SimpleNamespace(**ops), raising=False)
    yield state
    torch_ops._installed_problems.cache_clear()


@pytest.mark.parametrize(
    ("best", "label"),
    [
        (("dg_splitk", 0, 0, 256), "trtllm_mhc_pre_dg_splitk"),
        (("dg_nosplit", 0, 0, 512), "trtllm_mhc_pre_dg_nosplit"),
        (("fma", 8, 2, 128), "trtllm_mhc_pre_fma"),
    ],
)
def test_trtllm_pre_tunes_both_sites_then_reports_the_tactic_that_ran(trt_fake, best, label):
    trt_fake.best = best
    prepared = trt.prepare(case("pre"), "trtllm_mhc_pre_fma", "cpu", 2)
    assert prepared.kernel_source == label  # the observed tactic, whatever the plan predicted
    kinds = [c[0] for c in trt_fake.calls]
    first_site, second_site = trt_fake.sites[:2]
    # autotune() over copy 0's two sites first (serving's warm-up), then the observed call of each
    assert [c[1] for c in trt_fake.calls if c[0] == "tune"] == [first_site, second_site]
    assert kinds.index("tune") == 0 and kinds.count("pre") == 4
    assert all(grad is False for kind, *rest, grad in trt_fake.calls if kind == "pre")
    module = sys.modules["tensorrt_llm._torch.modules.mhc.mhc_cuda"]
    assert (module.mhc_gemm_rms_fma_cuda, module.mhc_gemm_rms_dg_cuda) == trt_fake.originals  # the spies are gone
    trt_fake.calls.clear()
    prepared.call()
    pres = [c for c in trt_fake.calls if c[0] == "pre"]
    assert len(pres) == 2 and {c[1] for c in pres} == set(trt_fake.sites[2:4])  # the second copy's two sites
    assert all(c[3] is False for c in pres)
    want = ("fma", best[1]) if best[0] == "fma" else ("dg", 16 if best[0] == "dg_splitk" else 1)
    assert [c for c in trt_fake.calls if c[0] in ("fma", "dg")] == [want, want]
    for site in trt_fake.sites:
        assert (site.mult, site.hidden_size, site.sinkhorn_iters) == (HC, HIDDEN, ITERS)


def test_trtllm_pre_without_a_tuned_tactic_reports_the_fallback(trt_fake, monkeypatch):
    @contextmanager
    def no_tuning(tune_mode=True, cache_path=None):
        yield  # an autotune() that profiled nothing: every call misses the cache

    monkeypatch.setattr(sys.modules["tensorrt_llm._torch.autotuner"], "autotune", no_tuning)
    assert trt.prepare(case("pre"), "x", "cpu", 1).kernel_source == "trtllm_mhc_pre_fma"


def test_trtllm_post_maps_what_pre_mapping_made(trt_fake):
    prepared = trt.prepare(case("post"), "trtllm_mhc_post_mapping", "cpu", 1)
    assert prepared.kernel_source == "trtllm_mhc_post_mapping"
    assert not any(c[0] == "tune" for c in trt_fake.calls)  # one kernel, no tactics: nothing tuned
    made = [c for c in trt_fake.calls if c[0] == "pre"]
    trt_fake.calls.clear()
    prepared.call()
    posts = [c for c in trt_fake.calls if c[0] == "post"]
    assert len(posts) == 2 and [c[1] for c in posts] == [c[1] for c in made]
    for (_, site, (x, residual, post_mix, comb), grad), pre_call in zip(posts, made):
        want_post, want_comb, want_x = ref.pre(pre_call[2], site.fn, site.scale, site.base, ITERS, 1e-6, 1.0)
        assert residual is pre_call[2] and grad is False
        assert torch.equal(x, want_x) and tuple(x.shape) == (T, HIDDEN)
        assert torch.equal(post_mix, want_post) and torch.equal(comb, want_comb)


def test_trtllm_tactic_labels_read_the_deepgemm_splits_as_called():
    def dg(x, w_nk, M, N, K, num_splits=16):
        return None

    def fma(x, w, M, N, K, w_t=None, tile_n=0, tile_m=0):
        return None

    module = SimpleNamespace(mhc_gemm_rms_dg_cuda=dg, mhc_gemm_rms_fma_cuda=fma)

    def run():
        module.mhc_gemm_rms_dg_cuda(1, 2, 3, 4, 5)  # the signature's default: 16 splits
        module.mhc_gemm_rms_dg_cuda(1, 2, 3, 4, 5, 1)
        module.mhc_gemm_rms_fma_cuda(1, None, 3, 4, 5, w_t=2)

    assert trt.tactic_labels(module, run) == ["dg_splitk", "dg_nosplit", "fma"]
    assert module.mhc_gemm_rms_dg_cuda is dg and module.mhc_gemm_rms_fma_cuda is fma
    assert trt.pre_label(["fma", "dg_splitk", "fma"]) == "trtllm_mhc_pre_dg_splitk+fma"  # the collector's join
    with pytest.raises(RuntimeError, match="neither"):
        trt.pre_label([])


def test_trtllm_refuses_sources_or_ops_that_no_longer_serve_what_it_times(trt_fake, tmp_path, monkeypatch):
    assert torch_ops.problems(_trt_tree(tmp_path / "ok"), "mhc") == []
    changed = ("_torch/modules/mhc/mhc_cuda.py", "mhc_gemm_rms_dg_cuda(x", "mhc_gemm_rms_tf32_cuda(x")
    with pytest.raises(KernelLimit, match="MhcPreMappingRunner.forward no longer uses mhc_gemm_rms_dg_cuda"):
        torch_ops.check_installed("mhc", _trt_tree(tmp_path / "broken", [changed]))
    monkeypatch.setattr(torch.ops, "trtllm", SimpleNamespace(mhc_big_fuse=1), raising=False)
    with pytest.raises(KernelLimit, match="torch.ops.trtllm.mhc_post_mapping"):
        trt.prepare(case("post"), "x", "cpu", 1)
    assert trt_fake.sites == []  # refused before any module is built


# ---------------------------------------------------------------- all three


def test_footprints_by_hand():
    t, h = 1000, 4096
    wide, weights = t * 4 * h * 2, 24 * (4 * h + 1) * 4 + 12
    outputs = t * 4 * 4 + t * 16 * 4 + t * h * 2
    # vLLM: 16 token tiles of 64 on up to 160 SMs -> 10 K splits (of at most 16384 / 64 / 4 = 64)
    assert vll.max_splits(t, 4 * h) == 10 and vll.max_splits(1, 4 * h) == 64 and vll.max_splits(10**6, 4 * h) == 1
    assert vll.footprint(case("pre", t, h)) == 2 * (wide + weights + outputs + 10 * t * 25 * 4)
    assert vll.footprint(case("post", t, h)) == 2 * (2 * wide + outputs)
    # SGLang: the tilelang split-K partials (32 x 33 per token) outweigh DeepGEMM's 10 x 25; the norm weight
    assert sgl.footprint(case("pre", t, h)) == 2 * (wide + weights + h * 2 + outputs + 32 * 33 * t * 4)
    assert sgl.footprint(case("post", t, h)) == vll.footprint(case("post", t, h))
    # TensorRT-LLM: dg_splitk's 16 partials; post keeps each site's module
    assert trt.footprint(case("pre", t, h)) == 2 * (weights + wide + outputs + 16 * t * 25 * 4)
    assert trt.footprint(case("post", t, h)) == 2 * (weights + 2 * wide + outputs)
    for module in (vll, sgl, trt):
        with pytest.raises(KernelLimit, match="no op 'mid'"):
            module.footprint(case("mid"))
    assert not any(m in sys.modules for m in ("vllm", "sglang", "tensorrt_llm"))


def test_each_backend_registers_its_mhc_runner():
    import opcollect.backends.sglang as sglang_backend
    import opcollect.backends.trtllm as trtllm_backend
    import opcollect.backends.vllm as vllm_backend

    assert vllm_backend.RUNNERS.find("mhc", VLLM_PRE).prepare is (vll.prepare)
    assert sglang_backend.RUNNERS.find("mhc", "sglang_tilelang_mhc_post").prepare is sgl.prepare
    for version in ("1.3.0rc20", "1.3.0rc23"):
        assert trtllm_backend.RUNNERS.find("mhc", "trtllm_mhc_pre_dg_splitk", version).prepare is trt.prepare


@pytest.mark.parametrize(
    ("backend", "label", "ran", "lies"),
    [
        ("vllm", VLLM_PRE, "mhc_pre_big_fuse_tilelang_kernel", False),
        ("vllm", VLLM_PRE, "mhc_post_tilelang_kernel", True),
        ("vllm", VLLM_POST, "mhc_post_tilelang_kernel", False),
        ("vllm", VLLM_POST, "mhc_pre_big_fuse_tilelang_kernel", True),
        ("sglang", "sglang_tilelang_mhc_pre", "mhc_pre_big_fuse_with_norm_tilelang_kernel", False),
        ("sglang", "sglang_tilelang_mhc_pre", "hc_split_sinkhorn_kernel__kernel", True),
        ("sglang", "sglang_torch_mhc_pre", "hc_split_sinkhorn_kernel__kernel", False),
        ("sglang", "sglang_tilelang_mhc_post", "mhc_pre_big_fuse_with_norm_tilelang_kernel", True),
        ("trtllm", "trtllm_mhc_pre_fma", "void tensorrt_llm::kernels::mhc::mhcGemmSqrsumFmaKernel<8>(", False),
        ("trtllm", "trtllm_mhc_pre_fma", "void deep_gemm::sm90_tf32_hc_prenorm_gemm_impl<24u, 16384u>", True),
        ("trtllm", "trtllm_mhc_pre_dg_splitk", "void deep_gemm::sm90_tf32_hc_prenorm_gemm_impl<24u, 16384u>", False),
        ("trtllm", "trtllm_mhc_post_mapping", "tensorrt_llm::kernels::mhc::mhcPostMappingKernel(", False),
        ("trtllm", "trtllm_mhc_post_mapping", "void tensorrt_llm::kernels::mhc::mhcBigFuseKernel<1, 256, false>", True),
    ],
)  # fmt: skip
def test_mhc_labels_tell_the_kernels_apart(backend, label, ran, lies):
    assert kt.contradicts_label(backend, label, [ran], "mhc") is lies
