"""The TensorRT-LLM GEMM runner's pure parts on the CPU, against shapes worked out by hand from linear.py's
create_weights and load paths; tensorrt_llm is never imported (prepare refuses what it cannot run first)."""

from __future__ import annotations

import ast
import sys
from collections import Counter
from math import prod
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import cases_of

from opcollect.backends.trtllm import gemm
from opcollect.plans.gemm import GemmCase
from opcollect.runtime.contract import KernelLimit
from opcollect.runtime.dtypes import TENSOR_BYTES

DTYPES = ("bfloat16", "fp8", "fp8_block", "nvfp4", "int4_wo")


def shapes(specs) -> dict:
    return {name: (shape, dtype) for name, shape, dtype in specs}


def test_layout_per_dtype_matches_hand_shapes():
    bf16 = gemm.gemm_layout(GemmCase("bfloat16", 5, 300, 200))
    assert (bf16.x_shape, bf16.out_shape) == ((5, 200), (5, 300))
    assert shapes(bf16.checkpoint) == shapes(bf16.params) == {"weight": ((300, 200), "bfloat16")}
    assert bf16.act_quant_bytes == 0 and bf16.quant_method == "UnquantizedLinearMethod"

    fp8 = gemm.gemm_layout(GemmCase("fp8", 5, 300, 200))
    # the checkpoint's weight_scale has one element (reshape([]) in load_weight_scales); no input_scale: dynamic
    assert shapes(fp8.checkpoint) == {"weight": ((300, 200), "float8_e4m3fn"), "weight_scale": ((1,), "float32")}
    assert shapes(fp8.params)["weight_scale"] == ((), "float32") and "input_scale" not in shapes(fp8.checkpoint)
    assert fp8.act_quant_bytes == 5 * 200 + 4 and fp8.quant_method == "FP8QDQLinearMethod"

    block = gemm.gemm_layout(GemmCase("fp8_block", 5, 300, 200))
    # ceil(300 / 128) = 3 blocks along n, ceil(200 / 128) = 2 along k
    assert shapes(block.checkpoint) == {"weight": ((300, 200), "float8_e4m3fn"), "weight_scale": ((3, 2), "float32")}
    assert block.act_quant_bytes == 5 * 200 + 8 * 2 * 4  # rows padded to 4, one fp32 scale per 128 of k
    assert block.quant_method == "FP8BlockScalesLinearMethod"

    fp4 = gemm.gemm_layout(GemmCase("nvfp4", 3, 300, 256))
    assert shapes(fp4.checkpoint) == {
        "weight": ((300, 128), "uint8"),  # two e2m1 values a byte
        "weight_scale": ((384, 16), "float8_e4m3fn"),  # pad(300, 128) rows, 256 / 16 = 16 (a multiple of 4)
        "weight_scale_2": ((1,), "float32"),
        "input_scale": ((1,), "float32"),
    }
    params = shapes(fp4.params)
    assert params["weight"] == ((320, 128), "uint8")  # post_load_weights pads rows to 32, columns to 16 bytes
    assert params["weight_scale"] == ((384 * 16,), "uint8")  # swizzled, flat
    assert fp4.act_quant_bytes == 3 * 128 + 128 * 16 + 3 * 300 * 2  # fp4 x, its scales, the sliced padded output
    assert fp4.quant_method == "NVFP4LinearMethod"

    int4 = gemm.gemm_layout(GemmCase("int4_wo", 3, 64, 256))
    assert shapes(int4.checkpoint) == {
        "weight": ((32, 256), "int8"),  # [n / 2, k]: transposed to [k, n / 2] and preprocessed on load
        "weight_scale": ((64, 2), "bfloat16"),  # [n, k / 128], transposed on load
        "pre_quant_scale": ((256,), "bfloat16"),
    }
    assert shapes(int4.params) == {
        "weight": ((256, 32), "int8"),
        "weight_scale": ((2, 64), "bfloat16"),
        "pre_quant_scale": ((256,), "bfloat16"),
    }
    assert int4.act_quant_bytes == 3 * 256 * 2 and int4.quant_method == "W4A16_AWQ_LinearMethod"


def test_nvfp4_pads_only_unaligned_shapes():
    aligned = gemm.gemm_layout(GemmCase("nvfp4", 4, 256, 512))
    assert shapes(aligned.params)["weight"] == ((256, 256), "uint8")
    assert aligned.act_quant_bytes == 4 * 256 + 128 * 32  # no padded output to slice
    narrow = gemm.gemm_layout(GemmCase("nvfp4", 4, 8, 16))  # the plan's smallest n; k / 2 = 8 bytes
    assert shapes(narrow.params)["weight"] == ((32, 16), "uint8")
    assert shapes(narrow.params)["weight_scale"] == ((128 * 4,), "uint8")  # 16 bytes hold 32 values: 2 -> 4 scales


def test_footprint_is_the_bytes_of_the_layout_and_grows():
    for dtype in DTYPES:
        case = GemmCase(dtype, 16, 256, 512)
        layout = gemm.gemm_layout(case)
        tensors = sum(prod(s) * TENSOR_BYTES[d] for _, s, d in (*layout.checkpoint, *layout.params))
        assert gemm.footprint(case) == tensors + (16 * 512 + 16 * 256) * 2 + layout.act_quant_bytes, dtype
        for bigger in (case._replace(m=32), case._replace(n=512), case._replace(k=1024)):
            assert gemm.footprint(bigger) > gemm.footprint(case), (dtype, bigger)
    # the weights dominate: bf16 holds two bytes a weight (checkpoint and parameter), fp8 one, int4 and fp4 half
    big = {dtype: gemm.footprint(GemmCase(dtype, 1, 4096, 4096)) for dtype in DTYPES}
    assert big["bfloat16"] > big["fp8"] > big["int4_wo"] and big["fp8"] > big["nvfp4"]
    assert big["bfloat16"] == pytest.approx(2 * 4096 * 4096 * 2, rel=0.01)


def test_refusals_happen_before_importing_tensorrt_llm():
    for case in (
        GemmCase("int4_wo", 4, 64, 200),  # k % 128
        GemmCase("int4_wo", 4, 63, 256),  # odd n: no int4 pairs
        GemmCase("nvfp4", 4, 64, 40),  # k % 16
        GemmCase("float32", 4, 64, 64),  # no TensorRT-LLM path
    ):
        with pytest.raises(KernelLimit):
            gemm.prepare(case, "torch_flow", "cpu", 1)
    gemm.check_shape(GemmCase("int4_wo", 4, 64, 256))
    gemm.check_shape(GemmCase("nvfp4", 4, 8, 32))
    gemm.check_shape(GemmCase("fp8_block", 4, 8, 32))  # block fp8 pads partial blocks: no refusal here
    assert "tensorrt_llm" not in sys.modules


def test_kernel_label_follows_what_tensorrt_llm_built():
    methods = gemm.QUANT_METHODS
    assert gemm.kernel_label("fp8_block", methods["fp8_block"], sm_100f=True, deep_gemm=True) == "deepgemm"
    # Hopper and SM120 run fp8_block_scaling_gemm; CuTe DSL or disable_deep_gemm on SM100 leave DeepGEMM too
    assert gemm.kernel_label("fp8_block", methods["fp8_block"], sm_100f=False, deep_gemm=True) == "torch_flow"
    assert gemm.kernel_label("fp8_block", methods["fp8_block"], sm_100f=True, deep_gemm=False) == "torch_flow"
    for dtype in ("bfloat16", "fp8", "nvfp4", "int4_wo"):
        assert gemm.kernel_label(dtype, methods[dtype], sm_100f=True, deep_gemm=True) == "torch_flow"
    with pytest.raises(RuntimeError, match="FP8RowwiseLinearMethod"):
        gemm.kernel_label("fp8", "FP8RowwiseLinearMethod", sm_100f=False, deep_gemm=True)
    with pytest.raises(RuntimeError, match="WeightOnlyQuantLinearMethod"):
        gemm.kernel_label("int4_wo", "WeightOnlyQuantLinearMethod", sm_100f=False, deep_gemm=True)


def test_deep_gemm_reads_the_linear_flags():
    assert gemm._deep_gemm(SimpleNamespace(use_cute_dsl_blockscaling_mm=False, disable_deep_gemm=False))
    assert not gemm._deep_gemm(SimpleNamespace(use_cute_dsl_blockscaling_mm=True, disable_deep_gemm=False))
    assert not gemm._deep_gemm(SimpleNamespace(use_cute_dsl_blockscaling_mm=False, disable_deep_gemm=True))


@pytest.mark.parametrize("sm", ["90", "100"])
def test_every_planned_case_builds_and_labels_as_planned(planner, sm):
    selection = planner.plan("trtllm", sm).ops["gemm"]
    cases = cases_of(selection)
    assert cases and {c.gemm_dtype for c in cases} <= set(DTYPES)
    refused: Counter = Counter()
    for case, dispatch in zip(cases, selection.dispatch):
        # what TensorRT-LLM builds when it builds the quant method the dtype implies, on this SM
        built = gemm.kernel_label(case.gemm_dtype, gemm.QUANT_METHODS[case.gemm_dtype], sm == "100", True)
        assert built == dispatch, (case, dispatch)
        try:
            gemm.check_shape(case)
        except KernelLimit:
            refused[case.gemm_dtype] += 1
            continue
        assert gemm.footprint(case) > 0

    # the documented refusals only, worked out here from the case: int4 with k % 128 or an odd n, nvfp4 with k % 16,
    # and 2^31-element activations, outputs or block-fp8 weights (int32 offsets)
    def expected(c) -> bool:
        big = c.m * c.n >= 2**31 or c.m * c.k >= 2**31 or (c.gemm_dtype == "fp8_block" and c.n * c.k >= 2**31)
        odd = (c.gemm_dtype == "int4_wo" and (c.k % 128 or c.n % 2)) or (c.gemm_dtype == "nvfp4" and c.k % 16)
        return bool(big or odd)

    assert refused == Counter(c.gemm_dtype for c in cases if expected(c))
    assert refused["int4_wo"] > 0 and refused["fp8_block"] > 0 and refused["bfloat16"] > 0
    assert refused["int4_wo"] < Counter(c.gemm_dtype for c in cases)["int4_wo"]


def test_runner_registration_and_no_framework_at_module_level():
    (runner,) = gemm.RUNNERS["gemm"]
    assert runner.prepare is gemm.prepare and runner.footprint is gemm.footprint
    assert runner.versions == frozenset({"1.3.0rc20", "1.3.0rc23"})
    tree = ast.parse(Path(gemm.__file__).read_text())
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            assert not any(n.split(".")[0] in ("torch", "tensorrt_llm") for n in names), names


def test_checkpoint_tensors_match_the_layout_on_the_cpu():
    torch = pytest.importorskip("torch")
    for dtype in DTYPES:
        layout = gemm.gemm_layout(GemmCase(dtype, 2, 64, 256))
        # a stand-in for the built linear: the fp4 weight is viewed as the dtype the linear holds
        linear = SimpleNamespace(weight=torch.empty(1, dtype=torch.uint8))
        tensors = gemm._checkpoint(layout, linear, "cpu", 0)
        assert set(tensors) == {name for name, _, _ in layout.checkpoint}
        for name, shape, kind in layout.checkpoint:
            assert tuple(tensors[name].shape) == shape and tensors[name].dtype == getattr(torch, kind), (dtype, name)
        if dtype in ("nvfp4", "int4_wo"):
            assert tensors["weight"].unique().numel() > 100  # random packed bytes, not a constant
    block = gemm._checkpoint(gemm.gemm_layout(GemmCase("fp8_block", 2, 64, 256)), None, "cpu", 0)
    assert torch.allclose(block["weight_scale"], torch.full((1, 2), 1 / 448))
    awq = gemm._checkpoint(gemm.gemm_layout(GemmCase("int4_wo", 2, 64, 256)), None, "cpu", 0)
    assert (awq["weight_scale"] == torch.tensor(0.01, dtype=torch.bfloat16)).all()
    assert (awq["pre_quant_scale"] == 1).all() and awq["weight"].min() < 0  # signed bytes, as int8 loads them
    int8_linear = SimpleNamespace(weight=torch.empty(1, dtype=torch.int8))
    fp4 = gemm._checkpoint(gemm.gemm_layout(GemmCase("nvfp4", 2, 64, 256)), int8_linear, "cpu", 0)
    assert fp4["weight"].dtype == torch.int8 and (fp4["weight_scale"].float() == 1).all()


class _Built(Exception):
    """Raised by the stand-in Linear: prepare got past its refusals and started building."""


def _fake_release(monkeypatch, sm: int, max_sm: int) -> list:
    built = []

    def linear(**kwargs):
        built.append(kwargs)
        raise _Built

    fake = {
        "tensorrt_llm": SimpleNamespace(),
        "tensorrt_llm._torch.modules.linear": SimpleNamespace(Linear=linear),
        "tensorrt_llm._utils": SimpleNamespace(get_sm_version=lambda: sm, is_sm_100f=lambda: sm in (100, 103)),
        "tensorrt_llm._torch.custom_ops.torch_custom_ops": SimpleNamespace(
            FinegrainedMixedDtypeGemm=SimpleNamespace(MAX_SUPPORTED_SM_VERSION=max_sm)
        ),
        "tensorrt_llm.models.modeling_utils": SimpleNamespace(
            QuantAlgo={"W4A16_AWQ": "W4A16_AWQ", "FP8": "FP8"}, QuantConfig=lambda **kw: SimpleNamespace(**kw)
        ),
    }
    for name, module in fake.items():
        monkeypatch.setitem(sys.modules, name, module)
    return built


def test_int4_above_the_mixed_gemm_sm_limit_is_a_kernel_limit_read_at_run_time(monkeypatch):
    pytest.importorskip("torch")
    int4 = GemmCase("int4_wo", 4, 64, 256)
    built = _fake_release(monkeypatch, sm=100, max_sm=90)
    with pytest.raises(KernelLimit, match="runs up to SM90, this GPU is SM100"):
        gemm.prepare(int4, "torch_flow", "cpu", 1)
    assert built == []  # refused before any weight is built
    # the same GPU under a release whose kernel serves it: the limit is the installed class's, not a table's
    built = _fake_release(monkeypatch, sm=100, max_sm=103)
    with pytest.raises(_Built):
        gemm.prepare(int4, "torch_flow", "cpu", 1)
    assert len(built) == 1
    # other dtypes never ask the W4A16 kernel
    built = _fake_release(monkeypatch, sm=120, max_sm=90)
    with pytest.raises(_Built):
        gemm.prepare(GemmCase("fp8", 4, 64, 256), "torch_flow", "cpu", 1)


def test_mixed_gemm_sm_limit_by_hand():
    gemm.check_mixed_gemm_sm(90, 90)
    gemm.check_mixed_gemm_sm(89, 103)
    with pytest.raises(KernelLimit, match="SM103, this GPU is SM120"):
        gemm.check_mixed_gemm_sm(120, 103)
