"""Context (prefill) and generation (decode) attention over generic and per-rank model head configs."""

from __future__ import annotations

from itertools import repeat
from typing import Mapping, NamedTuple

from opcollect.cases.grids import AttentionGrid, ContextAttentionGrid, GenerationAttentionGrid
from opcollect.cases.profiles import ModelShapes
from opcollect.plans import selection, selection_sglang
from opcollect.plans.base import Group, OpPlan, make_groups, refines
from opcollect.plans.gemm import model_origins
from opcollect.plans.work import Work, causal_pairs, format_of


class AttentionCase(NamedTuple):
    batch_size: int
    isl: int
    num_heads: int
    num_key_value_heads: int
    head_dim: int
    beam_width: int
    attn_dtype: str
    kv_cache_dtype: str
    step: int
    window_size: int


def work(c: AttentionCase) -> Work:
    """Context and generation alike: isl queries per sequence after step cached tokens (a generation row: one query
    over step + 1 keys, as the runners build it), each query seeing its causal span capped by the window.
    QK^T and PV cost 2 * head_dim FLOPs each per (query, key) pair and head, at the attention dtype's rate. Q is read
    and O written once per query and head; K and V once per key the queries see (keys per KV head: GQA shares
    them), at the KV cache dtype."""
    a, kv = format_of(c.attn_dtype), format_of(c.kv_cache_dtype)
    pairs = causal_pairs(c.isl, c.step, c.window_size)
    keys = c.step + c.isl if not c.window_size else min(c.step + c.isl, c.isl + c.window_size - 1)
    flops = 4.0 * c.batch_size * c.num_heads * c.head_dim * pairs
    moved = c.batch_size * c.head_dim * (2 * c.isl * c.num_heads * a.act + 2 * keys * c.num_key_value_heads * kv.act)
    return Work({a.peak: flops}, moved)


def head_configs(grid: AttentionGrid, shapes: Mapping[str, ModelShapes]):
    """Sorted (num_heads, kv_heads, head_dim, window) configs and the ones only models add.

    The generic sweeps make the base grid; the grid's model_heads and the model profiles add their per-rank
    configs, each with the models it comes from.
    """
    base = set()
    for sweep in grid.heads:
        for heads in sweep.num_heads:
            for kv in sweep.kv_heads:
                kv_heads = kv or heads  # 0 means MHA
                if kv_heads <= heads and heads % kv_heads == 0:
                    for head_dim in sweep.head_dim:
                        for window in sweep.window_size:
                            base.add((heads, kv_heads, head_dim, window))
    found: dict[tuple, set[str]] = {}
    for entry in grid.model_heads:
        for tp in entry.tp_sizes:
            if entry.num_heads % tp == 0:
                kv = -(-entry.kv_heads // tp)  # ceil: replicated once there are more ranks than kv heads
                for window in entry.window_size:
                    config = (entry.num_heads // tp, kv, entry.head_dim, window)
                    if config not in base:
                        found.setdefault(config, set()).add(entry.model)
    for config, models in model_origins(base, shapes, "attention").items():
        found.setdefault(config, set()).update(models)
    origins = {config: frozenset(models) for config, models in found.items()}
    return sorted(base | origins.keys()), origins


SHAPE_FIELDS = ("num_heads", "num_key_value_heads", "head_dim", "window_size")


def context_lengths(grid: ContextAttentionGrid, heads: int, kv: int, head_dim: int) -> list[tuple[int, int]]:
    """(batch_size, isl) pairs of one head config, in run order.

    MHA holds every head's KV, so its token cap (and batch cap) is lower than GQA's; max_kv_elements keeps the
    K and V elements of one call below the int32 index range the kernels use.
    """
    mha = kv == heads
    cap = grid.max_tokens_mha if mha else grid.max_tokens_gqa
    max_batch = grid.max_batch_mha if mha and grid.max_batch_mha else None
    pairs = []
    for batch in grid.batch_size:
        if max_batch is not None and batch > max_batch:
            continue
        for isl in grid.isl:
            tokens = batch * isl
            if tokens <= cap and (grid.max_kv_elements is None or tokens * kv * head_dim * 2 < grid.max_kv_elements):
                pairs.append((batch, isl))
    return pairs


_SCALE = {  # cap rule -> (numerator, denominator) of the per-token scale, from (num_heads, head_dim)
    "tokens": lambda heads, head_dim: (1, 1),
    "heads": lambda heads, head_dim: (heads, 1),
    "head_elements": lambda heads, head_dim: (heads * head_dim, 128),
}


def generation_steps(grid: GenerationAttentionGrid, heads: int, kv: int, head_dim: int) -> list[tuple[int, int]]:
    """(batch_size, step) pairs of one head config, in run order: the union over the grid's cap rules.

    Per rule, as the reference collector plans it: batch b at s = step + 1 cached tokens fits while
    b x s x scale <= the token cap (MHA or GQA); a step is kept only where at least min_batch_sizes_per_step
    batch sizes fit; batches of drop_longest_step_from_batch or more leave out their longest kept step.
    """
    cap = grid.max_tokens_mha if kv == heads else grid.max_tokens_gqa
    kept: set[tuple[int, int]] = set()
    for rule in grid.cap_rules:
        numerator, denominator = _SCALE[rule](heads, head_dim)
        limit = cap * denominator
        steps_of: dict[int, list[int]] = {}
        for step in sorted(grid.step):
            per_batch = (step + 1) * numerator
            fits = [batch for batch in grid.batch_size if batch * per_batch <= limit]
            if len(fits) >= grid.min_batch_sizes_per_step:
                for batch in fits:
                    steps_of.setdefault(batch, []).append(step)
        drop = grid.drop_longest_step_from_batch
        for batch, steps in steps_of.items():
            if drop is not None and batch >= drop:
                steps = steps[:-1]
            kept.update((batch, step) for step in steps)
    return [(batch, step) for batch in grid.batch_size for step in grid.step if (batch, step) in kept]


def _columns(pairs: list[tuple[int, int]]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(batch sizes, lengths) of a pair list, in its order."""
    return tuple(b for b, _ in pairs), tuple(n for _, n in pairs)


def _expand(op: str, grid: AttentionGrid, shapes, context: bool) -> list[Group]:
    configs, origins = head_configs(grid, shapes)
    # the (batch, length) pairs depend only on MHA-or-not, num_heads and kv x head_dim: share them across configs
    pairs_of: dict[tuple, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    per_config = []
    for heads, kv, head_dim, window in configs:
        if context:
            key = (kv == heads, kv * head_dim)
            pairs = pairs_of.get(key)
            if pairs is None:
                pairs = pairs_of[key] = _columns(context_lengths(grid, heads, kv, head_dim))  # type: ignore[arg-type]
        else:
            key = (kv == heads, heads, head_dim)
            pairs = pairs_of.get(key)
            if pairs is None:
                pairs = pairs_of[key] = _columns(generation_steps(grid, heads, kv, head_dim))  # type: ignore[arg-type]
        per_config.append((heads, kv, head_dim, window, pairs))
    rows = {}
    for p in grid.precisions:
        a, k = p.attn_dtype, p.kv_cache_dtype
        values: list[tuple] = []
        for heads, kv, head_dim, window, (batches, lengths) in per_config:
            # zip builds the AttentionCase-ordered tuples in C: planning stays fast at ~10^5 cases
            constant = (repeat(heads), repeat(kv), repeat(head_dim), repeat(1), repeat(a), repeat(k))
            if context:
                values += zip(batches, lengths, *constant, repeat(0), repeat(window))
            else:
                values += zip(batches, repeat(1), *constant, lengths, repeat(window))
        rows[(a, k)] = values
    return make_groups(op, AttentionCase, ("attn_dtype", "kv_cache_dtype"), rows, origins, SHAPE_FIELDS)


def expand_context(grid: ContextAttentionGrid, shapes) -> list[Group]:
    return _expand("attention_context", grid, shapes, context=True)


def expand_generation(grid: GenerationAttentionGrid, shapes) -> list[Group]:
    return _expand("attention_generation", grid, shapes, context=False)


def _context_cost(c: AttentionCase) -> float:
    span = min(c.isl, c.window_size) if c.window_size else c.isl
    return 4.0 * c.batch_size * c.isl * span * c.num_heads * c.head_dim


def _generation_cost(c: AttentionCase) -> float:
    span = min(c.step + 1, c.window_size) if c.window_size else c.step + 1
    return 4.0 * c.batch_size * span * c.num_key_value_heads * c.head_dim + c.batch_size * span * c.num_heads


def _vllm(sm: str, group: Group) -> str:
    # vLLM 0.24.0 platforms/cuda.py:144-159: FLASHINFER first on the SM100 family, FLASH_ATTN first elsewhere;
    # the flash-attention version and FlashInfer's kernels depend on the head: _vllm_case
    return "FLASHINFER" if sm in ("100", "103") else "FLASH_ATTN"


@refines(("head_dim", "kv_cache_dtype", "step", "isl"))
def _vllm_case(sm: str, dispatch: str, case: AttentionCase) -> str:
    """The kernel_source the vLLM runner reads off the chosen backend, as the reference names it: the selector's
    own answer per head and KV dtype where cases/selection has it (scripts/selection_tables.py), FlashInfer's
    prefill or decode kernel by the batch; the rules below are the fallback."""
    chosen = selection.vllm_attention(sm, case.kv_cache_dtype, case.head_dim)
    if chosen is not None and chosen != "FLASHINFER":
        return chosen
    if chosen == "FLASHINFER" or dispatch == "FLASHINFER":
        # without the file: FlashInfer's heads (v1/attention/backends/flashinfer.py:421-423); FLASH_ATTN (FA4 on
        # SM100) takes another head with a bf16 cache, TRITON_ATTN with fp8 (flash_attn.py:183-193)
        if chosen is None and case.head_dim not in (64, 128, 256, 512):
            return "vllm_flash_attn_fa4" if case.kv_cache_dtype == "bfloat16" else "vllm_triton_attn"
        # TRT-LLM-gen kernels on the SM100 family for prefill and decode (utils/flashinfer.py:374-408, 464-480;
        # flashinfer.py:687-700), picked per batch: the metadata class names them. A one-token query is a decode
        # for FlashInfer (flashinfer.py:564, 950-957), a prefill of isl 1 too
        prefill = case.step == 0 and case.isl > 1
        return "vllm_flashinfer_trtllmprefill" if prefill else "vllm_flashinfer_trtllmdecode"
    # v1/attention/backends/fa_utils.py:78-86: FA3 on SM9x, FA4 on SM10x, FA2 elsewhere; on SM90 a head
    # above 256 takes FA4 (:119-146)
    if sm == "90":
        return "vllm_flash_attn_fa4" if case.head_dim > 256 else "vllm_flash_attn_fa3"
    return "vllm_flash_attn_fa4" if sm in ("100", "103") else "vllm_flash_attn_fa2"


def _sglang(sm: str, group: Group) -> str:
    # SGLang 0.5.14 _get_default_attn_backend (sglang/srt/server_args.py:4431-4455): fa3 on Hopper, trtllm_mha on
    # SM100/103, flashinfer elsewhere; the reference labels a row with the backend's name
    if sm == "90":
        return "fa3"
    return "trtllm_mha" if sm in ("100", "103") else "flashinfer"


def _gemma4(case: AttentionCase) -> bool:
    """Gemma-4's global (head_dim 512) and sliding-window (head_dim 256, window 1024) layers: in the grids these
    head configs are Gemma-4's, which the frameworks serve on their own attention paths."""
    return case.head_dim == 512 or (case.head_dim == 256 and case.window_size == 1024)


def _sglang_architecture(case: AttentionCase) -> str | None:
    """The architecture whose ServerArgs serves this head config, where only one model in the grids has it (the
    grid's model_heads, cases/base_ops/attention_*.yaml); None for the generic sweeps' configs, which several
    models share (NemotronH's heads among them: its flashinfer at SM100 is not applied for that reason)."""
    if _gemma4(case):
        return "Gemma4ForConditionalGeneration"
    if case.head_dim == 128 and case.window_size == 512:  # Step-3.7-Flash's sliding layers, per rank
        return "Step3p5ForCausalLM"
    if case.head_dim == 192:  # MiMo-V2-Flash's full and sliding layers, per rank
        return "MiMoV2FlashForCausalLM"
    if (case.num_heads, case.num_key_value_heads, case.head_dim, case.window_size) in ((3, 1, 256, 0), (6, 1, 256, 0)):
        # Qwen3.5-27B at TP 8 and 4 (its TP 1 and 2 configs are in the generic sweep)
        return "Qwen3_5ForConditionalGeneration"
    return None


def _sglang_rule(dispatch: str, case: AttentionCase) -> str:
    # Gemma-4 runs on triton wherever trtllm_mha does not (server_args.py:4057-4084:
    # _handle_model_specific_adjustments)
    return "triton" if _gemma4(case) and dispatch != "trtllm_mha" else dispatch


def _sglang_phase(phase: str):
    """The case rule of one phase: the prefill or decode attention backend SGLang 0.5.14's ServerArgs leaves for
    the head config's model (cases/selection/sglang-0.5.14.yaml, from scripts/selection_tables_sglang.py; e.g.
    Qwen3.5 triton and Step-3.5 fa4 on SM100), labelled with the backend's name as the reference does; the
    hand rule where the file has no answer or the config is not one model's."""

    @refines(("num_heads", "num_key_value_heads", "head_dim", "window_size", "kv_cache_dtype"))
    def rule(sm: str, dispatch: str, case: AttentionCase) -> str:
        architecture = _sglang_architecture(case)
        if architecture is not None:
            chosen = selection_sglang.attention_backend(sm, architecture, case.kv_cache_dtype, phase)
            if chosen is not None:
                return chosen
        return _sglang_rule(dispatch, case)

    rule.__name__ = f"_sglang_{phase}_case"
    return rule


_sglang_context_case = _sglang_phase("prefill")
_sglang_generation_case = _sglang_phase("decode")


def _trtllm(sm: str, group: Group) -> str:
    # TensorRT-LLM's TRTLLM attention backend through create_attention, labelled torch_flow by the reference
    # collector (collector/trtllm/collect_attn.py:107,450); its FlashInfer path is taken on SM100/103 only
    # (:120-125), for Gemma-4's heads: _trtllm_case
    return "torch_flow"


@refines(("head_dim", "window_size"), ("torch_flow",))
def _trtllm_case(sm: str, dispatch: str, case: AttentionCase) -> str:
    return "torch_flow_flashinfer" if _gemma4(case) and sm in ("100", "103") else dispatch


def _torch(sm: str, group: Group) -> str:
    return "torch.nn.functional.scaled_dot_product_attention"


CONTEXT = OpPlan(
    name="attention_context",
    family="attention",
    table="context_attention_perf",
    op_name="context_attention",
    case_type=AttentionCase,
    dtype_fields=("attn_dtype", "kv_cache_dtype"),
    expand=expand_context,
    tp_sizes=lambda grid: tuple(grid.model_tp_sizes),
    dispatch={"torch": _torch, "vllm": _vllm, "sglang": _sglang, "trtllm": _trtllm},
    case_dispatch={"vllm": _vllm_case, "sglang": _sglang_context_case, "trtllm": _trtllm_case},
    cost=_context_cost,
    work=work,
)

GENERATION = OpPlan(
    name="attention_generation",
    family="attention",
    table="generation_attention_perf",
    op_name="generation_attention",
    case_type=AttentionCase,
    dtype_fields=("attn_dtype", "kv_cache_dtype"),
    expand=expand_generation,
    tp_sizes=lambda grid: tuple(grid.model_tp_sizes),
    dispatch={"torch": _torch, "vllm": _vllm, "sglang": _sglang, "trtllm": _trtllm},
    case_dispatch={"vllm": _vllm_case, "sglang": _sglang_generation_case, "trtllm": _trtllm_case},
    cost=_generation_cost,
    work=work,
)
