"""DeepSeek's sparse attention (DSA: DeepSeek-V3.2, GLM-5) as vLLM 0.24.0 serves it: the whole attention module at
one rank, prefill and decode (dsa_{context,generation}_module_perf).

What is built is what serving builds for layer 0 (models/deepseek_v2.py:1138-1153), with the rank's heads:
- DeepseekV2MLAAttention under the case's VllmConfig, with bf16 as torch's default dtype (deepseek_v2.py:887-1085).
  The config carries the model's DSA keys (dsa_inputs.MODELS: index_topk, index_n_heads, index_head_dim,
  indexer_rope_interleave), so the module is sparse (is_v32, :999) and, layer 0 being no indexer-skipping layer for
  any index_topk_freq (:1003-1027), builds its Indexer (:1029-1046: wq_b, the fused wk/head-weight projection, k_norm,
  its own rope, its fp8 key cache DeepseekV32IndexerCache and SparseAttnIndexer, :603-676) and the MLA wrapper
  (:1071-1085; model_executor/layers/mla.py:101-116) whose MLAAttention selects the sparse backend
  (platforms/cuda.py:93-142: FLASHMLA_SPARSE is SM90's only sparse entry) and canonicalizes an fp8 cache to
  FlashMLA's fp8_ds_mla (model_executor/layers/attention/mla_attention.py:323-336, :413-423).
- The shared top-k buffer DeepseekV2Model allocates, [max_num_batched_tokens, index_topk] int32 (deepseek_v2.py:
  1243-1253); vLLM's workspace manager, fresh per case (v1/worker/workspace.py:216-236, :272-281), which FlashMLA's
  sparse impl reserves at construction (flashmla_sparse.py:584-608) and the indexer draws on
  (model_executor/layers/sparse_attn_indexer.py:184-189).
- Weights filled and post-processed as the model loader does (mla.fill_and_process); projections under the
  gemm_type's checkpoint quant config (mla.quant_config), the indexer's wq_b included (deepseek_v2.py:627-633).
- Both caches in their backends' shapes and byte layouts (dsa_inputs), bound to the two layers
  (model.layers.0.self_attn.attn and .indexer.k_cache), and each backend's own metadata builder run on one batch
  (flashmla_sparse.py:490-537; v1/attention/backends/mla/indexer.py:471-643).
Each call runs module(positions, hidden_states, None) under set_forward_context with both layers' metadata and
slot mappings: the rope, projections, the indexer (its key quant-and-cache, fp8 MQA logits over every cached token
and the top index_topk, sparse_attn_indexer.py:82-398) and the sparse MLA over those tokens (flashmla_sparse.py:
857-894), then o_proj. kernel_source is the backend vLLM chose, attn_backend.get_name(), as the reference collector
names every DSA row (collector/vllm/collect_mla_module.py:286-300).

A context row is isl new tokens after `step` cached ones; a decode row one new token, `step` counting it
(dsa_inputs.lengths, as the reference: collect_mla_module.py:644-647, 873-879).

Deliberate differences from the reference collector (collect_mla_module.py, none in the key columns):
- max_model_len is serving's, the model's max_position_embeddings (163840, 202752), not max(prefix + isl, 4096)
  (:383). It sizes the prefill workspaces, so how many chunks an fp8 prefill's upconversion and the indexer's key
  gather take (flashmla_sparse.py:416-422; indexer.py:530-536), and the width of the indexer's decode logits.
- Batch limits and CUDA-graph sizes are serving's (context.serve_batch), not max_num_batched_tokens max(b*s, 131072)
  and max_num_seqs b (:400-401); they size buffers only.
- The latent cache write (concat_and_cache_mla) is timed with the module, as serving runs it: the reference passes
  no slot mapping, which skips it (mla_attention.py:1049-1058). The indexer's key write runs in both.
- The page table is serving's width (dsa_inputs), not each request's pages padded to an even count (:660-675).
- Weights, hidden states and caches hold random finite values, not constants (:520-545, :594-613, :882-887):
  the indexer's top-k then ranks varied scores.
- Context rows are replayed from a CUDA graph as every opcollect row is (runtime/timing.py), not run eagerly
  (:965-976, a workaround for its worker's graph memory pools).
- The config is the architecture's keys (dsa_inputs.MODELS), not a config.json read through AutoConfig, so the
  reference's glm_moe_dsa registry patch (:78-79) has no counterpart; num_hidden_layers keeps the model's (the
  reference sets 1), which only decides that layer 0 is no MTP layer.
- An indexer-skipping layer (SGLang's op_name ..._skip_indexer) and an fp8 query are refused: vLLM's DSA rows are
  full layers with a bf16 query (plans/dsa.py).
"""

from __future__ import annotations

from opcollect.backends.vllm import dsa_inputs as inputs
from opcollect.backends.vllm import mla
from opcollect.runtime.contract import KernelLimit, Prepared
from opcollect.runtime.timing import random_tensor

PREFIX = "model.layers.0.self_attn"  # layer 0 as make_layers names it (deepseek_v2.py:1264-1272)
ATTN = f"{PREFIX}.attn"  # the MLAAttention (mla.py:111)
INDEX_CACHE = f"{PREFIX}.indexer.k_cache"  # the indexer's cache layer (deepseek_v2.py:654-658)
CACHE_DTYPE = {"bfloat16": "auto", "fp8": "fp8"}  # as serving passes --kv-cache-dtype (config/cache.py)
SKIP_INDEXER = "_skip_indexer"


def check_case(case) -> dict:
    """The architecture's config keys; KernelLimit, before any framework import, for what vLLM cannot serve."""
    if case.op_name.endswith(SKIP_INDEXER):
        raise KernelLimit("vLLM's DSA rows time layer 0, which runs its indexer; no indexer-skipping layer")
    if case.mla_dtype != "bfloat16":
        raise KernelLimit(f"vLLM's sparse MLA takes a bf16 query, not {case.mla_dtype}")
    if case.kv_cache_dtype not in CACHE_DTYPE:
        raise KernelLimit(f"vLLM has no {case.kv_cache_dtype} sparse MLA cache")
    if case.gemm_type not in mla.GEMM_TYPES:
        raise KernelLimit(f"the vLLM DSA runner has no {case.gemm_type} projections")
    return inputs.model_keys(case.architecture)


def serving_tokens(case, context: bool) -> int:
    """max_num_batched_tokens as context.serve_batch sets it for this batch."""
    from opcollect.backends.vllm.context import serving_batched_tokens

    query_len, _ = inputs.lengths(case, context)
    return serving_batched_tokens(case.batch_size, case.batch_size * query_len)


def footprint(case, context: bool) -> int:
    return inputs.footprint_bytes(case, context, serving_tokens(case, context))


def hf_config(keys: dict, num_heads: int):
    """The HF config the module, its indexer and the sparse builders read, with the rank's heads."""
    from types import SimpleNamespace

    return SimpleNamespace(num_attention_heads=num_heads, num_key_value_heads=num_heads, **keys)


def stand_in(config, hf, num_heads: int, max_model_len: int) -> None:
    """What the module and the builders read off the ModelConfig (context.model_stand_in holds the rest):
    hf_config.index_topk (flashmla_sparse.py:263), the MLA dims (mla_attention.py:1345-1368), max_model_len
    (deepseek_v2.py:660; indexer.py:220, :312), heads (flashmla_sparse.py:256)."""
    model = config.model_config
    model.hf_config = model.hf_text_config = hf
    model.get_num_attention_heads = lambda parallel_config=None: num_heads
    model.get_num_kv_heads = lambda parallel_config=None: 1
    model.get_head_size = lambda: hf.kv_lora_rank + hf.qk_rope_head_dim
    model.max_model_len = max_model_len
    model.is_mm_prefix_lm = False
    model.use_mla = True


def common_metadata(layout, device: str, max_seq_len: int | None = None, positions=None):
    """(CommonAttentionMetadata of the batch, each new token's position int64 on the device) (v1/attention/backend.py:
    394-456), shared by the layers' builders as one KV cache group's is. max_seq_len: the batch's own unless given
    (MiniMax-M3's: serving's for the way it runs the batch, msa.py); positions: set in the metadata where a builder
    reads them (DeepSeek-V4's C128A builder, sparse_mla.py:270-280, dsv4.py), else the batch's, not set."""
    import torch
    from vllm.v1.attention.backend import CommonAttentionMetadata

    t = inputs.batch_tensors(layout)
    common = CommonAttentionMetadata(
        query_start_loc=t.query_start_loc.to(device),
        query_start_loc_cpu=t.query_start_loc,
        seq_lens=t.seq_lens.to(device),
        num_reqs=layout.batch_size,
        num_actual_tokens=layout.num_tokens,
        max_query_len=layout.query_len,
        max_seq_len=layout.seq_len if max_seq_len is None else max_seq_len,
        block_table_tensor=t.page_table.to(device),
        slot_mapping=t.slot_mapping.to(device),
        causal=True,
        seq_lens_cpu_upper_bound=t.seq_lens,
        **({} if positions is None else {"positions": positions}),
    )
    return common, t.positions.to(device=device, dtype=torch.int64) if positions is None else positions


def build_module(case, keys: dict, config, quant, device: str, max_model_len: int):
    """DeepseekV2MLAAttention as DeepseekV2DecoderLayer builds it, its weights filled and post-processed."""
    import torch
    from vllm.model_executor.models.deepseek_v2 import DeepseekV2MLAAttention

    hf = hf_config(keys, case.num_heads)
    stand_in(config, hf, case.num_heads, max_model_len)
    dtype = torch.bfloat16
    # DeepseekV2Model's shared buffer (deepseek_v2.py:1244-1251), sized by serving's batched-token limit
    topk = torch.empty(
        config.scheduler_config.max_num_batched_tokens, keys["index_topk"], dtype=torch.int32, device=device
    )
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # the backend selector reads it (mla_attention.py:396)
    try:
        with torch.device(device):
            module = DeepseekV2MLAAttention(
                vllm_config=config,
                config=hf,
                hidden_size=keys["hidden_size"],
                num_heads=case.num_heads,
                qk_nope_head_dim=keys["qk_nope_head_dim"],
                qk_rope_head_dim=keys["qk_rope_head_dim"],
                v_head_dim=keys["v_head_dim"],
                q_lora_rank=keys["q_lora_rank"],
                kv_lora_rank=keys["kv_lora_rank"],
                max_position_embeddings=keys["max_position_embeddings"],
                cache_config=config.cache_config,
                quant_config=quant,
                prefix=PREFIX,
                topk_indices_buffer=topk,
            )
            mla.fill_and_process(module, dtype, device)
    finally:
        torch.set_default_dtype(previous)
    return module


def caches(specs, layout, keys: dict, device: str, seed: int):
    """One latent cache and one indexer key cache, each in its backend's shape (flashmla_sparse.py:133-145,
    indexer.py:136-144) from its layer's spec, every page filled (dsa_inputs). ``specs``: (backend, spec) of the
    latent cache, then of the indexer's."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    built = []
    for backend, spec in specs:
        shape = backend.get_kv_cache_shape(
            layout.num_blocks, layout.block_size, 1, spec.head_size, spec.cache_dtype_str
        )
        built.append(torch.empty(shape, dtype=spec.dtype, device=device))
    latent, index = built
    inputs.fill_latent_cache(latent, specs[0][1].cache_dtype_str, gen)
    inputs.fill_indexer_cache(index, keys["index_head_dim"], gen)
    return latent, index


def prepare(case, dispatch: str, device: str, copies: int, context: bool) -> Prepared:
    keys = check_case(case)
    layout = inputs.dsa_layout(case, context)
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import set_forward_context
    from vllm.v1.worker.workspace import init_workspace_manager, reset_workspace_manager

    from opcollect.backends.vllm.context import serve_batch, vllm_context

    quant = mla.quant_config(case.gemm_type)
    with vllm_context(device, quant_config=quant) as config:
        # serving's batch limits, CUDA-graph sizes and eager kernels, before the module and the builders read them
        serve_batch(config, case.batch_size, layout.num_tokens)
        config.cache_config.cache_dtype = CACHE_DTYPE[case.kv_cache_dtype]
        mla.prefill_query(config, case.mla_dtype)  # clears vLLM's process-wide prefill-query cache
        # a fresh manager per case: its workspace only grows, and the impl takes its views at construction
        reset_workspace_manager()
        init_workspace_manager(torch.device(device))
        module = build_module(case, keys, config, quant, device, inputs.max_model_len(case, context))
        layers = config.compilation_config.static_forward_context
        attn, index_layer = layers[ATTN], layers[INDEX_CACHE]
        backend = attn.attn_backend
        if not backend.supports_block_size(inputs.BLOCK_SIZE):
            raise KernelLimit(f"{backend.get_name()} takes no {inputs.BLOCK_SIZE}-token pages, the indexer's only")
        # both layers' specs read the page size (mla_attention.py:1000-1010, deepseek_v2.py:589-595)
        config.cache_config.block_size = inputs.BLOCK_SIZE
        specs = (
            (backend, attn.get_kv_cache_spec(config)),
            (index_layer.get_attn_backend(), index_layer.get_kv_cache_spec(config)),
        )
        common, positions = common_metadata(layout, device)
        # each layer's own backend plans the batch (common_prefix_len 0: no cascade attention), as serving's model
        # runner does per attention group
        metadata = {
            name: owner.get_builder_cls()(spec, [name], config, torch.device(device)).build(
                common_prefix_len=0, common_attn_metadata=common
            )
            for name, (owner, spec) in zip((ATTN, INDEX_CACHE), specs)
        }
        kv = [caches(specs, layout, keys, device, i) for i in range(copies)]
        shape = (layout.num_tokens, keys["hidden_size"])
        hidden = [random_tensor(shape, torch.bfloat16, device, i) for i in range(copies)]
        # both layers' new-token slots, as the model runner hands each layer its group's (one group here)
        slot_mapping = {ATTN: common.slot_mapping, INDEX_CACHE: common.slot_mapping}
    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        attn.kv_cache, index_layer.kv_cache = kv[i]
        with (
            set_current_vllm_config(config, check_compile=False),
            set_forward_context(metadata, config, num_tokens=layout.num_tokens, slot_mapping=slot_mapping),
        ):
            module(positions, hidden[i], None)

    return Prepared(call, backend.get_name())
