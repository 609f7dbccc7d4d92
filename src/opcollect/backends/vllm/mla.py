"""DeepSeek-V3's whole MLA module at one rank through vLLM 0.24.0's DeepseekV2MLAAttention, context and generation.

The module (fused q_a/kv_a projection, norms, q_b and kv_b, rope, the MLA backend vLLM selects, o_proj;
model_executor/models/deepseek_v2.py:887-1093) is built under the current VllmConfig with bf16 as torch's default
dtype, its weights are filled with random values and post-processed as the model loader does
(model_executor/model_loader/utils.py:100-127: each linear's quant method, then MLAAttention's W_UK_T/W_UV), a latent
KV cache is bound to its MLAAttention, and each call runs module(positions, hidden_states) under set_forward_context.
The config is serving's for the batch (context.serve_batch): custom ops on, so rope runs FlashInfer's kernel
(rotary_embedding/deepseek_scaling_rope.py:61-67, 216-225) and the norms vLLM's C kernel, not torch chains.

kernel_source is read from what vLLM chose, as the reference collector names it (collect_mla_module.py:286-300): the
MLA backend's get_name() when the batch has no prefill part, else the prefill backend's (MLAAttention.prefill_backend,
mla_attention.py:493-502): FLASH_ATTN_MLA, FLASHMLA, FLASHINFER_MLA, or FLASH_ATTN / TRTLLM_RAGGED / FLASHINFER.

Projections (gemm_type) are built under the quant config of the checkpoint that serves them: none for bf16, block fp8
(DeepSeek-V3's own), ModelOpt NVFP4 (an NVFP4 DeepSeek checkpoint's hf_quant_config). An fp8 mla_dtype is vLLM's fp8
prefill query over an fp8 cache, as `--attention-config` turns it on for the SM100 family (prefill_query).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from opcollect.backends import mla_configs
from opcollect.backends.vllm.gemm import CONSTANTS, NVFP4_GROUP
from opcollect.runtime.contract import KernelLimit, Prepared
from opcollect.runtime.dtypes import ceil_div
from opcollect.runtime.timing import random_tensor

# deepseek-ai/DeepSeek-V3 config.json's attention keys (mla_configs); its yarn rope_type the module turns into
# deepseek_yarn (deepseek_v2.py:976-981)
DEEPSEEK_V3 = mla_configs.DEEPSEEK_V3
LATENT = DEEPSEEK_V3["kv_lora_rank"] + DEEPSEEK_V3["qk_rope_head_dim"]  # 576: one latent cache entry per token
# the page size vLLM serves each MLA backend with: the preferred size given the default 16 (platforms/interface.py:
# 593-626): FLASH_ATTN_MLA MultipleOf(16) (flashattn_mla.py:52-53), FLASHMLA 64 only (flashmla.py:58-59),
# FLASHINFER_MLA [32, 64] (flashinfer_mla.py), CUTLASS_MLA [128] (cutlass_mla.py:49-50)
MLA_BLOCK_SIZE = {"FLASH_ATTN_MLA": 16, "FLASHMLA": 64, "FLASHINFER_MLA": 32, "CUTLASS_MLA": 128}
NULL_BLOCK = 0
CACHE_DTYPE = {"bfloat16": "auto", "fp8": "fp8"}
GEMM_TYPES = ("bfloat16", "fp8_block", "nvfp4")
# nvfp4: a ModelOpt NVFP4 checkpoint's hf_quant_config ({"quant_algo": "NVFP4", "group_size": 16}, gemm.py's
# NVFP4_GROUP): one fp8 scale per 16 weights (model_executor/layers/quantization/modelopt.py:1011-1045, 1071-1108),
# the GEMM runner's config; the reference collector builds the same (collector/vllm/collect_mla_module.py:303-336)
# ModelOptNvFp4LinearMethod's scales (modelopt.py:1170-1197), filled with the GEMM runner's unit values
NVFP4_SCALES = ("input_scale", "weight_scale_2", "weight_scale")
# vLLM quantizes the prefill query to fp8 only with an fp8 KV cache, attention_config.use_prefill_query_quantization,
# the SM100 family and a FLASHINFER / TRTLLM_RAGGED / TOKENSPEED_MLA prefill backend (model_executor/layers/attention/
# mla_attention.py:1372-1397, 1452-1493); otherwise it silently keeps the bf16 query. The SM100 auto selector ranks
# FLASH_ATTN first (v1/attention/backends/mla/prefill/selector.py:59-65), so serving fp8 prefill names the backend
# too: TRTLLM_RAGGED, the first of the three in that ranking, as the reference collector pins it
# (collector/vllm/collect_mla_module.py:425-445, clearing the cache below at :466)
FP8_PREFILL_BACKEND = "TRTLLM_RAGGED"  # verified_on: vllm==0.24.0
# the KV-cache method's checkpoint scales (quantization/kv_cache.py:57-69): left at their -1 "not in the checkpoint",
# so its process_weights_after_loading sets 1.0 (kv_cache.py:111-115), as for a checkpoint without KV scales
KV_SCALES = ("q_scale", "k_scale", "v_scale", "prob_scale")


@dataclass(frozen=True)
class MlaLayout:
    batch_size: int
    query_len: int  # new tokens per sequence
    seq_len: int  # tokens per sequence including the new ones
    block_size: int
    blocks_per_seq: int
    num_blocks: int  # the null block plus every sequence's pages
    page_table: tuple[tuple[int, ...], ...]
    slot_mapping: tuple[int, ...]
    positions: tuple[int, ...]  # rope position of each new token
    query_start_loc: tuple[int, ...]
    seq_lens: tuple[int, ...]
    kv_cache_shape: tuple[int, int, int]  # (num_blocks, block_size, 576): mla_attention.py:1216-1223
    hidden_shape: tuple[int, int]  # (num_tokens, hidden_size)

    @property
    def num_tokens(self) -> int:
        return self.batch_size * self.query_len


def lengths(case, context: bool) -> tuple[int, int]:
    """(new tokens, tokens) per sequence: a prompt of isl tokens, or isl (1) new token after a history of step."""
    return (case.isl, case.isl) if context else (case.isl, case.step + case.isl)


def mla_layout(case, context: bool, block_size: int) -> MlaLayout:
    query_len, seq_len = lengths(case, context)
    per_seq = ceil_div(seq_len, block_size)
    b = case.batch_size
    table = tuple(tuple(1 + s * per_seq + j for j in range(per_seq)) for s in range(b))
    new = range(seq_len - query_len, seq_len)
    return MlaLayout(
        batch_size=b,
        query_len=query_len,
        seq_len=seq_len,
        block_size=block_size,
        blocks_per_seq=per_seq,
        num_blocks=1 + b * per_seq,
        page_table=table,
        slot_mapping=tuple(table[s][p // block_size] * block_size + p % block_size for s in range(b) for p in new),
        positions=tuple(p for _ in range(b) for p in new),
        query_start_loc=tuple(query_len * i for i in range(b + 1)),
        seq_lens=(seq_len,) * b,
        kv_cache_shape=(1 + b * per_seq, block_size, LATENT),
        hidden_shape=(b * query_len, DEEPSEEK_V3["hidden_size"]),
    )


def weight_elements(num_heads: int) -> int:
    """Elements of the module's projection weights with num_heads heads on the rank (deepseek_v2.py:924-971)."""
    c = DEEPSEEK_V3
    qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    return (
        c["hidden_size"] * (c["q_lora_rank"] + LATENT)  # fused_qkv_a_proj
        + c["q_lora_rank"] * num_heads * qk  # q_b_proj
        + c["kv_lora_rank"] * num_heads * (c["qk_nope_head_dim"] + c["v_head_dim"])  # kv_b_proj
        + num_heads * c["v_head_dim"] * c["hidden_size"]  # o_proj
    )


def footprint(case, context: bool) -> int:
    """Weights (fp8 block: 1 byte plus a 128x128 scale each; nvfp4: half a byte plus an fp8 scale per 16), bf16
    W_UK_T/W_UV, hidden in and out, the queries and latent per token, and the latent cache at the largest page size
    (64)."""
    c = DEEPSEEK_V3
    h = case.num_heads
    elements = weight_elements(h)
    if case.gemm_type == "fp8_block":
        weights = elements + elements // (128 * 128) * 4
    elif case.gemm_type == "nvfp4":
        weights = elements // 2 + elements // NVFP4_GROUP
    else:
        weights = elements * 2
    absorbed = 2 * h * c["kv_lora_rank"] * (c["qk_nope_head_dim"] + c["v_head_dim"])
    layout = mla_layout(case, context, 64)
    tokens = layout.num_tokens
    per_token = 2 * 2 * c["hidden_size"] + 2 * (c["q_lora_rank"] + 2 * LATENT + h * (LATENT + 192 + c["v_head_dim"]))
    cache = layout.num_blocks * 64 * LATENT * (1 if case.kv_cache_dtype == "fp8" else 2)
    return weights + absorbed + tokens * (per_token + 16) + cache


def kernel_source(mla_attn, metadata) -> str:
    if metadata.num_prefills == 0:
        return mla_attn.attn_backend.get_name()
    return mla_attn.prefill_backend.get_name()


def hf_config() -> SimpleNamespace:
    """The fields of DeepSeek-V3's HF config the module reads (deepseek_v2.py:944-999; no index_topk: not V3.2)."""
    fields = dict(DEEPSEEK_V3, rope_parameters=dict(DEEPSEEK_V3["rope_parameters"]))
    return SimpleNamespace(model_type="deepseek_v3", **fields)


def fill_and_process(module, dtype, device: str) -> None:
    """Random weights, then the model loader's post-processing (model_loader/utils.py:100-127)."""
    import torch
    from vllm.model_executor.layers.attention import MLAAttention
    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

    gen = torch.Generator(device=device).manual_seed(0)
    for name, param in module.named_parameters():
        last = name.rsplit(".", 1)[-1]
        if last in KV_SCALES:
            continue
        if not param.dtype.is_floating_point:  # NVFP4's packed weight: two e2m1 values a byte, any byte is one
            param.data.copy_(torch.randint(0, 256, param.shape, generator=gen, device=device, dtype=torch.uint8))
            continue
        if last in NVFP4_SCALES:
            param.data.fill_(CONSTANTS[last])
            continue
        values = torch.randn(param.shape, generator=gen, device=device, dtype=torch.float32)
        if "scale" in name:  # block-fp8 weight_scale_inv: small positive scales
            values = values.abs_().mul_(1e-3).add_(1e-4)
        elif "norm" in name:
            values = values.mul_(0.1).add_(1.0)
        else:
            values = values.mul_(0.02)
        param.data.copy_(values.to(param.dtype))
    for sub in module.modules():
        method = getattr(sub, "quant_method", None)
        if isinstance(method, QuantizeMethodBase):
            method.process_weights_after_loading(sub)
    for sub in module.modules():
        if isinstance(sub, MLAAttention):
            sub.process_weights_after_loading(dtype)


def check_dtypes(case, context: bool) -> None:
    """Refuse, before any framework import, the dtypes vLLM cannot serve the module with."""
    if case.mla_dtype not in ("bfloat16", "fp8"):
        raise KernelLimit(f"vLLM has no {case.mla_dtype} MLA query")
    if case.mla_dtype == "fp8" and (not context or case.kv_cache_dtype != "fp8"):
        # the fp8 query is a prefill setting over an fp8 cache only (mla_attention.py:1462-1466); decode queries
        # follow the MLA backend and the cache dtype, so an fp8 generation label would time the bf16 row again
        raise KernelLimit("vLLM quantizes the MLA query to fp8 only for prefill over an fp8 KV cache")
    if case.kv_cache_dtype not in CACHE_DTYPE:
        raise KernelLimit(f"vLLM has no {case.kv_cache_dtype} MLA cache")
    if case.gemm_type not in GEMM_TYPES:
        raise KernelLimit(f"the vLLM MLA runner has no {case.gemm_type} projections")


def quant_config(gemm_type: str):
    """The quant config of the checkpoint that serves these projections; None for bf16."""
    if gemm_type == "fp8_block":
        from vllm.model_executor.layers.quantization.fp8 import Fp8Config

        return Fp8Config(is_checkpoint_fp8_serialized=True, weight_block_size=[128, 128])
    if gemm_type == "nvfp4":
        from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config

        return ModelOptNvFp4Config(
            quant_method="NVFP4",
            is_checkpoint_nvfp4_serialized=True,
            kv_cache_quant_algo=None,
            exclude_modules=[],
            group_size=NVFP4_GROUP,
        )
    return None


def prefill_query(config, mla_dtype: str) -> None:
    """Set what vLLM reads for the prefill query's dtype (see FP8_PREFILL_BACKEND), before the module picks its
    prefill backend (mla_attention.py:493) and the builder its query dtype (mla_attention.py:1519)."""
    from vllm.model_executor.layers.attention.mla_attention import backend_supports_prefill_query_quantization
    from vllm.platforms import current_platform

    # a process-wide functools.cache that reads the config current at its first call (mla_attention.py:1371): a
    # serving process has one config, a worker builds one per case
    backend_supports_prefill_query_quantization.cache_clear()
    if mla_dtype != "fp8":
        return
    if not current_platform.is_device_capability_family(100):
        raise KernelLimit("vLLM quantizes the MLA prefill query to fp8 only on the SM100 family")
    from vllm.v1.attention.backends.mla.prefill.registry import MLAPrefillBackendEnum

    config.attention_config.use_prefill_query_quantization = True
    config.attention_config.mla_prefill_backend = MLAPrefillBackendEnum[FP8_PREFILL_BACKEND]


def check_query_dtype(builder, mla_dtype: str, dtype) -> None:
    """vLLM falls back to the bf16 query without an error (mla_attention.py:1472-1480): refuse a row it would
    mislabel."""
    if mla_dtype != "fp8":
        return
    from vllm.platforms import current_platform

    chosen = getattr(builder, "q_data_type", dtype)
    if chosen != current_platform.fp8_dtype():
        raise KernelLimit(f"vLLM chose a {chosen} prefill query for an fp8 mla_dtype")


def prepare(case, dispatch: str, device: str, copies: int, context: bool) -> Prepared:
    check_dtypes(case, context)
    import torch
    from vllm.config import CacheConfig, set_current_vllm_config
    from vllm.forward_context import set_forward_context
    from vllm.model_executor.models.deepseek_v2 import DeepseekV2MLAAttention

    from opcollect.backends.vllm.attention import allocate_cache, common_metadata
    from opcollect.backends.vllm.context import serve_batch, vllm_context

    # tp_size labels the model's sharding; the module is built at one rank with the case's per-rank heads
    dtype = torch.bfloat16
    c = DEEPSEEK_V3
    prefix = "opcollect.mla"
    name = f"{prefix}.attn"  # MLAAttention's name in static_forward_context (layers/mla.py:101-113)
    quant = quant_config(case.gemm_type)
    with vllm_context(device, quant_config=quant) as config:
        query_len, seq_len = lengths(case, context)
        # batch limits, CUDA-graph sizes and eager kernels as served (custom rope and fp8 quant, RMSNorm's C kernel),
        # before the module and the MLA builder read them
        serve_batch(config, case.batch_size, case.batch_size * query_len)
        config.model_config.hf_text_config = hf_config()
        config.model_config.get_num_attention_heads = lambda parallel_config=None: case.num_heads
        config.model_config.get_num_kv_heads = lambda parallel_config=None: 1
        config.model_config.get_head_size = lambda: LATENT
        config.model_config.max_model_len = seq_len
        config.model_config.is_mm_prefix_lm = False
        config.model_config.use_mla = True
        config.cache_config.cache_dtype = CACHE_DTYPE[case.kv_cache_dtype]
        prefill_query(config, case.mla_dtype)
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.device(device):
                module = DeepseekV2MLAAttention(
                    vllm_config=config,
                    config=hf_config(),
                    hidden_size=c["hidden_size"],
                    num_heads=case.num_heads,
                    qk_nope_head_dim=c["qk_nope_head_dim"],
                    qk_rope_head_dim=c["qk_rope_head_dim"],
                    v_head_dim=c["v_head_dim"],
                    q_lora_rank=c["q_lora_rank"],
                    kv_lora_rank=c["kv_lora_rank"],
                    max_position_embeddings=c["max_position_embeddings"],
                    cache_config=config.cache_config,
                    quant_config=quant,
                    prefix=prefix,
                )
                fill_and_process(module, dtype, device)
        finally:
            torch.set_default_dtype(previous)
        mla_attn = config.compilation_config.static_forward_context[name]
        backend = mla_attn.attn_backend
        # serving's page size for the chosen backend (see MLA_BLOCK_SIZE); the reference collector uses 64 for every
        # backend (collect_mla_module.py), so its FLASH_ATTN_MLA rows read 4x fewer, longer pages than serving
        block_size = backend.get_preferred_block_size(CacheConfig.DEFAULT_BLOCK_SIZE)
        config.cache_config.block_size = block_size
        layout = mla_layout(case, context, block_size)
        spec = mla_attn.get_kv_cache_spec(config)
        builder = backend.get_builder_cls()(spec, [name], config, torch.device(device))
        check_query_dtype(builder, case.mla_dtype, dtype)
        metadata = builder.build(common_prefix_len=0, common_attn_metadata=common_metadata(layout, device))
        source = kernel_source(mla_attn, metadata)
        caches = [
            allocate_cache(backend, layout, 1, LATENT, config.cache_config.cache_dtype, spec.dtype, device)
            for _ in range(copies)
        ]
        positions = torch.tensor(layout.positions, dtype=torch.int64, device=device)
        hidden = [random_tensor(layout.hidden_shape, dtype, device, i) for i in range(copies)]
        # the KV write (concat_and_cache_mla) is timed with the module, as serving runs it; the reference collector
        # passes no slot mapping, which skips it (mla_attention.py:1050), so its times are lower by that write
        slot_mapping = {name: torch.tensor(layout.slot_mapping, dtype=torch.int64, device=device)}
    state = {"i": 0}

    def call() -> None:
        i = state["i"] = (state["i"] + 1) % copies
        mla_attn.kv_cache = caches[i]
        with (
            set_current_vllm_config(config, check_compile=False),
            set_forward_context({name: metadata}, config, num_tokens=layout.num_tokens, slot_mapping=slot_mapping),
        ):
            module(positions, hidden[i], None)

    return Prepared(call, source)
