"""DeepSeek-V4's own config.json keys: compressed sparse attention (CSA), heavily compressed attention (HCA) and the
hyper-connection (mHC) mixing, as far as the dsv4_* and mhc tables need them.

A DeepSeek-V4 layer attends through one latent KV head (head_dim 512, qk_rope_head_dim of it rotated) over a
sliding window of ``sliding_window`` tokens plus, by the layer's ``compress_ratios`` entry, nothing else (0), the
top ``index_topk`` of the KV compressed 4 to 1 that an indexer of ``index_n_heads`` x ``index_head_dim`` scores
(4: CSA), or all of the KV compressed 128 to 1 (128: HCA). The output projection is grouped: ``o_groups`` groups
of heads, each projected to ``o_lora_rank``. Around every attention and FFN block the residual stream is ``hc_mult``
copies wide, mixed by a Sinkhorn normalisation of ``hc_sinkhorn_iters`` iterations (mHC).

Read by vLLM 0.24.0 (models/deepseek_v4/attention.py:160-330), SGLang 0.5.14 (srt/models/deepseek_v4.py) and the
consumer (aiconfigurator-core 0.12.0 sdk/common.py:287-305 DeepSeekV4Config, sdk/models/deepseek_v4.py). The
projections, the indexer and the compressor are timed inside the dsv4_* module tables, so a DeepSeek-V4 model adds
no attention GEMM or attention-kernel shapes of its own (cases/profiles.py leaves them out for it).
"""

from __future__ import annotations

from typing import Annotated, Mapping, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from opcollect.errors import InputError
from opcollect.runtime.planfile import MAX_DIM
from opcollect.yamlio import describe_validation_error

PosInt = Annotated[int, Field(strict=True, gt=0, le=MAX_DIM)]
NonNegInt = Annotated[int, Field(strict=True, ge=0, le=MAX_DIM)]

ARCHITECTURES = frozenset({"DeepseekV4ForCausalLM"})
# a layer's compress_ratios entry: sliding window only, CSA, HCA (vLLM attention.py:181-185 reads any value, its
# compressor knows 4 and 128; the consumer refuses others, sdk/models/deepseek_v4.py:19,65-68)
SWA, CSA, HCA = 0, 4, 128
RATIOS = (SWA, CSA, HCA)
# the config keys standard readers leave alone (ModelConfig reads hidden_size, heads, head_dim, q_lora_rank, ...)
KEYS = (
    "compress_ratios",
    "o_lora_rank",
    "o_groups",
    "index_n_heads",
    "index_head_dim",
    "index_topk",
    "hc_mult",
    "hc_sinkhorn_iters",
    "max_position_embeddings",
    "num_nextn_predict_layers",
)


class Dsv4Config(BaseModel):
    """The DeepSeek-V4 keys of a config.json; the standard ones (hidden_size, num_attention_heads, head_dim,
    q_lora_rank, qk_rope_head_dim, sliding_window, num_hidden_layers) are ModelConfig's."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    compress_ratios: Annotated[tuple[NonNegInt, ...], Field(strict=False, min_length=1)]
    o_lora_rank: PosInt
    o_groups: PosInt
    index_n_heads: PosInt | None = None  # required where a layer is CSA (ratio 4): its indexer
    index_head_dim: PosInt | None = None
    index_topk: PosInt | None = None
    hc_mult: PosInt
    hc_sinkhorn_iters: PosInt
    max_position_embeddings: PosInt
    num_nextn_predict_layers: NonNegInt | None = None  # MTP layers: compress_ratios has an entry for each


class Dsv4Attention(NamedTuple):
    """A DeepSeek-V4 model's attention and mHC dimensions: what its dsv4_* and mhc cases are built from."""

    architecture: str
    hidden_size: int
    num_heads: int  # num_attention_heads, all ranks
    q_lora_rank: int
    o_lora_rank: int
    o_groups: int
    head_dim: int
    rope_head_dim: int
    sliding_window: int
    ratios: tuple[int, ...]  # the distinct compress_ratios, ascending
    index_n_heads: int  # 0 without CSA layers
    index_head_dim: int
    index_topk: int
    hc_mult: int
    hc_sinkhorn_iters: int
    max_position_embeddings: int

    @property
    def has_csa(self) -> bool:
        return CSA in self.ratios

    @property
    def has_hca(self) -> bool:
        """HCA layers, or sliding-window-only ones: vLLM and SGLang build an SWA-only layer with the HCA module's
        window (no compressor), and the consumer bills it as HCA (sdk/models/deepseek_v4.py:121-128)."""
        return HCA in self.ratios or SWA in self.ratios


def split_keys(architecture: str, data: Mapping[str, object]) -> tuple[dict[str, object] | None, dict[str, object]]:
    """(the DeepSeek-V4 keys, the rest) of a config's keys; (None, all of them) for another architecture."""
    if architecture not in ARCHITECTURES:
        return None, dict(data)
    own = {key: data[key] for key in KEYS if data.get(key) is not None}
    return own, {key: value for key, value in data.items() if key not in KEYS}


def pick_keys(architecture: str, raw: Mapping[str, object]) -> dict[str, object]:
    """The DeepSeek-V4 keys of a config.json (none for another architecture)."""
    own, _ = split_keys(architecture, raw)
    return own or {}


def attention_of(source: str, architecture: str, keys: Mapping[str, object], config) -> Dsv4Attention:
    """The model's DeepSeek-V4 dimensions from its own keys and its standard ones (``config``: a ModelConfig);
    InputError naming the source, the field, its value and the fix for a config no framework could build."""
    try:
        own = Dsv4Config.model_validate(dict(keys))
    except ValidationError as exc:
        raise InputError(describe_validation_error(source, exc)) from None

    def refuse(field: str, value: object, why: str, fix: str) -> InputError:
        return InputError(f"{source}: field {field!r}: {value!r} {why}; {fix}")

    def required(field: str, value):
        if value is None:
            raise InputError(f"{source}: missing key {field!r} required for {architecture}; add it to the config")
        return value

    bad = sorted({ratio for ratio in own.compress_ratios if ratio not in RATIOS})
    if bad:
        layer = own.compress_ratios.index(bad[0])
        raise refuse(
            "compress_ratios",
            bad[0],
            f"at layer {layer} is no DeepSeek-V4 compression",
            "use 0 (sliding window only), 4 (CSA) or 128 (HCA)",
        )
    layers = config.num_hidden_layers
    if layers is not None and len(own.compress_ratios) < layers:
        raise refuse(
            "compress_ratios",
            f"{len(own.compress_ratios)} entries",
            f"cover fewer than num_hidden_layers {layers}",
            "give one ratio per layer (and one per MTP layer)",
        )
    head_dim = required("head_dim", config.head_dim)
    rope = required("qk_rope_head_dim", config.qk_rope_head_dim)
    if rope >= head_dim:
        raise refuse("qk_rope_head_dim", rope, f"is not below head_dim {head_dim}", "rotate a part of the head only")
    heads = config.num_attention_heads
    if heads % own.o_groups:
        raise refuse("o_groups", own.o_groups, f"does not divide num_attention_heads {heads}", "give a divisor")
    kv_heads = config.num_key_value_heads
    if kv_heads not in (None, 1):
        raise refuse(
            "num_key_value_heads", kv_heads, "is not 1: DeepSeek-V4 attends through one latent KV head", "set 1"
        )
    csa = CSA in own.compress_ratios
    if csa:  # the CSA layers' indexer scores the compressed KV
        for key in ("index_n_heads", "index_head_dim", "index_topk"):
            required(key, getattr(own, key))
    return Dsv4Attention(
        architecture=architecture,
        hidden_size=config.hidden_size,
        num_heads=heads,
        q_lora_rank=required("q_lora_rank", config.q_lora_rank),
        o_lora_rank=own.o_lora_rank,
        o_groups=own.o_groups,
        head_dim=head_dim,
        rope_head_dim=rope,
        sliding_window=required("sliding_window", config.sliding_window),
        ratios=tuple(sorted(set(own.compress_ratios))),
        index_n_heads=(own.index_n_heads or 0) if csa else 0,
        index_head_dim=(own.index_head_dim or 0) if csa else 0,
        index_topk=(own.index_topk or 0) if csa else 0,
        hc_mult=own.hc_mult,
        hc_sinkhorn_iters=own.hc_sinkhorn_iters,
        max_position_embeddings=own.max_position_embeddings,
    )


def shapes_of(attention: object) -> frozenset[Dsv4Attention]:
    """ModelShapes.dsv4 of a model: its DeepSeek-V4 dimensions, or nothing for another attention."""
    return frozenset({attention}) if isinstance(attention, Dsv4Attention) else frozenset()
