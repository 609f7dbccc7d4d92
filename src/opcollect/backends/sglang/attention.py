"""Context and generation attention through SGLang 0.5.14's RadixAttention and the backend SGLang selects.

Paths are relative to the wheel's sglang/srt/. The backend is what ServerArgs._get_default_attn_backend returns for
an MHA model on this GPU (server_args.py:4431-4455: fa3 on Hopper, trtllm_mha on SM100/103, flashinfer or triton
elsewhere), after the one model override the grids carry: Gemma-4's heads run trtllm_mha on SM100 and triton
elsewhere (server_args.py:4057-4084). Its class is built as ModelRunner builds it, over SGLang's own token pools
(mem_cache/memory_pool.py MHATokenToKVPool, ReqToTokenPool) sized for the case, with the page size SGLang serves
that backend with: 64 for trtllm_mha (server_args.py:4638-4642), 1 otherwise (server_args.py:4806-4825). A
ForwardBatch in EXTEND (context) or DECODE (generation) mode is planned by the backend's init_forward_metadata,
and each call runs layer(q, k, v, forward_batch) under SGLang's forward_context, so the KV write into the pool is
timed with the attention, as serving runs it.

kernel_source is the backend class SGLang constructed, named as the plan names it (fa3, trtllm_mha, flashinfer,
triton: the reference collector's label, collect_attn.py:714).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from opcollect.runtime.contract import KernelLimit, Prepared
from opcollect.runtime.dtypes import ceil_div
from opcollect.runtime.timing import random_tensor

# the page size SGLang forces for the trtllm backends: trtllm_mha (server_args.py:4638-4642), trtllm_mla
# (server_args.py:4541-4554); every other backend keeps the default page size 1 (server_args.py:4806-4825)
TRTLLM_PAGE_SIZE = 64
MAX_PAGE_SIZE = TRTLLM_PAGE_SIZE
ELEMENT_BYTES = {"bfloat16": 2, "fp8": 1}
KV_CACHE_DTYPE = {"bfloat16": "auto", "fp8": "fp8_e4m3"}  # opcollect -> ServerArgs.kv_cache_dtype
MHA_SOURCE = {
    "FlashAttentionBackend": "fa3",
    "TRTLLMHAAttnBackend": "trtllm_mha",
    "FlashInferAttnBackend": "flashinfer",
    "TritonAttnBackend": "triton",
}


def page_size_for(backend: str) -> int:
    return TRTLLM_PAGE_SIZE if backend.startswith("trtllm") else 1


@dataclass(frozen=True)
class TokenLayout:
    """Every sequence alike, each starting on its own page as SGLang's paged allocator hands them out."""

    batch_size: int
    query_len: int  # new tokens per sequence
    seq_len: int  # tokens per sequence including the new ones
    page_size: int
    pages_per_seq: int
    pool_size: int  # the token pools' size: tokens in real pages
    buffer_rows: int  # rows of each K/V buffer: size + page_size (the padded first page, memory_pool.py)
    req_pool_indices: tuple[int, ...]  # rows of ReqToTokenPool; row 0 is its padding row (free_slots from 1)
    req_to_token: tuple[tuple[int, ...], ...]  # the KV slot of every token of each sequence
    out_cache_loc: tuple[int, ...]  # the slots the new tokens are written to
    positions: tuple[int, ...]  # the position of each new token
    seq_lens: tuple[int, ...]
    prefix_lens: tuple[int, ...]  # tokens already cached before this forward (0 for a prompt)

    @property
    def num_tokens(self) -> int:
        return self.batch_size * self.query_len


def token_layout(batch_size: int, query_len: int, seq_len: int, page_size: int) -> TokenLayout:
    pages = ceil_div(seq_len, page_size)
    # slot 0..page_size-1 is the padded first page, where padded tokens write (memory_pool.py _create_buffers)
    table = tuple(tuple(page_size * (1 + s * pages) + p for p in range(seq_len)) for s in range(batch_size))
    new = range(seq_len - query_len, seq_len)
    size = batch_size * pages * page_size
    return TokenLayout(
        batch_size=batch_size,
        query_len=query_len,
        seq_len=seq_len,
        page_size=page_size,
        pages_per_seq=pages,
        pool_size=size,
        buffer_rows=size + page_size,
        req_pool_indices=tuple(range(1, batch_size + 1)),
        req_to_token=table,
        out_cache_loc=tuple(table[s][p] for s in range(batch_size) for p in new),
        positions=tuple(p for _ in range(batch_size) for p in new),
        seq_lens=(seq_len,) * batch_size,
        prefix_lens=(seq_len - query_len,) * batch_size,
    )


def lengths(case, context: bool) -> tuple[int, int]:
    """(new tokens, tokens) per sequence: a prompt of isl tokens, or one new token after a history of step."""
    return (case.isl, case.isl) if context else (1, case.step + 1)


def attention_layout(case, context: bool, page_size: int) -> TokenLayout:
    return token_layout(case.batch_size, *lengths(case, context), page_size)


def footprint(case, context: bool) -> int:
    """q, k, v and the output of the new tokens, the K and V buffers at the largest page size, the token tables."""
    kv_elem = ELEMENT_BYTES.get(case.kv_cache_dtype, 4)
    lay = attention_layout(case, context, MAX_PAGE_SIZE)
    qkvo = lay.num_tokens * (2 * case.num_heads + 2 * case.num_key_value_heads) * case.head_dim * 2
    pool = lay.buffer_rows * 2 * case.num_key_value_heads * case.head_dim * kv_elem
    return qkvo + pool + (case.batch_size + 1) * lay.seq_len * 4 + lay.num_tokens * 16


def gemma4(case) -> bool:
    from opcollect.plans.attention import _gemma4

    return _gemma4(case)


def select_mha_backend(case, args) -> str:
    """What SGLang serves this layer with on this GPU (inside sglang_context; args: the global ServerArgs)."""
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.utils import is_sm100_supported

    if gemma4(case):  # _handle_model_specific_adjustments, server_args.py:4057-4084
        return "trtllm_mha" if is_sm100_supported() else "triton"
    model = SimpleNamespace(hf_config=SimpleNamespace(architectures=["LlamaForCausalLM"]), has_attention_sinks=False)
    return ServerArgs._get_default_attn_backend(args, False, model)


def backend_class(name: str):
    """The class ModelRunner builds for a backend name (layers/attention/attention_registry.py)."""
    if name == "fa3":
        from sglang.srt.layers.attention.flashattention_backend import FlashAttentionBackend

        return FlashAttentionBackend
    if name == "trtllm_mha":
        from sglang.srt.layers.attention.trtllm_mha_backend import TRTLLMHAAttnBackend

        return TRTLLMHAAttnBackend
    if name == "flashinfer":
        from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend

        return FlashInferAttnBackend
    if name == "triton":
        from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

        return TritonAttnBackend
    raise KernelLimit(f"the SGLang attention runner does not build the {name} backend")


def model_runner_stand_in(device: str, args, lay: TokenLayout, kv_dtype, model_config, pools, window=None):
    """What the backends' __init__ read from a ModelRunner (the reference collector's MockModelRunner plays the
    same part): the installed ServerArgs, the pools, the model dims. No spec decoding, no draft worker."""
    import torch
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    req_pool, kv_pool = pools
    return SimpleNamespace(
        device=device,
        gpu_id=torch.device(device).index or 0,
        dtype=torch.bfloat16,
        kv_cache_dtype=kv_dtype,
        page_size=lay.page_size,
        server_args=args,
        model_config=model_config,
        req_to_token_pool=req_pool,
        token_to_kv_pool=kv_pool,
        token_to_kv_pool_allocator=SimpleNamespace(page_size=lay.page_size, get_kvcache=lambda: kv_pool),
        sliding_window_size=window,
        attention_chunk_size=None,
        tp_size=1,
        attn_cp_size=1,
        is_draft_worker=False,
        spec_algorithm=SpeculativeAlgorithm.NONE,
        is_hybrid=False,
        is_hybrid_swa=False,
        model_is_mrope=False,
        hybrid_gdn_config=None,
        kimi_linear_config=None,
        linear_attn_model_spec=None,
        use_mla_backend=model_config.attention_arch.name == "MLA",
    )


def req_to_token_pool(lay: TokenLayout, device: str):
    import torch
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool

    pool = ReqToTokenPool(size=lay.batch_size, max_context_len=lay.seq_len, device=device, enable_memory_saver=False)
    rows = torch.tensor(lay.req_pool_indices, dtype=torch.int64, device=device)
    pool.req_to_token[rows] = torch.tensor(lay.req_to_token, dtype=torch.int32, device=device)
    return pool


def forward_batch(lay: TokenLayout, context: bool, device: str):
    """The batch a scheduler hands the model: EXTEND with no cached prefix for a prompt, DECODE for a step."""
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    def i32(values):
        return torch.tensor(values, dtype=torch.int32, device=device)

    seq_lens = i32(lay.seq_lens)
    common = dict(
        batch_size=lay.batch_size,
        input_ids=torch.zeros(lay.num_tokens, dtype=torch.int64, device=device),
        req_pool_indices=torch.tensor(lay.req_pool_indices, dtype=torch.int64, device=device),
        seq_lens=seq_lens,
        out_cache_loc=torch.tensor(lay.out_cache_loc, dtype=torch.int64, device=device),
        seq_lens_sum=sum(lay.seq_lens),
        seq_lens_cpu=seq_lens.cpu(),
        positions=torch.tensor(lay.positions, dtype=torch.int64, device=device),
    )
    if not context:
        return ForwardBatch(forward_mode=ForwardMode.DECODE, **common)
    extend = (lay.query_len,) * lay.batch_size
    return ForwardBatch(
        forward_mode=ForwardMode.EXTEND,
        extend_num_tokens=lay.num_tokens,
        extend_seq_lens=i32(extend),
        extend_prefix_lens=i32(lay.prefix_lens),
        extend_start_loc=i32(tuple(lay.query_len * i for i in range(lay.batch_size))),
        extend_seq_lens_cpu=list(extend),
        extend_prefix_lens_cpu=list(lay.prefix_lens),
        **common,
    )


def fill_random(buffers, seed: int) -> None:
    """Random cache contents in the pool's store dtype (fp8 pools store uint8: fp8 values, viewed)."""
    import torch

    for i, buf in enumerate(buffers):
        values = random_tensor(tuple(buf.shape), torch.bfloat16, str(buf.device), seed + i)
        buf.copy_(values.to(torch.float8_e4m3fn).view(torch.uint8) if buf.dtype == torch.uint8 else values)


def prepare(case, dispatch: str, device: str, copies: int, context: bool) -> Prepared:
    if case.kv_cache_dtype not in KV_CACHE_DTYPE:
        raise KernelLimit(f"SGLang has no {case.kv_cache_dtype} KV cache")
    if case.attn_dtype not in ("bfloat16", "fp8"):
        raise KernelLimit(f"SGLang serves attention in the model dtype (bf16), not {case.attn_dtype}")
    if case.attn_dtype == "fp8" and (case.kv_cache_dtype != "fp8" or not context):
        raise KernelLimit("SGLang computes attention in fp8 only in prefill, over an fp8 KV cache")
    if case.beam_width != 1:
        raise KernelLimit("SGLang serves no beam search; beam_width must be 1")
    import torch
    from sglang.srt.configs.model_config import AttentionArch
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    from opcollect.backends.sglang.context import sglang_context

    h, kvh, d = case.num_heads, case.num_key_value_heads, case.head_dim
    with sglang_context(device) as defaults:
        name = select_mha_backend(case, defaults)
    fp8_kv = case.kv_cache_dtype == "fp8"
    # fa3 (head_dim <= 256, flashattention_backend.py:857-872) and trtllm_mha quantize q to the fp8 KV dtype
    # themselves: on those a bf16-compute prefill over an fp8 cache does not exist, it is the fp8 row; flashinfer and
    # triton read an fp8 cache with bf16 queries and have no fp8 prefill compute
    q_quantized = fp8_kv and (name == "trtllm_mha" or (name == "fa3" and d <= 256))
    if context and q_quantized != (case.attn_dtype == "fp8"):
        raise KernelLimit(f"SGLang's {name} computes this prefill in {'fp8' if q_quantized else 'bf16'}")
    lay = attention_layout(case, context, page_size_for(name))
    server_args = dict(
        attention_backend=name, page_size=lay.page_size, kv_cache_dtype=KV_CACHE_DTYPE[case.kv_cache_dtype]
    )
    # SGLang passes a model's sliding window minus one (get_attention_sliding_window_size; the reference passes
    # 1023 for Gemma-4's 1024, Gemma4ForConditionalGeneration_cases.yaml:43). The pool keeps every key: serving a
    # hybrid-SWA model frees keys before the window (SWAKVPool), which the kernel does not read either way
    window = case.window_size - 1 if case.window_size else -1
    kv_dtype = torch.float8_e4m3fn if fp8_kv else torch.bfloat16
    with sglang_context(device, **server_args) as args:
        hf = SimpleNamespace(architectures=["LlamaForCausalLM"], num_attention_heads=h, num_key_value_heads=kvh)
        hf.head_dim, hf.hidden_size, hf.attn_logit_softcapping = d, h * d, None
        model_config = SimpleNamespace(
            is_encoder_decoder=False,
            context_len=lay.seq_len,
            attention_arch=AttentionArch.MHA,
            num_attention_heads=h,
            num_key_value_heads=kvh,
            head_dim=d,
            v_head_dim=d,
            swa_v_head_dim=d,
            hidden_size=h * d,
            hf_config=hf,
            hf_text_config=hf,
            is_multimodal=False,
            is_local_attention_model=False,
            is_hybrid_swa=False,
            attention_chunk_size=None,
            get_num_kv_heads=lambda tp_size: kvh,
        )
        kv_pool = MHATokenToKVPool(
            size=lay.pool_size,
            page_size=lay.page_size,
            dtype=kv_dtype,
            head_num=kvh,
            head_dim=d,
            layer_num=1,
            device=device,
            enable_memory_saver=False,
        )
        fill_random(kv_pool.k_buffer + kv_pool.v_buffer, 300)
        pools = (req_to_token_pool(lay, device), kv_pool)
        runner = model_runner_stand_in(device, args, lay, kv_dtype, model_config, pools, window if window > 0 else None)
        backend = backend_class(name)(runner)
        source = MHA_SOURCE[type(backend).__name__]
        layer = RadixAttention(
            num_heads=h, head_dim=d, scaling=d**-0.5, num_kv_heads=kvh, layer_id=0, sliding_window_size=window
        ).to(device)
        batch = forward_batch(lay, context, device)
        with forward_context(ForwardContext(attn_backend=backend)):
            backend.init_forward_metadata(batch)
        t = lay.num_tokens
        # bf16 inputs also for an fp8 row: the backend quantizes q itself, as serving feeds it (see q_quantized)
        qs = [random_tensor((t, h * d), torch.bfloat16, device, i) for i in range(copies)]
        ks = [random_tensor((t, kvh * d), torch.bfloat16, device, 100 + i) for i in range(copies)]
        vs = [random_tensor((t, kvh * d), torch.bfloat16, device, 200 + i) for i in range(copies)]
    # one pool for every input set: a cache small enough to stay in L2 reads faster than in serving, so small cases
    # may time a little low; the per-set q, k, v are rotated as elsewhere
    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        with sglang_context(device, **server_args), forward_context(ForwardContext(attn_backend=backend)):
            layer(qs[i], ks[i], vs[i], batch)

    return Prepared(call, source)
