"""DeepSeek-V3's MLA attention kernel at one rank through TensorRT-LLM's TRTLLM attention backend (context and
generation), and the registration of the four MLA ops (the whole-module ones are in mla_module.py).

The backend is built as MLA builds its two (modules/attention.py MLA.__init__; modules/mla.py MLA.__init__ at c0261efa
after PR #15648 moved it; the same arguments in every version read): create_attention("TRTLLM", ...,
is_mla_enable=True; attention_backend/utils.py:55-111) with DeepSeek-V3's ranks (q_lora 1536, kv_lora 512,
nope 128, rope 64, v 128), its yarn rope as PositionalEmbeddingParams and q_scaling = 1 / mscale^2; for a prompt the
"mha" one (192-wide query/key heads, num_kv_heads = heads, v 128), for decode the "mqa" one (576-wide heads, one KV
head, v = kv_lora_rank 512, hidden_size given). The reference collector builds the same pair (AIC
collect_mla.py:309-362) but gives the mqa backend v 128, which a generation-only call does not read (trtllm.py
create_output sizes its output by kv_lora_rank). The latent cache is a one-layer SELFKONLY KVCacheManager with pages
of 64 tokens where FlashMLA runs (SM90) and 32 elsewhere, and the metadata carries enable_flash_mla as the executor
sets it (mla_inputs.kv_cache, attention_metadata; AIC collect_mla.py:37-51, :366-438).

Each call runs what MLA runs for the phase (AIC collect_mla.py:589-626): a prompt calls the backend's forward with
q, k, v (v a strided view of the kv_b_proj output, as MLA passes it) and the latent to cache, context_only; a decode
step runs mla_rope_generation (rope into the fused query, the new latent appended to the cache, the FMHA scheduler
buffers and, for an fp8 cache, the fp8 query and BMM scales) and then forward, generation_only. These legacy forward
keywords are accepted both before and after AttentionForwardArgs: later interface.py versions merge them into it
(merge_attention_forward_args; its fields include every keyword passed here).

kernel_source: default when the built backend is TensorRT-LLM's TrtllmAttention with MLA parameters (the label the
reference records, collect_mla.py:668); any other class shows up as its own name (mla_inputs.kernel_source).
"""

from __future__ import annotations

from functools import partial

from opcollect.backends.trtllm import mla_inputs as inputs
from opcollect.backends.trtllm.context import SERVED_VERSIONS, hold_until_dropped, release_pending
from opcollect.backends.trtllm.mla_module import module_footprint, module_prepare
from opcollect.runtime.contract import Prepared, Runner
from opcollect.runtime.timing import random_tensor


def footprint(case, context: bool) -> int:
    return inputs.kernel_footprint(case, context)


def build_backend(num_heads: int, kv_cache_dtype: str, context: bool):
    """The mha (prompt) or mqa (decode) TrtllmAttention MLA builds for DeepSeek-V3 with num_heads on the rank."""
    from types import SimpleNamespace

    from tensorrt_llm._torch.attention_backend.interface import (
        PositionalEmbeddingParams,
        PositionEmbeddingType,
        RopeParams,
    )
    from tensorrt_llm._torch.attention_backend.utils import create_attention

    from opcollect.backends.trtllm.context import quant_config

    rope = RopeParams.from_config(SimpleNamespace(**inputs.config_fields(num_heads)))
    # (head, KV heads, v head) of MLA's mha for a prompt and of its mqa for decode; hidden_size is given to mqa only
    head_dim, kv_heads, v_head = (
        (inputs.QK_HEAD, num_heads, inputs.V_HEAD) if context else (inputs.LATENT, 1, inputs.KV_LORA)
    )
    return create_attention(
        "TRTLLM",
        0,
        num_heads,
        head_dim,
        num_kv_heads=kv_heads,
        pos_embd_params=PositionalEmbeddingParams(type=PositionEmbeddingType.yarn, rope=rope, is_neox=False),
        quant_config=quant_config("bfloat16", kv_cache_dtype),  # only the KV cache is quantized
        q_scaling=inputs.q_scaling(),
        is_mla_enable=True,
        q_lora_rank=inputs.Q_LORA,
        kv_lora_rank=inputs.KV_LORA,
        qk_rope_head_dim=inputs.ROPE,
        qk_nope_head_dim=inputs.NOPE,
        v_head_dim=v_head,
        hidden_size=None if context else inputs.HIDDEN,
        predicted_tokens_per_seq=1,
    )


def check_quant_state(attn, kv_cache_dtype: str) -> None:
    # the fp8-cache decode path needs the BMM scales and the fp8 query buffer; read the backend's own flag rather than
    # assume it, as AIC does (collect_mla.py:530-547), so a cache mismatch fails instead of timing the other path
    has_fp8 = getattr(attn, "has_fp8_kv_cache", None)
    if has_fp8 is None or bool(has_fp8) != (kv_cache_dtype == "fp8"):
        raise RuntimeError(f"TrtllmAttention.has_fp8_kv_cache is {has_fp8} for a {kv_cache_dtype} latent cache")


def prepare(case, dispatch: str, device: str, copies: int, context: bool) -> Prepared:
    inputs.check_case(case)
    import torch
    from tensorrt_llm._torch.attention_backend.interface import AttentionInputType

    capability = torch.cuda.get_device_capability(torch.device(device))
    inputs.check_capability(capability)
    release_pending()  # an earlier case's pools, if its Prepared is still referenced somewhere
    h, dtype = case.num_heads, torch.bfloat16
    attn = build_backend(h, case.kv_cache_dtype, context)
    source = inputs.backend_label(attn)
    check_quant_state(attn, case.kv_cache_dtype)
    layout = inputs.kv_layout(case, context, inputs.page_size(capability), copies)
    shapes = inputs.kernel_shapes(case, context)
    manager = inputs.kv_cache(layout, case.kv_cache_dtype)
    try:
        metadata = [
            inputs.attention_metadata(type(attn), manager, layout, i, context, inputs.flash_mla(capability))
            for i in range(copies)
        ]
        sets = []
        for i in range(copies):
            latent = random_tensor(shapes["latent_cache"], dtype, device, 10 * i + 3)
            if context:
                kv = random_tensor(shapes["kv"], dtype, device, 10 * i + 1)
                q = random_tensor(shapes["q"], dtype, device, 10 * i)
                k = random_tensor(shapes["k"], dtype, device, 10 * i + 2)
                sets.append((q, k, kv[:, h * inputs.NOPE :], latent))  # v keeps kv_b_proj's row stride
                continue
            t, fp8 = layout.num_tokens, case.kv_cache_dtype == "fp8"
            scheduler = dict(  # filled by mla_rope_generation, read by the FMHA (AIC collect_mla.py:525-557)
                cu_q_seqlens=torch.empty(shapes["cu_seqlens"], dtype=torch.int32, device=device),
                cu_kv_seqlens=torch.empty(shapes["cu_seqlens"], dtype=torch.int32, device=device),
                fmha_scheduler_counter=torch.empty(1, dtype=torch.uint32, device=device),
                mla_bmm1_scale=torch.empty(2, dtype=torch.float32, device=device) if fp8 else None,
                mla_bmm2_scale=torch.empty(1, dtype=torch.float32, device=device) if fp8 else None,
                quant_q_buffer=torch.empty(t, h * inputs.LATENT, dtype=torch.uint8, device=device) if fp8 else None,
            )
            fused_q = random_tensor(shapes["fused_q"], dtype, device, 10 * i)
            sets.append((fused_q, random_tensor(shapes["q_pe"], dtype, device, 10 * i + 1), latent, scheduler))
    except BaseException:
        manager.shutdown()
        raise
    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        if context:
            q, k, v, latent = sets[i]
            attn.forward(
                q, k, v, metadata[i], attention_input_type=AttentionInputType.context_only, latent_cache=latent
            )
            return
        fused_q, q_pe, latent, scheduler = sets[i]
        # positional, as MLA.forward_absorption_generation calls it (trtllm.py TrtllmAttention.mla_rope_generation)
        rope_args = [scheduler[name] for name in inputs.ROPE_GENERATION_ARGS]
        attn.mla_rope_generation(fused_q, q_pe, latent, metadata[i], *rope_args)
        attn.forward(
            fused_q,
            None,
            None,
            metadata[i],
            attention_input_type=AttentionInputType.generation_only,
            latent_cache=latent,
            q_pe=q_pe,
            **scheduler,
        )

    hold_until_dropped(call, manager.shutdown)
    return Prepared(call, source)


def _runner(footprint_fn, prepare_fn, context: bool) -> tuple[Runner, ...]:
    # one runner per op for both pins: no API the runners use differs between 1.3.0rc20 and rc23 (module docstring)
    sized, prepared = partial(footprint_fn, context=context), partial(prepare_fn, context=context)
    return (Runner(sized, prepared, versions=SERVED_VERSIONS),)


RUNNERS = {
    "mla_context": _runner(footprint, prepare, True),
    "mla_generation": _runner(footprint, prepare, False),
    "mla_context_module": _runner(module_footprint, module_prepare, True),
    "mla_generation_module": _runner(module_footprint, module_prepare, False),
}
