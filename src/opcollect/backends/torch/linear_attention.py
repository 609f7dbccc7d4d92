"""Gated DeltaNet and Mamba2 in plain PyTorch: the math of the linear-attention kernels (gdn_perf, mamba2_perf), a
chunked form for a prompt and a recurrent step for a decode token; backends/torch/linear_runners.py times them.

Causal conv1d (both layers): a depthwise convolution of ``width`` taps over the sequence, each output seeing its
own token and the width - 1 before it, then SiLU (vLLM 0.24.0 model_executor/layers/mamba/ops/causal_conv1d.py:468
causal_conv1d_fn, :1069 causal_conv1d_update). A decode token's update convolves the conv state (the last width - 1
inputs) with it and shifts it in.

Gated DeltaNet (FLA's gated delta rule, vLLM fla/ops/chunk.py, fused_recurrent.py): per value head a state S
[dk, dv] decays by exp(g_t), is corrected toward v_t along k_t with strength beta_t, and read by q_t:
S_t = exp(g_t) S_{t-1};  S_t += k_t (beta_t (v_t - S_t^T k_t))^T;  o_t = S_t^T (q_t scale). The chunked form
(FLA's WY representation) solves each chunk's C x C unit-lower-triangular system for the corrected values, so a
chunk costs matrix products instead of C sequential steps. q and k have num_k_heads heads, each serving
num_v_heads / num_k_heads value heads.

Mamba2 (SSD, vLLM model_executor/layers/mamba/ops/ssd_combined.py, mamba_ssm.py selective_state_update): per head
h (scalar A_h < 0, group g = h / (heads / groups) of B and C) a state S [p, n]: dt_t = softplus(dt_t + dt_bias),
S_t = exp(dt_t A_h) S_{t-1} + dt_t x_t B_t^T, y_t = S_t C_t + D_h x_t. The chunked form computes each chunk's
outputs as a masked product within it plus the decayed state it starts from.

Every function computes in float32 whatever its inputs' dtype; states are float32 and updated in place.
"""

from __future__ import annotations

import math

GDN_CHUNK = 64  # FLA's chunk of the gated delta rule (fla/ops/chunk.py BT)


def causal_conv1d(x, weight, bias=None):
    """SiLU of the causal depthwise convolution of x [batch, channels, seq] with weight [channels, width] (and
    bias [channels]); returns (output [batch, channels, seq] fp32, the final conv state [batch, channels,
    width - 1]: the last width - 1 inputs, zeros before the first)."""
    import torch
    import torch.nn.functional as F

    width = weight.shape[-1]
    padded = F.pad(x.float(), (width - 1, 0))
    out = F.conv1d(padded, weight.float().unsqueeze(1), None if bias is None else bias.float(), groups=x.shape[1])
    return F.silu(out), padded[..., padded.shape[-1] - (width - 1) :].clone() if width > 1 else torch.empty(0)


def causal_conv1d_update(x, state, weight, bias=None):
    """One token x [batch, channels] through the conv whose last width - 1 inputs ``state`` [batch, channels,
    width - 1] (fp32) holds: returns the SiLU output [batch, channels] fp32 and shifts x into the state."""
    import torch
    import torch.nn.functional as F

    window = torch.cat([state, x.float().unsqueeze(-1)], dim=-1)
    out = (window * weight.float()).sum(dim=-1)
    if bias is not None:
        out = out + bias.float()
    state.copy_(window[..., 1:])
    return F.silu(out)


def l2_normalize(x, eps: float = 1e-6):
    """x / sqrt(sum x^2 + eps) over the last dim (FLA's l2norm, fla/ops/l2norm.py)."""
    import torch

    x = x.float()
    return x * torch.rsqrt(x.square().sum(dim=-1, keepdim=True) + eps)


def expand_heads(x, heads: int):
    """[..., key heads, d] -> [..., heads, d]: each key head serves heads / key heads value heads, consecutive."""
    return x.repeat_interleave(heads // x.shape[-2], dim=-2) if x.shape[-2] != heads else x


def gdn_step(q, k, v, g, beta, state, scale: float):
    """One decode token per request: q, k [b, key heads, dk], v [b, hv, dv], g (log decay) and beta [b, hv],
    state [b, hv, dk, dv] fp32 (updated); returns o [b, hv, dv] fp32."""
    import torch

    hv = v.shape[1]
    q, k = expand_heads(q.float(), hv), expand_heads(k.float(), hv)
    state.mul_(g.float().exp()[..., None, None])
    read = torch.einsum("bhk,bhkv->bhv", k, state)
    delta = (v.float() - read) * beta.float()[..., None]
    state.add_(k[..., :, None] * delta[..., None, :])
    return torch.einsum("bhk,bhkv->bhv", q * scale, state)


def gdn_chunked(q, k, v, g, beta, state, scale: float, chunk: int = GDN_CHUNK):
    """A prompt per request: q, k [b, s, key heads, dk], v [b, s, hv, dv], g and beta [b, s, hv], state
    [b, hv, dk, dv] fp32 (the initial state, then the final one); returns o [b, s, hv, dv] fp32.

    Per chunk of C tokens with cumulative log decay c: the corrected values V' = T (beta V) - T (beta exp(c) K) S,
    T the inverse of I + strictly lower (beta_t k_t . k_i exp(c_t - c_i)); the outputs (q exp(c)) S + (Q K^T
    exp(c_t - c_i), lower) V'; the state S exp(c_C) + (K exp(c_C - c))^T V'."""
    import torch
    import torch.nn.functional as F

    b, s, _, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    pad = (-s) % chunk  # padded tokens: no decay (g 0) and no update (beta 0, k 0)

    def blocks(x, last: int | None):  # [b, s, h, d] or [b, s, h] -> [b, h, n, C, d] or [b, h, n, C]
        x = x.float()
        x = F.pad(x, (0, 0, 0, 0, 0, pad) if last else (0, 0, 0, pad))
        x = x.view(b, -1, chunk, hv, last) if last else x.view(b, -1, chunk, hv)
        return x.permute(0, 3, 1, 2, 4) if last else x.permute(0, 3, 1, 2)

    q, k = blocks(expand_heads(q.float(), hv), dk) * scale, blocks(expand_heads(k.float(), hv), dk)
    v, g, beta = blocks(v, dv), blocks(g, None), blocks(beta, None)
    c = g.cumsum(dim=-1)  # [b, hv, n, C]
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    gaps = (c[..., :, None] - c[..., None, :]).masked_fill(~lower, -math.inf).exp()  # exp(c_t - c_i), i <= t
    strict = (beta[..., None] * (k @ k.transpose(-1, -2)) * gaps).tril(-1)
    eye = torch.eye(chunk, device=q.device)
    inverse = torch.linalg.solve_triangular(eye + strict, eye, upper=False, unitriangular=True)
    u = inverse @ (v * beta[..., None])
    w = inverse @ (k * (beta * c.exp())[..., None])
    attn = (q @ k.transpose(-1, -2)) * gaps
    out = torch.empty_like(v)
    for i in range(c.shape[2]):
        corrected = u[:, :, i] - w[:, :, i] @ state
        out[:, :, i] = (q[:, :, i] * c[:, :, i, :, None].exp()) @ state + attn[:, :, i] @ corrected
        last = c[:, :, i, -1]
        keys = k[:, :, i] * (last[..., None] - c[:, :, i]).exp()[..., None]
        state.mul_(last.exp()[..., None, None]).add_(keys.transpose(-1, -2) @ corrected)
    return out.permute(0, 2, 3, 1, 4).reshape(b, -1, hv, dv)[:, :s]


def ssd_step(x, dt, a, bmat, cmat, d, dt_bias, state):
    """One decode token per request: x [b, h, p], dt [b, h] (before softplus), a, d, dt_bias [h], B and C
    [b, groups, n], state [b, h, p, n] fp32 (updated); returns y [b, h, p] fp32."""
    import torch
    import torch.nn.functional as F

    h = x.shape[1]
    dt = F.softplus(dt.float() + dt_bias.float())
    bmat, cmat = expand_heads(bmat.float(), h), expand_heads(cmat.float(), h)
    state.mul_((dt * a.float()).exp()[..., None, None])
    state.add_((dt[..., None] * x.float())[..., None] * bmat[..., None, :])
    return torch.einsum("bhpn,bhn->bhp", state, cmat) + d.float()[:, None] * x.float()


def ssd_chunked(x, dt, a, bmat, cmat, d, dt_bias, state, chunk: int):
    """A prompt per request: x [b, s, h, p], dt [b, s, h] (before softplus), a, d, dt_bias [h], B and C
    [b, s, groups, n], state [b, h, p, n] fp32 (the initial state, then the final one); returns y [b, s, h, p] fp32.

    Per chunk of C tokens with cumulative decay c = cumsum(dt a): y_t = exp(c_t) S C_t + sum_{i <= t}
    exp(c_t - c_i) (C_t . B_i) dt_i x_i + D x_t; S <- exp(c_C) S + sum_i exp(c_C - c_i) dt_i x_i B_i^T."""
    import torch
    import torch.nn.functional as F

    b, s, h, p = x.shape
    n = bmat.shape[-1]
    pad = (-s) % chunk  # padded tokens: dt softplus(0 + bias) would decay, so their dt is forced to 0

    def blocks(t, last: int | None):
        t = F.pad(t.float(), (0, 0, 0, 0, 0, pad) if last else (0, 0, 0, pad))
        t = t.view(b, -1, chunk, h, last) if last else t.view(b, -1, chunk, h)
        return t.permute(0, 3, 1, 2, 4) if last else t.permute(0, 3, 1, 2)

    dt = F.softplus(dt.float() + dt_bias.float())
    xs, dts = blocks(x, p), blocks(dt, None)  # the padding's dt is 0 after softplus
    bs, cs = blocks(expand_heads(bmat.float(), h), n), blocks(expand_heads(cmat.float(), h), n)
    c = (dts * a.float()[None, :, None, None]).cumsum(dim=-1)  # [b, h, nc, C]
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=x.device).tril()
    gaps = (c[..., :, None] - c[..., None, :]).masked_fill(~lower, -math.inf).exp()
    mixed = (cs @ bs.transpose(-1, -2)) * gaps  # [b, h, nc, C, C]
    inputs = xs * dts[..., None]  # dt_i x_i
    out = mixed @ inputs
    for i in range(c.shape[2]):
        out[:, :, i] += c[:, :, i, :, None].exp() * (cs[:, :, i] @ state.transpose(-1, -2))
        last = c[:, :, i, -1]
        weighted = inputs[:, :, i] * (last[..., None] - c[:, :, i]).exp()[..., None]
        state.mul_(last.exp()[..., None, None]).add_(weighted.transpose(-1, -2) @ bs[:, :, i])
    y = out.permute(0, 2, 3, 1, 4).reshape(b, -1, h, p)[:, :s]
    return y + d.float()[:, None] * x.float()
