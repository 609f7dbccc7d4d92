"""Context and generation attention through vLLM 0.24.0's own Attention layer, as its platform selects the backend.

The layer is built under the current VllmConfig with bf16 as torch's default dtype (the selector reads it:
model_executor/layers/attention/attention.py:317-327), its backend's metadata builder plans the batch
(v1/attention/backend.py:578-649), a paged KV cache in the backend's shape and stride order is bound to the layer,
and each call runs layer(q, k, v) under set_forward_context with the layer's slot mapping, so the KV write
(unified_kv_cache_update, attention.py:724) is timed with the attention, as serving runs it.

kernel_source is read from what vLLM chose: FLASH_ATTN -> vllm_flash_attn_fa{impl.vllm_flash_attn_version}
(flash_attn.py:666-669), FLASHINFER -> vllm_flashinfer_<metadata class of the prefill or decode part>
(flashinfer.py:463-560), any other backend -> vllm_<backend name lower case> (e.g. vllm_triton_attn).
"""

from __future__ import annotations

from dataclasses import dataclass

from opcollect.runtime.contract import KernelLimit, Prepared
from opcollect.runtime.dtypes import ceil_div
from opcollect.runtime.timing import random_tensor

# vLLM's default page size, kept by FLASH_ATTN and FLASHINFER (config/cache.py:46; platforms/interface.py:593-626
# with backend.get_preferred_block_size, v1/attention/backend.py:194-202)
SERVING_BLOCK_SIZE = 16
NULL_BLOCK = 0  # vLLM's block pool reserves block 0 as the null block that unused page-table entries point at
ELEMENT_BYTES = {"bfloat16": 2, "float16": 2, "fp8": 1}
# the opcollect KV dtype -> vLLM's cache_dtype string: "auto" is the model dtype (bf16), as serving passes it
CACHE_DTYPE = {"bfloat16": "auto", "fp8": "fp8"}


@dataclass(frozen=True)
class AttentionLayout:
    """The batch one call runs: every sequence alike."""

    batch_size: int
    query_len: int  # new tokens per sequence
    seq_len: int  # tokens per sequence including the new ones (CommonAttentionMetadata.seq_lens)
    block_size: int
    first_block: int  # the first page a sequence keeps: earlier pages lie outside the sliding window
    blocks_per_seq: int  # page-table width: cdiv(seq_len, block_size)
    num_blocks: int  # pages allocated: the null block plus the kept pages of every sequence
    page_table: tuple[tuple[int, ...], ...]
    slot_mapping: tuple[int, ...]  # one cache slot per new token
    query_start_loc: tuple[int, ...]
    seq_lens: tuple[int, ...]
    kv_cache_shape: tuple[int, ...]  # (num_blocks, 2, block_size, num_kv_heads, head_size), logical order

    @property
    def num_tokens(self) -> int:
        return self.batch_size * self.query_len


def lengths(case, context: bool) -> tuple[int, int]:
    """(new tokens, tokens) per sequence: a prompt of isl tokens, or one new token after a history of step."""
    return (case.isl, case.isl) if context else (1, case.step + 1)


def attention_layout(case, context: bool, block_size: int = SERVING_BLOCK_SIZE) -> AttentionLayout:
    query_len, seq_len = lengths(case, context)
    blocks_per_seq = ceil_div(seq_len, block_size)
    # a prompt's queries together see every key; a decode step only the last window_size keys. vLLM's sliding-window
    # manager frees pages wholly before the window and points their entries at the null block
    # (v1/core/single_type_kv_cache_manager.py SlidingWindowManager); the kernel reads only keys in the window
    first_key = 0 if context or not case.window_size else max(0, seq_len - case.window_size)
    first_block = first_key // block_size
    kept = blocks_per_seq - first_block
    b = case.batch_size
    table = tuple(
        tuple(NULL_BLOCK if j < first_block else 1 + s * kept + j - first_block for j in range(blocks_per_seq))
        for s in range(b)
    )
    slots = tuple(
        table[s][pos // block_size] * block_size + pos % block_size
        for s in range(b)
        for pos in range(seq_len - query_len, seq_len)
    )
    num_blocks = 1 + b * kept
    return AttentionLayout(
        batch_size=b,
        query_len=query_len,
        seq_len=seq_len,
        block_size=block_size,
        first_block=first_block,
        blocks_per_seq=blocks_per_seq,
        num_blocks=num_blocks,
        page_table=table,
        slot_mapping=slots,
        query_start_loc=tuple(query_len * i for i in range(b + 1)),
        seq_lens=(seq_len,) * b,
        kv_cache_shape=(num_blocks, 2, block_size, case.num_key_value_heads, case.head_dim),
    )


def footprint(case, context: bool) -> int:
    """q, k, v and the output of the new tokens, the KV pages, the page table and slot mapping."""
    elem = ELEMENT_BYTES.get(case.attn_dtype, 4)
    kv_elem = ELEMENT_BYTES.get(case.kv_cache_dtype, 4)
    query_len, seq_len = lengths(case, context)
    tokens = case.batch_size * query_len
    qkvo = tokens * (2 * case.num_heads + 2 * case.num_key_value_heads) * case.head_dim * elem
    blocks_per_seq = ceil_div(seq_len, SERVING_BLOCK_SIZE)
    # upper bound: a sliding window frees pages (attention_layout), counted here as if kept
    pages = (1 + case.batch_size * blocks_per_seq) * 2 * SERVING_BLOCK_SIZE * case.num_key_value_heads * case.head_dim
    return qkvo + pages * kv_elem + case.batch_size * blocks_per_seq * 4 + tokens * 8


def kernel_source(layer, metadata) -> str:
    """The kernel vLLM chose for this layer and batch, named as the reference collector names it."""
    name = layer.attn_backend.get_name()
    if name == "FLASH_ATTN":
        return f"vllm_flash_attn_fa{layer.impl.vllm_flash_attn_version}"
    if name == "FLASHINFER":
        part = metadata.prefill if metadata.prefill is not None else metadata.decode
        return "vllm_flashinfer_" + type(part).__name__.lower()
    return "vllm_" + name.lower()


def model_stand_in_for(config, num_heads: int, num_kv_heads: int, head_size: int, max_model_len: int) -> None:
    """Add what the metadata builders and the layer read from a ModelConfig to context.py's stand-in
    (flash_attn.py:331-336, flashinfer.py:596-597,638; attention.py:306)."""
    model = config.model_config
    model.get_num_attention_heads = lambda parallel_config=None: num_heads
    model.get_num_kv_heads = lambda parallel_config=None: num_kv_heads
    model.get_head_size = lambda: head_size
    model.max_model_len = max_model_len
    model.is_mm_prefix_lm = False
    model.use_mla = False


def allocate_cache(
    backend, layout: AttentionLayout, num_kv_heads: int, head_size: int, cache_dtype: str, dtype, device
):
    """A cache as vLLM's runner allocates it: the backend's shape, laid out in its stride order
    (v1/worker/gpu_model_runner.py _reshape_kv_cache_tensors; flash_attn.py:152-171, flashinfer.py:389-408)."""
    import torch

    shape = backend.get_kv_cache_shape(layout.num_blocks, layout.block_size, num_kv_heads, head_size, cache_dtype)
    try:
        order = tuple(backend.get_kv_cache_stride_order())
    except (AttributeError, NotImplementedError):
        order = tuple(range(len(shape)))
    physical = torch.empty(tuple(shape[i] for i in order), dtype=torch.bfloat16, device=device).uniform_(-0.5, 0.5)
    if dtype == torch.uint8:  # fp8 caches are stored as uint8 (kv_cache_dtype_str_to_dtype): fp8 values, viewed
        physical = physical.to(torch.float8_e4m3fn).view(torch.uint8)
    elif dtype != torch.bfloat16:
        physical = physical.to(dtype)
    return physical.permute(*tuple(order.index(i) for i in range(len(order))))


def common_metadata(layout: AttentionLayout, device: str):
    import torch
    from vllm.v1.attention.backend import CommonAttentionMetadata

    query_start_loc_cpu = torch.tensor(layout.query_start_loc, dtype=torch.int32)
    seq_lens_cpu = torch.tensor(layout.seq_lens, dtype=torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=query_start_loc_cpu.to(device),
        query_start_loc_cpu=query_start_loc_cpu,
        seq_lens=seq_lens_cpu.to(device),
        num_reqs=layout.batch_size,
        num_actual_tokens=layout.num_tokens,
        max_query_len=layout.query_len,
        max_seq_len=layout.seq_len,
        block_table_tensor=torch.tensor(layout.page_table, dtype=torch.int32, device=device),
        slot_mapping=torch.tensor(layout.slot_mapping, dtype=torch.int64, device=device),
        causal=True,
        seq_lens_cpu_upper_bound=seq_lens_cpu,
    )


def prepare(case, dispatch: str, device: str, copies: int, context: bool) -> Prepared:
    if case.attn_dtype not in ("bfloat16", "float16"):
        raise KernelLimit(f"vLLM's attention backends take bf16/fp16 activations, not {case.attn_dtype}")
    if case.kv_cache_dtype not in CACHE_DTYPE:
        raise KernelLimit(f"vLLM has no {case.kv_cache_dtype} KV cache")
    if case.beam_width != 1:
        raise KernelLimit("vLLM serves no beam search in its attention kernels; beam_width must be 1")
    import torch
    from vllm.config import CacheConfig, set_current_vllm_config
    from vllm.forward_context import set_forward_context
    from vllm.model_executor.layers.attention import Attention

    from opcollect.backends.vllm.context import serve_batch, vllm_context

    dtype = torch.bfloat16 if case.attn_dtype == "bfloat16" else torch.float16
    cache_dtype = CACHE_DTYPE[case.kv_cache_dtype]
    h, kvh, d = case.num_heads, case.num_key_value_heads, case.head_dim
    name = "opcollect.attn"  # each prepare has a fresh VllmConfig, so its own static_forward_context
    with vllm_context(device) as config:
        query_len, seq_len = lengths(case, context)
        # batch limits, CUDA-graph sizes and eager kernels as served, before the layer and its builder read them
        serve_batch(config, case.batch_size, case.batch_size * query_len)
        model_stand_in_for(config, h, kvh, d, max_model_len=seq_len)
        config.model_config.dtype = dtype
        config.cache_config.cache_dtype = cache_dtype
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.device(device):
                layer = Attention(
                    num_heads=h,
                    head_size=d,
                    scale=d**-0.5,
                    num_kv_heads=kvh,
                    cache_config=config.cache_config,
                    per_layer_sliding_window=case.window_size or None,
                    prefix=name,
                )
                layer.process_weights_after_loading(dtype)  # default kv/q scales 1.0 (attention.py:554-568)
        finally:
            torch.set_default_dtype(previous)
        backend = layer.attn_backend
        # serving's page size: the backend's preferred one given vLLM's default (platforms/interface.py:593-626).
        # The reference collector uses 64 everywhere (collect_attn.py:96); 16 pages mean more page-table reads per
        # key, so its times can run a little lower than serving's for long caches
        block_size = backend.get_preferred_block_size(CacheConfig.DEFAULT_BLOCK_SIZE)
        config.cache_config.block_size = block_size
        layout = attention_layout(case, context, block_size)
        spec = layer.get_kv_cache_spec(config)
        builder = backend.get_builder_cls()(spec, [name], config, torch.device(device))
        metadata = builder.build(common_prefix_len=0, common_attn_metadata=common_metadata(layout, device))
        source = kernel_source(layer, metadata)
        cache_torch_dtype = layer.kv_cache_torch_dtype
        caches = [
            allocate_cache(backend, layout, kvh, d, cache_dtype, cache_torch_dtype, device) for _ in range(copies)
        ]
        t = layout.num_tokens
        qs = [random_tensor((t, h * d), dtype, device, i) for i in range(copies)]
        ks = [random_tensor((t, kvh * d), dtype, device, 100 + i) for i in range(copies)]
        vs = [random_tensor((t, kvh * d), dtype, device, 200 + i) for i in range(copies)]
        slot_mapping = {name: torch.tensor(layout.slot_mapping, dtype=torch.int64, device=device)}
    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        layer.kv_cache = caches[i]
        # the fp8 cache: Attention.forward quantizes q itself through layer.query_quant (attention.py:476-486), as in
        # serving; the reference collector quantizes q before the call and leaves it out of the time
        with (
            set_current_vllm_config(config, check_compile=False),
            set_forward_context({name: metadata}, config, num_tokens=t, slot_mapping=slot_mapping),
        ):
            layer(qs[i], ks[i], vs[i])

    return Prepared(call, source)
