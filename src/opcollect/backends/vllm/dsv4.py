"""DeepSeek-V4's attention as vLLM 0.24.0 serves it, at one rank: the whole module of a CSA (compress ratio 4) or HCA
(128) layer, prefill and decode (dsv4_{csa,hca}_{context,generation}_module_perf), the HCA layer's sparse MLA alone
(dsv4_hca_attn_module_perf) and the CSA indexer's paged MQA logits kernel (dsv4_paged_mqa_logits_module_perf).

What is built is what serving builds for one decoder layer (DeepseekV4DecoderLayer, models/deepseek_v4/nvidia/
model.py:774-791), with the rank's heads (dsv4_inputs):
- the attention class vLLM selects, _select_dsv4_attn_cls (nvidia/model.py:738-769: DeepseekV4FlashMLAAttention
  except on SM12x), under the case's VllmConfig with bf16 torch's default dtype, its hf_config vLLM's own
  DeepseekV4Config (transformers_utils/configs/deepseek_v4.py) holding the checkpoint's keys with the rank's heads and
  output groups and compress_ratios [ratio] (one layer, as the reference: collector/vllm/collect_dsv4_attn.py:
  126-143), the quant config the checkpoint's quantization_config gives (DeepseekV4FP8Config.from_config: vLLM
  overrides fp8 to deepseek_v4_fp8 for this model type, models/deepseek_v4/quant_config.py:118-130); with it the
  layer's compressor, sliding-window cache and, for CSA, its indexer (attention.py:97-318, 663-802);
- the shared top-k buffer and three aux streams DeepseekV4Model allocates (nvidia/model.py:944-955);
- weights filled and post-processed as the model loader does (mla.fill_and_process);
- every cache layer the module registers (the compressed MLA cache, the sliding-window cache, the indexer's key cache,
  each compressor's state cache) in its backend's shape and its spec's page stride, with its backend's own metadata
  builder run on the batch at its page size (dsv4_inputs.layout), as serving's runner builds one per KV cache group.
A module row runs module(positions, hidden_states, None) under set_forward_context: the input GEMMs on their streams,
the q/kv norms, wq_b and the fused q-norm/RoPE/fp8 cache insert, the compressor(s), for CSA the indexer (its query,
paged MQA logits and top-k), FlashMLA's sparse attention and the grouped output projection (attention.py:320-507;
nvidia/flashmla.py). An hca_attn row runs forward_mqa alone over the same caches (collector :674-711), a paged MQA
logits row DeepGEMM's kernel on the reference's inputs (collector :596-671). kernel_source: the layer's backend,
get_attn_backend().get_name(), and the DeepGEMM entry point for the logits, as the reference labels them (:565, :743).

Keys (dsv4_inputs.lengths): a context row is isl new tokens after `step` cached ones; a decode row one new token after
`step` cached ones; an hca_attn row isl new tokens after `step`.

Module rows are timed as serving runs the batch (dsv4_inputs.graph_mode): a decode batch up to the largest capture
size (512) from one CUDA graph of the forward; any other batch up to 512 tokens from vLLM's breakable capture (graph
pieces around attention_impl, which runs eagerly: attention.py:428); a larger batch eagerly. The breakable and eager
rows are timed eagerly (graph_safe False). hca_attn and paged MQA logits rows replay one CUDA graph, as the reference.

Deliberate differences from the reference collector (collect_dsv4_attn.py, none in the key columns):
- The reference replays every module row from one CUDA graph of the whole forward: its plain capture runs
  attention_impl inside the graph. Prefills carry the eager attention's launches here, as serving runs them.
- Each cache layer has a page table at its own page size; the reference builds one at 64 tokens for the MLA, SWA and
  indexer caches (:311-322) and remaps only the compressor states (:346-364).
- Weights, hidden states and caches hold random finite values, not constants 0.01 and zeros (:281-291, :533-538):
  the indexer's top-k then ranks varied scores.
- The config is built from the checkpoint's keys (dsv4_inputs.MODELS) with vLLM's DeepseekV4Config, not read from a
  config.json in a temporary directory; the rank's heads are the config's heads at TP 1, not TP patched into vLLM's
  linear layers (:146-184): the shapes are the same, and no collective runs in either.
- Batch limits and CUDA-graph sizes are serving's (context.serve_batch), not max_num_batched_tokens max(b * s, 2048)
  and max_num_seqs b (:214-231); they size buffers. max_model_len is the reference's, max(tokens, 4096), not serving's
  1048576, whose buffers (the C128A indices, the indexer's expanded page table, both by max_num_batched_tokens) would
  not fit the largest prefills.
- Paged MQA logits rows keep the reference's inputs, causal lengths running on across the batch_size x isl packed rows
  (:628-634), not per request as serving's indexer has them (plans/dsv4_kernels.py).
"""

from __future__ import annotations

from opcollect.backends.vllm import dsv4_inputs as inputs
from opcollect.backends.vllm import mla, msa
from opcollect.backends.vllm.dsa import common_metadata
from opcollect.runtime.contract import KernelLimit, Prepared
from opcollect.runtime.timing import random_tensor

CACHE_DTYPE = "fp8"  # --kv-cache-dtype fp8, which the FlashMLA layer canonicalizes to fp8_ds_mla (attention.py:64-91)
PREFIX = "model.layers.0.attn"  # as DeepseekV4DecoderLayer names it (nvidia/model.py:786-791)
PAGED_LABEL = "vllm.utils.deep_gemm.fp8_fp4_paged_mqa_logits"
AUX_STREAMS = 3  # nvidia/model.py:944-948


def check_case(case, query: str = "bfloat16") -> dict:
    """The model's config keys; KernelLimit, before any framework import, for what vLLM cannot serve."""
    if case.mla_dtype != query:
        raise KernelLimit(f"vLLM's DeepSeek-V4 rows take a {query} query, not {case.mla_dtype}")
    if case.kv_cache_dtype != CACHE_DTYPE:
        raise KernelLimit(f"vLLM labels DeepSeek-V4's e4m3 cache fp8; no {case.kv_cache_dtype} cache here")
    if case.gemm_type != "fp8_block":
        raise KernelLimit(f"DeepSeek-V4's checkpoints serve block-fp8 projections only, not {case.gemm_type}")
    if case.compress_ratio not in inputs.STATE_BYTES:
        raise KernelLimit(f"DeepSeek-V4's compressed layers have ratio 4 or 128, not {case.compress_ratio}")
    keys = inputs.model_keys(case.model)
    native = keys["num_attention_heads"]
    if native % case.tp_size or keys["o_groups"] % case.tp_size or rank_heads(case) * case.tp_size != native:
        raise KernelLimit(f"{case.model}'s {native} heads give no rank {rank_heads(case)} heads at TP {case.tp_size}")
    return keys


def rank_heads(case) -> int:
    return getattr(case, "local_num_heads", case.num_heads)


def hf_config(keys: dict, heads: int, tp: int, ratio: int):
    """vLLM's DeepseekV4Config with the checkpoint's keys, one layer of ``ratio``, the rank's heads and groups."""
    from vllm.transformers_utils.configs.deepseek_v4 import DeepseekV4Config

    fields = {k: v for k, v in keys.items() if k != "rope_scaling"}
    fields.update(num_attention_heads=heads, o_groups=keys["o_groups"] // tp, num_hidden_layers=1,
                  compress_ratios=[ratio])  # fmt: skip
    return DeepseekV4Config(rope_scaling=dict(keys["rope_scaling"]), **fields)


def stand_in(config, hf, max_model_len: int) -> None:
    """What the module and the builders read off the ModelConfig (context.model_stand_in holds the rest)."""
    model = config.model_config
    model.hf_config = model.hf_text_config = hf
    model.max_model_len = max_model_len
    model.get_num_attention_heads = lambda parallel_config=None: hf.num_attention_heads
    model.get_num_kv_heads = lambda parallel_config=None: 1
    model.get_head_size = lambda: hf.head_dim
    model.is_mm_prefix_lm = False
    model.use_mla = True


def attention_class():
    """The class vLLM selects for the device, its module imported with breakable CUDA graphs on (msa.breakable_graphs),
    as a serving process of DeepSeek-V4 has them, so attention_impl ends a captured piece (attention.py:428)."""
    with msa.breakable_graphs():
        from vllm.models.deepseek_v4.nvidia.model import _select_dsv4_attn_cls
    return _select_dsv4_attn_cls


def check_breakable(cls) -> None:
    """attention_impl carries its eager break: functools.wraps leaves __wrapped__ on the decorated method."""
    if not hasattr(cls.attention_impl, "__wrapped__"):
        raise RuntimeError(
            f"vllm.models.deepseek_v4.attention was imported in this worker with {msa.BREAKABLE} off, so its "
            "attention would be captured whole: run vLLM DeepSeek-V4 plans in a worker of their own"
        )


def build_module(case, keys: dict, config, device: str, model_len: int):
    """The layer's attention as DeepseekV4DecoderLayer builds it, its weights filled and post-processed."""
    import torch

    hf = hf_config(keys, rank_heads(case), case.tp_size, case.compress_ratio)
    stand_in(config, hf, model_len)
    select = attention_class()
    cls = select(config)
    check_breakable(cls)
    backend = cls.backend_cls
    if inputs.MLA_BLOCK not in backend.get_supported_kernel_block_sizes():
        raise KernelLimit(f"{backend.get_name()} takes no {inputs.MLA_BLOCK}-token pages")
    config.cache_config.block_size = inputs.MLA_BLOCK  # the MLA and indexer specs read it (attention.py:611, :650)
    tokens = config.scheduler_config.max_num_batched_tokens
    topk = torch.empty(tokens, keys["index_topk"], dtype=torch.int32, device=device)  # nvidia/model.py:951-955
    streams = [torch.cuda.Stream(device=device) for _ in range(AUX_STREAMS)]
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # the model's dtype: parameters and the rope table
    try:
        with torch.device(device):
            module = cls(config, prefix=PREFIX, topk_indices_buffer=topk, aux_stream_list=streams)
            mla.fill_and_process(module, torch.bfloat16, device)
    finally:
        torch.set_default_dtype(previous)
    if module.n_local_heads != rank_heads(case):  # the rank's heads reached the layer (attention.py:170-171)
        raise RuntimeError(f"DeepSeek-V4 layer has {module.n_local_heads} heads, the case {rank_heads(case)}")
    return module


def cache_layers(module, config) -> list:
    """Every layer the module registered that has a cache: the compressed MLA cache (the module), the sliding-window
    cache, the indexer's keys, each compressor's states (collector :308-364)."""
    found = [module, module.swa_cache_layer]
    compressors = [module.compressor]
    if module.indexer is not None:
        found.append(module.indexer.k_cache)
        compressors.append(module.indexer.compressor)
    found += [c.state_cache for c in compressors if c is not None]
    registered = config.compilation_config.static_forward_context
    return [registered[layer.prefix] for layer in found]


def allocate(backend, spec, num_blocks: int, device: str, generator):
    """A cache in its backend's shape at the spec's stored page size, pages strided by the spec's padded page size
    (collector :378-395), every byte filled (dsv4_inputs.fill_pages)."""
    import torch

    dtype_str = getattr(spec, "cache_dtype_str", None) or "auto"
    block = getattr(spec, "storage_block_size", spec.block_size)
    shape = backend.get_kv_cache_shape(num_blocks, block, spec.num_kv_heads, spec.head_size, dtype_str)
    item = torch.empty((), dtype=spec.dtype).element_size()
    dense = 1
    for n in shape[1:]:
        dense *= n
    page = spec.page_size_bytes // item if getattr(spec, "page_size_padded", None) else dense
    raw = torch.empty(num_blocks * page * item, dtype=torch.uint8, device=device)
    inputs.fill_pages(raw, spec.dtype, generator)
    inner = [1]  # contiguous within a page
    for n in reversed(shape[2:]):
        inner.insert(0, inner[0] * n)
    strides = [page, *inner]
    return raw.view(spec.dtype).as_strided(shape, strides)


def bind(module, config, b, device: str, copies: int):
    """(metadata by layer, slot mappings by layer, [caches by layer] per copy, positions) for the batch."""
    import torch

    new = torch.arange(b.seq_len - b.query_len, b.seq_len, dtype=torch.int64)
    positions = new.repeat(b.batch_size).to(device)  # each new token's position, int64 as the insert needs (:553)
    metadata, slots, owners = {}, {}, []
    for layer in cache_layers(module, config):
        spec = layer.get_kv_cache_spec(config)
        if spec is None:
            continue
        backend = layer.get_attn_backend()
        layout = inputs.layout(b, spec.block_size)
        common, _ = common_metadata(layout, device, positions=positions)
        metadata[layer.prefix] = backend.get_builder_cls()(spec, [layer.prefix], config, torch.device(device)).build(
            common_prefix_len=0, common_attn_metadata=common
        )
        slots[layer.prefix] = common.slot_mapping
        owners.append((layer, backend, spec, layout.num_blocks))
    caches = []
    for i in range(copies):
        gen = torch.Generator(device=device).manual_seed(i)
        caches.append([(layer, allocate(backend, spec, n, device, gen)) for layer, backend, spec, n in owners])
    return metadata, slots, caches, positions


def footprint(case, context: bool) -> int:
    return inputs.footprint_bytes(case, context, rank_heads(case))


def hca_footprint(case) -> int:
    return inputs.footprint_bytes(case, True, rank_heads(case), module=False)


def setup(case, keys: dict, context: bool, device: str, copies: int):
    """The built module and its bound batch inside a fresh vLLM context (context.vllm_context)."""
    import torch
    from vllm.models.deepseek_v4.quant_config import DeepseekV4FP8Config
    from vllm.v1.worker.workspace import init_workspace_manager, reset_workspace_manager

    from opcollect.backends.vllm.context import serve_batch, vllm_context

    b = inputs.batch(case, context)
    quant = DeepseekV4FP8Config.from_config(keys["quantization_config"])
    with vllm_context(device, quant_config=quant) as config:
        serve_batch(config, case.batch_size, b.num_tokens)  # serving's batch limits, before the builders read them
        config.cache_config.cache_dtype = CACHE_DTYPE
        # a fresh manager per case: its workspace only grows (v1/worker/workspace.py:216-236)
        reset_workspace_manager()
        init_workspace_manager(torch.device(device))
        module = build_module(case, keys, config, device, inputs.max_model_len(case, context))
        bound = bind(module, config, b, device, copies)
    return config, module, b, bound


def run_in(config, metadata, slots, b, mode: str | None = None):
    """The forward context a call runs in, as the model runner sets it (one KV cache group per cache layer)."""
    from contextlib import ExitStack

    import torch
    from vllm.config import CUDAGraphMode, set_current_vllm_config
    from vllm.forward_context import set_forward_context

    stack = ExitStack()
    stack.enter_context(set_current_vllm_config(config, check_compile=False))
    runtime = {} if mode is None else {"cudagraph_runtime_mode": getattr(CUDAGraphMode, mode)}
    stack.enter_context(set_forward_context(metadata, config, num_tokens=b.num_tokens, slot_mapping=slots, **runtime))
    stack.enter_context(torch.inference_mode())  # as serving's worker runs the model
    return stack


def prepare(case, dispatch: str, device: str, copies: int, context: bool) -> Prepared:
    keys = check_case(case)
    mode = inputs.graph_mode(case, context)
    import torch

    config, module, b, (metadata, slots, caches, positions) = setup(case, keys, context, device, copies)
    hidden = [random_tensor((b.num_tokens, keys["hidden_size"]), torch.bfloat16, device, i) for i in range(copies)]

    def run(i: int, step) -> None:
        for layer, cache in caches[i]:
            layer.kv_cache = cache
        with run_in(config, metadata, slots, b, mode):
            step(i)

    def forward(i: int) -> None:
        module(positions, hidden[i], None)

    return msa.served(run, forward, copies, module.get_attn_backend().get_name(), mode, device)


def prepare_hca(case, dispatch: str, device: str, copies: int) -> Prepared:
    """forward_mqa of the HCA layer over its caches: a bf16 query at FlashMLA's padded heads (collector :674-711)."""
    keys = check_case(case)
    if case.compress_ratio != 128:
        raise KernelLimit(f"dsv4_hca_attn_module times the HCA layer (ratio 128), not ratio {case.compress_ratio}")
    import torch

    config, module, b, (metadata, slots, caches, positions) = setup(case, keys, True, device, copies)
    shape = (b.num_tokens, module.padded_heads, module.head_dim)
    queries = [random_tensor(shape, torch.bfloat16, device, i) for i in range(copies)]
    kv = random_tensor((b.num_tokens, module.head_dim), torch.bfloat16, device, copies)  # read through the caches
    out = torch.empty(shape, dtype=torch.bfloat16, device=device)
    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        for layer, cache in caches[i]:
            layer.kv_cache = cache
        with run_in(config, metadata, slots, b):
            module.forward_mqa(queries[i], kv, positions, out)

    return Prepared(call, module.get_attn_backend().get_name())


def paged_footprint(case) -> int:
    k = inputs.MODELS.get(case.model)
    if k is None:
        return 0
    rows = case.batch_size * case.isl
    c4 = max(1, (rows + case.step) // 4)
    heads, dim = k["index_n_heads"], k["index_head_dim"]
    blocks = -(-c4 // inputs.INDEX_BLOCK)
    per_row = heads * (dim * 3 + 4) + blocks * 4 + c4 * 4  # q (bf16 then fp8), weights, page table, logits
    return rows * per_row + blocks * inputs.INDEX_BLOCK * (dim * 2 + inputs.INDEX_TOKEN_BYTES) + 2**20


def prepare_paged(case, dispatch: str, device: str, copies: int) -> Prepared:
    """DeepGEMM's paged MQA logits through vLLM's wrapper, on the reference's inputs (collector :596-671): m = batch x
    isl fp8 query rows of index_n_heads x index_head_dim, fp32 head weights, one request's fp8 indexer pages of
    (step + m) // 4 compressed tokens shared by every row, causal lengths (step + 1 .. step + m) // 4."""
    keys = check_case(case, query="fp8_e4m3")
    if case.compress_ratio != 4:
        raise KernelLimit(f"paged MQA logits score the CSA indexer (ratio 4), not ratio {case.compress_ratio}")
    import torch
    from vllm.utils.deep_gemm import fp8_fp4_paged_mqa_logits, get_paged_mqa_logits_metadata
    from vllm.utils.platform_utils import num_compute_units

    m, heads, dim = case.batch_size * case.isl, keys["index_n_heads"], keys["index_head_dim"]
    c4 = max(1, (m + case.step) // 4)
    blocks = -(-c4 // inputs.INDEX_BLOCK)
    index = torch.device(device).index or 0
    lengths = (torch.arange(case.step + 1, case.step + m + 1, device=device) // 4).clamp(min=1).to(torch.int32)
    lengths = lengths.view(m, 1)
    table = torch.arange(blocks, dtype=torch.int32, device=device).expand(m, blocks).contiguous()
    schedule = get_paged_mqa_logits_metadata(lengths, inputs.INDEX_BLOCK, num_compute_units(index))
    rows = []
    for i in range(copies):
        gen = torch.Generator(device=device).manual_seed(i)
        q = random_tensor((m, 1, heads, dim), torch.bfloat16, device, 3 * i).to(torch.float8_e4m3fn)
        pages = torch.empty(blocks, inputs.INDEX_BLOCK, 1, dim + 4, dtype=torch.uint8, device=device)
        flat = pages.view(blocks, -1)  # a page: 64 x dim fp8 values, then 64 fp32 scales (collector :586-593)
        flat[:, : inputs.INDEX_BLOCK * dim].random_(inputs.FP8_LOW, inputs.FP8_HIGH, generator=gen)
        flat[:, inputs.INDEX_BLOCK * dim :].view(torch.float32).fill_(2.0**-6)
        rows.append((q, pages, random_tensor((m, heads), torch.float32, device, 3 * i + 1)))
    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        q, pages, weights = rows[i]
        fp8_fp4_paged_mqa_logits(
            (q, None), pages, weights, lengths, table, schedule, max_model_len=c4, clean_logits=False
        )

    return Prepared(call, PAGED_LABEL)
