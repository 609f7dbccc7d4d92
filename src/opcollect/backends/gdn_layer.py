"""What the vLLM and SGLang Gated DeltaNet runners (backends/vllm/gdn.py, backends/sglang/gdn.py) share: the layer's
packed conv width, the refusals their kernels have alike, the conv weight and the rotation of input sets. No framework
import; torch only inside the functions that build tensors or run a call."""

from __future__ import annotations

from opcollect.runtime.contract import KernelLimit
from opcollect.runtime.timing import random_tensor

PACKED_DECODE_GRID_Y = 65_535  # CUDA's grid-y limit: the packed decode launches (NV, batch x num_v_heads)


def conv_dim(case) -> int:
    """The packed q | k | v conv channels on the rank: 2 num_k_heads head_k_dim + num_v_heads head_v_dim."""
    return 2 * case.num_k_heads * case.head_k_dim + case.num_v_heads * case.head_v_dim


def check_heads(case) -> None:
    """KernelLimit for a conv without state or value heads that do not group over the key heads."""
    if case.d_conv < 2:
        raise KernelLimit(f"d_conv {case.d_conv}: the causal conv1d keeps a state of d_conv - 1 >= 1 inputs")
    if case.num_v_heads % case.num_k_heads:
        raise KernelLimit(f"{case.num_v_heads} value heads are no multiple of {case.num_k_heads} key heads")


def check_packed_decode(case, framework: str, launch: str) -> None:
    """KernelLimit for a packed recurrent decode whose grid-y, batch_size x num_v_heads, passes CUDA's limit (FLA's
    fused_recurrent launches grid (NV, B * HV); the reference refuses it too, collect_gdn.py:444-456). ``launch``:
    the framework's file:line of the launch."""
    grid_y = case.batch_size * case.num_v_heads
    if case.stage == "core" and case.phase == "generation" and grid_y > PACKED_DECODE_GRID_Y:
        raise KernelLimit(
            f"{framework}'s packed recurrent decode launches grid-y batch_size x num_v_heads = {grid_y} > "
            f"{PACKED_DECODE_GRID_Y} ({launch})"
        )


def conv_weight(case, device: str):
    """The layer's conv weight [conv_dim, d_conv] (as vLLM's layer views it, qwen_gdn_linear_attn.py:1325-1327),
    scaled by d_conv^-0.5 so the decode conv, which overwrites its input, keeps finite values call after call."""
    import torch

    return random_tensor((conv_dim(case), case.d_conv), torch.bfloat16, device, 1).mul_(case.d_conv**-0.5)


def cycle(sets: list, step):
    """A call running ``step(*set)`` on the next of the input sets in inference mode, as serving's worker runs the
    model."""
    state = {"i": 0}

    def call() -> None:
        import torch

        i = state["i"] = (state["i"] + 1) % len(sets)
        with torch.inference_mode():
            step(*sets[i])

    return call
