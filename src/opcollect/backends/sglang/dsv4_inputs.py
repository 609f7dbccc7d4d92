"""What SGLang 0.5.14's DeepSeek-V4 attention module runner (backends/sglang/dsv4.py) is built and fed with: each
model's config keys, the batch in SGLang's paged token pools, the pools' sizes and the bytes a case needs. No sglang
import; torch only inside the functions that build tensors. Paths relative to the wheel's sglang/srt/.

- Config: the keys of the config.json files aiconfigurator-core 0.12.0 ships (tests/data/dsv4_configs), as
  transformers 5 (SGLang's pin) holds them in the DeepseekV3Config SGLang registers for deepseek_v4
  (utils/hf_transformers/common.py:117-131): rope_parameters with rope_theta (the files leave it out: the class's
  10000) and the yarn keys inside, rms_norm_eps 1e-6 (its default; the files leave it out); with one layer of the
  case's compress ratio (compress_ratios [ratio], as the reference collector patches it, collect_dsv4_attn.py:516-520)
  and the checkpoint's native heads (the rank's come from the simulated attention TP, dsv4.py).
- Pages: 256 tokens for the full-attention positions (the backend asserts it, deepseek_v4_backend.py:489; the model
  runner's pool too, model_executor/model_runner_kv_cache_mixin.py:438), each request on its own pages after the
  allocator's padding page 0 (mem_cache/allocator/paged.py keeps page 0 out of its free list); the request-to-token
  rows start at 1 (ReqToTokenPool keeps row 0) and are context_len (max_position_embeddings) + 4 wide as the model
  runner sizes them (model_runner_kv_cache_mixin.py:413-418; mem_cache/common.py:251-267 with no speculation).
- The sliding-window pool holds, per request, its pages from the one holding position max(0, step - window) on, as
  serving keeps them once SWA eviction has freed the older ones; the full-to-SWA map is the allocator's
  (mem_cache/allocator/swa.py:82-101: size + one page of zeros, then -1) with each kept position mapped and every
  other one 0. The compressed pools follow the full pages (c4: 64 entries, c128: 2 a page; the configurator's sizes,
  model_executor/pool_configurator.py:580-589), the compressor state pools hold the SWA pool's tokens / window x ring
  (:587-588).
"""

from __future__ import annotations

from typing import NamedTuple

from opcollect.runtime.contract import KernelLimit
from opcollect.runtime.dtypes import ceil_div

PAGE_SIZE = 256  # deepseek_v4_backend.py:489
WINDOW = 128  # sliding_window of both checkpoints; the backend's SWA_WINDOW (deepseek_v4_backend.py:74)
EXTRA_CONTEXT = 4  # get_req_to_token_extra_context_len without speculative decoding (mem_cache/common.py:260)
RING = {4: 8, 128: 128}  # get_compress_state_ring_size without speculation (deepseek_v4_memory_pool.py:30-44)
KV_TOKEN_BYTES = 584  # 448 fp8 NoPE, 64 bf16 RoPE values, 8 scale bytes: the pools' FlashMLA layout
INDEX_TOKEN_BYTES = 132  # 128 fp8 values and an fp32 scale
STATE_HEAD = {4: 2 * 2 * 512, 128: 2 * 512}  # fp32 (kv, score) x coff values of a state slot (pool_configurator:556)

_COMMON = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "model_type": "deepseek_v4",
    "num_key_value_heads": 1,
    "head_dim": 512,
    "qk_rope_head_dim": 64,
    "o_lora_rank": 1024,
    "index_n_heads": 64,
    "index_head_dim": 128,
    "sliding_window": WINDOW,
    "max_position_embeddings": 1048576,
    "compress_rope_theta": 160000,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {
        "rope_theta": 10000,
        "rope_type": "yarn",
        "factor": 16,
        "beta_fast": 32,
        "beta_slow": 1,
        "original_max_position_embeddings": 65536,
    },
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "scale_fmt": "ue8m0",
        "weight_block_size": [128, 128],
    },
}
MODELS: dict[str, dict] = {
    "sgl-project/DeepSeek-V4-Flash-FP8": {
        **_COMMON,
        "hidden_size": 4096,
        "num_attention_heads": 64,
        "q_lora_rank": 1024,
        "o_groups": 8,
        "index_topk": 512,
    },
    "sgl-project/DeepSeek-V4-Pro-FP8": {
        **_COMMON,
        "hidden_size": 7168,
        "num_attention_heads": 128,
        "q_lora_rank": 1536,
        "o_groups": 16,
        "index_topk": 1024,
    },
}


def model_keys(model: str, ratio: int) -> dict:
    """A fresh copy of the model's keys, one layer of ``ratio`` (the layer rewrites rope_parameters' rope_type in
    place, models/deepseek_v4.py:318-320)."""
    found = MODELS.get(model)
    if found is None:
        raise KernelLimit(f"the SGLang DeepSeek-V4 runner knows no config of {model} (backends/sglang/dsv4_inputs.py)")
    keys = {k: dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v for k, v in found.items()}
    keys.update(num_hidden_layers=1, compress_ratios=[ratio])
    return keys


def lengths(case, context: bool) -> tuple[int, int]:
    """(new tokens, tokens) per request: isl after `step` cached ones; a decode step's one token after `step` (the
    reference collector, collect_dsv4_attn.py:1283-1285, :1561)."""
    return (case.isl, case.step + case.isl) if context else (1, case.step + 1)


class Layout(NamedTuple):
    """Every request alike, each on its own full pages and its own sliding-window pages."""

    batch_size: int
    query_len: int
    seq_len: int
    pages: int  # full pages of a request
    swa_first: int  # the first position whose sliding-window slot a request keeps (page-aligned)
    swa_pages: int  # sliding-window pages of a request
    context_len: int  # the request-to-token rows' width

    @property
    def num_tokens(self) -> int:
        return self.batch_size * self.query_len

    @property
    def full_size(self) -> int:
        return self.batch_size * self.pages * PAGE_SIZE

    @property
    def swa_size(self) -> int:
        return self.batch_size * self.swa_pages * PAGE_SIZE

    def state_size(self, ratio: int) -> int:
        return self.swa_size // WINDOW * RING[ratio]


def layout(case, context: bool) -> Layout:
    query_len, seq_len = lengths(case, context)
    if case.batch_size < 1 or query_len < 1 or case.step < 0:
        raise KernelLimit(f"a DeepSeek-V4 {'prefill' if context else 'decode'} needs requests with new tokens: {case}")
    context_len = MODELS[case.model]["max_position_embeddings"] if case.model in MODELS else seq_len
    if seq_len > context_len:
        raise KernelLimit(f"{seq_len} tokens exceed {case.model}'s {context_len} positions")
    prefix = seq_len - query_len
    first = max(0, prefix - WINDOW) // PAGE_SIZE * PAGE_SIZE
    pages = ceil_div(seq_len, PAGE_SIZE)
    return Layout(case.batch_size, query_len, seq_len, pages, first, pages - first // PAGE_SIZE,
                  context_len + EXTRA_CONTEXT)  # fmt: skip


class BatchTensors(NamedTuple):
    req_to_token: object  # int32 [b, seq_len]: each token's full slot, rows 1..b of ReqToTokenPool
    full_to_swa: object  # int64 [full_size + PAGE_SIZE + 1]: the allocator's map, -1 last
    out_cache_loc: object  # int64 [b x query_len]: the new tokens' full slots
    positions: object  # int64 [b x query_len]
    seq_lens: object  # int32 [b]


def batch_tensors(lay: Layout, device: str) -> BatchTensors:
    import torch

    b = torch.arange(lay.batch_size, dtype=torch.int64)[:, None]
    pos = torch.arange(lay.seq_len, dtype=torch.int64)
    slots = PAGE_SIZE * (1 + b * lay.pages) + pos  # [b, seq_len]: page 0 is the allocator's padding
    mapping = torch.zeros(lay.full_size + PAGE_SIZE + 1, dtype=torch.int64)
    mapping[-1] = -1
    kept = pos[lay.swa_first :]
    mapping[slots[:, lay.swa_first :]] = PAGE_SIZE * (1 + b * lay.swa_pages) + kept - lay.swa_first
    new = pos[lay.seq_len - lay.query_len :]
    return BatchTensors(
        req_to_token=slots.to(device=device, dtype=torch.int32),
        full_to_swa=mapping.to(device),
        out_cache_loc=slots[:, new].reshape(-1).to(device),
        positions=new.repeat(lay.batch_size).to(device),
        seq_lens=torch.full((lay.batch_size,), lay.seq_len, dtype=torch.int32, device=device),
    )


def weight_bytes(keys: dict, heads: int, tp: int, gemm_type: str) -> int:
    """The rank's projections (models/deepseek_v4.py:398-466: wqkv_a, wq_b, wo_a, wo_b), the indexer's wq_b and
    weights_proj and the compressors' bf16 wkv_gate (dsv4/indexer.py:660-675, compressor.py:373-380)."""
    k = keys
    hidden, head, q_lora = k["hidden_size"], k["head_dim"], k["q_lora_rank"]
    width = 1 if gemm_type == "fp8_block" else 2
    groups = k["o_groups"] // tp
    projections = hidden * (q_lora + head) + q_lora * heads * head + heads * head * k["o_lora_rank"]
    projections += groups * k["o_lora_rank"] * hidden
    index = q_lora * k["index_n_heads"] * k["index_head_dim"] + hidden * k["index_n_heads"] * 2
    gates = hidden * 2 * 2 * (head + k["index_head_dim"]) * 2
    return projections * width + index + gates


def footprint(case, context: bool) -> int:
    """Bytes a case holds on the device: weights, pools, request rows, activations (each token's q at the padded
    heads in bf16 and fp32 intermediates), the indexer's logits over the compressed prefix, and a margin."""
    keys = MODELS.get(case.model)
    if keys is None or case.batch_size < 1:
        return 0  # prepare refuses it before any allocation
    _, seq_len = lengths(case, context)
    lay = layout(case, context)
    ratio = case.compress_ratio if case.compress_ratio in RING else 4
    heads = max(case.num_heads, 64)
    pools = lay.swa_size * KV_TOKEN_BYTES + lay.full_size // ratio * KV_TOKEN_BYTES
    pools += lay.state_size(ratio) * STATE_HEAD[ratio] * 4
    if ratio == 4:
        pools += lay.full_size // 4 * INDEX_TOKEN_BYTES + lay.state_size(4) * 2 * 2 * 128 * 4
    rows = (lay.batch_size + 1) * lay.context_len * 4
    tokens = lay.num_tokens
    activations = tokens * (heads * keys["head_dim"] * 2 * 4 + keys["hidden_size"] * 2 * 4)
    # the indexer's rows are as wide as the page table: the batch's longest request in prefill, the request rows'
    # whole width in decode, whose metadata is built for graph replay (deepseek_v4_backend.py:851-871, 1117-1122)
    width = ceil_div(seq_len if context else lay.context_len, PAGE_SIZE) * PAGE_SIZE // 4
    logits = tokens * width * 4 * 2 if ratio == 4 else 0
    weights = weight_bytes(keys, case.num_heads, case.tp_size, case.gemm_type)
    return weights + pools + rows + activations + logits + 2**28
