"""Typed grids of the linear-attention tables (cases/base_ops/gdn.yaml, mamba2.yaml).

The reference collector times one shape list for every framework (collector/case_generator.py:1901-1990 Mamba2,
:2055-2145 GDN; each framework's get_gdn_test_cases forwards to it): the models in file order, each shape once, the
first model that brings it naming it (model_name). A model is named by its profile (cases/models) or a --model
config, whose linear-attention keys (cases/linear.py) give the shape, or by the shape itself where no profile holds
the model (the collector's smaller Qwen3.5 checkpoints, its synthetic Mamba2 shapes). ``more_models`` adds every
other model of this kind the plan reads, under its own name.

grids.py registers these types in GRID_TYPES when it is imported.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from opcollect.cases import grids as _grids
from opcollect.cases.grids import Frozen, PosInt


class GdnShape(Frozen):
    """One GDN layer's geometry: d_model (hidden_size), d_conv taps, the model's key and value heads."""

    d_model: PosInt
    d_conv: PosInt
    num_k_heads: PosInt
    head_k_dim: PosInt
    num_v_heads: PosInt
    head_v_dim: PosInt


class Mamba2Shape(Frozen):
    """One Mamba2 layer's geometry, its heads whole (mamba2_perf has no TP split)."""

    d_model: PosInt
    d_state: PosInt
    d_conv: PosInt
    nheads: PosInt
    head_dim: PosInt
    n_groups: PosInt
    chunk_size: PosInt


class _Model(Frozen):
    model: str = Field(min_length=1, description="the model_name column, as the reference names it")
    profile: str | None = Field(None, min_length=1, description="the profile (cases/models) or --model config")
    shape: GdnShape | Mamba2Shape | None = Field(None, description="the layer's geometry, where no profile has it")

    @model_validator(mode="after")
    def _profile_or_shape(self) -> _Model:
        if (self.profile is None) == (self.shape is None):
            raise ValueError(f"model {self.model!r}: give its profile or its shape, one of the two")
        return self


class GdnModel(_Model):
    shape: GdnShape | None = None
    tp_sizes: list[PosInt] = Field(min_length=1, description="each splits both head counts (the collector's list)")


class Mamba2Model(_Model):
    shape: Mamba2Shape | None = None


class _Phases(Frozen):
    """Context rows: every batch_size x seq_len of the two lists; generation rows: one token per request."""

    context_batch_size: list[PosInt] = Field(min_length=1)
    context_seq_len: list[PosInt] = Field(min_length=1)
    generation_batch_size: list[PosInt] = Field(min_length=1)
    more_models: bool = Field(False, description="also every other model of this kind the plan reads")

    @model_validator(mode="after")
    def _lists_ascending(self) -> _Phases:
        for axis in ("context_batch_size", "context_seq_len", "generation_batch_size"):
            _grids._ascending_unique(axis, getattr(self, axis))
        return self


class GdnGrid(_Phases):
    models: list[GdnModel] = Field(min_length=1)
    model_tp_sizes: list[PosInt] = Field(min_length=1, description="more_models' TP sizes, where they split")


class Mamba2Grid(_Phases):
    models: list[Mamba2Model] = Field(min_length=1)


LINEAR_GRID_TYPES: dict[str, type[Frozen]] = {"gdn": GdnGrid, "mamba2": Mamba2Grid}
_grids.GRID_TYPES.update(LINEAR_GRID_TYPES)
