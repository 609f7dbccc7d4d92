"""Vision-tower (encoder) attention: full, non-causal MHA over batch_size images of isl patch tokens, no KV cache.

Head configs are the generic sweeps, the grid's model_heads and the per-rank heads of every profile's vision
tower (ModelShapes.encoder). The (batch_size, isl) pairs of a config stay within the grid's token budget and
32-bit indexing bound, as the reference collector plans them (collector/<fw>/collect_attn_encoder.py:
get_encoder_attention_test_cases, the same filter for vLLM, SGLang and TRT-LLM).
"""

from __future__ import annotations

from itertools import repeat
from typing import Mapping, NamedTuple

from opcollect.cases.grids import EncoderAttentionGrid
from opcollect.cases.profiles import ModelShapes
from opcollect.plans.base import Group, OpPlan, make_groups
from opcollect.plans.gemm import model_origins
from opcollect.plans.work import Work, format_of


class EncoderAttentionCase(NamedTuple):
    batch_size: int
    isl: int
    num_heads: int
    head_dim: int
    attn_dtype: str


def work(c: EncoderAttentionCase) -> Work:
    """Non-causal: every query sees all isl keys, 4 * head_dim FLOPs per (query, key) pair and head (QK^T, PV);
    Q, K, V read and O written once, all num_heads wide (no KV cache, no GQA)."""
    f = format_of(c.attn_dtype)
    flops = 4.0 * c.batch_size * c.num_heads * c.head_dim * c.isl * c.isl
    return Work({f.peak: flops}, 4 * c.batch_size * c.isl * c.num_heads * c.head_dim * f.act)


SHAPE_FIELDS = ("num_heads", "head_dim")


def head_configs(grid: EncoderAttentionGrid, shapes: Mapping[str, ModelShapes]):
    """Sorted (num_heads, head_dim) configs, head_dim first as the collector orders them, and the ones only
    models add with the models they come from."""
    base = {(heads, head_dim) for sweep in grid.heads for heads in sweep.num_heads for head_dim in sweep.head_dim}
    found: dict[tuple, set[str]] = {}
    for entry in grid.model_heads:
        for tp in entry.tp_sizes:
            config = (entry.num_heads // tp, entry.head_dim)
            if entry.num_heads % tp == 0 and config not in base:
                found.setdefault(config, set()).add(entry.model)
    for config, models in model_origins(base, shapes, "encoder").items():
        found.setdefault(config, set()).update(models)
    origins = {config: frozenset(models) for config, models in found.items()}
    return sorted(base | origins.keys(), key=lambda c: (c[1], c[0])), origins


def lengths(grid: EncoderAttentionGrid, heads: int, head_dim: int) -> list[tuple[int, int]]:
    """(batch_size, isl) pairs of one head config in run order (isl, then batch_size, ascending): batch_size x isl
    within max_tokens, and batch_size x isl x heads x head_dim below max_head_elements."""
    bound = grid.max_head_elements
    return [
        (batch, isl)
        for isl in grid.isl
        for batch in grid.batch_size
        if batch * isl <= grid.max_tokens and (bound is None or batch * isl * heads * head_dim < bound)
    ]


def expand(grid: EncoderAttentionGrid, shapes: Mapping[str, ModelShapes]) -> list[Group]:
    configs, origins = head_configs(grid, shapes)
    per_config = []
    for heads, head_dim in configs:
        pairs = lengths(grid, heads, head_dim)
        per_config.append((heads, head_dim, [b for b, _ in pairs], [s for _, s in pairs]))
    rows = {}
    for dtype in grid.attn_dtypes:
        values: list[tuple] = []
        for heads, head_dim, batches, isls in per_config:
            values += zip(batches, isls, repeat(heads), repeat(head_dim), repeat(dtype))
        rows[(dtype,)] = values
    return make_groups("encoder_attention", EncoderAttentionCase, ("attn_dtype",), rows, origins, SHAPE_FIELDS)


def _cost(c: EncoderAttentionCase) -> float:
    return 4.0 * c.batch_size * c.isl * c.isl * c.num_heads * c.head_dim  # QK^T and PV over the full square


def _vllm(sm: str, group: Group) -> str:
    """vLLM 0.24.0's MMEncoderAttention backend and flash-attention version, labelled as the reference collector
    labels them (collector/vllm/collect_attn_encoder.py:138-141: vllm_vit_flash_attn_fa<version>).

    The backend (model_executor/layers/attention/mm_encoder_attention.py:354-367 -> platforms/cuda.py:510-546):
    the first of FLASH_ATTN, TRITON_ATTN, TORCH_SDPA, FLASHINFER (cuda.py:493-502, from SM80) whose class takes
    the head size, dtype and SM; FLASH_ATTN takes bf16, head sizes that are multiples of 8 up to 256
    (v1/attention/backends/flash_attn.py:69, 173-180) and any SM from 8.0 (:206-207), so every head_dim of the grid
    (64, 72, 80) runs it. Its version (v1/attention/backends/fa_utils.py:78-86): FA3 on SM9x, FA4 on SM10x (FA4
    keeps these heads on Blackwell: :163-174 leaves only head sizes above 128), FA2 elsewhere (SM80-89, SM120).
    """
    if sm == "90":
        return "vllm_vit_flash_attn_fa3"
    return "vllm_vit_flash_attn_fa4" if sm in ("100", "103") else "vllm_vit_flash_attn_fa2"


def _sglang(sm: str, group: Group) -> str:
    """SGLang 0.5.14's VisionAttention backend with no --mm-attention-backend (Qwen3-VL's vision blocks pass none,
    srt/models/qwen3_vl.py:193-206): srt/layers/attention/vision.py:1081-1088 takes fa3 on capability 9.x, fa4 on
    10.x except 10.3, triton_attn elsewhere; labelled as the reference collector labels them
    (collector/sglang/collect_attn_encoder.py:86-150: flash_attention_v3, flash_attention_v4, triton)."""
    if sm == "90":
        return "flash_attention_v3"
    return "flash_attention_v4" if sm == "100" else "triton"


def _trtllm(sm: str, group: Group) -> str:
    """TensorRT-LLM's vision attention is its Attention module on the model's attention backend (TRTLLM by
    default: modeling_qwen2vl.py Qwen2_5_VLVisionAttention, which Qwen3VLVisionAttention extends), run with a
    full mask and no KV cache; the reference collector builds that layer with create_attention("TRTLLM") and
    labels it torch_flow on every SM (collector/trtllm/collect_attn_encoder.py:79-88, 158). On SM100/103 the
    context FMHA leaves TRT-LLM-Gen for the fmha_v2 runner at head_dim 72 and 80 (fmhaDispatcher), still this
    backend."""
    return "torch_flow"


def _torch(sm: str, group: Group) -> str:
    return "torch.nn.functional.scaled_dot_product_attention"  # without a causal mask


PLAN = OpPlan(
    name="encoder_attention",
    family="encoder_attention",
    table="encoder_attention_perf",
    op_name="encoder_attention",
    case_type=EncoderAttentionCase,
    dtype_fields=("attn_dtype",),
    expand=expand,
    tp_sizes=lambda grid: tuple(grid.model_tp_sizes),
    dispatch={"torch": _torch, "vllm": _vllm, "sglang": _sglang, "trtllm": _trtllm},
    cost=_cost,
    work=work,
)
