"""DeepSeek-V4's hyper-connection (mHC) pre and post (mhc_module_perf) as SGLang 0.5.14's DeepSeek-V4 decoder layer
runs them, through the layer's own methods.

Paths are relative to the wheel's sglang/srt/. DeepseekV4DecoderLayer.forward, with the fused post+pre off (its
default: SGLANG_OPT_FUSE_MHC_POST_PRE is False, environ.py:786; models/deepseek_v4.py:149-156, 1151), calls per
site (models/deepseek_v4.py:1474-1495 attention, 1544-1556 FFN):
- pre: ``self.hc_pre(residual, hc_fn, hc_scale, hc_base, norm=<the site's RMSNorm>)`` (:1279-1391). With
  SGLANG_OPT_USE_TILELANG_MHC_PRE it runs layers/mhc.py mhc_pre (:728-783) with the norm's weight and eps, so the
  site's RMSNorm is fused into the tilelang big-fuse kernel (mhc_pre_big_fuse_with_norm_tilelang, layers/mhc.py:
  920-952) and the layer runs no separate norm (:1484-1495); the product before it is DeepGEMM's
  tf32_hc_prenorm_gemm split along K where SGLANG_OPT_DEEPGEMM_HC_PRENORM, else tilelang's (layers/mhc.py:834-918).
  Without the tilelang flag it runs the torch or DeepGEMM product and the tilelang hc_split_sinkhorn, unfused: the
  layer then applies its norm on its own, which the row leaves out, as the collector does.
- post: ``self.hc_post(x, residual, post, comb)`` (:1393-1432): layers/mhc.py mhc_post's tilelang kernel (:1037-1058)
  with SGLANG_OPT_USE_TILELANG_MHC_POST, else a torch expression.
The runner calls these two methods of DeepseekV4DecoderLayer on a stand-in holding what they read of the layer
(HcLayer; building the whole layer would bring its attention and MoE for two small ops) with the layer's two
RMSNorms, SGLang's own (input_layernorm for the attention site, post_attention_layernorm for the FFN site,
:1133-1136), as the reference collector calls them on a built layer (collector/sglang/collect_mhc_module.py:237-277).

The flags are read per call from the environment (environ.py:781-784, all True by default). The server's model
hook sets them for DeepseekV4ForCausalLM (ServerArgs._handle_model_specific_adjustments, server_args.py:3787-3808):
SM120 turns TILELANG_MHC_PRE and DEEPGEMM_HC_PRENORM off, HIP turns DEEPGEMM_HC_PRENORM and both tilelang ones
off. The runner's ServerArgs is a stand-in that runs no model hook (context.py), so each call sets what the hook
would (hook_flags) for its length. SGLANG_DSV4_MHC_PREWARM is also off for the call: mhc_pre's first call would
otherwise compile the kernel of every split bucket up to the server's chunked_prefill_size (layers/mhc.py:509-553),
a start-up compile that changes no timed kernel.

Inputs are the collector's: per site a random bf16 residual [T, hc_mult, hidden] and the layer's fp32 hc_*_fn
[(2 + hc) x hc, hc x hidden], hc_*_base (random) and hc_*_scale (ones), rms_norm_eps = hc_eps = 1e-6,
hc_sinkhorn_iters; post mixes what pre made of its site's inputs. Each site has its own residual here (the collector
reuses one for both; in serving the FFN site's residual is the attention's output). A row sums num_sites sites.

kernel_source, as the collector reads the flags after the hook (collect_mhc_module.py:399-416): pre
sglang_tilelang_mhc_pre, else sglang_deepgemm_mhc_pre, else sglang_torch_mhc_pre; post sglang_tilelang_mhc_post,
else sglang_torch_mhc_post. verified_on: sglang==0.5.14
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Iterator, Mapping

from opcollect.backends.torch.mhc import check_case, mixes, site_inputs
from opcollect.runtime.contract import Prepared

EPS = 1e-6  # rms_norm_eps and hc_eps of the DeepSeek-V4 configs (the sgl-project FP8 ones lack rms_norm_eps)
TILELANG_PRE = "SGLANG_OPT_USE_TILELANG_MHC_PRE"
DEEPGEMM_PRENORM = "SGLANG_OPT_DEEPGEMM_HC_PRENORM"
TILELANG_POST = "SGLANG_OPT_USE_TILELANG_MHC_POST"
PREWARM = "SGLANG_DSV4_MHC_PREWARM"
MAX_SMS = 160  # the most SMs a GPU has that these rows run on (H200 132, B200 148): bounds the K splits
SPLIT_BLOCK_M, SPLIT_BLOCK_K = 64, 64  # _compute_num_split_for_mhc_pre's blocks (layers/mhc.py:489-494)
SPLITK_PARTS, SPLITK_WIDTH = 32, 32  # the tilelang split-K product's partials without DeepGEMM (mhc.py:856-885)


@dataclass
class HcLayer:
    """What DeepseekV4DecoderLayer.hc_pre and hc_post read of their layer, set as its __init__ sets them
    (models/deepseek_v4.py:1138-1148)."""

    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float
    rms_norm_eps: float


def hook_flags(sm120: bool, hip: bool) -> dict[str, bool]:
    """The mHC flags the DeepSeek-V4 model hook sets on this device (server_args.py:3787-3808), and the prewarm off."""
    flags = {PREWARM: False}
    if sm120:
        flags.update({TILELANG_PRE: False, DEEPGEMM_PRENORM: False})
    elif hip:
        flags.update({DEEPGEMM_PRENORM: False, TILELANG_PRE: False, TILELANG_POST: False})
    return flags


def kernel_label(op: str, tilelang_pre: bool, deepgemm_prenorm: bool, tilelang_post: bool) -> str:
    if op == "pre":
        path = "tilelang" if tilelang_pre else "deepgemm" if deepgemm_prenorm else "torch"
    else:
        path = "tilelang" if tilelang_post else "torch"
    return f"sglang_{path}_mhc_{op}"


@contextmanager
def flags_set(envs, flags: Mapping[str, bool]) -> Iterator[None]:
    """SGLang's flags set to ``flags`` with its own EnvField.override, each restored on exit (environ.py:82-92)."""
    with ExitStack() as stack:
        for name, value in flags.items():
            stack.enter_context(getattr(envs, name).override(value))
        yield


def max_splits(num_tokens: int, depth: int) -> int:
    """The most K splits _compute_num_split_for_mhc_pre gives (layers/mhc.py:489-494)."""
    tiles = -(-num_tokens // SPLIT_BLOCK_M)
    return max(1, min(MAX_SMS // tiles, depth // SPLIT_BLOCK_K // 4))


def footprint(case) -> int:
    """Bytes of one input set: per site the residual and pre's outputs; pre adds the weights, the norm weight and the
    larger of its two products' partials (DeepGEMM's K splits, or tilelang's 32 x 32 split-K partials), post the
    new residual."""
    check_case(case, "SGLang")
    t, hc, h = case.num_tokens, case.hc_mult, case.hidden_size
    residual = t * hc * h * 2
    outputs = t * hc * 4 + t * hc * hc * 4 + t * h * 2
    if case.op_name == "pre":
        weights = mixes(hc) * (hc * h + 1) * 4 + 3 * 4 + h * 2
        width = max(max_splits(t, hc * h) * (mixes(hc) + 1), SPLITK_PARTS * (SPLITK_WIDTH + 1))
        return case.num_sites * (residual + weights + outputs + width * t * 4)
    return case.num_sites * (2 * residual + outputs)


def prepare(case, dispatch: str, device: str, copies: int) -> Prepared:
    check_case(case, "SGLang")
    import torch
    from sglang.srt.environ import envs
    from sglang.srt.layers.layernorm import RMSNorm
    from sglang.srt.models.deepseek_v4 import DeepseekV4DecoderLayer
    from sglang.srt.utils.common import is_hip, is_sm120_supported

    from opcollect.backends.sglang.context import sglang_context

    flags = hook_flags(bool(is_sm120_supported()), bool(is_hip()))
    layer = HcLayer(hc_mult=case.hc_mult, hc_sinkhorn_iters=case.sinkhorn_iters, hc_eps=EPS, rms_norm_eps=EPS)

    def pre(residual, fn, scale, base, norm):
        return DeepseekV4DecoderLayer.hc_pre(layer, residual, fn, scale, base, norm=norm)

    with sglang_context(device), flags_set(envs, flags):
        label = kernel_label(
            case.op_name,
            bool(getattr(envs, TILELANG_PRE).get()),
            bool(getattr(envs, DEEPGEMM_PRENORM).get()),
            bool(getattr(envs, TILELANG_POST).get()),
        )
        with torch.device(device):  # the bf16 weights of input_layernorm and post_attention_layernorm
            norms = [RMSNorm(case.hidden_size, eps=EPS) for _ in range(case.num_sites)]
        sets = [[site_inputs(case, device, 1000 * c + 10 * s) for s in range(case.num_sites)] for c in range(copies)]
        if case.op_name == "post":
            with torch.no_grad():  # post mixes what pre made of its site's inputs, as the collector feeds it
                made = []
                for sites in sets:
                    outs = [pre(*site, norm) for site, norm in zip(sites, norms)]
                    made.append([(y, site[0], post, comb) for site, (y, post, comb, _) in zip(sites, outs)])
                sets = made

    def run(sites) -> None:
        if case.op_name == "pre":
            for site, norm in zip(sites, norms):
                pre(*site, norm)
        else:
            for x, residual, post, comb in sites:
                DeepseekV4DecoderLayer.hc_post(layer, x, residual, post, comb)

    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        with sglang_context(device), flags_set(envs, flags), torch.no_grad():
            run(sets[i])

    return Prepared(call, label)
