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
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from opcollect.runtime.contract import KernelLimit, Prepared
from opcollect.runtime.dtypes import ceil_div
from opcollect.runtime.timing import random_tensor

# deepseek-ai/DeepSeek-V3 config.json (Hugging Face; also aiconfigurator_core/model_configs/
# deepseek-ai--DeepSeek-V3_config.json)
DEEPSEEK_V3 = {
    "hidden_size": 7168,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 163840,
    "rope_parameters": {
        "rope_type": "yarn",  # the module turns it into deepseek_yarn (deepseek_v2.py:976-981)
        "rope_theta": 10000,
        "factor": 40,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
    },
}
LATENT = DEEPSEEK_V3["kv_lora_rank"] + DEEPSEEK_V3["qk_rope_head_dim"]  # 576: one latent cache entry per token
# the page size vLLM serves each MLA backend with: the preferred size given the default 16 (platforms/interface.py:
# 593-626): FLASH_ATTN_MLA MultipleOf(16) (flashattn_mla.py:52-53), FLASHMLA 64 only (flashmla.py:58-59),
# FLASHINFER_MLA [32, 64] (flashinfer_mla.py), CUTLASS_MLA [128] (cutlass_mla.py:49-50)
MLA_BLOCK_SIZE = {"FLASH_ATTN_MLA": 16, "FLASHMLA": 64, "FLASHINFER_MLA": 32, "CUTLASS_MLA": 128}
NULL_BLOCK = 0
CACHE_DTYPE = {"bfloat16": "auto", "fp8": "fp8"}
GEMM_TYPES = ("bfloat16", "fp8_block")


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
    """Weights (fp8 block: 1 byte plus a 128x128 scale each), bf16 W_UK_T/W_UV, hidden in and out, the queries and
    latent per token, and the latent cache at the largest page size (64)."""
    c = DEEPSEEK_V3
    h = case.num_heads
    weights = weight_elements(h) * (1 if case.gemm_type == "fp8_block" else 2)
    if case.gemm_type == "fp8_block":
        weights += weight_elements(h) // (128 * 128) * 4
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
        if not param.dtype.is_floating_point:
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


def prepare(case, dispatch: str, device: str, copies: int, context: bool) -> Prepared:
    if case.mla_dtype != "bfloat16":
        # an fp8 MLA query runs only on SM100 with an fp8-capable prefill backend (mla_attention.py:1372-1398,
        # 1453-1493); on SM90 vLLM silently keeps bf16, so an fp8 row would time bf16. Not measured on any SM yet
        raise KernelLimit(f"the vLLM MLA runner times bf16 MLA only, not {case.mla_dtype}")
    if case.kv_cache_dtype not in CACHE_DTYPE:
        raise KernelLimit(f"vLLM has no {case.kv_cache_dtype} MLA cache")
    if case.gemm_type not in GEMM_TYPES:
        raise KernelLimit(f"the vLLM MLA runner has no {case.gemm_type} projections")
    import torch
    from vllm.config import CacheConfig, set_current_vllm_config
    from vllm.forward_context import set_forward_context
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config
    from vllm.model_executor.models.deepseek_v2 import DeepseekV2MLAAttention

    from opcollect.backends.vllm.attention import allocate_cache, common_metadata
    from opcollect.backends.vllm.context import serve_batch, vllm_context

    # tp_size labels the model's sharding; the module is built at one rank with the case's per-rank heads
    dtype = torch.bfloat16
    c = DEEPSEEK_V3
    prefix = "opcollect.mla"
    name = f"{prefix}.attn"  # MLAAttention's name in static_forward_context (layers/mla.py:101-113)
    quant = (
        Fp8Config(is_checkpoint_fp8_serialized=True, weight_block_size=[128, 128])
        if case.gemm_type != "bfloat16"
        else None
    )
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
