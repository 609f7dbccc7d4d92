"""The SGLang MoE runner's prepare and the SGLang context against a fake sglang that records what it is given: the
layer built as a real EP rank, SGLang's TopK per model in the timed call, routing drawn on the CPU, and DeepGEMM's
JIT precompile off before SGLang reads it. The real sglang needs a GPU for these paths."""

from __future__ import annotations

import enum
import importlib.abc
import importlib.machinery
import os
import sys
import types
from contextlib import contextmanager

import pytest
from conftest import install_fakes

from opcollect.backends.sglang import context, moe, moe_routing
from opcollect.plans.moe import MoeCase

torch = pytest.importorskip("torch")

PARALLEL_FIELDS = ("tp_size", "moe_tp_size", "moe_tp_rank", "moe_ep_size", "moe_ep_rank")
RoutingMethodType = enum.IntEnum(
    "RoutingMethodType", ["Default", "Renormalize", "DeepSeekV3", "Llama4", "RenormalizeNaive"]
)


class FakeParallel:
    """get_parallel(): the one-rank world's values unless overridden, as runtime_context.ParallelContext."""

    def __init__(self):
        self.values = dict.fromkeys(PARALLEL_FIELDS, 1) | {"moe_tp_rank": 0, "moe_ep_rank": 0}

    @contextmanager
    def override(self, **fields):
        saved = dict(self.values)
        self.values.update(fields)
        try:
            yield self
        finally:
            self.values = saved


@pytest.fixture
def fake_sglang(monkeypatch):
    parallel = FakeParallel()
    record = {"layers": [], "topk": [], "calls": []}

    class FusedMoE:
        def __init__(self, **kwargs):
            self.kwargs, self.parallel = kwargs, dict(parallel.values)
            runner = types.SimpleNamespace(runner_backend=types.SimpleNamespace(value="triton"))
            self.quant_method = types.SimpleNamespace(runner=runner, process_weights_after_loading=lambda layer: None)
            self.should_fuse_routed_scaling_factor_in_topk = False
            record["layers"].append(self)

        def eval(self):
            return self

        def requires_grad_(self, flag):
            return self

        def named_parameters(self, recurse=True):
            return iter(())

        def __call__(self, hidden, topk_output):
            record["calls"].append(("experts", topk_output, dict(parallel.values)))

    class TopK:
        def __init__(self, top_k, **kwargs):
            self.kwargs = {"top_k": top_k, **kwargs}
            record["topk"].append(self)

        def __call__(self, hidden, logits):
            record["calls"].append(("topk", logits))
            return ("topk_output", len(record["calls"]))

    install_fakes(monkeypatch, {
        "sglang.srt.layers.moe.fused_moe_triton.layer": {"FusedMoE": FusedMoE},
        "sglang.srt.layers.moe.topk": {"TopK": TopK},
        "sglang.srt.layers.moe.utils": {"RoutingMethodType": RoutingMethodType,
                                        "get_moe_runner_backend": lambda: types.SimpleNamespace(value="auto")},
        "sglang.srt.utils": {"is_triton_kernels_available": lambda: False},
        "sglang.srt.runtime_context": {"get_parallel": lambda: parallel},
    })  # fmt: skip

    @contextmanager
    def no_context(device, **server_args):
        record.setdefault("server_args", []).append(server_args)
        yield server_args

    monkeypatch.setattr(context, "sglang_context", no_context)
    monkeypatch.setattr(moe, "sm_major", lambda device: 9)
    monkeypatch.setattr(moe, "_fill", lambda layer, layout, device, seed: None)
    import opcollect.runtime.timing as timing

    monkeypatch.setattr(timing, "random_tensor", lambda shape, dtype, device, seed=0: torch.zeros(shape, device=device))
    return record


def case(dtype="bfloat16", tokens=16, hidden=256, inter=512, topk=2, experts=8, tp=1, ep=1, dist="power_law_1.2"):
    return MoeCase(dtype, tokens, hidden, inter, topk, experts, tp, ep, dist)


def test_layer_is_a_real_ep_rank(fake_sglang):
    prepared = moe.prepare(case(tp=2, ep=4, experts=16), "x", "cpu", 1)
    (layer,) = fake_sglang["layers"]
    # the global expert count and inter size: FusedMoE divides them by the ep and tp it reads from get_parallel
    assert layer.kwargs["num_experts"] == 16 and layer.kwargs["intermediate_size"] == 512
    expected = {"tp_size": 8, "moe_tp_size": 2, "moe_tp_rank": 0, "moe_ep_size": 4, "moe_ep_rank": 0}
    assert layer.parallel == expected
    prepared.call()
    assert fake_sglang["calls"][-1][0] == "experts" and fake_sglang["calls"][-1][2] == expected


def test_routing_is_drawn_on_the_cpu_outside_the_device_context(fake_sglang, monkeypatch):
    """On a GPU, routing inside torch.device("cuda") puts torch.arange on the GPU while the generator stays on the
    CPU, and torch.multinomial raises. "meta" stands in for the GPU here."""
    import opcollect.backends.torch.moe as torch_moe

    real, seen = torch_moe.routing, []

    def spy(c):
        seen.append(torch.empty(0).device.type)
        return real(c)

    monkeypatch.setattr(torch_moe, "routing", spy)
    moe.prepare(case(), "x", "meta", 1).call()
    assert seen == ["cpu"]
    logits = fake_sglang["calls"][0][1]
    assert logits.device.type == "meta" and tuple(logits.shape) == (16, 8)


def test_router_logits_pick_the_routing_under_any_device_context():
    from opcollect.backends.torch.moe import routing

    c = case(tokens=64, topk=4, experts=16, ep=4)
    with torch.device("meta"):
        logits = moe_routing.router_logits(c)
    assert logits.device.type == "cpu" and logits.dtype == torch.float32 and tuple(logits.shape) == (64, 16)
    picked = torch.topk(logits, 4, dim=-1).indices.sort(-1).values
    assert torch.equal(picked, routing(c).sort(-1).values)
    assert torch.equal(logits.sum(-1), torch.full((64,), 4.0))  # 1 at each chosen expert, 0 elsewhere


def test_topk_layer_per_model_and_in_the_timed_call(fake_sglang):
    deepseek = case(hidden=7168, inter=2048, topk=8, experts=256, ep=8)  # the routing follows the shape
    prepared = moe.prepare(deepseek, "x", "cpu", 1)
    (topk,) = fake_sglang["topk"]
    kw = topk.kwargs
    assert kw["output_format"] is None  # SGLang's TopK picks the format the installed runner backend consumes
    assert (kw["top_k"], kw["use_grouped_topk"], kw["num_expert_group"], kw["topk_group"]) == (8, True, 8, 4)
    assert kw["scoring_func"] == "sigmoid" and kw["routed_scaling_factor"] == 2.5 and kw["renormalize"]
    assert torch.equal(kw["correction_bias"], torch.zeros(256))
    (layer,) = fake_sglang["layers"]
    assert layer.kwargs["routing_method_type"] == RoutingMethodType.DeepSeekV3
    assert layer.kwargs["routed_scaling_factor"] == 2.5
    assert fake_sglang["calls"] == []
    prepared.call()
    (kind, logits), (experts, topk_output, _) = fake_sglang["calls"]
    assert kind == "topk" and experts == "experts" and topk_output == ("topk_output", 1)  # top-k timed with experts


def test_topk_outside_the_timed_call_only_where_the_reference_prebuilds_it(fake_sglang):
    # default routing on the Triton runner at EP > 1: the reference's raw Triton path times prebuilt top-k outputs
    prepared = moe.prepare(case(ep=2), "x", "cpu", 2)
    assert [c[0] for c in fake_sglang["calls"]] == ["topk", "topk"]  # one per input copy, at prepare
    prepared.call()
    assert [c[0] for c in fake_sglang["calls"][2:]] == ["experts"]
    assert fake_sglang["calls"][2][1] == ("topk_output", 2)
    spec = moe_routing.DEFAULT
    assert moe_routing.topk_timed(spec, case(ep=1), "sglang_fused_moe_triton")
    assert moe_routing.topk_timed(spec, case("w4a16_mxfp4", ep=2), "sglang_fused_moe_triton")
    assert moe_routing.topk_timed(spec, case(ep=2), "sglang_flashinfer_cutlass_moe")


def test_router_specs_follow_the_reference_cases():
    assert moe_routing.router_spec(case(hidden=2880, inter=2880, topk=4, experts=32)) == moe_routing.DEFAULT
    kimi = moe_routing.router_spec(case(hidden=7168, inter=2048, topk=8, experts=384))
    assert (kimi.num_expert_group, kimi.topk_group, kimi.routed_scaling_factor) == (1, 1, 2.827)
    qwen = moe_routing.router_spec(case(hidden=2048, inter=512, topk=8, experts=256))
    assert qwen.routing_method_type == "RenormalizeNaive" and qwen.scoring_func == "softmax"
    assert all(s.routing_method_type in (None, *RoutingMethodType.__members__) for s in moe_routing.SPECS.values())


class _CompileUtilsFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """compile_utils as SGLang writes it: the precompile switch read from the environment once, at import."""

    NAME = "sglang.srt.layers.deep_gemm_wrapper.compile_utils"

    def find_spec(self, name, path, target=None):
        return importlib.machinery.ModuleSpec(name, self) if name == self.NAME else None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module._ENABLE_JIT_DEEPGEMM_PRECOMPILE = os.environ.get("SGLANG_JIT_DEEPGEMM_PRECOMPILE", "1") != "0"


@pytest.mark.parametrize("before", [None, "1"])
def test_deepgemm_precompile_is_off_before_sglang_reads_it_and_restored(monkeypatch, before):
    seen = {}

    class ServerArgs:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    def installed(args):
        seen["env"] = os.environ.get("SGLANG_JIT_DEEPGEMM_PRECOMPILE")
        seen["module"] = sys.modules[_CompileUtilsFinder.NAME]._ENABLE_JIT_DEEPGEMM_PRECOMPILE

    install_fakes(monkeypatch, {
        "sglang.srt.layers.moe.utils": {"MOE_RUNNER_BACKEND": "before"},
        "sglang.srt.layers.moe": {"initialize_moe_config": installed},
        "sglang.srt.layers.quantization.fp4_utils": {"FP4_GEMM_RUNNER_BACKEND": 4,
                                                     "initialize_fp4_gemm_config": lambda a: None},
        "sglang.srt.layers.quantization.fp8_utils": {"FP8_GEMM_RUNNER_BACKEND": 8,
                                                     "initialize_fp8_gemm_config": lambda a: None},
        "sglang.srt.server_args": {"_global_server_args": None, "ServerArgs": ServerArgs,
                                   "set_global_server_args_for_scheduler": lambda a: None},
        "sglang.srt.layers.deep_gemm_wrapper": {},
    })  # fmt: skip
    monkeypatch.delitem(sys.modules, _CompileUtilsFinder.NAME, raising=False)
    monkeypatch.setattr(sys, "meta_path", [_CompileUtilsFinder(), *sys.meta_path])
    monkeypatch.setattr(context, "_initialised", {"cpu"})
    if before is None:
        monkeypatch.delenv("SGLANG_JIT_DEEPGEMM_PRECOMPILE", raising=False)
    else:
        monkeypatch.setenv("SGLANG_JIT_DEEPGEMM_PRECOMPILE", before)
    with context.sglang_context("cpu", moe_runner_backend="auto"):
        pass
    assert seen == {"env": "0", "module": False}  # read as off at SGLang's first import of compile_utils
    assert os.environ.get("SGLANG_JIT_DEEPGEMM_PRECOMPILE") == before  # the variable as it was
    # imported earlier with the switch on (another runner in the worker): the module's copy is turned off too
    sys.modules[_CompileUtilsFinder.NAME]._ENABLE_JIT_DEEPGEMM_PRECOMPILE = True
    with context.sglang_context("cpu", moe_runner_backend="auto"):
        pass
    assert seen["module"] is False and sys.modules[_CompileUtilsFinder.NAME]._ENABLE_JIT_DEEPGEMM_PRECOMPILE is True


QWEN3 = {"hidden": 4096, "inter": 1536, "topk": 8, "experts": 128}  # Qwen3-235B-A22B's experts


@pytest.mark.parametrize("dtype", ["bfloat16", "fp8", "fp8_block"])
def test_runner_backend_is_what_the_plan_dispatch_names_at_sm100(fake_sglang, monkeypatch, dtype):
    """ServerArgs gives Qwen3 MoE flashinfer_trtllm on SM100 (server_args.py:4152-4177); the plan reads that from
    SGLang's selection and the runner installs what the plan row names, not its own hand rule (auto)."""
    from opcollect.plans.moe import _sglang, _sglang_case

    monkeypatch.setattr(moe, "sm_major", lambda device: 10)
    monkeypatch.setattr(moe, "quant_config", lambda dtype: None)  # the fake FusedMoE takes any quant config
    c = case(dtype, **QWEN3)
    dispatch = _sglang_case("100", _sglang("100", types.SimpleNamespace(dtype=dtype)), c)
    assert dispatch == "sglang_flashinfer_trtllm_moe"
    moe.prepare(c, dispatch, "cpu", 1)
    assert fake_sglang["server_args"][0]["moe_runner_backend"] == "flashinfer_trtllm"


def test_server_backend_follows_the_label_and_keeps_auto_where_auto_resolves_to_it():
    deepseek_v4_pro = {"hidden": 7168, "inter": 3072, "topk": 6, "experts": 384}
    gpt_oss = {"hidden": 2880, "inter": 2880, "topk": 4, "experts": 32}
    nemotron = {"hidden": 2688, "inter": 1856, "topk": 6, "experts": 128}
    rows = [  # (case, dispatch, SM major, --moe-runner-backend)
        (case("fp8_block", **QWEN3), "sglang_flashinfer_trtllm_moe", 10, "flashinfer_trtllm"),
        # DeepSeek-V4's own hook leaves auto (Triton) where the DeepSeek-V3 hand rule says flashinfer_trtllm
        (case("fp8_block", **deepseek_v4_pro), "sglang_fused_moe_triton", 10, "auto"),
        (case("nvfp4", **deepseek_v4_pro), "sglang_flashinfer_trtllm_routed_moe", 10, "flashinfer_trtllm_routed"),
        # NVFP4 auto resolves to flashinfer_trtllm on SM100: auto stays (the method differs when it is explicit)
        (case("nvfp4", **QWEN3), "sglang_flashinfer_trtllm_moe", 10, "auto"),
        (case("nvfp4", **nemotron), "sglang_flashinfer_trtllm_moe", 10, "flashinfer_trtllm"),  # its hook sets it
        (case("nvfp4", **nemotron), "sglang_marlin_moe", 9, "marlin"),
        (case("w4a16_mxfp4", **gpt_oss), "sglang_flashinfer_trtllm_moe", 10, "flashinfer_mxfp4"),  # shared label
        (case("bfloat16", **QWEN3), "sglang_fused_moe_triton", 9, "auto"),
        (case("bfloat16", **QWEN3), "bfloat16", 10, "auto"),  # no runner label: the hand rules
    ]
    for c, dispatch, sm, expected in rows:
        assert moe.server_backend(c, dispatch, sm) == expected, (c, dispatch, sm)
    # triton_kernel depends on the image's packages, which the plan does not see: the runtime's rule holds
    assert moe.server_backend(case("w4a16_mxfp4", **gpt_oss), "sglang_fused_moe_triton", 9, True) == "triton_kernel"
    assert moe.label_backend("sglang_marlin_moe_situ_as_silu", "w4a16_mxfp4") == "marlin"
    assert moe.label_backend("sglang_flashinfer_trtllm_moe", "nvfp4") == "flashinfer_trtllm"
    assert moe.label_backend("sglang_unknown_moe", "nvfp4") is None


def test_sm90_plan_labels_keep_the_runner_backend_of_the_hand_rules():
    """At SM90 the plan's labels (100% against the H200 reference, which has no NVFP4 rows) lead to what the hand
    rules installed."""
    from opcollect.plans.moe import _sglang, _sglang_case
    from opcollect.plans.selection_sglang import MOE_ARCHITECTURE

    for hidden, inter, topk, experts in [*MOE_ARCHITECTURE, (3584, 3072, 16, 896), (1024, 1024, 4, 64)]:
        for dtype in ("bfloat16", "fp8", "fp8_block", "int4_wo", "w4a16_mxfp4", "nvfp4"):
            if dtype == "nvfp4" and MOE_ARCHITECTURE.get((hidden, inter, topk, experts)) == "DeepseekV4ForCausalLM":
                continue  # its hook sets flashinfer_trtllm_routed on every SM (deepseek_v4_hook.py:62-67)
            for ep in (1, 8):
                c = case(dtype, hidden=hidden, inter=inter, topk=topk, experts=experts, ep=ep)
                dispatch = _sglang_case("90", _sglang("90", types.SimpleNamespace(dtype=dtype)), c)
                assert moe.server_backend(c, dispatch, 9) == moe.runner_backend(c, 9), (c, dispatch)


def test_runner_installs_what_auto_gives_where_the_plan_names_auto_s_runner():
    """NVFP4 at SM90 and generic int4 at SM100 are labelled Marlin, which "auto" resolves to in their quant methods
    (modelopt_quant.py:2317-2320, compressed_tensors.py:689-697): the runner leaves auto, so the method builds its
    own Marlin path; Kimi-K2.5's int4 keeps ServerArgs' flashinfer_trtllm and Kimi-K3 Marlin (with SiLU) at SM100."""
    from opcollect.plans.moe import _sglang, _sglang_case

    kimi_k25 = {"hidden": 7168, "inter": 2048, "topk": 8, "experts": 384}
    kimi_k3 = {"hidden": 3584, "inter": 3072, "topk": 16, "experts": 896}
    rows = [  # (case, SM, plan label, --moe-runner-backend, what the method runs)
        (case("nvfp4", **QWEN3), "90", "sglang_marlin_moe", "auto", "marlin"),
        (case("int4_wo", **QWEN3), "100", "sglang_marlin_moe", "auto", "marlin"),
        (case("int4_wo", **kimi_k25), "100", "sglang_flashinfer_trtllm_moe", "flashinfer_trtllm", "flashinfer_trtllm"),
        (case("w4a16_mxfp4", **kimi_k3), "100", "sglang_marlin_moe_situ_as_silu", "marlin", "marlin"),
        (case("w4a16_mxfp4", **kimi_k3), "90", "sglang_marlin_moe_situ_as_silu", "marlin", "marlin"),
    ]
    for c, sm, label, backend, runs in rows:
        dispatch = _sglang_case(sm, _sglang(sm, types.SimpleNamespace(dtype=c.moe_dtype)), c)
        assert dispatch == label, (c, sm)
        installed = moe.server_backend(c, dispatch, int(sm) // 10)
        assert installed == backend, (c, sm)
        assert (moe.auto_backend(c.moe_dtype, int(sm) // 10) if installed == "auto" else installed) == runs
