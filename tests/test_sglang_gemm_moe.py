"""The SGLang GEMM and MoE runners' input builders on the CPU, against shapes worked out by hand from the case.
SGLang is never imported: the builders are pure, and prepare refuses what SGLang cannot run before importing it."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from opcollect.backends.sglang import context, gemm, moe, moe_routing
from opcollect.plans.gemm import GemmCase
from opcollect.plans.moe import MoeCase, _sglang, _sglang_case
from opcollect.runtime.contract import KernelLimit

torch = pytest.importorskip("torch")

DTYPES = {"bfloat16": torch.bfloat16, "float8_e4m3fn": torch.float8_e4m3fn, "float32": torch.float32,
          "int32": torch.int32, "uint8": torch.uint8}  # fmt: skip


def shapes(specs) -> dict:
    return {name: (shape, dtype) for name, shape, dtype in specs}


def test_gemm_layout_per_dtype_matches_hand_shapes():
    bf16 = gemm.gemm_layout(GemmCase("bfloat16", 5, 300, 200))
    assert (bf16.x_shape, bf16.out_shape, bf16.weight) == ((5, 200), (5, 300), ("weight", (300, 200), "bfloat16"))
    assert bf16.scales == () and bf16.quantization is None and bf16.act_quant_bytes == 0

    fp8 = gemm.gemm_layout(GemmCase("fp8", 5, 300, 200))
    assert fp8.weight == ("weight", (300, 200), "float8_e4m3fn") and fp8.block_size is None
    assert shapes(fp8.scales) == {"weight_scale": ((1,), "float32")} and fp8.quantization == "fp8"
    assert fp8.act_quant_bytes == 5 * 200 + 5 * 4  # fp8 activations and one fp32 scale per token

    block = gemm.gemm_layout(GemmCase("fp8_block", 5, 300, 200))
    assert shapes(block.scales) == {"weight_scale_inv": ((3, 2), "float32")}  # 300/128 -> 3, 200/128 -> 2
    assert block.block_size == (128, 128) and block.act_quant_bytes == 5 * 200 + 5 * 2 * 4

    int4 = gemm.gemm_layout(GemmCase("int4_wo", 3, 64, 256))
    assert int4.weight == ("qweight", (32, 64), "int32") and int4.quantization == "gptq_marlin"
    assert shapes(int4.scales) == {"g_idx": ((256,), "int32"), "scales": ((2, 64), "bfloat16"),
                                   "qzeros": ((2, 8), "int32")}  # fmt: skip

    fp4 = gemm.gemm_layout(GemmCase("nvfp4", 3, 64, 256))
    assert fp4.weight == ("weight", (64, 128), "uint8") and fp4.quantization == "modelopt_fp4"
    assert shapes(fp4.scales) == {"input_scale": ((1,), "float32"), "weight_scale_2": ((1,), "float32"),
                                  "weight_scale": ((64, 16), "float8_e4m3fn")}  # fmt: skip
    assert fp4.act_quant_bytes == 3 * 256 // 2 + 3 * 256 // 16


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


def test_gemm_refuses_before_importing_sglang():
    for case in (GemmCase("int4_wo", 4, 64, 200), GemmCase("int4_wo", 4, 96, 256), GemmCase("nvfp4", 4, 64, 8),
                 GemmCase("float32", 4, 64, 64)):  # fmt: skip
        with pytest.raises(KernelLimit):
            gemm.prepare(case, "x", "cpu", 1)
    gemm.check_shape(GemmCase("int4_wo", 4, 128, 256))  # a Marlin tile fits: no refusal
    assert "sglang" not in sys.modules


def test_gemm_fill_gives_checkpoint_like_values():
    int4 = gemm.gemm_layout(GemmCase("int4_wo", 3, 64, 256))
    layer = module_of((int4.weight, *int4.scales))
    gemm._fill(layer, int4, "cpu", 0)
    assert layer.qweight.unique().numel() > 100 and torch.equal(layer.g_idx, torch.arange(256) // 128)
    assert (layer.qzeros == 0x77777777).all() and (layer.scales == 0.01).all()
    block = gemm.gemm_layout(GemmCase("fp8_block", 3, 256, 256))
    layer = module_of((block.weight, *block.scales))
    gemm._fill(layer, block, "cpu", 0)
    assert (layer.weight_scale_inv == 1 / 448).all() and layer.weight.float().abs().max() > 0
    with pytest.raises(RuntimeError):  # a layer SGLang shaped otherwise than the layout says
        gemm._fill(module_of((("weight", (64, 64), "float8_e4m3fn"), *block.scales)), block, "cpu", 0)


def moe_case(dtype="bfloat16", tokens=16, hidden=256, inter=512, topk=2, experts=8, tp=1, ep=1, dist="balanced"):
    return MoeCase(dtype, tokens, hidden, inter, topk, experts, tp, ep, dist)


def test_moe_split_and_weight_bytes_per_dtype():
    tp = moe.moe_layout(moe_case(tp=2))
    assert (tp.local_experts, tp.local_inter, tp.hidden) == (8, 256, 256)
    assert tp.weight_bytes == 8 * 3 * 256 * 256 * 2  # w13 [8, 512, 256] + w2 [8, 256, 256], bf16
    ep = moe.moe_layout(moe_case(ep=4))
    assert (ep.local_experts, ep.local_inter) == (2, 512) and ep.weight_bytes == 2 * 3 * 512 * 256 * 2
    both = moe.moe_layout(moe_case(tp=2, ep=2))  # SGLang shards inter by moe_tp and experts by moe_ep
    assert (both.local_experts, both.local_inter) == (4, 256)
    elements = 8 * 3 * 512 * 256
    assert moe.moe_layout(moe_case("fp8")).weight_bytes == elements
    assert moe.moe_layout(moe_case("fp8_block")).weight_bytes == elements + elements * 4 // 128**2
    assert moe.moe_layout(moe_case("int4_wo")).weight_bytes == elements // 2 + elements * 2 // 32
    assert moe.moe_layout(moe_case("nvfp4")).weight_bytes == elements // 2 + elements // 16
    gpt = moe.moe_layout(moe_case("w4a16_mxfp4", hidden=2880, inter=2880, topk=4, experts=32, tp=2))
    assert (gpt.with_bias, gpt.gemm1_alpha, gpt.gemm1_clamp_limit, gpt.local_inter) == (True, 1.702, 7.0, 1440)
    gpt_elements = 32 * 3 * 1440 * 2880
    assert gpt.weight_bytes == gpt_elements // 2 + gpt_elements // 32 + 32 * (2 * 1440 + 2880) * 2
    nemotron = moe.moe_layout(moe_case(hidden=2688, inter=1856, topk=6, experts=128))
    assert (nemotron.activation, nemotron.is_gated) == ("relu2", False)
    assert nemotron.weight_bytes == 128 * 2 * 1856 * 2688 * 2  # non-gated: w13 holds up only
    for bad in (moe_case("fp8_block", inter=384, tp=2), moe_case(experts=8, ep=3), moe_case("float32")):
        with pytest.raises(KernelLimit):
            moe.moe_layout(bad)


def test_moe_footprint_grows_with_the_case():
    for dtype in ("bfloat16", "fp8", "fp8_block", "int4_wo", "nvfp4"):
        case = moe_case(dtype, inter=1024)
        for bigger in (case._replace(num_tokens=64), case._replace(num_experts=16), case._replace(inter_size=2048)):
            assert moe.footprint(bigger) > moe.footprint(case), (dtype, bigger)
        assert moe.footprint(case) > moe.moe_layout(case).weight_bytes
    real = (
        torch.empty(8, 2 * 512, 256, dtype=torch.bfloat16).nbytes
        + torch.empty(8, 256, 512, dtype=torch.bfloat16).nbytes
    )
    assert moe.moe_layout(moe_case()).weight_bytes == real  # bf16 w13 + w2 as real tensors
    assert moe.footprint(moe_case(ep=4)) < moe.footprint(moe_case())


def test_runner_backend_follows_server_args_and_the_plan():
    cases = {
        ("bfloat16", 90): moe_case(),
        ("nemotron", 90): moe_case(hidden=2688, inter=1856, topk=6, experts=128),
        ("nemotron", 100): moe_case(hidden=2688, inter=1856, topk=6, experts=128),
        ("deepseek", 100): moe_case("fp8_block", hidden=7168, inter=2048, topk=8, experts=256),
        ("deepseek", 90): moe_case("fp8_block", hidden=7168, inter=2048, topk=8, experts=256),
        ("gpt-oss", 90): moe_case("w4a16_mxfp4", hidden=2880, inter=2880, topk=4, experts=32),
        ("kimi-k3", 90): moe_case("w4a16_mxfp4", hidden=3584, inter=3072, topk=16, experts=896),
        ("int4", 90): moe_case("int4_wo", hidden=7168, inter=2048, topk=8, experts=384),
    }
    expected = {("bfloat16", 90): "auto", ("nemotron", 90): "flashinfer_cutlass",
                ("nemotron", 100): "flashinfer_trtllm", ("deepseek", 100): "flashinfer_trtllm",
                ("deepseek", 90): "auto", ("gpt-oss", 90): "auto", ("kimi-k3", 90): "marlin",
                ("int4", 90): "auto"}  # fmt: skip
    for key, case in cases.items():
        assert moe.runner_backend(case, key[1] // 10) == expected[key], key
    gpt = cases[("gpt-oss", 90)]
    assert moe.runner_backend(gpt, 9, triton_kernels=True) == "triton_kernel"
    assert moe.runner_backend(gpt._replace(moe_ep_size=2), 9, triton_kernels=True) == "auto"
    # a launch with --quantization keeps auto (server_args.py:3914-3934 requires quantization is None)
    assert moe.runner_backend(gpt, 9, triton_kernels=True, quantization="mxfp4") == "auto"
    assert moe.QUANTIZATION is None
    # an explicit backend's label is the plan's prediction for the same case
    for key in (("nemotron", 90), ("nemotron", 100), ("deepseek", 100), ("kimi-k3", 90)):
        case, sm = cases[key], str(key[1])
        label = moe.LABELS[expected[key]] + ("_situ_as_silu" if key[0] == "kimi-k3" else "")
        assert _sglang_case(sm, _sglang(sm, type("G", (), {"dtype": case.moe_dtype})()), case) == label, key


def test_moe_prepare_refuses_first_and_fill_on_the_cpu():
    with pytest.raises(KernelLimit):
        moe.prepare(moe_case(experts=8, ep=3), "x", "cpu", 1)
    assert "sglang" not in sys.modules
    layout = moe.moe_layout(moe_case("int4_wo", experts=2))
    specs = (("w13_weight_packed", (2, 32, 1024), "int32"), ("w13_weight_scale", (2, 8, 1024), "bfloat16"),
             ("w13_weight_shape", (2, 2), "bfloat16"), ("w13_weight_g_idx", (2, 256), "int32"),
             ("w2_weight_scale_inv", (2, 2, 4), "float32"), ("w13_bias", (2, 1024), "bfloat16"),
             ("w2_weight", (2, 256, 512), "bfloat16"), ("w13_weight_scale_e8m0", (2, 4, 8), "uint8"))  # fmt: skip
    layer = module_of(specs)
    moe._fill(layer, layout, "cpu", 0)
    assert layer.w13_weight_packed.unique().numel() > 100 and (layer.w13_weight_g_idx == 0).all()
    assert (layer.w13_weight_scale == 1).all() and layer.w13_weight_shape[0].tolist() == [1024, 256]
    assert (layer.w2_weight_scale_inv == 1 / 448).all() and (layer.w13_bias == 0).all()
    assert layer.w2_weight.float().abs().max() > 0 and (layer.w13_weight_scale_e8m0 == 127).all()


def test_no_framework_import_at_module_level():
    for module in (context, gemm, moe, moe_routing):
        tree = ast.parse(Path(module.__file__).read_text())
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                assert not any(n.split(".")[0] in ("torch", "sglang", "sgl_kernel") for n in names), names
    assert "sglang" not in sys.modules


def module_of(specs):
    """A stand-in for the layer SGLang builds: the tensors as parameters, empty as create_weights leaves them."""
    layer = torch.nn.Module()
    for name, shape, dtype in specs:
        layer.register_parameter(name, torch.nn.Parameter(torch.empty(shape, dtype=DTYPES[dtype]), requires_grad=False))
    return layer
