"""GEMM with PyTorch: F.linear for bf16/fp16/fp32, torch._scaled_mm for per-tensor fp8."""

from __future__ import annotations

from opcollect.backends.torch.timing import random_tensor
from opcollect.runtime.contract import KernelLimit, Prepared

ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}


def footprint(case) -> int:
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
