"""What the torch runners and the framework-independent backend parts refuse on the CPU, each with its reason:
a refusal dropped would time a shape the kernel cannot take, or a different quantity under the same key."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from opcollect.backends import gdn_layer  # noqa: E402
from opcollect.backends.kernels import Meaning  # noqa: E402
from opcollect.backends.torch import measure, mhc, routing  # noqa: E402
from opcollect.backends.torch.comm import run_all_reduce_row  # noqa: E402
from opcollect.backends.torch.reference import admitted_dtype  # noqa: E402
from opcollect.plans.comm import CustomAllreduceCase  # noqa: E402
from opcollect.plans.gemm import GemmCase  # noqa: E402
from opcollect.plans.linear_attention import GdnCase  # noqa: E402
from opcollect.plans.mhc import MhcCase  # noqa: E402
from opcollect.plans.moe import MoeCase  # noqa: E402
from opcollect.runtime.contract import KernelLimit  # noqa: E402
from opcollect.runtime.harness import TimingConfig  # noqa: E402

QUICK = TimingConfig(max_noise=0.2, min_samples=3, max_case_seconds=0.02, warmup_seconds=0.001)
INT4 = "torch._weight_int4pack_mm_for_cpu"


@pytest.mark.parametrize(("n", "k"), [(24, 256), (32, 192)])
def test_int4_weight_only_gemm_refuses_n_off_16_and_k_off_the_group(n, k):
    with pytest.raises(KernelLimit, match=rf"n % 16 == 0 and k % 128 == 0 \(n={n}, k={k}\)"):
        measure("gemm", INT4, [GemmCase("int4_wo", 4, n, k)], "cpu", QUICK)


def test_int4_weight_only_gemm_times_a_shape_on_the_grid():
    (row,) = measure("gemm", INT4, [GemmCase("int4_wo", 4, 32, 256)], "cpu", QUICK)
    assert row.stats.samples >= 3 and row.stats.latency > 0


def _moe(dtype: str = "bfloat16") -> MoeCase:
    return MoeCase(dtype, 8, 64, 32, 2, 4, 1, 1, "balanced")


def test_torch_moe_refuses_quantized_experts_and_grouped_mm_off_cuda():
    with pytest.raises(KernelLimit, match="the torch MoE runner has no fp8 experts"):
        measure("moe", "torch.matmul", [_moe("fp8")], "cpu", QUICK)
    with pytest.raises(KernelLimit, match=r"torch._grouped_mm needs a CUDA device"):
        measure("moe", "torch._grouped_mm", [_moe()], "cpu", QUICK)


def _mhc(op: str = "pre", tokens: int = 4, sites: int = 2) -> MhcCase:
    return MhcCase(op, "DeepseekV4ForCausalLM", tokens, sites, 4, 64, 3)


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        (_mhc(op="mid"), "torch's mHC has no op 'mid'"),
        (_mhc(tokens=0), r"needs tokens and sites \(num_tokens=0, sites=2\)"),
        (_mhc(sites=0), r"needs tokens and sites \(num_tokens=4, sites=0\)"),
    ],
)
def test_mhc_refuses_unknown_ops_and_empty_rows(case, needle):
    with pytest.raises(KernelLimit, match=needle):
        mhc.check_case(case, "torch")


def test_mhc_accepts_a_row_with_tokens_and_sites():
    for op in mhc.OPS:
        assert mhc.check_case(_mhc(op=op, tokens=1, sites=1), "torch") is None


def test_a_reference_computes_only_in_its_dtypes():
    assert admitted_dtype("bfloat16", ("bfloat16", "float32"), "MSA") is torch.bfloat16
    with pytest.raises(KernelLimit, match="the torch MSA reference computes in bfloat16/float32, not fp8"):
        admitted_dtype("fp8", ("bfloat16", "float32"), "MSA")


def test_routing_knows_balanced_and_power_laws_only():
    with pytest.raises(ValueError, match="unknown token distribution 'zipf_1.2'"):
        routing.alpha_of("zipf_1.2")
    with pytest.raises(ValueError, match="alpha != 1"):
        routing.alpha_of("power_law_1")
    with pytest.raises(ValueError, match="balanced routing has no drawn counts"):
        routing.case_counts(64, 8, 2, 1, "balanced")


def _ar(**change) -> CustomAllreduceCase:
    return CustomAllreduceCase("bfloat16", 2, 1024, "custom")._replace(**change)


def _never(*args):
    raise AssertionError("a refused row starts no rank")


@pytest.mark.parametrize("other", [{"allreduce_dtype": "float16"}, {"num_gpus": 4}, {"backend": "oneshot"}])
def test_an_all_reduce_row_is_one_dtype_gpu_count_and_variant(other):
    with pytest.raises(ValueError, match="mixes dtypes, GPU counts or variants"):
        run_all_reduce_row([_ar(), _ar(**other)], "cuda", QUICK, _never, "vLLM", ("custom", "oneshot"), 1.0)


def test_an_all_reduce_row_is_refused_for_an_unknown_variant_and_off_cuda():
    with pytest.raises(KernelLimit, match="vLLM has no all-reduce variant 'nccl'"):
        run_all_reduce_row([_ar(backend="nccl")], "cuda", QUICK, _never, "vLLM", ("custom",), 1.0)
    with pytest.raises(KernelLimit, match="vLLM's all-reduce runs on CUDA GPUs only"):
        run_all_reduce_row([_ar()], "cpu", QUICK, _never, "vLLM", ("custom",), 1.0)


def _gdn(**change) -> GdnCase:
    base = GdnCase("core", "generation", 8, 1, 8, 2048, 4, 16, 128, 32, 128, "Qwen3-Next")
    return base._replace(**change)


def test_gdn_layers_need_conv_state_and_grouped_value_heads():
    assert gdn_layer.check_heads(_gdn()) is None
    with pytest.raises(KernelLimit, match="d_conv 1: the causal conv1d keeps a state"):
        gdn_layer.check_heads(_gdn(d_conv=1))
    with pytest.raises(KernelLimit, match="24 value heads are no multiple of 16 key heads"):
        gdn_layer.check_heads(_gdn(num_v_heads=24))


def test_gdn_packed_decode_is_refused_past_cudas_grid_y_only():
    limit = 65_535  # CUDA's gridDim.y maximum
    at_limit = _gdn(batch_size=limit // 32, num_v_heads=32)
    assert gdn_layer.check_packed_decode(at_limit, "vLLM", "f.py:1") is None
    over = _gdn(batch_size=limit // 32 + 1, num_v_heads=32)
    with pytest.raises(KernelLimit, match=rf"vLLM's packed recurrent decode .* = {(limit // 32 + 1) * 32} > {limit}"):
        gdn_layer.check_packed_decode(over, "vLLM", "f.py:1")
    # only the packed decode launches that grid: prefill and the other stages are not refused
    assert gdn_layer.check_packed_decode(over._replace(phase="context"), "vLLM", "f.py:1") is None
    assert gdn_layer.check_packed_decode(over._replace(stage="conv"), "vLLM", "f.py:1") is None


def test_a_kernel_label_has_patterns_or_a_reason_never_both_nor_neither():
    assert Meaning(patterns=("gemm",)).patterns == ("gemm",)
    assert Meaning(unobservable="a host-side copy").unobservable
    for bad in ({}, {"patterns": ("gemm",), "unobservable": "both"}):
        with pytest.raises(ValueError, match="patterns or a reason it is unobservable, not both or neither"):
            Meaning(**bad)
