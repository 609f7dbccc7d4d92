"""Typed models of cases/base_ops/*.yaml: one sweep grid per op family, with narrowed grids per SM.

Every file has ``schema_version``, ``op``, a ``grid`` used on GPUs and ``narrowed``: whole grids that
replace it on the named SMs (``cpu`` keeps its grids small enough for one core).
"""

from __future__ import annotations

from typing import Annotated, Generic, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from opcollect.names import SMS

PosInt = Annotated[int, Field(strict=True, gt=0)]
NonNegInt = Annotated[int, Field(strict=True, ge=0)]
SM = Literal[SMS]  # one of names.SMS
GemmDtype = Literal["float32", "bfloat16", "fp8", "fp8_block", "nvfp4", "int4_wo"]
ActDtype = Literal["float32", "bfloat16", "fp8"]
KvDtype = Literal["float32", "bfloat16", "fp8"]
MoeDtype = Literal["float32", "bfloat16", "fp8", "fp8_block", "nvfp4"]
CommDtype = Literal["float32", "half", "bfloat16"]
Distribution = Literal["balanced", "power_law_1.01", "power_law_1.2"]


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def _distinct(values: list) -> list:
    for i, value in enumerate(values):
        if value in values[:i]:
            shown = value.model_dump() if isinstance(value, BaseModel) else value
            raise ValueError(f"{shown!r} is listed twice; list each value once")
    return values


Distinct = AfterValidator(_distinct)  # a list whose values each appear once: dtypes, precisions, distributions


def _ascending_unique(name: str, values: list[int]) -> None:
    if sorted(set(values)) != list(values):
        raise ValueError(f"{name} must be strictly ascending without repeats")


class NK(Frozen):
    n: PosInt
    k: PosInt


class GemmGrid(Frozen):
    dtypes: Annotated[list[GemmDtype], Distinct] = Field(min_length=1)
    m: list[PosInt] = Field(min_length=1)
    n: list[PosInt] = Field(min_length=1)
    k: list[PosInt] = Field(min_length=1)
    exclude_nk: list[NK] = []
    model_tp_sizes: list[PosInt] = Field(min_length=1)

    @model_validator(mode="after")
    def _sorted(self) -> GemmGrid:
        for axis in ("m", "n", "k", "model_tp_sizes"):
            _ascending_unique(axis, getattr(self, axis))
        return self


class AttentionPrecision(Frozen):
    attn_dtype: ActDtype
    kv_cache_dtype: KvDtype


class HeadSweep(Frozen):
    """Generic head configurations: every num_heads with each kv-head count that divides it."""

    num_heads: list[PosInt] = Field(min_length=1)
    kv_heads: list[NonNegInt] = Field(min_length=1, description="0 means as many as num_heads (MHA)")
    head_dim: list[PosInt] = Field(min_length=1)
    window_size: list[NonNegInt] = [0]


class AttentionGrid(Frozen):
    precisions: Annotated[list[AttentionPrecision], Distinct] = Field(min_length=1)
    batch_size: list[PosInt] = Field(min_length=1)
    heads: HeadSweep
    max_tokens_mha: PosInt
    max_tokens_gqa: PosInt
    model_tp_sizes: list[PosInt] = Field(min_length=1)


class ContextAttentionGrid(AttentionGrid):
    isl: list[PosInt] = Field(min_length=1)


class GenerationAttentionGrid(AttentionGrid):
    step: list[PosInt] = Field(min_length=1, description="past KV length per sequence")


class MoeShapeEntry(Frozen):
    hidden_size: PosInt
    inter_size: PosInt
    topk: PosInt
    num_experts: PosInt


class MoeGrid(Frozen):
    dtypes: Annotated[list[MoeDtype], Distinct] = Field(min_length=1)
    num_tokens: list[PosInt] = Field(min_length=1)
    distributions: Annotated[list[Distribution], Distinct] = Field(min_length=1)
    gpus: list[PosInt] = Field(min_length=1, description="moe_tp_size x moe_ep_size")
    shapes: list[MoeShapeEntry] = []


class MlaPrecision(Frozen):
    mla_dtype: ActDtype
    kv_cache_dtype: KvDtype


class MlaGrid(Frozen):
    precisions: Annotated[list[MlaPrecision], Distinct] = Field(min_length=1)
    batch_size: list[PosInt] = Field(min_length=1)
    tp_size: list[PosInt] = Field(min_length=1)
    num_heads: list[PosInt] = Field(min_length=1, description="total heads, split by tp_size")
    max_tokens: PosInt


class ContextMlaGrid(MlaGrid):
    isl: list[PosInt] = Field(min_length=1)


class GenerationMlaGrid(MlaGrid):
    step: list[PosInt] = Field(min_length=1)


class CommGrid(Frozen):
    dtypes: Annotated[list[CommDtype], Distinct] = Field(min_length=1)
    num_gpus: list[Annotated[int, Field(strict=True, ge=2)]] = Field(min_length=1)
    message_size: list[PosInt] = Field(min_length=1)


G = TypeVar("G", bound=Frozen)


class OpFile(Frozen, Generic[G]):
    schema_version: Literal[1]
    op: str
    grid: G
    narrowed: dict[SM, G] = {}

    def grid_for(self, sm: str) -> G:
        return self.narrowed.get(sm, self.grid)  # type: ignore[arg-type]


GRID_TYPES: dict[str, type[Frozen]] = {
    "gemm": GemmGrid,
    "attention_context": ContextAttentionGrid,
    "attention_generation": GenerationAttentionGrid,
    "moe": MoeGrid,
    "mla_context": ContextMlaGrid,
    "mla_generation": GenerationMlaGrid,
    "comm": CommGrid,
}
