"""Mixture-of-experts layers at every valid (moe_tp_size, moe_ep_size) split of each model's experts."""

from __future__ import annotations

from itertools import product
from typing import Mapping, NamedTuple

from opcollect.cases.grids import MoeGrid
from opcollect.cases.profiles import ModelShapes
from opcollect.names import SGLANG_MOE_LABELS
from opcollect.plans import selection, selection_sglang
from opcollect.plans.base import Group, OpPlan, make_groups, refines, sm_at_least
from opcollect.plans.gemm import model_origins
from opcollect.plans.work import Work, format_of


class MoeCase(NamedTuple):
    moe_dtype: str
    num_tokens: int
    hidden_size: int
    inter_size: int  # the model's expert inter size; each rank holds inter_size / moe_tp_size
    topk: int
    num_experts: int
    moe_tp_size: int
    moe_ep_size: int
    distribution: str


def rank0_load(tokens: int, experts: int, topk: int, ep: int) -> tuple[int, int]:
    """(token-expert pairs, distinct experts) on EP rank 0, the timed rank, at least.

    Each token takes topk distinct experts, tokens * topk pairs in all; rank 0 is taken to carry at least its
    mean share of them (the reference's power law puts its busiest rank first, backends/torch/routing.py; its
    balanced logits aim at an even spread), over at least pairs / tokens experts (an expert takes a token once).
    Nothing more is assumed of the spread: a framework's own router re-picks experts from the logits (DeepSeek's
    grouped top-k keeps 4 of 8 groups), and the reference's balanced DeepSeek rows read about 150 of 256 experts'
    weights, not all of them.
    """
    pairs = tokens * topk // ep
    return pairs, min(experts // ep, -(-pairs // tokens))


def work(c: MoeCase) -> Work:
    """Rank 0's routed pairs (rank0_load) each through the expert MLP: gate and up [H -> 2I/tp] and down
    [I/tp -> H], or up and down for a non-gated (ReLU2) expert, 2 FLOPs per weight per pair; each expert that
    takes a token has its weights read once, and each token routed here is read and written once (bf16 out)."""
    f = format_of(c.moe_dtype)
    pairs, touched = rank0_load(c.num_tokens, c.num_experts, c.topk, c.moe_ep_size)
    matrices = 2 if _nemotron_h(c) else 3
    expert = matrices * c.hidden_size * (c.inter_size // c.moe_tp_size)  # weights of one expert on this rank
    rows = -(-pairs // min(c.topk, c.num_experts // c.moe_ep_size))  # tokens with a pair here, at least
    return Work({f.peak: 2.0 * pairs * expert}, touched * expert * f.weight + rows * c.hidden_size * (f.act + 2))


# Per-rank inter_size must be a whole number of weight blocks: 128x128 block-scaled fp8 experts refuse anything
# else (vLLM 0.24.0 model_executor/layers/quantization/fp8.py:Fp8MoEMethod.create_weights raises "is not
# divisible by weight quantization block_n"; the collector's TRT-LLM and SGLang harnesses raise the same).
BLOCK_INTER = {"fp8_block": 128}


def splits(gpus: list[int], inter: int, experts: int, max_tp: int | None = None) -> list[tuple[int, int]]:
    """(tp, ep) with tp x ep in gpus, tp <= max_tp, ep <= experts, experts % ep == 0 and inter % tp == 0."""
    found = []
    for total in gpus:
        for tp in range(1, total + 1):
            if total % tp or (max_tp is not None and tp > max_tp):
                continue
            ep = total // tp
            if ep <= experts and experts % ep == 0 and inter % tp == 0:
                found.append((tp, ep))
    return sorted(set(found))


def served_dtypes(grid: MoeGrid) -> dict[tuple[int, int, int, int], list[str]]:
    """The formats each listed shape is served in (its own list, else the grid's)."""
    return {(s.hidden_size, s.inter_size, s.topk, s.num_experts): s.dtypes or grid.dtypes for s in grid.shapes}


def expand(grid: MoeGrid, shapes: Mapping[str, ModelShapes]) -> list[Group]:
    served = served_dtypes(grid)
    origins = model_origins(set(served), shapes, "moe")
    configs = sorted(served.keys() | origins.keys())
    # groups in the grid's dtype order, then the formats only some shapes are served in
    dtypes = list(dict.fromkeys([*grid.dtypes, *(d for s in grid.shapes for d in s.dtypes or ())]))
    split_of = {
        (inter, experts): splits(grid.gpus, inter, experts, grid.max_tp_size) for _, inter, _, experts in configs
    }
    rows = {}
    for dtype in dtypes:
        block = BLOCK_INTER.get(dtype, 1)
        values = []
        for hidden, inter, topk, experts in configs:
            if dtype not in served.get((hidden, inter, topk, experts), grid.dtypes):
                continue
            for tp, ep in split_of[(inter, experts)]:
                if (inter // tp) % block:
                    continue
                for distribution in grid.distributions:
                    fixed = ((hidden,), (inter,), (topk,), (experts,), (tp,), (ep,), (distribution,))
                    values.extend(product((dtype,), grid.num_tokens, *fixed))
        if values:
            rows[(dtype,)] = values
    return make_groups(
        "moe", MoeCase, ("moe_dtype",), rows, origins, ("hidden_size", "inter_size", "topk", "num_experts")
    )


def _cost(c: MoeCase) -> float:
    local_inter = c.inter_size // c.moe_tp_size
    local_experts = c.num_experts // c.moe_ep_size
    weights = 3.0 * local_experts * c.hidden_size * local_inter
    return 6.0 * c.num_tokens * c.topk * c.hidden_size * local_inter / c.moe_ep_size + weights


def _torch(sm: str, group: Group) -> str:
    # torch._grouped_mm runs bf16 grouped GEMMs on Hopper and newer; elsewhere one GEMM per expert
    return "torch._grouped_mm" if sm_at_least(sm, 90) else "per_expert_loop"


def _moe_label(method: str, backend: str, experts: str) -> str:
    """The kernel_source of a vLLM MoE as the reference records it: quant method (without 'Method'), the
    oracle's backend and the experts class, lowercase, spaces as '_'."""
    return f"vllm_{method}_{backend}_{experts}".lower().replace(" ", "_").replace("-", "_")


def _vllm(sm: str, group: Group) -> str:
    """vLLM 0.24.0's experts kernel per quant mode: the first backend of the mode's oracle whose experts class
    supports the device and scheme (model_executor/layers/fused_moe/oracle/*.py); _vllm_case refines by case.

    The oracle's own answer where cases/selection has one (scripts/selection_tables.py runs it per SM): the label
    when TP and EP splits share it, else the dtype for _vllm_case to split. The rules below are the fallback."""
    if group.dtype in _VLLM_BY_MODEL:
        return group.dtype
    chosen = selection.vllm_moe(sm, group.dtype)
    if chosen is not None:
        return chosen
    if selection.vllm_moe(sm, group.dtype, expert_parallel=False) is not None:
        return group.dtype  # TP and EP differ: _vllm_case
    family100 = sm in ("100", "103")
    if group.dtype == "bfloat16":
        # oracle/unquantized.py:152-254: FlashInfer moves to the back on SM90, so Triton; TRT-LLM bf16 on SM100
        if family100:
            return _moe_label("UnquantizedFusedMoE", "FlashInfer TRTLLM", "TrtLlmBf16Experts")
        return _moe_label("UnquantizedFusedMoE", "TRITON", "TritonExperts")
    if group.dtype == "fp8":
        # a static per-tensor fp8 checkpoint (ModelOptFp8Config): oracle/fp8.py:75-88 order; TRT-LLM on the SM100
        # family (experts/trtllm_fp8_moe.py:64-71), FlashInfer CUTLASS from SM90 (flashinfer_cutlass_moe.py:132-175)
        if family100:
            return _moe_label("ModelOptFp8MoE", "FLASHINFER_TRTLLM", "TrtLlmFp8ExpertsMonolithic")
        if sm == "90":
            return _moe_label("ModelOptFp8MoE", "FLASHINFER_CUTLASS", "FlashInferExperts")
        return _moe_label("ModelOptFp8MoE", "TRITON", "TritonExperts")
    if group.dtype == "fp8_block":
        if family100:  # oracle/fp8.py:75-77
            return _moe_label("Fp8MoE", "FLASHINFER_TRTLLM", "TrtLlmFp8ExpertsMonolithic")
        return "fp8_block"  # by its expert split: _vllm_case
    if group.dtype == "int4_wo":
        # compressed-tensors int4 group: oracle/int_wna16.py:79-93, TRT-LLM MxInt4 on the SM100 family, else Marlin
        if family100:
            return _moe_label("CompressedTensorsWNA16MarlinMoE", "FLASHINFER_TRTLLM", "TrtLlmMxint4ExpertsMonolithic")
        return _moe_label("CompressedTensorsWNA16MarlinMoE", "MARLIN", "MarlinExperts")
    if group.dtype == "w4a16_mxfp4":
        return "w4a16_mxfp4"  # by model: _vllm_case
    if group.dtype == "nvfp4":
        return _moe_label("ModelOptNvFp4FusedMoE", "FLASHINFER_TRTLLM", "TrtLlmNvFp4ExpertsMonolithic")
    if group.dtype == "w4a8_mxfp4_mxfp8":
        return "flashinfer_trtllm_mxfp4_mxfp8" if family100 else "flashinfer_cutlass_mxfp4_mxfp8"
    return _moe_label("UnquantizedFusedMoE", "TRITON", "TritonExperts")


# gpt-oss's experts (hidden and inter size 2880) load through its own Mxfp4Config; other MXFP4 checkpoints
# (Kimi) through compressed-tensors
_GPT_OSS = (2880, 2880)
_VLLM_BY_MODEL = ("w4a16_mxfp4",)  # the quant method depends on the model: _vllm_case
# the dtypes _vllm may leave to _vllm_case: the oracle's answer differs between TP and EP splits
_VLLM_SPLIT = ("bfloat16", "fp8", "fp8_block", "int4_wo", "nvfp4", "w4a8_mxfp4_mxfp8")


@refines(("moe_ep_size", "hidden_size", "inter_size"), (*_VLLM_SPLIT, *_VLLM_BY_MODEL))
def _vllm_case(sm: str, dispatch: str, case: MoeCase) -> str:
    expert_parallel = case.moe_ep_size > 1
    gpt_oss = (case.hidden_size, case.inter_size) == _GPT_OSS
    if dispatch in _VLLM_SPLIT or (dispatch == "w4a16_mxfp4" and gpt_oss):
        # the oracle's answer for this split (cases/selection; gpt-oss's GptOssMxfp4MoEMethod for MXFP4)
        chosen = selection.vllm_moe(sm, dispatch, expert_parallel)
        if chosen is not None:
            return chosen
    if dispatch == "fp8_block":
        # oracle/fp8.py:105-115: on exactly SM90 expert parallelism puts FlashInfer CUTLASS first, else Triton
        if sm == "90" and case.moe_ep_size > 1:
            return _moe_label("Fp8MoE", "FLASHINFER_CUTLASS", "FlashInferExperts")
        return _moe_label("Fp8MoE", "TRITON", "TritonExperts")
    if dispatch == "w4a16_mxfp4":
        if (case.hidden_size, case.inter_size) == _GPT_OSS:
            # oracle/mxfp4.py:304-323: TRT-LLM on the SM100 family, OAI Triton kernels on SM 9.0-10.x
            # (experts/gpt_oss_triton_kernels_moe.py:37-50), monolithic: routing inside the kernel
            if sm in ("100", "103"):
                return _moe_label("GptOssMxfp4MoE", "FLASHINFER_TRTLLM_MXFP4_BF16", "TrtLlmMxfp4ExpertsMonolithic")
            return _moe_label("GptOssMxfp4MoE", "TRITON", "OAITritonMxfp4ExpertsMonolithic")
        # compressed-tensors MXFP4 runs Marlin with the reference collector's silu for Kimi's activation
        return _moe_label("CompressedTensorsW4A4Mxfp4MoE", "MARLIN", "MarlinExperts") + "_situ_as_silu"
    return dispatch


def _sglang(sm: str, group: Group) -> str:
    """SGLang 0.5.14's MoE runner per quant mode, named as the reference labels it (collector/sglang/
    collect_moe.py:598-604). Where cases/selection/sglang-0.5.14.yaml covers the SM, the runner depends on the
    model and EP size (ServerArgs' choice): the dtype is returned and _sglang_case decides. Paths are in the
    wheel's sglang/srt/."""
    if selection_sglang.table(selection_sglang.FILE).get(selection_sglang._sm(sm)):
        return group.dtype
    return _sglang_auto(sm, group.dtype)


def _sglang_auto(sm: str, dtype: str) -> str:
    """The runner a quant method resolves "auto" to, or the dtype where the model decides (_sglang_model)."""
    family100 = sm in ("100", "103")
    if dtype == "nvfp4":
        # ModelOptNvFp4FusedMoEMethod.create_moe_runner in auto: Marlin on SM 8.0-9.x, else FlashInfer TRT-LLM
        # (layers/quantization/modelopt_quant.py:2317-2324); ServerArgs turns SM120's auto into FlashInfer CUTLASS
        # first (server_args.py:5096-5104)
        if sm_at_least(sm, 80) and not sm_at_least(sm, 100):
            return "sglang_marlin_moe"
        return "sglang_flashinfer_cutlass_moe" if sm == "120" else "sglang_flashinfer_trtllm_moe"
    if dtype == "w4a8_mxfp4_mxfp8" and family100:
        return "sglang_flashinfer_trtllm_moe"
    if dtype == "int4_wo":
        # compressed-tensors int4 experts in auto: CompressedTensorsWNA16MoE, Marlin, on every SM
        # (layers/quantization/compressed_tensors/compressed_tensors.py:689-697; its runner
        # schemes/compressed_tensors_wNa16_moe.py:412-416); only ServerArgs' DeepSeek branch sets flashinfer_trtllm,
        # for Kimi-K2/K2.5's int4 group-32 recipe on SM100 (server_args.py:3683-3737), which the file records
        return "sglang_marlin_moe"
    return dtype  # the runner depends on the model: _sglang_model


# NemotronH's experts (hidden, inter, experts, topk) in the grids: their own MoE defaults apply
_NEMOTRON_H = {(2688, 1856, 128, 6), (2048, 5120, 512, 22), (8192, 5120, 512, 22)}


def _nemotron_h(case: MoeCase) -> bool:
    return (case.hidden_size, case.inter_size, case.num_experts, case.topk) in _NEMOTRON_H


_DEEPSEEK_HIDDEN = 7168  # DeepSeek-V3 and Kimi-K2.5: SGLang forces flashinfer_trtllm for them on SM100

_SGLANG_DTYPES = ("bfloat16", "fp8", "fp8_block", "w4a8_mxfp4_mxfp8", "w4a16_mxfp4", "nvfp4", "int4_wo")


@refines(("hidden_size", "inter_size", "num_experts", "topk", "moe_ep_size"), _SGLANG_DTYPES)
def _sglang_case(sm: str, dispatch: str, case: MoeCase) -> str:
    shape = (case.hidden_size, case.inter_size, case.topk, case.num_experts)
    # ServerArgs' --moe-runner-backend for this model on this SM (scripts/selection_tables_sglang.py runs
    # server_args.py:_handle_model_specific_adjustments and _handle_moe_kernel_config of the pinned wheel); "auto"
    # leaves it to the quant method at layer build: _sglang_auto, then the model rules for Triton's dtypes.
    # server_args.py:3914-3934 gives gpt-oss triton_kernel only with quantization None, EP 1 and triton_kernels
    # installed, which the file evaluates (its environment: the image's packages).
    chosen = selection_sglang.moe_runner_backend(sm, shape, dispatch, case.moe_ep_size)
    if chosen is not None and chosen != "auto":
        return SGLANG_MOE_LABELS.get(chosen, f"sglang_{chosen}_moe")
    auto = _sglang_auto(sm, dispatch) if dispatch in _SGLANG_DTYPES else dispatch
    if chosen == "auto":
        if auto not in ("bfloat16", "fp8", "fp8_block", "w4a8_mxfp4_mxfp8", "w4a16_mxfp4"):
            return auto
        if auto == "w4a16_mxfp4" and case.num_experts == 896:
            return "sglang_marlin_moe_situ_as_silu"  # not reached: Kimi-K3 has no entry (UNKNOWN_MOE)
        # auto resolves to the Triton runner (layers/quantization/unquant.py:405-421; fp8.py:889-903 takes
        # DeepGEMM only with a DeepEP/Mooncake/NIXL all-to-all; mxfp4.py without flashinfer_mxfp4)
        return "sglang_fused_moe_triton"
    return _sglang_model(sm, auto, case)


def _sglang_model(sm: str, dispatch: str, case: MoeCase) -> str:
    """Hand rules for SMs and models the selection file does not cover."""
    family100 = sm in ("100", "103")
    if dispatch == "w4a16_mxfp4":
        if case.num_experts == 896:
            # Kimi-K3's 896 MXFP4 experts: 0.5.14 has no KimiK3 architecture (so no ServerArgs branch); the
            # reference collector serves them with Marlin under SiLU on every SM (collector/sglang cases
            # KimiK3ForConditionalGeneration_cases.yaml:46-72)
            return "sglang_marlin_moe_situ_as_silu"
        if family100:  # gpt-oss MXFP4 on SM100: flashinfer_mxfp4 (server_args.py:3876-3881)
            return "sglang_flashinfer_trtllm_moe"
        if sm == "120":
            return "sglang_marlin_moe"  # gpt-oss MXFP4 on SM120 (server_args.py:3882-3887)
        return "sglang_fused_moe_triton"  # gpt-oss on Hopper: auto, Triton (the image has no triton_kernels)
    if dispatch not in ("bfloat16", "fp8", "fp8_block", "w4a8_mxfp4_mxfp8"):
        return dispatch
    if _nemotron_h(case) and dispatch == "bfloat16":
        # apply_nemotron_h_defaults (arg_groups/nemotron_h_hook.py:36-58): flashinfer_trtllm on SM100 without
        # all-to-all, else flashinfer_cutlass
        return "sglang_flashinfer_trtllm_moe" if family100 else "sglang_flashinfer_cutlass_moe"
    if family100 and case.hidden_size == _DEEPSEEK_HIDDEN:
        return "sglang_flashinfer_trtllm_moe"  # server_args.py:3683-3737
    # auto resolves to the Triton runner (layers/quantization/unquant.py:405-421; fp8.py:889-903 takes DeepGEMM
    # only with a DeepEP/Mooncake/NIXL all-to-all)
    return "sglang_fused_moe_triton"


def _trtllm(sm: str, group: Group) -> str:
    """TensorRT-LLM's create_moe backend, labelled as the reference collector labels it (collector/trtllm/
    collect_moe.py:761-788, first match): MXFP4 experts run its Triton MoE on Hopper (gpt-oss: :428-442, after
    TensorRT-LLM's resolve_moe_backend) and trtllm-gen on Blackwell, both moe_torch_flow; block fp8 on SM100 is
    deepgemm; gated experts elsewhere run CUTLASS (:466-479); non-gated ones: _trtllm_case."""
    if group.dtype in ("w4a16_mxfp4", "w4a8_mxfp4_mxfp8"):
        return "moe_torch_flow"
    if group.dtype == "fp8_block" and sm in ("100", "103"):
        return "deepgemm"
    return "moe_torch_flow_cutlass"


@refines(("hidden_size", "inter_size", "num_experts", "topk"), ("moe_torch_flow_cutlass", "moe_torch_flow"))
def _trtllm_case(sm: str, dispatch: str, case: MoeCase) -> str:
    # Nemotron-3's experts are non-gated ReLU2 (collect_moe.py:42,364-377; NemotronHMOE passes Relu2 to create_moe)
    if dispatch == "moe_torch_flow_cutlass" and _nemotron_h(case):
        return "moe_torch_flow_nongated"
    # TensorRT-LLM's resolve_moe_backend gives Triton to gpt-oss alone on Hopper; another MXFP4 checkpoint (Kimi-K3)
    # resolves to CUTLASS there, its WFP4A16 method (tensorrt_llm/_torch/model_config.py resolve_moe_backend,
    # cited at 1.3.0rc20 by collect_moe.py:428-454; fused_moe/quantization.py WFP4A16FusedMoEMethod)
    if dispatch == "moe_torch_flow" and sm == "90" and (case.hidden_size, case.inter_size) != _GPT_OSS:
        return "moe_torch_flow_cutlass"
    return dispatch


PLAN = OpPlan(
    name="moe",
    family="moe",
    table="moe_perf",
    op_name="moe",
    case_type=MoeCase,
    dtype_fields=("moe_dtype",),
    expand=expand,
    tp_sizes=lambda grid: tuple(sorted(set(grid.gpus))),
    dispatch={"torch": _torch, "vllm": _vllm, "sglang": _sglang, "trtllm": _trtllm},
    case_dispatch={"vllm": _vllm_case, "sglang": _sglang_case, "trtllm": _trtllm_case},
    cost=_cost,
    work=work,
)
