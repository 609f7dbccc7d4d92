"""Typed grids of the DeepSeek-V4 attention ops (cases/base_ops/dsv4_*.yaml) and of the mHC op (mhc.yaml).

The models, their heads and dimensions come from the DeepSeek-V4 profiles and --model configs (cases/dsv4.py);
a grid holds what the framework collectors sweep. The frameworks bound their sweeps differently (vLLM by fixed
token budgets, SGLang by its chunked-prefill size and KV pool) and label the same fp8 KV cache differently (vLLM
``fp8``, SGLang ``fp8_e4m3``), so a grid is a list of sweeps, each with the labels it is timed under and its own
bounds; plans/skips.py keeps each framework to its labels.

grids.py registers these types in GRID_TYPES when it is imported (its last lines import this module).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from opcollect.cases import grids as _grids
from opcollect.cases.grids import Distinct, Frozen, NonNegInt, PosInt, _ascending_unique

# float32 and bfloat16: the CPU's grids for the torch backend; fp8 (vLLM) and fp8_e4m3 (SGLang) name one e4m3 cache
Dsv4Dtype = Literal["float32", "bfloat16", "fp8", "fp8_e4m3"]
Dsv4Gemm = Literal["float32", "bfloat16", "fp8_block"]
ScoreMode = Literal["flat", "top_last"]  # the top-k calibration's score patterns (plans/dsv4_sparse.py)
MhcOp = Literal["pre", "post"]


class Dsv4Precision(Frozen):
    mla_dtype: Dsv4Dtype
    kv_cache_dtype: Dsv4Dtype


class LadderRung(Frozen):
    """Decode shapes with step >= min_step take at most max_batch sequences."""

    min_step: PosInt
    max_batch: PosInt


class ContextShapes(Frozen):
    """isl new tokens per sequence after a cached prefix of ``step`` tokens, for each batch_size; a bound left
    out does not apply. The model's max_position_embeddings always bounds step + isl."""

    batch_size: list[PosInt] = Field(min_length=1)
    isl: list[PosInt] = Field(min_length=1)
    step: list[NonNegInt] = Field(min_length=1, description="cached prefixes")
    fill_to: PosInt | None = Field(None, description="also the prefix fill_to - isl (a sequence that ends there)")
    max_seq_len: PosInt | None = Field(None, description="step + isl stays at or below")
    max_query_tokens: PosInt | None = Field(None, description="batch_size x isl stays at or below")
    max_kv_tokens: PosInt | None = Field(None, description="batch_size x (step + isl) stays at or below")
    max_prefix_tokens: PosInt | None = Field(None, description="batch_size x step stays at or below")

    @model_validator(mode="after")
    def _sorted(self) -> ContextShapes:
        for axis in ("batch_size", "isl", "step"):
            _ascending_unique(axis, getattr(self, axis))
        return self


class DecodeShapes(Frozen):
    """One new token per sequence after ``step`` cached ones (isl 1), for each batch_size; the model's
    max_position_embeddings always bounds step + 1."""

    batch_size: list[PosInt] = Field(min_length=1)
    step: list[PosInt] = Field(min_length=1)
    max_step: PosInt | None = Field(None, description="step stays at or below")
    max_kv_tokens: PosInt | None = Field(None, description="batch_size x step stays at or below")
    batch_ladder: list[LadderRung] = []

    @model_validator(mode="after")
    def _sorted(self) -> DecodeShapes:
        for axis in ("batch_size", "step"):
            _ascending_unique(axis, getattr(self, axis))
        return self


class Dsv4Sweep(Frozen):
    """One framework collector's sweep: the labels its rows carry, the TP sizes, and its shapes."""

    precisions: Annotated[list[Dsv4Precision], Distinct] = Field(min_length=1)
    gemm_types: Annotated[list[Dsv4Gemm], Distinct] = Field(min_length=1)
    tp_sizes: list[PosInt] = Field(min_length=1)
    context: ContextShapes | None = None
    decode: DecodeShapes | None = None

    @model_validator(mode="after")
    def _some_shapes(self) -> Dsv4Sweep:
        _ascending_unique("tp_sizes", self.tp_sizes)
        if self.context is None and self.decode is None:
            raise ValueError("a sweep needs context or decode shapes")
        return self


class Dsv4Grid(Frozen):
    sweeps: list[Dsv4Sweep] = Field(min_length=1)
    models: Annotated[list[str], Distinct] | None = Field(
        None, min_length=1, description="only these DeepSeek-V4 models; default: every profile and --model config"
    )


def _only(grid: Dsv4Grid, wanted: str) -> None:
    other = "decode" if wanted == "context" else "context"
    for i, sweep in enumerate(grid.sweeps):
        if getattr(sweep, wanted) is None or getattr(sweep, other) is not None:
            raise ValueError(f"sweeps.{i}: this op's sweeps have {wanted} shapes only")


class Dsv4ContextGrid(Dsv4Grid):
    """A whole attention module in prefill (dsv4_{csa,hca}_context_module): context shapes only."""

    @model_validator(mode="after")
    def _context_only(self) -> Dsv4ContextGrid:
        _only(self, "context")
        return self


class Dsv4GenerationGrid(Dsv4Grid):
    """A whole attention module in decode (dsv4_{csa,hca}_generation_module): decode shapes only."""

    @model_validator(mode="after")
    def _decode_only(self) -> Dsv4GenerationGrid:
        _only(self, "decode")
        return self


class Dsv4KernelGrid(Dsv4Grid):
    """One kernel of the module (dsv4_paged_mqa_logits_module, dsv4_hca_attn_module): the union of a sweep's
    context and decode shapes; num_heads is the model's, local_num_heads the rank's."""


class Dsv4TopkGrid(Dsv4Grid):
    """The indexer's top-k calibration (dsv4_csa_topk_calib): each score mode at every shape, the prefill top-k
    for context shapes and the decode one for decode shapes."""

    score_modes: Annotated[list[ScoreMode], Distinct] = Field(min_length=1)


class MhcGrid(Frozen):
    """The mHC mixing around num_sites blocks (attention and FFN), for each DeepSeek-V4 model's hidden_size,
    hc_mult and hc_sinkhorn_iters, at every num_tokens."""

    op_names: Annotated[list[MhcOp], Distinct] = Field(min_length=1)
    num_tokens: list[PosInt] = Field(min_length=1)
    num_sites: PosInt
    models: Annotated[list[str], Distinct] | None = Field(
        None, min_length=1, description="only these DeepSeek-V4 models; default: every profile and --model config"
    )

    @model_validator(mode="after")
    def _sorted(self) -> MhcGrid:
        _ascending_unique("num_tokens", self.num_tokens)
        return self


DSV4_GRID_TYPES: dict[str, type[Frozen]] = {
    "dsv4_csa_context_module": Dsv4ContextGrid,
    "dsv4_csa_generation_module": Dsv4GenerationGrid,
    "dsv4_hca_context_module": Dsv4ContextGrid,
    "dsv4_hca_generation_module": Dsv4GenerationGrid,
    "dsv4_paged_mqa_logits_module": Dsv4KernelGrid,
    "dsv4_hca_attn_module": Dsv4KernelGrid,
    "dsv4_csa_topk_calib": Dsv4TopkGrid,
    "mhc": MhcGrid,
}
_grids.GRID_TYPES.update(DSV4_GRID_TYPES)
