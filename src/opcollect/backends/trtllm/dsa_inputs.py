"""What TensorRT-LLM 1.3.0rc20's DSA attention module (backends/trtllm/dsa.py) is built and fed with: each
architecture's config fields, the refusals, the cache layout and the bytes a case needs. No tensorrt_llm and no torch
import: the CPU tests check these against the checkpoints' config.json and by hand.

Paths are TensorRT-LLM's tensorrt_llm/...; "AIC" is the reference collector (ai-dynamo/aiconfigurator
collector/trtllm/collect_mla_module.py at 095f58a5, `__compat__ "trtllm>=1.3.0rc20"`, :47).

- Config: the fields DeepseekV3DecoderLayer, its DSA attention and RopeParams.from_config read
  (models/modeling_deepseekv3.py DeepseekV3DecoderLayer.__init__, DeepseekV32Attention; attention_backend/
  interface.py RopeParams.from_config), as the config.json files aiconfigurator-core 0.12.0 ships hold them
  (model_configs/deepseek-ai--DeepSeek-V3.2_config.json, zai-org--GLM-5_config.json); GLM-5's rope_parameters are
  given in the flat form (rope_theta, no rope_scaling) every RopeParams.from_config read accepts.
- Both architectures are built as model_type deepseek_v32 / DeepseekV32ForCausalLM, the type TensorRT-LLM serves
  DSA under (AIC :534-536 remaps GLM-5's glm_moe_dsa the same way), with one layer and the rank's heads (:538-541).
- The cache: one SELFKONLY latent of 576 values a token (bf16, or fp8 from SM100) and the indexer's fp8 keys with a
  float32 scale per 128 values (132 bytes a token; DSACacheManager.get_indexer_k_cache_buffers), pages of 64 tokens
  where FlashMLA runs (SM90) and 32 elsewhere (mla_inputs.page_size; AIC :647-648).
"""

from __future__ import annotations

import math

from opcollect.backends.mla_configs import DEEPSEEK_V32, GLM5, legacy_rope
from opcollect.backends.trtllm import mla_inputs
from opcollect.backends.trtllm.mla_module import EXCLUDED, WEIGHT_BYTES
from opcollect.runtime.contract import KernelLimit

# DeepSeek-V3.2 and GLM-5 (config.json, see the module docstring): the attention, rope and DSA fields (mla_configs,
# the rope as rope_theta and rope_scaling), and the decoder layer's MLP fields it reads to build layer 0 (a dense
# layer: first_k_dense_replace 3)
_DECODER = {
    "attention_bias": False,
    "first_k_dense_replace": 3,
    "hidden_act": "silu",
    "moe_intermediate_size": 2048,
    "moe_layer_freq": 1,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
}
MODELS: dict[str, dict] = {
    "DeepseekV32ForCausalLM": {
        **_DECODER,
        **legacy_rope(DEEPSEEK_V32),
        "intermediate_size": 18432,
        "n_group": 8,
        "topk_group": 4,
    },
    "GlmMoeDsaForCausalLM": {
        **_DECODER,
        **legacy_rope(GLM5),
        "intermediate_size": 12288,
        "n_group": 1,
        "topk_group": 1,
    },
}
SERVED_TYPE = {"model_type": "deepseek_v32", "architectures": ["DeepseekV32ForCausalLM"]}
INDEX_QUANT_BLOCK = 128  # DSACacheManager.quant_block_size: one float32 scale per 128 indexer key values
INDEXER_CHUNK = 32768  # DSAMetadataParams' indexer_max_chunk_size default: query tokens per prefill logits chunk
SKIP_INDEXER = "_skip_indexer"
# DeepSeekSparseAttentionConfig fields a config gives where the installed class has them (later copies of
# llmapi/llm_args.py; ModelConfig.from_pretrained reads indexer_rope_interleave off the checkpoint for both
# architectures in model_config.py, index id 54702305068): GLM-5's indexer rope is interleaved
OPTIONAL_SPARSE_FIELDS = ("indexer_rope_interleave",)


def model_keys(architecture: str) -> dict:
    found = MODELS.get(architecture)
    if found is None:
        known = ", ".join(MODELS)
        raise KernelLimit(f"the TensorRT-LLM DSA runner builds {known}, not {architecture} (dsa_inputs.MODELS)")
    return {k: dict(v) if isinstance(v, dict) else v for k, v in found.items()}


def check_case(case) -> dict:
    """The architecture's fields; KernelLimit, before any framework import, for what TensorRT-LLM does not serve."""
    if case.op_name.endswith(SKIP_INDEXER):
        raise KernelLimit("TensorRT-LLM's DSA rows time layer 0, which runs its indexer; no indexer-skipping layer")
    keys = model_keys(case.architecture)
    mla_inputs.check_case(case)  # bf16 compute, a bf16 or fp8 latent cache
    if case.gemm_type not in WEIGHT_BYTES:
        raise KernelLimit(f"the TensorRT-LLM DSA runner has no {case.gemm_type} projections")
    if case.isl < 1 or case.step < 0 or case.batch_size < 1 or case.num_heads < 1:
        raise KernelLimit(f"a DSA case needs new tokens, a batch and heads: {case}")
    return keys


def check_capability(case, capability: tuple[int, int]) -> None:
    """What the device refuses (AIC collect_mla_module.py): no MLA FMHA below SM90 (:820-833); the indexer's DeepGEMM
    MQA logits assert off the datacenter SMs, SM120 on (:803-819); FlashMLA's sparse prefill, SM90's DSA kernel,
    asserts a bf16 cache, so an fp8 cache needs SM100's trtllm-gen sparse MLA (:4-11, :176-178); NVFP4 projections
    need SM100 (:172-173)."""
    mla_inputs.check_capability(capability)
    major = capability[0]
    if major >= 12:
        raise KernelLimit(f"TensorRT-LLM's DSA indexer (DeepGEMM MQA logits) has no SM{major}{capability[1]} kernel")
    if case.kv_cache_dtype == "fp8" and major < 10:
        raise KernelLimit(f"TensorRT-LLM's DSA takes an fp8 cache from SM100 only (SM{major}{capability[1]})")
    if case.gemm_type == "nvfp4" and major < 10:
        raise KernelLimit(f"nvfp4 projections need SM100 or newer (SM{major}{capability[1]})")


def pretrained_fields(keys: dict, num_heads: int) -> dict:
    """The pretrained config the module is built from: the model's fields under the served DSA type, one layer, the
    rank's heads (AIC :534-541)."""
    fields = {k: v for k, v in keys.items() if k not in OPTIONAL_SPARSE_FIELDS}
    fields.update(SERVED_TYPE, num_hidden_layers=1, num_attention_heads=num_heads, num_key_value_heads=num_heads)
    return fields


def sparse_fields(keys: dict, known: set[str] | frozenset[str]) -> dict:
    """DeepSeekSparseAttentionConfig's keywords: the indexer's heads, head size and top-k (AIC :482-486), and the
    optional fields the installed class knows (``known``: its field names)."""
    fields = {k: keys[k] for k in ("index_n_heads", "index_head_dim", "index_topk")}
    fields.update({k: keys[k] for k in OPTIONAL_SPARSE_FIELDS if k in keys and k in known})
    return fields


def layout(case, tokens_per_block: int, copies: int = 1) -> mla_inputs.KvLayout:
    """isl new tokens per sequence after `step` cached ones, in both phases: a context row's step is its cached
    prefix, a generation row (isl 1) appends one token to `step` cached ones (AIC :650-661, :701)."""
    return mla_inputs.KvLayout(case.batch_size, copies, case.isl, case.step, tokens_per_block)


def max_seq_len(case, kv: mla_inputs.KvLayout) -> int:
    """The cache manager's and the engine's max_seq_len: serving's, the model's max_position_embeddings, or the case's
    sequence if it is longer. The decode indexer's logits are this wide (sparse/dsa.py sparse_attn_indexer passes
    kv_cache_manager.max_seq_len to fp8_paged_mqa_logits)."""
    return max(MODELS[case.architecture]["max_position_embeddings"], kv.max_seq_len)


def indexer_entry_bytes(head_dim: int) -> int:
    return head_dim + head_dim // INDEX_QUANT_BLOCK * 4


def cache_bytes_per_token(keys: dict, kv_cache_dtype: str) -> int:
    latent = keys["kv_lora_rank"] + keys["qk_rope_head_dim"]
    return latent * mla_inputs.KV_BYTES[kv_cache_dtype] + indexer_entry_bytes(keys["index_head_dim"])


def weight_bytes(keys: dict, heads: int, gemm_type: str) -> int:
    """The projections in gemm_type (kv_b_proj bf16 where the format excludes it): the fused q_a/kv_a/indexer-wk,
    q_b, kv_b, o and the indexer's wq_b; the indexer's float32 wk and head-weight projections (twice: some copies keep
    a fused copy); the bf16 absorb weights k_b_proj_trans and v_b_proj."""
    k = keys
    nope, rope, v, idx = k["qk_nope_head_dim"], k["qk_rope_head_dim"], k["v_head_dim"], k["index_head_dim"]
    projections = {
        "kv_a_proj_with_mqa": k["hidden_size"] * (k["q_lora_rank"] + k["kv_lora_rank"] + rope + idx),
        "q_b_proj": k["q_lora_rank"] * heads * (nope + rope),
        "kv_b_proj": k["kv_lora_rank"] * heads * (nope + v),
        "o_proj": heads * v * k["hidden_size"],
        "indexer.wq_b": k["q_lora_rank"] * k["index_n_heads"] * idx,
    }
    total = 0.0
    for name, elems in projections.items():
        excluded = any(pattern.strip("*") in name for pattern in EXCLUDED.get(gemm_type, ()))
        total += elems * WEIGHT_BYTES["bfloat16" if excluded else gemm_type]
    fp32 = 2 * 4 * k["hidden_size"] * (idx + k["index_n_heads"])
    absorb = 2 * heads * k["kv_lora_rank"] * (nope + v)
    return math.ceil(total) + fp32 + absorb


def activation_bytes_per_token(keys: dict, heads: int, context: bool) -> int:
    """bf16 hidden in and out, the fused-A output, q, the phase's MLA intermediates (k/v expansion and output for a
    prompt; the absorbed 576-wide query and 512-wide latent output for decode), the indexer's query in bf16 and fp8,
    its head weights and its top-k indices (its own and the metadata's buffer)."""
    k = keys
    nope, rope, v = k["qk_nope_head_dim"], k["qk_rope_head_dim"], k["v_head_dim"]
    latent = k["kv_lora_rank"] + rope
    common = 2 * k["hidden_size"] + k["q_lora_rank"] + latent + k["index_head_dim"] + heads * (nope + rope)
    phase = heads * (2 * (nope + v) + nope + rope) if context else heads * (latent + 2 * k["kv_lora_rank"] + v)
    index = 3 * k["index_n_heads"] * k["index_head_dim"] + 4 * k["index_n_heads"] + 2 * 4 * k["index_topk"]
    return 2 * (common + phase) + index


def logits_bytes(case, context: bool, width: int) -> int:
    """The indexer's float32 logits at their largest: a decode step's [batch, max_seq_len] (fp8_paged_mqa_logits);
    a prefill chunk's [chunk queries, chunk keys] (fp8_mqa_logits over up to 32768 query tokens, whole requests
    packed, split_prefill_chunks), none when every request fits in index_topk (the indexer is skipped)."""
    keys = MODELS[case.architecture]
    if not context:
        return case.batch_size * case.isl * width * 4
    seq = case.step + case.isl
    if seq <= keys["index_topk"]:
        return 0
    requests = min(case.batch_size, max(1, INDEXER_CHUNK // case.isl))
    queries = min(requests * case.isl, INDEXER_CHUNK)
    return queries * requests * seq * 4


def footprint(case, context: bool) -> int:
    """Weights, the case's caches at the larger page size, per-token activations, the indexer's logits and, for a
    prompt after a cached prefix, the gathered prefix keys (132 bytes and two int64 slots per cached token)."""
    keys = MODELS.get(case.architecture)
    if keys is None:
        return 0  # prepare refuses the architecture before any allocation
    kv = layout(case, mla_inputs.MAX_PAGE)
    tokens = kv.num_tokens
    gathered = case.batch_size * case.step * (indexer_entry_bytes(keys["index_head_dim"]) + 16) if context else 0
    return (
        weight_bytes(keys, case.num_heads, case.gemm_type)
        + kv.max_tokens * cache_bytes_per_token(keys, case.kv_cache_dtype)
        + tokens * activation_bytes_per_token(keys, case.num_heads, context)
        + logits_bytes(case, context, max_seq_len(case, kv))
        + gathered
    )


def module_label(module_mro: list[str], backend_mro: list[str], has_indexer: bool) -> str:
    """kernel_source of the built module: default, the static label of every TensorRT-LLM DSA row (AIC :974), for an
    MLA whose attention backend is TensorRT-LLM's (a TrtllmAttention, DSATrtllmAttention for DSA) with an indexer;
    another backend is reported by its class name, so the row shows the difference."""
    if "MLA" not in module_mro or not has_indexer:
        raise RuntimeError(f"TensorRT-LLM built {module_mro[0]}, not an MLA with a DSA indexer, for a DSA case")
    return "default" if "TrtllmAttention" in backend_mro else backend_mro[0]
