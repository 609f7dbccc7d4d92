"""Qwen3.5's Gated DeltaNet kernels as SGLang 0.5.14 serves them: one kernel of one layer on one rank per row
(gdn_perf), the calls GDNAttnBackend makes (srt/layers/attention/linear/gdn_backend.py:303-376 decode, :378-517
prefill) with the kernel object its default backend builds.

What each row times, with the rank's heads (conv_dim = 2 num_k_heads head_k_dim + num_v_heads head_v_dim):
- conv, context: ``causal_conv1d_fn`` of srt/layers/attention/mamba/causal_conv1d.py:32 (the CUDA entry gdn_backend.py:
  34-39 binds) as forward_extend calls it (:442-451): x the transposed packed q | k | v of the batch's tokens (Qwen3.5's
  fused_qkvzba_split_reshape_cat_contiguous makes it [T, conv_dim] contiguous, models/qwen3_5.py:506-514), the layer's
  conv weight, no bias, silu, the layer's conv states, has_initial_state all False (fresh prompts), cache_indices, the
  batch's query_start_loc and seq_lens_cpu. Given a strided x and seq_lens_cpu it runs the Triton kernel
  (causal_conv1d.py:74-91, causal_conv1d_triton.py:382).
- core, context: TritonGDNKernel.extend (srt/layers/attention/linear/kernels/gdn_triton.py:129-156), the prefill
  kernel of the default backend (triton: server_args.py:1750-1770; GDNKernelDispatcher, gdn_backend.py:63-99): FLA's
  ``chunk_gated_delta_rule`` (fla/chunk.py:133) on q, k [1, T, num_k_heads, head_k_dim] and v [1, T, num_v_heads,
  head_v_dim] bf16 contiguous (fused_qkv_split_gdn_prefill, jit_kernel/triton/gdn_fused_proj.py:356-390), g and beta
  [1, T, num_v_heads] fp32 (fused_gdn_gating, fla/fused_gdn_gating.py:44-75), the state pool in place with the
  requests' slots, q and k L2-normalized in the call.
- conv, generation: the Triton ``causal_conv1d_update`` (mamba/causal_conv1d_triton.py:991) serving keeps for decode
  (gdn_backend.py:13-16, :319-326) on one token a request, in place.
- core, generation: TritonGDNKernel.packed_decode (gdn_triton.py:41-89), the packed path forward_decode takes
  (gdn_backend.py:328-346): ``fused_recurrent_gated_delta_rule_packed_decode`` (fla/fused_recurrent.py:268) on the
  conv's output, a and b [batch, num_v_heads] bf16, the layer's A_log (fp32) and dt_bias (bf16, the model dtype,
  models/qwen3_5.py:236-242), scale head_k_dim^-0.5, the state pool in place.

State pools as serving lays them out: Mamba2StateShape.create (srt/configs/mamba_utils.py:129-180, called with Qwen3.5's
keys as configs/qwen3_next.py:287-306 does, here with the rank's heads and a TP of 1) gives the conv state
(conv_dim, d_conv - 1) and the recurrent state (num_v_heads, head_v_dim, head_k_dim); mamba2_state_dtype (:39-94) their
dtypes, bf16 and the config's mamba_ssm_dtype (float32 in every Qwen3.5 config); MambaPool holds size + 1 slots a
layer, contiguous (mem_cache/memory_pool.py:366-394), and a layer's cache is its slice (mamba2_layer_cache). The
requests hold slots 0..batch_size - 1, as the reference collector's (collector/sglang/collect_gdn.py:189, 359).

Timing: the harness replays each call from a CUDA graph (an op whose capture fails is timed eagerly). Serving replays
decode batches from its CUDA graphs and runs prefill eagerly, queued behind the layer's other kernels, so a prefill
row holds the GPU time of the call, as the reference's does (benchmark_with_power, repeat_n 10). The prefill conv's
grid comes from seq_lens_cpu on the host (causal_conv1d_triton.py:506-511); FLA derives its chunk lists from
query_start_loc once per tensor (@tensor_cache, fla/index.py:16-26), so the batch's one query_start_loc is shared by
every input set, as serving shares it among the layers.

Deliberate differences from the reference collector (collect_gdn.py:118-512), none in the key columns: the layer's
kernel object (TritonGDNKernel) makes the prefill and decode core calls, as serving's dispatcher does, where the
collector calls the FLA functions; the packed decode allocates its output inside the call, as TritonGDNKernel does;
the states are drawn random for decode rows (the collector's are zeros).
"""

from __future__ import annotations

from types import SimpleNamespace

from opcollect.backends.gdn_layer import check_heads, check_packed_decode, conv_dim, conv_weight, cycle
from opcollect.runtime.contract import KernelLimit, Prepared
from opcollect.runtime.timing import random_tensor

INT32_OFFSETS = 2**31  # the Triton prefill conv's int32 token offsets (causal_conv1d_triton.py:373-379)
MAMBA_SSM_DTYPE = "float32"  # every Qwen3.5 config's mamba_ssm_dtype, which mamba2_state_dtype reads
ACTIVATION = "silu"
CONV_FN, CONV_UPDATE = "causal_conv1d_fn", "causal_conv1d_update"
CHUNK = "chunk_gated_delta_rule"
PACKED_DECODE = "fused_recurrent_gated_delta_rule_packed_decode"


def check_case(case) -> None:
    """KernelLimit, before any framework import, for what SGLang's kernels cannot launch."""
    check_heads(case)
    elements = case.num_tokens * conv_dim(case)
    if case.phase == "context" and elements >= INT32_OFFSETS:
        # the prefill conv's token offsets wrap at 2^31 elements and write out of bounds, poisoning the CUDA context;
        # serving cannot run the layer's prefill there, so neither of its rows is timed (the reference refuses both,
        # collect_gdn.py:168-186)
        raise KernelLimit(
            f"SGLang's prefill causal_conv1d computes int32 token offsets: num_tokens x conv_dim = {elements} >= 2^31 "
            "(srt/layers/attention/mamba/causal_conv1d_triton.py:373-379)"
        )
    check_packed_decode(case, "SGLang", "srt/layers/attention/fla/fused_recurrent.py:373")


def footprint(case) -> int:
    """Bytes of one input set: the layer's pools of batch_size + 1 slots, and per stage its inputs and outputs."""
    check_case(case)
    conv, value = conv_dim(case), case.num_v_heads * case.head_v_dim
    t, b, nv = case.num_tokens, case.batch_size, case.num_v_heads
    pools = (b + 1) * ((case.d_conv - 1) * conv * 2 + nv * case.head_v_dim * case.head_k_dim * 4)
    if case.stage == "conv":
        out = t * conv * 2 if case.phase == "context" else 0  # the decode conv writes in place
        return pools + t * conv * 2 + out + conv * case.d_conv * 2
    if case.phase == "generation":
        return pools + t * conv * 2 + 2 * b * nv * 2 + b * value * 2 + nv * 6
    # q, k, v, g, beta in; the normalized q and k; the output
    return pools + t * conv * 2 * 2 + t * nv * 8 + t * value * 2 + (t // 64 + b + 1) * 16


def pools(case, device: str, seed: int, fill: bool):
    """One layer's (conv states [slots, conv_dim, d_conv - 1], recurrent states [slots, HV, V, K]) as MambaPool
    allocates them for batch_size requests; random where the requests carry earlier state (decode)."""
    import torch
    from sglang.srt.configs.mamba_utils import Mamba2StateShape, mamba2_state_dtype

    shape = Mamba2StateShape.create(
        tp_world_size=1,
        intermediate_size=case.num_v_heads * case.head_v_dim,
        n_groups=case.num_k_heads,
        num_heads=case.num_v_heads,
        head_dim=case.head_v_dim,
        state_size=case.head_k_dim,
        conv_kernel=case.d_conv,
    )
    dtype = mamba2_state_dtype(SimpleNamespace(mamba_ssm_dtype=MAMBA_SSM_DTYPE))
    slots = case.batch_size + 1
    conv = torch.zeros((slots, *shape.conv[0]), dtype=dtype.conv, device=device)
    ssm = torch.zeros((slots, *shape.temporal), dtype=dtype.temporal, device=device)
    if fill:
        gen = torch.Generator(device=device).manual_seed(seed)
        conv.normal_(generator=gen)
        ssm.normal_(generator=gen)
    return conv, ssm


def triton_kernel():
    """The GDN kernel object of SGLang's default linear-attention backend (triton for decode and prefill)."""
    from sglang.srt.layers.attention.linear.kernels.gdn_triton import TritonGDNKernel

    kernel = TritonGDNKernel()
    if not kernel.supports_packed_decode:
        raise KernelLimit("SGLang's Triton GDN kernel has no packed decode on this platform (gdn_triton.py:41)")
    return kernel


def prepare(case, dispatch: str, device: str, copies: int) -> Prepared:
    check_case(case)
    import torch

    b, t = case.batch_size, case.num_tokens
    indices = torch.arange(b, dtype=torch.int32, device=device)
    if case.phase == "context":
        # one batch's lists, shared by every input set as serving shares them among the layers
        starts = torch.arange(0, t + 1, case.seq_len, dtype=torch.int32, device=device)
        if case.stage == "conv":
            return _prepare_conv_fn(case, device, copies, starts, indices)
        return _prepare_extend(case, device, copies, starts, indices)
    if case.stage == "conv":
        from sglang.srt.layers.attention.mamba.causal_conv1d_triton import causal_conv1d_update

        weight = conv_weight(case, device)

        def conv_set(i: int):
            conv, _ = pools(case, device, 40 + i, fill=True)
            return random_tensor((b, conv_dim(case)), torch.bfloat16, device, 10 + i), conv

        def run_update(mixed_qkv, conv) -> None:
            causal_conv1d_update(mixed_qkv, conv, weight, None, ACTIVATION, conv_state_indices=indices)

        return Prepared(cycle([conv_set(i) for i in range(copies)], run_update), CONV_UPDATE)
    kernel = triton_kernel()
    nv = case.num_v_heads
    a_log = random_tensor((nv,), torch.float32, device, 2)
    dt_bias = random_tensor((nv,), torch.bfloat16, device, 3)

    def step_set(i: int):
        _, ssm = pools(case, device, 40 + i, fill=True)
        mixed_qkv = random_tensor((b, conv_dim(case)), torch.bfloat16, device, 10 + i)
        a = random_tensor((b, nv), torch.bfloat16, device, 20 + i)
        gate = random_tensor((b, nv), torch.bfloat16, device, 30 + i)
        return mixed_qkv, a, gate, ssm

    def run_step(mixed_qkv, a, gate, ssm) -> None:
        kernel.packed_decode(
            mixed_qkv,
            a,
            gate,
            A_log=a_log,
            dt_bias=dt_bias,
            scale=case.head_k_dim**-0.5,
            ssm_states=ssm,
            cache_indices=indices,
            num_v_heads=nv,
            head_v_dim=case.head_v_dim,
        )

    return Prepared(cycle([step_set(i) for i in range(copies)], run_step), PACKED_DECODE)


def _prepare_conv_fn(case, device: str, copies: int, starts, indices) -> Prepared:
    import torch
    from sglang.srt.layers.attention.mamba.causal_conv1d import causal_conv1d_fn

    weight = conv_weight(case, device)
    fresh = torch.zeros(case.batch_size, dtype=torch.bool, device=device)
    seq_lens_cpu = [case.seq_len] * case.batch_size  # forward_batch.extend_seq_lens_cpu

    def conv_set(i: int):
        conv, _ = pools(case, device, 40 + i, fill=False)
        mixed_qkv = random_tensor((case.num_tokens, conv_dim(case)), torch.bfloat16, device, 10 + i)
        return mixed_qkv.transpose(0, 1), conv

    def run_conv(x, conv) -> None:
        causal_conv1d_fn(
            x,
            weight,
            None,
            activation=ACTIVATION,
            conv_states=conv,
            has_initial_state=fresh,
            cache_indices=indices,
            query_start_loc=starts,
            seq_lens_cpu=seq_lens_cpu,
        )

    return Prepared(cycle([conv_set(i) for i in range(copies)], run_conv), CONV_FN)


def _prepare_extend(case, device: str, copies: int, starts, indices) -> Prepared:
    import torch
    import torch.nn.functional as F

    kernel = triton_kernel()
    t, nk, hk, nv, hv = case.num_tokens, case.num_k_heads, case.head_k_dim, case.num_v_heads, case.head_v_dim

    def scan_set(i: int):
        _, ssm = pools(case, device, 40 + i, fill=False)  # fresh slots are cleared (MambaPool.clear_slots)
        return (
            random_tensor((1, t, nk, hk), torch.bfloat16, device, 10 + i),
            random_tensor((1, t, nk, hk), torch.bfloat16, device, 20 + i),
            random_tensor((1, t, nv, hv), torch.bfloat16, device, 30 + i),
            F.logsigmoid(random_tensor((1, t, nv), torch.float32, device, 40 + i)),
            torch.sigmoid(random_tensor((1, t, nv), torch.float32, device, 50 + i)),
            ssm,
        )

    def run_scan(q, k, v, g, beta, ssm) -> None:
        kernel.extend(q, k, v, g, beta, ssm_states=ssm, cache_indices=indices, query_start_loc=starts)

    return Prepared(cycle([scan_set(i) for i in range(copies)], run_scan), CHUNK)
