"""DeepSeek's sparse attention (DSA: DeepSeek-V3.2, GLM-5) as TensorRT-LLM 1.3.0rc20 serves it: the whole attention
module of layer 0 at one rank, prefill and decode (dsa_{context,generation}_module_perf), built as the reference
collector builds it (AIC: ai-dynamo/aiconfigurator collector/trtllm/collect_mla_module.py at 095f58a5, `__compat__
"trtllm>=1.3.0rc20"`, :47; its calls hold for both pins, as context.SERVED_VERSIONS). TensorRT-LLM sources are cited
by symbol at the copies named in tests/data/trtllm-release/README.md (no rc20 or rc23 checkout is in reach) and the
sparse/dsa.py read at 00e3c1a5.

What is built (dsa_inputs has the fields and the pure rules):
- A ModelConfig of the architecture's fields as model_type deepseek_v32 (AIC :534-541), the rank's heads, the case's
  QuantConfig for the projections and the KV cache (mla_module.EXCLUDED leaves kv_b_proj bf16 for fp8_block, as a
  served block-fp8 checkpoint does, AIC :340-365), attn_backend TRTLLM, skip_create_weights_in_init, and a
  DeepSeekSparseAttentionConfig of the indexer's heads, head size and top-k (AIC :477-499), the rest its defaults
  (skip_indexer_for_short_seqs on: a request whose keys fit in index_topk skips the indexer's logits and top-k).
- DeepseekV3DecoderLayer(model_config, 0, aux streams).self_attn (AIC :552-606): for deepseek_v32 the decoder layer
  builds the DSA attention (DeepseekV32Attention in modeling_deepseekv3.py), an MLA whose mqa backend is the DSA
  backend (create_attention with the sparse config: sparse/dsa.py DSATrtllmAttention) holding the Indexer (wq_b,
  wk, k_norm, head weights, its rope) and whose fused q_a/kv_a projection carries the indexer's wk. Before its
  weights are created the excluded modules get a QuantConfig with only the KV cache algorithm (as serving's
  apply_quant_config_exclude_modules, AIC :558-582); weights are drawn as TensorRT-LLM's dummy loader draws them
  (mla_module.fill_dummy_weights) and post_load_weights runs on every module that has it (AIC :584-595).
- The cache manager serving picks for the sparse config (pyexecutor/_util.py get_kv_cache_manager_cls: the DSA
  cache manager, with the indexer's key pool), SELFKONLY, one layer of 576-wide latents, block reuse off, pages of 64
  on SM90 and 32 elsewhere, every sequence's tokens registered (AIC :636-702).
- The DSA metadata (type(self_attn.mqa).Metadata) with the fields the executor sets (AIC :704-776): the lowered
  sparse_metadata_params, enable_flash_mla as ModelConfig has it, prompt_lens the new tokens, and for a prompt after
  a cached prefix enable_context_mla_with_cached_kv with cache_reuse; the indexer attached; prepare() run.
Each call runs self_attn.forward(position_ids, hidden_states, metadata) inside model_extra_attrs with the metadata
registered (AIC :905-940): the projections, the indexer (its keys quantized into the key cache, fp8 MQA logits
over the cached keys and the top index_topk, or none for a request within index_topk), the sparse MLA over the
chosen keys and o_proj. kernel_source is default, the static label of every TensorRT-LLM DSA row (AIC :974), for a
built MLA with an indexer on TensorRT-LLM's attention backend (dsa_inputs.module_label). torch_ops.check_installed
refuses an install whose sources no longer build or feed the module this way.

A context row is isl new tokens after `step` cached ones; a generation row one new token after `step` cached ones
(AIC :650-661).

Deliberate differences from the reference collector (none in the key columns):
- The config is the architecture's fields (dsa_inputs.MODELS) in a namespace, not a config.json read through
  ModelConfig.from_pretrained with the glm_moe_dsa registry patch (AIC :131-132, :506-528); the sparse config takes
  GLM-5's indexer_rope_interleave where the installed DeepSeekSparseAttentionConfig has the field (later serving
  reads it off the checkpoint for both architectures), which the collector leaves at its default.
- The cache manager's and the engine's max_seq_len is serving's, the model's max_position_embeddings (163840,
  202752), not the case's sequence plus one (AIC :650-661) nor 163840 for both (:515): a decode step's indexer
  logits are that wide (sparse/dsa.py sparse_attn_indexer: fp8_paged_mqa_logits over kv_cache_manager.max_seq_len).
- Only self_attn's weights are created: the decoder layer's MLP and norms, which the timed call never runs, stay
  unallocated (AIC :584-595 creates and fills the whole layer).
- A decode token's rope position is `step`, the position after its cached tokens (AIC :889-895 uses step - 1).
- Hidden states are random and `copies` input sets rotate over disjoint requests of one cache manager, each with
  its own metadata (the harness's cold-L2 rotation); the harness warms up and times as every opcollect row
  (CUDA graph replay where the capture succeeds), not benchmark_with_power's 10 warmups and 6 runs.
- An indexer-skipping layer (SGLang's op_name ..._skip_indexer) is refused: TensorRT-LLM's rows are full layers.
"""

from __future__ import annotations

import inspect
from functools import partial
from types import SimpleNamespace

from opcollect.backends.trtllm import dsa_inputs as inputs
from opcollect.backends.trtllm import mla_inputs, torch_ops
from opcollect.backends.trtllm.context import SERVED_VERSIONS, release_pending
from opcollect.backends.trtllm.mla_module import (
    EXCLUDED,
    MAX_NUM_TOKENS,
    aux_streams,
    create_weights,
    keep_excluded_unquantized,
    layer_call,
    load_dummy_weights,
)
from opcollect.runtime.contract import Prepared, Runner


def model_config(case, keys: dict, max_seq_len: int, num_tokens: int):
    """The ModelConfig of layer 0 at one rank with the DSA sparse config."""
    import torch
    from tensorrt_llm._torch.model_config import DeepSeekSparseAttentionConfig, ModelConfig

    from opcollect.backends.trtllm.context import one_rank_mapping, quant_config

    known = frozenset(getattr(DeepSeekSparseAttentionConfig, "model_fields", {}))
    sparse = DeepSeekSparseAttentionConfig(**inputs.sparse_fields(keys, known))
    pretrained = SimpleNamespace(**inputs.pretrained_fields(keys, case.num_heads), torch_dtype=torch.bfloat16)
    quant = quant_config(case.gemm_type, case.kv_cache_dtype, exclude_modules=EXCLUDED.get(case.gemm_type, ()))
    return ModelConfig(
        pretrained_config=pretrained,
        mapping=one_rank_mapping(),
        quant_config=quant,
        sparse_attention_config=sparse,
        attn_backend="TRTLLM",
        skip_create_weights_in_init=True,
        max_num_tokens=max(MAX_NUM_TOKENS, num_tokens),  # the collector's engine token limit (AIC :514)
        max_seq_len=max_seq_len,
    )


def build_module(case, config, device: str):
    """self_attn of DeepseekV3DecoderLayer 0, its weights created, drawn and post-processed."""
    import torch
    from tensorrt_llm._torch.models.modeling_deepseekv3 import DeepseekV3DecoderLayer

    streams = aux_streams(device)
    with torch.device(device):
        module = DeepseekV3DecoderLayer(model_config=config, layer_idx=0, aux_stream_dict=streams).self_attn
        if EXCLUDED.get(case.gemm_type):
            keep_excluded_unquantized(module, config.quant_config, case.kv_cache_dtype)
        create_weights(module)
    load_dummy_weights(module, device)
    return module


def label(module) -> str:
    indexer = getattr(module, "indexer", None) or getattr(getattr(module, "mqa", None), "indexer", None)
    backend = getattr(module, "mqa", None)
    return inputs.module_label(
        [c.__name__ for c in type(module).__mro__], [c.__name__ for c in type(backend).__mro__], indexer is not None
    )


def kv_cache(config, kv: mla_inputs.KvLayout, kv_cache_dtype: str, max_seq_len: int):
    """The cache manager serving picks for the sparse config, holding every sequence of the layout (AIC :663-702).
    Shut down by the caller."""
    from tensorrt_llm._torch.pyexecutor._util import get_kv_cache_manager_cls
    from tensorrt_llm._torch.pyexecutor.resource_manager import CacheTypeCpp, DataType, KvCacheConfig

    cache_config = KvCacheConfig(max_tokens=kv.max_tokens, enable_block_reuse=False)  # DSA refuses block reuse
    if "kv_cache_config" in inspect.signature(get_kv_cache_manager_cls).parameters:
        manager_cls = get_kv_cache_manager_cls(config, cache_config)
    else:  # the older signature (AIC :669-675 handles both)
        manager_cls = get_kv_cache_manager_cls(config)
    manager = manager_cls(
        cache_config,
        CacheTypeCpp.SELFKONLY,
        num_layers=1,
        num_kv_heads=1,
        head_dim=mla_inputs.LATENT,
        tokens_per_block=kv.tokens_per_block,
        max_seq_len=max_seq_len,
        max_batch_size=kv.num_sequences,
        mapping=config.mapping,
        dtype=DataType.FP8 if kv_cache_dtype == "fp8" else DataType.BF16,
        layer_mask=[True],
        # serving hands the DSA manager the sparse and pretrained configs (AIC :688-697)
        sparse_attention_config=config.sparse_attention_config,
        pretrained_config=config.pretrained_config,
        model_config=config,
    )
    try:
        ids = list(range(kv.num_sequences))
        if manager.add_dummy_requests(ids, token_nums=kv.token_nums()) is None:  # no free block: nothing added
            raise RuntimeError(f"the DSA cache of {kv.num_blocks} blocks took none of {len(ids)} sequences")
    except BaseException:
        manager.shutdown()
        raise
    return manager


def attention_metadata(module, config, manager, kv: mla_inputs.KvLayout, copy: int, context: bool, device: str):
    """The DSA backend's metadata for one copy's sequences, its indexer attached, prepared (AIC :704-776)."""
    import torch
    from tensorrt_llm._torch.attention_backend.interface import AttentionRuntimeFeatures
    from tensorrt_llm._torch.metadata import KVCacheParams

    from opcollect.backends.trtllm.context import prepare_metadata

    b = kv.batch_size
    reuse = context and kv.past_len > 0  # serving: is_mla and (cache_reuse or chunked_prefill) (AIC :755-762)
    sparse = config.sparse_attention_config
    metadata = type(module.mqa).Metadata(
        max_num_requests=b,
        max_num_tokens=kv.num_tokens,
        kv_cache_manager=manager,
        mapping=config.mapping,
        enable_flash_mla=bool(config.enable_flash_mla),
        seq_lens=torch.tensor([kv.query_len] * b, dtype=torch.int),
        position_ids=None,
        num_contexts=b if context else 0,
        kv_cache_params=KVCacheParams(use_cache=True, num_cached_tokens_per_seq=[kv.past_len] * b),
        cross=None,
        request_ids=kv.request_ids(copy),
        prompt_lens=kv.prompt_lens(context),
        enable_context_mla_with_cached_kv=reuse,
        runtime_features=AttentionRuntimeFeatures(chunked_prefill=False, cache_reuse=reuse),
        all_rank_num_tokens=None,
        workspace=torch.tensor([], device=device, dtype=torch.int8),
        sparse_metadata_params=sparse.to_sparse_metadata_params(pretrained_config=config.pretrained_config),
    )
    metadata.indexer = module.indexer
    return prepare_metadata(metadata)


def prepare(case, dispatch: str, device: str, copies: int, context: bool) -> Prepared:
    keys = inputs.check_case(case)
    torch_ops.check_installed("dsa_context_module" if context else "dsa_generation_module")
    import torch

    capability = torch.cuda.get_device_capability(torch.device(device))
    inputs.check_capability(case, capability)
    release_pending()
    kv = inputs.layout(case, mla_inputs.page_size(capability), copies)
    longest = inputs.max_seq_len(case, kv)
    config = model_config(case, keys, longest, kv.num_tokens)
    module = build_module(case, config, device)
    source = label(module)
    manager = kv_cache(config, kv, case.kv_cache_dtype, longest)

    def metadata_of(i: int):
        return attention_metadata(module, config, manager, kv, i, context, device)

    # the MLA registered itself in config.extra_attrs when built
    call = layer_call(module, config.extra_attrs, manager, kv, keys["hidden_size"], device, metadata_of)
    return Prepared(call, source)


def _runner(context: bool) -> tuple[Runner, ...]:
    sized, prepared = partial(inputs.footprint, context=context), partial(prepare, context=context)
    return (Runner(sized, prepared, versions=SERVED_VERSIONS),)


RUNNERS = {"dsa_context_module": _runner(True), "dsa_generation_module": _runner(False)}
