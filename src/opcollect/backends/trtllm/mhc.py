"""DeepSeek-V4's hyper-connection (mHC) pre and post (mhc_module_perf) with TensorRT-LLM's own mHC module.

TensorRT-LLM's _torch/modules/mhc/hyper_connection.py mHC (cited by symbol: copies @10ce7685 of hyper_connection.py
and @07f9cd08 of mhc_cuda.py; no 1.3.0rc20 or rc23 checkout is in reach, tests/data/trtllm-release/README.md):
- ``mHC(mult, hidden_size, sinkhorn_iters)`` holds fn [(2 + mult) x mult, mult x hidden] fp32, base and scale [3]
  fp32, with its defaults eps = norm_eps = sinkhorn_eps = 1e-6 and post_mult_value 1.0 (mHC.__init__);
- ``pre_mapping(x)`` (x bf16 [T, mult, hidden]) runs mhc_cuda.mhc_pre_mapping_fused: the AutoTuner's choose_one over
  MhcPreMappingRunner ("trtllm::mhc_pre_mapping") picks a tactic (backend, tile_n, tile_m, bigfuse_bs) whose forward
  runs the GEMM + square sum through one of two entry points, mhc_gemm_rms_fma_cuda (CUDA-core FMA,
  torch.ops.trtllm.mhc_gemm_sqrsum_fma) or mhc_gemm_rms_dg_cuda (DeepGEMM's TF32 tf32_hc_prenorm_gemm, 16 K splits
  for dg_splitk, none for dg_nosplit; offered only where _get_dg_fn imports it), then torch.ops.trtllm.mhc_big_fuse;
  a tuner cache miss takes ("fma", 0, 0, 0);
- ``post_mapping(x, residual, post_layer_mix, comb_res_mix)`` runs mhc_post_mapping_cuda, the one kernel
  torch.ops.trtllm.mhc_post_mapping.
TensorRT-LLM 1.3.0rc20 ships no DeepSeek-V4 model, so the reference collector drives these module calls directly, as
this runner does (collector/trtllm/collect_mhc_module.py:135-329): per site an mHC with fn and base random and scale
ones and a random bf16 residual [T, mult, hidden]; for pre, autotune() over both sites' pre_mapping before anything
is timed, as serving's warm-up tunes it (:168-183); post mixes what pre_mapping made of its site's inputs. Serving may
fuse post with the next pre (mHC.fused_hc), which the table does not hold (collector docstring :17-50). A row sums
num_sites sites.

kernel_source: post trtllm_mhc_post_mapping; pre trtllm_mhc_pre_<tactic>, the tactic the tuned pre_mapping ran, read
as the collector reads it (:186-223): one more pre_mapping per site after tuning, with the two entry points wrapped to
record which ran, a DeepGEMM call counting as dg_splitk when it passes more than one K split. torch_ops.check_installed
refuses a TensorRT-LLM whose sources no longer route pre_mapping, the tactic and post_mapping through these calls.
"""

from __future__ import annotations

import inspect
from typing import Callable

from opcollect.backends.torch.mhc import check_case, mixes
from opcollect.backends.trtllm import torch_ops
from opcollect.backends.trtllm.context import SERVED_VERSIONS
from opcollect.runtime.contract import Prepared, Runner

POST_LABEL = "trtllm_mhc_post_mapping"
PRE_LABEL = "trtllm_mhc_pre_"
DG_SPLITS = 16  # mhc_cuda._DG_NUM_SPLITS: dg_splitk's K splits, the most pre_mapping's partials hold
# the one torch op post_mapping launches (collect_mhc_module.py:271-276 @1.3.0rc20): a KernelLimit names it where the
# install lacks it; pre's calls are held by torch_ops.check_installed
TORCH_OPS = {"pre": (), "post": ("mhc_post_mapping",)}


def footprint(case) -> int:
    """Bytes of one input set: per site the mHC's weights, the residual and pre_mapping's outputs; pre adds the
    partial products and square sums of its widest tactic (16 K splits), post the new residual."""
    check_case(case, "TensorRT-LLM")
    t, hc, h = case.num_tokens, case.hc_mult, case.hidden_size
    weights = mixes(hc) * (hc * h + 1) * 4 + 3 * 4
    residual = t * hc * h * 2
    outputs = t * hc * 4 + t * hc * hc * 4 + t * h * 2
    if case.op_name == "pre":
        return case.num_sites * (weights + residual + outputs + DG_SPLITS * t * (mixes(hc) + 1) * 4)
    return case.num_sites * (weights + 2 * residual + outputs)


def tactic_labels(mhc_cuda, run: Callable[[], None]) -> list[str]:
    """The tactics ``run`` took, in call order: each call of mhc_cuda's two GEMM + square-sum entry points, wrapped
    for the length of ``run`` and restored after it (the tactics' forward looks them up in the module at each call).
    A DeepGEMM call's K splits are read from its bound arguments, its signature's default included."""
    fma, dg = mhc_cuda.mhc_gemm_rms_fma_cuda, mhc_cuda.mhc_gemm_rms_dg_cuda
    dg_signature = inspect.signature(dg)
    seen: list[str] = []

    def fma_spy(*args, **kwargs):
        seen.append("fma")
        return fma(*args, **kwargs)

    def dg_spy(*args, **kwargs):
        bound = dg_signature.bind(*args, **kwargs)
        bound.apply_defaults()
        seen.append("dg_splitk" if int(bound.arguments["num_splits"]) > 1 else "dg_nosplit")
        return dg(*args, **kwargs)

    mhc_cuda.mhc_gemm_rms_fma_cuda, mhc_cuda.mhc_gemm_rms_dg_cuda = fma_spy, dg_spy
    try:
        run()
    finally:
        mhc_cuda.mhc_gemm_rms_fma_cuda, mhc_cuda.mhc_gemm_rms_dg_cuda = fma, dg
    return seen


def pre_label(tactics: list[str]) -> str:
    """trtllm_mhc_pre_<tactic>; the collector's joined label where sites took different tactics."""
    if not tactics:
        raise RuntimeError("pre_mapping called neither mhc_gemm_rms_fma_cuda nor mhc_gemm_rms_dg_cuda")
    return PRE_LABEL + "+".join(sorted(set(tactics)))


def build_sites(case, device: str, seed: int) -> list:
    """num_sites (mHC, residual) pairs: the module TensorRT-LLM serves, fn and base random, scale ones."""
    import torch
    from tensorrt_llm._torch.modules.mhc.hyper_connection import mHC

    from opcollect.runtime.timing import random_tensor

    hc, h = case.hc_mult, case.hidden_size
    sites = []
    for s in range(case.num_sites):
        at = seed + 10 * s
        with torch.device(device):
            site = mHC(mult=hc, hidden_size=h, sinkhorn_iters=case.sinkhorn_iters)
        with torch.no_grad():
            site.fn.copy_(random_tensor(tuple(site.fn.shape), torch.float32, device, at))
            site.base.copy_(random_tensor(tuple(site.base.shape), torch.float32, device, at + 1))
            site.scale.fill_(1.0)
        sites.append((site, random_tensor((case.num_tokens, hc, h), torch.bfloat16, device, at + 2)))
    return sites


def prepare(case, dispatch: str, device: str, copies: int) -> Prepared:
    check_case(case, "TensorRT-LLM")
    torch_ops.check_installed("mhc")
    import tensorrt_llm._torch.modules.mhc.mhc_cuda as mhc_cuda
    import torch
    from tensorrt_llm._torch.autotuner import autotune

    from opcollect.runtime.timing import is_cuda

    for name in TORCH_OPS[case.op_name]:
        torch_ops.torch_op("trtllm", name)
    sets = [build_sites(case, device, 1000 * c) for c in range(copies)]
    if case.op_name == "pre":
        with torch.inference_mode(), autotune():  # serving's warm-up: the tuner times every tactic it offers
            for site, residual in sets[0]:
                site.pre_mapping(residual)
        if is_cuda(device):
            torch.cuda.synchronize(torch.device(device))
        with torch.no_grad():
            label = pre_label(tactic_labels(mhc_cuda, lambda: [site.pre_mapping(r) for site, r in sets[0]]))

        def run(sites) -> None:
            for site, residual in sites:
                site.pre_mapping(residual)
    else:
        label = POST_LABEL
        with torch.no_grad():  # post mixes what pre_mapping made of its site's inputs, as the collector feeds it
            sets = [[(site, residual, site.pre_mapping(residual)) for site, residual in sites] for sites in sets]

        def run(sites) -> None:
            for site, residual, (post_mix, comb_mix, layer_input) in sites:
                site.post_mapping(layer_input, residual, post_mix, comb_mix)

    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        with torch.no_grad():
            run(sets[i])

    return Prepared(call, label)


# the collector's calls hold for both pins (__compat__ "trtllm>=1.3.0rc20", collect_mhc_module.py:55)
RUNNERS = {"mhc": (Runner(footprint, prepare, versions=SERVED_VERSIONS),)}
