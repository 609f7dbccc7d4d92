"""DeepSeek-V3's MLA attention at one rank through SGLang 0.5.14's RadixAttention and its MLA backend, context and
generation: the attention call alone, on the inputs the absorb BMMs give it as DeepseekV2AttentionMLA runs them.

Paths are relative to the wheel's sglang/srt/. The backend is what SGLang serves DeepSeek-V3 with: trtllm_mla on
SM100/103 (server_args.py:3636-3650), else ServerArgs._get_default_attn_backend's MLA branch: fa3 on Hopper
(server_args.py:4456-4459), triton elsewhere (:4471-4472). Its class is built over an MLATokenToKVPool (one latent
entry of 512 + 64 per token) and a ReqToTokenPool sized for the case, with page size 64 for trtllm_mla
(server_args.py:4541-4554) and 1 otherwise. The absorbed path (models/deepseek_common/attention_forward_methods/
forward_mla.py:376-399, 520-536, 686-716) runs q_nope x W_UK (torch.bmm for bf16; per_tensor_quant_mla_fp8 +
sgl_kernel.bmm_fp8 for an fp8 checkpoint), the attention with the latent KV written into the pool, and the output x
W_UV. Only the attention is timed, as the reference does (collector/sglang/collect_mla.py times the backend's
forward alone; the BMMs are their own op, mla_bmm_perf from collect_mla_bmm.py, and the consumer adds BMM + MLA +
BMM): q_nope x W_UK runs once per input copy when the case is prepared, so the timed call sees q in the layout and
dtype the BMM leaves it, and the output BMM is not run. trtllm_mla's prefill is not absorbed (192-wide q/k, 128-wide
v): the reference collector's setup (collect_mla.py), with no BMM.

kernel_source is the backend class SGLang constructed, named as the plan names it: FlashAttentionBackend ->
flash_attention (the reference's label for SGLang's fa3 MLA, collect_mla.py:434-437), TRTLLMMLABackend -> trtllm_mla,
TritonAttnBackend -> triton.
"""

from __future__ import annotations

from types import SimpleNamespace

from opcollect.backends.sglang.attention import KV_CACHE_DTYPE, TokenLayout, token_layout
from opcollect.runtime.contract import KernelLimit, Prepared
from opcollect.runtime.timing import random_tensor

KV_LORA_RANK = 512
QK_NOPE_HEAD_DIM = 128
QK_ROPE_HEAD_DIM = 64
V_HEAD_DIM = 128
LATENT = KV_LORA_RANK + QK_ROPE_HEAD_DIM  # 576
SCALING = (QK_NOPE_HEAD_DIM + QK_ROPE_HEAD_DIM) ** -0.5
MLA_SOURCE = {
    "FlashAttentionBackend": "flash_attention",
    "TRTLLMMLABackend": "trtllm_mla",
    "TritonAttnBackend": "triton",
}
MAX_PAGE_SIZE = 64


def lengths(case, context: bool) -> tuple[int, int]:
    """(new tokens, tokens) per sequence: a prompt of isl tokens, or isl (1) new token after a history of step."""
    return (case.isl, case.isl) if context else (case.isl, case.step + case.isl)


def mla_layout(case, context: bool, page_size: int) -> TokenLayout:
    return token_layout(case.batch_size, *lengths(case, context), page_size)


def latent_cache_shape(lay: TokenLayout) -> tuple[int, int, int]:
    """MLATokenToKVPool's buffer: (size + page_size, 1, 512 + 64) (memory_pool.py _create_buffers)."""
    return (lay.buffer_rows, 1, LATENT)


def fp8_cache(case) -> bool:
    # the reference tables put the fp8 KV switch in mla_dtype (kv_cache_dtype stays bfloat16 there; see
    # docs/research/sglang-0.5.14-dispatch.md section 4): either field asks for an fp8 latent cache
    return "fp8" in (case.mla_dtype, case.kv_cache_dtype)


def dims(backend: str, context: bool) -> tuple[int, int]:
    """(q/k head dim, v head dim) the attention sees: the latent dims, or trtllm_mla's unabsorbed prefill."""
    if backend == "trtllm_mla" and context:
        return QK_NOPE_HEAD_DIM + QK_ROPE_HEAD_DIM, V_HEAD_DIM
    return LATENT, KV_LORA_RANK


def footprint(case, context: bool) -> int:
    """The latent cache at the largest page size, q (latent and nope), k, the output before and after W_UV, the
    absorb weights W_UK and W_UV, and the token tables."""
    lay = mla_layout(case, context, MAX_PAGE_SIZE)
    h, t = case.num_heads, lay.num_tokens
    cache = lay.buffer_rows * LATENT * (1 if fp8_cache(case) else 2)
    activations = t * (h * (2 * LATENT + QK_NOPE_HEAD_DIM + KV_LORA_RANK + V_HEAD_DIM) + 2 * LATENT) * 2
    weights = 2 * h * QK_NOPE_HEAD_DIM * KV_LORA_RANK * (1 if case.mla_dtype == "fp8" else 2)
    return cache + activations + weights + (case.batch_size + 1) * lay.seq_len * 4 + t * 16


def select_mla_backend(args) -> str:
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.utils import is_sm100_supported

    if is_sm100_supported():  # DeepSeek V3/R1 with no backend set (server_args.py:3636-3650)
        return "trtllm_mla"
    model = SimpleNamespace(hf_config=SimpleNamespace(architectures=["DeepseekV3ForCausalLM"]))
    return ServerArgs._get_default_attn_backend(args, True, model)


def mla_backend_class(name: str):
    if name == "fa3":
        from sglang.srt.layers.attention.flashattention_backend import FlashAttentionBackend

        return FlashAttentionBackend
    if name == "trtllm_mla":
        from sglang.srt.layers.attention.trtllm_mla_backend import TRTLLMMLABackend

        return TRTLLMMLABackend
    if name == "triton":
        from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

        return TritonAttnBackend
    raise KernelLimit(f"the SGLang MLA runner does not build the {name} backend")


def absorb_weights(num_heads: int, fp8: bool, device: str):
    """W_UK (h, 128, 512) and W_UV (h, 512, 128) in the column-major layout the weight loader leaves them in
    (models/deepseek_common/deepseek_weight_loader.py:584-590); fp8 with one per-tensor scale, as a block-fp8
    kv_b_proj becomes (block_quant_to_tensor_quant, :547-552)."""
    import torch

    w = random_tensor((num_heads, QK_NOPE_HEAD_DIM + V_HEAD_DIM, KV_LORA_RANK), torch.bfloat16, device, 7).mul_(0.05)
    if fp8:
        w = w.to(torch.float8_e4m3fn)
    w_kc, w_vc = w.split([QK_NOPE_HEAD_DIM, V_HEAD_DIM], dim=1)
    w_kc = w_kc.transpose(1, 2).contiguous().transpose(1, 2)
    w_vc = w_vc.contiguous().transpose(1, 2)
    return w_kc, w_vc, torch.ones(1, dtype=torch.float32, device=device) if fp8 else None


def absorb_bmm(x, w, w_scale):
    """x (tokens, h, k) x w (h, k, n) -> (tokens, h, n): forward_mla.py:376-399 and 686-716 on CUDA."""
    import torch

    if w_scale is None:
        return torch.bmm(x.transpose(0, 1), w).transpose(0, 1)
    from sgl_kernel import bmm_fp8
    from sglang.srt.layers.quantization.fp8_kernel import per_tensor_quant_mla_fp8

    x_val, x_scale = per_tensor_quant_mla_fp8(x.transpose(0, 1), torch.zeros(1, dtype=torch.float32, device=x.device))
    return bmm_fp8(x_val, w, x_scale, w_scale, torch.bfloat16).transpose(0, 1)


def prepare(case, dispatch: str, device: str, copies: int, context: bool) -> Prepared:
    for field in ("mla_dtype", "kv_cache_dtype"):
        if getattr(case, field) not in KV_CACHE_DTYPE:
            raise KernelLimit(f"SGLang's MLA runs no {getattr(case, field)} {field}")
    import torch
    from sglang.srt.configs.model_config import AttentionArch
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    from opcollect.backends.sglang.attention import fill_random, forward_batch, model_runner_stand_in, req_to_token_pool
    from opcollect.backends.sglang.context import sglang_context

    with sglang_context(device) as defaults:
        name = select_mla_backend(defaults)
    if name == "triton" and fp8_cache(case):  # the reference collects triton MLA with a bf16 cache only
        raise KernelLimit("SGLang's triton MLA is collected with a bf16 latent cache only")
    page_size = MAX_PAGE_SIZE if name == "trtllm_mla" else 1
    lay = mla_layout(case, context, page_size)
    kv = "fp8" if fp8_cache(case) else "bfloat16"
    server_args = dict(attention_backend=name, page_size=page_size, kv_cache_dtype=KV_CACHE_DTYPE[kv])
    if name == "fa3":
        server_args["disable_chunked_prefix_cache"] = True  # a prompt has no prefix (flashattention_backend.py:1119)
    kv_dtype = torch.float8_e4m3fn if kv == "fp8" else torch.bfloat16
    h, (qk_dim, v_dim) = case.num_heads, dims(name, context)
    with sglang_context(device, **server_args) as args:
        # num_attention_heads are the rank's heads: the runner is a world of one rank (attn_tp_size 1)
        model_config = SimpleNamespace(
            is_encoder_decoder=False,
            context_len=lay.seq_len,
            attention_arch=AttentionArch.MLA,
            num_attention_heads=h,
            kv_lora_rank=KV_LORA_RANK,
            qk_nope_head_dim=QK_NOPE_HEAD_DIM,
            qk_rope_head_dim=QK_ROPE_HEAD_DIM,
            head_dim=256,  # as the reference's mock model config; the MLA paths read the dims above
            v_head_dim=v_dim,
            swa_v_head_dim=v_dim,
            scaling=SCALING,
            is_local_attention_model=False,
            is_hybrid_swa=None,
            attention_chunk_size=None,
            get_num_kv_heads=lambda tp_size: 1,
        )
        model_config.hf_text_config = model_config
        kv_pool = MLATokenToKVPool(
            size=lay.pool_size,
            page_size=page_size,
            dtype=kv_dtype,
            kv_lora_rank=KV_LORA_RANK,
            qk_rope_head_dim=QK_ROPE_HEAD_DIM,
            layer_num=1,
            device=device,
            enable_memory_saver=False,
        )
        fill_random(kv_pool.kv_buffer, 300)
        runner = model_runner_stand_in(
            device, args, lay, kv_dtype, model_config, (req_to_token_pool(lay, device), kv_pool)
        )
        backend = mla_backend_class(name)(runner)
        source = MLA_SOURCE[type(backend).__name__]
        layer = RadixAttention(
            num_heads=h, head_dim=qk_dim, scaling=SCALING, num_kv_heads=1, layer_id=0, v_head_dim=v_dim
        ).to(device)
        batch = forward_batch(lay, context, device)
        with forward_context(ForwardContext(attn_backend=backend)):
            backend.init_forward_metadata(batch)
        t = lay.num_tokens
        absorbed = qk_dim == LATENT
        w_kc, _, w_scale = absorb_weights(h, case.mla_dtype == "fp8", device)  # W_UV: the output BMM, not timed
        q_nope_dim = QK_NOPE_HEAD_DIM if absorbed else qk_dim - QK_ROPE_HEAD_DIM
        raw = [
            (
                random_tensor((t, h, q_nope_dim), torch.bfloat16, device, i),
                random_tensor((t, h, QK_ROPE_HEAD_DIM), torch.bfloat16, device, 100 + i),
                random_tensor((t, 1, v_dim), torch.bfloat16, device, 200 + i),
                random_tensor((t, 1, QK_ROPE_HEAD_DIM), torch.bfloat16, device, 300 + i),
            )
            for i in range(copies)
        ]
        inputs = attention_inputs(raw, w_kc if absorbed else None, w_scale)
        extra = {}
        if name == "trtllm_mla":  # the fused rope + fp8 quant reads a float32 cos/sin cache (forward_mla.py:522-527)
            extra["cos_sin_cache"] = random_tensor((lay.seq_len, QK_ROPE_HEAD_DIM), torch.float32, device, 9)

    def attend(q, q_rope, k_nope, k_rope) -> None:
        with sglang_context(device, **server_args), forward_context(ForwardContext(attn_backend=backend)):
            if name == "triton":  # triton takes q and k whole (forward_mla.py: q_rope/k_rope only for fa3/trtllm)
                layer(torch.cat([q, q_rope], -1), torch.cat([k_nope, k_rope], -1), k_nope, batch)
            else:
                layer(q, k_nope, k_nope, batch, q_rope=q_rope, k_rope=k_rope, **extra)

    return Prepared(rotating_call(attend, inputs), source)


def attention_inputs(raw, w_kc, w_scale) -> list[tuple]:
    """(q, q_rope, k_nope, k_rope) per copy: q is q_nope x W_UK (absorb_bmm, run here once, outside the timed call)
    when ``w_kc`` is given, else q_nope as it is (trtllm_mla's unabsorbed prefill)."""
    return [(q_nope if w_kc is None else absorb_bmm(q_nope, w_kc, w_scale), *rest) for q_nope, *rest in raw]


def rotating_call(attend, inputs):
    """The timed call: ``attend`` on the next copy's inputs, nothing else."""
    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % len(inputs)
        attend(*inputs[i])

    return call
