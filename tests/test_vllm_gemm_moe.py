"""The vLLM GEMM and MoE runners' input builders on the CPU, against shapes worked out by hand from the case.
vLLM is never imported: the builders are pure, and prepare refuses what vLLM cannot run before importing it."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from opcollect.backends.vllm import gemm, moe
from opcollect.plans.gemm import GemmCase
from opcollect.plans.moe import MoeCase, _moe_label
from opcollect.runtime.contract import KernelLimit

torch = pytest.importorskip("torch")

DTYPES = {"bfloat16": torch.bfloat16, "float8_e4m3fn": torch.float8_e4m3fn, "float32": torch.float32,
          "int32": torch.int32, "uint8": torch.uint8}  # fmt: skip


def shapes(specs) -> dict:
    return {name: (shape, dtype) for name, shape, dtype in specs}


def test_gemm_layout_per_dtype_matches_hand_shapes():
    m, n, k = 5, 300, 200
    bf16 = gemm.gemm_layout(GemmCase("bfloat16", m, n, k))
    assert (bf16.x_shape, bf16.out_shape, bf16.weight) == ((5, 200), (5, 300), ("weight", (300, 200), "bfloat16"))
    assert bf16.scales == () and bf16.config_class is None

    fp8 = gemm.gemm_layout(GemmCase("fp8", m, n, k))
    assert fp8.weight == ("weight", (300, 200), "float8_e4m3fn")
    assert shapes(fp8.scales) == {"weight_scale": ((1,), "float32")}
    assert fp8.config_class == "Fp8Config" and dict(fp8.config_args)["activation_scheme"] == "dynamic"
    assert "weight_block_size" not in dict(fp8.config_args)

    block = gemm.gemm_layout(GemmCase("fp8_block", m, n, k))
    # 300 / 128 -> 3 blocks along n, 200 / 128 -> 2 along k
    assert shapes(block.scales) == {"weight_scale_inv": ((3, 2), "float32")}
    assert block.block_size == (128, 128) and dict(block.config_args)["weight_block_size"] == (128, 128)

    int4 = gemm.gemm_layout(GemmCase("int4_wo", 3, 64, 256))
    assert int4.weight == ("qweight", (32, 64), "int32")  # 256 / 8 packed rows
    assert shapes(int4.scales) == {
        "g_idx": ((256,), "int32"),
        "scales": ((2, 64), "bfloat16"),  # 256 / 128 groups
        "qzeros": ((2, 8), "int32"),  # 64 / 8 packed columns
    }
    args = dict(int4.config_args)
    assert int4.config_class == "AutoGPTQConfig" and (args["weight_bits"], args["group_size"]) == (4, 128)
    assert any(module in gemm.PREFIX for module in args["modules_in_block_to_quantize"])  # else vLLM leaves it bf16

    fp4 = gemm.gemm_layout(GemmCase("nvfp4", 3, 64, 256))
    assert fp4.weight == ("weight", (64, 128), "uint8")
    assert shapes(fp4.scales) == {
        "input_scale": ((1,), "float32"),
        "weight_scale_2": ((1,), "float32"),
        "weight_scale": ((64, 16), "float8_e4m3fn"),
    }
    assert fp4.config_class == "ModelOptNvFp4Config"


def test_gemm_footprint_is_the_bytes_of_real_tensors_and_grows():
    for dtype in ("bfloat16", "fp8", "fp8_block", "int4_wo", "nvfp4"):
        case = GemmCase(dtype, 16, 256, 512)
        layout = gemm.gemm_layout(case)
        tensors = [torch.empty(shape, dtype=DTYPES[d]) for _, shape, d in (layout.weight, *layout.scales)]
        tensors += [
            torch.empty(layout.x_shape, dtype=torch.bfloat16),
            torch.empty(layout.out_shape, dtype=torch.bfloat16),
        ]
        assert gemm.footprint(case) == sum(t.nbytes for t in tensors) + layout.act_quant_bytes, dtype
        for bigger in (case._replace(m=32), case._replace(n=512), case._replace(k=1024)):
            assert gemm.footprint(bigger) > gemm.footprint(case), (dtype, bigger)
    assert gemm.footprint(GemmCase("fp8", 16, 256, 512)) < gemm.footprint(GemmCase("bfloat16", 16, 256, 512))


def test_gemm_refuses_before_importing_vllm():
    for case in (GemmCase("int4_wo", 4, 64, 200), GemmCase("nvfp4", 4, 64, 8), GemmCase("float32", 4, 64, 64)):
        with pytest.raises(KernelLimit):
            gemm.prepare(case, "x", "cpu", 1)
    assert "vllm" not in sys.modules


def moe_case(dtype="bfloat16", tokens=16, hidden=256, inter=512, topk=2, experts=8, tp=1, ep=1, dist="balanced"):
    return MoeCase(dtype, tokens, hidden, inter, topk, experts, tp, ep, dist)


def test_moe_split_follows_vllm_tp_and_ep():
    tp = moe.moe_layout(moe_case(tp=2))
    assert (tp.local_experts, tp.local_inter, tp.parallel_size, tp.expert_parallel) == (8, 256, 2, False)
    assert shapes(tp.params) == {"w13_weight": ((8, 512, 256), "bfloat16"), "w2_weight": ((8, 256, 256), "bfloat16")}
    ep = moe.moe_layout(moe_case(ep=4))
    assert (ep.local_experts, ep.local_inter, ep.parallel_size, ep.expert_parallel) == (2, 512, 4, True)
    assert shapes(ep.params)["w13_weight"] == ((2, 1024, 256), "bfloat16")
    with pytest.raises(KernelLimit):
        moe.moe_layout(moe_case(tp=2, ep=2))


def test_moe_layout_per_dtype_matches_hand_shapes():
    fp8 = shapes(moe.moe_layout(moe_case("fp8")).params)
    assert fp8["w13_weight"] == ((8, 1024, 256), "float8_e4m3fn") and fp8["w2_weight"] == (
        (8, 256, 512),
        "float8_e4m3fn",
    )
    assert fp8["w13_weight_scale"] == ((8, 2), "float32") and fp8["w2_weight_scale"] == ((8,), "float32")
    assert fp8["w13_input_scale"] == ((8,), "float32") and fp8["w2_input_scale"] == ((8,), "float32")

    block = shapes(moe.moe_layout(moe_case("fp8_block", hidden=300, inter=256)).params)
    # inter 256 -> 2 blocks (w13 holds gate and up: 4), hidden 300 -> 3 blocks
    assert block["w13_weight_scale_inv"] == ((8, 4, 3), "float32")
    assert block["w2_weight_scale_inv"] == ((8, 3, 2), "float32")
    with pytest.raises(KernelLimit):
        moe.moe_layout(moe_case("fp8_block", inter=384, tp=2))  # 192 per rank is not whole blocks

    int4 = shapes(moe.moe_layout(moe_case("int4_wo")).params)
    assert int4["w13_weight_packed"] == ((8, 32, 1024), "int32")  # hidden / 8 packed, gate and up
    assert int4["w2_weight_packed"] == ((8, 64, 256), "int32")  # inter / 8 packed
    assert int4["w13_weight_scale"] == ((8, 2, 1024), "bfloat16")  # hidden / 128 groups
    assert int4["w2_weight_scale"] == ((8, 4, 256), "bfloat16")  # inter / 128 groups
    assert dict(moe.moe_layout(moe_case("int4_wo")).config_args)["group_size"] == 128

    gpt_oss = moe.moe_layout(moe_case("w4a16_mxfp4", hidden=2880, inter=2880, topk=4, experts=32, tp=2))
    assert gpt_oss.local_inter == 1472  # 1440 rounded up to 64 for the Triton backend
    mx = shapes(gpt_oss.params)
    assert mx["w13_weight"] == ((32, 2944, 1440), "uint8") and mx["w13_weight_scale"] == ((32, 2944, 90), "uint8")
    assert mx["w2_weight"] == ((32, 2880, 736), "uint8") and mx["w2_weight_scale"] == ((32, 2880, 46), "uint8")
    assert mx["w13_bias"] == ((32, 2944), "bfloat16") and mx["w2_bias"] == ((32, 2880), "bfloat16")
    assert (gpt_oss.activation, gpt_oss.has_bias, gpt_oss.config_class) == ("swigluoai", True, "Mxfp4Config")
    assert moe.moe_layout(moe_case("w4a16_mxfp4", hidden=2880, inter=2880, experts=32)).local_inter == 2880
    with pytest.raises(KernelLimit):
        moe.moe_layout(moe_case("w4a16_mxfp4", hidden=3584, inter=3072))


def test_moe_footprint_grows_with_the_case():
    for dtype in ("bfloat16", "fp8", "fp8_block", "int4_wo"):
        case = moe_case(dtype, inter=1024)
        for bigger in (case._replace(num_tokens=64), case._replace(num_experts=16), case._replace(inter_size=2048)):
            assert moe.footprint(bigger) > moe.footprint(case), (dtype, bigger)
        layout = moe.moe_layout(case)
        weights = sum(torch.empty(s, dtype=DTYPES[d]).nbytes for _, s, d in layout.params)
        assert moe.footprint(case) > weights
    assert moe.footprint(moe_case(ep=4)) < moe.footprint(moe_case())


@pytest.mark.parametrize("dist", ["balanced", "power_law_1.01", "power_law_1.2"])
def test_router_logits_pick_the_distribution_experts(dist):
    from opcollect.backends.torch.moe import routing

    case = moe_case(tokens=64, topk=4, experts=16, dist=dist)
    logits = moe.router_logits(case)
    assert logits.shape == (64, 16) and logits.dtype == torch.bfloat16
    chosen = torch.topk(logits.float().softmax(-1), 4, dim=-1).indices.sort(-1).values
    assert torch.equal(chosen, routing(case).sort(-1).values)
    assert torch.equal(moe.router_logits(case), logits)  # deterministic
    counts = torch.bincount(chosen.flatten(), minlength=16)
    if dist == "balanced":
        assert counts.tolist() == [16] * 16
    else:  # skewed: the hottest expert well above the balanced 16 (which expert is hot is drawn, not by index)
        assert counts.max() > 2 * 16


def test_moe_label_matches_the_planner_and_prepare_refuses_first():
    for parts in (("UnquantizedFusedMoE", "FlashInfer TRTLLM", "TrtLlmBf16Experts"), ("Fp8MoE", "TRITON", "X-y")):
        assert moe.moe_label(*parts) == _moe_label(*parts)
    with pytest.raises(KernelLimit):
        moe.prepare(moe_case(tp=2, ep=2), "x", "cpu", 1)
    assert "vllm" not in sys.modules


def test_runner_modules_import_no_framework_at_module_level():
    for module in (gemm, moe):
        tree = ast.parse(Path(module.__file__).read_text())
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                assert not any(n.split(".")[0] in ("torch", "vllm") for n in names), (module.__name__, names)


def module_of(specs):
    """A stand-in for the layer vLLM builds: the layout's tensors as parameters, empty as create_weights leaves them."""
    layer = torch.nn.Module()
    for name, shape, dtype in specs:
        layer.register_parameter(name, torch.nn.Parameter(torch.empty(shape, dtype=DTYPES[dtype]), requires_grad=False))
    return layer


def test_fill_gives_checkpoint_like_values_on_the_cpu():
    int4 = gemm.gemm_layout(GemmCase("int4_wo", 3, 64, 256))
    layer = module_of((int4.weight, *int4.scales))
    gemm._fill(layer, int4, "cpu", 0)
    assert layer.qweight.unique().numel() > 100 and torch.equal(layer.g_idx, torch.arange(256) // 128)
    assert (layer.qzeros == 0x77777777).all() and (layer.scales == 0.01).all()
    fp4 = gemm.gemm_layout(GemmCase("nvfp4", 3, 64, 256))
    layer = module_of((fp4.weight, *fp4.scales))
    gemm._fill(layer, fp4, "cpu", 0)
    assert (layer.weight_scale.float() == 1).all() and layer.weight.unique().numel() > 100
    with pytest.raises(RuntimeError):  # a layer vLLM shaped otherwise than the layout says
        gemm._fill(module_of((("weight", (64, 64), "uint8"), *fp4.scales)), fp4, "cpu", 0)

    mx = moe.moe_layout(moe_case("w4a16_mxfp4", hidden=2880, inter=2880, topk=4, experts=2, tp=4))
    experts = module_of(mx.params)
    moe._fill(experts, mx, "cpu", 0)
    assert (experts.w13_weight_scale == 127).all() and (experts.w13_bias == 0).all()
    assert experts.w2_weight.unique().numel() > 200
    i4 = moe.moe_layout(moe_case("int4_wo", experts=2))
    experts = module_of(i4.params)
    moe._fill(experts, i4, "cpu", 0)
    assert experts.w13_weight_packed.unique().numel() > 100 and (experts.w13_weight_g_idx == 0).all()
    assert (experts.w2_weight_scale == 1).all() and experts.w13_weight_shape[0].tolist() == [1024, 256]
    b = moe.moe_layout(moe_case("fp8_block", experts=2))
    experts = module_of(b.params)
    moe._fill(experts, b, "cpu", 0)
    assert experts.w13_weight.float().abs().max() > 0 and (experts.w2_weight_scale_inv == 1 / 448).all()
