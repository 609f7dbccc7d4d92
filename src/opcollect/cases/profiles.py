"""Model profiles (cases/models/<Architecture>.yaml) and Hugging Face config.json files.

Both describe a model with standard config.json keys. ``parse_config`` reads the keys into one layout
(attention, dense MLP, experts, vocabulary) whatever the architecture is called; a few families differ
only in defaults their config class fills in, or in how sliding-window layers are laid out (``FAMILIES``).
An architecture not listed there is planned from the same keys, with a note. ``derive_shapes`` turns a
layout into the per-rank shapes the sweeps must include, so a profile and a config.json of the same
model give the same shapes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Mapping, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from opcollect.cases import dsv4, linear, sparse
from opcollect.cases.quantization import QuantizeShape, quantize_shapes, static_fp8
from opcollect.cases.vision import EncoderShape, Vision, VisionConfig, vision_keys, vision_layout
from opcollect.errors import InputError
from opcollect.inputs import MIB, read_json
from opcollect.runtime.planfile import MAX_DIM
from opcollect.yamlio import describe_validation_error

# a size or count of a config.json: an int (strict: never a float or a bool) up to the bound a plan file holds
PosInt = Annotated[int, Field(strict=True, gt=0, le=MAX_DIM)]
NonNegInt = Annotated[int, Field(strict=True, ge=0, le=MAX_DIM)]


class ModelConfig(BaseModel):
    """The config.json keys shapes are derived from; a config.json's other keys are not read."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    hidden_size: PosInt
    num_attention_heads: PosInt
    num_key_value_heads: PosInt | None = None  # absent: one kv head per query head
    head_dim: PosInt | None = None  # absent: hidden_size / num_attention_heads
    intermediate_size: PosInt | None = None
    dense_intermediate_size: PosInt | None = None  # the dense layers' MLP width where it differs (MiniMax-M3)
    vocab_size: PosInt | None = None
    num_hidden_layers: PosInt | None = None
    # mixture of experts: the expert count goes by three names; 0 means a dense model
    num_experts: NonNegInt | None = None
    num_local_experts: NonNegInt | None = None
    n_routed_experts: NonNegInt | None = None
    num_experts_per_tok: NonNegInt | None = None
    moe_intermediate_size: PosInt | None = None
    n_shared_experts: NonNegInt | None = None  # shared experts of moe_intermediate_size each
    shared_expert_intermediate_size: NonNegInt | None = None  # one shared expert of this size
    first_k_dense_replace: NonNegInt | None = None  # the first k layers are dense
    # every k-th layer is MoE, or (MiniMax-M3) one 0/1 flag per layer, 1 for a MoE layer
    moe_layer_freq: int | tuple[int, ...] | None = None
    decoder_sparse_step: PosInt | None = None
    mlp_only_layers: Annotated[tuple[NonNegInt, ...], Field(strict=False)] | None = None
    # multi-head latent attention
    q_lora_rank: PosInt | None = None  # absent: q is projected from hidden directly
    kv_lora_rank: PosInt | None = None
    qk_nope_head_dim: PosInt | None = None
    qk_rope_head_dim: PosInt | None = None
    v_head_dim: PosInt | None = None
    # sliding-window attention
    sliding_window: PosInt | None = None
    use_sliding_window: bool | None = None
    max_window_layers: NonNegInt | None = None
    sliding_window_pattern: PosInt | None = None
    layer_types: Annotated[tuple[str, ...], Field(strict=False)] | None = None
    attn_output_gate: bool | None = None  # Qwen3.5 / Qwen3-Next: q_proj projects the query and its output gate
    # a multimodal model's vision tower: its encoder attention shapes (cases/vision.py)
    vision_config: VisionConfig | None = None

    @field_validator("moe_layer_freq", mode="before")
    @classmethod
    def _every_kth_or_one_flag_per_layer(cls, value: object) -> object:
        flags = isinstance(value, list) and value and all(type(v) is int and v in (0, 1) for v in value)
        if not (flags or (type(value) is int and 0 < value <= MAX_DIM)):
            raise ValueError("set it to a positive int (every k-th layer is MoE) or one 0/1 flag per layer")
        return tuple(value) if flags else value

    @field_validator("num_key_value_heads")
    @classmethod
    def _kv_heads_group_the_heads(cls, kv: int | None, info: ValidationInfo) -> int | None:
        heads = info.data.get("num_attention_heads")
        if kv is not None and heads is not None and kv > heads:
            raise ValueError(f"{kv} is greater than num_attention_heads {heads}; set it to a divisor of {heads}")
        if kv is not None and heads is not None and heads % kv:
            raise ValueError(f"{kv} does not divide num_attention_heads {heads}; set it to a divisor of {heads}")
        return kv


KEYS = tuple(ModelConfig.model_fields)


@dataclass(frozen=True)
class Family:
    """Where an architecture differs from the plain reading of its keys."""

    defaults: Mapping[str, object] = field(default_factory=dict)  # its config class's defaults for absent keys
    alternating_window: bool = False  # sliding and full layers alternate when layer_types is absent
    ffn: bool = True  # False: its MLP and expert keys mean other shapes than the standard reading's (not planned)
    # its MLP blocks (Nemotron-H's "-") are up_proj, relu2, down_proj: one intermediate_size wide, no gate
    ungated_mlp: bool = False


_PLAIN = Family()
_QWEN = Family(defaults={"use_sliding_window": False})  # sliding_window is set but unused unless enabled
_QWEN_GATED = Family(defaults={"use_sliding_window": False, "attn_output_gate": True})
_GEMMA3 = Family(defaults={"head_dim": 256, "sliding_window": 4096, "sliding_window_pattern": 6})

FAMILIES: dict[str, Family] = {
    "LlamaForCausalLM": _PLAIN,
    "MistralForCausalLM": _PLAIN,  # sliding_window, when set, applies to every layer
    "MixtralForCausalLM": _PLAIN,  # experts of intermediate_size
    "Phi3ForCausalLM": _PLAIN,  # fused qkv_proj and gate_up_proj: the same per-rank shapes
    "Qwen2ForCausalLM": _QWEN,
    "Qwen2MoeForCausalLM": _QWEN,  # one shared expert of shared_expert_intermediate_size
    "Qwen3ForCausalLM": _QWEN,
    "Qwen3MoeForCausalLM": _QWEN,
    "Gemma2ForCausalLM": Family(defaults={"head_dim": 256, "sliding_window": 4096}, alternating_window=True),
    "Gemma3ForCausalLM": _GEMMA3,
    "Gemma3ForConditionalGeneration": _GEMMA3,  # its language model's keys are under text_config
    "Qwen3VLForConditionalGeneration": _QWEN,  # text_config: Qwen3's keys; vision_config: the vision tower
    "Qwen3VLMoeForConditionalGeneration": _QWEN,
    "DeepseekV2ForCausalLM": _PLAIN,  # MLA; first_k_dense_replace dense layers, then routed + shared experts
    "DeepseekV3ForCausalLM": _PLAIN,
    "Glm4MoeForCausalLM": _PLAIN,  # GQA with head_dim; DeepSeek-style experts
    "GptOssForCausalLM": Family(alternating_window=True),
    "DeepseekV32ForCausalLM": _PLAIN,  # MLA with DSA's indexer keys (cases/sparse.py)
    "GlmMoeDsaForCausalLM": _PLAIN,
    "MiniMaxM3ForCausalLM": _PLAIN,  # GQA with MSA's sparse_attention_config (cases/sparse.py)
    "DeepseekV4ForCausalLM": _PLAIN,  # compressed sparse attention and mHC: its own keys (cases/dsv4.py)
    # Gated DeltaNet layers beside full attention (cases/linear.py); the language model's keys are under text_config
    # and attn_output_gate, True where absent (vLLM 0.24.0 model_executor/models/qwen3_next.py:244)
    "Qwen3_5ForConditionalGeneration": _QWEN_GATED,
    "Qwen3_5MoeForConditionalGeneration": _QWEN_GATED,
    "Qwen3NextForCausalLM": _QWEN_GATED,
    # Mamba2, attention, MLP and MoE blocks by hybrid_override_pattern (cases/linear.py). Its MLP blocks are up_proj,
    # relu2, down_proj without a gate, planned as such; Nemotron-3's experts run in moe_latent_size with a shared
    # expert of moe_shared_expert_intermediate_size (aiconfigurator-core sdk/models/nemotron_h.py:221-370): the
    # standard reading (hidden-wide experts) would plan other GEMMs, so its expert shapes are not planned
    "NemotronHForCausalLM": Family(ffn=False, ungated_mlp=True),
}


class GemmShape(NamedTuple):
    n: int
    k: int


class HeadShape(NamedTuple):
    num_heads: int
    num_key_value_heads: int
    head_dim: int
    window_size: int


class MoeShape(NamedTuple):
    hidden_size: int
    inter_size: int
    topk: int
    num_experts: int


class MlaShape(NamedTuple):
    num_heads: int  # total query heads; a case holds num_heads / tp_size per rank


class Gqa(NamedTuple):
    kv_heads: int
    head_dim: int
    windows: tuple[int, ...]  # 0 is full attention
    # attn_output_gate (Qwen3.5, Qwen3-Next): q_proj also projects a per-head output gate, twice the query width
    output_gate: bool = False


class Mla(NamedTuple):
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


class Mlp(NamedTuple):
    inter: int
    key: str  # the config key it comes from, for notes
    gated: bool = True  # gate_up projects to 2 x inter; ungated, up projects to inter


class Experts(NamedTuple):
    count: int
    topk: int
    mlp: Mlp  # one expert
    shared: Mlp | None


@dataclass(frozen=True)
class Layout:
    """What the shapes are derived from, read from the keys once."""

    hidden: int
    heads: int
    attention: Gqa | Mla | dsv4.Dsv4Attention
    dense: Mlp | None  # the MLP of dense layers, when the model has any
    experts: Experts | None
    vocab: int | None
    vision: Vision | None = None  # a multimodal model's vision tower


@dataclass(frozen=True)
class ModelSpec:
    name: str
    architecture: str
    config: ModelConfig
    source: str
    layout: Layout
    notes: tuple[str, ...] = ()  # what a plan reports about this model (e.g. an unknown architecture)
    static_fp8: str | None = None  # the quantization_config format of static FP8 activations (cases/quantization.py)
    sparse: sparse.Dsa | sparse.Msa | None = None  # DSA or MSA keys (cases/sparse.py)
    linear: linear.Gdn | linear.Mamba2 | None = None  # Gated DeltaNet or Mamba2 layers (cases/linear.py)


class LeftOut(NamedTuple):
    family: str  # the op family whose shapes are missing (gemm, attention)
    text: str


@dataclass(frozen=True)
class ModelShapes:
    gemm: frozenset[GemmShape]
    attention: frozenset[HeadShape]
    moe: frozenset[MoeShape]
    mla: frozenset[MlaShape]
    left_out: frozenset[LeftOut] = frozenset()  # shapes a TP size could not split, with the reason
    encoder: frozenset[EncoderShape] = frozenset()  # a vision tower's attention heads per rank
    quantize: frozenset[QuantizeShape] = frozenset()  # a static-FP8 model's linear-layer input widths per rank
    sparse: sparse.Dsa | sparse.Msa | None = None  # the model's sparse attention, at every TP size
    dsv4: frozenset[dsv4.Dsv4Attention] = frozenset()  # DeepSeek-V4's attention and mHC (cases/dsv4.py)
    linear: linear.Gdn | linear.Mamba2 | None = None  # the model's linear attention, at every TP size

    def notes_for(self, family: str) -> list[str]:
        return sorted(entry.text for entry in self.left_out if entry.family == family)


class _Collector:
    def __init__(self, name: str, hidden: int):
        self.name = name
        self.hidden = hidden
        self.gemm: set[GemmShape] = set()
        self.heads: set[HeadShape] = set()
        self.moe: set[MoeShape] = set()
        self.mla: set[MlaShape] = set()
        self.left_out: set[LeftOut] = set()
        self.encoder: set[EncoderShape] = set()

    def leave_out(self, tp: int, why: str, what: str, families: tuple[str, ...]) -> None:
        text = f"{self.name}: tp {tp} {why}; its {what} shapes at tp {tp} are left out"
        self.left_out.update(LeftOut(family, text) for family in families)

    def query_heads(self, heads: int, tp: int, what: str, families: tuple[str, ...]) -> int | None:
        if heads % tp:
            self.leave_out(tp, f"does not divide {heads} heads", what, families)
            return None
        return heads // tp

    def gqa(self, heads: int, attn: Gqa, tp: int) -> None:
        what, families = "attention and qkv/o GEMM", ("attention", "gemm")
        q = self.query_heads(heads, tp, what, families)
        if q is None:
            return
        # kv heads are split across ranks, or replicated when there are fewer kv heads than ranks
        if attn.kv_heads >= tp and attn.kv_heads % tp == 0:
            kv = attn.kv_heads // tp
        elif attn.kv_heads < tp and tp % attn.kv_heads == 0:
            kv = 1
        else:
            self.leave_out(tp, f"does not split {attn.kv_heads} kv heads evenly", what, families)
            return
        gated = 2 if attn.output_gate else 1  # the gate's half of q_proj (aiconfigurator-core sdk/models/qwen35.py:361)
        self.gemm.add(GemmShape((gated * q + 2 * kv) * attn.head_dim, self.hidden))  # qkv
        self.gemm.add(GemmShape(self.hidden, q * attn.head_dim))  # o
        for window in attn.windows:
            self.heads.add(HeadShape(q, kv, attn.head_dim, window))

    def mla_gemms(self, heads: int, attn: Mla, tp: int) -> None:
        q = self.query_heads(heads, tp, "MLA projection GEMM", ("gemm",))
        if q is None:
            return
        rope, nope, v = attn.qk_rope_head_dim, attn.qk_nope_head_dim, attn.v_head_dim
        if attn.q_lora_rank is None:
            self.gemm.add(GemmShape(q * (nope + rope), self.hidden))  # q
            self.gemm.add(GemmShape(attn.kv_lora_rank + rope, self.hidden))  # kv_a, replicated
        else:
            self.gemm.add(GemmShape(attn.q_lora_rank + attn.kv_lora_rank + rope, self.hidden))  # fused q_a/kv_a
            self.gemm.add(GemmShape(q * (nope + rope), attn.q_lora_rank))  # q_b
        self.gemm.add(GemmShape(q * (nope + v), attn.kv_lora_rank))  # kv_b
        self.gemm.add(GemmShape(self.hidden, q * v))  # o

    def mlp(self, mlp: Mlp, tp: int, what: str) -> None:
        if mlp.inter % tp:
            self.leave_out(tp, f"does not divide {mlp.key} {mlp.inter}", f"{what} gate_up/down GEMM", ("gemm",))
            return
        part = mlp.inter // tp
        self.gemm.add(GemmShape(2 * part if mlp.gated else part, self.hidden))  # gate_up, or up
        self.gemm.add(GemmShape(self.hidden, part))  # down


def derive_shapes(spec: ModelSpec, tp_sizes: list[int]) -> ModelShapes:
    """Per-rank shapes of one model at each tensor-parallel size in ``tp_sizes``."""
    lay = spec.layout
    out = _Collector(spec.name, lay.hidden)
    for tp in tp_sizes:
        if isinstance(lay.attention, Mla):
            out.mla_gemms(lay.heads, lay.attention, tp)
            out.mla.add(MlaShape(lay.heads))  # MLA cases split the total heads themselves
        elif not isinstance(lay.attention, dsv4.Dsv4Attention) and linear.has_attention(spec.linear):
            out.gqa(lay.heads, lay.attention, tp)  # DeepSeek-V4's are in its module tables; a hybrid's if it has any
        if spec.linear is not None:  # the linear-attention layers' projections (cases/linear.py)
            found = linear.rank_gemms(spec.linear, tp)
            if found.why is not None:
                out.leave_out(tp, found.why, found.what, found.families)
            out.gemm.update(GemmShape(n, k) for n, k in found.shapes)
        if lay.dense is not None:
            out.mlp(lay.dense, tp, "dense MLP")
        if lay.experts is not None:
            experts = lay.experts
            out.gemm.add(GemmShape(experts.count, lay.hidden))  # router
            out.mlp(experts.mlp, tp, "expert")  # routed expert weights under TP
            if experts.shared is not None:
                out.mlp(experts.shared, tp, "shared expert")
            out.moe.add(MoeShape(lay.hidden, experts.mlp.inter, experts.topk, experts.count))
        if lay.vision is not None:  # the vision tower's heads split over the ranks as the language model's do
            heads = out.query_heads(lay.vision.heads, tp, "vision-tower attention", ("encoder_attention",))
            if heads is not None:
                out.encoder.add(EncoderShape(heads, lay.vision.head_dim))
        if lay.vocab is not None:
            # lm_head: vocabulary rows split across ranks; an uneven split pads each rank to ceil(vocab / tp)
            out.gemm.add(GemmShape(-(-lay.vocab // tp), lay.hidden))
    return ModelShapes(
        frozenset(out.gemm),
        frozenset(out.heads),
        frozenset(out.moe),
        frozenset(out.mla),
        frozenset(out.left_out),
        encoder=frozenset(out.encoder),
        # every linear layer's input width k on a rank: what its fp8 activations are quantized at
        quantize=quantize_shapes(spec.static_fp8, {shape.k for shape in out.gemm}),
        sparse=spec.sparse,
        dsv4=dsv4.shapes_of(lay.attention),
        linear=spec.linear,
    )


def _known() -> str:
    return ", ".join(sorted(FAMILIES))


def _windows(cfg: ModelConfig, family: Family, missing, name: str, notes: list[str]) -> tuple[int, ...]:
    """The attention windows the model's layers use: 0 for full attention, else the window in tokens."""
    window = cfg.sliding_window
    if cfg.layer_types is not None:
        kinds = set(cfg.layer_types)
        other = sorted(kinds - {"full_attention", "sliding_attention", "linear_attention"})  # GDN: cases/linear.py
        if other:
            notes.append(
                f"{name}: layer_types {', '.join(other)} are not planned; "
                "its full_attention and sliding_attention layers are"
            )
        if "sliding_attention" in kinds and window is None:
            raise missing("sliding_window", " (layer_types lists sliding_attention layers)")
        found = ({0} if "full_attention" in kinds else set()) | ({window} if "sliding_attention" in kinds else set())
        return tuple(sorted(found))
    if window is None or cfg.use_sliding_window is False:
        return (0,)
    if cfg.use_sliding_window and cfg.max_window_layers is not None and cfg.num_hidden_layers is not None:
        # Qwen2 style: layers from max_window_layers on use the window, the ones before attend fully
        full = {0} if cfg.max_window_layers > 0 else set()
        return tuple(sorted(full | ({window} if cfg.max_window_layers < cfg.num_hidden_layers else set())))
    if cfg.sliding_window_pattern is not None:
        # every pattern-th layer attends fully, the others slide (Gemma 3); a pattern of 1 slides nowhere
        return (0, window) if cfg.sliding_window_pattern > 1 else (0,)
    if family.alternating_window:
        return (0, window)
    return (window,)  # every layer slides (Mistral)


def _layout(source: str, arch: str, name: str, cfg: ModelConfig, family: Family, notes: list[str]) -> Layout:
    def missing(key: str, why: str = "") -> InputError:
        return InputError(f"{source}: missing key {key!r} required for {arch}{why}; add it to the config")

    hidden, heads = cfg.hidden_size, cfg.num_attention_heads
    attention: Gqa | Mla
    if cfg.kv_lora_rank is not None:
        for key in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if getattr(cfg, key) is None:
                raise missing(key, " (multi-head latent attention: kv_lora_rank is set)")
        attention = Mla(cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim)
    else:
        head_dim = cfg.head_dim
        if head_dim is None:
            if hidden % heads:
                raise missing("head_dim", f" (hidden_size {hidden} is not a multiple of num_attention_heads {heads})")
            head_dim = hidden // heads
        windows = _windows(cfg, family, missing, name, notes)
        attention = Gqa(cfg.num_key_value_heads or heads, head_dim, windows, bool(cfg.attn_output_gate))

    if not family.ffn:
        return Layout(hidden, heads, attention, None, None, cfg.vocab_size, vision_layout(source, cfg.vision_config))
    count_key = next((k for k in ("num_experts", "num_local_experts", "n_routed_experts") if getattr(cfg, k)), None)
    experts = None
    dense_why = ""
    if count_key is not None:
        count = getattr(cfg, count_key)
        topk = cfg.num_experts_per_tok
        if topk is None:
            raise missing("num_experts_per_tok", f" ({count_key} is {count})")
        if topk == 0:
            raise InputError(
                f"{source}: field 'num_experts_per_tok': 0 routes a token to no expert, but {count_key} is "
                f"{count}; set it to the experts per token (1 to {count})"
            )
        if topk > count:
            raise InputError(
                f"{source}: field 'num_experts_per_tok': {topk} is greater than {count_key} {count}; "
                f"set it to at most {count}"
            )
        if cfg.moe_intermediate_size is not None:
            expert = Mlp(cfg.moe_intermediate_size, "moe_intermediate_size")
        elif cfg.intermediate_size is not None:
            expert = Mlp(cfg.intermediate_size, "intermediate_size")  # Mixtral, gpt-oss
        else:
            raise missing("moe_intermediate_size", f" ({count_key} is {count})")
        shared = None
        if cfg.shared_expert_intermediate_size:
            shared = Mlp(cfg.shared_expert_intermediate_size, "shared_expert_intermediate_size")
        elif cfg.n_shared_experts:
            # DeepSeek style: the shared experts run as one MLP n_shared_experts times an expert wide
            shared = Mlp(cfg.n_shared_experts * expert.inter, f"n_shared_experts x {expert.key}")
        experts = Experts(count, topk, expert, shared)
        if cfg.first_k_dense_replace:
            dense_why = f" (the first {cfg.first_k_dense_replace} layers are dense)"
        elif cfg.mlp_only_layers:
            dense_why = " (mlp_only_layers are dense)"
        elif isinstance(cfg.moe_layer_freq, tuple):
            if 0 in cfg.moe_layer_freq:
                dense_why = " (moe_layer_freq marks some layers dense)"
        elif (cfg.decoder_sparse_step or 1) > 1 or (cfg.moe_layer_freq or 1) > 1:
            dense_why = " (some layers are dense)"
    dense = None
    if experts is None or dense_why:
        if cfg.dense_intermediate_size is not None:
            dense = Mlp(cfg.dense_intermediate_size, "dense_intermediate_size")
        elif cfg.intermediate_size is None:
            raise missing("intermediate_size", dense_why)
        else:
            dense = Mlp(cfg.intermediate_size, "intermediate_size")
    return Layout(hidden, heads, attention, dense, experts, cfg.vocab_size, vision_layout(source, cfg.vision_config))


def parse_config(
    source: str, architecture: str, name: str, data: Mapping[str, object], notes: tuple[str, ...] = ()
) -> ModelSpec:
    """One model from its config.json keys: a profile entry, or the keys read from a config.json."""
    family = FAMILIES.get(architecture)
    found = list(notes)
    if family is None:
        for key in ("hidden_size", "num_attention_heads"):
            if key not in data:
                raise InputError(
                    f"{source}: unknown architecture {architecture!r} and no key {key!r}: it cannot be planned "
                    f"from standard config.json keys; known architectures: {_known()}"
                )
        family = _PLAIN
        found.append(f"{name}: unknown architecture {architecture}, planned from its standard config.json keys")
    for key in ("hidden_size", "num_attention_heads"):
        if key not in data:
            raise InputError(f"{source}: missing key {key!r} required for {architecture}; add it to the config")
    quantization = data.get("quantization_config")  # read by cases/quantization.py, not a ModelConfig key
    own, data = dsv4.split_keys(architecture, data)  # DeepSeek-V4's keys (cases/dsv4.py), DSA's index_* alike
    raw = data
    data = {
        key: value
        for key, value in data.items()
        if key != "quantization_config" and key not in sparse.KEYS and key not in linear.KEYS
    }
    try:
        config = ModelConfig.model_validate({**family.defaults, **data})
    except ValidationError as exc:
        raise InputError(describe_validation_error(source, exc)) from None
    layout = _layout(source, architecture, name, config, family, found)
    if own is not None:
        layout = replace(layout, attention=dsv4.attention_of(source, architecture, own, config))
    kv_heads = config.num_key_value_heads
    mla = config.kv_lora_rank is not None
    attention = sparse.sparse_attention(source, architecture, raw, mla, config.num_attention_heads, kv_heads)
    layers = linear.linear_attention(
        source, architecture, raw, config.hidden_size, config.layer_types, config.num_hidden_layers
    )
    if family.ungated_mlp and isinstance(layers, linear.Mamba2) and layers.mlp_layers:
        if config.intermediate_size is None:
            raise InputError(
                f"{source}: missing key 'intermediate_size' required for {architecture} (hybrid_override_pattern "
                "has MLP blocks); add it from the model's config.json"
            )
        layout = replace(layout, dense=Mlp(config.intermediate_size, "intermediate_size", gated=False))
    return ModelSpec(
        name, architecture, config, source, layout, tuple(found), static_fp8(source, quantization), attention, layers
    )


def _name_of(path: Path, data: dict) -> str:
    """_name_or_path when set; else the file name, or its folder's name for a file called config.json."""
    named = data.get("_name_or_path")
    if isinstance(named, str) and named:
        return named
    path = Path(path).resolve()
    return path.parent.name if path.stem == "config" else path.stem


MAX_CONFIG_BYTES = 16 * MIB  # a config.json is a few KB


def read_hf_config(path: Path) -> ModelSpec:
    """A Hugging Face config.json from disk, reduced to the keys shapes are derived from."""
    data = read_json(path, "model config", "give a Hugging Face config.json (UTF-8 JSON)", limit=MAX_CONFIG_BYTES)
    if not isinstance(data, dict):
        raise InputError(f"{path}: a model config is a JSON object, not {type(data).__name__}; give a config.json")
    archs = data.get("architectures")
    if archs is None:
        raise InputError(f"{path}: missing key 'architectures'; add e.g. [\"LlamaForCausalLM\"] (known: {_known()})")
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
        raise InputError(
            f"{path}: field 'architectures' is {archs!r}; it must be a list of names, "
            f'e.g. ["LlamaForCausalLM"] (known: {_known()})'
        )
    arch = archs[0]
    name = _name_of(path, data)
    keys = dict(data)
    notes: tuple[str, ...] = ()
    text = data.get("text_config")
    if isinstance(text, dict) and "hidden_size" not in data:
        keys.update(text)  # a multimodal model: its language model's keys are nested
        notes = (f"{name}: {arch} is planned from its text_config (the language model only)",)
    picked = {key: keys[key] for key in KEYS if keys.get(key) is not None}
    # a multimodal config may keep its language model's quantization_config under text_config
    quantization = data.get("quantization_config", text.get("quantization_config") if isinstance(text, dict) else None)
    if quantization is not None:
        picked["quantization_config"] = quantization
    picked.update(sparse.config_keys(keys))  # DSA and MSA keys (cases/sparse.py)
    picked.update(dsv4.pick_keys(arch, keys))  # DeepSeek-V4's (cases/dsv4.py)
    picked.update(linear.config_keys(keys))  # Gated DeltaNet and Mamba2 keys (cases/linear.py)
    vision = data.get("vision_config")
    if isinstance(vision, dict):  # the vision tower's own keys; another shape of value is named by validation
        picked["vision_config"] = vision_keys(vision)
        if picked["vision_config"] is None:
            del picked["vision_config"]
            notes += (f"{name}: vision_config has no hidden_size and num_heads; its vision tower is not planned",)
        elif notes:
            notes = (f"{name}: {arch} is planned from its text_config (the language model) and vision_config",)
    return parse_config(str(path), arch, name, picked, notes)
