"""MiniMax-M3's block-sparse attention (MSA) as TensorRT-LLM 1.3.0rc23 serves it: the whole attention module of a sparse
layer at one rank, prefill and decode (msa_{context,generation}_module_perf at the reference's second TensorRT-LLM pin),
built as the reference collector builds it (T: ai-dynamo/aiconfigurator collector/trtllm/collect_msa_module.py at
095f58a5; TensorRT-LLM lines as T cites them @1.3.0rc23, no rc23 checkout being in reach). msa_inputs has the fields
and the pure rules.

The route is what the installed TensorRT-LLM provides. The runner is registered for 1.3.0rc23 alone (VERSIONS): rc23
added MiniMaxM3SparseAttentionConfig.implementation ("triton" or "msa") and the fmha_sm100 MSA backend (sparse/
minimax_m3/msa_backend.py); any other installed version finds no runner for these ops, and the worker refuses each
of their rows with one line naming that version (Registry.find). Inside rc23 the route is picked as serving picks it
(T:358-367): "msa" on SM100/103, "triton" elsewhere, and a probe of the installed config class confirms the field
(one line naming the installed version where it is missing). The static imports are the ones rc20 has too, so the
run's preflight (every TensorRT-LLM symbol a runner imports, checked for the whole backend) still passes in the rc20
image for the ops collected there; the rc23-only pieces are checked before a case by torch_ops.check_installed
(the implementation field, the backend's two routes) and read off the built objects (the backend's and metadata's
class names), never imported.

What is built (T:300-495, :560-779):
- A ModelConfig of MiniMax-M3's text config cut to one sparse layer at the rank's heads (msa_inputs.pretrained_fields),
  the case's QuantConfig on qkv_proj/o_proj (index_qk_proj is built unquantized by the model), attn_backend TRTLLM,
  skip_create_weights_in_init, and a MiniMaxM3SparseAttentionConfig of the checkpoint's sparse geometry with the route.
- MiniMaxM3DecoderLayer(model_config, 0, aux streams).self_attn, the sparse MiniMaxM3Attention serving builds for
  layers 3..59; its weights created, drawn as TensorRT-LLM's dummy loader draws them, post_load_weights run.
- The cache manager serving picks for the sparse config (get_kv_cache_manager_cls: MiniMax-M3's KVCacheManagerV2 with
  its index-key side cache), SELF, the rank's KV heads, bf16, the route's page size, layer 0 sparse with its index
  value disabled, every sequence's tokens registered (is_gen for a decode batch).
- The metadata of the layer's own attention backend (type(self_attn.attn).Metadata) with the fields the executor
  sets, including max_num_sequences, num_heads_per_kv and sparse_metadata_params where the class has them; prepare()
  run, then its route's contract checked (the MSA buffers and decode plans, or the Triton minimax_m3 attachment).
Each call runs self_attn.forward(position_ids, hidden_states, metadata) inside model_extra_attrs with the metadata
registered (T:876-894): the fused QKV projection, the per-head Gemma norms and partial rope, the index projection and
its block scores, the top-16 block selection, the sparse GQA and o_proj. kernel_source is the route's label,
msa_fmha_sm100 or default (T:766, :776-777), once the layer's backend and metadata are seen to be that route's.
The MSA route's prefill is timed eagerly as serving runs it; every other batch replays a CUDA graph (T:896-916).

A context row is isl new tokens after `step` cached ones; a decode row one new token after `step` cached ones.

Deliberate differences from the reference collector (none in the key columns):
- The config is the checkpoint's keys (msa_inputs.MODELS) on a bare transformers PretrainedConfig, as TensorRT-LLM
  itself wraps a dict text config (modeling_minimaxm3.py _wrap_dict_as_config), not a config.json read through
  ModelConfig.from_pretrained with the _CONFIG_REGISTRY shim (T:65-115, :368-403); the ModelConfig is built with the
  sparse config directly.
- The Metadata class is the built layer's backend's (type(self_attn.attn).Metadata), not get_attention_backend called
  again with rc23's sparse_params (T:521-541): the same class, without a call whose keyword differs between the pins.
- Only self_attn's weights are created: the decoder layer's MLP and norms, which the timed call never runs, stay
  unallocated (T:479-490 creates and fills the whole layer).
- 128-head cases are refused before anything is built (their KV heads do not divide the index heads; T lets them
  fail at construction: the reference sidecar's 856 failures).
- Hidden states are random and `copies` input sets rotate over disjoint requests of one cache manager, each with its
  own metadata (the pool, 2x headroom as T's, grows with the copies); the harness warms up and times as every
  opcollect row, not benchmark_with_power's 10 warm-ups and 6 runs.
"""

from __future__ import annotations

from functools import partial

from opcollect.backends.trtllm import msa_inputs as inputs
from opcollect.backends.trtllm import torch_ops
from opcollect.backends.trtllm.context import installed_version, release_pending
from opcollect.backends.trtllm.mla_module import aux_streams, create_weights, layer_call, load_dummy_weights
from opcollect.runtime.contract import KernelLimit, Prepared, Runner

# the pin whose MiniMax-M3 route this runner was written and checked against (the reference's msa/trtllm/1.3.0rc23)
VERSIONS = frozenset({"1.3.0rc23"})
OPS = ("msa_context_module", "msa_generation_module")


def sparse_config(keys: dict, route: str):
    """MiniMaxM3SparseAttentionConfig of the checkpoint's geometry and the route; KernelLimit naming the installed
    version where the class has no implementation field (before rc23: no MSA route, T:358-364)."""
    from tensorrt_llm.llmapi.llm_args import MiniMaxM3SparseAttentionConfig

    if "implementation" not in getattr(MiniMaxM3SparseAttentionConfig, "model_fields", {}):
        raise KernelLimit(
            f"TensorRT-LLM {installed_version()}'s MiniMaxM3SparseAttentionConfig has no implementation field: the "
            f"1.3.0rc23 MiniMax-M3 route is not there; collect the MSA tables in the {sorted(VERSIONS)[0]} image"
        )
    return MiniMaxM3SparseAttentionConfig(**inputs.sparse_fields(keys, route))


def model_config(case, keys: dict, route: str, kv: inputs.MsaLayout):
    """The ModelConfig of one sparse layer at the rank's heads with the route's sparse config."""
    import torch
    from tensorrt_llm._torch.model_config import ModelConfig
    from transformers import PretrainedConfig

    from opcollect.backends.trtllm.context import one_rank_mapping, quant_config

    pretrained = PretrainedConfig()
    for key, value in inputs.pretrained_fields(keys, case.num_heads).items():
        setattr(pretrained, key, value)
    pretrained.torch_dtype = torch.bfloat16  # the typed dtype serving's config carries (T:405-412)
    return ModelConfig(
        pretrained_config=pretrained,
        mapping=one_rank_mapping(),
        quant_config=quant_config(case.gemm_type, "bfloat16"),
        sparse_attention_config=sparse_config(keys, route),
        attn_backend="TRTLLM",
        skip_create_weights_in_init=True,
        max_num_tokens=max(inputs.MAX_NUM_TOKENS, kv.num_tokens),
        max_seq_len=max(inputs.MAX_SEQ_LEN, kv.max_seq_len),
    )


def build_module(config, device: str):
    """self_attn of MiniMaxM3DecoderLayer 0 (a sparse layer), its weights created, drawn and post-processed."""
    import torch
    from tensorrt_llm._torch.models.modeling_minimaxm3 import MiniMaxM3DecoderLayer

    streams = aux_streams(device)
    with torch.device(device):
        module = MiniMaxM3DecoderLayer(model_config=config, layer_idx=0, aux_stream_dict=streams).self_attn
        create_weights(module)
    if not getattr(module, "is_sparse_attention_layer", False):
        raise RuntimeError("TensorRT-LLM built a dense MiniMax-M3 attention for the one sparse layer (T:492-494)")
    load_dummy_weights(module, device)
    return module


def label(module, route: str) -> str:
    backend = type(getattr(module, "attn", None))
    metadata = getattr(backend, "Metadata", type(None))
    return inputs.module_label(route, [c.__name__ for c in backend.__mro__], [c.__name__ for c in metadata.__mro__])


def kv_cache(config, kv: inputs.MsaLayout, context: bool):
    """The cache manager serving picks for MiniMax-M3's sparse config, holding every sequence (T:606-691). Shut down
    by the caller."""
    from tensorrt_llm._torch.pyexecutor._util import get_kv_cache_manager_cls
    from tensorrt_llm._torch.pyexecutor.resource_manager import CacheTypeCpp, DataType, KvCacheConfig

    pretrained, sparse = config.pretrained_config, config.sparse_attention_config
    cache_config = KvCacheConfig(max_tokens=kv.max_tokens, enable_block_reuse=False)
    manager = get_kv_cache_manager_cls(config, cache_config)(
        cache_config,
        CacheTypeCpp.SELF,
        num_layers=1,
        num_kv_heads=[pretrained.num_key_value_heads],
        head_dim=pretrained.head_dim,
        tokens_per_block=kv.tokens_per_block,
        max_seq_len=kv.max_seq_len,
        max_batch_size=kv.num_sequences,
        mapping=config.mapping,
        dtype=DataType.BF16,
        sparse_attention_config=sparse,
        pretrained_config=pretrained,
        sparse_layer_ids=[0],  # the one layer is sparse (the manager's default assumes 3 dense first, T:585-590)
        disable_index_value_layer_ids=[0],
        sparse_index_dim=sparse.sparse_index_dim,
    )
    try:
        ids = list(range(kv.num_sequences))
        added = manager.add_dummy_requests(token_nums=kv.token_nums(), request_ids=ids, is_gen=not context)
        if added is None:  # KVCacheManagerV2 releases what it took and returns None (T:670-676)
            raise RuntimeError(f"MiniMax-M3's cache of {kv.max_tokens} tokens took none of {len(ids)} sequences")
    except BaseException:
        manager.shutdown()
        raise
    return manager


def attention_metadata(module, config, manager, kv: inputs.MsaLayout, copy: int, context: bool, route: str):
    """The layer's backend's metadata for one copy's sequences, prepared, its route's contract met (T:693-779)."""
    import dataclasses

    import torch
    from tensorrt_llm._torch.attention_backend.interface import AttentionRuntimeFeatures
    from tensorrt_llm._torch.metadata import KVCacheParams

    from opcollect.backends.trtllm.context import prepare_metadata

    cls = type(module.attn).Metadata
    b, pretrained = kv.batch_size, config.pretrained_config
    fields = {f.name for f in dataclasses.fields(cls) if f.init} if dataclasses.is_dataclass(cls) else set()
    serving = {  # the executor's keywords where the class has them (T:693-718)
        "max_num_sequences": b,
        "num_heads_per_kv": pretrained.num_attention_heads // pretrained.num_key_value_heads,
        "sparse_metadata_params": config.sparse_attention_config.to_sparse_metadata_params(
            pretrained_config=pretrained
        ),
    }
    reuse = context and kv.past_len > 0
    metadata = cls(
        max_num_requests=b,
        max_num_tokens=kv.num_tokens,
        kv_cache_manager=manager,
        mapping=config.mapping,
        seq_lens=torch.tensor([kv.query_len] * b, dtype=torch.int32),
        position_ids=None,
        num_contexts=b if context else 0,
        kv_cache_params=KVCacheParams(use_cache=True, num_cached_tokens_per_seq=[kv.past_len] * b),
        cross=None,
        request_ids=kv.request_ids(copy),
        prompt_lens=kv.prompt_lens(context),
        runtime_features=AttentionRuntimeFeatures(chunked_prefill=False, cache_reuse=reuse),
        all_rank_num_tokens=None,
        **{k: v for k, v in serving.items() if k in fields},
    )
    prepare_metadata(metadata)
    problem = inputs.metadata_problem(route, context, metadata)
    if problem is not None:
        raise RuntimeError(problem)
    return metadata


def prepare(case, dispatch: str, device: str, copies: int, context: bool) -> Prepared:
    keys = inputs.check_case(case)
    torch_ops.check_installed(OPS[0] if context else OPS[1])
    import torch

    capability = torch.cuda.get_device_capability(torch.device(device))
    inputs.check_capability(case, capability)
    release_pending()
    route = inputs.implementation(capability)
    kv = inputs.layout(case, context, inputs.PAGES[route], copies)
    config = model_config(case, keys, route, kv)
    module = build_module(config, device)
    source = label(module, route)
    manager = kv_cache(config, kv, context)

    def metadata_of(i: int):
        return attention_metadata(module, config, manager, kv, i, context, route)

    call = layer_call(module, config.extra_attrs, manager, kv, keys["hidden_size"], device, metadata_of)
    return Prepared(call, source, graph_safe=inputs.graph_safe(route, context))


def _runner(context: bool) -> tuple[Runner, ...]:
    sized, prepared = partial(inputs.footprint, context=context), partial(prepare, context=context)
    return (Runner(sized, prepared, versions=VERSIONS),)


RUNNERS = {OPS[0]: _runner(True), OPS[1]: _runner(False)}
