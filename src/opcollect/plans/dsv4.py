"""DeepSeek-V4's attention module at one rank, prefill and decode, for its CSA (compress ratio 4) and HCA (128)
layers: dsv4_{csa,hca}_{context,generation}_module_perf, family sparse_attention.

A row times the layer's whole attention as serving builds it: q/kv projections and norms, RoPE, the cache writes,
the compressor, for CSA the indexer and its top-k, the sparse FlashMLA kernel over the sliding window and the
compressed KV, and the grouped output projection, with collectives left out (TP is simulated in one process).
vLLM 0.24.0 times DeepseekV4Attention.forward (models/deepseek_v4/attention.py:320; the reference collector,
collector/vllm/collect_dsv4_attn.py:378-576); SGLang 0.5.14 times the layer's self_attn, MQALayer.forward
(srt/models/deepseek_v4.py:269,916; collector/sglang/collect_dsv4_attn.py:1303-1639).

Keys as the reference holds them: num_heads are the rank's (num_attention_heads / tp_size, which the consumer
multiplies back by tp_size and refuses a file without: aiconfigurator-core dsv4.rs:1334-1375); isl is the new
tokens (1 in decode) and step the cached prefix (the past length in decode); compress_ratio is the table's, 4 or
128. The model is the DeepSeek-V4 profile's name (its Hugging Face id). The frameworks label their fp8 KV cache
differently (vLLM fp8, collector :550; SGLang fp8_e4m3, collector :373-375), and each table keeps its framework's
label (plans/skips.py dsv4-*-labels).

Deliberate differences from the reference collectors:
- SGLang drops context shapes whose KV does not fit its live KV pool (collector :1445-1479), a count that depends
  on the GPU's memory. The grid bounds them by batch_size x step <= 2^28 instead, which keeps exactly the H200
  reference's shapes (the pool's capacity there lies between 268,443,648 and 512,000,512 tokens); on another
  GPU a shape beyond its pool fails at run time, as a capacity failure, not as a skip.
- SGLang's chunked-prefill size is 8192 on an H200 and 16384 on GPUs of 160 GB and more (server_args.py:
  3186-3201); the grid holds the H200's on every SM.
"""

from __future__ import annotations

from typing import Callable, Mapping, NamedTuple

from opcollect.cases.dsv4 import CSA, HCA, Dsv4Attention
from opcollect.cases.grids_dsv4 import ContextShapes, DecodeShapes, Dsv4Grid
from opcollect.cases.profiles import ModelShapes
from opcollect.names import BACKENDS
from opcollect.plans.base import Group, OpPlan, make_groups
from opcollect.plans.work import Work, format_of

FAMILY = "sparse_attention"
DTYPE_FIELDS = ("mla_dtype", "kv_cache_dtype", "gemm_type")


class Dsv4ModuleCase(NamedTuple):
    model: str
    architecture: str
    mla_dtype: str
    kv_cache_dtype: str
    gemm_type: str
    num_heads: int  # on the rank
    batch_size: int
    isl: int
    tp_size: int
    step: int
    compress_ratio: int


class Dims(NamedTuple):
    """What the speed-of-light bound and the top-k calibration need of a model beyond its case's keys."""

    hidden_size: int
    q_lora_rank: int
    o_lora_rank: int
    o_groups: int
    head_dim: int
    sliding_window: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int


# The DeepSeek-V4 profiles' dimensions (cases/models/DeepseekV4ForCausalLM.yaml; tests hold the two equal), by the
# model column: a case is all a bound sees. A model of a --model config has none here, so no bound and no zero rows.
DIMS: dict[str, Dims] = {
    "sgl-project/DeepSeek-V4-Flash-FP8": Dims(4096, 1024, 1024, 8, 512, 128, 64, 128, 512),
    "sgl-project/DeepSeek-V4-Pro-FP8": Dims(7168, 1536, 1024, 16, 512, 128, 64, 128, 1024),
}


def dims_of(attention: Dsv4Attention) -> Dims:
    a = attention
    return Dims(
        a.hidden_size,
        a.q_lora_rank,
        a.o_lora_rank,
        a.o_groups,
        a.head_dim,
        a.sliding_window,
        a.index_n_heads,
        a.index_head_dim,
        a.index_topk,
    )


def models(grid: Dsv4Grid, shapes: Mapping[str, ModelShapes], keep: Callable[[Dsv4Attention], bool]):
    """(name, dimensions) of the DeepSeek-V4 models an op plans, in the order the sources list them."""
    return [
        (name, attention)
        for name, model_shapes in shapes.items()
        for attention in sorted(model_shapes.dsv4)
        if keep(attention) and (grid.models is None or name in grid.models)
    ]


def context_shapes(c: ContextShapes, max_positions: int) -> list[tuple[int, int, int]]:
    """(batch_size, isl, step) of a context sweep, batch-major as the collectors run them: each isl with every
    prefix of ``step`` (and fill_to - isl), within the sweep's bounds and the model's positions."""
    found = []
    for batch in c.batch_size:
        for isl in c.isl:
            prefixes = dict.fromkeys((*c.step, *(() if c.fill_to is None else (c.fill_to - isl,))))
            for step in prefixes:
                total = step + isl
                if (
                    step < 0
                    or total > max_positions
                    or (c.max_seq_len is not None and total > c.max_seq_len)
                    or (c.max_query_tokens is not None and batch * isl > c.max_query_tokens)
                    or (c.max_kv_tokens is not None and batch * total > c.max_kv_tokens)
                    or (c.max_prefix_tokens is not None and batch * step > c.max_prefix_tokens)
                ):
                    continue
                found.append((batch, isl, step))
    return found


def decode_shapes(d: DecodeShapes, max_positions: int) -> list[tuple[int, int, int]]:
    """(batch_size, 1, step) of a decode sweep: one new token after step cached ones."""
    return [
        (batch, 1, step)
        for batch in d.batch_size
        for step in d.step
        if step + 1 <= max_positions
        and (d.max_step is None or step <= d.max_step)
        and (d.max_kv_tokens is None or batch * step <= d.max_kv_tokens)
        and not any(step >= rung.min_step and batch > rung.max_batch for rung in d.batch_ladder)
    ]


def keeps(ratio: int) -> Callable[[Dsv4Attention], bool]:
    """The models with layers of this compression (HCA: sliding-window-only layers too, Dsv4Attention.has_hca)."""
    return (lambda a: a.has_csa) if ratio == CSA else (lambda a: a.has_hca)


def _expand(op: str, ratio: int, context: bool):
    def expand(grid: Dsv4Grid, shapes: Mapping[str, ModelShapes]) -> list[Group]:
        rows: dict[tuple, dict[tuple, None]] = {}
        origins = {}
        for sweep in grid.sweeps:
            for name, a in models(grid, shapes, keeps(ratio)):
                origins[(name,)] = frozenset({name})
                found = (
                    context_shapes(sweep.context, a.max_position_embeddings)  # type: ignore[arg-type]
                    if context
                    else decode_shapes(sweep.decode, a.max_position_embeddings)  # type: ignore[arg-type]
                )
                for p in sweep.precisions:
                    for gemm_type in sweep.gemm_types:
                        key = (p.mla_dtype, p.kv_cache_dtype, gemm_type)
                        bucket = rows.setdefault(key, {})
                        for tp in sweep.tp_sizes:
                            if a.num_heads % tp:  # vLLM asserts it (attention.py:170), SGLang splits heads alike
                                continue
                            heads = a.num_heads // tp
                            for batch, isl, step in found:
                                bucket[(name, a.architecture, *key, heads, batch, isl, tp, step, ratio)] = None
        values = {key: list(found) for key, found in rows.items()}
        return make_groups(op, Dsv4ModuleCase, DTYPE_FIELDS, values, origins, ("model",))

    return expand


def projection_weights(d: Dims, heads: int, tp: int) -> int:
    """The attention projections' weights on a rank (vLLM attention.py:198-236): fused wq_a + wkv [hidden ->
    q_lora + head_dim] (replicated), wq_b [q_lora -> heads x head_dim], the grouped wo_a [heads x head_dim ->
    o_lora per group] and wo_b [groups x o_lora -> hidden]; the compressor's and indexer's are left out."""
    groups = max(1, d.o_groups // tp)
    return (
        d.hidden_size * (d.q_lora_rank + d.head_dim)
        + d.q_lora_rank * heads * d.head_dim
        + heads * d.head_dim * d.o_lora_rank
        + groups * d.o_lora_rank * d.hidden_size
    )


def work(c: Dsv4ModuleCase) -> Work | None:
    """The projections alone (projection_weights), 2 FLOPs per weight per token at gemm_type's rate, every weight
    read once at its width and the hidden states read and written once in bf16; the attention, compressor and
    indexer only add to it. None for a model without its dimensions in DIMS: no bound."""
    d = DIMS.get(c.model)
    if d is None:
        return None
    g = format_of(c.gemm_type)
    weights = projection_weights(d, c.num_heads, c.tp_size)
    tokens = c.batch_size * c.isl
    return Work({g.peak: 2.0 * tokens * weights}, weights * g.weight + tokens * d.hidden_size * 2 * 2)


def _cost(c: Dsv4ModuleCase) -> float:
    tokens = c.batch_size * c.isl
    return tokens * (c.num_heads * 1e5 + c.step // c.compress_ratio + 128) + c.batch_size * c.step


def vllm_backend(sm: str) -> str:
    """The attention backend vLLM 0.24.0 builds DeepSeek-V4's layers on, as the reference labels its rows (the
    layer's backend get_name(), collector/vllm/collect_dsv4_attn.py:497,565): with no backend configured,
    _select_dsv4_attn_cls (models/deepseek_v4/nvidia/model.py:738-769) takes DeepseekV4FlashInferSM120Attention on
    capability major 12 (FLASHINFER_MLA_SPARSE_DSV4, nvidia/flashinfer_sparse.py:509-512) and
    DeepseekV4FlashMLAAttention elsewhere (FLASHMLA_SPARSE_DSV4, models/deepseek_v4/sparse_mla.py:37,59-60), whose
    FlashMLA supports majors 9 and 10 only (:94-95): below SM90 no backend exists (plans/skips.py dsv4-needs-sm90)."""
    return "FLASHINFER_MLA_SPARSE_DSV4" if sm == "120" else "FLASHMLA_SPARSE_DSV4"


def _vllm(sm: str, group: Group) -> str:
    return vllm_backend(sm)


def _sglang(sm: str, group: Group) -> str:
    """SGLang 0.5.14's dsv4 attention backend (srt/layers/attention/attention_registry.py:129-150 ->
    deepseek_v4_backend.DeepseekV4AttnBackend: decode through sgl_kernel.flash_mla.flash_mla_with_kvcache,
    :1434-1436, prefill through flash_mla_sparse_fwd, :1476-1548, and flash_mla_with_kvcache_sm120 on SM120,
    :1416-1421), under the one label the reference collector gives it on every SM (collect_dsv4_attn.py:1296)."""
    return "compressed_flashmla"


def _torch(sm: str, group: Group) -> str:
    return "torch_dsv4_attention"  # the torch backend's reference module: gathered sparse attention in plain torch


def _trtllm(sm: str, group: Group) -> str:
    return "no-dsv4-attention"  # TensorRT-LLM 1.3.0rc20 has no DeepSeek-V4 model (plans/skips.py)


DISPATCH = {"torch": _torch, "vllm": _vllm, "sglang": _sglang, "trtllm": _trtllm}
assert set(DISPATCH) == set(BACKENDS)


def _plan(kind: str, ratio: int, phase: str) -> OpPlan:
    name = f"dsv4_{kind}_{phase}_module"
    return OpPlan(
        name=name,
        family=FAMILY,
        table=f"{name}_perf",
        op_name=name,
        case_type=Dsv4ModuleCase,
        dtype_fields=DTYPE_FIELDS,
        expand=_expand(name, ratio, context=phase == "context"),
        tp_sizes=lambda grid: (),  # the sweeps split each model's heads themselves
        dispatch=DISPATCH,
        cost=_cost,
        work=work,
    )


CSA_CONTEXT = _plan("csa", CSA, "context")
CSA_GENERATION = _plan("csa", CSA, "generation")
HCA_CONTEXT = _plan("hca", HCA, "context")
HCA_GENERATION = _plan("hca", HCA, "generation")
MODULES = (CSA_CONTEXT, CSA_GENERATION, HCA_CONTEXT, HCA_GENERATION)
