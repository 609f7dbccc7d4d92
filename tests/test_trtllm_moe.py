"""The TensorRT-LLM MoE runner's input builders on the CPU, against shapes worked out by hand from the case, and
over every moe case of the trtllm plans at SM 90 and 100. TensorRT-LLM is never imported: the builders are pure,
and prepare refuses what TensorRT-LLM cannot run before importing it."""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import cases_of

from opcollect.backends.trtllm import moe, moe_inputs
from opcollect.backends.trtllm.moe_inputs import (
    check_case,
    check_sm,
    choose_backend,
    footprint,
    kernel_label,
    moe_layout,
    split,
)
from opcollect.plans.moe import _NEMOTRON_H, MoeCase
from opcollect.plans.planner import PlanOptions
from opcollect.runtime.contract import KernelLimit

CLASSES = {
    "CUTLASS": "CutlassFusedMoE",
    "TRITON": "TritonFusedMoE",
    "TRTLLM": "TRTLLMGenFusedMoE",
    "DEEPGEMM": "DeepGemmFusedMoE",
}  # create_moe.py get_moe_cls


def case(dtype="bfloat16", tokens=16, hidden=256, inter=512, topk=2, experts=8, tp=1, ep=1, dist="balanced"):
    return MoeCase(dtype, tokens, hidden, inter, topk, experts, tp, ep, dist)


def shapes(specs) -> dict:
    return {name: (shape, dtype) for name, shape, dtype in specs}


def test_split_keeps_rank_zeros_share_of_experts_and_inter():
    assert split(case(tp=2)) == (8, 256)
    assert split(case(ep=4)) == (2, 512)
    assert split(case(tp=2, ep=4)) == (2, 256)  # TRT-LLM combines TP and EP


def test_layout_per_dtype_matches_hand_shapes():
    bf16 = moe_layout(case(tp=2), "CUTLASS")
    assert shapes(bf16.params) == {
        "w3_w1_weight": ((8, 512, 256), "bfloat16"),
        "w2_weight": ((8, 256, 256), "bfloat16"),
    }
    assert bf16.gated and not bf16.gpt_oss and bf16.checkpoint == ()
    # Relu2 experts: w1 only, inter rows (not 2 x inter)
    relu2 = moe_layout(case(hidden=2688, inter=1856, topk=6, experts=128), "CUTLASS")
    assert not relu2.gated and shapes(relu2.params)["w3_w1_weight"] == ((128, 1856, 2688), "bfloat16")

    fp8 = shapes(moe_layout(case("fp8", ep=2), "CUTLASS").params)
    assert fp8["w3_w1_weight"] == ((4, 1024, 256), "float8_e4m3fn") and fp8["fc31_dequant"] == ((4,), "float32")
    assert fp8["fc2_quant"] == ((), "float32") and fp8["fc31_input_dequant"] == ((), "float32")

    block = shapes(moe_layout(case("fp8_block", hidden=384, inter=256), "DEEPGEMM").params)
    # inter 256 -> 2 blocks (w3 and w1: 4), hidden 384 -> 3 blocks
    assert block["w3_w1_weight_scaling_factor"] == ((8, 4, 3), "float32")
    assert block["w2_weight_scaling_factor"] == ((8, 3, 2), "float32")

    fp4 = moe_layout(case("nvfp4"), "CUTLASS")
    assert fp4.scale_byte == 0x38
    fp4 = shapes(fp4.params)
    assert fp4["w3_w1_weight"] == ((8, 1024, 16), "int64")  # 256 / 16 fp4 per int64
    assert fp4["w3_w1_weight_scale"] == ((8, 1024, 4), "int32")  # 256 / 16 scales, 4 per int32
    assert fp4["w2_weight"] == ((8, 256, 32), "int64") and fp4["w2_weight_scale"] == ((8, 256, 8), "int32")


def test_mxfp4_layout_reads_the_full_checkpoint_and_pads_per_backend():
    gpt = case("w4a16_mxfp4", hidden=2880, inter=2880, topk=4, experts=32, ep=4)
    trtllm = moe_layout(gpt, "TRTLLM")
    assert trtllm.gpt_oss and trtllm.scale_byte == 127 and trtllm.local_experts == 8
    ckpt = shapes(trtllm.checkpoint)
    assert ckpt["w1.weight"] == ((2880, 1440), "uint8") and ckpt["w2.weight"] == ((2880, 1440), "uint8")
    assert ckpt["w1.weight_scale"] == ((2880, 90), "uint8") and ckpt["w2.weight_scale"] == ((2880, 90), "uint8")
    # 2880 rounded up to 3072 (256) for TRTLLMGen, 2944 (128) for CUTLASS
    assert shapes(trtllm.params)["w3_w1_weight"] == ((8, 6144, 1536), "uint8")
    cutlass = moe_layout(case("w4a16_mxfp4", hidden=3584, inter=3072, topk=16, experts=896, ep=8), "CUTLASS")
    assert {name for name, _, _ in cutlass.checkpoint} == {
        "w1.weight", "w3.weight", "w2.weight", "w1.weight_scale_inv", "w3.weight_scale_inv", "w2.weight_scale_inv"
    }  # fmt: skip
    assert not cutlass.gpt_oss and shapes(moe_layout(gpt, "CUTLASS").params)["w2_weight"] == ((8, 2944, 1472), "uint8")


def test_backend_follows_serving_resolution_and_aic():
    gpt = case("w4a16_mxfp4", hidden=2880, inter=2880, topk=4, experts=128)
    assert [choose_backend(gpt, sm) for sm in (90, 100, 103, 120)] == ["TRITON", "TRTLLM", "TRTLLM", "CUTLASS"]
    assert choose_backend(gpt._replace(moe_dtype="w4a8_mxfp4_mxfp8"), 100) == "TRTLLM"
    kimi = case("w4a16_mxfp4", hidden=3584, inter=3072, topk=16, experts=896)
    assert choose_backend(kimi, 90) == "CUTLASS" and choose_backend(kimi, 100) == "TRTLLM"
    block = case("fp8_block", hidden=7168, inter=2048, topk=8, experts=256)
    assert [choose_backend(block, sm) for sm in (90, 100, 103, 120)] == ["CUTLASS", "DEEPGEMM", "DEEPGEMM", "CUTLASS"]
    for dtype in ("bfloat16", "fp8", "nvfp4"):
        assert choose_backend(case(dtype), 100) == "CUTLASS"


def test_refusals_name_the_limit():
    with pytest.raises(KernelLimit, match="int4"):
        check_case(case("int4_wo", hidden=7168, inter=2048, topk=8, experts=384))
    with pytest.raises(KernelLimit, match="128"):
        check_case(case("fp8_block", hidden=300, inter=256))
    with pytest.raises(KernelLimit, match="% 16"):
        check_case(case(inter=1856, tp=8))  # 232 per rank
    check_case(case(inter=1856, tp=4))  # 464 per rank: whole 16s
    with pytest.raises(KernelLimit, match="% 64"):
        check_case(case("w4a16_mxfp4", hidden=2880, inter=2880, tp=2))  # 1440 per rank
    with pytest.raises(KernelLimit, match="% 32"):
        check_case(case("fp8", inter=704, tp=4))
    with pytest.raises(KernelLimit):
        check_case(case("float32"))
    for dtype, sm in (("nvfp4", 90), ("w4a8_mxfp4_mxfp8", 90), ("w4a16_mxfp4", 120), ("fp8_block", 89), ("fp8", 86)):
        with pytest.raises(KernelLimit):
            check_sm(case(dtype), sm)
    for dtype, sm in (("nvfp4", 100), ("w4a16_mxfp4", 90), ("w4a16_mxfp4", 103), ("fp8", 89), ("bfloat16", 80)):
        check_sm(case(dtype), sm)


def test_label_follows_the_built_class_in_aic_order():
    assert kernel_label("DeepGemmFusedMoE", True, "fp8_block", 100) == "deepgemm"
    assert kernel_label("CutlassFusedMoE", True, "fp8_block", 90) == "moe_torch_flow_cutlass"
    assert kernel_label("CutlassFusedMoE", True, "fp8_block", 120) == "moe_torch_flow_triton_fp8_block"
    assert kernel_label("CutlassFusedMoE", False, "bfloat16", 90) == "moe_torch_flow_nongated"
    assert kernel_label("TRTLLMGenFusedMoE", False, "nvfp4", 100) == "moe_torch_flow_nongated"
    assert kernel_label("TritonFusedMoE", True, "w4a16_mxfp4", 90) == "moe_torch_flow"
    assert kernel_label("TRTLLMGenFusedMoE", True, "w4a8_mxfp4_mxfp8", 100) == "moe_torch_flow"
    # a fallback TRT-LLM chose shows as its own label
    assert kernel_label("VanillaMoE", True, "bfloat16", 90) == "moe_torch_flow_vanillamoe"


def test_nemotron_shapes_match_the_planner():
    as_planner = {(h, i, e, k) for h, i, e, k in moe_inputs.NEMOTRON_H}
    assert as_planner == _NEMOTRON_H


def test_footprint_by_hand():
    c = case(tokens=4, tp=2)  # 8 experts, inter 256, hidden 256, topk 2
    weights = 8 * 512 * 256 * 2 + 8 * 256 * 256 * 2
    activations = (2 * 4 * 256 + 8 * (256 + 3 * 256)) * 2
    assert footprint(c) == weights + activations + 4 * 8 * 2
    mx = case("w4a16_mxfp4", tokens=1, hidden=2880, inter=2880, topk=4, experts=32)
    per_expert = 2 * 3072 * 1536 + 3072 * 1536 + 2 * 3072 * 96 + 3072 * 96  # padded to 256 as TRTLLMGen
    ckpt = 3 * 2880 * 1440 + 3 * 2880 * 90
    assert footprint(mx) == 32 * per_expert + ckpt + (2 * 2880 + 4 * (2880 + 3 * 2880)) * 2 + 32 * 2


def test_prepare_refuses_before_importing_tensorrt_llm():
    with pytest.raises(KernelLimit, match="int4"):
        moe.prepare(case("int4_wo"), "moe_torch_flow_cutlass", "cuda:0", 1)
    with pytest.raises(KernelLimit, match="CUDA"):
        moe.prepare(case(), "moe_torch_flow_cutlass", "cpu", 1)
    assert "tensorrt_llm" not in sys.modules


def test_runner_modules_import_no_framework_at_module_level():
    for module in (moe, moe_inputs):
        tree = ast.parse(Path(module.__file__).read_text())
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                assert not any(n.split(".")[0] in ("torch", "tensorrt_llm") for n in names), (module.__name__, names)
    (runner,) = moe.RUNNERS["moe"]
    assert runner.versions == {"1.3.0rc20", "1.3.0rc23"} and runner.footprint is footprint


@pytest.mark.parametrize("sm", ["90", "100"])
def test_every_planned_case_builds_or_is_a_documented_refusal(planner, sm):
    plan = planner.plan("trtllm", sm, PlanOptions(ops=("moe",))).ops["moe"]
    refused: Counter[str] = Counter()
    differences: dict = {}
    seen = set()
    for c, dispatch in zip(cases_of(plan), plan.dispatch):
        key = (c.moe_dtype, c.hidden_size, c.inter_size, c.topk, c.num_experts, c.moe_tp_size, c.moe_ep_size)
        if key in seen:
            continue
        seen.add(key)
        try:
            check_case(c)
            check_sm(c, int(sm))
            layout = moe_layout(c, choose_backend(c, int(sm)))
            assert footprint(c) > 0
        except KernelLimit as err:
            refused["int4" if c.moe_dtype == "int4_wo" else "alignment" if "% " in str(err) else str(err)] += 1
            continue
        assert layout.local_experts * c.moe_ep_size == c.num_experts
        label = kernel_label(CLASSES[layout.backend], layout.gated, c.moe_dtype, int(sm))
        if label != dispatch:
            differences[(sm, c.moe_dtype, (c.hidden_size, c.inter_size, c.topk, c.num_experts))] = (dispatch, label)
    # int4_wo is left out by skip trtllm-no-int4-weight-only-moe; the refusals are the kernels' weight-layout
    # alignments; the label the runner derives from the backend it builds is the plan's on every case
    assert set(refused) == {"alignment"} and refused["alignment"] > 0
    assert differences == {}


def test_router_logits_pick_the_routed_experts():
    torch = pytest.importorskip("torch")
    from opcollect.backends.torch.moe import routing

    for dist in ("balanced", "power_law_1.2"):
        c = case(tokens=64, topk=4, experts=16, dist=dist)
        logits = moe.router_logits(c)
        assert logits.shape == (64, 16) and logits.dtype == torch.bfloat16
        chosen = torch.topk(logits.float(), 4, dim=-1).indices.sort(-1).values
        assert torch.equal(chosen, routing(c).sort(-1).values)


def module_of(specs):
    """A stand-in for the module create_moe builds: the layout's tensors as parameters, under a backend child as
    ConfigurableMoE holds them, garbage as torch.empty leaves them."""
    torch = pytest.importorskip("torch")
    dtypes = {"bfloat16": torch.bfloat16, "float8_e4m3fn": torch.float8_e4m3fn, "float32": torch.float32,
              "int64": torch.int64, "int32": torch.int32, "uint8": torch.uint8}  # fmt: skip
    outer, inner = torch.nn.Module(), torch.nn.Module()
    outer.backend = inner
    for name, shape, dtype in specs:
        param = torch.nn.Parameter(torch.full(shape, 7, dtype=dtypes[dtype]), requires_grad=False)
        inner.register_parameter(name, param)
    return outer


def test_fill_gives_checkpoint_like_values_on_the_cpu():
    torch = pytest.importorskip("torch")
    fp4 = moe_layout(case("nvfp4", experts=2), "CUTLASS")
    module = module_of((*fp4.params, ("w2_bias", (2, 256), "bfloat16")))
    moe.fill(module, fp4, "cpu", 0)
    b = module.backend
    assert b.w3_w1_weight.view(torch.uint8).unique().numel() > 200  # random packed fp4 bytes
    assert (b.w3_w1_weight_scale.view(torch.uint8) == 0x38).all() and (b.fc31_alpha == 1).all()
    assert (b.fc2_input_scale == 1).all() and (b.w2_bias == 0).all()
    block = moe_layout(case("fp8_block", experts=2, inter=256), "DEEPGEMM")
    module = module_of(block.params)
    moe.fill(module, block, "cpu", 0)
    weight = module.backend.w3_w1_weight.float()
    assert weight.abs().max() > 0 and weight.std() > 0 and not torch.equal(weight[0], weight[1])
    assert (module.backend.w2_weight_scaling_factor == 1).all()
    with pytest.warns(UserWarning, match="layout says"):  # a module TRT-LLM shaped otherwise than the layout says
        moe.fill(module_of((("w2_weight", (2, 8, 8), "bfloat16"),)), block, "cpu", 0)


def test_checkpoint_gives_every_local_expert_one_shared_set():
    torch = pytest.importorskip("torch")
    layout = moe_layout(case("w4a8_mxfp4_mxfp8", hidden=256, inter=512, experts=8, ep=4), "TRTLLM")
    weights = moe.checkpoint(layout, "cpu", 0)
    assert len(weights) == 2 * 6  # experts 0 and 1 (rank 0 of ep 4), six tensors each
    assert weights["1.w1.weight"] is weights["0.w1.weight"] and weights["0.w1.weight"].shape == (512, 128)
    assert weights["0.w2.weight_scale"].shape == (256, 16) and (weights["0.w2.weight_scale"] == 127).all()
    assert weights["0.w3.weight"].dtype == torch.uint8 and weights["0.w3.weight"].unique().numel() > 200


@pytest.mark.parametrize("dtype", ["fp8", "fp8_block", "bfloat16"])
def test_create_moe_gets_servings_bf16_model_dtype(monkeypatch, dtype):
    """Serving's models hand create_moe the checkpoint config's torch_dtype, bf16 for fp8 and block-fp8 checkpoints;
    the reference collector passes float8_e4m3fn for those two (the difference moe.py records)."""
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    got = []

    class Built(Exception):
        pass

    def create_moe(**kwargs):
        got.append(kwargs)
        raise Built

    record = lambda *a, **kw: SimpleNamespace(args=a, **kw)  # noqa: E731
    for name, module in {
        "tensorrt_llm": SimpleNamespace(),
        "tensorrt_llm._torch.model_config": SimpleNamespace(ModelConfig=record),
        "tensorrt_llm._torch.modules.fused_moe.create_moe": SimpleNamespace(
            ActivationType=SimpleNamespace(Swiglu="swiglu", Relu2="relu2"), create_moe=create_moe
        ),
        "tensorrt_llm._torch.modules.fused_moe.routing": SimpleNamespace(RenormalizeMoeRoutingMethod=record),
        "tensorrt_llm.models.modeling_utils": SimpleNamespace(
            QuantAlgo=CLASSES | {"FP8": "FP8", "FP8_BLOCK_SCALES": "FP8_BLOCK_SCALES"}, QuantConfig=record
        ),
        "tensorrt_llm.mapping": SimpleNamespace(Mapping=lambda **kw: SimpleNamespace(**kw)),
    }.items():
        monkeypatch.setitem(sys.modules, name, module)
    c = case(dtype, hidden=512)
    with pytest.raises(Built):
        moe.build(c, moe_layout(c, choose_backend(c, 90)), "cpu", 90, 0)
    (kwargs,) = got
    assert kwargs["dtype"] is torch.bfloat16
    assert kwargs["model_config"].pretrained_config.torch_dtype is torch.bfloat16
