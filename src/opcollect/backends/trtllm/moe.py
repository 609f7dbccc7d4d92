"""A MoE layer's experts on one rank through TensorRT-LLM's create_moe, with the backend serving resolves (and
AIC's DeepGEMM for block fp8 on SM100), built as the reference collector builds it (aiconfigurator
collector/trtllm/collect_moe.py, "AIC" below; TRT-LLM paths relative to tensorrt_llm/_torch/, commits in
docs/research/trtllm-1.3.0-runners.md "MoE"). The pure parts (backend choice, split, tensors, refusals, label)
are in moe_inputs.

One rank of a (moe_tp_size, moe_ep_size) split on one GPU: a one-rank Mapping whose moe_tp_size / moe_ep_size
are set afterwards (AIC :342-345), so MoE.__init__ keeps E / ep experts of inter / tp each and the kernels skip
the tokens routed to other ranks' experts; tp_size stays 1, so there is no all-reduce after TP experts and no
all-to-all around EP experts: the rows are the experts' compute, low by the communication serving adds (timed
separately). Quantization: context.quant_config(moe_dtype) (QuantAlgo FP8, FP8_BLOCK_SCALES, NVFP4, W4A16_MXFP4,
W4A8_MXFP4_MXFP8; none for bf16). Weights: MXFP4 through load_weights, which shuffles and pads them for the kernel
(AIC :566-613); the other formats filled in place in the layout create_weights made, as AIC leaves them (it times
torch.empty; here random weights and unit scales), with the DeepGEMM scale transform on the SM100 family that
post_load_weights would do (AIC :527-564). Routing: RenormalizeMoeRoutingMethod(topk) (AIC :502) over router
logits that pick the experts the case's distribution draws (opcollect.backends.torch.moe.routing). The AutoTuner
profiles the tactics in one forward under autotune() before timing (AIC :667-693; skipped for w4a16_mxfp4 as AIC
skips it, :637, so those rows run the default tactics). max_num_tokens is the case's batch, so the tactics are
tuned for it; serving tunes power-of-2 buckets up to its max_num_tokens and runs a batch on its bucket's tactic,
and AIC tunes once with its largest batch (:359, :667-693). verified_on: trtllm==1.3.0rc23

Where this differs from AIC, in serving's direction: create_moe gets dtype bfloat16 for every moe_dtype, fp8 and
fp8_block included. Serving's models pass the checkpoint config's torch_dtype (``dtype=config.torch_dtype`` in
models/modeling_mixtral.py and modeling_qwen3_next.py, DeepseekV3MoE's ``dtype`` likewise; index ids 52352453442,
750924321, 227015512), which fp8 and block-fp8 checkpoints (DeepSeek-V3, Qwen3-FP8) declare as bfloat16: their
weights are quantized, the activations and the layer's output stay bf16. AIC passes torch.float8_e4m3fn for
fp8 and fp8_block (collect_moe.py:300-312). The backend is passed in upper case as serving's MoeConfig spells it.
Where both differ from serving: gpt-oss's experts are built without their biases (serving: bias=True,
models/modeling_gpt_oss.py MLPBlock), so its rows are low by the bias epilogue.
verified_on: trtllm==1.3.0rc23
"""

from __future__ import annotations

from opcollect.backends.trtllm.context import SERVED_VERSIONS, one_rank_mapping, quant_config
from opcollect.backends.trtllm.moe_inputs import (
    E8M0_ONE,
    GPT_OSS_SWIGLU,
    MoeLayout,
    check_case,
    check_sm,
    choose_backend,
    footprint,
    is_sm_100f,
    kernel_label,
    moe_layout,
)
from opcollect.runtime.contract import KernelLimit, Prepared, Runner

FC_WEIGHTS = ("w3_w1_weight", "w2_weight")


def router_logits(case):
    """[tokens, num_experts] bf16 logits whose top-k are the experts the case's distribution routes each token to
    (opcollect.backends.torch.moe.routing, shared by every backend): 1 at the chosen experts, 0 elsewhere."""
    import torch

    from opcollect.backends.torch.moe import routing

    ids = routing(case)
    return torch.zeros(case.num_tokens, case.num_experts, dtype=torch.bfloat16).scatter_(1, ids, 1.0)


def fill(module, layout: MoeLayout, device: str, seed: int) -> None:
    """Checkpoint-like values in the parameters create_weights made: random fc weights (bf16 draws cast to the
    parameter's float type, random bytes for packed fp4), one expert at a time so no full-size draw is held; zero
    biases; float scales 1; integer-packed block scales the format's 1.0 byte."""
    import warnings

    import torch

    from opcollect.runtime.timing import random_tensor

    expected = {name: shape for name, shape, _ in layout.params}
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for full_name, param in module.named_parameters():
            name, shape = full_name.rsplit(".", 1)[-1], tuple(param.shape)
            if name in expected and shape != expected[name]:
                # TRT-LLM is the truth for what it allocates; a mismatch only makes the footprint estimate wrong
                warnings.warn(f"TRT-LLM made {name} {shape}, the layout says {expected[name]}", stacklevel=2)
            if name in FC_WEIGHTS:
                for expert in range(shape[0]):
                    if param.dtype.is_floating_point:
                        draw = random_tensor(shape[1:], torch.bfloat16, device, seed + expert).mul_(0.1)
                        param[expert].copy_(draw)
                    else:
                        raw = param[expert].view(torch.uint8)
                        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, device=device, generator=gen))
            elif "bias" in name:
                param.zero_()
            elif param.dtype.is_floating_point:
                param.fill_(1.0)
            elif param.dim():
                param.view(torch.uint8).fill_(layout.scale_byte)


def checkpoint(layout: MoeLayout, device: str, seed: int) -> dict:
    """load_weights' input for rank 0's experts: {expert}.{w1,w2,w3}.{weight,scale} as in ``layout.checkpoint``,
    random fp4 bytes and e8m0 scales of 1; every expert shares one set of tensors (their values do not matter)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    tensors = {
        name: torch.full(shape, E8M0_ONE, dtype=torch.uint8, device=device)
        if "scale" in name
        else torch.randint(0, 256, shape, dtype=torch.uint8, device=device, generator=gen)
        for name, shape, _ in layout.checkpoint
    }
    return {f"{expert}.{name}": t for expert in range(layout.local_experts) for name, t in tensors.items()}


def device_sm(device: str) -> int:
    """The SM as TRT-LLM's get_sm_version computes it (major * 10 + minor of the device's capability)."""
    import torch

    major, minor = torch.cuda.get_device_capability(torch.device(device))
    return major * 10 + minor


def build(case, layout: MoeLayout, device: str, sm: int, seed: int):
    """One MoE module from create_moe with rank 0's weights in place."""
    from types import SimpleNamespace

    import torch
    from tensorrt_llm._torch.model_config import ModelConfig
    from tensorrt_llm._torch.modules.fused_moe.create_moe import ActivationType, create_moe
    from tensorrt_llm._torch.modules.fused_moe.routing import RenormalizeMoeRoutingMethod

    mapping = one_rank_mapping()
    mapping.moe_tp_size = case.moe_tp_size
    mapping.moe_ep_size = case.moe_ep_size
    config = ModelConfig(
        # CommunicationFactory reads pretrained_config.hidden_size (AIC :347-356)
        pretrained_config=SimpleNamespace(
            hidden_size=case.hidden_size,
            intermediate_size=case.inter_size,
            num_experts=case.num_experts,
            torch_dtype=torch.bfloat16,
        ),
        mapping=mapping,
        quant_config=quant_config(case.moe_dtype),
        moe_backend=layout.backend,
        # one chunk of exactly this batch (AIC :359), and the tuner's buckets up to it
        max_num_tokens=case.num_tokens,
        moe_max_num_tokens=case.num_tokens,
    )
    swiglu = [None, None, None]
    if layout.gpt_oss:  # per local expert, on the device (AIC :428-433)
        swiglu = [torch.full((layout.local_experts,), v, dtype=torch.float32, device=device) for v in GPT_OSS_SWIGLU]
    with torch.device(device):
        try:
            moe = create_moe(
                routing_method=RenormalizeMoeRoutingMethod(case.topk),
                num_experts=case.num_experts,
                hidden_size=case.hidden_size,
                intermediate_size=case.inter_size,
                dtype=torch.bfloat16,  # serving's config.torch_dtype, bf16 for fp8 / fp8_block checkpoints too
                reduce_results=False,
                model_config=config,
                swiglu_alpha=swiglu[0],
                swiglu_beta=swiglu[1],
                swiglu_limit=swiglu[2],
                activation_type=ActivationType.Swiglu if layout.gated else ActivationType.Relu2,
            )
        except (NotImplementedError, ValueError) as err:  # a quant method or backend refuses the shape or SM
            raise KernelLimit(f"TensorRT-LLM refuses {case.moe_dtype} experts for {case}: {err}") from err
    moe.to(torch.device(device))
    moe.eval()
    # ConfigurableMoE holds the backend module as .backend (create_moe.py create_moe); a bare backend is itself
    inner = getattr(moe, "backend", None)
    backend = inner if isinstance(inner, torch.nn.Module) else moe
    if layout.checkpoint:
        moe.load_weights([checkpoint(layout, device, seed)])
    else:
        fill(moe, layout, device, seed)
        if layout.backend == "DEEPGEMM" and is_sm_100f(sm):
            _deepgemm_scales(backend)
    return moe, backend


def _deepgemm_scales(backend) -> None:
    """The SM100 DeepGEMM weight scales: float32 [G, N / 128, K / 128] to int32 UE8M0, TMA-aligned, as
    DeepSeekFP8BlockScalesFusedMoEMethodDeepGemm.post_load_weights does after a real load (AIC :527-564)."""
    import torch
    from tensorrt_llm.quantization.utils.fp8_utils import transform_sf_into_required_layout

    for weight_name in ("w3_w1_weight", "w2_weight"):
        weight = getattr(backend, weight_name)
        scale_name = f"{weight_name}_scaling_factor"
        scale = transform_sf_into_required_layout(
            getattr(backend, scale_name),
            mn=weight.shape[1],
            k=weight.shape[2],
            recipe=(1, 128, 128),
            num_groups=weight.shape[0],
            is_sfa=False,
        )
        setattr(backend, scale_name, torch.nn.Parameter(scale, requires_grad=False))
    backend.quant_method.setup_quant_scales(backend)


def prepare(case, dispatch: str, device: str, copies: int) -> Prepared:
    check_case(case)  # refuses int4 and misaligned splits before importing anything
    if not device.startswith("cuda"):
        raise KernelLimit("TensorRT-LLM's MoE runs on CUDA devices only")
    import torch
    from tensorrt_llm._torch.autotuner import autotune

    from opcollect.runtime.timing import random_tensor

    sm = device_sm(device)
    check_sm(case, sm)
    layout = moe_layout(case, choose_backend(case, sm))
    built = [build(case, layout, device, sm, 100 + i) for i in range(copies)]
    moes = [moe for moe, _ in built]
    backend = built[0][1]
    hidden = [random_tensor((case.num_tokens, case.hidden_size), torch.bfloat16, device, i) for i in range(copies)]
    logits = router_logits(case).to(device)
    if case.moe_dtype != "w4a16_mxfp4":
        with torch.inference_mode(), autotune():
            moes[0].forward(hidden[0], logits)
        torch.cuda.synchronize(torch.device(device))
    gated = bool(getattr(backend, "is_gated_activation", layout.gated))
    source = kernel_label(type(backend).__name__, gated, case.moe_dtype, sm)
    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        with torch.inference_mode():
            moes[i].forward(hidden[i], logits)

    return Prepared(call, source)


# autotune() is called without arguments: every signature found takes only defaulted ones ((tune_mode),
# (tune_mode, cache_path, rank), (tune_mode, cache_path), (..., skip_dynamic_tuning_buckets)), and AIC's one
# collect_moe.py ran both pins, so one runner serves both
RUNNERS = {"moe": (Runner(footprint, prepare, versions=SERVED_VERSIONS),)}
