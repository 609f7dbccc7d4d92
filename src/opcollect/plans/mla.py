"""Multi-head latent attention (DeepSeek style), context and generation, with per-rank head counts.

Each per-rank head count is planned once, labelled with the smallest tp_size that gives it (see rank_labels).
"""

from __future__ import annotations

from typing import Mapping, NamedTuple

from opcollect.cases.grids import ContextMlaGrid, GenerationMlaGrid, MlaGrid
from opcollect.cases.profiles import ModelShapes
from opcollect.plans import selection_sglang
from opcollect.plans.base import Group, OpPlan, make_groups, refines
from opcollect.plans.gemm import model_origins
from opcollect.plans.work import Work, causal_pairs, format_of


class MlaCase(NamedTuple):
    mla_dtype: str
    kv_cache_dtype: str
    num_heads: int  # per rank
    batch_size: int
    isl: int
    tp_size: int
    step: int


# DeepSeek-V3's MLA per head (cases/models/DeepseekV3ForCausalLM.yaml): keys qk_nope 128 + rope 64, values 128,
# and the 512-wide latent (kv_lora) that the cache keeps with the 64-wide rope key
QK_NOPE, QK_ROPE, V_HEAD, KV_LORA = 128, 64, 128, 512
LATENT = KV_LORA + QK_ROPE  # 576: one cached token


def attention_work(c, kv_bytes: float, act_bytes: float) -> tuple[float, float, float]:
    """(pair FLOPs, kv_b FLOPs, bytes) of MLA's attention, each the least of its two legal forms.

    Expanded (prefill's form): QK^T over 192 and PV over 128 per (query, key) pair and head, 2 * 320 FLOPs, after
    kv_b expands each key's latent into K and V (2 * 512 * 256 FLOPs per key and head). Absorbed (decode's): W_UK
    and W_UV applied per query instead (the same 2 * 512 * 256 per query and head), then QK^T over 576 and PV over
    512 (2 * 1088 per pair and head). The least pair cost is the expanded one's, the least kv_b cost the absorbed
    one's (a query per key at most); their sum is below either form. Causal span as attention's (isl queries after
    step cached tokens). Q (192 wide) is read and O (128 wide) written once per query and head; each key crosses
    memory once, as its latent or its expanded K and V, whichever is smaller."""
    heads = c.num_heads * c.batch_size
    pairs = heads * 2.0 * (QK_NOPE + QK_ROPE + V_HEAD) * causal_pairs(c.isl, c.step, 0)
    kv_b = heads * c.isl * 2.0 * KV_LORA * (QK_NOPE + V_HEAD)
    per_key = min(LATENT, c.num_heads * (QK_NOPE + QK_ROPE + V_HEAD))
    keys = c.batch_size * (c.step + c.isl)
    moved = heads * c.isl * (QK_NOPE + QK_ROPE + V_HEAD) * act_bytes + keys * per_key * kv_bytes
    return pairs, kv_b, moved


def work(c: MlaCase) -> Work:
    """The MLA kernel alone (attention_work) at the MLA dtype's rate: kv_b is outside it (the kernel may be handed
    K and V expanded, or the query absorbed)."""
    a = format_of(c.mla_dtype)
    pairs, _, moved = attention_work(c, format_of(c.kv_cache_dtype).act, a.act)
    return Work({a.peak: pairs}, moved)


def rank_labels(totals, tp_sizes) -> dict[int, int]:
    """Each per-rank head count the totals give at these TP sizes, labelled with the smallest tp that gives it.

    The MLA kernel sees only the heads on its rank, so one head count is timed once; the reference tables
    label it as the collector does (SGLang collect_mla.py / TRT-LLM collect_mla.py keep the smallest tp of a
    duplicate), e.g. 64 heads as (64, tp 1) from a 64-head model rather than (64, tp 2) from a 128-head one.
    """
    labels: dict[int, int] = {}
    for total in totals:
        for tp in tp_sizes:
            if total % tp == 0 and tp < labels.get(total // tp, tp + 1):
                labels[total // tp] = tp
    return labels


def _expand(op: str, grid: MlaGrid, shapes: Mapping[str, ModelShapes], lengths: list[int], context: bool):
    base = {(h,) for h in grid.num_heads}
    origins = model_origins(base, shapes, "mla")
    # cases are keyed by heads per rank and tp_size; base head counts keep their label whatever models add
    labels = rank_labels(grid.num_heads, grid.tp_size)
    rank_origins = {}
    for heads, tp in rank_labels([total for (total,) in origins], grid.tp_size).items():
        if heads not in labels:
            labels[heads] = tp
            rank_origins[(heads, tp)] = frozenset(
                m
                for (total,), models in origins.items()
                if total % heads == 0 and total // heads in grid.tp_size
                for m in models
            )
    ranks = sorted(labels.items(), reverse=True)  # most heads per rank first
    rows = {}
    for p in grid.precisions:
        values = []
        for heads, tp in ranks:
            for batch in grid.batch_size:
                for length in lengths:
                    tokens = batch * length if context else batch * (length + 1)
                    if tokens <= grid.max_tokens:
                        isl, step = (length, 0) if context else (1, length)
                        values.append((p.mla_dtype, p.kv_cache_dtype, heads, batch, isl, tp, step))
        rows[(p.mla_dtype, p.kv_cache_dtype)] = values
    return make_groups(op, MlaCase, ("mla_dtype", "kv_cache_dtype"), rows, rank_origins, ("num_heads", "tp_size"))


def expand_context(grid: ContextMlaGrid, shapes) -> list[Group]:
    return _expand("mla_context", grid, shapes, grid.isl, context=True)


def expand_generation(grid: GenerationMlaGrid, shapes) -> list[Group]:
    return _expand("mla_generation", grid, shapes, grid.step, context=False)


# absorbed MLA per head: 576-wide keys (kv_lora 512 + rope 64), 512-wide values
def _context_cost(c: MlaCase) -> float:
    return 2.0 * c.batch_size * c.isl * c.isl * c.num_heads * (576 + 512)


def _generation_cost(c: MlaCase) -> float:
    return 2.0 * c.batch_size * (c.step + 1) * (c.num_heads * (576 + 512) + 576)


def _torch(sm: str, group: Group) -> str:
    return "torch.mla_absorbed"


def _vllm(sm: str, group: Group) -> str:
    # vLLM 0.24.0 selects the MLA backend by KV cache dtype (platforms/cuda.py:94-142): on SM90 FLASH_ATTN_MLA
    # takes a bf16 cache only (v1/attention/backends/mla/flashattn_mla.py:45-49,80-97), FLASHMLA the fp8 one
    # (flashmla.py:49-59); on the SM100 family FLASHINFER_MLA takes both (flashinfer_mla.py:38-106)
    if sm == "90":
        return "FLASH_ATTN_MLA" if group.constants.get("kv_cache_dtype") == "bfloat16" else "FLASHMLA"
    return "FLASHINFER_MLA" if sm in ("100", "103") else "TRITON_MLA"


@refines(("isl", "mla_dtype"))  # mla_dtype: the fp8 prefill query
def _vllm_context(sm: str, dispatch: str, case: MlaCase) -> str:
    # Prefill tokens beyond the backend's decode threshold run the prefill backend, FLASH_ATTN on SM90 and
    # first on SM100 (mla/prefill/selector.py:48-69): the threshold is 512 for FLASH_ATTN_MLA
    # (flashattn_mla.py:118), 128 for FLASHMLA (flashmla.py:121), 1 otherwise (mla_attention.py:1419, 1638-1644).
    # An fp8 query is served on the SM100 family only (mla_attention.py:1384-1386) with the prefill backend pinned
    # to TRTLLM_RAGGED, the selector's first fp8-query backend there (selector.py:59-65, mla_attention.py:1393-1397;
    # backends/vllm/mla.py FP8_PREFILL_BACKEND); the auto choice, FLASH_ATTN, would keep the bf16 query
    threshold = {"FLASH_ATTN_MLA": 512, "FLASHMLA": 128}.get(dispatch, 1)
    if case.isl <= threshold:
        return dispatch
    return "TRTLLM_RAGGED" if case.mla_dtype == "fp8" and sm in ("100", "103") else "FLASH_ATTN"


# SGLang's attention backend names as the reference labels their MLA rows: fa3 is flash_attention
# (collector/sglang/collect_mla.py:434-437; backends/sglang/mla.py MLA_SOURCE)
_SGLANG_MLA_LABELS = {"fa3": "flash_attention"}


def _sglang_phase(sm: str, group: Group | None, phase: str) -> str:
    """SGLang 0.5.14's MLA backend for DeepSeek's MLA in ``phase`` ("prefill" or "decode"): ServerArgs' own choice
    at this SM and KV cache dtype (cases/selection/sglang-0.5.14.yaml, written by scripts/selection_tables_sglang.py
    from server_args.py's DeepSeek branch :3636-3650 and _get_default_attn_backend :4456-4472). The KV cache is fp8
    when either dtype field says so (the reference puts the switch in mla_dtype; backends/sglang/mla.py fp8_cache)."""
    constants = getattr(group, "constants", None) or {}
    fp8 = "fp8" in (constants.get("mla_dtype"), constants.get("kv_cache_dtype"))
    chosen = selection_sglang.mla_backend(sm, "fp8" if fp8 else "bfloat16", phase)
    if chosen is not None:
        return _SGLANG_MLA_LABELS.get(chosen, chosen)
    # an SM the file does not cover: fa3 on Hopper (server_args.py:4456-4459), trtllm_mla for DeepSeek on
    # SM100/103 (:3636-3650), triton elsewhere (:4471-4472)
    if sm == "90":
        return "flash_attention"
    return "trtllm_mla" if sm in ("100", "103") else "triton"


def _sglang(sm: str, group: Group | None) -> str:
    return _sglang_phase(sm, group, "prefill")


def _sglang_generation(sm: str, group: Group | None) -> str:
    return _sglang_phase(sm, group, "decode")


def _trtllm(sm: str, group: Group) -> str:
    # TensorRT-LLM's MLA (the TRTLLM attention backend), labelled default by the reference collector
    # (collector/trtllm/collect_mla.py:668; the whole module: collect_mla_module.py:974)
    return "default"


def _mla_plan(name: str, table: str, op_name: str, expand, cost, sglang) -> OpPlan:
    return OpPlan(
        name=name,
        family="mla",
        table=table,
        op_name=op_name,
        case_type=MlaCase,
        dtype_fields=("mla_dtype", "kv_cache_dtype"),
        expand=expand,
        tp_sizes=lambda grid: tuple(grid.tp_size),
        dispatch={"torch": _torch, "vllm": _vllm, "sglang": sglang, "trtllm": _trtllm},
        cost=cost,
        work=work,
    )


CONTEXT = _mla_plan("mla_context", "context_mla_perf", "mla_context", expand_context, _context_cost, _sglang)
GENERATION = _mla_plan(
    "mla_generation", "generation_mla_perf", "mla_generation", expand_generation, _generation_cost, _sglang_generation
)
