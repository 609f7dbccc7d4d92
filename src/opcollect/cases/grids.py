"""Typed models of cases/base_ops/*.yaml: one sweep grid per op family, with narrowed grids per SM.

Every file has ``schema_version``, ``op``, a ``grid`` used on GPUs and ``narrowed``: whole grids that
replace it on the named SMs (``cpu`` keeps its grids small enough for one core). ``by_sm`` lists what
the frameworks run on some SMs beyond the grid: each entry names its SMs, says why, and gives values
appended to list fields of the grid there (a dtype, a precision, a projection type). An SM with
additions gets the grid plus them as its narrowed grid, so every other SM plans exactly the grid.
"""

from __future__ import annotations

from copy import deepcopy
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from opcollect.names import SMS

PosInt = Annotated[int, Field(strict=True, gt=0)]
NonNegInt = Annotated[int, Field(strict=True, ge=0)]
SM = Literal[SMS]  # one of names.SMS
GemmDtype = Literal["float32", "bfloat16", "fp8", "fp8_block", "nvfp4", "int4_wo"]
ActDtype = Literal["float32", "bfloat16", "fp8"]
KvDtype = Literal["float32", "bfloat16", "fp8"]
# w4a16_mxfp4: MXFP4 expert weights with bf16 activations; w4a8_mxfp4_mxfp8: MXFP4 weights with MXFP8 activations
MoeDtype = Literal["float32", "bfloat16", "fp8", "fp8_block", "nvfp4", "int4_wo", "w4a16_mxfp4", "w4a8_mxfp4_mxfp8"]
CommDtype = Literal["half", "int8", "fp8"]  # nccl_dtype: the consumer knows no other
Collective = Literal["all_reduce", "all_gather", "reduce_scatter", "alltoall"]  # nccl_perf's op_name
AllreduceDtype = Literal["bfloat16", "half"]
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


class ModelHeads(Frozen):
    """One attention layer type of a model without a profile: its per-rank heads at each TP size.

    Per rank: num_heads / tp query heads (a tp that does not divide them is left out) and
    ceil(kv_heads / tp) kv heads (kv heads are replicated once there are more ranks than kv heads).
    """

    model: str = Field(min_length=1)
    num_heads: PosInt
    kv_heads: PosInt
    head_dim: PosInt
    window_size: list[NonNegInt] = Field([0], min_length=1)
    tp_sizes: list[PosInt] = Field(min_length=1)

    @model_validator(mode="after")
    def _kv_divides(self) -> ModelHeads:
        if self.kv_heads > self.num_heads or self.num_heads % self.kv_heads:
            raise ValueError(f"kv_heads {self.kv_heads} must divide num_heads {self.num_heads}")
        return self


class AttentionGrid(Frozen):
    precisions: Annotated[list[AttentionPrecision], Distinct] = Field(min_length=1)
    batch_size: list[PosInt] = Field(min_length=1)
    heads: list[HeadSweep] = Field(min_length=1, description="generic sweeps; their union is planned")
    model_heads: list[ModelHeads] = []
    max_tokens_mha: PosInt
    max_tokens_gqa: PosInt
    model_tp_sizes: list[PosInt] = Field(min_length=1)


class ContextAttentionGrid(AttentionGrid):
    isl: list[PosInt] = Field(min_length=1)
    max_batch_mha: PosInt | None = Field(None, description="largest batch_size planned for MHA heads")
    max_kv_elements: PosInt | None = Field(None, description="batch_size x isl x kv heads x head_dim x 2 stays below")


# Generation caps: batch b at s = step + 1 cached tokens is planned while b x s x scale <= the token cap, where
# scale is 1 (tokens), num_heads (heads) or num_heads x head_dim / 128 (head_elements).
CapRule = Literal["tokens", "heads", "head_elements"]


class GenerationAttentionGrid(AttentionGrid):
    step: list[PosInt] = Field(min_length=1, description="past KV length per sequence")
    cap_rules: Annotated[list[CapRule], Distinct] = Field(["tokens"], min_length=1, description="union of rules")
    min_batch_sizes_per_step: PosInt = Field(1, description="a step is planned only where this many batch sizes fit")
    drop_longest_step_from_batch: PosInt | None = Field(None, description="batches this large skip their longest step")


class MoeShapeEntry(Frozen):
    hidden_size: PosInt
    inter_size: PosInt
    topk: PosInt
    num_experts: PosInt
    dtypes: Annotated[list[MoeDtype], Distinct] | None = Field(
        None, min_length=1, description="the formats the model is served in; default: the grid's dtypes"
    )


class MoeGrid(Frozen):
    dtypes: Annotated[list[MoeDtype], Distinct] = Field(min_length=1, description="for shapes that name none")
    num_tokens: list[PosInt] = Field(min_length=1)
    distributions: Annotated[list[Distribution], Distinct] = Field(min_length=1)
    gpus: list[PosInt] = Field(min_length=1, description="moe_tp_size x moe_ep_size")
    max_tp_size: PosInt | None = Field(None, description="largest moe_tp_size; the rest of a split goes to experts")
    shapes: list[MoeShapeEntry] = []

    @model_validator(mode="after")
    def _shapes_once(self) -> MoeGrid:
        keys = [(s.hidden_size, s.inter_size, s.topk, s.num_experts) for s in self.shapes]
        for i, key in enumerate(keys):
            if key in keys[:i]:
                raise ValueError(f"shape {key} is listed twice; list each (hidden, inter, topk, experts) once")
        return self


class MlaPrecision(Frozen):
    mla_dtype: ActDtype
    kv_cache_dtype: KvDtype


class MlaGrid(Frozen):
    precisions: Annotated[list[MlaPrecision], Distinct] = Field(min_length=1)
    batch_size: list[PosInt] = Field(min_length=1)
    tp_size: list[PosInt] = Field(min_length=1)
    num_heads: list[PosInt] = Field(
        min_length=1, description="total heads; each per-rank count is labelled with the smallest tp_size giving it"
    )
    max_tokens: PosInt


class ContextMlaGrid(MlaGrid):
    isl: list[PosInt] = Field(min_length=1)


class GenerationMlaGrid(MlaGrid):
    step: list[PosInt] = Field(min_length=1)


class MlaModel(Frozen):
    model: str = Field(min_length=1)  # as the reference's model column names it
    architecture: str = Field(min_length=1)


class MlaModuleGrid(Frozen):
    """A framework's whole MLA module (projections, norms, rope, attention) at one rank, tp_size 1."""

    models: Annotated[list[MlaModel], Distinct] = Field(min_length=1)
    precisions: Annotated[list[MlaPrecision], Distinct] = Field(min_length=1)
    gemm_types: Annotated[list[GemmDtype], Distinct] = Field(min_length=1)
    num_heads: list[PosInt] = Field(min_length=1, description="heads on the rank")
    batch_size: list[PosInt] = Field(min_length=1)
    max_tokens: PosInt = Field(description="batch_size x isl (context) or batch_size x step (generation)")


class ContextMlaModuleGrid(MlaModuleGrid):
    isl: list[PosInt] = Field(min_length=1)


class GenerationMlaModuleGrid(MlaModuleGrid):
    step: list[PosInt] = Field(min_length=1)


QuantDtype = Literal["fp8"]  # quant_dtype: bf16 activations quantized to float8_e4m3fn, as the reference holds


class QuantizeGrid(Frozen):
    """FP8 activation quantization of x[m, k] (compute_scale, scale_matrix): every m with every k. Statically
    quantized FP8 models add the input width k of their linear layers at each of model_tp_sizes."""

    dtypes: Annotated[list[QuantDtype], Distinct] = Field(min_length=1)
    m: list[PosInt] = Field(min_length=1)
    k: list[PosInt] = Field(min_length=1)
    model_tp_sizes: list[PosInt] = Field(min_length=1)

    @model_validator(mode="after")
    def _sorted(self) -> QuantizeGrid:
        for axis in ("m", "k", "model_tp_sizes"):
            _ascending_unique(axis, getattr(self, axis))
        return self


BmmDtype = Literal["float32", "bfloat16", "fp8"]  # float32: the CPU's baseline for the torch backend
MlaBmmOp = Literal["mla_gen_pre", "mla_gen_post"]  # the absorb BMM before MLA decode, the W_UV BMM after it


class MlaBmmGrid(Frozen):
    """MLA generation's absorb BMMs per rank: each op_name's token counts with every head count on the rank. MLA
    models add num_attention_heads / tp for each of model_tp_sizes that divides them."""

    dtypes: Annotated[list[BmmDtype], Distinct] = Field(min_length=1)
    num_tokens: dict[MlaBmmOp, list[PosInt]] = Field(min_length=1, description="per op_name")
    num_heads: list[PosInt] = Field(min_length=1, description="heads on the rank")
    model_tp_sizes: list[PosInt] = Field(min_length=1)

    @model_validator(mode="after")
    def _sorted(self) -> MlaBmmGrid:
        for op_name, tokens in self.num_tokens.items():
            if not tokens:
                raise ValueError(f"num_tokens.{op_name} is empty")
            _ascending_unique(f"num_tokens.{op_name}", tokens)
        for axis in ("num_heads", "model_tp_sizes"):
            _ascending_unique(axis, getattr(self, axis))
        return self


GpuCount = Annotated[int, Field(strict=True, ge=2)]


class CommGrid(Frozen):
    op_names: Annotated[list[Collective], Distinct] = Field(min_length=1)
    dtypes: Annotated[list[CommDtype], Distinct] = Field(min_length=1)
    num_gpus: list[GpuCount] = Field(min_length=1)
    message_size: dict[CommDtype, list[PosInt]] = Field(description="per dtype: elements of it, not bytes")

    @model_validator(mode="after")
    def _sizes_per_dtype(self) -> CommGrid:
        if set(self.message_size) != set(self.dtypes):
            raise ValueError(
                f"message_size lists sizes for {sorted(self.message_size)}, dtypes are {sorted(self.dtypes)}; "
                "give one list of element counts per dtype"
            )
        _ascending_unique("num_gpus", self.num_gpus)
        for dtype, sizes in self.message_size.items():
            if not sizes:
                raise ValueError(f"message_size.{dtype} is empty")
            _ascending_unique(f"message_size.{dtype}", sizes)
        return self


class CustomAllreduceGrid(Frozen):
    dtypes: Annotated[list[AllreduceDtype], Distinct] = Field(min_length=1)
    num_gpus: list[GpuCount] = Field(min_length=1)
    message_size: list[PosInt] = Field(min_length=1, description="elements of the dtype, not bytes")

    @model_validator(mode="after")
    def _sorted(self) -> CustomAllreduceGrid:
        for axis in ("num_gpus", "message_size"):
            _ascending_unique(axis, getattr(self, axis))
        return self


EncoderDtype = Literal["float32", "bfloat16"]  # the vision towers run in the model dtype (the reference: bf16)


class EncoderHeadSweep(Frozen):
    """Generic vision-tower head configurations: every num_heads with every head_dim (MHA: kv heads = heads)."""

    num_heads: list[PosInt] = Field(min_length=1)
    head_dim: list[PosInt] = Field(min_length=1)


class EncoderModelHeads(Frozen):
    """One vision tower without a profile: num_heads / tp heads per rank at each TP size that divides them."""

    model: str = Field(min_length=1)
    num_heads: PosInt
    head_dim: PosInt
    tp_sizes: list[PosInt] = Field(min_length=1)


class EncoderAttentionGrid(Frozen):
    attn_dtypes: Annotated[list[EncoderDtype], Distinct] = Field(min_length=1)
    batch_size: list[PosInt] = Field(min_length=1)
    isl: list[PosInt] = Field(min_length=1)
    heads: list[EncoderHeadSweep] = Field(min_length=1, description="generic sweeps; their union is planned")
    model_heads: list[EncoderModelHeads] = []
    max_tokens: PosInt = Field(description="batch_size x isl stays at or below")
    max_head_elements: PosInt | None = Field(None, description="batch_size x isl x num_heads x head_dim stays below")
    model_tp_sizes: list[PosInt] = Field(min_length=1)

    @model_validator(mode="after")
    def _sorted(self) -> EncoderAttentionGrid:
        for axis in ("batch_size", "isl", "model_tp_sizes"):
            _ascending_unique(axis, getattr(self, axis))
        return self


G = TypeVar("G", bound=Frozen)


class SmAddition(Frozen):
    """Values the grid gains on ``sms``: what the frameworks can run there and not on every SM."""

    sms: Annotated[list[SM], Distinct] = Field(min_length=1)
    why: str = Field(min_length=1, description="the framework source that makes these cases exist there")
    add: dict[str, list[Any]] = Field(min_length=1, description="grid field -> values appended to it")


class OpFile(Frozen, Generic[G]):
    schema_version: Literal[1]
    op: str
    grid: G
    narrowed: dict[SM, G] = {}
    by_sm: list[SmAddition] = []

    @model_validator(mode="before")
    @classmethod
    def _fold_additions(cls, data: Any) -> Any:
        """Give each SM named in ``by_sm`` the grid plus its additions as a narrowed grid."""
        if not isinstance(data, dict) or not data.get("by_sm") or not isinstance(data.get("grid"), dict):
            return data
        entries = data["by_sm"]
        if not isinstance(entries, list):
            return data  # the field's own validation names the type error
        narrowed = dict(data.get("narrowed") or {})
        grown: dict[str, dict] = {}
        for index, entry in enumerate(entries):
            if not isinstance(entry, dict) or not isinstance(entry.get("add"), dict):
                continue
            for field, values in entry["add"].items():
                base = data["grid"].get(field)
                if not isinstance(base, list) or not isinstance(values, list):
                    raise ValueError(f"by_sm.{index}.add.{field}: the grid has no list field {field!r} to add to")
                for value in values:
                    if value in base:
                        raise ValueError(f"by_sm.{index}.add.{field}: {value!r} is in the grid already, on every SM")
            for sm in entry.get("sms") or []:
                if sm not in SMS:
                    continue  # the field's own validation names it
                if sm in narrowed:
                    raise ValueError(
                        f"by_sm.{index}: SM {sm} has a narrowed grid; add its values there instead of in by_sm"
                    )
                grid = grown.setdefault(str(sm), deepcopy(data["grid"]))
                for field, values in entry["add"].items():
                    for value in values:
                        if value in grid[field]:
                            raise ValueError(f"by_sm.{index}.add.{field}: {value!r} is added to SM {sm} twice")
                        grid[field].append(deepcopy(value))
        return {**data, "narrowed": {**narrowed, **grown}}

    def grid_for(self, sm: str) -> G:
        return self.narrowed.get(sm, self.grid)  # type: ignore[arg-type]

    def additions_for(self, sm: str) -> list[SmAddition]:
        """The ``by_sm`` entries that grow the grid on ``sm``."""
        return [entry for entry in self.by_sm if sm in entry.sms]


GRID_TYPES: dict[str, type[Frozen]] = {
    "gemm": GemmGrid,
    "attention_context": ContextAttentionGrid,
    "attention_generation": GenerationAttentionGrid,
    "moe": MoeGrid,
    "mla_context": ContextMlaGrid,
    "mla_generation": GenerationMlaGrid,
    "mla_context_module": ContextMlaModuleGrid,
    "mla_generation_module": GenerationMlaModuleGrid,
    "compute_scale": QuantizeGrid,
    "scale_matrix": QuantizeGrid,
    "mla_bmm": MlaBmmGrid,
    "encoder_attention": EncoderAttentionGrid,
    "comm": CommGrid,
    "custom_allreduce": CustomAllreduceGrid,
}

# the sparse-attention grids, the DeepSeek-V4 / mHC ones and the linear-attention ones register themselves in GRID_TYPES
from opcollect.cases import grids_dsv4, grids_linear, grids_sparse  # noqa: E402, F401
