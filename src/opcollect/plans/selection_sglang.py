"""What SGLang 0.5.14's own ServerArgs chose per model class and SM, read from cases/selection/sglang-0.5.14.yaml.

scripts/selection_tables_sglang.py writes the file by running the pinned wheel's ServerArgs.__post_init__ on a CPU
with the device reporting each SM; tests/test_sglang_selection.py regenerates and compares it. The plans' SGLang
MoE, attention, MLA and fp8 GEMM dispatch ask here first and keep their hand-written rule where the file has no
answer (an SM it does not cover, a model 0.5.14 does not know, or "auto": the quant method resolves that when the
layer is built). Pure YAML: no framework import.
"""

from __future__ import annotations

from opcollect.plans.selection import table

FILE = "sglang-0.5.14.yaml"

# MoE shapes (hidden, inter, topk, experts) of cases/base_ops/moe.yaml and the architecture that serves each
# (the comments there name the models); a shape not listed is served by an architecture without a
# model-specific branch in server_args (MixtralForCausalLM in the file)
MOE_ARCHITECTURE = {
    (2048, 512, 8, 256): "Qwen3_5MoeForConditionalGeneration",  # Qwen3.5-35B-A3B
    (3072, 1024, 8, 256): "Qwen3_5MoeForConditionalGeneration",  # Qwen3.5-122B-A10B
    (4096, 1024, 10, 512): "Qwen3_5MoeForConditionalGeneration",  # Qwen3.5-397B-A17B
    (6144, 2560, 8, 160): "Qwen3MoeForCausalLM",  # Qwen3-Coder-480B-A35B
    (4096, 1536, 8, 128): "Qwen3MoeForCausalLM",  # Qwen3-235B-A22B (profile)
    (2048, 768, 8, 128): "Qwen3MoeForCausalLM",  # Qwen3-30B-A3B (profile)
    (4096, 2048, 8, 256): "MiMoV2FlashForCausalLM",
    (6144, 2048, 8, 256): "GlmMoeDsaForCausalLM",  # GLM-5
    (5120, 8192, 1, 16): "Llama4ForConditionalGeneration",
    (5120, 8192, 1, 128): "Llama4ForConditionalGeneration",
    (2816, 704, 8, 128): "Gemma4ForConditionalGeneration",
    (2688, 1856, 6, 128): "NemotronHForCausalLM",
    (8192, 5120, 22, 512): "NemotronHForCausalLM",
    (2048, 5120, 22, 512): "NemotronHForCausalLM",
    (3072, 1536, 8, 256): "MiniMaxM2ForCausalLM",
    (7168, 2048, 8, 256): "DeepseekV3ForCausalLM",
    (4096, 2048, 6, 256): "DeepseekV4ForCausalLM",  # DeepSeek-V4-Flash
    (7168, 3072, 6, 384): "DeepseekV4ForCausalLM",  # DeepSeek-V4-Pro
    (7168, 2048, 8, 384): "KimiK25ForConditionalGeneration",  # Kimi-K2 / K2.5 (both take the DeepSeek branch)
    (2880, 2880, 4, 128): "GptOssForCausalLM",
    (2880, 2880, 4, 32): "GptOssForCausalLM",
}
GENERIC_MOE = "MixtralForCausalLM"
# Kimi-K3 (3584, 3072, 16, 896) is no architecture 0.5.14 knows: its rule stays hand-written (plans/moe.py)
UNKNOWN_MOE = {(3584, 3072, 16, 896)}


def _sm(sm: str) -> str:
    # is_sm100_supported is "major == 10" (utils/common.py:282-286): SM103 takes SM100's branches
    return "100" if sm == "103" else sm


def moe_runner_backend(sm: str, shape: tuple[int, int, int, int], dtype: str, ep_size: int) -> str | None:
    """--moe-runner-backend as ServerArgs leaves it for the model of ``shape`` served in ``dtype`` ("auto": the
    quant method picks at layer build); None where the file has no answer."""
    if shape in UNKNOWN_MOE:
        return None
    arch = MOE_ARCHITECTURE.get(shape, GENERIC_MOE)
    entry = table(FILE).get(_sm(sm), {}).get(f"moe/{arch}/{dtype}/ep{1 if ep_size == 1 else 8}")
    return None if not entry or "refused" in entry else entry.get("moe_runner_backend")


def attention_backend(sm: str, architecture: str, kv_cache_dtype: str, phase: str) -> str | None:
    """The prefill or decode attention backend ServerArgs leaves for ``architecture``; None where unknown."""
    entry = table(FILE).get(_sm(sm), {}).get(f"attention/{architecture}/{kv_cache_dtype}")
    if not entry or "refused" in entry:
        return None
    return entry.get(f"{phase}_attention_backend")


# The architecture whose MLA ServerArgs is asked about: DeepSeek-V3, which the SGLang MLA runner stands in for
# (backends/sglang/mla.py); Kimi-K2.5, the tables' other head count, takes the same DeepSeek branch
# (server_args.py:3519-3527) and the file records it too (tests/test_sglang_selection.py holds them equal)
MLA_ARCHITECTURE = "DeepseekV3ForCausalLM"


def mla_backend(sm: str, kv_cache_dtype: str, phase: str, architecture: str = MLA_ARCHITECTURE) -> str | None:
    """The prefill or decode attention backend ServerArgs leaves for an MLA model with this KV cache dtype
    ("bfloat16" or "fp8"); None where the file has no answer."""
    entry = table(FILE).get(_sm(sm), {}).get(f"mla/{architecture}/{kv_cache_dtype}")
    if not entry or "refused" in entry:
        return None
    return entry.get(f"{phase}_attention_backend")


def fp8_gemm(sm: str, dtype: str) -> dict | None:
    """What Fp8LinearMethod.__init__ decides for an fp8 checkpoint (``dtype`` "fp8" or "fp8_block") on this SM:
    block_fp8_linear (the function dispatch_w8a8_block_fp8_linear returns), cutlass_fp8_supported, fp8_marlin and
    triton_w8a8_fp8_kernel (scripts/selection_sglang_fp8.py); None where the file has no answer."""
    entry = table(FILE).get(_sm(sm), {}).get(f"gemm/LlamaForCausalLM/{dtype}")
    return None if not entry or "refused" in entry else entry
