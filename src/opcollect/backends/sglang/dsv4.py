"""DeepSeek-V4's attention as SGLang 0.5.14 serves it, at one rank: the whole module of a CSA (compress ratio 4) or HCA
(128) layer, prefill and decode (dsv4_{csa,hca}_{context,generation}_module_perf).

What serving times. A forward runs DeepseekV4DecoderLayer, which calls ``self.self_attn(x, positions, forward_batch)``
= MQALayer.forward (models/deepseek_v4.py:269, :916-1088) under the ForwardContext whose attn_backend the ModelRunner
built (model_executor/forward_context.py:34-84); the layer reads its backend and token pool from it (:925,
get_token_to_kv_pool). The reference collector builds a 1-layer dummy ModelRunner for that and times the same call
(collector/sglang/collect_dsv4_attn.py:1048-1162, 1303-1639). So the runner builds what that ModelRunner builds for the
layer, around a stand-in model runner as backends/sglang/dsa.py does (paths relative to the wheel's sglang/srt/):
- MQALayer (:269-476) over the model's config keys (dsv4_inputs), one layer of the case's ratio, bf16 as the default
  dtype, the checkpoint's quant config for fp8_block (Fp8Config.from_config of its quantization_config, as
  ModelConfig does; none for bfloat16, whose rows the reference collects with the quant config dropped, :503-513),
  the five alt streams DeepseekV4Model hands its layers on CUDA (:1675-1688). Its rank's heads come from SGLang's
  attention TP, read once at construction (get_parallel().attn_tp_size, :279-281), set here to the case's tp_size
  with SGLang's own override (context.rank_topology), as the reference simulates it (:553-625): the rank's shards of
  wq_b, wo_a and wo_b, q zero-padded to 64 heads for FlashMLA (:941-960), no collective (wo_b reduces only at
  attn TP = world size, :459-461; :1085). For CSA it builds its compressor and C4Indexer, for HCA its compressor.
- Weights as the dummy loader leaves them (model_loader/loader.py:1398-1421): initialize_dummy_weights, the model's
  post_load_weights for this one layer (the fp8 wo_a scale layout and the compressors' ape fix, models/
  deepseek_v4.py:1979-2024), then each module's quant_method.process_weights_after_loading.
- SGLang reads SGLANG_OPT_FP8_WO_A_GEMM once, into models/deepseek_v4.py's _FP8_WO_A_GEMM (:141); the reference sets it
  per gemm_type before each subprocess imports SGLang (:1681) and the DeepSeek-V4 hook turns it off on SM120
  (server_args.py:3795). A worker imports SGLang once, so the runner sets the module's copy for each build and call:
  the flag where gemm_type is fp8_block, on SM120 never. The hook's indexer flags are dsv4_kernels.hook_flags.
- DeepSeekV4TokenToKVPool (mem_cache/deepseek_v4_memory_pool.py:438-640) as the model runner makes it
  (model_runner_kv_cache_mixin.py:430-506: page 256, the fp8 cache dtype, the compress-state dtypes of
  _get_dsv4_compress_state_dtypes, :63), sized for the case (dsv4_inputs), with the full-to-SWA map registered as
  SWATokenToKVPoolAllocator registers its own (mem_cache/allocator/swa.py:101); a ReqToTokenPool; and
  DeepseekV4AttnBackend (layers/attention/deepseek_v4_backend.py:467-518) over them.
- A ForwardBatch in EXTEND (isl new tokens after `step` cached ones) or DECODE mode (one after `step`), planned once by
  the backend's init_forward_metadata (:1078-1087), as the reference does after its scheduler's batch (:1048-1118).
A decode batch SGLang would capture in a CUDA graph (decode_graph_max_bs) runs under model_capture_mode, as the
reference's decode does: up to 64 tokens on Hopper the layer then overlaps its kv, compressor and indexer on the alt
streams (:930-937). kernel_source is the reference's fixed label, compressed_flashmla (collect_dsv4_attn.py:1296).

Deliberate differences from the reference collector:
- The layer is built alone, not inside a DeepseekV4DecoderLayer with its MoE and mHC (never called by the timed call);
  its model runner is a stand-in holding what the backend reads (runner_stand_in).
- The pools hold the case's requests only, not SGLang's memory-sized pool: a case beyond the device's memory fails
  as an out-of-memory case, where the reference skips shapes beyond its live pool (:1445-1479; the plan bounds them,
  plans/dsv4.py). A request keeps its sliding-window slots from the page of position step - 128 on, where the
  reference allocates its prefix's through SGLang's SWA tail allocation (runtime_limits.py:255-318).
- The caches are SGLang's fresh zeros, the weights the dummy loader's, as the reference has them (its CSA rows time
  the indexer's top-k over degenerate scores, which the consumer's top-k calibration corrects), but the hidden
  states are opcollect's random draw, not torch.randn.
- The server args are a stand-in (backends/sglang/context.py), with the DeepSeek-V4 hook's flags set per build.
- A worker builds a layer once for consecutive cases of one model, ratio, tp and gemm (layer_module), as serving
  builds its layers once; the reference builds one ModelRunner per batch size.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager, nullcontext
from functools import partial
from types import SimpleNamespace

from opcollect.backends.sglang import dsv4_inputs as inputs
from opcollect.runtime.contract import KernelLimit, Prepared
from opcollect.runtime.timing import random_tensor

PREFIX = "model.layers.0.self_attn"
LABEL = "compressed_flashmla"  # the reference's label of the dsv4 backend's FlashMLA (collect_dsv4_attn.py:1296)
LABELS = ("bfloat16", "fp8_e4m3")  # bf16 queries, the fp8 cache SGLang names fp8_e4m3 (collector :373-375)
QUANTIZATION = {"bfloat16": None, "fp8_block": "fp8"}
ALT_STREAMS = 5  # DeepseekV4Model on CUDA (models/deepseek_v4.py:1675-1677)
WO_A_FLAG = "SGLANG_OPT_FP8_WO_A_GEMM"


def check_case(case, context: bool):
    """(config keys, layout); KernelLimit, before any framework import, for what SGLang's DeepSeek-V4 does not serve."""
    if (case.mla_dtype, case.kv_cache_dtype) != LABELS:
        raise KernelLimit(f"SGLang's DeepSeek-V4 rows take {LABELS}, not {(case.mla_dtype, case.kv_cache_dtype)}")
    if case.gemm_type not in QUANTIZATION:
        raise KernelLimit(f"the SGLang DeepSeek-V4 runner has no {case.gemm_type} projections")
    if case.compress_ratio not in inputs.RING:
        raise KernelLimit(f"DeepSeek-V4's compressed layers have ratio 4 or 128, not {case.compress_ratio}")
    keys = inputs.model_keys(case.model, case.compress_ratio)
    native, tp = keys["num_attention_heads"], case.tp_size
    if tp < 1 or native % tp or keys["o_groups"] % tp or case.num_heads * tp != native:
        raise KernelLimit(f"{case.model}'s {native} heads give no rank {case.num_heads} heads at TP {tp}")
    return keys, inputs.layout(case, context)


def footprint(case, context: bool) -> int:
    return inputs.footprint(case, context)


def device_info(device: str) -> tuple[bool, bool, float]:
    """(SM120, HIP, total memory in MiB) of the device."""
    import torch

    from opcollect.backends.sglang.dsv4_kernels import device_kind

    sm120, hip = device_kind()
    return sm120, hip, torch.cuda.get_device_properties(torch.device(device)).total_memory / 2**20


@contextmanager
def wo_a_gemm(enabled: bool):
    """models/deepseek_v4.py's _FP8_WO_A_GEMM set for a build or a call, restored after."""
    import sglang.srt.models.deepseek_v4 as deepseek_v4

    previous = deepseek_v4._FP8_WO_A_GEMM
    deepseek_v4._FP8_WO_A_GEMM = enabled
    try:
        yield
    finally:
        deepseek_v4._FP8_WO_A_GEMM = previous


def quant_config(keys: dict, gemm_type: str):
    if gemm_type != "fp8_block":
        return None
    from sglang.srt.layers.quantization.fp8 import Fp8Config

    return Fp8Config.from_config(keys["quantization_config"])


def build_layer(keys: dict, tp: int, quant, device: str):
    """The layer's MQALayer at the rank of attention TP ``tp``, its weights loaded as the dummy loader loads them."""
    import torch
    from sglang.srt.model_loader.weight_utils import initialize_dummy_weights
    from sglang.srt.models.deepseek_v4 import DeepseekV4ForCausalLM, MQALayer

    from opcollect.backends.sglang.context import rank_topology

    hf = SimpleNamespace(**keys)
    streams = [torch.cuda.Stream(torch.device(device)) for _ in range(ALT_STREAMS)]
    with rank_topology(attn_tp_size=tp, attn_tp_rank=0), torch.device(device):
        layer = MQALayer(config=hf, layer_id=0, quant_config=quant, prefix=PREFIX, alt_streams=streams)
    initialize_dummy_weights(layer)
    # the model's post-load step over a model of this one layer (models/deepseek_v4.py:2005-2024); the decoder
    # layer's mHC norm cache is not the attention's
    decoder = SimpleNamespace(self_attn=layer, refresh_mhc_norm_weight_cache=lambda: None)
    causal_lm = SimpleNamespace(model=SimpleNamespace(layers=[decoder], start_layer=0, end_layer=1))
    causal_lm._setup_fp8_wo_a_scales = partial(DeepseekV4ForCausalLM._setup_fp8_wo_a_scales, causal_lm)
    DeepseekV4ForCausalLM.post_load_weights(causal_lm)
    for _, sub in layer.named_modules():
        method = getattr(sub, "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(sub)
    return layer.eval()


_built: dict = {}  # the last layer built in this worker, by what shapes it (serving builds its layers once)


def layer_module(key: tuple, build):
    if key not in _built:
        _built.clear()  # the previous layer's memory goes before the next is built
        _built[key] = build()
    return _built[key]


def runner_stand_in(device: str, args, hf, pools):
    """What DeepseekV4AttnBackend.__init__ reads off a ModelRunner (deepseek_v4_backend.py:476-512): the model
    config's head_dim and v_head_dim (both 448 + 64, configs/model_config.py:775-780) and hf_text_config's
    index_topk, the page size, the pools, no HiSparse, the server args."""
    req_pool, kv_pool = pools
    model = SimpleNamespace(head_dim=hf.head_dim, v_head_dim=hf.head_dim, hf_text_config=hf)
    return SimpleNamespace(device=device, page_size=inputs.PAGE_SIZE, model_config=model, server_args=args,
                           req_to_token_pool=req_pool, token_to_kv_pool=kv_pool,
                           hisparse_coordinator=None)  # fmt: skip


def build_pools(lay, t, keys: dict, device: str):
    """ReqToTokenPool and DeepSeekV4TokenToKVPool as the model runner makes them (model_runner_kv_cache_mixin.py:
    409-506), sized for the batch, with the batch's requests and full-to-SWA map in them."""
    import torch
    from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool, get_compress_state_ring_size
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.model_executor.model_runner_kv_cache_mixin import _get_dsv4_compress_state_dtypes

    b, window = lay.batch_size, keys["sliding_window"]
    req_pool = ReqToTokenPool(size=b, max_context_len=lay.context_len, device=device, enable_memory_saver=False)
    req_pool.req_to_token[1 : b + 1, : lay.seq_len] = t.req_to_token  # rows 1..b: row 0 is the padding row
    c4_dtype, c128_dtype = _get_dsv4_compress_state_dtypes()
    rope = keys["qk_rope_head_dim"]
    kv_pool = DeepSeekV4TokenToKVPool(
        max_num_reqs=b,
        swa_size=lay.swa_size,
        c4_size=lay.full_size // 4,
        c128_size=lay.full_size // 128,
        # the configurator's state sizes: the SWA pool's tokens / window x ring (pool_configurator.py:587-588)
        c4_state_pool_size=lay.swa_size // window * get_compress_state_ring_size(4, False),
        c128_state_pool_size=lay.swa_size // window * get_compress_state_ring_size(128, False),
        page_size=inputs.PAGE_SIZE,
        swa_page_size=inputs.PAGE_SIZE,
        dtype=torch.float8_e4m3fn,
        c4_state_dtype=c4_dtype,
        c128_state_dtype=c128_dtype,
        qk_nope_head_dim=keys["head_dim"] - rope,
        qk_rope_head_dim=rope,
        indexer_head_dim=keys["index_head_dim"],
        layer_num=1,
        device=device,
        enable_memory_saver=False,
        compression_ratios=list(keys["compress_ratios"]),
        sliding_window=window,
        start_layer=0,
        end_layer=1,
        enable_hisparse=False,
        online_mtp_max_draft_tokens=0,
        num_req_slots=req_pool.req_to_token.shape[0],
    )
    kv_pool.register_mapping(t.full_to_swa)
    return req_pool, kv_pool


def prepare(case, dispatch: str, device: str, copies: int, context: bool) -> Prepared:
    keys, lay = check_case(case, context)
    import torch
    from sglang.srt.environ import envs
    from sglang.srt.layers.attention.deepseek_v4_backend import DeepseekV4AttnBackend
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
    from sglang.srt.model_executor.runner import model_capture_mode

    from opcollect.backends.sglang.context import rank_topology, sglang_context
    from opcollect.backends.sglang.dsa import forward_batch
    from opcollect.backends.sglang.dsa_inputs import decode_graph_max_bs
    from opcollect.backends.sglang.dsv4_kernels import _flags, hook_flags

    sm120, hip, total_mib = device_info(device)
    if hip:
        raise KernelLimit("SGLang serves DeepSeek-V4 on ROCm with another backend (DeepseekV4HipRadixBackend)")
    server_args = dict(attention_backend="dsv4", page_size=inputs.PAGE_SIZE, kv_cache_dtype="fp8_e4m3",
                       quantization=QUANTIZATION[case.gemm_type])  # fmt: skip
    flags = hook_flags(sm120, hip)
    wo_a = case.gemm_type == "fp8_block" and not sm120 and bool(getattr(envs, WO_A_FLAG).get())
    tp = case.tp_size
    state = {"i": 0}

    def within():
        """What every build and call runs inside: the server args, the hook's flags, the rank's attention TP."""
        stack = ExitStack()
        state["args"] = stack.enter_context(sglang_context(device, **server_args))
        stack.enter_context(_flags(envs, flags))
        stack.enter_context(wo_a_gemm(wo_a))
        stack.enter_context(rank_topology(attn_tp_size=tp, attn_tp_rank=0))
        return stack

    with within():
        key = (device, case.model, case.compress_ratio, tp, case.gemm_type, wo_a, repr(sorted(flags.items())))
        layer = layer_module(key, lambda: build_layer(keys, tp, quant_config(keys, case.gemm_type), device))
        t = inputs.batch_tensors(lay, device)
        pools = build_pools(lay, t, keys, device)
        hf = SimpleNamespace(**keys)
        backend = DeepseekV4AttnBackend(runner_stand_in(device, state["args"], hf, pools))
        batch = forward_batch(lay, t, context, device)
        with forward_context(ForwardContext(attn_backend=backend)):
            backend.init_forward_metadata(batch)
        shape = (lay.num_tokens, keys["hidden_size"])
        hidden = [random_tensor(shape, torch.bfloat16, device, i) for i in range(copies)]
    graphed = not context and lay.batch_size <= decode_graph_max_bs(total_mib)
    capture = model_capture_mode if graphed else nullcontext

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        with within(), forward_context(ForwardContext(attn_backend=backend)), capture(), torch.no_grad():
            layer(hidden[i], t.positions, batch)

    return Prepared(call, LABEL)
