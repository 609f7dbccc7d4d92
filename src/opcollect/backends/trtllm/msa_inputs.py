"""What TensorRT-LLM 1.3.0rc23's MiniMax-M3 sparse attention module (backends/trtllm/msa.py) is built and fed with: the
checkpoint's text config, the route by SM, the refusals, the cache layout, the contracts the route's metadata must
meet, and the bytes a case needs. No tensorrt_llm and no torch import: the CPU tests check these against the
checkpoint's config.json and by hand.

"T" is the reference collector, ai-dynamo/aiconfigurator collector/trtllm/collect_msa_module.py at 095f58a5
(`__compat__ "trtllm>=1.3.0rc19"`, :6), which collected the reference's msa/trtllm/1.3.0rc23 tables; TensorRT-LLM
lines are as T cites them at @1.3.0rc23 (no rc23 checkout is in reach: tests/data/trtllm-release/README.md).

- Config: MiniMax-M3's text config.json as aiconfigurator-core 0.12.0 ships it (model_configs/MiniMaxAI--MiniMax-M3_
  config.json; tests/data/sparse_configs), every scalar key and the sparse dict, cut to one sparse layer as T cuts
  it (T:414-427): num_hidden_layers 1, sparse_attention_freq [1], the last sparse_disable_index_value flag,
  moe_layer_freq [0] (a dense MLP, whose weights are never created here).
- The rank: num_heads query heads, max(1, heads / 16) KV heads (the checkpoint's 64 / 4; T:436-449); the index heads
  stay the checkpoint's 4, replicated (T:432-434). The sparse backend needs the KV heads to divide the index heads
  (MiniMaxM3SparseConfig's check, T:436-443): 128 heads (8 KV heads) fail by construction and are refused here.
- The route (T:358-367): rc23's MiniMaxM3SparseAttentionConfig.implementation, "msa" (fmha_sm100, SM100/103 only:
  msa_availability.ensure_msa_available) on SM100/103, "triton" elsewhere; labelled msa_fmha_sm100 and default
  (T:766, :776-777). Pages: 128 tokens for "msa" (the fmha_sm100 CSR builder asserts blk_kv 128), 32 for "triton"
  (py_executor_creator.py:427 @1.3.0rc23, T:611-616).
- The cache: bf16 K and V of the rank's KV heads and a bf16 index key a token, pages drawn from one budget of
  2 x sequences x (round_up(max_seq_len, page) + 2 pages) tokens (T:638-660: the index pages share the budget and the
  decode dummy path resizes to capacity + 1).
"""

from __future__ import annotations

from dataclasses import dataclass

from opcollect.backends.trtllm.mla_inputs import PagedLayout
from opcollect.runtime.contract import KernelLimit
from opcollect.runtime.dtypes import ceil_div

_LAYERS = 60
_PER_LAYER = [0] * 3 + [1] * (_LAYERS - 3)  # the checkpoint's first 3 layers are dense, the other 57 sparse
# MiniMax-M3's config.json (see the module docstring), every key the decoder layer may read
MODELS: dict[str, dict] = {
    "MiniMaxM3ForCausalLM": {
        "architectures": ["MiniMaxM3ForCausalLM"],
        "model_type": "minimax_m3",
        "attention_output_gate": False,
        "dense_intermediate_size": 12288,
        "first_k_dense_replace": 3,
        "head_dim": 128,
        "hidden_act": "swigluoai",
        "hidden_size": 6144,
        "intermediate_size": 3072,
        "max_position_embeddings": 1048576,
        "moe_intermediate_size": 3072,
        "moe_layer_freq": _PER_LAYER,
        "n_shared_experts": 1,
        "num_attention_heads": 64,
        "num_experts_per_tok": 4,
        "num_hidden_layers": _LAYERS,
        "num_key_value_heads": 4,
        "num_local_experts": 128,
        "num_mtp_modules": 7,
        "num_nextn_predict_layers": 1,
        "partial_rotary_factor": 0.5,
        "qk_norm_type": "per_head",
        "rms_norm_eps": 1e-06,
        "rope_theta": 5000000,
        "rotary_dim": 64,
        "routed_scaling_factor": 2.0,
        "scoring_func": "sigmoid",
        "shared_intermediate_size": 3072,
        "swiglu_alpha": 1.702,
        "swiglu_limit": 7.0,
        "tie_word_embeddings": False,
        "use_gemma_norm": True,
        "use_qk_norm": True,
        "use_routing_bias": True,
        "vocab_size": 200064,
        "sparse_attention_config": {
            "sparse_attention_freq": _PER_LAYER,
            "sparse_block_size": 128,
            "sparse_disable_index_value": _PER_LAYER,
            "sparse_index_dim": 128,
            "sparse_init_block": 0,
            "sparse_local_block": 1,
            "sparse_num_index_heads": 4,
            "sparse_score_type": "max",
            "sparse_topk_blocks": 16,
            "use_sparse_attention": True,
        },
    },
}
# MiniMaxM3SparseAttentionConfig's keyword <- the checkpoint's sparse key (T:348-356)
SPARSE_FIELDS = {
    "sparse_num_index_heads": "sparse_num_index_heads",
    "sparse_index_dim": "sparse_index_dim",
    "sparse_block_size": "sparse_block_size",
    "sparse_topk_blocks": "sparse_topk_blocks",
    "sparse_init_blocks": "sparse_init_block",
    "sparse_local_blocks": "sparse_local_block",
}
MSA, TRITON = "msa", "triton"
LABELS = {MSA: "msa_fmha_sm100", TRITON: "default"}
PAGES = {MSA: 128, TRITON: 32}
MSA_SMS = ((10, 0), (10, 3))  # T:365-367: get_sm_version() in (100, 103)
# the names the route's objects carry (T:503-518, :837-848): the MSA backend and its metadata class
MSA_ATTENTION, MSA_METADATA = "MiniMaxM3MsaSparseAttention", "MiniMaxM3MsaSparseAttentionMetadata"
# qkv_proj / o_proj formats (T:247-289); index_qk_proj is always bf16
WEIGHT_BYTES = {"bfloat16": 2.0, "fp8_block": 1.0 + 4 / (128 * 128), "nvfp4": 0.5 + 1 / 16}
MAX_NUM_TOKENS, MAX_SEQ_LEN = 131072, 163840  # the ModelConfig's engine limits (T:377-385)
CHUNK_BUDGET = 512 * 1024 * 1024  # the Triton path's per-chunk fp32 working set (triton_backend.py)


def model_keys(architecture: str) -> dict:
    """A fresh copy of the architecture's config keys."""
    found = MODELS.get(architecture)
    if found is None:
        raise KernelLimit(f"the TensorRT-LLM MSA runner knows no config of {architecture} (trtllm/msa_inputs.MODELS)")
    copy = {k: list(v) if isinstance(v, list) else v for k, v in found.items()}
    copy["sparse_attention_config"] = {
        k: list(v) if isinstance(v, list) else v for k, v in found["sparse_attention_config"].items()
    }
    return copy


def rank_kv_heads(keys: dict, heads: int) -> int:
    """KV heads on a rank of ``heads`` query heads: the checkpoint's query heads per KV head kept (T:444-449)."""
    return max(1, heads // max(1, keys["num_attention_heads"] // keys["num_key_value_heads"]))


def check_case(case) -> dict:
    """The architecture's keys; KernelLimit, before any framework import, for what the module cannot build."""
    if case.mla_dtype != "bfloat16" or case.kv_cache_dtype != "bfloat16":
        # T:806-810: MiniMax-M3's sparse attention at rc23 is bf16 compute over a bf16 cache
        raise KernelLimit(
            f"TensorRT-LLM's MiniMax-M3 sparse attention is bf16 only, not {case.mla_dtype} over {case.kv_cache_dtype}"
        )
    if case.gemm_type not in WEIGHT_BYTES:
        raise KernelLimit(f"the TensorRT-LLM MSA runner has no {case.gemm_type} projections")
    if case.isl < 1 or case.step < 0 or case.batch_size < 1 or case.num_heads < 1:
        raise KernelLimit(f"an MSA case needs new tokens, a batch, heads and no negative step: {case}")
    keys = model_keys(case.architecture)
    kv, index = rank_kv_heads(keys, case.num_heads), keys["sparse_attention_config"]["sparse_num_index_heads"]
    if index % kv:
        raise KernelLimit(
            f"TensorRT-LLM's MiniMax-M3 sparse backend needs the KV heads to divide the index heads: {case.num_heads} "
            f"heads have {kv} KV heads, the index {index} (MiniMaxM3SparseConfig; serving never has more than 4)"
        )
    return keys


def implementation(capability: tuple[int, int]) -> str:
    """The route serving sets on this device (T:358-367)."""
    return MSA if tuple(capability) in MSA_SMS else TRITON


def check_capability(case, capability: tuple[int, int]) -> None:
    """NVFP4 projections need SM100 (T:123-135, mla_module.yaml:180-198); block-fp8 the fp8 conversions of SM89."""
    major, minor = capability
    if case.gemm_type == "nvfp4" and major < 10:
        raise KernelLimit(f"nvfp4 projections need SM100 or newer (SM{major}{minor})")
    if case.gemm_type == "fp8_block" and tuple(capability) < (8, 9):
        raise KernelLimit(f"fp8_block projections need SM89 or newer (SM{major}{minor})")


def pretrained_fields(keys: dict, num_heads: int) -> dict:
    """The text config of one sparse layer at the rank's heads (T:414-449)."""
    fields = dict(keys)
    sparse = dict(keys["sparse_attention_config"])
    sparse["sparse_attention_freq"] = [1]
    flags = sparse.get("sparse_disable_index_value")
    if flags is not None:
        sparse["sparse_disable_index_value"] = [flags[-1] if isinstance(flags, list) else flags]
    fields.update(
        num_hidden_layers=1,
        sparse_attention_config=sparse,
        moe_layer_freq=[0],
        num_attention_heads=num_heads,
        num_key_value_heads=rank_kv_heads(keys, num_heads),
    )
    return fields


def sparse_fields(keys: dict, route: str) -> dict:
    """MiniMaxM3SparseAttentionConfig's keywords: the checkpoint's sparse geometry verbatim, the index value branch
    off (T:348-356), and the route (T:365-367)."""
    sparse = keys["sparse_attention_config"]
    missing = [key for key in SPARSE_FIELDS.values() if key not in sparse]
    if missing:
        raise KernelLimit(f"MiniMax-M3's sparse_attention_config lacks {', '.join(missing)}: no sparse geometry")
    fields = {name: int(sparse[key]) for name, key in SPARSE_FIELDS.items()}
    return {**fields, "sparse_disable_index_value": True, "implementation": route}


@dataclass(frozen=True)
class MsaLayout(PagedLayout):
    """The cache of one case: ``copies`` disjoint sets of ``batch_size`` sequences in one pool."""

    @property
    def max_tokens(self) -> int:
        """KvCacheConfig.max_tokens (T:638-660), for every copy's sequences."""
        page = self.tokens_per_block
        return 2 * self.num_sequences * (ceil_div(self.max_seq_len, page) * page + 2 * page)


def layout(case, context: bool, tokens_per_block: int, copies: int = 1) -> MsaLayout:
    """A prompt of isl tokens after `step` cached ones; a decode token after `step` cached ones (the reference's
    generation keys count the cached tokens: its sidecar re-keyed step -> step - 1)."""
    query_len = case.isl if context else 1
    return MsaLayout(case.batch_size, copies, query_len, case.step, tokens_per_block)


def module_label(route: str, attention_mro: list[str], metadata_mro: list[str]) -> str:
    """kernel_source of what was built: the route's label when the layer's backend and its metadata are the route's
    (T:693-779, :837-848); RuntimeError when they are not, so no row times one path under the other's label."""
    msa_built = attention_mro[0] == MSA_ATTENTION or MSA_ATTENTION in attention_mro
    msa_metadata = MSA_METADATA in metadata_mro
    if msa_built != msa_metadata or msa_built != (route == MSA):
        raise RuntimeError(
            f"TensorRT-LLM built {attention_mro[0]} with {metadata_mro[0]} for the {route!r} MiniMax-M3 route"
        )
    return LABELS[route]


def metadata_problem(route: str, context: bool, metadata) -> str | None:
    """What the prepared metadata lacks of its route's contract (T:750-779): the MSA metadata's cache-write buffers
    and, for a decode batch, its graph-safe decode plans; the Triton metadata's minimax_m3 attachment."""
    if route == MSA:
        if not getattr(metadata, "_msa_fields_ready", False):
            return "MiniMaxM3MsaSparseAttentionMetadata.prepare() built no MSA cache-write buffers"
        if not context and getattr(metadata, "msa_decode_proxy_plan", None) is None:
            return "the MSA metadata built no decode plans for a decode batch (sparse_metadata_params not reached)"
        return None
    if getattr(metadata, "minimax_m3", None) is None:
        return "MiniMaxM3AttentionMetadata.prepare() built no minimax_m3 attachment (not the M3 cache manager)"
    return None


def graph_safe(route: str, context: bool) -> bool:
    """The MSA route prefills eagerly in serving (its indexer plans fmha_sm100 on the host); every other batch
    replays a graph (T:896-916)."""
    return not (route == MSA and context)


def weight_bytes(keys: dict, heads: int, gemm_type: str) -> int:
    """qkv_proj and o_proj in gemm_type; index_qk_proj (index heads' queries and one key) in bf16."""
    d, hidden = keys["head_dim"], keys["hidden_size"]
    sparse = keys["sparse_attention_config"]
    kv = rank_kv_heads(keys, heads)
    quantized = hidden * (heads + 2 * kv) * d + heads * d * hidden
    index = hidden * (sparse["sparse_num_index_heads"] + 1) * sparse["sparse_index_dim"]
    return int(quantized * WEIGHT_BYTES[gemm_type]) + 2 * index


def cache_bytes_per_token(keys: dict, heads: int) -> int:
    """bf16 K and V of the rank's KV heads and the bf16 index key."""
    return 2 * (2 * rank_kv_heads(keys, heads) * keys["head_dim"] + keys["sparse_attention_config"]["sparse_index_dim"])


def footprint(case, context: bool) -> int:
    """Weights, the pool at the larger page size, per-token activations (hidden in and out, the fused q/k/v and its
    norm/rope copy, the index q/k, the attention output), and the Triton path's index scores: fp32 [tokens, index
    heads, keys] and its masked copy, the block scores, plus its chunked fp32 working set (triton_backend.py
    _index_attention_and_select, _sparse_gqa_masked)."""
    keys = MODELS.get(case.architecture)
    if keys is None:
        return 0  # prepare refuses the architecture before any allocation
    kv = layout(case, context, max(PAGES.values()))
    sparse = keys["sparse_attention_config"]
    heads, d, hidden = case.num_heads, keys["head_dim"], keys["hidden_size"]
    kvh, index_heads, index_dim = (
        rank_kv_heads(keys, heads),
        sparse["sparse_num_index_heads"],
        sparse["sparse_index_dim"],
    )
    tokens = kv.num_tokens
    per_token = 2 * (2 * hidden + 2 * (heads + 2 * kvh) * d + (index_heads + 1) * index_dim + heads * d)
    scores = tokens * index_heads * kv.seq_len * 4 * 2 + tokens * ceil_div(kv.seq_len, sparse["sparse_block_size"]) * 8
    return (
        weight_bytes(keys, heads, case.gemm_type)
        + kv.max_tokens * cache_bytes_per_token(keys, heads)
        + tokens * per_token
        + scores
        + 2 * CHUNK_BUDGET
    )
