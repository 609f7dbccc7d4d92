"""DeepSeek-V4's hyper-connection (mHC) mixing (mhc_module_perf, family mhc): the residual stream is hc_mult copies
of hidden_size wide, and around every attention and FFN block

- pre (op_name ``pre``) reduces it to the block's input: an RMS-normed product [num_tokens, hc_mult x hidden] x
  [hc_mult x hidden, (2 + hc_mult) x hc_mult] gives the pre, post and combination mixes, the combination matrix
  normalised by sinkhorn_iters Sinkhorn iterations, and the pre mix weighs the copies into one;
- post (op_name ``post``) writes the block's output back: post mix x output + combination^T x residual.

A row is the sum over num_sites sites (2: the attention's and the FFN's, as the consumer bills one row per layer,
aiconfigurator-core sdk/models/deepseek_v4.py:227-248, mhc.rs:192-254), keyed by op_name, architecture and the
model's hidden_size, hc_mult and hc_sinkhorn_iters (cases/dsv4.py) at every num_tokens of the grid; the
reference collector's grid (collector/cases/base_ops/mhc.yaml:9-44, case_generator.py:2030-2054).

What each framework's rows time, as its collector does (a deliberate difference of one framework from another,
kept as each framework's own):
- vLLM 0.24.0: mhc_pre_tilelang without the fused RMSNorm weight, mhc_post_tilelang
  (collector/vllm/collect_mhc_module.py:106-228); serving fuses post into the next pre across layers
  (models/deepseek_v4/nvidia/model.py:857-897), which the table does not time.
- SGLang 0.5.14: the layer's hc_pre with its input_layernorm (the fused RMSNorm, srt/models/deepseek_v4.py:
  1323-1340) and hc_post (:1393-1413) (collector/sglang/collect_mhc_module.py:127-304).
- TensorRT-LLM 1.3.0rc20: mHC.pre_mapping (mhc_pre_mapping_fused: the autotuned GEMM + sqrsum, then
  mhc_big_fuse) and post_mapping, after autotune() over both sites (collector/trtllm/collect_mhc_module.py:
  135-329); its SM100 fused_hc path is not what the table holds.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple

from opcollect.cases.grids_dsv4 import MhcGrid
from opcollect.cases.profiles import ModelShapes
from opcollect.plans.base import Group, OpPlan, make_groups, refines
from opcollect.plans.work import Work


class MhcCase(NamedTuple):
    op_name: str  # pre or post
    architecture: str
    num_tokens: int
    num_sites: int
    hc_mult: int
    hidden_size: int
    sinkhorn_iters: int


SHAPE_FIELDS = ("architecture", "hc_mult", "hidden_size", "sinkhorn_iters")


def expand(grid: MhcGrid, shapes: Mapping[str, ModelShapes]) -> list[Group]:
    """Every op_name at every num_tokens for each distinct (architecture, hc_mult, hidden_size, iterations) of the
    DeepSeek-V4 models, hidden_size ascending; the models a configuration comes from label it."""
    found: dict[tuple, set[str]] = {}
    for name, model_shapes in shapes.items():
        if grid.models is not None and name not in grid.models:
            continue
        for a in model_shapes.dsv4:
            found.setdefault((a.architecture, a.hc_mult, a.hidden_size, a.hc_sinkhorn_iters), set()).add(name)
    configs = sorted(found, key=lambda c: (c[2], c[1], c[3], c[0]))
    rows = {
        (op_name,): [
            (op_name, arch, tokens, grid.num_sites, hc, hidden, iters)
            for arch, hc, hidden, iters in configs
            for tokens in grid.num_tokens
        ]
        for op_name in grid.op_names
    }
    origins = {config: frozenset(models) for config, models in found.items()}
    return make_groups("mhc", MhcCase, ("op_name",), rows, origins, SHAPE_FIELDS)


def mixes(c: MhcCase) -> int:
    """Outputs of pre's product: the pre and post mixes (hc_mult each) and the hc_mult x hc_mult combination."""
    return (2 + c.hc_mult) * c.hc_mult


def work(c: MhcCase) -> Work:
    """Per site, pre reads the bf16 residual [tokens, hc_mult x hidden] once, multiplies it by the fp32 mixing
    weights (2 x hc_mult x hidden x mixes FLOPs per token, in TF32 or on CUDA cores: no rate the plan can name) and
    writes the bf16 block input [tokens, hidden]; post reads the residual and the block output and writes the new
    residual, hidden x (hc_mult + hc_mult^2) x 2 FLOPs per token. The Sinkhorn iterations on hc_mult x hc_mult
    matrices and the weights add little and are left out."""
    wide = c.num_tokens * c.hc_mult * c.hidden_size
    if c.op_name == "pre":
        flops = 2.0 * wide * mixes(c)
        moved = 2 * (wide + c.num_tokens * c.hidden_size)
    else:
        flops = 2.0 * wide * (1 + c.hc_mult)
        moved = 2 * (2 * wide + c.num_tokens * c.hidden_size)
    return Work({None: c.num_sites * flops}, c.num_sites * moved)


def _cost(c: MhcCase) -> float:
    return c.num_sites * c.num_tokens * c.hc_mult * c.hidden_size * (1 + c.sinkhorn_iters / 64)


def _op(group: Group) -> str:
    return str(group.constants["op_name"])


def _torch(sm: str, group: Group) -> str:
    return f"torch_mhc_{_op(group)}"  # the torch backend's reference mixing


def _vllm(sm: str, group: Group) -> str:
    """vLLM 0.24.0 runs tilelang's kernels on every CUDA SM (model_executor/layers/mhc.py:45-72
    MHCPreOp.forward_cuda; kernels/mhc/tilelang.py:90 pre, :303 post), labelled as the reference collector labels
    them (collector/vllm/collect_mhc_module.py:220)."""
    return f"vllm.model_executor.kernels.mhc.tilelang.mhc_{_op(group)}_tilelang"


def _sglang(sm: str, group: Group) -> str:
    """SGLang 0.5.14's pre: tilelang if SGLANG_OPT_USE_TILELANG_MHC_PRE, else DeepGEMM's prenorm GEMM if
    SGLANG_OPT_DEEPGEMM_HC_PRENORM, else torch; post: tilelang if SGLANG_OPT_USE_TILELANG_MHC_POST, else torch
    (the reference collector reads them so, collector/sglang/collect_mhc_module.py:399-416). All default on
    (srt/environ.py:781-783); the server's DeepSeek-V4 hook turns the two pre ones off on SM120
    (server_args.py:3797-3798), so SM120's pre is torch's."""
    if sm == "120" and _op(group) == "pre":
        return "sglang_torch_mhc_pre"
    return f"sglang_tilelang_mhc_{_op(group)}"


# SMs whose TensorRT-LLM can run DeepGEMM's tf32_hc_prenorm_gemm: DeepGEMM builds for SM90 and the SM100 family only
DEEPGEMM_SMS = ("90", "100", "103")
TUNED = "trtllm_mhc_pre_autotuned"  # a group dispatch each case refines (_trtllm_pre)


def _trtllm(sm: str, group: Group) -> str:
    """post: torch.ops.trtllm.mhc_post_mapping, one kernel, no tactics (collect_mhc_module.py:271-276). pre: the
    tactic TensorRT-LLM's AutoTuner times fastest among MhcPreMappingRunner.get_valid_tactics
    (_torch/modules/mhc/mhc_cuda.py): FMA tiles on CUDA cores always, DeepGEMM's TF32 GEMM with 16 K-splits or none
    only where DeepGEMM's tf32_hc_prenorm_gemm runs (_get_dg_fn; DeepGEMM has SM90 and SM100-family kernels), and
    ("fma", 0, 0, 0) on a tuner cache miss. Off those SMs the space is FMA's alone: trtllm_mhc_pre_fma."""
    if _op(group) == "post":
        return "trtllm_mhc_post_mapping"
    return TUNED if sm in DEEPGEMM_SMS else "trtllm_mhc_pre_fma"


@refines(("num_tokens", "hc_mult", "hidden_size"), dispatches=(TUNED,))
def _trtllm_pre(sm: str, dispatch: str, c: MhcCase) -> str:
    """The tactic the AutoTuner picks where all three exist: a timing, not a rule in TensorRT-LLM's code. This is
    the rule the H200 reference's 139 rows follow (every one; collector/trtllm/collect_mhc_module.py:186-223 records
    the entry point the tuned pre_mapping called), with K = hc_mult x hidden_size the product's depth: FMA while
    the product is small (num_tokens x K <= 2^21 multiply-adds per output column: no tensor-core launch pays
    off), DeepGEMM split 16 ways along K while the token tiles alone are few (8 x num_tokens <= K), DeepGEMM
    unsplit beyond. Its boundaries are MEASURED on an H200 (between 128 and 160 tokens and between 2048 and 3072 at
    hidden 4096; 64/80 and 3072/4096 at 7168), not derived from code: a rerun may flip a row at an edge, and SM100
    is predicted by the same boundaries, unmeasured. The runner reports the tactic that ran."""
    if dispatch != TUNED:
        return dispatch
    depth = c.hc_mult * c.hidden_size
    if c.num_tokens * depth <= 2**21:
        return "trtllm_mhc_pre_fma"
    return "trtllm_mhc_pre_dg_splitk" if 8 * c.num_tokens <= depth else "trtllm_mhc_pre_dg_nosplit"


PLAN = OpPlan(
    name="mhc",
    family="mhc",
    table="mhc_module_perf",
    op_name=None,  # the case's: pre or post
    case_type=MhcCase,
    dtype_fields=("op_name",),  # the table has no dtype column: pre and post label the groups
    expand=expand,
    tp_sizes=lambda grid: (),
    dispatch={"torch": _torch, "vllm": _vllm, "sglang": _sglang, "trtllm": _trtllm},
    cost=_cost,
    case_dispatch={"trtllm": _trtllm_pre},
    work=work,
)
