"""GEMM with PyTorch: F.linear for bf16/fp16/fp32, torch._scaled_mm for per-tensor fp8, and int4 weight-only
(bf16 activations, 4-bit weights in groups of INT4_GROUP along k with a bf16 scale and zero each) through
torch._weight_int4pack_mm (CUDA, SM80+) or torch._weight_int4pack_mm_for_cpu."""

from __future__ import annotations

from opcollect.runtime.contract import KernelLimit, Prepared
from opcollect.runtime.timing import random_tensor

ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}
INT4_GROUP = 128  # the common GPTQ/AWQ group size; torch's kernels take 32, 64, 128 or 256
INT4_INNER_K_TILES = 8  # CUDA packing: k-tiles of 16 packed back to back (2, 4 or 8); 8 needs k % 128 == 0


def footprint(case) -> int:
    if case.gemm_dtype == "int4_wo":
        scales = (case.k // INT4_GROUP) * case.n * 2 * 2
        return case.m * case.k * 2 + case.n * case.k // 2 + scales + case.m * case.n * 2
    elem = ELEMENT_BYTES.get(case.gemm_dtype, 2)
    out = 4 if case.gemm_dtype == "float32" else 2
    return (case.m * case.k + case.n * case.k) * elem + case.m * case.n * out


def prepare(case, dispatch: str, device: str, copies: int) -> Prepared:
    import torch
    import torch.nn.functional as F

    m, n, k = case.m, case.n, case.k
    if case.gemm_dtype == "fp8":
        if not hasattr(torch, "float8_e4m3fn") or not device.startswith("cuda"):
            raise KernelLimit("fp8 GEMM needs a CUDA device with fp8 support")
        xs = [random_tensor((m, k), torch.float8_e4m3fn, device, i) for i in range(copies)]
        # _scaled_mm wants the second operand column-major: a (k, n) view of an (n, k) weight
        ws = [random_tensor((n, k), torch.float8_e4m3fn, device, 1000 + i).t() for i in range(copies)]
        one = torch.ones((), dtype=torch.float32, device=device)
        state = {"i": 0}

        def call() -> None:
            i = state["i"] = (state["i"] + 1) % copies
            torch._scaled_mm(xs[i], ws[i], scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

        return Prepared(call, "torch._scaled_mm")
    if case.gemm_dtype == "int4_wo":
        return _int4_weight_only(case, device, copies)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(case.gemm_dtype)
    if dtype is None:
        raise KernelLimit(f"the torch backend has no {case.gemm_dtype} GEMM")
    xs = [random_tensor((m, k), dtype, device, i) for i in range(copies)]
    ws = [random_tensor((n, k), dtype, device, 1000 + i) for i in range(copies)]
    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        F.linear(xs[i], ws[i])

    return Prepared(call, "torch.nn.functional.linear")


def _int4_weight_only(case, device: str, copies: int) -> Prepared:
    """x[m, k] (bf16) @ dequant(w_int4[n, k])^T with per-group scales and zeros, in torch's tinygemm layout."""
    import torch

    m, n, k = case.m, case.n, case.k
    cuda = device.startswith("cuda")
    # the CPU packer wants n % 16 (aten/src/ATen/native/LinearAlgebra.cpp:_convert_weight_to_int4pack_cpu), the
    # CUDA one n tiles of 8 and k a whole number of groups and of inner k-tiles (native/cuda/int4mm.cu)
    if n % 16 or k % INT4_GROUP:
        raise KernelLimit(f"int4 weight-only GEMM needs n % 16 == 0 and k % {INT4_GROUP} == 0 (n={n}, k={k})")
    name = "torch._weight_int4pack_mm" if cuda else "torch._weight_int4pack_mm_for_cpu"
    mm = getattr(torch, name.split(".", 1)[1], None)
    if mm is None:
        raise KernelLimit(f"this torch {torch.__version__} has no {name}")
    if cuda and torch.cuda.get_device_capability(torch.device(device)) < (8, 0):
        raise KernelLimit("torch._weight_int4pack_mm needs SM80 or newer (bf16 m16n8k16 tensor cores)")

    def packed(seed: int):
        gen = torch.Generator().manual_seed(seed)
        nibbles = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=gen)
        if cuda:
            pairs = (nibbles[:, ::2] << 4 | nibbles[:, 1::2]).to(torch.uint8).to(device)
            return torch._convert_weight_to_int4pack(pairs, INT4_INNER_K_TILES)
        return torch._convert_weight_to_int4pack_for_cpu(nibbles, INT4_INNER_K_TILES)

    xs = [random_tensor((m, k), torch.bfloat16, device, i) for i in range(copies)]
    ws = [packed(1000 + i) for i in range(copies)]
    scales = [random_tensor((k // INT4_GROUP, n, 2), torch.bfloat16, device, 2000 + i) for i in range(copies)]
    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        mm(xs[i], ws[i], INT4_GROUP, scales[i])

    return Prepared(call, name)
