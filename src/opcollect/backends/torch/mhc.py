"""DeepSeek-V4's hyper-connection (mHC) mixing in plain PyTorch: mhc_module_perf's pre and post.

The residual stream is hc_mult copies of hidden_size. pre (vLLM 0.24.0 model_executor/kernels/mhc/torch.py:6-91,
mhc_pre_torch, the fallback of MHCPreOp, model_executor/layers/mhc.py:139-164): the fp32 product of the flattened
residual [T, hc_mult x hidden] with fn [(2 + hc_mult) x hc_mult, hc_mult x hidden], scaled by the residual's
reciprocal RMS, gives hc_mult pre logits, hc_mult post logits and hc_mult x hc_mult combination logits; pre mix =
sigmoid + eps, post mix = post_mult x sigmoid, the combination a softmax over each row then sinkhorn_iters
normalisations (columns first, then rows and columns sinkhorn_iters - 1 more times), and the block input the pre
mix's weighted sum of the copies, in bf16. SGLang 0.5.14's hc_split_sinkhorn (srt/layers/mhc.py:72-159) computes
the same. post (mhc_post_torch, torch.py:94-106; SGLang's hc_post_torch_impl, srt/models/deepseek_v4.py:1426-1431):
copy j of the new residual = post_j x block output + sum_i comb_ij x residual_i.

As the vLLM collector times them (collector/vllm/collect_mhc_module.py:106-228): no fused RMSNorm weight, eps 1e-6,
post_mult 2.0, fn and base random, scale ones; a row is num_sites sites, each with its own inputs, and post mixes
the outputs of pre on its site's inputs. kernel_source is the plan's dispatch: torch_mhc_pre or torch_mhc_post.
"""

from __future__ import annotations

from opcollect.runtime.contract import KernelLimit, Prepared
from opcollect.runtime.timing import random_tensor

OPS = ("pre", "post")
EPS = 1e-6  # hc_eps and rms_norm_eps of the DeepSeek-V4 configs, the collectors' MHC_EPS
POST_MULT = 2.0  # hc_post_mult_value: vLLM's collector passes 2.0, SGLang's kernel multiplies by 2 (mhc.py:99)


def mixes(hc_mult: int) -> int:
    return (2 + hc_mult) * hc_mult


def check_case(case, framework: str) -> None:
    """A row every framework's mHC runner can time: pre or post, with tokens and sites."""
    if case.op_name not in OPS:
        raise KernelLimit(f"{framework}'s mHC has no op {case.op_name!r} ({', '.join(OPS)})")
    if case.num_tokens < 1 or case.num_sites < 1:
        raise KernelLimit(f"an mHC row needs tokens and sites (num_tokens={case.num_tokens}, sites={case.num_sites})")


def sinkhorn(logits, iters: int, eps: float = EPS):
    """The combination matrices [..., hc, hc] from their logits: a row softmax + eps, a column normalisation, then
    iters - 1 row-and-column normalisations (mhc_pre_torch, torch.py:78-82)."""
    import torch

    comb = torch.softmax(logits, dim=-1) + eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return comb


def pre(residual, fn, scale, base, iters: int, eps: float = EPS, post_mult: float = POST_MULT):
    """(post mix [T, hc, 1] fp32, combination [T, hc, hc] fp32, block input [T, hidden] bf16) of a residual
    [T, hc, hidden] (mhc_pre_torch, torch.py:56-91)."""
    import torch

    tokens, hc, hidden = residual.shape
    x = residual.reshape(tokens, hc * hidden).float()
    mixed = torch.matmul(x, fn.t())
    mixed = mixed * torch.rsqrt(x.square().sum(dim=-1, keepdim=True) / (hc * hidden) + eps)
    pre_mix = torch.sigmoid(mixed[:, :hc] * scale[0] + base[:hc]) + eps
    post_mix = torch.sigmoid(mixed[:, hc : 2 * hc] * scale[1] + base[hc : 2 * hc]) * post_mult
    logits = mixed[:, 2 * hc :].view(tokens, hc, hc) * scale[2] + base[2 * hc :].view(1, hc, hc)
    comb = sinkhorn(logits, iters, eps)
    layer_input = (pre_mix.unsqueeze(-1) * residual.float()).sum(dim=1).to(torch.bfloat16)
    return post_mix.view(tokens, hc, 1), comb, layer_input


def post(x, residual, post_mix, comb):
    """The new residual [T, hc, hidden]: post_mix x output + comb^T x residual (mhc_post_torch, torch.py:94-106)."""
    import torch

    mixed = torch.einsum("tij,tih->tjh", comb.float(), residual.float())
    return (mixed + post_mix.float() * x.unsqueeze(-2).float()).to(residual.dtype)


def footprint(case) -> int:
    """One input set: per site the bf16 residual, fn and the outputs, and the fp32 intermediates pre or post
    makes of the residual (its fp32 copy and a product of that size)."""
    wide = case.num_tokens * case.hc_mult * case.hidden_size
    weights = mixes(case.hc_mult) * (case.hc_mult * case.hidden_size + 1) * 4
    per_site = weights + wide * 2 + case.num_tokens * case.hidden_size * 2 + 2 * wide * 4
    return case.num_sites * per_site


def site_inputs(case, device: str, seed: int):
    """One site's (residual, fn, hc_scale, hc_base), as the collectors draw them; the vLLM and SGLang runners
    draw theirs here too."""
    import torch

    hc, hidden = case.hc_mult, case.hidden_size
    residual = random_tensor((case.num_tokens, hc, hidden), torch.bfloat16, device, seed)
    fn = random_tensor((mixes(hc), hc * hidden), torch.float32, device, seed + 1)
    base = random_tensor((mixes(hc),), torch.float32, device, seed + 2)
    scale = torch.ones(3, dtype=torch.float32, device=device)
    return residual, fn, scale, base


def prepare(case, dispatch: str, device: str, copies: int) -> Prepared:
    import torch

    iters = case.sinkhorn_iters
    sets = [[site_inputs(case, device, 1000 * c + 10 * s) for s in range(case.num_sites)] for c in range(copies)]
    if case.op_name == "pre":
        inputs = sets

        def run(sites) -> None:
            for residual, fn, scale, base in sites:
                pre(residual, fn, scale, base, iters)
    else:

        def post_inputs(residual, fn, scale, base):
            post_mix, comb, layer_input = pre(residual, fn, scale, base, iters)
            return layer_input, residual, post_mix, comb

        with torch.no_grad():  # post mixes what pre made of its site's inputs, as the collector feeds it
            inputs = [[post_inputs(*site) for site in sites] for sites in sets]

        def run(sites) -> None:
            for layer_input, residual, post_mix, comb in sites:
                post(layer_input, residual, post_mix, comb)

    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        with torch.no_grad():
            run(inputs[i])

    return Prepared(call, dispatch)
