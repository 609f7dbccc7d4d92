"""DeepSeek MLA's two absorb BMMs of a decode step at one rank, run with TensorRT-LLM's ops as its MLA runs them.

MLA.forward_absorption_generation (_torch/modules/attention.py @00547a25; modules/mla.py @06d27b41 after PR #15648):
- mla_gen_pre: q_nope [t, h, 128], a strided view of q_b_proj's output [t, h * 192], times k_b_proj_trans
  [h, 512, 128] (transposed), written into the first 512 of each head's 576 values of fused_q [t, h, 576]:
  ``torch.ops.trtllm.bmm_out(q_nope.transpose(0, 1), k_b_proj_trans.transpose(1, 2), fused_q[..., :512]
  .transpose(0, 1))`` (newer copies through MLA._bmm_bf16_out, which calls the same op unless the opt-in CuTe DSL
  bf16 BMM is on).
- mla_gen_post: the attention's latent output [t, h * 512] viewed [t, h, 512], times v_b_proj [h, 128, 512]
  (transposed), into the module output [t, h * 128]: ``bmm_out(latent.transpose(0, 1), v_b_proj.transpose(1, 2),
  output.view(t, h, 128).transpose(0, 1))``.
- fp8 (FP8_BLOCK_SCALES checkpoints): the weights are fp8 with float32 scales per 128 x 128 block
  (MLA.create_weights: k_b_proj_trans_scale [h, 4, 1], v_b_proj_scale [h, 1, 4]) and both BMMs go through the
  module-level wrapper fp8_block_scaling_bmm_out(mat1, weight, weight_scale, out, weight_dequant), which by SM
  (get_sm_version()) runs: SM89/90 torch.ops.trtllm.fp8_batched_quantize_1x128_permute102(mat1) (fp8 [h, t, k]
  and its 1x128 scales), then torch.ops.trtllm.fp8_block_scaling_bmm_out into a fresh buffer copied into ``out``;
  SM120 the same with fp8_utils.per_token_quant_and_transform(mat1, need_permute102=True) and weights resmoothed to
  UE8M0 at load (MLA.post_load_weights / resmooth_parameters); SM100/103 (is_sm_100f) a bf16 torch.bmm into ``out``
  on the weight dequantized at load; any other SM raises NotImplementedError, a KernelLimit here.

The runner does not import the wrapper (it moved files between the copies read, and a contract-visible import of the
wrong one would fail every TensorRT-LLM run's preflight): it calls the same ops the same way, and
torch_ops.check_installed proves before each case that the installed MLA and wrapper still call them, and
torch_ops.fp8_bmm_wrapper reads whether the installed wrapper copies through a fresh buffer. The reference collector
(AIC collect_mla_bmm.py) times the same ops on contiguous inputs and without the wrapper's copy; here the inputs are
serving's views (strided q_nope, the fused_q slice) and the copy is timed where the installed wrapper makes it: fp8
rows err high against the reference by one [h, t, n] bf16 copy.

kernel_source (AIC collect_mla_bmm.py): trtllm_bmm_out for bf16, trtllm_fp8_block_scaling_bmm_out where the fp8
kernel runs (SM89/90/120), trtllm_bmm_out_dequant_bf16 where serving runs a bf16 BMM on dequantized weights
(SM100/103). The builders (bmm_layout, footprint, fp8_path, kernel_label) need no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from opcollect.backends.trtllm import torch_ops
from opcollect.backends.trtllm.context import SERVED_VERSIONS
from opcollect.backends.trtllm.mla_inputs import KV_LORA, LATENT, NOPE, QK_HEAD, V_HEAD
from opcollect.runtime.contract import KernelLimit, Prepared, Runner
from opcollect.runtime.dtypes import ceil_div

BLOCK = 128  # fp8 block weights: one float32 scale per 128 x 128 block; activations in 1 x 128 groups
BLOCK_SCALE = 1.0 / 448.0  # a block scale near a real one (amax / 448); positive, as SM120's UE8M0 resmooth needs
WEIGHT_BYTES = {"bfloat16": 2, "fp8": 1}
BF16 = "trtllm_bmm_out"
FP8 = "trtllm_fp8_block_scaling_bmm_out"
FP8_DEQUANT = "trtllm_bmm_out_dequant_bf16"
# fp8_block_scaling_bmm_out's branches, in its order: SM89/90, SM120, is_sm_100f (SM100/103)
FP8_KERNEL_SMS = (89, 90)
FP8_TRANSFORM_SM = 120
SM_100F = (100, 103)
UE8M0_RECIPE = (1, 128, 128)  # MLA.resmooth_parameters' recipe for the SM120 weight scales


@dataclass(frozen=True)
class BmmLayout:
    """One BMM of a case: out[h, t, n] = mat1[h, t, k] @ weight[h, n, k]^T per head, inside serving's buffers."""

    op_name: str
    tokens: int
    heads: int
    n: int
    k: int
    act_width: int  # values per head of the buffer mat1 is a view of (q: 192, the latent output: 512)
    out_width: int  # values per head of the buffer out is a view of (fused_q: 576, the module output: 128)

    @property
    def act_shape(self) -> tuple[int, int]:
        return (self.tokens, self.heads * self.act_width)

    @property
    def out_shape(self) -> tuple[int, int, int]:
        return (self.tokens, self.heads, self.out_width)

    @property
    def weight_shape(self) -> tuple[int, int, int]:
        return (self.heads, self.n, self.k)

    @property
    def scale_shape(self) -> tuple[int, int, int]:
        return (self.heads, ceil_div(self.n, BLOCK), ceil_div(self.k, BLOCK))


def bmm_layout(case) -> BmmLayout:
    if case.bmm_dtype not in WEIGHT_BYTES:
        raise KernelLimit(f"TensorRT-LLM's MLA BMMs run bfloat16 or fp8 block weights, not {case.bmm_dtype}")
    if case.num_tokens < 1 or case.num_heads < 1:
        raise KernelLimit(f"an MLA BMM needs tokens and heads (t={case.num_tokens}, h={case.num_heads})")
    t, h = case.num_tokens, case.num_heads
    if case.op_name == "mla_gen_pre":  # q_nope x k_b_proj_trans^T -> fused_q[..., :512]
        return BmmLayout(case.op_name, t, h, n=KV_LORA, k=NOPE, act_width=QK_HEAD, out_width=LATENT)
    if case.op_name == "mla_gen_post":  # latent x v_b_proj^T -> output
        return BmmLayout(case.op_name, t, h, n=V_HEAD, k=KV_LORA, act_width=KV_LORA, out_width=V_HEAD)
    raise KernelLimit(f"MLA has no absorb BMM {case.op_name!r} (mla_gen_pre, mla_gen_post)")


def footprint(case) -> int:
    """Bytes of one input set: the activation and output buffers, the weight (and fp8 scales), and for fp8 an upper
    bound over the SM paths: the quantized activation with its 1x128 scales (rows padded to 4, as
    fp8_block_scaling_bmm_out strides them), the wrapper's [h, t, n] bf16 buffer and the dequantized bf16 weight that
    SM100/103 keep."""
    lay = bmm_layout(case)
    t, h, n, k = lay.tokens, lay.heads, lay.n, lay.k
    buffers = (t * h * lay.act_width + t * h * lay.out_width) * 2
    weight = h * n * k * WEIGHT_BYTES[case.bmm_dtype]
    if case.bmm_dtype == "bfloat16":
        return buffers + weight
    scales = h * ceil_div(n, BLOCK) * ceil_div(k, BLOCK) * 4
    act_quant = h * t * k + h * ceil_div(t, 4) * 4 * ceil_div(k, BLOCK) * 4
    return buffers + weight + scales + act_quant + h * t * n * 2 + h * n * k * 2


def fp8_path(sm: int, sm_100f: bool) -> str:
    """The branch fp8_block_scaling_bmm_out takes on ``sm``: 'quantize_1x128', 'per_token_transform' or 'dequant';
    a KernelLimit where it raises NotImplementedError."""
    if sm in FP8_KERNEL_SMS:
        return "quantize_1x128"
    if sm == FP8_TRANSFORM_SM:
        return "per_token_transform"
    if sm_100f:
        return "dequant"
    raise KernelLimit(f"TensorRT-LLM's fp8 MLA BMM has no path on SM{sm} (fp8_block_scaling_bmm_out raises)")


def kernel_label(bmm_dtype: str, path: str | None) -> str:
    if bmm_dtype == "bfloat16":
        return BF16
    return FP8_DEQUANT if path == "dequant" else FP8


def _views(lay: BmmLayout, act, out):
    """mat1 [t, h, k] and out [h, t, n] as serving views its buffers (module docstring)."""
    t, h = lay.tokens, lay.heads
    mat1 = act.view(t, h, lay.act_width)[..., : lay.k]  # pre: q_nope of q; post: the whole latent
    out_t = out[..., : lay.n].transpose(0, 1)  # pre: fused_q[..., :512]; post: the output
    return mat1, out_t


def _weights(lay: BmmLayout, dtype: str, path: str | None, device: str, seed: int) -> dict:
    import torch

    from opcollect.runtime.timing import random_tensor

    if dtype == "bfloat16":
        return {"weight": random_tensor(lay.weight_shape, torch.bfloat16, device, seed)}
    weights = {
        "weight": random_tensor(lay.weight_shape, torch.float8_e4m3fn, device, seed),
        "scale": torch.full(lay.scale_shape, BLOCK_SCALE, dtype=torch.float32, device=device),
    }
    if path == "dequant":  # MLA keeps k_b_proj_trans_dequant / v_b_proj_dequant beside the fp8 weight on SM100f
        weights["dequant"] = random_tensor(lay.weight_shape, torch.bfloat16, device, seed + 1)
    elif path == "per_token_transform":  # MLA.post_load_weights -> resmooth_parameters on SM120
        from tensorrt_llm.quantization.utils.fp8_utils import resmooth_to_fp8_e8m0, transform_sf_into_required_layout

        weight, scale = resmooth_to_fp8_e8m0(weights["weight"], weights["scale"])
        weights["weight"] = weight
        weights["scale"] = transform_sf_into_required_layout(
            scale, mn=weight.shape[1], k=weight.shape[2], recipe=UE8M0_RECIPE, num_groups=weight.shape[0], is_sfa=False
        )
    return weights


def _fp8_call(path: str, copies_output: bool):
    """fp8_block_scaling_bmm_out's branch for ``path``, on (mat1, weights, out)."""
    import torch

    if path == "dequant":
        return lambda mat1, w, out: torch.bmm(mat1.transpose(0, 1), w["dequant"].transpose(1, 2), out=out)
    if path == "quantize_1x128":
        quantize = torch_ops.torch_op("trtllm", "fp8_batched_quantize_1x128_permute102")
    else:
        from tensorrt_llm.quantization.utils.fp8_utils import per_token_quant_and_transform

        def quantize(mat1):
            return per_token_quant_and_transform(mat1, need_permute102=True)

    bmm = torch_ops.torch_op("trtllm", "fp8_block_scaling_bmm_out")

    def call(mat1, w, out) -> None:
        mat1_fp8, mat1_scale = quantize(mat1)
        if copies_output:
            output = out.new_empty(out.shape, dtype=out.dtype, device=out.device)
            bmm(mat1_fp8, w["weight"], mat1_scale, w["scale"], output)
            out.copy_(output)
        else:
            bmm(mat1_fp8, w["weight"], mat1_scale, w["scale"], out)

    return call


def prepare(case, dispatch: str, device: str, copies: int) -> Prepared:
    lay = bmm_layout(case)
    torch_ops.check_installed("mla_bmm")
    import torch
    from tensorrt_llm._utils import get_sm_version, is_sm_100f

    from opcollect.runtime.timing import random_tensor

    path = None
    if case.bmm_dtype == "fp8":
        sm = get_sm_version()
        path = fp8_path(sm, bool(is_sm_100f(sm)))
        run = _fp8_call(path, path != "dequant" and torch_ops.installed_fp8_bmm_wrapper().copies_output)
    else:
        bmm_out = torch_ops.torch_op("trtllm", "bmm_out")

        def run(mat1, w, out) -> None:
            bmm_out(mat1.transpose(0, 1), w["weight"].transpose(1, 2), out)

    sets = []
    for i in range(copies):
        act = random_tensor(lay.act_shape, torch.bfloat16, device, 10 * i)
        out = torch.empty(lay.out_shape, dtype=torch.bfloat16, device=device)
        mat1, out_t = _views(lay, act, out)
        sets.append((mat1, _weights(lay, case.bmm_dtype, path, device, 10 * i + 1), out_t))
    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        run(*sets[i])

    return Prepared(call, kernel_label(case.bmm_dtype, path))


RUNNERS = {"mla_bmm": (Runner(footprint, prepare, versions=SERVED_VERSIONS),)}
