"""A model's linear-attention layers, read from its config.json keys: Gated DeltaNet (GDN: Qwen3.5, Qwen3.6,
Qwen3-Next) and Mamba2 (Nemotron-H, Nemotron-3). cases/profiles.py calls ``linear_attention`` for every model and
passes the result to the plans through ModelSpec.linear and ModelShapes.linear; ``rank_gemms`` gives the layers'
projection GEMMs on a rank.

GDN (keys under text_config in Qwen3.5's configs, read_hf_config merges them): ``linear_num_key_heads`` key heads of
``linear_key_head_dim``, ``linear_num_value_heads`` value heads of ``linear_value_head_dim``, a causal conv1d of
``linear_conv_kernel_dim`` taps over the packed q | k | v channels. ``layer_types`` names each layer
linear_attention or full_attention; without it layer i is full attention iff (i + 1) % ``full_attention_interval``
== 0 (default 4; vLLM 0.24.0 transformers_utils/configs/qwen3_5.py:88-96, qwen3_next.py:249-253).

Mamba2 (Nemotron-H): ``mamba_num_heads`` heads of ``mamba_head_dim``, state ``ssm_state_size`` wide in
``n_groups`` groups of B and C, a conv1d of ``conv_kernel`` taps, SSD chunks of ``chunk_size`` tokens.
``hybrid_override_pattern`` (or ``layers_block_type``, aiconfigurator-core sdk/utils.py:63-79) gives each layer's
block: M Mamba2, * attention, - MLP, E MoE (vLLM transformers_utils/configs/nemotron_h.py:217-225).

The model profiles count the layers of each kind: a hybrid model plans its linear-attention shapes and, when it
has any full-attention layer, its attention shapes too.
"""

from __future__ import annotations

from typing import Annotated, Mapping, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from opcollect.errors import InputError
from opcollect.runtime.planfile import MAX_DIM
from opcollect.yamlio import describe_validation_error

PosInt = Annotated[int, Field(strict=True, gt=0, le=MAX_DIM)]

GDN_ARCHITECTURES = frozenset(
    {"Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration", "Qwen3NextForCausalLM"}
)
MAMBA2_ARCHITECTURES = frozenset({"NemotronHForCausalLM"})
GDN_KEYS = ("linear_num_key_heads", "linear_key_head_dim", "linear_num_value_heads", "linear_value_head_dim")
GDN_KEYS += ("linear_conv_kernel_dim",)
MAMBA2_KEYS = ("mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups", "conv_kernel", "chunk_size")
PATTERN_KEYS = ("hybrid_override_pattern", "layers_block_type")
# every top-level config.json key read here (layer_types and num_hidden_layers are ModelConfig's): read_hf_config
# picks them, parse_config hands them here only
KEYS = (*GDN_KEYS, "full_attention_interval", *MAMBA2_KEYS, *PATTERN_KEYS)
BLOCKS = {"M": "Mamba2", "*": "attention", "-": "MLP", "E": "MoE"}
# layers_block_type's words for the pattern's letters (aiconfigurator-core sdk/utils.py:32-44)
BLOCK_WORDS = {
    "mamba": "M",
    "attention": "*",
    "mlp": "-",
    "dense": "-",
    "ffn": "-",
    "moe": "E",
    **{b: b for b in BLOCKS},
}


class _GdnKeys(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    linear_num_key_heads: PosInt
    linear_key_head_dim: PosInt
    linear_num_value_heads: PosInt
    linear_value_head_dim: PosInt
    linear_conv_kernel_dim: PosInt
    full_attention_interval: PosInt = 4


class _Mamba2Keys(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    mamba_num_heads: PosInt
    mamba_head_dim: PosInt
    ssm_state_size: PosInt
    n_groups: PosInt
    conv_kernel: PosInt
    chunk_size: PosInt


class Gdn(NamedTuple):
    architecture: str
    d_model: int  # hidden_size: a lookup key of gdn_perf, global at every TP size
    d_conv: int
    num_k_heads: int  # the model's; a rank holds num_k_heads / tp
    head_k_dim: int
    num_v_heads: int
    head_v_dim: int
    layers: int  # linear_attention layers
    attention_layers: int  # full_attention layers


class Mamba2(NamedTuple):
    architecture: str
    d_model: int
    d_state: int
    d_conv: int
    nheads: int  # the model's: mamba2_perf keys the whole layer's heads
    head_dim: int
    n_groups: int
    chunk_size: int
    layers: int  # M blocks
    attention_layers: int  # * blocks
    mlp_layers: int = 0  # - blocks: an ungated relu2 MLP each (cases/profiles.py plans its GEMMs)


def config_keys(data: Mapping[str, object]) -> dict[str, object]:
    """The keys of a config.json this module reads (those that are set), for read_hf_config to pass on."""
    return {key: data[key] for key in KEYS if data.get(key) is not None}


def _validate(source: str, model: type[BaseModel], data: Mapping[str, object]) -> BaseModel:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InputError(describe_validation_error(source, exc)) from None


def linear_attention(
    source: str,
    architecture: str,
    data: Mapping[str, object],
    hidden: int,
    layer_types: tuple[str, ...] | None,
    num_layers: int | None,
) -> Gdn | Mamba2 | None:
    """The model's linear attention from its keys, None when it has none (or no layer of it). ``hidden``,
    ``layer_types``, ``num_layers``: its hidden_size, layer_types and num_hidden_layers. A GDN or Mamba2
    architecture without its keys, or keys that disagree with each other or with the layer count, is refused with
    one line naming the key and the fix."""
    mamba = "mamba_num_heads" in data or any(key in data for key in PATTERN_KEYS)
    if architecture in MAMBA2_ARCHITECTURES or mamba:
        return _mamba2(source, architecture, data, hidden, num_layers)
    gdn = any(key in data for key in GDN_KEYS) or "linear_attention" in (layer_types or ())
    if architecture in GDN_ARCHITECTURES or gdn:
        return _gdn(source, architecture, data, hidden, layer_types, num_layers)
    return None


def _missing(source: str, architecture: str, key: str, what: str, keys: tuple[str, ...]) -> InputError:
    return InputError(
        f"{source}: missing key {key!r} required for {architecture}'s {what} ({', '.join(keys)}); add it from the "
        "model's config.json"
    )


def _gdn(
    source: str,
    architecture: str,
    data: Mapping[str, object],
    hidden: int,
    layer_types: tuple[str, ...] | None,
    num_layers: int | None,
) -> Gdn | None:
    picked = {key: data[key] for key in (*GDN_KEYS, "full_attention_interval") if data.get(key) is not None}
    for key in GDN_KEYS:
        if key not in picked:
            raise _missing(source, architecture, key, "Gated DeltaNet layers", GDN_KEYS)
    keys = _validate(source, _GdnKeys, picked)
    nk, nv = keys.linear_num_key_heads, keys.linear_num_value_heads
    if nv % nk:
        # each key head leads nv / nk value heads: vLLM 0.24.0 views the qkvz projection per key head
        # (model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py:652-677)
        raise InputError(
            f"{source}: field 'linear_num_value_heads': {nv} is not a multiple of linear_num_key_heads {nk}; each "
            f"key head leads linear_num_value_heads / linear_num_key_heads value heads, set it to a multiple of {nk}"
        )
    if layer_types is not None:
        if num_layers is not None and len(layer_types) != num_layers:
            # the consumer refuses it too (aiconfigurator-core sdk/utils.py:886-889)
            raise InputError(
                f"{source}: field 'layer_types': {len(layer_types)} entries for num_hidden_layers {num_layers}; "
                "list one type per layer"
            )
        kinds = list(layer_types)
    elif num_layers is not None:
        interval = keys.full_attention_interval
        kinds = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers)]
    else:
        raise InputError(
            f"{source}: missing key 'layer_types' required for {architecture}'s Gated DeltaNet layers (or "
            "num_hidden_layers with full_attention_interval); add it from the model's config.json"
        )
    layers = kinds.count("linear_attention")
    if not layers:
        return None
    attention = kinds.count("full_attention")
    head_k, head_v = keys.linear_key_head_dim, keys.linear_value_head_dim
    return Gdn(architecture, hidden, keys.linear_conv_kernel_dim, nk, head_k, nv, head_v, layers, attention)


def _pattern(source: str, data: Mapping[str, object]) -> str | None:
    """The block pattern from hybrid_override_pattern, else layers_block_type (the consumer's order, sdk/utils.py:
    63-79); None when neither is set."""
    pattern = data.get("hybrid_override_pattern")
    if pattern is not None:
        if not isinstance(pattern, str):
            raise InputError(
                f"{source}: field 'hybrid_override_pattern' is a {type(pattern).__name__}; it is a string of "
                "M, *, - and E, one per layer"
            )
        for i, block in enumerate(pattern):
            if block not in BLOCKS:
                raise InputError(
                    f"{source}: field 'hybrid_override_pattern': {block!r} at layer {i} is no Nemotron-H block; use "
                    "M (Mamba2), * (attention), - (MLP) or E (MoE)"
                )
        return pattern
    blocks = data.get("layers_block_type")
    if blocks is None:
        return None
    if not isinstance(blocks, (list, tuple)):
        raise InputError(
            f"{source}: field 'layers_block_type' is a {type(blocks).__name__}; it is a list of block types, one "
            "per layer"
        )
    letters = []
    for i, word in enumerate(blocks):
        if not isinstance(word, str) or word not in BLOCK_WORDS:
            raise InputError(
                f"{source}: field 'layers_block_type': {word!r} at layer {i} is no Nemotron-H block; use mamba, "
                "attention, mlp or moe"
            )
        letters.append(BLOCK_WORDS[word])
    return "".join(letters)


def _mamba2(
    source: str, architecture: str, data: Mapping[str, object], hidden: int, num_layers: int | None
) -> Mamba2 | None:
    picked = {key: data[key] for key in MAMBA2_KEYS if data.get(key) is not None}
    for key in MAMBA2_KEYS:
        if key not in picked:
            raise _missing(source, architecture, key, "Mamba2 layers", MAMBA2_KEYS)
    keys = _validate(source, _Mamba2Keys, picked)
    pattern = _pattern(source, data)
    if pattern is None:
        raise _missing(source, architecture, "hybrid_override_pattern", "layer pattern", PATTERN_KEYS)
    if num_layers is not None and len(pattern) != num_layers:
        # vLLM 0.24.0 asserts it (transformers_utils/configs/nemotron_h.py:219-221)
        raise InputError(
            f"{source}: field 'hybrid_override_pattern': {len(pattern)} blocks for num_hidden_layers {num_layers}; "
            "give one block per layer"
        )
    if keys.mamba_num_heads % keys.n_groups:
        # every SSD kernel asserts it: a group's B and C serve nheads / n_groups heads (vLLM 0.24.0
        # model_executor/layers/mamba/ops/ssd_combined.py:51, mamba_ssm.py:587)
        raise InputError(
            f"{source}: field 'mamba_num_heads': {keys.mamba_num_heads} is not a multiple of n_groups "
            f"{keys.n_groups}; each group of B and C serves mamba_num_heads / n_groups heads, set it to a multiple "
            f"of {keys.n_groups}"
        )
    if "M" not in pattern:
        return None
    return Mamba2(
        architecture,
        hidden,
        keys.ssm_state_size,
        keys.conv_kernel,
        keys.mamba_num_heads,
        keys.mamba_head_dim,
        keys.n_groups,
        keys.chunk_size,
        pattern.count("M"),
        pattern.count("*"),
        pattern.count("-"),
    )


def gdn_rank_heads(layer: Gdn, tp: int) -> tuple[int, int] | None:
    """(key heads, value heads) on a rank at tp, None when tp does not divide both (the consumer refuses the TP
    size, aiconfigurator-core sdk/models/qwen35.py:148-154; the collector too, case_generator.py:2102-2106)."""
    if layer.num_k_heads % tp or layer.num_v_heads % tp:
        return None
    return layer.num_k_heads // tp, layer.num_v_heads // tp


class RankGemms(NamedTuple):
    shapes: tuple[tuple[int, int], ...]  # (n, k) of each projection on the rank
    why: str | None  # why tp cannot split the layer, when it cannot
    what: str  # the shapes it leaves out then
    families: tuple[str, ...]  # their op families


def rank_gemms(layer: Gdn | Mamba2, tp: int) -> RankGemms:
    """The linear-attention layer's projection GEMMs on a rank at tp, as the consumer bills them.

    GDN (sdk/models/qwen35.py:282-285): in_proj_qkvz [hidden -> 2 (nk hk + nv hv) / tp], in_proj_ba [hidden ->
    2 nv / tp], out_proj [nv hv / tp -> hidden]. Mamba2 (vLLM model_executor/layers/mamba/mamba_mixer2.py:285-310;
    sdk/models/nemotron_h.py:131-134): in_proj [hidden -> 2 d_inner / tp + 2 groups N + nheads / tp] with
    n_groups / tp groups a rank, or the single group replicated, and out_proj [d_inner / tp -> hidden]."""
    h = layer.d_model
    if isinstance(layer, Gdn):
        heads = gdn_rank_heads(layer, tp)
        if heads is None:
            why = f"does not divide both {layer.num_k_heads} key and {layer.num_v_heads} value heads of Gated DeltaNet"
            return RankGemms((), why, "Gated DeltaNet projection GEMM and kernel", ("gemm", "linear_attention"))
        nk, nv = heads
        qkvz = 2 * (nk * layer.head_k_dim + nv * layer.head_v_dim)
        return RankGemms(((qkvz, h), (2 * nv, h), (h, nv * layer.head_v_dim)), None, "", ())
    if layer.nheads % tp or (layer.n_groups % tp and layer.n_groups != 1):
        why = f"does not divide both {layer.nheads} Mamba2 heads and {layer.n_groups} groups (nor is it 1 group)"
        return RankGemms((), why, "Mamba2 projection GEMM", ("gemm",))
    groups = max(1, layer.n_groups // tp)
    inner = layer.nheads // tp * layer.head_dim
    return RankGemms(((2 * inner + 2 * groups * layer.d_state + layer.nheads // tp, h), (h, inner)), None, "", ())


def has_attention(layer: Gdn | Mamba2 | None) -> bool:
    """Whether the model has attention layers beside its linear ones (a model without linear attention has)."""
    return layer is None or layer.attention_layers > 0
