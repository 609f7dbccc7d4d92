"""What TensorRT-LLM's Gated DeltaNet and Mamba2 runners (backends/trtllm/linear_attention.py) build and label: the
refusals, the layer config, the state pools' layout and the bytes a case needs. No tensorrt_llm and no torch import:
the CPU tests check these by hand.

Sources (TensorRT-LLM, cited by symbol: no v1.3.0rc20 or rc23 checkout is in reach, tests/data/trtllm-release/
README.md; the copies read are named there): _torch/modules/mamba/gdn_mixer.py Qwen3NextGatedDeltaNet (the layer
Qwen3-Next and Qwen3.5 serve), _torch/modules/mamba/mamba2_mixer.py Mamba2Mixer (Nemotron-H's), and the mamba cache
manager (_torch/pyexecutor/.../mamba_cache_manager: conv_state_shape = [conv_dim, d_conv - 1] and ssm_state_shape =
[nheads, head_dim, d_state] per slot, conv states in the model dtype). A GDN layer takes the mamba cache with
nheads = value heads, head_dim = head_v_dim and d_state = head_k_dim (conv_dim = 2 nk hk + nv hv), so its recurrent
state per slot is [HV, V, K], K innermost (fla/fused_sigmoid_gating_recurrent.py: "Pool layout [slots, HV, V, K]").
"""

from __future__ import annotations

from typing import NamedTuple

from opcollect.runtime.contract import KernelLimit

PHASES = ("context", "generation")
STAGES = ("conv", "core")
# kernel_source: the reference collector's fixed labels (AIC collector/trtllm/collect_gdn.py:229, 256, 464, 507;
# collect_mamba2.py:340, 396, 635, 688), which the plan's dispatch names (plans/linear_attention.py TRTLLM_GDN,
# TRTLLM_MAMBA2; the runtime does not import plans, so they are repeated here)
GDN_DECODE = "fused_recurrent_gated_delta_rule"  # serving's decode is its fused-gating form (linear_attention.py)
CONV = {("conv", "context"): "causal_conv1d_fn", ("conv", "generation"): "causal_conv1d_update"}
LABELS = {
    "gdn": {**CONV, ("core", "context"): "chunk_gated_delta_rule", ("core", "generation"): GDN_DECODE},
    "mamba2": {
        **CONV,
        ("core", "context"): "mamba_chunk_scan_combined",
        ("core", "generation"): "selective_state_update",
    },
}
BF16, FP32 = 2, 4
FLA_CHUNK = 64  # the vendored FLA chunk of the gated delta rule (fla/chunk.py BT)


def label(op: str, case) -> str:
    return LABELS[op][(case.stage, case.phase)]


def check_case(op: str, case) -> None:
    """Refuse, before anything is imported or allocated, a case TensorRT-LLM's layer cannot run."""
    if op not in LABELS:
        raise KernelLimit(f"TensorRT-LLM's linear-attention runners have no op {op!r} ({', '.join(LABELS)})")
    if case.stage not in STAGES or case.phase not in PHASES:
        raise KernelLimit(f"{op}: no kernel for stage {case.stage!r} in phase {case.phase!r}")
    if case.batch_size < 1 or case.seq_len < 1 or case.num_tokens != case.batch_size * case.seq_len:
        raise KernelLimit(
            f"{op}: {case.batch_size} requests of {case.seq_len} tokens do not make num_tokens {case.num_tokens}"
        )
    if case.phase == "generation" and case.seq_len != 1:
        raise KernelLimit(f"{op}: a decode step is one token per request, not {case.seq_len}")
    if case.d_conv < 2:
        raise KernelLimit(f"{op}: d_conv {case.d_conv}: the conv state keeps d_conv - 1 >= 1 inputs")
    if op == "gdn" and case.num_v_heads % case.num_k_heads:
        raise KernelLimit(f"gdn: {case.num_v_heads} value heads are no multiple of {case.num_k_heads} key heads")
    if op == "mamba2" and case.nheads % case.n_groups:
        raise KernelLimit(f"mamba2: {case.nheads} heads are no multiple of {case.n_groups} groups")


def gdn_config(case) -> dict:
    """The config fields Qwen3NextGatedDeltaNet.__init__ reads, at one rank: the case's heads are the rank's, so the
    layer is built with them as its whole (tp 1). hidden_size is the model's (no timed kernel reads it)."""
    return {
        "hidden_size": case.d_model,
        "linear_num_key_heads": case.num_k_heads,
        "linear_key_head_dim": case.head_k_dim,
        "linear_num_value_heads": case.num_v_heads,
        "linear_value_head_dim": case.head_v_dim,
        "linear_conv_kernel_dim": case.d_conv,
        "hidden_act": "silu",  # every Qwen3.5 / Qwen3-Next config.json
        "rms_norm_eps": 1e-6,
    }


def mamba2_config(case) -> dict:
    """Mamba2Mixer's keyword arguments for the case's whole layer (the reference's heads are unsharded)."""
    return {
        "d_model": case.d_model,
        "d_state": case.d_state,
        "d_conv": case.d_conv,
        "nheads": case.nheads,
        "n_groups": case.n_groups,
        "head_dim": case.head_dim,
        "chunk_size": case.chunk_size,
        "layer_idx": 0,
    }


def conv_dim(op: str, case) -> int:
    """The channels the layer convolves: GDN's packed q | k | v (gdn_mixer conv_dim_per_tp = 2 key_dim + value_dim),
    Mamba2's x | B | C (mamba2_mixer conv_dim = d_inner + 2 n_groups d_state)."""
    if op == "gdn":
        return 2 * case.num_k_heads * case.head_k_dim + case.num_v_heads * case.head_v_dim
    return case.nheads * case.head_dim + 2 * case.n_groups * case.d_state


class Pools(NamedTuple):
    """The layer cache's state pools: slots x conv [conv_dim, d_conv - 1] and slots x ssm state."""

    slots: int
    conv: tuple[int, int]
    ssm: tuple[int, int, int]


def pools(op: str, case, copies: int) -> Pools:
    """Each of the ``copies`` input sets owns batch_size slots of its own (the harness's cold-L2 rotation)."""
    conv = (conv_dim(op, case), case.d_conv - 1)
    if op == "gdn":
        ssm = (case.num_v_heads, case.head_v_dim, case.head_k_dim)
    else:
        ssm = (case.nheads, case.head_dim, case.d_state)
    return Pools(copies * case.batch_size, conv, ssm)


def slot_range(case, copy: int) -> tuple[int, int]:
    return copy * case.batch_size, (copy + 1) * case.batch_size


def footprint(op: str, case) -> int:
    """Bytes of one input set with its state slots and the call's outputs and intermediates (states counted at 4
    bytes, the widest cache dtype the layer is served with)."""
    check_case(op, case)
    b, tokens, channels = case.batch_size, case.num_tokens, conv_dim(op, case)
    p = pools(op, case, 1)
    state = b * p.ssm[0] * p.ssm[1] * p.ssm[2] * FP32
    if case.stage == "conv":  # input, conv state slots (the output is written over the input)
        return tokens * channels * BF16 + b * channels * (case.d_conv - 1) * BF16 + (b + 1) * 8
    if op == "gdn":
        key, value, heads = case.num_k_heads * case.head_k_dim, case.num_v_heads * case.head_v_dim, case.num_v_heads
        inputs = tokens * (channels + 2 * heads) * BF16 + tokens * 2 * heads * FP32 + tokens * value * BF16
        if case.phase == "generation":
            return inputs + state
        chunks = b * -(-case.seq_len // FLA_CHUNK)
        # FLA's chunked forward: the per-chunk states h [chunks, HV, K, V], w and u, the chunk's A, the new values
        middle = chunks * heads * case.head_k_dim * case.head_v_dim * FP32
        middle += tokens * (heads * (case.head_k_dim + 2 * case.head_v_dim) + key) * BF16
        middle += tokens * heads * FLA_CHUNK * FP32
        return inputs + 2 * state + middle
    inner, groups = case.nheads * case.head_dim, case.n_groups * case.d_state
    inputs = tokens * (2 * inner + 2 * groups) * BF16 + tokens * case.nheads * FP32
    if case.phase == "generation":  # dt is expanded per head_dim as a view; A, D, dt_bias expanded per head
        return inputs + state + case.nheads * case.head_dim * (case.d_state + 2) * FP32
    chunks = b * -(-case.seq_len // case.chunk_size) + b
    # the SSD scan: dt and its cumsum, per-chunk states before and after passing, C B^T per chunk and group
    middle = 2 * tokens * case.nheads * FP32 + 2 * chunks * case.nheads * case.head_dim * case.d_state * FP32
    middle += chunks * case.n_groups * case.chunk_size * case.chunk_size * FP32
    return inputs + 2 * state + middle
