"""MLA generation's absorb BMMs at one rank (mla_bmm_perf), DeepSeek-V3 dimensions (qk_nope 128, kv_lora 512, v 128).

mla_gen_pre: q_nope [heads, tokens, 128] x W_UK -> [heads, tokens, 512], before MLA decode; mla_gen_post: the
attention output [heads, tokens, 512] x W_UV -> [heads, tokens, 128], after it. op_name is a case field, as the
table's op_name column is per row. num_heads are the heads on the rank.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple

from opcollect.cases.grids import MlaBmmGrid
from opcollect.cases.profiles import ModelShapes
from opcollect.plans.base import Group, OpPlan, make_groups
from opcollect.plans.work import Work, format_of

QK_NOPE, KV_LORA, V_HEAD = 128, 512, 128
# (in, out) width per head of each BMM
WIDTHS = {"mla_gen_pre": (QK_NOPE, KV_LORA), "mla_gen_post": (KV_LORA, V_HEAD)}


class MlaBmmCase(NamedTuple):
    op_name: str  # mla_gen_pre or mla_gen_post
    bmm_dtype: str
    num_tokens: int
    num_heads: int  # per rank


def work(c: MlaBmmCase) -> Work:
    """Per head a [tokens, in] x [in, out] product: 2 * in * out FLOPs per token and head at the BMM dtype's rate;
    the activation read and the weight read once at the BMM dtype's width, the output written once in bf16."""
    f = format_of(c.bmm_dtype)
    d_in, d_out = WIDTHS.get(c.op_name, (KV_LORA, KV_LORA))
    heads = c.num_heads
    flops = 2.0 * heads * c.num_tokens * d_in * d_out
    moved = heads * (c.num_tokens * d_in * f.act + d_in * d_out * f.weight + c.num_tokens * d_out * 2)
    return Work({f.peak: flops}, moved)


def rank_heads(shapes: Mapping[str, ModelShapes], tp_sizes: list[int]) -> dict[int, set[str]]:
    """Heads per rank of each MLA model at each TP size that divides its heads, with the models giving them."""
    found: dict[int, set[str]] = {}
    for model, model_shapes in shapes.items():
        for (total,) in model_shapes.mla:
            for tp in tp_sizes:
                if total % tp == 0:
                    found.setdefault(total // tp, set()).add(model)
    return found


def expand(grid: MlaBmmGrid, shapes: Mapping[str, ModelShapes]) -> list[Group]:
    base = set(grid.num_heads)
    origins = {(heads,): frozenset(models) for heads, models in rank_heads(shapes, grid.model_tp_sizes).items()}
    origins = {key: models for key, models in origins.items() if key[0] not in base}
    heads = sorted(base | {h for (h,) in origins}, reverse=True)  # most heads first, as the reference lists them
    # run order: pre then post, most heads first, tokens ascending
    order = [(op_name, h, tokens) for op_name, counts in grid.num_tokens.items() for h in heads for tokens in counts]
    rows = {(dtype,): [(op_name, dtype, tokens, h) for op_name, h, tokens in order] for dtype in grid.dtypes}
    return make_groups("mla_bmm", MlaBmmCase, ("bmm_dtype",), rows, origins, ("num_heads",))


def _cost(c: MlaBmmCase) -> float:
    d_in, d_out = WIDTHS.get(c.op_name, (KV_LORA, KV_LORA))
    return 2.0 * c.num_tokens * c.num_heads * d_in * d_out + 2.0 * c.num_heads * d_in * d_out


def _torch(sm: str, group: Group) -> str:
    return "torch.bmm"  # backends/torch/mla_bmm.py; fp8 has no torch batched matmul (skips.py torch-no-fp8-bmm)


def _vllm(sm: str, group: Group) -> str:
    # vLLM 0.24.0 keeps bf16 copies of W_UK_T and W_UV, dequantizing an fp8 kv_b_proj at load ("we currently do not
    # have quantized bmm's", model_executor/layers/attention/mla_attention.py:875-880, :957-962), and multiplies
    # with torch.bmm on CUDA (:789 pre, :1034 post); its fp8 BMM is ROCm AITER's only (:520, :768-776, :1027-1031),
    # so the fp8 cases are skipped (skips.py vllm-mla-bmm-bf16-only). Label: collector/vllm/collect_mla_bmm.py.
    return "vllm_torch_bmm"


def _sglang(sm: str, group: Group) -> str:
    # SGLang 0.5.14 on CUDA (srt/models/deepseek_common/attention_forward_methods/forward_mla.py): an fp8 w_kc / w_vc
    # runs per_tensor_quant_mla_fp8 then sgl_kernel.bmm_fp8 (:377-395 pre, :688-711 post; bmm_fp8 wraps cuBLASLt's
    # fp8 batched GEMM, sgl_kernel/gemm.py:65-81, the same on every SM from 89), a bf16 one torch.bmm (:396-397,
    # :724-740). The DeepGEMM masked BMM (:317, :596) needs SGL_USE_DEEPGEMM_BMM, off by default, and never runs on
    # Blackwell (srt/models/deepseek_common/deepseek_weight_loader.py:517-521); 128x128 block-fp8 weights are
    # dequantized to bf16 at load instead (:525-530). Labels: collector/sglang/collect_mla_bmm.py.
    return "sglang_sgl_kernel_bmm_fp8" if group.dtype == "fp8" else "sglang_torch_bmm"


def _trtllm(sm: str, group: Group) -> str:
    # TensorRT-LLM 1.3.0rc20's MLA (_torch/modules/attention.py): a bf16 k_b_proj_trans / v_b_proj runs
    # torch.ops.trtllm.bmm_out, an fp8 one fp8_block_scaling_bmm_out, which per SM (cited at rc20 by the reference
    # collector, collector/trtllm/collect_mla_bmm.py: attention.py:1080-1093, 1159-1190) quantizes the activation
    # 1x128 and runs torch.ops.trtllm.fp8_block_scaling_bmm_out on SM89/90 and SM120, and on the SM100 family
    # (is_sm_100f) runs torch.bmm on the weight dequantized to bf16 at load; other SMs raise NotImplementedError
    # (skips.py fp8-needs-sm89 keeps SM80/86 out). Labels as the collector writes them.
    if group.dtype != "fp8":
        return "trtllm_bmm_out"
    return "trtllm_bmm_out_dequant_bf16" if sm in ("100", "103") else "trtllm_fp8_block_scaling_bmm_out"


PLAN = OpPlan(
    name="mla_bmm",
    family="mla_bmm",
    table="mla_bmm_perf",
    op_name=None,  # the case's: mla_gen_pre or mla_gen_post
    case_type=MlaBmmCase,
    dtype_fields=("bmm_dtype",),
    expand=expand,
    tp_sizes=lambda grid: tuple(grid.model_tp_sizes),
    dispatch={"torch": _torch, "vllm": _vllm, "sglang": _sglang, "trtllm": _trtllm},
    cost=_cost,
    work=work,
)
