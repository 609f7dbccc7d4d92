"""A model's sparse attention, read from its config.json keys: DeepSeek's sparse attention (DSA) and MiniMax-M3's
block-sparse attention (MSA). cases/profiles.py calls ``sparse_attention`` for every model and passes the result
to the plans through ModelSpec.sparse and ModelShapes.sparse.

DSA (DeepSeek-V3.2, GLM-5.x): an MLA model with a lightning indexer. ``index_n_heads`` heads of ``index_head_dim``
score every cached token, and the top ``index_topk`` tokens are the only ones the MLA kernel reads. GLM-5.2 runs
the indexer on one layer in ``index_topk_freq``, from layer ``index_skip_topk_offset`` on; the other layers reuse
the top-k of the layer before (SGLang 0.5.14 srt/configs/model_config.py:180-200 dsa_layer_skips_topk).
``max_position_embeddings`` bounds the prefixes SGLang's module sweep reaches, and a block-FP8
``quantization_config`` (``weight_block_size``) makes the projections fp8_block (the reference collector,
collector/sglang/collect_mla_module.py:463-547).

MSA (MiniMax-M3): ``sparse_attention_config`` holds the index branch: ``sparse_num_index_heads`` heads of
``sparse_index_dim`` pick the top ``sparse_topk_blocks`` blocks of ``sparse_block_size`` tokens per query.
"""

from __future__ import annotations

from typing import Annotated, Mapping, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from opcollect.errors import InputError
from opcollect.runtime.planfile import MAX_DIM
from opcollect.yamlio import describe_validation_error

PosInt = Annotated[int, Field(strict=True, gt=0, le=MAX_DIM)]
NonNegInt = Annotated[int, Field(strict=True, ge=0, le=MAX_DIM)]

# the architectures whose attention is DSA or MSA: their configs must carry the keys
DSA_ARCHITECTURES = frozenset({"DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM"})
MSA_ARCHITECTURES = frozenset({"MiniMaxM3ForCausalLM"})
DSA_KEYS = ("index_topk", "index_n_heads", "index_head_dim", "index_topk_freq", "index_skip_topk_offset")
MSA_KEY = "sparse_attention_config"
# every top-level config.json key read here: read_hf_config picks them, parse_config hands them here only
KEYS = (*DSA_KEYS, "max_position_embeddings", MSA_KEY)


class _DsaKeys(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    index_topk: PosInt
    index_n_heads: PosInt
    index_head_dim: PosInt
    index_topk_freq: PosInt = 1
    index_skip_topk_offset: NonNegInt | None = None
    max_position_embeddings: PosInt | None = None


class _MsaKeys(BaseModel):
    """The keys of sparse_attention_config that define the module's shapes; its per-layer lists are not read."""

    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)

    sparse_num_index_heads: PosInt
    sparse_index_dim: PosInt
    sparse_block_size: PosInt
    sparse_topk_blocks: PosInt


class Dsa(NamedTuple):
    architecture: str
    heads: int  # num_attention_heads: a rank holds heads / tp
    index_topk: int  # tokens the MLA kernel reads per query; SGLang's dense-prefill threshold too
    index_heads: int
    index_head_dim: int
    topk_freq: int  # one layer in topk_freq runs the indexer; 1: every layer
    max_positions: int | None  # max_position_embeddings
    gemm_type: str  # the checkpoint's projections as SGLang serves them: fp8_block or bfloat16


class Msa(NamedTuple):
    architecture: str
    heads: int  # num_attention_heads
    index_heads: int
    index_dim: int
    block_size: int
    topk_blocks: int


def config_keys(data: Mapping[str, object]) -> dict[str, object]:
    """The keys of a config.json this module reads (those that are set), for read_hf_config to pass on."""
    return {key: data[key] for key in KEYS if data.get(key) is not None}


def _checkpoint_gemm(quantization: object) -> str:
    """fp8_block when quantization_config is block-wise FP8 (quant_method fp8 with weight_block_size, or ModelOpt's
    quant_algo FP8), else bfloat16: the reference collector's rule for SGLang's DSA projections
    (collect_mla_module.py:463-547; an NVFP4 checkpoint's DSA projections stay bf16 there)."""
    if not isinstance(quantization, dict):
        return "bfloat16"
    method = str(quantization.get("quant_method", "")).lower()
    if method == "fp8" and quantization.get("weight_block_size"):
        return "fp8_block"
    algo = str(quantization.get("quant_algo", "")).upper()
    if method == "modelopt" and "FP8" in algo and "FP4" not in algo:
        return "fp8_block"
    return "bfloat16"


def sparse_attention(
    source: str, architecture: str, data: Mapping[str, object], mla: bool, heads: int, kv_heads: int | None
) -> Dsa | Msa | None:
    """The model's sparse attention from its keys, None when it has none. ``mla``: the config has MLA keys;
    ``heads``, ``kv_heads``: its num_attention_heads and num_key_value_heads. A DSA or MSA architecture without
    its keys, or keys that disagree with each other or with the attention they index, is refused with one line
    naming the key and the fix."""
    if MSA_KEY in data or architecture in MSA_ARCHITECTURES:
        return _msa(source, architecture, data, heads, kv_heads)
    if any(key in data for key in DSA_KEYS) or architecture in DSA_ARCHITECTURES:
        return _dsa(source, architecture, data, mla, heads)
    return None


def _validate(source: str, model: type[BaseModel], data: Mapping[str, object], prefix: str = "") -> BaseModel:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        message = describe_validation_error(source, exc)
        raise InputError(message.replace("field '", f"field '{prefix}", 1) if prefix else message) from None


def _dsa(source: str, architecture: str, data: Mapping[str, object], mla: bool, heads: int) -> Dsa:
    picked = {key: data[key] for key in (*DSA_KEYS, "max_position_embeddings") if data.get(key) is not None}
    for key in DSA_KEYS[:3]:
        if key not in picked:
            raise InputError(
                f"{source}: missing key {key!r} required for {architecture}'s sparse attention (DSA: "
                f"{', '.join(DSA_KEYS[:3])}); add it from the model's config.json"
            )
    keys = _validate(source, _DsaKeys, picked)
    if not mla:
        raise InputError(
            f"{source}: field 'index_topk': DSA indexes an MLA cache, but the config has no kv_lora_rank; add the "
            "MLA keys (kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim) or remove the index_* keys"
        )
    offset = keys.index_skip_topk_offset
    if keys.index_topk_freq > 1 and offset == 0:
        # SGLang asserts it: layer 0 would reuse a top-k no layer made (model_config.py:195-199)
        raise InputError(
            f"{source}: field 'index_skip_topk_offset': 0 makes layer 0 reuse a top-k no earlier layer made "
            f"(index_topk_freq {keys.index_topk_freq}); set it to 1 or more (GLM-5.2: 3)"
        )
    return Dsa(
        architecture,
        heads,
        keys.index_topk,
        keys.index_n_heads,
        keys.index_head_dim,
        keys.index_topk_freq,
        keys.max_position_embeddings,
        _checkpoint_gemm(data.get("quantization_config")),
    )


def _msa(source: str, architecture: str, data: Mapping[str, object], heads: int, kv_heads: int | None) -> Msa:
    raw = data.get(MSA_KEY)
    if raw is None:
        raise InputError(
            f"{source}: missing key {MSA_KEY!r} required for {architecture}'s block-sparse attention (MSA); "
            "add it from the model's config.json"
        )
    if not isinstance(raw, dict):
        raise InputError(
            f"{source}: field {MSA_KEY!r} is a {type(raw).__name__}; it is a JSON object of sparse_* keys, "
            "as the model's config.json holds it"
        )
    keys = _validate(source, _MsaKeys, raw, prefix=f"{MSA_KEY}.")
    if kv_heads is not None and keys.sparse_num_index_heads != kv_heads:
        # vLLM 0.24.0 fuses index_q into the qkv projection with as many heads as K and V and shards them alike
        # (models/minimax_m3/nvidia/model.py:425-431)
        raise InputError(
            f"{source}: field '{MSA_KEY}.sparse_num_index_heads': {keys.sparse_num_index_heads} is not "
            f"num_key_value_heads {kv_heads}; MSA's index heads are the KV heads, set it to {kv_heads}"
        )
    return Msa(
        architecture,
        heads,
        keys.sparse_num_index_heads,
        keys.sparse_index_dim,
        keys.sparse_block_size,
        keys.sparse_topk_blocks,
    )
