"""DeepSeek's sparse attention (DSA: DeepSeek-V3.2, GLM-5.x) as SGLang 0.5.14 serves it: layer 0's whole attention
module at one rank, prefill and decode (dsa_{context,generation}_module_perf), its indexer-skipping twin included.

What serving times. A forward runs DeepseekV2DecoderLayer.forward, which calls ``self.self_attn(positions,
hidden_states, forward_batch, zero_allocator, ..., prev_topk_indices)`` (models/deepseek_v2.py:2126-2134) under the
ForwardContext whose attn_backend the ModelRunner built (model_executor/forward_context.py:34-80); the ModelRunner
only builds (the config, the pools, the backend, the weights) and is not in the timed call. The reference collector
builds a 2-layer dummy ModelRunner for that and times the same call on model.model.layers[0].self_attn
(collector/sglang/collect_mla_module.py:1093-1180, :1868-1934, :2118). So the runner builds what that ModelRunner
builds for layer 0 and calls it the same way (paths relative to the wheel's sglang/srt/):
- DeepseekV2AttentionMLA with DeepseekV2DecoderLayer's arguments (deepseek_v2.py:1966-2003) over the model's config
  keys (dsa_inputs), the rank's heads, bf16 as the default dtype, the gemm_type's quant config (Fp8Config block
  128 x 128 for fp8_block, as the checkpoints'), the alternate CUDA stream DeepseekV2Model hands its layers
  (:2286-2304). Being a DSA config (configs/model_config.py:103-115) it builds its Indexer (:1578-1614).
- Weights as the dummy loader leaves them (model_loader/loader.py:1398-1421): initialize_dummy_weights, the model's
  post_load_weights for layer 0 (w_kc/w_vc split off kv_b_proj, models/deepseek_common/deepseek_weight_loader.py:
  411-623), then each module's quant_method.process_weights_after_loading.
- The server's DSA choices: attention_backend dsa, page size 64, kv_cache_dtype bfloat16 or fp8_e4m3, and the DSA
  prefill/decode implementations ServerArgs._set_default_dsa_backends picks for the KV dtype and SM major
  (server_args.py:3431-3479), set on the process's server args; the dense-prefill threshold is the model's
  index_topk unless the environment sets it (server_args.py:3528-3541).
- DSATokenToKVPool (mem_cache/memory_pool.py:2492-2575) with the latent width ModelRunner computes
  (ModelRunnerKVCacheMixin.calculate_mla_kv_cache_dim, model_executor/model_runner_kv_cache_mixin.py:226-271) and a
  ReqToTokenPool, every cached byte filled (dsa_inputs); DeepseekSparseAttnBackend (layers/attention/
  dsa_backend.py:290-409) over them; a ForwardBatch in EXTEND (isl new tokens after `step` cached ones) or DECODE
  (one after `step`) mode, planned once by the backend's init_forward_metadata (:620-895), which decides dense MHA
  against the sparse path (set_dsa_prefill_impl, :2431-2467).
Each call sets the layer's AttentionInputs with the module's own prepare_qkv_latent, as the decoder layer's
communicator does (layers/communicator.py:216-256, :689), runs the module under forward_context and clears them
(deepseek_v2.py:2139). A decode batch SGLang would capture in a CUDA graph (decode_graph_max_bs) runs under
model_capture_mode, as the reference's captured decode does: the indexer then overlaps q_b_proj on the alternate
stream (forward_mla.py:238-276; dsa_indexer.py:1383-1388). An indexer-skipping row (op_name ..._skip_indexer) first
runs the layer with next_skip_topk set to take the top-k it would hand on, then times the layer with skip_topk set
and those indices as prev_topk_indices (forward_mla.py:254-278), as the reference does (:1771-1806, :2125-2146); a
dense prefill needs none (the dense path runs the indexer's key store either way, forward_mha.py:135-173).

kernel_source is what the backend chose for the batch (dsa_inputs.label: use_mha, dsa_prefill_impl,
dsa_decode_impl), named as the reference names it.

Deliberate differences from the reference collector:
- The qkv down-projection is timed: each call gives the layer fresh AttentionInputs, as serving does per layer. The
  reference sets them once before its warm-ups, so its latent is computed (by a torch.randn stand-in) once and
  reused from then on (AttentionInputs.fetch_qkv_latent caches it, communicator.py:235-241): its rows leave out
  fused_qkv_a_proj_with_mqa.
- Context rows are replayed from a CUDA graph as every opcollect row is (runtime/timing.py); the reference times
  them eagerly, 10 back to back.
- The caches hold random finite values, not the zeros of a fresh pool: the indexer's top-k ranks varied scores.
- The server args are a stand-in (backends/sglang/context.py): no mem_fraction_static, so the indexer's logits
  split budget is min(free x 0.2, total x 0.3) of the device (dsa_indexer.py:741-775) without serving's cap from
  the memory it leaves free.
- The pools hold the case's tokens only, not max_total_tokens, and max_position_embeddings grows to hold a case
  longer than the model's (none in the grids).
- A worker builds a layer once for consecutive cases of one model, heads, gemm and cache dtype (layer_module), as
  serving builds its layers once; the reference builds one ModelRunner per batch size.
- fp8 queries (mla_dtype fp8) are refused: SGLang's DSA rows run bf16 queries.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from types import SimpleNamespace

from opcollect.backends.sglang import dsa_inputs as inputs
from opcollect.runtime.contract import KernelLimit, Prepared
from opcollect.runtime.timing import random_tensor

PREFIX = "model.layers.0.self_attn"  # layer 0 as make_layers names it (deepseek_v2.py:2296-2309)
# ServerArgs.kv_cache_dtype for DSA (server_args.py:3416-3429)
KV_CACHE_DTYPE = {"bfloat16": "bfloat16", "fp8": "fp8_e4m3"}
QUANTIZATION = {"bfloat16": None, "fp8_block": "fp8"}
SKIP_INDEXER = "_skip_indexer"
DENSE_THRESHOLD = "SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD"


def check_case(case, context: bool):
    """(config keys, layout, skips the indexer); KernelLimit, before any framework import, for what SGLang's DSA
    does not serve."""
    if case.mla_dtype != "bfloat16":
        raise KernelLimit(f"SGLang's DSA runs bf16 queries, not {case.mla_dtype}")
    if case.kv_cache_dtype not in KV_CACHE_DTYPE:
        raise KernelLimit(f"SGLang's DSA has no {case.kv_cache_dtype} cache (bf16 or fp8_e4m3)")
    if case.gemm_type not in QUANTIZATION:
        raise KernelLimit(f"the SGLang DSA runner has no {case.gemm_type} projections")
    lay = inputs.layout(case, context)
    keys = inputs.model_keys(case, lay.seq_len)
    skip = case.op_name.endswith(SKIP_INDEXER)
    if skip and keys.get("index_topk_freq", 1) <= 1:
        raise KernelLimit(f"{case.model} runs the indexer on every layer: it has no indexer-skipping layer")
    return keys, lay, skip


def footprint(case, context: bool) -> int:
    return inputs.footprint(case, context)


def layer_args(hf) -> dict:
    """DeepseekV2DecoderLayer's arguments of its attention (deepseek_v2.py:1966-2003)."""
    rope = hf.rope_parameters
    return dict(
        config=hf,
        hidden_size=hf.hidden_size,
        num_heads=hf.num_attention_heads,
        qk_nope_head_dim=hf.qk_nope_head_dim,
        qk_rope_head_dim=hf.qk_rope_head_dim,
        v_head_dim=hf.v_head_dim,
        q_lora_rank=hf.q_lora_rank,
        kv_lora_rank=hf.kv_lora_rank,
        rope_theta=rope["rope_theta"],
        rope_scaling=rope if rope.get("rope_type") != "default" else None,
        max_position_embeddings=hf.max_position_embeddings,
        layer_id=0,
        reduce_results=False,
        prefix=PREFIX,
        is_nextn=False,
        dsa_enable_prefill_cp=False,
        mla_enable_prefill_cp=False,
    )


def quant_config(gemm_type: str):
    if gemm_type != "fp8_block":
        return None
    from sglang.srt.layers.quantization.fp8 import Fp8Config

    return Fp8Config(is_checkpoint_fp8_serialized=True, activation_scheme="dynamic", weight_block_size=[128, 128])


def build_module(hf, quant, device: str):
    """Layer 0's DeepseekV2AttentionMLA, its weights loaded as the dummy loader loads them."""
    import torch
    from sglang.srt.model_loader.weight_utils import initialize_dummy_weights
    from sglang.srt.models.deepseek_common.deepseek_weight_loader import DeepseekV2WeightLoaderMixin
    from sglang.srt.models.deepseek_v2 import DeepseekV2AttentionMLA

    with torch.device(device):
        module = DeepseekV2AttentionMLA(**layer_args(hf), quant_config=quant, alt_stream=alt_stream(device))
    initialize_dummy_weights(module)
    # the model's post-load step, over a model of this one layer (deepseek_weight_loader.py:427-444)
    model = SimpleNamespace(layers=[SimpleNamespace(self_attn=module)], start_layer=0, end_layer=1)
    DeepseekV2WeightLoaderMixin.post_load_weights(SimpleNamespace(model=model, config=hf, quant_config=quant))
    for _, sub in module.named_modules():
        method = getattr(sub, "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(sub)
    return module.eval()


def alt_stream(device: str):
    import torch

    return torch.cuda.Stream(torch.device(device))


def device_info(device: str) -> tuple[int, float]:
    """(SM major, total memory in MiB) of the device."""
    import torch

    props = torch.cuda.get_device_properties(torch.device(device))
    return props.major, props.total_memory / 2**20


_built: dict = {}  # the last layer built in this worker, by what shapes it (serving builds its layers once)


def layer_module(key: tuple, hf, quant, device: str):
    """The layer for ``key`` (built once; a worker's cases come grouped), its skip flags as its config sets them."""
    if key not in _built:
        _built.clear()  # the previous layer's memory goes before the next is built
        module = build_module(hf, quant, device)
        _built[key] = (module, module.skip_topk, module.next_skip_topk)
    module, skip, next_skip = _built[key]
    module.skip_topk, module.next_skip_topk = skip, next_skip
    return module


def runner_stand_in(device: str, args, hf, heads: int, kv_dtype, pools=(None, None)):
    """What DeepseekSparseAttnBackend.__init__ and calculate_mla_kv_cache_dim read off a ModelRunner
    (dsa_backend.py:293-409; model_runner_kv_cache_mixin.py:226-271)."""
    req_pool, kv_pool = pools
    model = SimpleNamespace(hf_config=hf, context_len=hf.max_position_embeddings, num_attention_heads=heads,
                            qk_nope_head_dim=hf.qk_nope_head_dim, kv_lora_rank=hf.kv_lora_rank,
                            qk_rope_head_dim=hf.qk_rope_head_dim)  # fmt: skip
    return SimpleNamespace(device=device, page_size=inputs.PAGE_SIZE, server_args=args, model_config=model,
                           kv_cache_dtype=kv_dtype, req_to_token_pool=req_pool, token_to_kv_pool=kv_pool,
                           hisparse_coordinator=None)  # fmt: skip


def build_pools(lay, batch_tensors, kv_dtype, kv_dim: int, device: str, seed: int):
    import torch
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, ReqToTokenPool

    b = lay.batch_size
    req_pool = ReqToTokenPool(size=b, max_context_len=lay.seq_len, device=device, enable_memory_saver=False)
    req_pool.req_to_token[1 : b + 1] = batch_tensors.req_to_token  # rows 1..b: row 0 is the padding row
    kv_pool = DSATokenToKVPool(
        lay.pool_size,
        page_size=inputs.PAGE_SIZE,
        kv_lora_rank=inputs.KV_LORA,
        dtype=kv_dtype,
        qk_rope_head_dim=inputs.LATENT - inputs.KV_LORA,
        layer_num=1,
        device=device,
        index_head_dim=inputs.INDEX_DIM,
        enable_memory_saver=False,
        kv_cache_dim=kv_dim,
    )
    gen = torch.Generator(device=device).manual_seed(seed)
    inputs.fill_latent(kv_pool.kv_buffer[0], kv_dim == inputs.FP8_LATENT_BYTES, gen)
    inputs.fill_index(kv_pool.index_k_with_scale_buffer[0], gen)
    return req_pool, kv_pool


def forward_batch(lay, t, context: bool, device: str):
    """The batch a scheduler hands the model (ForwardBatch.init_new's fields, model_executor/forward_batch_info.py:
    322-339, 797-828): EXTEND after `step` cached tokens, or DECODE."""
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    b = lay.batch_size
    seq_lens = t.seq_lens.to(torch.int64)
    common = dict(
        batch_size=b,
        input_ids=torch.zeros(lay.num_tokens, dtype=torch.int64, device=device),
        req_pool_indices=torch.arange(1, b + 1, dtype=torch.int64, device=device),
        seq_lens=seq_lens,
        out_cache_loc=t.out_cache_loc,
        seq_lens_sum=b * lay.seq_len,
        seq_lens_cpu=seq_lens.cpu(),
        positions=t.positions,
    )
    if not context:
        return ForwardBatch(forward_mode=ForwardMode.DECODE, **common)
    extend, prefix = [lay.query_len] * b, [lay.seq_len - lay.query_len] * b
    return ForwardBatch(
        forward_mode=ForwardMode.EXTEND,
        extend_num_tokens=lay.num_tokens,
        extend_seq_lens=torch.tensor(extend, dtype=torch.int32, device=device),
        extend_prefix_lens=torch.tensor(prefix, dtype=torch.int32, device=device),
        extend_start_loc=torch.arange(b, dtype=torch.int32, device=device) * lay.query_len,
        extend_seq_lens_cpu=extend,
        extend_prefix_lens_cpu=prefix,
        **common,
    )


@contextmanager
def dense_threshold(envs, index_topk: int):
    """The dense-prefill threshold serving sets to the model's index_topk when the environment leaves it unset."""
    field = getattr(envs, DENSE_THRESHOLD)
    with nullcontext() if field.is_set() else field.override(index_topk):
        yield


def prepare(case, dispatch: str, device: str, copies: int, context: bool) -> Prepared:
    keys, lay, skip = check_case(case, context)
    import torch
    from sglang.srt.environ import envs
    from sglang.srt.layers.attention.dsa_backend import DeepseekSparseAttnBackend
    from sglang.srt.layers.communicator import AttentionInputs, get_attn_tp_context
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
    from sglang.srt.model_executor.model_runner_kv_cache_mixin import ModelRunnerKVCacheMixin
    from sglang.srt.model_executor.runner import model_capture_mode
    from sglang.srt.utils import BumpAllocator

    from opcollect.backends.sglang.context import sglang_context

    server_args = dict(attention_backend="dsa", page_size=inputs.PAGE_SIZE,
                       kv_cache_dtype=KV_CACHE_DTYPE[case.kv_cache_dtype],
                       quantization=QUANTIZATION[case.gemm_type])  # fmt: skip
    major, total_mib = device_info(device)
    kv_dtype = torch.float8_e4m3fn if case.kv_cache_dtype == "fp8" else torch.bfloat16
    hf = SimpleNamespace(**keys)
    with sglang_context(device, **server_args) as args:
        # the implementations a DSA model's server picks (a no-op once set: it keeps what is set)
        args._set_default_dsa_backends(args.kv_cache_dtype, major)
        quant = quant_config(case.gemm_type)
        key = (device, case.model, case.num_heads, case.gemm_type, args.kv_cache_dtype, repr(sorted(keys.items())))
        module = layer_module(key, hf, quant, device)
        kv_dim = ModelRunnerKVCacheMixin.calculate_mla_kv_cache_dim(runner_stand_in(device, args, hf, 0, kv_dtype))
        t = inputs.batch_tensors(lay, device)
        pools = build_pools(lay, t, kv_dtype, kv_dim, device, 300)
        backend = DeepseekSparseAttnBackend(runner_stand_in(device, args, hf, case.num_heads, kv_dtype, pools))
        batch = forward_batch(lay, t, context, device)
        with forward_context(ForwardContext(attn_backend=backend)), dense_threshold(envs, keys["index_topk"]):
            backend.init_forward_metadata(batch)
        impl = backend.dsa_prefill_impl if context else backend.dsa_decode_impl
        source = inputs.label(context, backend.use_mha, backend.device_sm_major, skip, impl)
        hidden = [random_tensor((lay.num_tokens, hf.hidden_size), torch.bfloat16, device, i) for i in range(copies)]
        # serving shares one per forward among its layers; allocate() is reached with fp8 absorb weights only
        zero_allocator = BumpAllocator(buffer_size=2, dtype=torch.float32, device=device)
    graphed = not context and lay.batch_size <= inputs.decode_graph_max_bs(total_mib)
    capture = model_capture_mode if graphed else nullcontext

    def run(x, **extra):
        tp = get_attn_tp_context()
        tp.set_attn_inputs(AttentionInputs(x, batch, module.prepare_qkv_latent))
        try:
            with torch.no_grad():
                return module(positions=t.positions, hidden_states=x, forward_batch=batch,
                              zero_allocator=zero_allocator, **extra)  # fmt: skip
        finally:
            tp.clear_attn_inputs()

    extra = {}
    if skip and not (context and backend.use_mha):
        with sglang_context(device, **server_args), forward_context(ForwardContext(attn_backend=backend)), capture():
            handed = topk_to_hand_on(module, run, hidden[0])
        module.skip_topk = True
        extra["prev_topk_indices"] = handed
    elif skip:
        module.skip_topk = True  # the dense path needs no top-k (collect_mla_module.py:1760-1776)
    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        with sglang_context(device, **server_args), forward_context(ForwardContext(attn_backend=backend)), capture():
            run(hidden[i], **extra)

    return Prepared(call, source)


def topk_to_hand_on(module, run, x):
    """The top-k layer 0 hands the next layer when that layer skips the indexer (forward_mla.py:755-761)."""
    previous = module.next_skip_topk
    module.next_skip_topk = True
    try:
        out = run(x)
    finally:
        module.next_skip_topk = previous
    if not isinstance(out, tuple) or out[1] is None:
        raise KernelLimit("SGLang's DSA layer handed on no top-k indices for the indexer-skipping layer")
    return out[1].clone()
