"""A MoE layer's expert work on one rank: routed tokens through gate_up, SiLU-and-mul, down, combine.

Rank 0 of the EP group owns experts [0, num_experts / ep); it holds inter_size / tp of each. Routing
follows the case's distribution (balanced, or power law with exponent 1.01 or 1.2) as the reference collector
draws it, seeded from the case so every run routes the same tokens (opcollect.backends.torch.routing).
"""

from __future__ import annotations

from opcollect.runtime.contract import KernelLimit, Prepared
from opcollect.runtime.timing import random_tensor


def local_shape(case) -> tuple[int, int]:
    return case.num_experts // case.moe_ep_size, case.inter_size // case.moe_tp_size


def routing(case, device=None):
    """[num_tokens, topk] int64 expert ids for the whole batch, deterministic per case; every backend routes with
    it. Drawn on the CPU whatever the default device (callers build inside ``torch.device(...)``), then moved to
    ``device`` when one is given."""
    from opcollect.backends.torch.routing import expert_ids

    ids = expert_ids(case)
    return ids if device is None else ids.to(device)


def local_routes(case):
    """Rank 0's routed pairs: tokens per local expert, and the token of each pair grouped by expert."""
    import torch

    local, _ = local_shape(case)
    ids = routing(case).flatten()
    tokens = torch.arange(ids.numel(), device=ids.device) // case.topk
    mine = ids < local
    order = torch.sort(ids[mine], stable=True).indices
    return torch.bincount(ids[mine], minlength=local).tolist(), tokens[mine][order]


def footprint(case) -> int:
    local, inter = local_shape(case)
    weights = 3 * local * case.hidden_size * inter * 2
    routed = case.num_tokens * case.topk
    activations = (case.num_tokens * case.hidden_size + routed * (case.hidden_size + 3 * inter)) * 2
    return weights + activations


def prepare(case, dispatch: str, device: str, copies: int) -> Prepared:
    import torch
    import torch.nn.functional as F

    if case.moe_dtype not in ("bfloat16", "float32"):
        raise KernelLimit(f"the torch MoE runner has no {case.moe_dtype} experts")
    dtype = torch.bfloat16 if case.moe_dtype == "bfloat16" else torch.float32
    local, inter = local_shape(case)
    counts, token_of_pair = local_routes(case)
    active = [e for e, c in enumerate(counts) if c]
    hidden = case.hidden_size
    routed = sum(counts)
    w1 = [random_tensor((local, 2 * inter, hidden), dtype, device, 10 + i) for i in range(copies)]
    w2 = [random_tensor((local, hidden, inter), dtype, device, 20 + i) for i in range(copies)]
    tokens = random_tensor((case.num_tokens, hidden), dtype, device, 30)
    token_of_pair = token_of_pair.to(device)
    probs = torch.full((routed, 1), 1.0 / case.topk, dtype=dtype, device=device)
    out = torch.zeros((case.num_tokens, hidden), dtype=dtype, device=device)
    state = {"i": 0}
    grouped = dispatch == "torch._grouped_mm"
    if grouped and not (hasattr(torch, "_grouped_mm") and device.startswith("cuda")):
        raise KernelLimit("torch._grouped_mm needs a CUDA device (SM90+) and torch >= 2.8")
    offsets = torch.tensor(counts, device=device).cumsum(0).to(torch.int32)
    bounds = [0, *torch.tensor(counts).cumsum(0).tolist()]

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        if routed == 0:
            return
        x = tokens.index_select(0, token_of_pair)  # dispatch: gather each pair's token, grouped by expert
        if grouped:
            h = torch._grouped_mm(x, w1[i].transpose(1, 2), offs=offsets)
            gate, up = h.chunk(2, dim=-1)
            y = torch._grouped_mm(F.silu(gate) * up, w2[i].transpose(1, 2), offs=offsets)
        else:
            parts = []
            for e in active:
                xe = x[bounds[e] : bounds[e + 1]]
                gate, up = F.linear(xe, w1[i][e]).chunk(2, dim=-1)
                parts.append(F.linear(F.silu(gate) * up, w2[i][e]))
            y = torch.cat(parts)
        out.index_add_(0, token_of_pair, y * probs)  # combine: weighted scatter-add back to the tokens

    return Prepared(call, dispatch)
