"""What the TensorRT-LLM MLA runners (mla.py: the attention kernel; mla_module.py: DeepSeek-V3's whole MLA module)
share: DeepSeek-V3's MLA dimensions, the paged latent cache a case needs, the label read off the built backend, and
the release of the cache pools a case allocates outside torch.

The builders are pure (no torch, no tensorrt_llm) so the CPU tests check them; kv_cache and attention_metadata import
tensorrt_llm inside and run on the GPU. Paths are TensorRT-LLM's tensorrt_llm/...; "AIC" is the reference collector
(ai-dynamo/aiconfigurator collector/trtllm/collect_mla.py and collect_mla_module.py at 095f58a5); commits of the
TensorRT-LLM sources read are in docs/research/trtllm-1.3.0-runners.md.

Case semantics (as the vLLM and SGLang runners, plans/mla.py and plans/mla_module.py): num_heads are the heads on
the rank (tp_size only labels which TP gives them); a context case is a prompt of isl new tokens per sequence, a
generation case is isl (1) new token after a history of step cached tokens, so a sequence holds step + 1 tokens
(AIC collect_mla.py:419-438 registers step tokens then adds one; collect_mla_module.py:657-661, 701).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from opcollect.backends.mla_configs import checkpoint_keys, legacy_rope
from opcollect.runtime.contract import KernelLimit
from opcollect.runtime.dtypes import ceil_div

# deepseek-ai/DeepSeek-V3 config.json (Hugging Face; also aiconfigurator_core/model_configs/
# deepseek-ai--DeepSeek-V3_config.json; mla_configs): the fields the MLA module and its rope read, the rope as
# rope_theta and rope_scaling
DEEPSEEK_V3 = {**legacy_rope(checkpoint_keys("DeepseekV3ForCausalLM")), "attention_bias": False}
HIDDEN = DEEPSEEK_V3["hidden_size"]
Q_LORA = DEEPSEEK_V3["q_lora_rank"]
KV_LORA = DEEPSEEK_V3["kv_lora_rank"]
NOPE = DEEPSEEK_V3["qk_nope_head_dim"]
ROPE = DEEPSEEK_V3["qk_rope_head_dim"]
V_HEAD = DEEPSEEK_V3["v_head_dim"]
QK_HEAD = NOPE + ROPE  # 192: the context (mha) query/key head
LATENT = KV_LORA + ROPE  # 576: one latent cache entry per token, and the generation (mqa) head
KV_BYTES = {"bfloat16": 2, "fp8": 1}
# the cache page TensorRT-LLM serves MLA with: 64 tokens where FlashMLA runs (head 576 on SM90: model_config.py:358-368
# enable_flash_mla, and the executor then sets tokens_per_block 64; AIC collect_mla.py:37-51,
# collect_mla_module.py:637-648), else KvCacheConfig's default 32 (trtllm-gen MLA keeps only P32 cubins for
# DeepSeek dims since PR #10261, as AIC notes there)
FLASH_MLA_PAGE, DEFAULT_PAGE = 64, 32
MAX_PAGE = max(FLASH_MLA_PAGE, DEFAULT_PAGE)
# TrtllmAttention.mla_rope_generation's parameters after (fused_q, q_pe, latent_cache, metadata), in order, the same in
# every trtllm.py read; forward takes them as keywords (interface.py AttentionForwardArgs fields)
ROPE_GENERATION_ARGS = (
    "cu_q_seqlens",
    "cu_kv_seqlens",
    "fmha_scheduler_counter",
    "mla_bmm1_scale",
    "mla_bmm2_scale",
    "quant_q_buffer",
)
BACKEND_LABELS = {"TrtllmAttention": "default"}  # AIC logs every TRT-LLM MLA row as default (collect_mla.py:668)


def check_case(case) -> None:
    """Refusals before anything is built (no import)."""
    if case.mla_dtype != "bfloat16":
        # TensorRT-LLM's MLA has no compute-dtype switch apart from the cache: the reference records only bfloat16
        # (AIC collect_mla.py:654; collect_mla_module.py:158-159 and :1067-1072 "TRT-LLM currently only supports
        # bfloat16 attention compute"); an fp8 row would time the (bf16, fp8-cache) kernel under another label
        raise KernelLimit(f"TensorRT-LLM's MLA computes in bfloat16 only, not {case.mla_dtype}")
    if case.kv_cache_dtype not in KV_BYTES:
        raise KernelLimit(f"TensorRT-LLM's MLA has no {case.kv_cache_dtype} latent cache")


def check_capability(capability: tuple[int, int]) -> None:
    """TensorRT-LLM's MLA FMHA needs Hopper or newer: AttentionOp::initialize asserts below it (AIC
    collect_mla.py:192-219, attentionOp.cpp:3091/3097 at 1.3.0rc20)."""
    if tuple(capability) < (9, 0):
        raise KernelLimit(f"TensorRT-LLM's MLA has no FMHA kernel below SM90 (SM{capability[0]}{capability[1]})")


def flash_mla(capability: tuple[int, int], head_dim: int = LATENT) -> bool:
    """ModelConfig.enable_flash_mla (model_config.py:358-368): the TRTLLM backend, a 576-wide latent head
    (kv_lora_rank + qk_rope_head_dim), and capability exactly (9, 0)."""
    return tuple(capability) == (9, 0) and head_dim == 576


def page_size(capability: tuple[int, int]) -> int:
    return FLASH_MLA_PAGE if flash_mla(capability) else DEFAULT_PAGE


def yarn_mscale(scale: float, mscale: float) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def q_scaling() -> float:
    """MLA's q_scaling, 1 / mscale^2 of DeepSeek-V3's yarn rope (modules/attention.py MLA.__init__; AIC
    collect_mla.py:327-335)."""
    rope = DEEPSEEK_V3["rope_scaling"]
    m = yarn_mscale(rope["factor"], rope["mscale_all_dim"])
    return 1.0 / (m * m)


def config_fields(num_heads: int) -> dict:
    """DeepSeek-V3's config with the rank's heads as the model's (tp 1): what AIC sets before building
    (collect_mla_module.py:538-541) and what RopeParams.from_config and DeepseekV3Attention read."""
    fields = dict(DEEPSEEK_V3, rope_scaling=dict(DEEPSEEK_V3["rope_scaling"]))
    fields.update(num_attention_heads=num_heads, num_key_value_heads=num_heads, num_hidden_layers=1)
    return fields


def lengths(case, context: bool) -> tuple[int, int]:
    """(new tokens, cached tokens before them) per sequence."""
    return (case.isl, 0) if context else (case.isl, case.step)


@dataclass(frozen=True)
class PagedLayout:
    """``copies`` disjoint sets of ``batch_size`` sequences in one paged pool, each query_len new tokens after
    past_len cached ones (the MLA, DSA and MSA module runners' batches)."""

    batch_size: int
    copies: int
    query_len: int  # new tokens per sequence
    past_len: int  # cached tokens before them
    tokens_per_block: int

    @property
    def seq_len(self) -> int:
        return self.past_len + self.query_len

    @property
    def max_seq_len(self) -> int:
        # one token of headroom past the sequence, as the reference collectors' max_seq (AIC collect_mla_module.py:
        # 653-661; the MSA collector's prefix + isl + 1 and cached + 2, collect_msa_module.py:621-636)
        return self.seq_len + 1

    @property
    def num_sequences(self) -> int:
        return self.batch_size * self.copies

    @property
    def num_tokens(self) -> int:
        """Tokens one call feeds (per copy)."""
        return self.batch_size * self.query_len

    def request_ids(self, copy: int) -> list[int]:
        return list(range(copy * self.batch_size, (copy + 1) * self.batch_size))

    def token_nums(self) -> list[int]:
        """add_dummy_requests' token_nums: past + input tokens (resource_manager.py:572-625, add_sequence per id)."""
        return [self.seq_len] * self.num_sequences

    def prompt_lens(self, context: bool) -> list[int]:
        # serving's prompt_lens: the chunk's tokens for a prompt, the prompt (the history) for a generation step
        # (AIC collect_mla_module.py:739-754)
        return [self.query_len if context else self.past_len] * self.batch_size

    def positions(self) -> list[int]:
        """Each new token's rope position, sequence by sequence: a decode token's is its cached count."""
        return [p for _ in range(self.batch_size) for p in range(self.past_len, self.seq_len)]


@dataclass(frozen=True)
class KvLayout(PagedLayout):
    """The latent cache of one case: a pool holding exactly the sequences' pages."""

    @property
    def blocks_per_seq(self) -> int:
        return ceil_div(self.max_seq_len, self.tokens_per_block)

    @property
    def num_blocks(self) -> int:
        return self.num_sequences * self.blocks_per_seq

    @property
    def max_tokens(self) -> int:
        """KvCacheConfig.max_tokens: the pool holds exactly the sequences' pages."""
        return self.num_blocks * self.tokens_per_block

    def cache_bytes(self, kv_cache_dtype: str) -> int:
        return self.max_tokens * LATENT * KV_BYTES[kv_cache_dtype]


def kv_layout(case, context: bool, tokens_per_block: int, copies: int = 1) -> KvLayout:
    query_len, past_len = lengths(case, context)
    return KvLayout(case.batch_size, copies, query_len, past_len, tokens_per_block)


def kernel_shapes(case, context: bool) -> dict[str, tuple[int, ...]]:
    """The inputs of one attention call with num_heads on the rank (AIC collect_mla.py:440-586; the tensors MLA
    hands its backends: modules/attention.py forward_context_default / forward_absorption_generation)."""
    h = case.num_heads
    t = case.batch_size * case.isl
    if context:  # unabsorbed prefill: q and k 192 wide per head, v 128 (a view of the kv_b_proj output)
        return {
            "q": (t, h * QK_HEAD),
            "kv": (t, h * (NOPE + V_HEAD)),
            "k": (t, h * QK_HEAD),
            "latent_cache": (t, LATENT),
            "output": (t, h * V_HEAD),
        }
    return {  # absorbed decode: the fused 576-wide query, its rope part, the new latent, the 512-wide output
        "fused_q": (t, h * LATENT),
        "q_pe": (t, h, ROPE),
        "latent_cache": (t, LATENT),
        "output": (t, h * KV_LORA),
        "cu_seqlens": (case.batch_size + 1,),
    }


def kernel_footprint(case, context: bool) -> int:
    """bf16 inputs and output of one call, fp8 query/operand copies when the cache is fp8, and the case's cache at
    the largest page size."""
    shapes = kernel_shapes(case, context)
    elems = sum(math.prod(shape) for name, shape in shapes.items() if name != "cu_seqlens")
    scratch = 0
    if case.kv_cache_dtype == "fp8":  # quant_q_buffer (decode) or the fp8 q/k/v the context FMHA reads
        h, t = case.num_heads, case.batch_size * case.isl
        scratch = t * h * (LATENT if not context else 2 * QK_HEAD + V_HEAD)
    cache = kv_layout(case, context, MAX_PAGE).cache_bytes(case.kv_cache_dtype)
    return 2 * elems + scratch + 2 * 4 * (case.batch_size + 1) + cache


def kernel_source(backend_class: str, mla_enabled: bool) -> str:
    """The label of the attention backend TensorRT-LLM built: default for its TrtllmAttention with MLA, as AIC
    records it; any other backend class is reported by its own name, so the row shows the difference."""
    if not mla_enabled:
        raise RuntimeError(f"TensorRT-LLM built {backend_class} without MLA parameters for an MLA case")
    return BACKEND_LABELS.get(backend_class, backend_class)


def backend_label(backend) -> str:
    """kernel_source of a built backend object (TrtllmAttention keeps its MLAParams; is_mla_enable on older ones)."""
    enabled = bool(getattr(backend, "is_mla_enable", False) or getattr(backend, "mla_params", None) is not None)
    return kernel_source(type(backend).__name__, enabled)


# --- GPU side: the cache manager and the attention metadata ----------------------------------------------------
def kv_cache(layout: KvLayout, kv_cache_dtype: str):
    """A one-layer SELFKONLY latent cache (one 576-wide head per token) holding every sequence of the layout, as AIC
    builds it (collect_mla.py:366-401; collect_mla_module.py:663-702). Shut down by the caller.

    Serving picks the manager class with pyexecutor/_util.py get_kv_cache_manager_cls (the module collector asks it,
    collect_mla_module.py:668-675); this is the KVCacheManager the kernel collector builds (collect_mla.py:377), whose
    block-offset tables the attention op reads the same way. Like AIC, the pool is left as allocated: its values do
    not change the kernels' work. verified_on: trtllm==1.3.0rc23"""
    from tensorrt_llm._torch.pyexecutor.resource_manager import CacheTypeCpp, DataType, KvCacheConfig, KVCacheManager

    from opcollect.backends.trtllm.context import one_rank_mapping

    manager = KVCacheManager(
        KvCacheConfig(max_tokens=layout.max_tokens, enable_block_reuse=False),
        CacheTypeCpp.SELFKONLY,
        num_layers=1,
        num_kv_heads=1,
        head_dim=LATENT,
        tokens_per_block=layout.tokens_per_block,
        max_seq_len=layout.max_seq_len,
        max_batch_size=layout.num_sequences,
        mapping=one_rank_mapping(),
        dtype=DataType.FP8 if kv_cache_dtype == "fp8" else DataType.BF16,
    )
    try:
        ids = list(range(layout.num_sequences))
        # add_dummy_requests returns None, adding nothing, when the pool has no free block (resource_manager.py:596);
        # the pool holds max_tokens exactly when that is below the free-memory fraction (:885-893)
        if manager.add_dummy_requests(ids, token_nums=layout.token_nums()) is None:
            raise RuntimeError(f"the MLA cache of {layout.num_blocks} blocks took none of {len(ids)} sequences")
    except BaseException:
        manager.shutdown()
        raise
    return manager


def attention_metadata(backend_cls, manager, layout: KvLayout, copy: int, context: bool, enable_flash_mla: bool):
    """The backend's metadata for one copy's sequences, prepared (AIC collect_mla_module.py:724-776: the fields the
    executor sets for an all-context or all-generation batch)."""
    import torch
    from tensorrt_llm._torch.metadata import KVCacheParams

    from opcollect.backends.trtllm.context import one_rank_mapping, prepare_metadata

    b = layout.batch_size
    metadata = backend_cls.Metadata(
        max_num_requests=b,
        max_num_tokens=layout.num_tokens,
        kv_cache_manager=manager,
        mapping=one_rank_mapping(),
        enable_flash_mla=enable_flash_mla,
        seq_lens=torch.tensor([layout.query_len] * b, dtype=torch.int),
        num_contexts=b if context else 0,
        request_ids=layout.request_ids(copy),
        prompt_lens=layout.prompt_lens(context),
        kv_cache_params=KVCacheParams(use_cache=True, num_cached_tokens_per_seq=[layout.past_len] * b),
    )
    return prepare_metadata(metadata)
