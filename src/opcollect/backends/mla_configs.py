"""The config.json keys of the MLA architectures the framework runners build: DeepSeek-V3, DeepSeek-V3.2 and GLM-5,
their attention's dimensions, rope and DSA indexer, as Hugging Face and the files aiconfigurator-core 0.12.0 ships hold
them (aiconfigurator_core/model_configs/deepseek-ai--DeepSeek-V3_config.json, deepseek-ai--DeepSeek-V3.2_config.json,
zai-org--GLM-5_config.json; tests/data). The rope is in transformers 5's form, rope_parameters with rope_theta inside,
as vLLM and SGLang read it; legacy_rope gives the rope_theta + rope_scaling form TensorRT-LLM's RopeParams.from_config
reads. Each backend adds the keys its own builder reads (backends/{vllm,sglang,trtllm}/dsa_inputs.py, vllm/mla.py,
trtllm/mla_inputs.py). No framework import: the CPU-side inputs modules and tests read it."""

from __future__ import annotations

# the attention's keys
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
        "rope_type": "yarn",
        "rope_theta": 10000,
        "factor": 40,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
    },
}
DEEPSEEK_V32 = {**DEEPSEEK_V3, "index_topk": 2048, "index_n_heads": 64, "index_head_dim": 128}  # V3's, the indexer
GLM5 = {
    "hidden_size": 6144,
    "q_lora_rank": 2048,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 192,
    "qk_rope_head_dim": 64,
    "v_head_dim": 256,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 202752,
    "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"},
    "index_topk": 2048,
    "index_n_heads": 32,
    "index_head_dim": 128,
    "indexer_rope_interleave": True,  # GLM-5's indexer rope is interleaved; DeepSeek-V3.2's NeoX style (no key)
}
ATTENTION = {"DeepseekV3ForCausalLM": DEEPSEEK_V3, "DeepseekV32ForCausalLM": DEEPSEEK_V32, "GlmMoeDsaForCausalLM": GLM5}
DSA = {arch: ATTENTION[arch] for arch in ("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM")}
# each checkpoint's model_type and num_hidden_layers
IDENTITY = {
    "DeepseekV3ForCausalLM": ("deepseek_v3", 61),
    "DeepseekV32ForCausalLM": ("deepseek_v32", 61),
    "GlmMoeDsaForCausalLM": ("glm_moe_dsa", 78),
}


def checkpoint_keys(architecture: str) -> dict:
    """The checkpoint's architectures, model_type and num_hidden_layers, then its attention's keys."""
    model_type, layers = IDENTITY[architecture]
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "num_hidden_layers": layers,
        **ATTENTION[architecture],
    }


def legacy_rope(keys: dict) -> dict:
    """``keys`` with rope_parameters as rope_theta and rope_scaling ({"type": ..., ...}, None for the default rope),
    the form config.json files before transformers 5 hold."""
    rope = dict(keys["rope_parameters"])
    theta, kind = rope.pop("rope_theta"), rope.pop("rope_type")
    fields = {k: v for k, v in keys.items() if k != "rope_parameters"}
    return {**fields, "rope_theta": theta, "rope_scaling": None if kind == "default" else {"type": kind, **rope}}
