"""Context and generation attention through TensorRT-LLM's PyTorch-flow attention backends, built as serving builds
one attention layer's backend and timed as its forward runs: the KV cache write (fused with RoPE on the TRTLLM
backend) and the attention kernel.

Built as the reference collector builds it (ai-dynamo/aiconfigurator collector/trtllm/collect_attn.py, AIC below,
written for 1.3.0rc20): create_attention(backend, layer 0, heads, head_dim, kv heads, pos_embd_params,
quant_config) (AIC :224-233; attention_backend/utils.py create_attention), a KVCacheManager over a one-layer
SELF cache with block reuse off (AIC :271-295), dummy requests holding each sequence's blocks (AIC :297-300), the
backend's own Metadata class with the batch's lengths and prepare() (AIC :302-365; serving builds it from the
backend's Metadata, pyexecutor/model_engine.py), and forward(qkv, None, None, metadata, attention_window_size,
attention_sinks, out_scale) on the TRTLLM backend or forward(q, k, v, metadata, attention_window_size) on FlashInfer
(AIC :376-396; TrtllmAttention.forward and FlashInferAttention.forward in attention_backend/trtllm.py and
flashinfer.py; later versions merge these keywords into AttentionForwardArgs, interface.py
merge_attention_forward_args, so the call is the same).

Where this runner deliberately differs from the collector, and the direction:
- 32 tokens per block, serving's KvCacheConfig default, not the collector's 64 (attention_inputs.py).
- RoPE of the whole head (RopeParams(dim=head_dim)), as RopeParams.from_config gives a full-rotary model; the
  collector passes dim=128 to every head (AIC :202): the same for head_dim 128, a wider or narrower rotation else.
- one cache manager holds ``copies`` input sets, each its own requests and blocks, cycled by call() so the cache
  reads come from HBM; the collector times one set. Each metadata's prepare() is followed by a device sync
  (context.prepare_metadata): the manager stages every batch's block offsets in one shared pinned buffer.
- a windowed case gives the cache manager its window (KvCacheConfig.max_attention_window), as serving does for a
  sliding layer; the collector gives it none (attention_inputs.max_attention_window).
kernel_source is read from the class create_attention built (attention_inputs.kernel_source): get_attention_backend
falls back to TrtllmAttention when FlashInfer cannot be imported (utils.py:52-53 at 1.3.0rc20, cited by AIC
:234-238), which then shows as torch_flow under a torch_flow_flashinfer dispatch.

Lifetime: our Prepared has no release hook, so the KVCacheManager (whose pools TensorRT-LLM allocates outside
torch's caching allocator) is shut down by context.hold_until_dropped on call(): the harness drops the Prepared
after the case (runtime/timing.py measure), call() is freed with it, and KVCacheManager.shutdown() releases the pools
(resource_manager.py: impl.release_pools(), as AIC :454 calls it). call() holds no reference cycle, so this happens
at once, before the harness empties torch's cache. A failed prepare shuts the manager down itself.
"""

from __future__ import annotations

import os
from functools import partial

from opcollect.backends.trtllm import attention_inputs as inputs
from opcollect.backends.trtllm.context import (
    SERVED_VERSIONS,
    hold_until_dropped,
    one_rank_mapping,
    prepare_metadata,
    quant_config,
    release_pending,
)
from opcollect.runtime.contract import KernelLimit, Prepared, Runner
from opcollect.runtime.devices import device_sm
from opcollect.runtime.timing import random_tensor

# TensorRT-LLM's Gemma-4 pins FlashInfer's trtllm-gen sub-backend on every layer (models/modeling_gemma4.py:263-270
# at 1.3.0rc20, cited by AIC :246-259); create_attention leaves FlashInferAttention on its "fa2" default
# (flashinfer.py FlashInferAttention.__init__: kwargs.pop('flashinfer_backend', "fa2"))
FLASHINFER_SUB_BACKEND = "trtllm-gen"


def footprint(case, context: bool) -> int:
    return inputs.footprint(case, context)


def _refuse(case, context: bool, backend: str, sm: str) -> None:
    reason = inputs.refusal(case, context, backend, sm)
    if reason is not None:
        raise KernelLimit(reason)


def _metadata(attn, lay: inputs.AttentionLayout, copy: int, manager, mapping, workspace):
    """The batch of input set ``copy`` in the built backend's Metadata class, prepared (AIC :302-365)."""
    import torch
    from tensorrt_llm._torch.attention_backend.interface import AttentionRuntimeFeatures
    from tensorrt_llm._torch.metadata import KVCacheParams

    request_ids = list(lay.request_ids(copy))
    # token_nums is past_kv_len + input_len (resource_manager.py KVCacheManager.add_dummy_requests): the blocks
    # a sequence holds once this call has written its new tokens
    manager.add_dummy_requests(request_ids, [lay.kv_tokens] * lay.batch_size)
    metadata_cls = type(attn).Metadata
    kwargs = {}
    if "workspace" in getattr(metadata_cls, "__dataclass_fields__", {}):
        kwargs["workspace"] = workspace  # TrtllmAttentionMetadata only; FlashInfer keeps its own buffer
    metadata = metadata_cls(
        max_num_requests=lay.batch_size,
        max_num_tokens=lay.batch_size * lay.kv_tokens,
        kv_cache_manager=manager,
        mapping=mapping,
        enable_flash_mla=False,
        seq_lens=torch.tensor(lay.seq_lens, dtype=torch.int32, device="cpu"),
        num_contexts=lay.num_contexts,
        position_ids=None,
        cross=None,
        request_ids=request_ids,
        prompt_lens=list(lay.prompt_lens),
        kv_cache_params=KVCacheParams(
            use_cache=True,
            num_cached_tokens_per_seq=list(lay.num_cached_tokens_per_seq),
            block_ids_per_seq=None,
            host_max_attention_window_sizes=None,
            host_sink_token_length=None,
        ),
        # no chunked prefill, reuse or draft tokens: a plain prompt or decode step (AIC :313-329)
        runtime_features=AttentionRuntimeFeatures(
            chunked_prefill=False, cache_reuse=False, has_speculative_draft_tokens=False
        ),
        all_rank_num_tokens=None,
        **kwargs,
    )
    return prepare_metadata(metadata)


def prepare(case, dispatch: str, device: str, copies: int, context: bool) -> Prepared:
    backend = inputs.backend_name(dispatch)
    sm = device_sm(device)
    _refuse(case, context, backend, sm)
    release_pending()  # an earlier case's pools, if its Prepared is still referenced somewhere
    import torch
    from tensorrt_llm._torch.attention_backend.interface import (
        PositionalEmbeddingParams,
        PositionEmbeddingType,  # tensorrt_llm.functional's enum, as interface.py imports it
        RopeParams,
    )
    from tensorrt_llm._torch.attention_backend.utils import create_attention, get_attention_backend
    from tensorrt_llm._torch.pyexecutor.resource_manager import (
        CacheTypeCpp,
        DataType,
        KvCacheConfig,  # llmapi.llm_args.KvCacheConfig, the class KVCacheManager is annotated with
        KVCacheManager,
    )

    # the collector turns XQA JIT off for prefill, whose XQA prepare fails for some head/length settings, and on for
    # decode (AIC :138-143); TensorRT-LLM reads the variable when its attention op runs
    os.environ["TRTLLM_ENABLE_XQA_JIT"] = "0" if context else "1"
    lay = inputs.attention_layout(case, context)
    h, kvh, d = case.num_heads, case.num_key_value_heads, case.head_dim
    # serving hands pos_embd_params to the backend only where the class fuses RoPE (modules/attention.py:601-610
    # at 1.3.0rc20): TrtllmAttention does, FlashInferAttention does not (interface.py support_fused_rope; AIC
    # :194-202)
    pos = (
        PositionalEmbeddingParams(type=PositionEmbeddingType.rope_gpt_neox, rope=RopeParams(dim=d))
        if get_attention_backend(backend).support_fused_rope()
        else None
    )
    attn = create_attention(
        backend_name=backend,
        layer_idx=0,
        num_heads=h,
        head_dim=d,
        num_kv_heads=kvh,
        pos_embd_params=pos,
        quant_config=quant_config(case.attn_dtype, case.kv_cache_dtype),
        is_mla_enable=False,
    )
    built = type(attn).__name__
    # a fallback to TrtllmAttention must pass TrtllmAttention's limits before it runs (head_dim 512 would abort)
    _refuse(case, context, "TRTLLM" if built == "TrtllmAttention" else backend, sm)
    if built == "FlashInferAttention":
        attn.flashinfer_backend = FLASHINFER_SUB_BACKEND
    fused_qkv = type(attn).support_fused_qkv()  # TrtllmAttention: True; FlashInferAttention: False (interface.py)
    manager = KVCacheManager(
        KvCacheConfig(
            max_tokens=lay.pool_tokens(copies),
            enable_block_reuse=False,
            max_attention_window=inputs.max_attention_window(lay),  # a sliding layer's window, as serving passes it
        ),
        CacheTypeCpp.SELF,  # dense attention keeps K and V (pyexecutor/_util.py:1539 at 1.3.0rc20; AIC :279-283)
        num_layers=1,
        num_kv_heads=kvh,
        head_dim=d,
        tokens_per_block=lay.tokens_per_block,
        max_seq_len=lay.max_seq_len,
        max_batch_size=copies * lay.batch_size,
        mapping=one_rank_mapping(),
        dtype=DataType.FP8 if case.kv_cache_dtype == "fp8" else DataType.BF16,
    )
    try:
        mapping = one_rank_mapping()
        workspace = torch.empty(0, dtype=torch.int8, device=device)  # sized by the op, shared as serving shares it
        metadatas = [_metadata(attn, lay, c, manager, mapping, workspace) for c in range(copies)]
        bf16 = torch.bfloat16
        if fused_qkv:
            args = [(random_tensor(lay.qkv_shape, bf16, device, c), None, None) for c in range(copies)]
        else:
            args = [
                (
                    random_tensor(lay.q_shape, bf16, device, c),
                    random_tensor(lay.kv_shape, bf16, device, 100 + c),
                    random_tensor(lay.kv_shape, bf16, device, 200 + c),
                )
                for c in range(copies)
            ]
        kwargs = {"attention_window_size": lay.window}
        if built == "TrtllmAttention":
            # sinks: one float32 per query head (trtllm.py wrapper.plan docstring); the output scale is the unit
            # scale standing in for o_proj.inv_input_scale (AIC :180-187); with an fp8 model (QuantAlgo.FP8) and an
            # fp8 cache TrtllmAttention then writes an fp8 output (trtllm.py get_quantize_output_dtype)
            sinks = random_tensor((h,), torch.float32, device, 300) if inputs.uses_sinks(case) else None
            scale = torch.ones(1, dtype=torch.float32, device=device) if inputs.uses_out_scale(case, context) else None
            kwargs.update(attention_sinks=sinks, out_scale=scale)
        # one forward per input set before timing: FlashInfer plans each metadata's wrappers at its first forward
        # behind a host sync (flashinfer.py FlashInferAttentionMetadata plan: "Must sync after
        # append_paged_kv_cache and before plan"), and the TRTLLM op grows the workspace; neither may fall into
        # the harness's graph capture, which only warms three calls
        for c in range(copies):
            attn.forward(*args[c], metadatas[c], **kwargs)
        torch.cuda.synchronize(torch.device(device))
    except BaseException:
        manager.shutdown()
        raise
    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        attn.forward(*args[i], metadatas[i], **kwargs)

    hold_until_dropped(call, manager.shutdown)
    return Prepared(call, inputs.kernel_source(built))


RUNNERS = {
    "attention_context": (
        Runner(partial(footprint, context=True), partial(prepare, context=True), versions=SERVED_VERSIONS),
    ),
    "attention_generation": (
        Runner(partial(footprint, context=False), partial(prepare, context=False), versions=SERVED_VERSIONS),
    ),
}
