"""A multimodal model's vision tower, as far as its attention shapes go: the ``vision_config`` of a config.json.

A vision-language config (Qwen3-VL, Gemma 3, ...) nests its language model under ``text_config`` and its vision
encoder under ``vision_config``. The encoder's attention is full (non-causal) MHA over the image's patch tokens:
``num_heads`` heads (Qwen-VL's key; SigLIP and CLIP call it ``num_attention_heads``) of ``head_dim`` (the key
when given, else hidden_size / heads), split over tensor-parallel ranks as the language model's heads are.
"""

from __future__ import annotations

from typing import Annotated, Mapping, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from opcollect.errors import InputError
from opcollect.runtime.planfile import MAX_DIM

PosInt = Annotated[int, Field(strict=True, gt=0, le=MAX_DIM)]


class VisionConfig(BaseModel):
    """The vision_config keys the encoder's attention shapes come from; its other keys are not read."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    hidden_size: PosInt
    num_heads: PosInt | None = None
    num_attention_heads: PosInt | None = None
    head_dim: PosInt | None = None

    @model_validator(mode="after")
    def _heads_once(self) -> VisionConfig:
        if (self.num_heads is None) == (self.num_attention_heads is None):
            raise ValueError("give the vision tower's heads as num_heads or as num_attention_heads, once")
        return self


KEYS = tuple(VisionConfig.model_fields)
HEAD_KEYS = ("num_heads", "num_attention_heads")


class Vision(NamedTuple):
    heads: int  # the whole tower's; a rank holds heads / tp
    head_dim: int


class EncoderShape(NamedTuple):
    num_heads: int  # per rank
    head_dim: int


def vision_keys(raw: Mapping[str, object]) -> dict[str, object] | None:
    """The keys of a config.json's vision_config that VisionConfig reads, or None when it has no hidden_size or
    no head count (a tower described by other keys, e.g. Kimi-K2.5's vt_*): then only the language model plans."""
    picked = {key: raw[key] for key in KEYS if raw.get(key) is not None}
    if "hidden_size" not in picked or not any(key in picked for key in HEAD_KEYS):
        return None
    if all(key in picked for key in HEAD_KEYS):
        picked.pop("num_attention_heads")  # Qwen-VL's num_heads is the one its modeling code reads
    return picked


def vision_layout(source: str, config: VisionConfig | None) -> Vision | None:
    """The tower's heads and head_dim; a hidden_size the heads do not divide needs an explicit head_dim."""
    if config is None:
        return None
    heads = config.num_heads or config.num_attention_heads or 0  # VisionConfig holds exactly one of the two
    if config.head_dim is not None:
        return Vision(heads, config.head_dim)
    if config.hidden_size % heads:
        raise InputError(
            f"{source}: vision_config hidden_size {config.hidden_size} is not a multiple of its {heads} heads; "
            "add vision_config.head_dim"
        )
    return Vision(heads, config.hidden_size // heads)
