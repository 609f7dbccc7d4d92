"""Model profiles (cases/models/<Architecture>.yaml) and Hugging Face config.json files.

Both describe a model with the config.json keys of its architecture; ``derive_shapes`` turns one into
the per-rank shapes that the sweeps must include. A profile and a config.json of the same model give
the same shapes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from opcollect.cases.grids import PosInt
from opcollect.errors import InputError
from opcollect.yamlio import describe_validation_error, not_utf8


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    hidden_size: PosInt
    num_attention_heads: PosInt

    @field_validator("num_key_value_heads", check_fields=False)
    @classmethod
    def _kv_heads_group_the_heads(cls, kv: int, info: ValidationInfo) -> int:
        heads = info.data.get("num_attention_heads")
        if heads is not None and kv > heads:
            raise ValueError(f"{kv} is greater than num_attention_heads {heads}; set it to a divisor of {heads}")
        if heads is not None and heads % kv:
            raise ValueError(f"{kv} does not divide num_attention_heads {heads}; set it to a divisor of {heads}")
        return kv


class DenseConfig(_Config):
    num_key_value_heads: PosInt
    head_dim: PosInt | None = None
    intermediate_size: PosInt


class Qwen3MoeConfig(_Config):
    num_key_value_heads: PosInt
    head_dim: PosInt | None = None
    num_experts: PosInt
    num_experts_per_tok: PosInt
    moe_intermediate_size: PosInt


class MixtralConfig(_Config):
    num_key_value_heads: PosInt
    head_dim: PosInt | None = None
    intermediate_size: PosInt
    num_local_experts: PosInt
    num_experts_per_tok: PosInt


class GptOssConfig(_Config):
    num_key_value_heads: PosInt
    head_dim: PosInt
    intermediate_size: PosInt
    num_local_experts: PosInt
    num_experts_per_tok: PosInt
    sliding_window: PosInt


class DeepseekV3Config(_Config):
    q_lora_rank: PosInt
    kv_lora_rank: PosInt
    qk_nope_head_dim: PosInt
    qk_rope_head_dim: PosInt
    v_head_dim: PosInt
    intermediate_size: PosInt
    moe_intermediate_size: PosInt
    n_routed_experts: PosInt
    n_shared_experts: int = Field(ge=0)
    num_experts_per_tok: PosInt
    first_k_dense_replace: int = Field(ge=0)


ARCHITECTURES: dict[str, type[_Config]] = {
    "LlamaForCausalLM": DenseConfig,
    "Qwen3ForCausalLM": DenseConfig,
    "Qwen3MoeForCausalLM": Qwen3MoeConfig,
    "MixtralForCausalLM": MixtralConfig,
    "GptOssForCausalLM": GptOssConfig,
    "DeepseekV3ForCausalLM": DeepseekV3Config,
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


@dataclass(frozen=True)
class ModelSpec:
    name: str
    architecture: str
    config: _Config
    source: str


@dataclass(frozen=True)
class ModelShapes:
    gemm: frozenset[GemmShape]
    attention: frozenset[HeadShape]
    moe: frozenset[MoeShape]
    mla: frozenset[MlaShape]


def _split(total: int, tp: int) -> int | None:
    return total // tp if total % tp == 0 else None


def _dense_attention(cfg, tp: int, gemm: set, heads: set, windows: tuple[int, ...] = (0,)) -> None:
    head_dim = cfg.head_dim or cfg.hidden_size // cfg.num_attention_heads
    q = _split(cfg.num_attention_heads, tp)
    if q is None:
        return
    # kv heads are split across ranks, or replicated when there are fewer kv heads than ranks
    kv = cfg.num_key_value_heads // tp if cfg.num_key_value_heads >= tp else 1
    gemm.add(GemmShape((q + 2 * kv) * head_dim, cfg.hidden_size))  # qkv
    gemm.add(GemmShape(cfg.hidden_size, q * head_dim))  # o
    for window in windows:
        heads.add(HeadShape(q, kv, head_dim, window))


def _mlp(hidden: int, inter: int, tp: int, gemm: set) -> None:
    part = _split(inter, tp)
    if part is None:
        return
    gemm.add(GemmShape(2 * part, hidden))  # gate_up
    gemm.add(GemmShape(hidden, part))  # down


def derive_shapes(spec: ModelSpec, tp_sizes: list[int]) -> ModelShapes:
    """Per-rank shapes of one model at each tensor-parallel size in ``tp_sizes``."""
    cfg = spec.config
    gemm: set[GemmShape] = set()
    heads: set[HeadShape] = set()
    moe: set[MoeShape] = set()
    mla: set[MlaShape] = set()
    for tp in tp_sizes:
        if isinstance(cfg, DenseConfig):
            _dense_attention(cfg, tp, gemm, heads)
            _mlp(cfg.hidden_size, cfg.intermediate_size, tp, gemm)
        elif isinstance(cfg, (Qwen3MoeConfig, MixtralConfig)):
            _dense_attention(cfg, tp, gemm, heads)
            experts = getattr(cfg, "num_experts", None) or cfg.num_local_experts
            inter = getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size
            gemm.add(GemmShape(experts, cfg.hidden_size))  # router
            _mlp(cfg.hidden_size, inter, tp, gemm)  # expert weights under TP
            moe.add(MoeShape(cfg.hidden_size, inter, cfg.num_experts_per_tok, experts))
        elif isinstance(cfg, GptOssConfig):
            # alternate layers use a sliding window; the others attend to the full context
            _dense_attention(cfg, tp, gemm, heads, windows=(0, cfg.sliding_window))
            gemm.add(GemmShape(cfg.num_local_experts, cfg.hidden_size))
            _mlp(cfg.hidden_size, cfg.intermediate_size, tp, gemm)
            moe.add(MoeShape(cfg.hidden_size, cfg.intermediate_size, cfg.num_experts_per_tok, cfg.num_local_experts))
        elif isinstance(cfg, DeepseekV3Config):
            q = _split(cfg.num_attention_heads, tp)
            if q is None:
                continue
            rope, nope, v = cfg.qk_rope_head_dim, cfg.qk_nope_head_dim, cfg.v_head_dim
            gemm.add(GemmShape(cfg.q_lora_rank + cfg.kv_lora_rank + rope, cfg.hidden_size))  # fused q_a/kv_a
            gemm.add(GemmShape(q * (nope + rope), cfg.q_lora_rank))  # q_b
            gemm.add(GemmShape(q * (nope + v), cfg.kv_lora_rank))  # kv_b
            gemm.add(GemmShape(cfg.hidden_size, q * v))  # o
            gemm.add(GemmShape(cfg.n_routed_experts, cfg.hidden_size))  # router
            _mlp(cfg.hidden_size, cfg.intermediate_size, tp, gemm)  # first dense layers
            if cfg.n_shared_experts:
                _mlp(cfg.hidden_size, cfg.moe_intermediate_size * cfg.n_shared_experts, tp, gemm)
            _mlp(cfg.hidden_size, cfg.moe_intermediate_size, tp, gemm)  # routed experts under TP
            moe.add(MoeShape(cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts_per_tok, cfg.n_routed_experts))
            mla.add(MlaShape(cfg.num_attention_heads))
    return ModelShapes(frozenset(gemm), frozenset(heads), frozenset(moe), frozenset(mla))


def _supported() -> str:
    return ", ".join(sorted(ARCHITECTURES))


def parse_config(source: str, architecture: str, name: str, data: dict) -> ModelSpec:
    model = ARCHITECTURES.get(architecture)
    if model is None:
        raise InputError(f"{source}: unknown architecture {architecture!r}; supported: {_supported()}")
    try:
        config = model.model_validate(data)
    except ValidationError as exc:
        raise InputError(describe_validation_error(source, exc)) from None
    return ModelSpec(name=name, architecture=architecture, config=config, source=source)


def read_hf_config(path: Path) -> ModelSpec:
    """A Hugging Face config.json from disk, reduced to the keys its architecture's shapes need."""
    try:
        data = json.loads(Path(path).read_bytes())
    except OSError as exc:
        raise InputError(f"{path}: cannot read model config ({exc.strerror}); check the path") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: {not_utf8(exc)}; a config.json is UTF-8 JSON, save it as such") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: a model config is a JSON object, not {type(data).__name__}; give a config.json")
    archs = data.get("architectures")
    if archs is None:
        raise InputError(f"{path}: missing key 'architectures'; supported: {_supported()}")
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
        raise InputError(
            f"{path}: field 'architectures' is {archs!r}; it must be a list of names, "
            f'e.g. ["LlamaForCausalLM"] (supported: {_supported()})'
        )
    arch = archs[0]
    model = ARCHITECTURES.get(arch)
    if model is None:
        raise InputError(f"{path}: unknown architecture {arch!r}; supported: {_supported()}")
    fields = model.model_fields
    for key, info in fields.items():
        if info.is_required() and key not in data:
            raise InputError(f"{path}: missing key {key!r} required for {arch}; add it to the config")
    picked = {key: data[key] for key in fields if key in data and data[key] is not None}
    name = data.get("_name_or_path") or Path(path).resolve().parent.name
    return parse_config(str(path), arch, str(name), picked)
