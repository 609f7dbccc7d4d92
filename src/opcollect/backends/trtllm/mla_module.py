"""DeepSeek-V3's whole MLA attention module at one rank through TensorRT-LLM, context and generation.

The module is DeepseekV3Attention (models/modeling_deepseekv3.py:504-535), the MLA subclass (the `MLA` of
modules/attention.py; a later TensorRT-LLM moves it to modules/mla.py, PR #15648, while DeepseekV3Attention stays
where it is) that DeepseekV3DecoderLayer builds as self_attn (:951), the object the reference collector times
(AIC collect_mla_module.py:552-606): its fused q_a/kv_a projection (DeepseekV3Linear, :452-501: the fused-A GEMM
for 1-16 unquantized tokens), the q_a/kv_a norms, q_b_proj, kv_b_proj, the TRTLLM mha/mqa backends with the
absorption BMMs, the yarn rope fused into the attention op, and o_proj. It is built from a ModelConfig of
DeepSeek-V3's config with the rank's heads as the model's (tp 1; AIC :538-541), the case's QuantConfig for the
projections and KV cache, and skip_create_weights_in_init, so that, as serving's DecoderModelForCausalLM.__post_init__
does (apply_quant_config_exclude_modules, AIC :558-582), the modules an fp8 block checkpoint excludes from
quantization ("*kv_b_proj*", "*k_b_proj*", "*eh_proj": model_config.py:624-634, AIC :339-364) get a QuantConfig with
only the KV cache algorithm before create_weights. Weights are drawn as TensorRT-LLM's dummy loader draws them
(fill_dummy_weights) and then post_load_weights runs on every module that has it (AIC :584-595).

Each call runs module.forward(position_ids, hidden_states, metadata) inside model_extra_attrs (_torch/utils.py:57-64)
with the metadata registered, as the executor does (AIC :906-928), over the latent cache and metadata mla_inputs
builds (pages of 64 on SM90 for FlashMLA, 32 elsewhere; enable_flash_mla from ModelConfig). kernel_source: default
when the module is an MLA whose attention backends are TensorRT-LLM's TrtllmAttention with MLA parameters
(AIC :974), else the backend's name.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Callable

from opcollect.backends.trtllm import mla_inputs as inputs
from opcollect.backends.trtllm.context import hold_until_dropped, release_pending
from opcollect.runtime.contract import KernelLimit, Prepared
from opcollect.runtime.timing import random_tensor

MODELS = {"deepseek-ai/DeepSeek-V3": "DeepseekV3ForCausalLM"}
MAX_NUM_TOKENS = 131072
# bytes per weight element of the projections: bf16; fp8 with a float32 scale per 128x128 block; nvfp4 two values a
# byte with an fp8 scale per 16
WEIGHT_BYTES = {"bfloat16": 2.0, "fp8_block": 1.0 + 4 / (128 * 128), "nvfp4": 0.5 + 1 / 16}
# the modules a served fp8 block checkpoint keeps unquantized (model_config.py:624-634 load_hf_quant_config; AIC
# collect_mla_module.py:347-362)
EXCLUDED = {"fp8_block": ("*kv_b_proj*", "*k_b_proj*", "*eh_proj")}
# calibration scalars TensorRT-LLM's dummy loader leaves at their create_weights value (pyexecutor/model_loader.py
# initialize_dummy_weights)
CALIBRATION = frozenset({"input_scale", "inv_input_scale", "kv_scales", "inv_kv_scales", "alpha", "scalar_alpha"})


def check_module_case(case) -> None:
    if MODELS.get(case.model) != case.architecture:
        raise KernelLimit(f"the TensorRT-LLM MLA module runner builds DeepSeek-V3 only, not {case.model}")
    inputs.check_case(case)
    if case.gemm_type not in WEIGHT_BYTES:
        raise KernelLimit(f"the TensorRT-LLM MLA module runner has no {case.gemm_type} projections")


def check_gemm_capability(gemm_type: str, capability: tuple[int, int]) -> None:
    """nvfp4 projections need SM100 (AIC collect_mla_module.py:172-173)."""
    if gemm_type == "nvfp4" and capability[0] < 10:
        raise KernelLimit(f"nvfp4 projections need SM100 or newer (SM{capability[0]}{capability[1]})")


def projection_shapes(num_heads: int) -> dict[str, tuple[int, int]]:
    """(in, out) of the module's linear layers with num_heads on the rank (modules/attention.py MLA.__init__;
    kv_a_proj_with_mqa fuses q_a: DeepseekV3Attention)."""
    h = num_heads
    return {
        "kv_a_proj_with_mqa": (inputs.HIDDEN, inputs.Q_LORA + inputs.LATENT),
        "q_b_proj": (inputs.Q_LORA, h * inputs.QK_HEAD),
        "kv_b_proj": (inputs.KV_LORA, h * (inputs.NOPE + inputs.V_HEAD)),
        "o_proj": (h * inputs.V_HEAD, inputs.HIDDEN),
    }


def weight_bytes(num_heads: int, gemm_type: str) -> int:
    """Projections in the gemm type (kv_b_proj bf16 where excluded), k_b_proj_trans and v_b_proj in bf16 (MLA
    create_weights: bf16 when kv_b_proj is not fp8-block), and the two norms."""
    total = 0.0
    for name, (k, n) in projection_shapes(num_heads).items():
        excluded = any(pattern.strip("*") in name for pattern in EXCLUDED.get(gemm_type, ()))
        total += k * n * WEIGHT_BYTES["bfloat16" if excluded else gemm_type]
    absorb = 2 * num_heads * inputs.KV_LORA * (inputs.NOPE + inputs.V_HEAD)
    return math.ceil(total) + absorb + 2 * (inputs.Q_LORA + inputs.KV_LORA)


def activation_bytes_per_token(num_heads: int, context: bool) -> int:
    """bf16 hidden in and out, the fused-A output, q, and the phase's intermediates: k/v expansion and the 128-wide
    output for a prompt, the absorbed 512-wide query, fused 576-wide query and latent output for decode."""
    h = num_heads
    common = 2 * inputs.HIDDEN + inputs.Q_LORA + inputs.LATENT + h * inputs.QK_HEAD
    if context:
        phase = h * (inputs.NOPE + inputs.V_HEAD + inputs.QK_HEAD + inputs.V_HEAD)
    else:
        phase = h * (inputs.KV_LORA + inputs.LATENT + inputs.KV_LORA + inputs.V_HEAD)
    return 2 * (common + phase)


def module_footprint(case, context: bool) -> int:
    layout = inputs.kv_layout(case, context, inputs.MAX_PAGE)
    per_token = activation_bytes_per_token(case.num_heads, context)
    if case.kv_cache_dtype == "fp8":  # the fp8 query / operand copies of the fp8-cache FMHA
        per_token += case.num_heads * inputs.LATENT
    return (
        weight_bytes(case.num_heads, case.gemm_type)
        + layout.num_tokens * (per_token + 8)
        + layout.cache_bytes(case.kv_cache_dtype)
    )


def dummy_range(dtype_name: str) -> tuple[float, float] | None:
    """(low, high) of TensorRT-LLM's dummy weights for a parameter dtype (model_loader.py initialize_dummy_weights):
    floats uniform in +-1e-3, one-byte fp8/int8 codes in +-3, packed fp4 bytes in [0, 64); None leaves it."""
    if dtype_name in ("float8_e4m3fn", "int8"):
        return (-3.0, 3.0)
    if dtype_name == "uint8":
        return (0.0, 64.0)
    if dtype_name in ("bfloat16", "float16", "float32"):
        return (-1e-3, 1e-3)
    return None


def module_source(mro_names, backend_class: str, mla_enabled: bool) -> str:
    """The label of the built module: it must be an MLA; then its attention backend's label."""
    if "MLA" not in mro_names:
        raise RuntimeError(f"TensorRT-LLM built {mro_names[0]}, not an MLA module, for DeepSeek-V3")
    return inputs.kernel_source(backend_class, mla_enabled)


def module_label(module, context: bool) -> str:
    backend = getattr(module, "mha", None) if context else None
    backend = backend if backend is not None else module.mqa  # a prompt runs mha, or mqa where MLA absorbs it
    enabled = bool(getattr(backend, "is_mla_enable", False) or getattr(backend, "mla_params", None) is not None)
    return module_source([c.__name__ for c in type(module).__mro__], type(backend).__name__, enabled)


def fill_dummy_weights(module) -> None:
    import torch

    for name, tensor in module.state_dict().items():
        if name.rsplit(".", 1)[-1] in CALIBRATION:
            continue
        bounds = dummy_range(str(tensor.dtype).removeprefix("torch."))
        if bounds is None:
            continue
        gen = torch.Generator(device=tensor.device).manual_seed(0)
        if tensor.element_size() < 2:  # no uniform_ for one-byte dtypes: draw in fp16 and convert
            draw = torch.empty(tensor.shape, dtype=torch.float16, device=tensor.device).uniform_(*bounds, generator=gen)
            tensor.copy_(draw.to(tensor.dtype))
        else:
            tensor.uniform_(*bounds, generator=gen)


# --- building a TensorRT-LLM attention module as the reference collectors do (this runner, dsa.py, msa.py) ---------
def aux_streams(device: str) -> dict:
    """The aux_stream_dict a decoder layer is built with: one stream for the attention and the shared experts, one
    for MoE chunking (AIC collect_mla_module.py:552-606; the MSA collector's the same)."""
    import torch
    from tensorrt_llm._torch.utils import AuxStreamType

    attention = torch.cuda.Stream(device=device)
    return {
        AuxStreamType.Attention: attention,
        AuxStreamType.MoeShared: attention,
        AuxStreamType.MoeChunkingOverlap: torch.cuda.Stream(device=device),
    }


def keep_excluded_unquantized(module, quant, kv_cache_dtype: str) -> None:
    """The modules ``quant`` excludes from quantization get a QuantConfig with only the KV cache algorithm, before
    their weights are created, as serving's apply_quant_config_exclude_modules does (AIC :558-582)."""
    from opcollect.backends.trtllm.context import quant_config

    only_kv = quant_config("bfloat16", kv_cache_dtype)  # QuantConfig(kv_cache_quant_algo=...) alone
    for name, sub in module.named_modules():
        if getattr(sub, "quant_config", None) is not None and quant.is_module_excluded_from_quantization(name):
            sub.quant_config = only_kv


def create_weights(module) -> None:
    """create_weights on every submodule that has it (the model is built with skip_create_weights_in_init)."""
    for sub in module.modules():
        if callable(getattr(sub, "create_weights", None)):
            sub.create_weights()


def load_dummy_weights(module, device: str) -> None:
    """The module on the device, its weights drawn as TensorRT-LLM's dummy loader draws them (fill_dummy_weights),
    post_load_weights run on every module that has it (AIC :584-595), in eval mode without gradients."""
    import torch

    module.to(device)
    with torch.no_grad():
        fill_dummy_weights(module)
        for sub in module.modules():
            if hasattr(sub, "post_load_weights") and not getattr(sub, "_weights_removed", False):
                sub.post_load_weights()
    module.eval()
    module.requires_grad_(False)


def rotating_forward(module, extra_attrs: dict, position_ids, hidden: list, metadata: list):
    """A call running module.forward(position_ids, hidden_states, metadata) of the next copy inside model_extra_attrs
    with that copy's metadata registered, as the executor runs the layer (AIC :905-940)."""
    import weakref

    import torch
    from tensorrt_llm._torch.utils import model_extra_attrs

    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % len(hidden)
        extra_attrs["attention_metadata"] = weakref.ref(metadata[i])
        with model_extra_attrs(extra_attrs), torch.inference_mode():
            module.forward(position_ids, hidden[i], metadata[i])

    return call


def layer_call(module, extra_attrs: dict, manager, layout, hidden_size: int, device: str, metadata_of: Callable):
    """The timed call of an attention layer over ``layout``'s copies: metadata_of(i) for each copy, the positions and
    a bf16 hidden state per copy, run by rotating_forward; the KV cache manager shuts down when the call is dropped,
    or at once if the inputs fail."""
    import torch

    try:
        metadata = [metadata_of(i) for i in range(layout.copies)]
        position_ids = torch.tensor(layout.positions(), dtype=torch.long, device=device)
        shape = (layout.num_tokens, hidden_size)
        hidden = [random_tensor(shape, torch.bfloat16, device, i) for i in range(layout.copies)]
    except BaseException:
        manager.shutdown()
        raise
    call = rotating_forward(module, extra_attrs, position_ids, hidden, metadata)
    hold_until_dropped(call, manager.shutdown)
    return call


def build_module(case, device: str, layout: inputs.KvLayout):
    """DeepseekV3Attention with dummy weights, post-processed, and its ModelConfig."""
    import torch
    from tensorrt_llm._torch.model_config import ModelConfig
    from tensorrt_llm._torch.models.modeling_deepseekv3 import DeepseekV3Attention

    from opcollect.backends.trtllm.context import one_rank_mapping, quant_config

    excluded = EXCLUDED.get(case.gemm_type)
    quant = quant_config(case.gemm_type, case.kv_cache_dtype, exclude_modules=excluded or ())
    pretrained = SimpleNamespace(**inputs.config_fields(case.num_heads), torch_dtype=torch.bfloat16)
    model_config = ModelConfig(
        pretrained_config=pretrained,
        mapping=one_rank_mapping(),
        quant_config=quant,
        attn_backend="TRTLLM",
        skip_create_weights_in_init=True,
        # engine limits as AIC sets them (collect_mla_module.py:514-515): the plan's token cap, the model's context
        max_num_tokens=max(MAX_NUM_TOKENS, layout.num_tokens),
        max_seq_len=inputs.DEEPSEEK_V3["max_position_embeddings"],
    )
    with torch.device(device):
        module = DeepseekV3Attention(model_config, layer_idx=0, aux_stream=torch.cuda.Stream(device=device))
        if excluded:
            keep_excluded_unquantized(module, quant, case.kv_cache_dtype)
        create_weights(module)
    load_dummy_weights(module, device)
    return module, model_config


def module_prepare(case, dispatch: str, device: str, copies: int, context: bool) -> Prepared:
    check_module_case(case)
    import torch

    capability = torch.cuda.get_device_capability(torch.device(device))
    inputs.check_capability(capability)
    check_gemm_capability(case.gemm_type, capability)
    release_pending()
    layout = inputs.kv_layout(case, context, inputs.page_size(capability), copies)
    module, model_config = build_module(case, device, layout)
    source = module_label(module, context)
    # read before the KV cache exists: layer_call owns the manager's shutdown from here on
    backend_cls, flash = type(module.mqa), bool(model_config.enable_flash_mla)
    manager = inputs.kv_cache(layout, case.kv_cache_dtype)

    def metadata_of(i: int):
        return inputs.attention_metadata(backend_cls, manager, layout, i, context, flash)

    # MLA registered itself in extra_attrs (extra_attrs["mla_layers"]) when built
    call = layer_call(module, model_config.extra_attrs, manager, layout, inputs.HIDDEN, device, metadata_of)
    return Prepared(call, source)
