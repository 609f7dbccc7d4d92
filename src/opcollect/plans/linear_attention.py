"""Linear attention, one kernel of one layer on one rank per row (family linear_attention): Gated DeltaNet
(gdn_perf: vLLM 0.24.0, SGLang 0.5.14, TensorRT-LLM 1.3.0rc20) and Mamba2 (mamba2_perf: TensorRT-LLM only).

Each shape point is two rows per phase, one per kernel the layer runs between its projections (the projection
GEMMs are gemm_perf's: cases/linear.py rank_gemms): the causal conv1d over the packed channels (``stage`` conv)
and the recurrence (``stage`` core), as the reference collector times them (collector/{vllm,sglang,trtllm}/
collect_gdn.py, collector/trtllm/collect_mamba2.py). Context rows: batch_size requests of seq_len new tokens each,
no earlier state (the chunked scan over the prompt); generation rows: one token per request (seq_len 1) with the
conv and recurrent states (the recurrent step). num_tokens = batch_size x seq_len. GDN heads are the rank's
(num_k_heads / tp, num_v_heads / tp) and d_model the model's hidden_size, a lookup key no kernel reads
(case_generator.py:2055-2063); Mamba2's heads are the whole layer's (collect_mamba2.py:161-207).

Columns: the reference's in order (framework ... kernel_source, phase, batch_size, seq_len, num_tokens, the layer's
dimensions, model_name, latency), then ``stage`` (OpPlan.after_latency), a column the reference lacks: there the
kernel_source tells the two rows of a shape apart; here the stage does too, so that a row's speed-of-light bound
(check R8) knows its kernel. model_name is the first model in the grid's order
that brings the shape (case_generator.py:2108-2120), metadata the consumer does not read
(aiconfigurator-core perf_database/state_space.rs:73-78).

Deliberate differences from the reference, none in the key columns: the framework column is opcollect's (the vLLM
collector writes ``vLLM`` here, collect_gdn.py:220, and ``VLLM`` everywhere else; the consumer reads neither);
shapes a kernel cannot launch (vLLM's and SGLang's packed decode at batch_size x value heads > 65,535, SGLang's
context conv at batch_size x seq_len x channels >= 2^31, collect_gdn.py of both) are planned and refused by their
runners before launch; the reference's TensorRT-LLM gdn table predates the collector's TP-local heads (tp 1
geometry only), planned here at every TP size like the others; TensorRT-LLM's Mamba2 SSM rows, absent from every
reference system (their calls raise inside the collector's try, collect_mamba2.py:409-411, 701-703), are planned.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple

from opcollect.cases.grids_linear import GdnGrid, Mamba2Grid
from opcollect.cases.linear import Gdn, Mamba2, gdn_rank_heads
from opcollect.cases.profiles import ModelShapes
from opcollect.errors import InputError
from opcollect.plans.base import Group, OpPlan, make_groups, refines
from opcollect.plans.work import Work

NOT_THIS_FRAMEWORK = "not-this-framework"  # as plans/comm.py's: skips.py drops it
STAGES = ("conv", "core")
PHASES = ("context", "generation")
DTYPES = ("stage", "phase")  # the table has no dtype column: the kernel and the phase label the groups


class GdnCase(NamedTuple):
    stage: str  # conv or core: which of the layer's two kernels (a column after latency)
    phase: str
    batch_size: int
    seq_len: int
    num_tokens: int
    d_model: int
    d_conv: int
    num_k_heads: int  # on the rank
    head_k_dim: int
    num_v_heads: int  # on the rank
    head_v_dim: int
    model_name: str


class Mamba2Case(NamedTuple):
    stage: str
    phase: str
    batch_size: int
    seq_len: int
    num_tokens: int
    d_model: int
    d_state: int
    d_conv: int
    nheads: int
    head_dim: int
    n_groups: int
    chunk_size: int
    model_name: str


GDN_SHAPE = ("d_model", "d_conv", "num_k_heads", "head_k_dim", "num_v_heads", "head_v_dim")
MAMBA2_SHAPE = ("d_model", "d_state", "d_conv", "nheads", "head_dim", "n_groups", "chunk_size")


def _profile(op: str, model: str, profile: str, shapes: Mapping[str, ModelShapes], kind: type):
    found = shapes.get(profile)
    if found is None or not isinstance(found.linear, kind):
        what = "no such model" if found is None else f"no {kind.__name__} layers"
        raise InputError(
            f"cases/base_ops/{op}.yaml: model {model!r} names profile {profile!r}: {what}; name a profile of "
            f"cases/models whose config has them (known: {', '.join(sorted(shapes))})"
        )
    return found.linear


def _gdn_geometry(layer: Gdn) -> tuple[int, ...]:
    return (layer.d_model, layer.d_conv, layer.num_k_heads, layer.head_k_dim, layer.num_v_heads, layer.head_v_dim)


def gdn_shapes(grid: GdnGrid, shapes: Mapping[str, ModelShapes]) -> dict[tuple, list[str]]:
    """Each rank shape (GDN_SHAPE order) -> the models that bring it, the first naming it: the grid's models at
    their TP sizes, then (more_models) every other GDN model at model_tp_sizes that split its heads."""
    found: dict[tuple, list[str]] = {}

    def add(label: str, geometry: tuple[int, ...], tp: int) -> None:
        d_model, d_conv, nk, hk, nv, hv = geometry
        found.setdefault((d_model, d_conv, nk // tp, hk, nv // tp, hv), []).append(label)

    listed = set()
    for m in grid.models:
        if m.profile is not None:
            listed.add(m.profile)
            geometry = _gdn_geometry(_profile("gdn", m.model, m.profile, shapes, Gdn))
        else:
            s = m.shape
            geometry = (s.d_model, s.d_conv, s.num_k_heads, s.head_k_dim, s.num_v_heads, s.head_v_dim)
        for tp in m.tp_sizes:
            if geometry[2] % tp or geometry[4] % tp:
                raise InputError(
                    f"cases/base_ops/gdn.yaml: model {m.model!r}: tp {tp} does not divide its {geometry[2]} key and "
                    f"{geometry[4]} value heads; list only TP sizes that split both (the collector refuses them "
                    "too, case_generator.py:2102-2106)"
                )
            add(m.model, geometry, tp)
    if grid.more_models:
        for name in sorted(shapes):
            layer = shapes[name].linear
            if name in listed or not isinstance(layer, Gdn):
                continue
            for tp in grid.model_tp_sizes:  # a TP size that does not split them is a note (cases/profiles.py)
                if gdn_rank_heads(layer, tp) is not None:
                    add(name, _gdn_geometry(layer), tp)
    return found


def mamba2_shapes(grid: Mamba2Grid, shapes: Mapping[str, ModelShapes]) -> dict[tuple, list[str]]:
    """Each layer shape (MAMBA2_SHAPE order) -> the models that bring it, the first naming it."""
    found: dict[tuple, list[str]] = {}
    listed = set()
    for m in grid.models:
        if m.profile is not None:
            listed.add(m.profile)
            layer = _profile("mamba2", m.model, m.profile, shapes, Mamba2)
            geometry = tuple(getattr(layer, name) for name in MAMBA2_SHAPE)
        else:
            geometry = tuple(getattr(m.shape, name) for name in MAMBA2_SHAPE)
        found.setdefault(geometry, []).append(m.model)
    if grid.more_models:
        for name in sorted(shapes):
            layer = shapes[name].linear
            if name not in listed and isinstance(layer, Mamba2):
                found.setdefault(tuple(getattr(layer, f) for f in MAMBA2_SHAPE), []).append(name)
    return found


def _expand(op: str, case_type: type, shape_fields: tuple[str, ...], grid, found: dict[tuple, list[str]]):
    rows: dict[tuple, list[tuple]] = {}
    for stage in STAGES:
        context = rows.setdefault((stage, "context"), [])
        generation = rows.setdefault((stage, "generation"), [])
        for shape, models in found.items():
            label = models[0]
            context.extend(
                (stage, "context", b, s, b * s, *shape, label)
                for b in grid.context_batch_size
                for s in grid.context_seq_len
            )
            generation.extend((stage, "generation", b, 1, b, *shape, label) for b in grid.generation_batch_size)
    ordered = {key: rows[key] for key in ((stage, phase) for phase in PHASES for stage in STAGES)}
    origins = {shape: frozenset(models) for shape, models in found.items()}
    return make_groups(op, case_type, DTYPES, ordered, origins, shape_fields)


def expand_gdn(grid: GdnGrid, shapes: Mapping[str, ModelShapes]) -> list[Group]:
    return _expand("gdn", GdnCase, GDN_SHAPE, grid, gdn_shapes(grid, shapes))


def expand_mamba2(grid: Mamba2Grid, shapes: Mapping[str, ModelShapes]) -> list[Group]:
    return _expand("mamba2", Mamba2Case, MAMBA2_SHAPE, grid, mamba2_shapes(grid, shapes))


# --- dispatch: the kernel each framework's collector times and labels, per SM ---


def _key(group: Group) -> tuple[str, str]:
    return str(group.constants["stage"]), str(group.constants["phase"])


def _labels(table: Mapping[tuple[str, str], str]):
    def dispatch(sm: str, group: Group) -> str:
        return table[_key(group)]

    return dispatch


CONV = {("conv", "context"): "causal_conv1d_fn", ("conv", "generation"): "causal_conv1d_update"}
FLASHINFER = "chunk_gated_delta_rule_flashinfer"
TRITON = "chunk_gated_delta_rule_triton"


def _vllm_gdn(sm: str, group: Group) -> str:
    """vLLM 0.24.0: causal_conv1d_fn and causal_conv1d_update (model_executor/layers/mamba/ops/causal_conv1d.py:468,
    :1069); decode the packed fused_recurrent_gated_delta_rule_packed_decode (fla/ops/fused_recurrent.py:339), the
    serving non-spec decode path (gdn/qwen_gdn_linear_attn.py:1644-1690, VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE on
    by default, envs.py:115); prefill ChunkGatedDeltaRule's backend, labelled chunk_gated_delta_rule_{backend}
    (collector/vllm/collect_gdn.py:101-107, :333): _resolve_gdn_prefill_backend (qwen_gdn_linear_attn.py:150-214)
    takes FlashInfer on SM90, on the SM100 family with linear_key_head_dim 128 under CUDA 13 (_gdn_sm100 refines
    it), Triton elsewhere."""
    stage, phase = _key(group)
    if stage == "conv":
        return CONV[(stage, phase)]
    if phase == "generation":
        return "fused_recurrent_gated_delta_rule_packed_decode"
    return FLASHINFER if sm in ("90", "100", "103") else TRITON


@refines(("head_k_dim",), dispatches=(FLASHINFER,))
def _gdn_sm100(sm: str, dispatch: str, c: GdnCase) -> str:
    """On the SM100 family FlashInfer's GDN prefill needs head_k_dim 128 (qwen_gdn_linear_attn.py:187-192, with
    CUDA runtime 13 and an intact cutlass-dsl cu13 install: the consumer's B200/B300/GB200/GB300 vLLM 0.24.0
    gdn_perf tables, collected at the same image, hold _flashinfer rows only); any other head_k_dim is Triton's."""
    if dispatch != FLASHINFER or sm not in ("100", "103"):
        return dispatch
    return FLASHINFER if c.head_k_dim == 128 else TRITON


# SGLang 0.5.14 (collector/sglang/collect_gdn.py:267, 300, 450, 483): the CUDA causal_conv1d_fn (srt/layers/
# attention/mamba/causal_conv1d.py:32, rebound on CUDA by gdn_backend.py:34-39), FLA's chunk_gated_delta_rule
# (srt/layers/attention/fla/chunk.py:133), the Triton causal_conv1d_update serving keeps for decode
# (causal_conv1d_triton.py:991, gdn_backend.py:13-16, :319) and the packed recurrent decode (fla/fused_recurrent.py:
# 268). Its SM100 FlashInfer decode needs mamba_ssm_dtype bfloat16 (server_args.py:4884-4900); every Qwen3.5 config
# the consumer ships keeps float32, so every SM runs these.
SGLANG = {**CONV, ("core", "context"): "chunk_gated_delta_rule"}
SGLANG[("core", "generation")] = "fused_recurrent_gated_delta_rule_packed_decode"
# TensorRT-LLM 1.3.0rc20 (collector/trtllm/collect_gdn.py:229, 256, 464, 507): modules/mamba/causal_conv1d.py's
# causal_conv1d_fn and causal_conv1d_update, the vendored FLA chunk_gated_delta_rule (modules/fla/chunk.py) and
# fused_recurrent_gated_delta_rule (modules/fla/fused_recurrent.py), on every SM
TRTLLM_GDN = {**CONV, ("core", "context"): "chunk_gated_delta_rule"}
TRTLLM_GDN[("core", "generation")] = "fused_recurrent_gated_delta_rule"
# TensorRT-LLM's Mamba2 mixer kernels (collector/trtllm/collect_mamba2.py:340, 396, 635, 688): the conv as GDN's,
# modules/mamba/ssd_combined.py's mamba_chunk_scan_combined and selective_state_update.py's selective_state_update
TRTLLM_MAMBA2 = {**CONV, ("core", "context"): "mamba_chunk_scan_combined"}
TRTLLM_MAMBA2[("core", "generation")] = "selective_state_update"
# the torch backend's references (backends/torch/linear_attention.py)
TORCH_CONV = {("conv", "context"): "torch_causal_conv1d", ("conv", "generation"): "torch_causal_conv1d_update"}
TORCH_GDN = {**TORCH_CONV, ("core", "context"): "torch_gdn_chunked_scan"}
TORCH_GDN[("core", "generation")] = "torch_gdn_recurrent_step"
TORCH_MAMBA2 = {**TORCH_CONV, ("core", "context"): "torch_ssd_chunked_scan"}
TORCH_MAMBA2[("core", "generation")] = "torch_selective_state_update"

GDN_DISPATCH = {
    "vllm": _vllm_gdn,
    "sglang": _labels(SGLANG),
    "trtllm": _labels(TRTLLM_GDN),
    "torch": _labels(TORCH_GDN),
}
# only TensorRT-LLM's collector times Mamba2 (collector/trtllm/registry.py:84-97; vLLM's and SGLang's register gdn
# alone, collector/vllm/registry.py:173-176, collector/sglang/registry.py:326); plans/skips.py says why
MAMBA2_DISPATCH = {
    "vllm": lambda sm, group: NOT_THIS_FRAMEWORK,
    "sglang": lambda sm, group: NOT_THIS_FRAMEWORK,
    "trtllm": _labels(TRTLLM_MAMBA2),
    "torch": _labels(TORCH_MAMBA2),
}


# --- the least work of one kernel call (plans/work.py) ---
# Lower bounds for every framework's row of the key: the conv over the channels the narrowest runner convolves
# (TensorRT-LLM's GDN collector convolves the nk x hk key channels only, collect_gdn.py:157-168; vLLM and SGLang the
# packed 2 nk hk + nv hv), states and activations at 2 bytes (TensorRT-LLM's GDN decode state is bf16, vLLM's and
# SGLang's fp32), the recurrence's FLOPs of its sequential form (4 x state size per token: the state update and the
# output) at the bf16 tensor-core rate, faster than the CUDA cores the recurrent kernels run on.
BF16 = "bfloat16"


def gdn_work(c: GdnCase) -> Work:
    tokens, key, value = c.num_tokens, c.num_k_heads * c.head_k_dim, c.num_v_heads * c.head_v_dim
    state = c.num_v_heads * c.head_k_dim * c.head_v_dim  # one request's recurrent state
    if c.stage == "conv":
        moved = 2 * 2 * tokens * key + 2 * key * c.d_conv
        if c.phase == "generation":
            moved += 2 * 2 * c.batch_size * key * (c.d_conv - 1)  # the conv state read and written
        return Work({BF16: 2.0 * tokens * key * c.d_conv}, moved)
    moved = 2 * tokens * (2 * key + value + 2 * c.num_v_heads) + 2 * tokens * value  # q k v g beta in, out
    if c.phase == "generation":
        moved += 2 * 2 * c.batch_size * state  # the recurrent state read and written
    return Work({BF16: 4.0 * tokens * state}, moved)


def mamba2_work(c: Mamba2Case) -> Work:
    tokens, inner = c.num_tokens, c.nheads * c.head_dim
    state = inner * c.d_state  # one request's SSM state
    if c.stage == "conv":
        channels = inner + 2 * c.n_groups * c.d_state
        moved = 2 * 2 * tokens * channels + 2 * channels * c.d_conv
        if c.phase == "generation":
            moved += 2 * 2 * c.batch_size * channels * (c.d_conv - 1)
        return Work({BF16: 2.0 * tokens * channels * c.d_conv}, moved)
    # x, dt, B, C in and y out; context writes the final states, a decode step reads and writes them
    moved = 2 * tokens * (2 * inner + c.nheads + 2 * c.n_groups * c.d_state)
    moved += 2 * c.batch_size * state * (2 if c.phase == "generation" else 1)
    return Work({BF16: 4.0 * tokens * state}, moved)


def _cost(work):
    def cost(c) -> float:
        found = work(c)
        return sum(found.flops.values()) + found.bytes

    return cost


GDN = OpPlan(
    name="gdn",
    family="linear_attention",
    table="gdn_perf",
    op_name="gdn",
    case_type=GdnCase,
    dtype_fields=DTYPES,
    expand=expand_gdn,
    tp_sizes=lambda grid: tuple(grid.model_tp_sizes),
    dispatch=GDN_DISPATCH,
    cost=_cost(gdn_work),
    after_latency=("stage",),
    case_dispatch={"vllm": _gdn_sm100},
    work=gdn_work,
)
MAMBA2 = OpPlan(
    name="mamba2",
    family="linear_attention",
    table="mamba2_perf",
    op_name="mamba2",
    case_type=Mamba2Case,
    dtype_fields=DTYPES,
    expand=expand_mamba2,
    tp_sizes=lambda grid: (),
    dispatch=MAMBA2_DISPATCH,
    cost=_cost(mamba2_work),
    after_latency=("stage",),
    work=mamba2_work,
)
