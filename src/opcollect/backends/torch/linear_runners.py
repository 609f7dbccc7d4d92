"""The torch backend's gdn and mamba2 runners: one kernel of one layer per case, the math of
backends/torch/linear_attention.py on the inputs the reference collector hands the frameworks' kernels.

gdn (collector/vllm/collect_gdn.py:142-521, the vLLM 0.24.0 serving layout; heads on the rank):
- conv, context: the packed q | k | v channels (2 num_k_heads head_k_dim + num_v_heads head_v_dim) of
  batch_size x seq_len tokens, no bias, no earlier state; the final conv state is written, as serving's kernel does;
- core, context: the chunked scan with q and k L2-normalized, g = logsigmoid and beta = sigmoid (fp32), scale
  head_k_dim^-0.5, from a zero fp32 state per request, the final state written;
- conv, generation: one token per request through its bf16 inputs and its conv state;
- core, generation: the packed decode: the conv output split into q, k, v, q and k L2-normalized in the step,
  g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b), one recurrent step of the fp32 state.
mamba2 (collector/trtllm/collect_mamba2.py:128-700, the whole layer's heads): the conv over x | B | C
(nheads head_dim + 2 n_groups d_state channels) with bias; the SSD scan with dt_softplus, dt_bias, D, A < 0 per head,
chunk_size tokens a chunk, the final state returned; the decode's selective state update in the tied form serving
passes (one dt and A per head), with an fp32 state.

Inputs are bf16 as the frameworks' (weights and states as the collector makes them); the math runs in fp32. The
kernel_source is the plan's dispatch: torch_causal_conv1d, torch_gdn_chunked_scan, ... (plans/linear_attention.py).
"""

from __future__ import annotations

from opcollect.backends.torch import linear_attention as la
from opcollect.runtime.contract import KernelLimit, Prepared
from opcollect.runtime.timing import random_tensor

FP32 = 4


def gdn_channels(case) -> int:
    """The packed conv channels of a GDN layer on the rank: q and k (key heads) and v (value heads)."""
    return 2 * case.num_k_heads * case.head_k_dim + case.num_v_heads * case.head_v_dim


def mamba2_channels(case) -> int:
    """The conv channels of a Mamba2 layer: x (nheads x head_dim) and B and C (n_groups x d_state each)."""
    return case.nheads * case.head_dim + 2 * case.n_groups * case.d_state


def _check(case) -> None:
    if case.d_conv < 2:
        raise KernelLimit(f"d_conv {case.d_conv}: the causal conv1d keeps a state of d_conv - 1 >= 1 inputs")
    if hasattr(case, "num_k_heads") and case.num_v_heads % case.num_k_heads:
        raise KernelLimit(f"{case.num_v_heads} value heads are no multiple of {case.num_k_heads} key heads")


def gdn_footprint(case) -> int:
    """One input set and the fp32 intermediates of a call: the inputs in bf16 and fp32, the states, and for the
    chunked scan its per-chunk C x C matrices and corrected values and keys."""
    tokens, channels = case.num_tokens, gdn_channels(case)
    state = case.batch_size * case.num_v_heads * case.head_k_dim * case.head_v_dim * FP32
    if case.stage == "conv":
        return tokens * channels * (2 + 3 * FP32) + case.batch_size * channels * case.d_conv * FP32 * 2
    padded = case.batch_size * (-(-case.seq_len // la.GDN_CHUNK) * la.GDN_CHUNK)
    per_token = case.num_v_heads * (3 * case.head_k_dim + 3 * case.head_v_dim + 3 * la.GDN_CHUNK + 4)
    return 2 * state + tokens * channels * (2 + FP32) + padded * per_token * FP32


def mamba2_footprint(case) -> int:
    tokens, channels = case.num_tokens, mamba2_channels(case)
    inner = case.nheads * case.head_dim
    state = case.batch_size * inner * case.d_state * FP32
    if case.stage == "conv":
        return tokens * channels * (2 + 3 * FP32) + case.batch_size * channels * case.d_conv * FP32 * 2
    padded = case.batch_size * (-(-case.seq_len // case.chunk_size) * case.chunk_size)
    per_token = case.nheads * (3 * case.head_dim + 2 * case.d_state + 2 * case.chunk_size + 2)
    return 2 * state + tokens * channels * (2 + FP32) + padded * per_token * FP32


def _cycle(sets: list, step) -> Prepared:
    state = {"i": 0}

    def call() -> None:
        import torch

        i = state["i"] = (state["i"] + 1) % len(sets)
        with torch.no_grad():
            step(*sets[i])

    return call


def _conv(case, channels: int, device: str, copies: int, bias: bool):
    """The conv's input sets: (x, state, weight, bias) per copy; x [b, channels, seq] for a prompt, [b, channels]
    for a decode token; the state fp32 [b, channels, d_conv - 1]."""
    import torch

    b, width = case.batch_size, case.d_conv
    weight = random_tensor((channels, width), torch.bfloat16, device, 1)
    b_vec = random_tensor((channels,), torch.bfloat16, device, 2) if bias else None
    shape = (b, channels, case.seq_len) if case.phase == "context" else (b, channels)
    return [
        (
            random_tensor(shape, torch.bfloat16, device, 10 + i),
            random_tensor((b, channels, width - 1), torch.float32, device, 40 + i),
            weight,
            b_vec,
        )
        for i in range(copies)
    ]


def _run_conv(case):
    if case.phase == "context":

        def step(x, state, weight, bias) -> None:
            out, final = la.causal_conv1d(x, weight, bias)
            state.copy_(final)  # the kernel leaves the request's conv state for its decode
            out.to(x.dtype)

        return step

    def update(x, state, weight, bias) -> None:
        la.causal_conv1d_update(x, state, weight, bias).to(x.dtype)

    return update


def prepare_gdn(case, dispatch: str, device: str, copies: int) -> Prepared:
    import torch
    import torch.nn.functional as F

    _check(case)
    if case.stage == "conv":
        sets = _conv(case, gdn_channels(case), device, copies, bias=False)
        return Prepared(_cycle(sets, _run_conv(case)), dispatch)
    b, nk, dk, hv, dv = case.batch_size, case.num_k_heads, case.head_k_dim, case.num_v_heads, case.head_v_dim
    scale = dk**-0.5
    if case.phase == "context":
        s = case.seq_len

        def prompt(i: int):
            q = la.l2_normalize(random_tensor((b, s, nk, dk), torch.bfloat16, device, 10 + i)).bfloat16()
            k = la.l2_normalize(random_tensor((b, s, nk, dk), torch.bfloat16, device, 20 + i)).bfloat16()
            v = random_tensor((b, s, hv, dv), torch.bfloat16, device, 30 + i)
            g = F.logsigmoid(random_tensor((b, s, hv), torch.float32, device, 40 + i))
            beta = torch.sigmoid(random_tensor((b, s, hv), torch.float32, device, 50 + i))
            return q, k, v, g, beta, torch.zeros(b, hv, dk, dv, device=device)

        def scan(q, k, v, g, beta, state) -> None:
            state.zero_()  # no earlier state: each call is a new prompt
            la.gdn_chunked(q, k, v, g, beta, state, scale).to(v.dtype)

        return Prepared(_cycle([prompt(i) for i in range(copies)], scan), dispatch)
    a_log = random_tensor((hv,), torch.float32, device, 3)
    dt_bias = random_tensor((hv,), torch.bfloat16, device, 4)

    def token(i: int):
        mixed = random_tensor((b, gdn_channels(case)), torch.bfloat16, device, 10 + i)
        a = random_tensor((b, hv), torch.bfloat16, device, 20 + i)
        gate = random_tensor((b, hv), torch.bfloat16, device, 30 + i)
        return mixed, a, gate, torch.zeros(b, hv, dk, dv, device=device)

    def decode(mixed, a, gate, state) -> None:
        q, k, v = mixed.float().split([nk * dk, nk * dk, hv * dv], dim=-1)
        q, k = la.l2_normalize(q.view(b, nk, dk)), la.l2_normalize(k.view(b, nk, dk))
        g = -a_log.exp() * F.softplus(a.float() + dt_bias.float())
        la.gdn_step(q, k, v.view(b, hv, dv), g, torch.sigmoid(gate.float()), state, scale).to(mixed.dtype)

    return Prepared(_cycle([token(i) for i in range(copies)], decode), dispatch)


def prepare_mamba2(case, dispatch: str, device: str, copies: int) -> Prepared:
    import torch

    _check(case)
    if case.stage == "conv":
        sets = _conv(case, mamba2_channels(case), device, copies, bias=True)
        return Prepared(_cycle(sets, _run_conv(case)), dispatch)
    b, h, p, g, n = case.batch_size, case.nheads, case.head_dim, case.n_groups, case.d_state
    a = -torch.rand(h, device=device, generator=torch.Generator(device=device).manual_seed(3)).add_(0.5)
    d = random_tensor((h,), torch.float32, device, 4)
    dt_bias = random_tensor((h,), torch.float32, device, 5)
    tokens = (b, case.seq_len) if case.phase == "context" else (b,)

    def inputs(i: int):
        return (
            random_tensor((*tokens, h, p), torch.bfloat16, device, 10 + i),
            random_tensor((*tokens, h), torch.bfloat16, device, 20 + i),
            random_tensor((*tokens, g, n), torch.bfloat16, device, 30 + i),
            random_tensor((*tokens, g, n), torch.bfloat16, device, 40 + i),
            torch.zeros(b, h, p, n, device=device),
        )

    if case.phase == "context":

        def scan(x, dt, bmat, cmat, state) -> None:
            state.zero_()  # a new prompt: no earlier state; its final state is returned in place
            la.ssd_chunked(x, dt, a, bmat, cmat, d, dt_bias, state, case.chunk_size).to(x.dtype)

        return Prepared(_cycle([inputs(i) for i in range(copies)], scan), dispatch)

    def update(x, dt, bmat, cmat, state) -> None:
        la.ssd_step(x, dt, a, bmat, cmat, d, dt_bias, state).to(x.dtype)

    return Prepared(_cycle([inputs(i) for i in range(copies)], update), dispatch)
