"""MiniMax-M3's block-sparse attention (MSA) as vLLM 0.24.0 serves it: the whole attention module of a sparse layer at
one rank, prefill and decode (msa_{context,generation}_module_perf).

What is built is what serving builds for the first sparse layer (MiniMaxM3DecoderLayer, models/minimax_m3/nvidia/
model.py:665-679), with the rank's heads (msa_inputs):
- MiniMaxM3SparseAttention (nvidia/model.py:382-534) under the case's VllmConfig, bf16 torch's default dtype, its
  config vLLM's own MiniMaxM3TextConfig (transformers_utils/configs/minimax_m3.py:8-105) holding the checkpoint's keys:
  the fused q/k/v/index_q/index_k projection (MinimaxM3QKVParallelLinearWithIndexer) and o_proj under the gemm_type's
  checkpoint quant config (mla.quant_config), the Gemma norms and partial rope, the attend impl vLLM selects at
  construction (select_main_impl_cls, common/sparse_attention.py:391-422: Triton at SM90, MSA on the SM100 family)
  and the indexer with its key cache (common/indexer.py:457-567).
- The shared top-k buffer MiniMaxM3Model allocates, [index heads, max_num_batched_tokens padded to 4, 16] int32
  (nvidia/model.py:764-781), at serving's batch limits (context.serve_batch).
- Weights filled and post-processed as the model loader does (mla.fill_and_process).
- Both caches in their backends' shapes (msa_inputs), bound to the two layers (<prefix>.attn and
  <prefix>.attn.index_cache), and each backend's own metadata builder run on one batch (common/sparse_attention.py:
  185-269, common/indexer.py:252-325 at SM90; the MSA builders on the SM100 family).
Each call runs module(positions, hidden_states) under set_forward_context with both layers' metadata and slot
mappings: the fused GEMM, the fused norm + rope + K/V and index-key insert (fused_minimax_m3_qknorm_rope_kv_insert),
the indexer's block scores and top-k, the sparse attend over the chosen blocks, then o_proj (nvidia/model.py:
551-632). kernel_source is the attend impl's class, type(impl).__name__, as the reference collector names every row
(collector/vllm/collect_msa_module.py:801-803).

A context row is isl new tokens after `step` cached ones; a decode row one new token after `step` cached ones (step
counts the cached tokens only: msa_inputs.lengths).

Timing as serving runs the batch (msa_inputs.graph_mode): vLLM serves MiniMax-M3 with breakable CUDA graphs
(config/vllm.py:1077-1097). A decode batch up to the largest capture size (512) replays one graph of the whole forward,
its metadata built, as serving captures it, with max_seq_len = max_model_len (v1/worker/gpu_model_runner.py:
2247-2251), which sizes the indexer's decode scores and its top-k chunks (common/ops/index_topk.py:787-879). Any
other batch up to 512 tokens replays vLLM's breakable capture (BreakableCUDAGraphCapture): a graph of the projection
and insert, the indexer and attend eagerly (the @eager_break_during_capture of nvidia/model.py:619-631), a graph of
o_proj. A batch above 512 tokens runs eagerly. The breakable and eager rows are timed eagerly (graph_safe False).

Deliberate differences from the reference collector (collect_msa_module.py, none in the key columns):
- The reference replays every row from one CUDA graph of the whole module: its plain capture never opens a breakable
  capture, so the decorator runs the indexer and attend inside the graph (compilation/breakable_cudagraph.py:95-99),
  with metadata of the batch's own max_seq_len. Here prefills of at most 512 tokens carry the eager indexer's and
  attend's launches between two graphs, larger batches every launch, and graph-replayed decodes the top-k chunking
  of max_model_len: rows differ from the reference there by what serving adds.
- Serving pads a graph's batch to its capture size; every batch the grids plan at or under 512 tokens is one (powers
  of two), and no batch is padded here.
- max_model_len is serving's, the checkpoint's max_position_embeddings (1048576), not max(prefix + isl, 4096): it sets
  the page table's width, the rope table and a FULL graph's max_seq_len. Batch limits and CUDA-graph sizes are
  serving's (context.serve_batch), not max_num_batched_tokens max(b * s, 131072) and max_num_seqs b; they size buffers.
- The layer is the first sparse one (model.layers.3), not model.layers.0, which the checkpoint keeps dense; the name
  keys only the forward context.
- Weights, hidden states and caches hold random finite values, not constants 0.01 and zeros: the indexer's top-k
  then ranks varied scores.
- The config is built from the architecture's keys (msa_inputs.MODELS) with vLLM's MiniMaxM3TextConfig, not read
  from a config.json through the reference's _CONFIG_REGISTRY shim; the fields are the same.
- vLLM's decode memory filter (collect_msa_module.py:116-154) is not applied: a case that does not fit is refused at
  run time by its footprint.
"""

from __future__ import annotations

import os
from contextlib import contextmanager, nullcontext

from opcollect.backends.vllm import mla
from opcollect.backends.vllm import msa_inputs as inputs
from opcollect.backends.vllm.dsa import common_metadata
from opcollect.runtime.contract import KernelLimit, Prepared
from opcollect.runtime.timing import is_cuda, random_tensor

CACHE_DTYPE = {"bfloat16": "auto", "fp8": "fp8"}  # as serving passes --kv-cache-dtype (config/cache.py)
# vLLM sets it for MiniMax-M3 (config/vllm.py:1077-1097); @eager_break_during_capture reads it when nvidia/model.py
# is imported (compilation/breakable_cudagraph.py:90-91)
BREAKABLE = "VLLM_USE_BREAKABLE_CUDAGRAPH"


def check_case(case) -> dict:
    """The architecture's config keys; KernelLimit, before any framework import, for what vLLM cannot serve."""
    if case.mla_dtype != "bfloat16":
        raise KernelLimit(f"vLLM's MiniMax-M3 attention computes in the model's bf16, not {case.mla_dtype}")
    if case.kv_cache_dtype not in CACHE_DTYPE:
        raise KernelLimit(f"the vLLM MSA runner has no {case.kv_cache_dtype} KV cache (bf16 or fp8)")
    if case.gemm_type not in mla.GEMM_TYPES:
        raise KernelLimit(f"the vLLM MSA runner has no {case.gemm_type} projections")
    return inputs.model_keys(case.architecture)


def footprint(case, context: bool) -> int:
    return inputs.footprint_bytes(case, context)


def layer_names(keys: dict) -> tuple[str, str, str]:
    """(module prefix, attention layer, index cache layer) as the decoder layer names them (nvidia/model.py:482,
    common/indexer.py:372-378)."""
    prefix = f"model.layers.{inputs.first_sparse_layer(keys)}.self_attn"
    return prefix, f"{prefix}.attn", f"{prefix}.attn.index_cache"


@contextmanager
def breakable_graphs():
    """Breakable CUDA graphs on, as a serving process of MiniMax-M3 has them, while nvidia/model.py is imported, so
    its indexer and attend end a captured graph (nvidia/model.py:619-631); off again after it, so a worker's other
    runners keep their configs (config/vllm.py:1099-1104 reads it too)."""
    previous = os.environ.get(BREAKABLE)
    os.environ[BREAKABLE] = "1"
    try:
        yield
    finally:
        if previous is None:
            del os.environ[BREAKABLE]
        else:
            os.environ[BREAKABLE] = previous


def check_breakable(cls) -> None:
    """The attention's eager break is in place: functools.wraps leaves __wrapped__ on the decorated method."""
    if not hasattr(cls._run_attention, "__wrapped__"):
        raise RuntimeError(
            f"vllm.models.minimax_m3.nvidia.model was imported in this worker with {BREAKABLE} off, so its attention "
            "would be captured whole: run vLLM MSA plans in a worker of their own"
        )


def hf_config(keys: dict, num_heads: int):
    """vLLM's MiniMax-M3 text config with the checkpoint's keys and the rank's heads (msa_inputs)."""
    from vllm.transformers_utils.configs.minimax_m3 import MiniMaxM3TextConfig

    kv = inputs.rank_kv_heads(keys, num_heads)
    sparse = {**keys["sparse_attention_config"], "sparse_num_index_heads": kv}
    fields = {**keys, "num_attention_heads": num_heads, "num_key_value_heads": kv, "sparse_attention_config": sparse}
    return MiniMaxM3TextConfig(architectures=["MiniMaxM3SparseForCausalLM"], **fields)


def build_module(case, keys: dict, config, quant, device: str, max_model_len: int):
    """MiniMaxM3SparseAttention as MiniMaxM3DecoderLayer builds it, its weights filled and post-processed."""
    import torch

    hf = hf_config(keys, case.num_heads)
    model = config.model_config
    # the builders read hf_config's sparse keys (common/indexer.py:229-233), Fp8 linears hf_text_config (context.py)
    model.hf_config = model.hf_text_config = hf
    model.max_model_len = max_model_len
    sparse = hf.sparse_attention_config
    tokens = config.scheduler_config.max_num_batched_tokens
    topk = torch.empty(  # MiniMaxM3Model's shared buffer (nvidia/model.py:769-781)
        sparse["sparse_num_index_heads"], (tokens + 3) // 4 * 4, sparse["sparse_topk_blocks"],
        dtype=torch.int32, device=device,
    )  # fmt: skip
    prefix, _, _ = layer_names(keys)
    with breakable_graphs():
        from vllm.models.minimax_m3.nvidia.model import MiniMaxM3SparseAttention
    check_breakable(MiniMaxM3SparseAttention)
    dtype = torch.bfloat16
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # the model's dtype: parameters and the rope table
    try:
        with torch.device(device):
            module = MiniMaxM3SparseAttention(
                config=hf,
                layer_id=inputs.first_sparse_layer(keys),
                quant_config=quant,
                prefix=prefix,
                cache_config=config.cache_config,
                topk_indices_buffer=topk,
            )
            mla.fill_and_process(module, dtype, device)
    finally:
        torch.set_default_dtype(previous)
    return module


def check_cache_precision(module, kv_cache, kv_cache_dtype: str) -> None:
    """The requested KV precision reached the impl and the cache (as the reference checks, collect_msa_module.py:
    687-708): the impl views an fp8 cache's uint8 bytes as e4m3 (common/sparse_attention.py:298-306)."""
    import torch

    fp8 = kv_cache_dtype == "fp8"
    if bool(module.impl.use_fp8_kv) != fp8 or kv_cache.dtype != (torch.uint8 if fp8 else torch.bfloat16):
        raise RuntimeError(
            f"KV precision mismatch: asked {kv_cache_dtype}, impl use_fp8_kv={module.impl.use_fp8_kv}, "
            f"cache {kv_cache.dtype} (layer cache_dtype {module.kv_cache_dtype!r})"
        )


def caches(layers, config, layout, device: str, seed: int):
    """The K/V cache and the index-key cache, each in its backend's shape and its layer's spec dtype, filled."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    built = []
    for layer, heads in layers:
        spec = layer.get_kv_cache_spec(config)
        shape = layer.get_attn_backend().get_kv_cache_shape(layout.num_blocks, layout.block_size, heads, spec.head_size)
        built.append(torch.empty(shape, dtype=spec.dtype, device=device))
        inputs.fill_cache(built[-1], gen)
    return tuple(built)


def breakable_capture(forward, device: str):
    """vLLM's breakable capture of one forward (compilation/breakable_cudagraph.py:125-230), on a side stream as
    capture needs; its replay runs the graph segments and the eager attention in turn."""
    import torch
    from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphCapture

    stream = torch.cuda.Stream(device=device) if is_cuda(device) else None
    if stream is not None:
        torch.cuda.synchronize(device)
    capture = BreakableCUDAGraphCapture()
    with torch.cuda.stream(stream) if stream is not None else nullcontext(), capture:
        forward()
    if stream is not None:
        stream.synchronize()
    return capture


def prepare(case, dispatch: str, device: str, copies: int, context: bool) -> Prepared:
    keys = check_case(case)
    layout = inputs.msa_layout(case, context)
    mode = inputs.graph_mode(case, context)
    model_len = inputs.max_model_len(case, context)
    import torch
    from vllm.config import CUDAGraphMode, set_current_vllm_config
    from vllm.forward_context import set_forward_context

    from opcollect.backends.vllm.context import serve_batch, vllm_context

    quant = mla.quant_config(case.gemm_type)
    _, attn_name, index_name = layer_names(keys)
    with vllm_context(device, quant_config=quant) as config:
        # serving's batch limits and eager kernels, before the module and the builders read them
        serve_batch(config, case.batch_size, layout.num_tokens)
        config.cache_config.cache_dtype = CACHE_DTYPE[case.kv_cache_dtype]  # the impl picks off it at construction
        config.cache_config.block_size = inputs.BLOCK_SIZE  # both specs read it (nvidia/model.py:540-549)
        module = build_module(case, keys, config, quant, device, model_len)
        layers = config.compilation_config.static_forward_context
        attn, index_layer = layers[attn_name], layers[index_name]
        kv = [caches(((attn, module.num_kv_heads), (index_layer, 1)), config, layout, device, i) for i in range(copies)]
        check_cache_precision(module, kv[0][0], case.kv_cache_dtype)
        common, positions = common_metadata(layout, device, model_len if mode == inputs.FULL else layout.seq_len)
        # each layer's own backend plans the batch (common_prefix_len 0: no cascade), as serving's runner does
        metadata = {
            name: layer.get_attn_backend()
            .get_builder_cls()(layer.get_kv_cache_spec(config), [name], config, torch.device(device))
            .build(common_prefix_len=0, common_attn_metadata=common)
            for name, layer in ((attn_name, attn), (index_name, index_layer))
        }
        shape = (layout.num_tokens, keys["hidden_size"])
        hidden = [random_tensor(shape, torch.bfloat16, device, i) for i in range(copies)]
    # both layers' new-token slots, as the model runner hands each layer its group's (one group here)
    slot_mapping = {attn_name: common.slot_mapping, index_name: common.slot_mapping}
    runtime_mode = getattr(CUDAGraphMode, mode)

    def run(i: int, step) -> None:
        attn.kv_cache, index_layer.kv_cache = kv[i]
        with (
            set_current_vllm_config(config, check_compile=False),
            set_forward_context(
                metadata,
                config,
                num_tokens=layout.num_tokens,
                cudagraph_runtime_mode=runtime_mode,
                slot_mapping=slot_mapping,
            ),
            torch.inference_mode(),  # as serving's worker runs the model
        ):
            step(i)

    def forward(i: int) -> None:
        module(positions, hidden[i])

    return served(run, forward, copies, type(module.impl).__name__, mode, device)


def served(run, forward, copies: int, label: str, mode: str, device: str) -> Prepared:
    """The rows' call as serving runs the batch (``mode``, msa_inputs.graph_mode): FULL and EAGER call the forward of
    the next copy (a FULL row graph-safe: the harness replays it from one CUDA graph); PIECEWISE warms up once, then
    replays one breakable capture per copy, its eager pieces included (timed eagerly). ``run(i, step)`` runs step(i)
    in copy i's forward context; ``forward(i)`` is copy i's forward."""
    state = {"i": 0}
    if mode != inputs.PIECEWISE:

        def call() -> None:
            state["i"] = (state["i"] + 1) % copies
            run(state["i"], forward)

        return Prepared(call, label, graph_safe=mode == inputs.FULL)
    run(0, forward)  # compiles and tunes the kernels before any capture, as serving's warm-up runs do
    captures = []
    for i in range(copies):
        run(i, lambda i: captures.append(breakable_capture(lambda: forward(i), device)))

    def replay() -> None:
        state["i"] = (state["i"] + 1) % copies
        run(state["i"], lambda i: captures[i].replay())

    return Prepared(replay, label, graph_safe=False)
