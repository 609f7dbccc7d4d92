"""Qwen3.5's Gated DeltaNet kernels as vLLM 0.24.0 serves them: one kernel of one layer on one rank per row
(gdn_perf), the calls QwenGatedDeltaNetAttention._forward_core makes (model_executor/layers/mamba/gdn/
qwen_gdn_linear_attn.py:1260-1576) and its decode fast path _forward_core_decode_non_spec (:1644-1696).

What each row times, with the rank's heads (key_dim = num_k_heads x head_k_dim, value_dim likewise, conv_dim =
2 key_dim + value_dim):
- conv, context: ``causal_conv1d_fn`` (model_executor/layers/mamba/ops/causal_conv1d.py:468) over the packed q | k | v
  of batch_size fresh prompts of seq_len tokens, as _forward_core calls it (:1361-1375): x the transposed q | k | v
  split of the in_proj_qkvz output (Qwen3.5's layout, forward_cuda :936-940: rows of conv_dim + value_dim, so x is
  a strided view), no bias (the layer's conv1d has none, :467-472), silu, the layer's conv state, has_initial_state
  all False, cache_indices the requests' state slots, and the batch's GDNAttentionMetadata carrying the conv
  kernel's precomputed launch lists (compute_causal_conv1d_metadata, v1/attention/backends/utils.py:810-856, as the
  GDN metadata builder runs it once per batch, v1/attention/backends/gdn_attn.py:364-369).
- core, context: the layer's ChunkGatedDeltaRule (:291-418) called as _forward_core calls it (:1515-1529): q and k
  [1, T, num_k_heads, head_k_dim] L2-normalized and v [1, T, num_v_heads, head_v_dim] in bf16, contiguous, g (log
  decay) and beta fp32 [1, T, num_v_heads] (what fused_post_conv_prep hands it, fla/ops/fused_gdn_prefill_post_conv.py:
  152-203), the requests' fp32 initial state gathered from the cache and zeroed (no earlier state, :1512-1514),
  output_final_state, cu_seqlens, the builder's chunk_indices and chunk_offsets (gdn_attn.py:339-356: FLA's
  prepare_chunk_indices/prepare_chunk_offsets on the host), use_qk_l2norm_in_kernel False. ChunkGatedDeltaRule
  picks its backend when built (_resolve_gdn_prefill_backend, :150-211): FlashInfer's GDN prefill on SM90 (and on
  the SM100 family with head_k_dim 128 under CUDA 13), FLA's Triton chunk elsewhere; the row is labelled
  chunk_gated_delta_rule_{backend} from the object built (the reference's label, collector/vllm/collect_gdn.py:333).
- conv, generation: ``causal_conv1d_update`` (causal_conv1d.py:1069) on one token a request (the q | k | v split of
  the projection output, written in place), the conv state slots, validate_data False (:1674-1682).
- core, generation: ``fused_recurrent_gated_delta_rule_packed_decode`` (fla/ops/fused_recurrent.py:339) on the conv's
  output, a and b [batch, num_v_heads] bf16 contiguous (forward_cuda :941-943), the layer's A_log (fp32) and dt_bias
  (bf16, the model dtype, :516-522), scale head_k_dim^-0.5, the fp32 state cache in place with the slots, the
  output [batch, 1, num_v_heads, head_v_dim], use_qk_l2norm_in_kernel (:1683-1695); serving takes this path by
  default (VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE, envs.py:115).

State caches as serving lays them out: MambaStateShapeCalculator.gated_delta_net_state_shape and
gated_delta_net_state_dtype (model_executor/layers/mamba/mamba_utils.py:213-234, :107-116) give the conv state
(d_conv - 1, conv_dim) in the model's bf16 (SD layout, the default, :26-43) and the recurrent state (num_v_heads,
head_v_dim, head_k_dim) in fp32 (the Qwen3.5 configs' mamba_ssm_dtype, which vLLM adopts, models/config.py:
605-628); both lie in one page a block, strided views of one buffer (MambaSpec.page_size_bytes, v1/
kv_cache_interface.py:637-646; v1/worker/gpu_model_runner.py:7160-7180), and the conv kernels get the conv state
transposed to (conv_dim, d_conv - 1) (qwen_gdn_linear_attn.py:1311-1315). Block 0 is vLLM's null block
(NULL_BLOCK_ID, v1/attention/backends/utils.py:46); the requests hold blocks 1..batch_size.

Timing: the harness replays each call from a CUDA graph. Serving replays decode batches up to its largest capture size
from one (FULL_AND_PIECEWISE); the GDN core is a splitting op that prefill runs eagerly, queued behind the layer's
other kernels, so its row holds the GPU time of the call as the reference's does (collect_gdn.py:210-216).

Deliberate differences from serving and the reference collector (collect_gdn.py), none in the key columns:
- the cache pages are not padded to the attention layers' page size (platforms/interface.py:779-797 pads them in a
  hybrid model): a padded page moves where the next block starts, not what a kernel reads;
- the reference draws x as its own [T, conv_dim] tensor and passes no chunk_indices/chunk_offsets (the Triton chunk
  then derives them on the device); here x is serving's strided split and the builder's lists are passed;
- decode's conv passes validate_data False as serving does (the reference True: host-side asserts only);
- the FLA Triton chunk's intermediates (per-chunk states, the WY factors) are not in the footprint: a case they do not
  fit fails as oom where the Triton backend is chosen.
"""

from __future__ import annotations

from opcollect.backends.gdn_layer import check_heads, check_packed_decode, conv_dim, conv_weight, cycle
from opcollect.runtime.contract import Prepared
from opcollect.runtime.timing import random_tensor

MAMBA_SSM_DTYPE = "float32"  # every Qwen3.5 config's mamba_ssm_dtype (models/config.py:605-628 adopts it)
MAMBA_CACHE_DTYPE = "auto"  # --mamba-cache-dtype's default: the conv state in the model's dtype
MAX_MODEL_LEN = 262_144  # Qwen3.5's max_position_embeddings: the mamba block size without prefix caching
ACTIVATION = "silu"  # the layer's hidden_act (GatedDeltaNetAttention)
CONV_FN, CONV_UPDATE = "causal_conv1d_fn", "causal_conv1d_update"
PACKED_DECODE = "fused_recurrent_gated_delta_rule_packed_decode"
CHUNK_LABEL = "chunk_gated_delta_rule_{backend}"


def dims(case) -> tuple[int, int, int]:
    """(key_dim, value_dim, conv_dim) on the rank."""
    return case.num_k_heads * case.head_k_dim, case.num_v_heads * case.head_v_dim, conv_dim(case)


def check_case(case) -> None:
    """KernelLimit, before any framework import, for what vLLM's kernels cannot launch."""
    check_heads(case)
    check_packed_decode(case, "vLLM", "fla/ops/fused_recurrent.py:449")  # launches grid (NV, B * HV), :448-449


def page_bytes(case) -> int:
    """One block's page: the bf16 conv state and the fp32 recurrent state (MambaSpec.page_size_bytes)."""
    _, _, conv = dims(case)
    return (case.d_conv - 1) * conv * 2 + case.num_v_heads * case.head_v_dim * case.head_k_dim * 4


def footprint(case) -> int:
    """Bytes of one input set: the state pages of batch_size + 1 blocks, and per stage its inputs and outputs."""
    check_case(case)
    key, value, conv = dims(case)
    t, b, nv = case.num_tokens, case.batch_size, case.num_v_heads
    pages = (b + 1) * page_bytes(case)
    projected = t * (conv + value) * 2  # the in_proj_qkvz output the q | k | v split views
    if case.stage == "conv":
        out = t * conv * 2 if case.phase == "context" else 0  # the decode conv writes in place
        return pages + projected + out + conv * case.d_conv * 2
    if case.phase == "generation":
        return pages + projected + 2 * b * nv * 2 + b * value * 2 + nv * 6
    state = b * nv * case.head_v_dim * case.head_k_dim * 4
    # q, k, v, g, beta in; the gathered initial and the final state; the output; FlashInfer's exp(g) and lists
    return t * (2 * key + value) * 2 + t * nv * 12 + 2 * state + t * value * 2 + (t // 64 + b + 1) * 16


def state_views(raw, shapes, dtypes, page: int, blocks: int) -> list:
    """The conv and recurrent state of ``blocks`` blocks as strided views of one buffer, page by page, as
    _reshape_kv_cache_tensors lays a MambaSpec's states out (v1/worker/gpu_model_runner.py:7160-7180)."""
    import torch

    views, offset = [], 0
    for shape, dtype in zip(shapes, dtypes):
        size = dtype.itemsize
        inner = [1]
        for extent in reversed(shape):
            inner.insert(0, inner[0] * extent)
        stride = (page // size, *inner[1:])
        views.append(torch.as_strided(raw.view(dtype), (blocks, *shape), stride, offset // size))
        offset += inner[0] * size
    return views


def state_cache(case, device: str, seed: int, fill: bool):
    """(conv state viewed (blocks, conv_dim, d_conv - 1), recurrent state (blocks, HV, V, K)) of batch_size + 1
    blocks, views of one buffer the views keep alive; random where the requests carry earlier state (decode), zeros
    for fresh prompts."""
    import torch
    from vllm.model_executor.layers.mamba.mamba_utils import MambaStateDtypeCalculator, MambaStateShapeCalculator
    from vllm.v1.kv_cache_interface import MambaSpec

    shapes = MambaStateShapeCalculator.gated_delta_net_state_shape(
        1, case.num_k_heads, case.num_v_heads, case.head_k_dim, case.head_v_dim, case.d_conv, 0
    )
    dtypes = MambaStateDtypeCalculator.gated_delta_net_state_dtype(torch.bfloat16, MAMBA_CACHE_DTYPE, MAMBA_SSM_DTYPE)
    page = MambaSpec(shapes=tuple(shapes), dtypes=tuple(dtypes), block_size=MAX_MODEL_LEN).page_size_bytes
    blocks = case.batch_size + 1
    raw = torch.zeros(blocks * page, dtype=torch.int8, device=device)
    conv, ssm = state_views(raw, shapes, dtypes, page, blocks)
    if fill:
        gen = torch.Generator(device=device).manual_seed(seed)
        conv.normal_(generator=gen)
        ssm.normal_(generator=gen)
    # the conv kernels take (..., dim, width - 1): SD layout stores its transpose (qwen_gdn_linear_attn.py:1311-1315)
    return conv.transpose(-1, -2), ssm


def slots(case, device: str):
    """The requests' state blocks 1..batch_size (block 0 is the null block)."""
    import torch

    return torch.arange(1, case.batch_size + 1, dtype=torch.int32, device=device)


def projected(case, device: str, seed: int):
    """The in_proj_qkvz output of the batch's tokens and its q | k | v split (forward_cuda :936-940)."""
    import torch

    _, value, conv = dims(case)
    qkvz = random_tensor((case.num_tokens, conv + value), torch.bfloat16, device, seed)
    return qkvz, qkvz[:, :conv]


def prompt_lists(case):
    """query_start_loc of batch_size prompts of seq_len tokens, on the host (int32)."""
    import torch

    return torch.arange(0, case.num_tokens + 1, case.seq_len, dtype=torch.int32)


def conv_metadata(case, device: str, starts_cpu, starts, indices, fresh):
    """The batch's GDNAttentionMetadata with the conv kernel's launch lists, as the builder makes it (gdn_attn.py:
    358-369, 482-507)."""
    import torch
    from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadata
    from vllm.v1.attention.backends.utils import compute_causal_conv1d_metadata

    nums, batch_ptr, offsets = compute_causal_conv1d_metadata(starts_cpu, device=torch.device(device))
    b, t = case.batch_size, case.num_tokens
    return GDNAttentionMetadata(
        num_prefills=b,
        num_prefill_tokens=t,
        num_decodes=0,
        num_decode_tokens=0,
        num_spec_decodes=0,
        num_spec_decode_tokens=0,
        num_actual_tokens=t,
        has_initial_state=fresh,
        non_spec_query_start_loc=starts,
        non_spec_state_indices_tensor=indices,
        prefill_query_start_loc=starts,
        prefill_state_indices=indices,
        prefill_has_initial_state=fresh,
        nums_dict=nums,
        batch_ptr=batch_ptr,
        token_chunk_offset_ptr=offsets,
    )


def chunk_op(case, device: str):
    """ChunkGatedDeltaRule built as the layer builds it, under a config whose text config holds the layer's keys
    (the resolver reads linear_key_head_dim, qwen_gdn_linear_attn.py:175-177)."""
    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import ChunkGatedDeltaRule

    from opcollect.backends.vllm.context import vllm_context

    with vllm_context(device) as config:
        text = config.model_config.hf_text_config
        text.linear_num_key_heads, text.linear_key_head_dim = case.num_k_heads, case.head_k_dim
        text.linear_num_value_heads, text.linear_value_head_dim = case.num_v_heads, case.head_v_dim
        text.linear_conv_kernel_dim, text.mamba_ssm_dtype = case.d_conv, MAMBA_SSM_DTYPE
        return ChunkGatedDeltaRule()


def prepare(case, dispatch: str, device: str, copies: int) -> Prepared:
    check_case(case)
    if case.phase == "context":
        return _prepare_context(case, device, copies)
    return _prepare_generation(case, device, copies)


def _prepare_context(case, device: str, copies: int) -> Prepared:
    import torch
    import torch.nn.functional as F

    b, t, nk, hk, nv, hv = (case.batch_size, case.num_tokens, case.num_k_heads, case.head_k_dim, case.num_v_heads,
                            case.head_v_dim)  # fmt: skip
    starts_cpu = prompt_lists(case)
    starts = starts_cpu.to(device)  # one batch's lists, shared by every layer as serving shares them
    indices = slots(case, device)
    fresh = torch.zeros(b, dtype=torch.bool, device=device)
    if case.stage == "conv":
        from vllm.model_executor.layers.mamba.ops.causal_conv1d import causal_conv1d_fn

        metadata = conv_metadata(case, device, starts_cpu, starts, indices, fresh)
        weight = conv_weight(case, device)

        def conv_set(i: int):
            _, mixed_qkv = projected(case, device, 10 + i)
            conv_state, _ = state_cache(case, device, 40 + i, fill=False)
            return mixed_qkv.transpose(0, 1), conv_state

        def run_conv(x, conv_state) -> None:
            causal_conv1d_fn(
                x,
                weight,
                None,
                activation=ACTIVATION,
                conv_states=conv_state,
                has_initial_state=fresh,
                cache_indices=indices,
                query_start_loc=starts,
                metadata=metadata,
            )

        return Prepared(cycle([conv_set(i) for i in range(copies)], run_conv), CONV_FN)
    from vllm.model_executor.layers.fla.ops.index import prepare_chunk_indices, prepare_chunk_offsets
    from vllm.model_executor.layers.fla.ops.utils import FLA_CHUNK_SIZE

    chunk = chunk_op(case, device)
    chunk_indices = prepare_chunk_indices(starts_cpu, FLA_CHUNK_SIZE).to(device)
    chunk_offsets = prepare_chunk_offsets(starts_cpu, FLA_CHUNK_SIZE).to(device)

    def scan_set(i: int):
        q = F.normalize(random_tensor((1, t, nk, hk), torch.bfloat16, device, 10 + i), dim=-1)
        k = F.normalize(random_tensor((1, t, nk, hk), torch.bfloat16, device, 20 + i), dim=-1)
        v = random_tensor((1, t, nv, hv), torch.bfloat16, device, 30 + i)
        g = F.logsigmoid(random_tensor((1, t, nv), torch.float32, device, 40 + i))
        beta = torch.sigmoid(random_tensor((1, t, nv), torch.float32, device, 50 + i))
        return q, k, v, g, beta, torch.zeros(b, nv, hv, hk, dtype=torch.float32, device=device)

    def run_scan(q, k, v, g, beta, initial) -> None:
        chunk(
            q=q,
            k=k,
            v=v,
            g=g,
            beta=beta,
            initial_state=initial,
            output_final_state=True,
            cu_seqlens=starts,
            chunk_indices=chunk_indices,
            chunk_offsets=chunk_offsets,
            use_qk_l2norm_in_kernel=False,
        )

    label = CHUNK_LABEL.format(backend=chunk.gdn_prefill_backend)
    return Prepared(cycle([scan_set(i) for i in range(copies)], run_scan), label)


def _prepare_generation(case, device: str, copies: int) -> Prepared:
    import torch

    b, nv, hv = case.batch_size, case.num_v_heads, case.head_v_dim
    indices = slots(case, device)
    if case.stage == "conv":
        from vllm.model_executor.layers.mamba.ops.causal_conv1d import causal_conv1d_update

        weight = conv_weight(case, device)

        def conv_set(i: int):
            _, mixed_qkv = projected(case, device, 10 + i)
            conv_state, _ = state_cache(case, device, 40 + i, fill=True)
            return mixed_qkv, conv_state

        def run_update(mixed_qkv, conv_state) -> None:
            causal_conv1d_update(
                mixed_qkv,
                conv_state,
                weight,
                None,
                ACTIVATION,
                conv_state_indices=indices,
                validate_data=False,
            )

        return Prepared(cycle([conv_set(i) for i in range(copies)], run_update), CONV_UPDATE)
    from vllm.model_executor.layers.fla.ops import fused_recurrent_gated_delta_rule_packed_decode

    a_log = random_tensor((nv,), torch.float32, device, 2)
    dt_bias = random_tensor((nv,), torch.bfloat16, device, 3)
    scale = case.head_k_dim**-0.5

    def step_set(i: int):
        _, mixed_qkv = projected(case, device, 10 + i)  # the conv's output, in the split it overwrote
        _, ssm = state_cache(case, device, 40 + i, fill=True)
        a = random_tensor((b, nv), torch.bfloat16, device, 20 + i)
        gate = random_tensor((b, nv), torch.bfloat16, device, 30 + i)
        return mixed_qkv, a, gate, ssm, torch.zeros(b, 1, nv, hv, dtype=torch.bfloat16, device=device)

    def run_step(mixed_qkv, a, gate, ssm, out) -> None:
        fused_recurrent_gated_delta_rule_packed_decode(
            mixed_qkv=mixed_qkv,
            a=a,
            b=gate,
            A_log=a_log,
            dt_bias=dt_bias,
            scale=scale,
            initial_state=ssm,
            out=out,
            ssm_state_indices=indices,
            use_qk_l2norm_in_kernel=True,
        )

    return Prepared(cycle([step_set(i) for i in range(copies)], run_step), PACKED_DECODE)
