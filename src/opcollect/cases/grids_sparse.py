"""Typed grids of the sparse-attention module tables (cases/base_ops/dsa_*.yaml, msa_*.yaml, glm5_*.yaml).

Each framework's collector sweeps these modules its own way (SGLang emulates tensor parallelism on whole models,
vLLM and TensorRT-LLM sweep a rank's head count directly), so a grid is a list of sweeps, each naming the backends
that plan it; a backend no sweep names has no such table (the grid file says why). Models are named by their
profile (cases/models) or --model config, whose sparse-attention keys (cases/sparse.py) set what the sweep reads:
heads, the checkpoint's projection format, max_position_embeddings, the indexer's layer frequency.

grids.py registers these types in GRID_TYPES when it is imported (the last line of either module to load).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from opcollect.cases import grids as _grids
from opcollect.cases.grids import Distinct, Frozen, GemmDtype, MlaPrecision, NonNegInt, PosInt
from opcollect.names import BACKENDS

Backend = Literal[BACKENDS]


class SparseModel(Frozen):
    model: str = Field(min_length=1, description="the model column, as the reference names it")
    profile: str = Field(min_length=1, description="the profile (cases/models) or --model config it is read from")


class LongCap(Frozen):
    """Sequences of at least ``from_length`` tokens run at most ``max_batch`` requests (the collector's cap)."""

    from_length: PosInt
    max_batch: PosInt


class ModuleSweep(Frozen):
    backends: Annotated[list[Backend], Distinct] = Field(min_length=1)
    models: Annotated[list[SparseModel], Distinct] = Field(min_length=1)
    # SGLang's indexer-skipping layers (op_name <op>_skip_indexer): models whose index_topk_freq > 1
    skip_indexer_models: Annotated[list[SparseModel], Distinct] = []
    more_models: bool = Field(
        False,
        description="also every other model of this attention the plan reads (a --model config): each under its "
        "own name, or, where heads are swept directly, each architecture the models do not have",
    )
    leaves_out: list[str] = Field([], description="profiles more_models does not add: a listed model stands for them")
    precisions: Annotated[list[MlaPrecision], Distinct] = Field(min_length=1)
    gemm_types: Annotated[list[GemmDtype], Distinct] | None = Field(
        None, min_length=1, description="None: each model's checkpoint format (cases/sparse.py Dsa.gemm_type)"
    )
    num_heads: list[PosInt] = Field(min_length=1, description="heads on the rank")
    tp_sizes: list[PosInt] | None = Field(
        None,
        min_length=1,
        description="None: every num_heads at tp_size 1; else num_attention_heads / tp at each tp dividing them, "
        "kept where it is one of num_heads",
    )
    batch_size: list[PosInt] = Field(min_length=1)
    max_tokens: PosInt
    long: LongCap | None = None

    @model_validator(mode="after")
    def _lists_ascending(self) -> ModuleSweep:
        for axis in ("batch_size", "num_heads"):
            _grids._ascending_unique(axis, getattr(self, axis))
        return self


class ContextSweep(ModuleSweep):
    """isl new tokens per request after ``step`` cached ones (the prefix): batch_size x isl <= max_tokens."""

    isl: list[PosInt] = Field(min_length=1)
    prefix: list[NonNegInt] = Field(min_length=1)
    prefix_ceilings: list[PosInt] = Field([], description="C - isl is a prefix too, for each C (a context ceiling)")
    max_kv_tokens: PosInt | None = Field(None, description="batch_size x (prefix + isl) stays at or below")


class GenerationSweep(ModuleSweep):
    """One new token per request over ``step`` tokens: batch_size x step (x (step + 1) with cap_counts_new_token)
    <= max_tokens."""

    step: list[PosInt] = Field(min_length=1)
    cap_counts_new_token: bool = False
    batch_one_steps: list[PosInt] = Field([], description="more steps planned at batch_size 1")
    step_ceilings: list[PosInt] = Field([], description="C - 1 is a batch_size 1 step too, for each C")


def _one_sweep_per_backend(sweeps: list) -> None:
    seen: dict[str, int] = {}
    for i, sweep in enumerate(sweeps):
        for backend in sweep.backends:
            if backend in seen:
                raise ValueError(f"backend {backend} is in sweeps {seen[backend]} and {i}; give each backend one sweep")
            seen[backend] = i


class ContextModuleGrid(Frozen):
    sweeps: list[ContextSweep] = Field(min_length=1)

    @model_validator(mode="after")
    def _backends_once(self) -> ContextModuleGrid:
        _one_sweep_per_backend(self.sweeps)
        return self


class GenerationModuleGrid(Frozen):
    sweeps: list[GenerationSweep] = Field(min_length=1)

    @model_validator(mode="after")
    def _backends_once(self) -> GenerationModuleGrid:
        _one_sweep_per_backend(self.sweeps)
        return self


LabelDtype = Literal["bfloat16", "fp8_e4m3"]  # the GLM-5 kernel tables' labels (fp8_e4m3: the reference's word)
ScoreMode = Literal["flat", "top_last"]


class KernelLabels(Frozen):
    """Constant key columns of a GLM-5 kernel table, as the reference labels them."""

    mla_dtype: LabelDtype
    kv_cache_dtype: LabelDtype
    gemm_type: Literal["bfloat16", "fp8_block"]


class KernelSweep(Frozen):
    """The shapes the module sweep hands one layer's sparse kernels: prefill (isl > 1 new tokens after a prefix)
    and decode (one token after step cached ones), at the model's own heads and tp_size 1."""

    backends: Annotated[list[Backend], Distinct] = Field(min_length=1)
    model: SparseModel
    labels: KernelLabels
    batch_size: list[PosInt] = Field(min_length=1)
    isl: list[PosInt] = Field(min_length=1)
    prefix: list[NonNegInt] = Field(min_length=1)
    prefix_ceilings: list[PosInt] = []
    max_tokens: PosInt = Field(description="prefill: batch_size x isl stays at or below")
    long: LongCap | None = None
    max_kv_tokens: PosInt = Field(description="prefill: batch_size x (prefix + isl) stays at or below")
    step: list[PosInt] = Field(min_length=1, description="decode: cached tokens")
    max_decode_tokens: PosInt = Field(description="decode: batch_size x step stays at or below")
    decode_long: LongCap | None = None
    step_ceilings: list[PosInt] = Field([], description="C - 1 is a batch_size 1 decode step too, for each C")
    score_modes: Annotated[list[ScoreMode], Distinct] = Field(
        [], description="the top-k kernel's score distributions; other kernels none"
    )


class KernelGrid(Frozen):
    sweeps: list[KernelSweep] = Field(min_length=1)

    @model_validator(mode="after")
    def _backends_once(self) -> KernelGrid:
        _one_sweep_per_backend(self.sweeps)
        return self


SPARSE_GRID_TYPES: dict[str, type[Frozen]] = {
    "dsa_context_module": ContextModuleGrid,
    "dsa_generation_module": GenerationModuleGrid,
    "msa_context_module": ContextModuleGrid,
    "msa_generation_module": GenerationModuleGrid,
    "glm5_mqa_logits_module": KernelGrid,
    "glm5_topk_module": KernelGrid,
    "glm5_dsa_attn_module": KernelGrid,
}
_grids.GRID_TYPES.update(SPARSE_GRID_TYPES)
