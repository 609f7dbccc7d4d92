"""DeepSeek-V4's hyper-connection (mHC) pre and post (mhc_module_perf) with vLLM 0.24.0's own kernels, as its CUDA
DeepSeek-V4 model calls them.

vLLM's NVIDIA DeepSeek-V4 decoder layer imports the Python functions of model_executor/kernels/mhc/tilelang.py and
calls them directly (models/deepseek_v4/nvidia/model.py:19-23, 859-872); MHCPreOp.forward_cuda and
MHCPostOp.forward_cuda run the same functions as torch.ops.vllm.mhc_{pre,post}_tilelang (model_executor/layers/
mhc.py:45-72, 212-222; registered at kernels/mhc/tilelang.py:658-669):
- pre: ``mhc_pre_tilelang(residual, fn, hc_scale, hc_base, rms_eps, hc_pre_eps, hc_sinkhorn_eps,
  hc_post_mult_value, sinkhorn_repeat)`` (kernels/mhc/tilelang.py:90-257): DeepGEMM's tf32_hc_prenorm_gemm split
  along K where vllm.utils.deep_gemm.is_deep_gemm_supported() (Hopper and Blackwell), else tilelang's
  hc_prenorm_gemm (:165-210), then the tilelang big-fuse kernel (RMS scale, sigmoids, Sinkhorn, the weighted sum);
  returns post_mix [T, hc, 1] fp32, comb_mix [T, hc, hc] fp32, layer_input [T, hidden] bf16.
- post: ``mhc_post_tilelang(x, residual, post_layer_mix, comb_res_mix)`` (:303-322), one tilelang kernel writing
  the new residual [T, hc, hidden] bf16.

What the row times is the reference collector's (collector/vllm/collect_mhc_module.py:106-228): per site a bf16
residual [T, hc_mult, hidden] and the layer's fp32 hc_*_fn [(2 + hc) x hc, hc x hidden], hc_*_base and hc_*_scale
(model.py:800-842; fn and base random, scale ones), the eps of the configs (rms_norm_eps = hc_eps = 1e-6), the
layer's hc_post_alpha 2.0 (model.py:799) and hc_sinkhorn_iters; pre without the fused RMSNorm weight (the consumer
bills the norm separately, collect_mhc_module.py:117-132), post on what pre made of its site's inputs. Serving
fuses post into the next pre (mhc_fused_post_pre_tilelang, model.py:873-915), which the table does not hold. A row
sums num_sites sites (the attention's and the FFN's), each with its own inputs, called in one prepared call.

kernel_source: the reference's label, vllm.model_executor.kernels.mhc.tilelang.mhc_{pre,post}_tilelang
(collect_mhc_module.py:220), the functions the call runs. verified_on: vllm==0.24.0
"""

from __future__ import annotations

from opcollect.backends.torch.mhc import check_case, mixes, site_inputs
from opcollect.runtime.contract import Prepared

EPS = 1e-6  # rms_norm_eps, hc_eps of the DeepSeek-V4 configs: rms_eps, hc_pre_eps and hc_sinkhorn_eps
POST_MULT = 2.0  # DeepseekV4DecoderLayer.hc_post_alpha (models/deepseek_v4/nvidia/model.py:799)
LABEL = "vllm.model_executor.kernels.mhc.tilelang.mhc_{op}_tilelang"
# the most SMs a GPU has that these rows run on (H200 132, B200 148): bounds DeepGEMM's K splits in the footprint
MAX_SMS = 160
SPLIT_BLOCK_M, SPLIT_BLOCK_K = 64, 64  # compute_num_split's blocks (kernels/mhc/tilelang.py:167-173)


def max_splits(num_tokens: int, depth: int) -> int:
    """The most K splits compute_num_split gives (kernels/mhc/tilelang_kernels.py:30-41): the SMs over the token
    tiles, at most a quarter of the K blocks, at least 1."""
    tiles = -(-num_tokens // SPLIT_BLOCK_M)
    return max(1, min(MAX_SMS // tiles, depth // SPLIT_BLOCK_K // 4))


def footprint(case) -> int:
    """Bytes of one input set: per site the residual, the weights and pre's outputs (post_mix, comb_mix,
    layer_input); pre adds its split-K partial products and square sums, post its new residual."""
    check_case(case, "vLLM")
    t, hc, h = case.num_tokens, case.hc_mult, case.hidden_size
    residual = t * hc * h * 2
    outputs = t * hc * 4 + t * hc * hc * 4 + t * h * 2
    if case.op_name == "pre":
        weights = mixes(hc) * (hc * h + 1) * 4 + 3 * 4
        partials = max_splits(t, hc * h) * t * (mixes(hc) + 1) * 4
        return case.num_sites * (residual + weights + outputs + partials)
    return case.num_sites * (2 * residual + outputs)


def prepare(case, dispatch: str, device: str, copies: int) -> Prepared:
    check_case(case, "vLLM")
    import torch
    from vllm.model_executor.kernels.mhc.tilelang import mhc_post_tilelang, mhc_pre_tilelang

    iters = case.sinkhorn_iters

    def pre(residual, fn, scale, base):
        return mhc_pre_tilelang(residual, fn, scale, base, EPS, EPS, EPS, POST_MULT, iters)

    sets = [[site_inputs(case, device, 1000 * c + 10 * s) for s in range(case.num_sites)] for c in range(copies)]
    if case.op_name == "pre":
        inputs = sets

        def run(sites) -> None:
            for site in sites:
                pre(*site)
    else:
        with torch.no_grad():  # post mixes what pre made of its site's inputs, as the collector feeds it
            inputs = []
            for sites in sets:
                made = []
                for site in sites:
                    post_mix, comb_mix, layer_input = pre(*site)
                    made.append((layer_input, site[0], post_mix, comb_mix))
                inputs.append(made)
        del sets  # the weights are pre's alone

        def run(sites) -> None:
            for x, residual, post_mix, comb_mix in sites:
                mhc_post_tilelang(x, residual, post_mix, comb_mix)

    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        with torch.no_grad():
            run(inputs[i])

    return Prepared(call, LABEL.format(op=case.op_name))
