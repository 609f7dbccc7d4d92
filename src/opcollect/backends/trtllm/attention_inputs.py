"""What the TensorRT-LLM attention runner builds for a case, computed without torch or tensorrt_llm: the batch and
KV cache layout, the refusals, the kernel_source label. attention.py builds and runs it on the GPU.

Sources (TensorRT-LLM index copies, commits in docs/research/trtllm-1.3.0-runners.md; AIC = the reference collector
ai-dynamo/aiconfigurator collector/trtllm/collect_attn.py at HEAD, written for 1.3.0rc20):
- lengths: a context case is a prompt of isl tokens with an empty cache; a generation case is one new token after
  ``step`` cached tokens (AIC :297-330 with input_len = step, logged as step at :418-420; metadata.py KVCacheParams).
- tokens per block 32: serving's KvCacheConfig.tokens_per_block default (llmapi/llm_args.py KvCacheConfig); AIC uses
  64 (:148). Smaller pages mean more page-table entries per key: the collector's times can run a little lower.
- the KV pool: max_seq_len = tokens + 1 ("+1 for the magic fixme" of the XQA JIT path, AIC :267-269, :291), at
  least window + 2; the pool (KvCacheConfig.max_tokens, which KVCacheManager.calculate_max_num_blocks takes as the
  pool when given, resource_manager.py) holds the blocks the sequences use, twice over as AIC sizes it (:271-277,
  AttentionLayout.pool_tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

from opcollect.runtime.dtypes import ceil_div

SERVING_TOKENS_PER_BLOCK = 32
POOL_HEADROOM = 2  # the reference collector's factor on the KV pool (collect_attn.py:271-277)
ELEMENT_BYTES = {"bfloat16": 2, "fp8": 1}
# the plan's dispatch -> the backend name create_attention is asked for (attention_backend/utils.py
# get_attention_backend); the Gemma-4 heads are the only FLASHINFER-routed ones (AIC collect_attn.py:108-125)
BACKENDS = {"torch_flow": "TRTLLM", "torch_flow_flashinfer": "FLASHINFER"}
# the class create_attention built -> the label the reference collector records (collect_attn.py:239, :450)
LABELS = {"TrtllmAttention": "torch_flow", "FlashInferAttention": "torch_flow_flashinfer"}
# trtllm-gen FMHA (FlashInfer's trtllm-gen sub-backend) exists on SM100/103 only: TllmGenFmhaRunner asserts it
# (flashinfer fmhaRunner.cuh:37, cited at 1.3.0rc20 by AIC collect_attn.py:108-125)
FLASHINFER_SMS = ("100", "103")
# TrtllmAttention.is_sm_version_trtllm_gen_kernel (attention_backend/trtllm.py): SM100 and newer but SM120/121
TRTLLM_GEN_EXCLUDED = ("120", "121")
MAX_TRTLLM_HEAD_DIM = 256
# the head size whose context FMHA the SM90 table still has and the trtllm-gen kernels abort on
TRTLLM_GEN_UNSUPPORTED_HEAD_DIM = 192


def kernel_source(class_name: str) -> str:
    """The label of the attention backend class TensorRT-LLM built; another class keeps its own name."""
    return LABELS.get(class_name, "torch_flow_" + class_name.lower())


def backend_name(dispatch: str) -> str:
    return BACKENDS.get(dispatch, "TRTLLM")


def uses_trtllm_gen(sm: str) -> bool:
    return sm.isdigit() and int(sm) >= 100 and sm not in TRTLLM_GEN_EXCLUDED


def refusal(case, context: bool, backend: str, sm: str) -> str | None:
    """Why TensorRT-LLM cannot run this case with ``backend`` on ``sm`` (None: it can). Checked before any import
    and again on the class create_attention returned."""
    if case.beam_width != 1:
        return "the TRT-LLM attention runner builds no cache indirection for beam search; beam_width must be 1"
    if case.kv_cache_dtype not in ELEMENT_BYTES:
        return f"TRT-LLM has no {case.kv_cache_dtype} KV cache in this runner (bfloat16, fp8)"
    if case.attn_dtype not in ELEMENT_BYTES:
        return f"TRT-LLM attention takes bfloat16 or fp8 (QuantAlgo.FP8) compute, not {case.attn_dtype}"
    if case.attn_dtype == "fp8" and case.kv_cache_dtype != "fp8":
        # fp8 context FMHA reads and writes an fp8 cache (AIC collect_attn.py:152-153 asserts it)
        return "fp8 attention needs an fp8 KV cache"
    if backend == "FLASHINFER":
        if sm not in FLASHINFER_SMS:
            return (
                f"FlashInfer's trtllm-gen FMHA, which TRT-LLM pins for Gemma-4, runs on SM100/103 only, not SM{sm} "
                "(fmhaRunner.cuh:37, modeling_gemma4.py:263-270 at 1.3.0rc20; collect_attn.py:108-125)"
            )
        if case.attn_dtype == "fp8":
            # FlashInferAttention quantizes no attention compute: with an fp8 cache it casts Q to fp8 and writes a
            # bf16 output (attention_backend/flashinfer.py forward_impl; collect_attn.py:126-136)
            return "TRT-LLM's FlashInferAttention has no fp8 attention compute"
        if uses_sinks(case):
            # sinks are a TRTLLM-backend argument (modules/attention.py:949 at 1.3.0rc20; collect_attn.py:380-384)
            return "TRT-LLM's FlashInferAttention takes no attention sinks"
        return None
    if case.head_dim > MAX_TRTLLM_HEAD_DIM:
        # AttentionOp::initialize std::terminate()s "Head size N is not supported by MMHA": a hard abort that
        # would take the worker down (collect_attn.py:216-222)
        return f"TrtllmAttention aborts on head_dim {case.head_dim} > {MAX_TRTLLM_HEAD_DIM} (no MMHA kernel)"
    if case.head_dim == TRTLLM_GEN_UNSUPPORTED_HEAD_DIM and uses_trtllm_gen(sm):
        # TllmGenFmha aborts "Unsupported HeadDim for BMM2-N 192" (collect_attn.py:216-222); the B200 1.3.0rc20
        # reference tables hold no head_dim 192 row while the H200 ones do
        return f"TRT-LLM's trtllm-gen attention kernels abort on head_dim 192 (SM{sm})"
    return None


def lengths(case, context: bool) -> tuple[int, int]:
    """(new tokens, cached tokens) per sequence."""
    return (case.isl, 0) if context else (1, case.step)


def uses_out_scale(case, context: bool) -> bool:
    """An output scale, as serving's Attention._use_quantize_output gives an fp8 model's o_proj input scale: for fp8
    context FMHA, and for every fp8-cache decode, which the reference treats as the fp8-model deployment
    (collect_attn.py:158-187). A bf16 model with an fp8 cache passes none for its prefill."""
    return case.attn_dtype == "fp8" or (case.kv_cache_dtype == "fp8" and not context)


def uses_sinks(case) -> bool:
    """Learned attention sinks: gpt-oss's, whose head_dim 64 is the only one the reference gives them (collect_attn.py:
    372, every head_dim 64 case)."""
    return case.head_dim == 64


@dataclass(frozen=True)
class AttentionLayout:
    """One input set: ``batch_size`` requests alike, in a KV cache of ``tokens_per_block``-token blocks."""

    context: bool
    batch_size: int
    new_tokens: int  # query tokens per request
    cached_tokens: int  # tokens already in the cache per request
    tokens_per_block: int
    max_seq_len: int  # the KVCacheManager's max_seq_len
    window: int | None  # attention_window_size passed to forward (None: the whole sequence)
    heads: int
    kv_heads: int
    head_dim: int

    @property
    def kv_tokens(self) -> int:
        """Tokens per request in the cache once the call has written its new ones."""
        return self.new_tokens + self.cached_tokens

    @property
    def num_tokens(self) -> int:
        return self.batch_size * self.new_tokens

    @property
    def blocks_per_seq(self) -> int:
        return ceil_div(self.kv_tokens, self.tokens_per_block)

    @property
    def max_blocks_per_seq(self) -> int:
        return ceil_div(self.max_seq_len, self.tokens_per_block)

    def pool_tokens(self, copies: int = 1) -> int:
        """KvCacheConfig.max_tokens for ``copies`` input sets in one cache manager: the blocks their sequences
        hold, and at least one whole max_seq_len, which KVCacheManager._validate_and_adjust_attention_windows
        requires of the pool (else it cuts max_seq_len), times the collector's headroom. The collector reserves
        max_seq_len for every sequence (collect_attn.py:271-277): with a window far beyond the sequence (a decode
        step of 1 under an 8192 window) that is a pool of window-length sequences no kernel reads."""
        blocks = max(copies * self.batch_size * self.blocks_per_seq, self.max_blocks_per_seq)
        return POOL_HEADROOM * blocks * self.tokens_per_block

    @property
    def qkv_shape(self) -> tuple[int, int]:
        """Fused QKV, as the TRTLLM backend takes it (TrtllmAttention.support_fused_qkv; wrapper.run asserts
        (num_heads + 2 * num_kv_heads) * head_size columns)."""
        return (self.num_tokens, (self.heads + 2 * self.kv_heads) * self.head_dim)

    @property
    def q_shape(self) -> tuple[int, int]:
        return (self.num_tokens, self.heads * self.head_dim)

    @property
    def kv_shape(self) -> tuple[int, int]:
        """K and V each, split as FlashInfer takes them (no fused QKV: collect_attn.py:376-388)."""
        return (self.num_tokens, self.kv_heads * self.head_dim)

    @property
    def seq_lens(self) -> tuple[int, ...]:
        return (self.new_tokens,) * self.batch_size

    @property
    def num_cached_tokens_per_seq(self) -> tuple[int, ...]:
        return (self.cached_tokens,) * self.batch_size

    @property
    def prompt_lens(self) -> tuple[int, ...]:
        """The prompt of a context request; the cached tokens of a generation one (model_engine.py, cited at
        collect_attn.py:340-348)."""
        return (self.new_tokens if self.context else self.cached_tokens,) * self.batch_size

    @property
    def num_contexts(self) -> int:
        return self.batch_size if self.context else 0

    def request_ids(self, copy: int) -> tuple[int, ...]:
        """The requests of input set ``copy``: each set owns its own cache blocks."""
        return tuple(range(copy * self.batch_size, (copy + 1) * self.batch_size))


def max_attention_window(lay: AttentionLayout) -> list[int] | None:
    """KvCacheConfig.max_attention_window of the one-layer cache: a windowed case's window, as serving gives its KV
    cache manager a sliding layer's window (pyexecutor/_util.py, index id 54555926407: ``[sliding_window if the
    layer is sliding_attention else max_seq_len]``; KVCacheManager.__init__ builds max_attention_window_vec from it,
    resource_manager.py index id 3501434665); None (the default: max_seq_len) for full attention. The reference
    collector passes none (collect_attn.py:271-277): its cache treats the layer as full attention while forward
    masks by the window."""
    return [lay.window] if lay.window else None


def attention_layout(case, context: bool, tokens_per_block: int = SERVING_TOKENS_PER_BLOCK) -> AttentionLayout:
    new, cached = lengths(case, context)
    window = case.window_size or None
    longest = max(new + cached, window + 1 if window else 0)
    return AttentionLayout(
        context=context,
        batch_size=case.batch_size,
        new_tokens=new,
        cached_tokens=cached,
        tokens_per_block=tokens_per_block,
        max_seq_len=longest + 1,
        window=window,
        heads=case.num_heads,
        kv_heads=case.num_key_value_heads,
        head_dim=case.head_dim,
    )


def footprint(case, context: bool) -> int:
    """Bytes of one input set: QKV in bf16, the output, the KV pool, block offsets and an attention workspace.

    The workspace is sized by the op at its first call (attention_backend/trtllm.py passes metadata.workspace to
    thop.attention); a QKV-sized scratch stands in for it in context, where the FMHA stages QKV."""
    lay = attention_layout(case, context)
    qkv = lay.num_tokens * (lay.heads + 2 * lay.kv_heads) * lay.head_dim * 2
    out = lay.num_tokens * lay.heads * lay.head_dim * 2
    kv_elem = ELEMENT_BYTES.get(case.kv_cache_dtype, 2)
    pool = lay.pool_tokens() * 2 * lay.kv_heads * lay.head_dim * kv_elem
    offsets = lay.batch_size * 2 * lay.max_blocks_per_seq * 4
    workspace = qkv if context else lay.num_tokens * lay.heads * 8
    return qkv + out + pool + offsets + workspace
