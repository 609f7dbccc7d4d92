"""The one list of cases a collection leaves out, each entry with its reason in the comment above it.

An entry skips a case when every one of its keys matches. Keys: backend, op, sm, model, dtype (the op's
dtype field), dispatch, or any case field; a list value matches any of its items. ``model`` matches a
case that only models bring (not the base grid) when every such model, or its architecture, is listed.

The bar for an entry: the cases would be mismeasured, would hang, would fail as a whole block, or come
from a model the backend cannot serve. Everything else runs and has its failures recorded. Capacity is
not a skip: a case that does not fit the device is refused at run time, before allocation.
"""

from __future__ import annotations

import ast
import operator
from collections import Counter
from dataclasses import dataclass, replace
from functools import cache
from itertools import compress
from pathlib import Path
from typing import Mapping, NamedTuple

from opcollect.names import GPU_SMS

GROUP_KEYS = ("backend", "op", "sm", "dtype", "dispatch")
ATTENTION = ["attention_context", "attention_generation"]
MLA = ["mla_context", "mla_generation"]
MLA_MODULE = ["mla_context_module", "mla_generation_module"]
QUANTIZE = ["compute_scale", "scale_matrix"]
# DeepSeek-V4's attention (plans/dsv4.py, plans/dsv4_kernels.py)
DSV4_MODULE = ["dsv4_csa_context_module", "dsv4_csa_generation_module", "dsv4_hca_context_module"]
DSV4_MODULE += ["dsv4_hca_generation_module"]
DSV4 = [*DSV4_MODULE, "dsv4_paged_mqa_logits_module", "dsv4_hca_attn_module", "dsv4_csa_topk_calib"]
# DSA (plans/dsa.py), GLM-5's DSA kernels (plans/dsa_kernels.py) and MiniMax-M3's MSA (plans/msa.py)
DSA = ["dsa_context_module", "dsa_generation_module", "glm5_mqa_logits_module", "glm5_topk_module"]
DSA += ["glm5_dsa_attn_module"]
MSA = ["msa_context_module", "msa_generation_module"]
LINEAR = ["gdn", "mamba2"]  # Gated DeltaNet and Mamba2 (plans/linear_attention.py)
MAX_RANKS = 1024  # split-size values a parallelism entry lists: every count up to this


def _frozen(keys: Mapping[str, object]) -> dict[str, frozenset]:
    return {k: frozenset(v if isinstance(v, (list, tuple, set)) else [v]) for k, v in keys.items()}


@dataclass(frozen=True)
class Skip:
    name: str
    keys: Mapping[str, frozenset]
    # groups the entry leaves alone: each mapping of group keys (GROUP_KEYS) exempts the groups matching all of it
    exempt: tuple[Mapping[str, frozenset], ...] = ()

    def unless(self, **keys: object) -> Skip:
        """This entry, except for the groups that match every one of ``keys`` (group keys only)."""
        other = sorted(set(keys) - set(GROUP_KEYS))
        if other:
            raise ValueError(f"skip {self.name!r}: unless() takes group keys {GROUP_KEYS}, not {other}")
        return replace(self, exempt=(*self.exempt, _frozen(keys)))


def skip(name: str, **keys: object) -> Skip:
    return Skip(name, _frozen(keys))


SKIPS: list[Skip] = [
    # vLLM, SGLang and TensorRT-LLM run only on NVIDIA GPUs; on the CPU only the torch backend runs.
    # verified_on: vllm==0.24.0 sglang==0.5.14 trtllm==1.3.0rc23
    skip("frameworks-need-a-gpu", backend=["vllm", "sglang", "trtllm"], sm="cpu"),
    # gloo, the torch backend's process group on the CPU, has no float8 type in torch 2.13: all_reduce,
    # all_gather, reduce_scatter and alltoall on a float8_e4m3fn or float8_e5m2 tensor each raise "RuntimeError:
    # Invalid scalar type" (run with 2 and 4 ranks). half, bfloat16, int8 and float32 run all four with correct
    # results, so fp8 is gloo's only gap. It precedes fp8-needs-sm89, whose reason (no fp8 kernels) is another.
    # verified_on: torch==2.13.0
    skip("gloo-no-fp8", backend="torch", op="comm", sm="cpu", dtype="fp8"),
    # fp8 tensor-core instructions arrive with Ada (SM89): earlier GPUs and the CPU have no fp8 GEMM,
    # attention or MoE kernel, so every such case would fail as a block. The activation quantization that feeds an
    # fp8 GEMM (compute_scale, scale_matrix) is served from SM89 too: below it vLLM 0.24.0 and SGLang 0.5.14 serve
    # fp8 checkpoints weight-only with Marlin (vLLM kernels/linear/scaled_mm/marlin.py:46-55 is_supported below
    # capability 89, first in _POSSIBLE_FP8_KERNELS, kernels/linear/__init__.py:292-299; SGLang
    # layers/quantization/fp8_utils.py:1731-1737 can_auto_enable_marlin_fp8), so no activation is quantized there,
    # and the reference collector times it from SM89 only (collector/*/collect_computescale.py). On the CPU it is
    # a cast torch runs (backends/torch/quantize.py), the torch backend's stand-in for these tables.
    skip("fp8-needs-sm89", dtype="fp8", sm=["80", "86", "cpu"]).unless(op=QUANTIZE, sm="cpu"),
    # An fp8 (e4m3) KV cache is read through the same fp8 conversions, so attention keeps it from SM89 on too:
    # vLLM 0.24.0's FLASH_ATTN (its backend on SM80/86) takes an fp8 cache only with FA3 on the SM90 family
    # (v1/attention/backends/flash_attn.py:FlashAttentionBackend.supports_kv_cache_dtype), and the reference
    # collector plans fp8 KV only from SM89 for every framework (collector/{vllm,sglang,trtllm}/collect_attn.py:
    # get_context_attention_test_cases and get_generation_attention_test_cases).
    skip("fp8-kv-cache-needs-sm89", op=ATTENTION, kv_cache_dtype="fp8", sm=["80", "86", "cpu"]),
    # Block-scaled fp8 runs on the same fp8 tensor cores (SM89 and newer); below, vLLM 0.24.0 falls to the
    # weight-only MarlinFP8ScaledMMLinearKernel (model_executor/kernels/linear/__init__.py:
    # _POSSIBLE_FP8_BLOCK_KERNELS), a different kernel from the fp8_block label, and the others have none.
    skip("fp8-block-needs-sm89", dtype="fp8_block", sm=["80", "86", "cpu"]),
    # SM89 keeps fp8_block where the framework has a kernel for it: vLLM 0.24.0 GEMMs fall through
    # _POSSIBLE_FP8_BLOCK_KERNELS to TritonFp8BlockScaledMMKernel (kernels/linear/scaled_mm/triton.py:
    # is_supported, any CUDA) and its MoE to TritonExperts (fused_moe/experts/triton_moe.py:
    # _supports_quant_scheme, block fp8 when platforms/cuda.py:supports_fp8, i.e. SM89+); SGLang 0.5.14 GEMMs
    # fall to triton_w8a8_block_fp8_linear (layers/quantization/fp8_utils.py:_dispatch_auto_backend: no DeepGEMM
    # below SM90 per deep_gemm_wrapper/configurer.py:_compute_enable_deep_gemm, CUTLASS only from SM90) and its
    # MoE to the Triton fused_moe runner; TensorRT-LLM GEMMs run the Ada kernel (fp8_gemm_run: arch 89 ->
    # gemm_dispatch_sm89). TensorRT-LLM's grouped (MoE) block-scaled GEMM has no SM89 path: grouped_gemm_dispatch
    # is DeepGEMM-JIT only (TMA, SM90+) in cpp/tensorrt_llm/kernels/cutlass_kernels/fp8_blockscale_gemm/
    # fp8_blockscale_gemm_kernel.cuh (GitHub main; the 1.3.0rc23 tree is not in reach here).
    # verified_on: trtllm==1.3.0rc23
    skip("trtllm-fp8-block-moe-needs-sm90", backend="trtllm", op="moe", dtype="fp8_block", sm="89"),
    # NVFP4 needs the FP4 tensor cores of Blackwell (SM100 and newer).
    skip("nvfp4-needs-sm100", dtype="nvfp4", sm=["80", "86", "89", "90", "cpu"]),
    # No serving framework runs float32 GEMMs, attention or experts on a GPU; float32 is the CPU's
    # native baseline for the torch backend only.
    skip("float32-only-on-cpu", dtype="float32", sm=list(GPU_SMS)),
    # Plain PyTorch has no block-scaled fp8 or fp4 GEMM: each case would fail. (int4 weight-only runs:
    # torch._weight_int4pack_mm on CUDA SM80+, torch._weight_int4pack_mm_for_cpu on the CPU.) verified_on: torch==2.13.0
    skip("torch-no-quantized-gemm", backend="torch", op="gemm", dtype=["fp8_block", "nvfp4"]),
    # The torch MoE and MLA runners are bf16/fp32 references: quantized experts or latent caches (fp8, int4,
    # NVFP4, MXFP4) would be timed through dequantize-then-compute, a different kernel from any serving one
    # (mismeasured); the MoE runner refuses them (backends/torch/moe.py:prepare). verified_on: torch==2.13.0
    skip(
        "torch-no-quantized-moe-mla",
        backend="torch",
        op=["moe", *MLA],
        dtype=["fp8", "fp8_block", "nvfp4", "int4_wo", "w4a16_mxfp4", "w4a8_mxfp4_mxfp8"],
    ),
    # vLLM 0.24.0 runs experts either tensor-parallel or expert-parallel, never both: with expert parallel on,
    # FusedMoEParallelConfig.make (model_executor/layers/fused_moe/config.py) flattens the whole TP world into EP
    # (ep_size = tp_size) and returns tp_size=1, so a case with moe_tp_size > 1 and moe_ep_size > 1 is no vLLM
    # layer. (SGLang 0.5.14 splits both: moe_tp_size = tp // moe_ep_size // moe_dp_size in
    # distributed/parallel_state.py:initialize_model_parallel.) verified_on: vllm==0.24.0
    skip(
        "vllm-moe-tp-or-ep",
        backend="vllm",
        op="moe",
        moe_tp_size=list(range(2, MAX_RANKS + 1)),
        moe_ep_size=list(range(2, MAX_RANKS + 1)),
    ),
    # MXFP8 activations x MXFP4 weights need Blackwell's block-scaled tensor cores (SM100+): vLLM 0.24.0 serves
    # them only through TrtLlmMxfp4Experts (fused_moe/experts/trtllm_mxfp4_moe.py:_supports_current_device, SM100
    # family) and FlashInferExperts (fused_moe/experts/flashinfer_cutlass_moe.py:_supports_quant_scheme, mxfp4 x
    # mxfp8 at capability >= 100); SGLang 0.5.14 quantizes activations to MXFP8 only on its SM100 trtllm path
    # (layers/quantization/mxfp4.py:Mxfp4MoEMethod, the SM90 cutlass path is MXFP4 x BF16).
    skip("w4a8-mxfp4-needs-sm100", dtype="w4a8_mxfp4_mxfp8", sm=["80", "86", "89", "90", "cpu"]),
    # SGLang 0.5.14's MXFP8-activation MXFP4 MoE is the SM100/103 trtllm-gen kernel only: Mxfp4MoEMethod.__init__
    # (layers/quantization/mxfp4.py) raises "flashinfer_mxfp4 requires SM90 or SM100" elsewhere, and
    # utils/common.py:is_sm100_supported is capability major 10 only. verified_on: sglang==0.5.14
    skip("sglang-w4a8-mxfp4-sm100-only", backend="sglang", op="moe", dtype="w4a8_mxfp4_mxfp8", sm="120"),
    # TensorRT-LLM's weight-only MXFP4 MoE (WFP4A16) exists on SM90 (CUTLASS) and SM100-119 (TRTLLM-Gen):
    # tensorrt_llm/_torch/modules/fused_moe/quantization.py:WFP4A16FusedMoEMethod.create_weights raises
    # "WFP4A16 MoE is unsupported on SM<n>" for anything but SM90 on the CUTLASS backend, and model_config.py
    # picks TRTLLM-Gen only for 100 <= sm < 120 (cited at 1.3.0rc20 by the aiconfigurator collector,
    # cases/base_ops/moe.yaml moe_trtllm w4a16_mxfp4). verified_on: trtllm==1.3.0rc23
    skip(
        "trtllm-w4a16-mxfp4-sm90-to-sm119",
        backend="trtllm",
        op="moe",
        dtype="w4a16_mxfp4",
        sm=["80", "86", "89", "120"],
    ),
    # TensorRT-LLM has no int4 weight-only MoE: CutlassFusedMoE sends every int4 group-wise config (W4A16_AWQ shares
    # W4A8_AWQ's quant mode) to WInt4AFP8FusedMoEMethod, which quantizes activations to fp8 and raises
    # NotImplementedError outside SM89/90, per-channel W4A16 has no MoE method, and TRTLLM-Gen takes no int4
    # (tensorrt_llm/_torch/modules/fused_moe/create_moe.py get_moe_cls, fused_moe/quantization.py); the reference
    # holds no trtllm int4_wo MoE row. verified_on: trtllm==1.3.0rc23
    skip("trtllm-no-int4-weight-only-moe", backend="trtllm", op="moe", dtype="int4_wo"),
    # vLLM 0.24.0 has no fp8-query attention input: the layer takes the model's bf16 query and quantizes it itself
    # when the KV cache is fp8 (model_executor/layers/attention/attention.py:Attention.__init__ sets query_quant,
    # Attention.forward applies it), so bf16/fp8 is already the fp8 kernel and an fp8/fp8 case would time it
    # again under another label. verified_on: vllm==0.24.0
    skip("vllm-no-fp8-query-input", backend="vllm", op=ATTENTION, attn_dtype="fp8"),
    # Head dims above 256 run on FlashAttention 4 on SM90 (v1/attention/backends/fa_utils.py:get_flash_attn_version
    # upgrades FA3 -> FA4 for head_size > 256), whose forward asserts "FP8 is only supported on SM100" for an fp8
    # KV cache (vllm_flash_attn/cute/interface.py:_flash_attn_fwd); the grids' only such head_dim is 512.
    # verified_on: vllm==0.24.0
    skip("vllm-fa4-no-fp8-kv-on-sm90", backend="vllm", op=ATTENTION, sm="90", head_dim=512, kv_cache_dtype="fp8"),
    # TensorRT-LLM's FlashInferAttention (its path for Gemma-4's heads on SM100/103: head_dim 512, and head_dim 256
    # with a 1024-token window, plans/attention.py _trtllm_case) has no fp8 FMHA compute: with an fp8 KV cache the
    # query is cast and the output stays bf16 (attention_backend/flashinfer.py, cited at 1.3.0rc20 by the
    # aiconfigurator collector, collector/trtllm/collect_attn.py:126-136); its B200 rc20 table holds bf16 compute
    # only under torch_flow_flashinfer. verified_on: trtllm==1.3.0rc23
    skip(
        "trtllm-flashinfer-no-fp8-attention",
        backend="trtllm",
        op="attention_context",
        sm=["100", "103"],
        attn_dtype="fp8",
        head_dim=512,
    ),
    # The same FlashInferAttention path for Gemma-4's sliding-window layers (head_dim 256, window 1024): bf16 compute
    # only (collector/trtllm/collect_attn.py:126-136), as trtllm-flashinfer-no-fp8-attention.
    # verified_on: trtllm==1.3.0rc23
    skip(
        "trtllm-flashinfer-no-fp8-attention-windowed",
        backend="trtllm",
        op="attention_context",
        sm=["100", "103"],
        attn_dtype="fp8",
        head_dim=256,
        window_size=1024,
    ),
    # TensorRT-LLM's TRTLLM attention backend aborts the process for head_dim > 256 ("Head size N is not supported by
    # MMHA", a std::terminate, collect_attn.py:216-222), and Gemma-4's head_dim 512 has no other kernel off
    # SM100/103 (collect_attn.py:108-125): the block would kill its worker. verified_on: trtllm==1.3.0rc23
    skip(
        "trtllm-attention-head-dim-over-256",
        backend="trtllm",
        op=ATTENTION,
        head_dim=512,
        sm=[sm for sm in GPU_SMS if sm not in ("100", "103")],
    ),
    # TensorRT-LLM's trtllm-gen FMHA (its attention kernels on SM100/103) aborts on head_dim 192 ("Unsupported HeadDim
    # for BMM2-N 192", collect_attn.py:216-222); the B200 rc20 reference holds no head_dim 192 row, the H200 one
    # does. verified_on: trtllm==1.3.0rc23
    skip("trtllm-gen-no-head-dim-192", backend="trtllm", op=ATTENTION, head_dim=192, sm=["100", "103"]),
    # SGLang 0.5.14's FA3 casts the query to the KV dtype whenever the KV cache is fp8 and head_dim <= 256
    # (layers/attention/flashattention_backend.py:FlashAttentionBackend.forward_extend), so a bf16-query prefill
    # on an fp8 cache does not exist there: it is the fp8/fp8 case. Gemma-4 (head_dim 512, and its head_dim 256
    # layers with a 1024-token window) is served on triton below SM100 (server_args.py:
    # ServerArgs._handle_model_specific_adjustments), which reads a bf16 query against the fp8 cache, so those
    # keep bf16/fp8. verified_on: sglang==0.5.14
    skip(
        "sglang-fa3-casts-query-to-fp8",
        backend="sglang",
        op="attention_context",
        dispatch="fa3",
        attn_dtype="bfloat16",
        kv_cache_dtype="fp8",
        head_dim=[64, 128, 192, 256],
        window_size=[0, 128, 512, 8192],
    ),
    # SGLang 0.5.14's trtllm_mha (SM100/103) quantizes a bf16 query to fp8 for prefill when the KV cache is fp8
    # (layers/attention/trtllm_mha_backend.py:TRTLLMHAAttnBackend.forward_extend calls _maybe_quantize_q with
    # force_fp8), so bf16/fp8 prefill is the fp8/fp8 kernel under another label. verified_on: sglang==0.5.14
    skip(
        "sglang-trtllm-mha-quantizes-query",
        backend="sglang",
        op="attention_context",
        dispatch="trtllm_mha",
        attn_dtype="bfloat16",
        kv_cache_dtype="fp8",
    ),
    # SGLang 0.5.14's flashinfer prefill (its backend below SM90 and on SM120) passes the model-dtype query
    # straight to the kernel with the fp8 cache's scales (layers/attention/flashinfer_backend.py:
    # FlashInferAttnBackend.forward_extend): there is no fp8-query prefill to time, only bf16/fp8.
    # verified_on: sglang==0.5.14
    skip(
        "sglang-flashinfer-no-fp8-prefill",
        backend="sglang",
        op="attention_context",
        dispatch="flashinfer",
        attn_dtype="fp8",
    ),
    # scaled_dot_product_attention takes no fp8 inputs; converting an fp8 KV cache first would time the
    # conversion too (mismeasured). verified_on: torch==2.13.0
    skip("torch-sdpa-no-fp8-kv", backend="torch", op=[*ATTENTION, *MLA], kv_cache_dtype="fp8"),
    # gpt-oss attention has learned sinks on every layer; SDPA has none, so its head shapes timed
    # without them would be mismeasured. Shapes the base grid also has still run. verified_on: torch==2.13.0
    skip("torch-sdpa-no-sinks", backend="torch", op=ATTENTION, model="GptOssForCausalLM"),
    # Plain PyTorch has no all-reduce of its own: its only all-reduce is torch.distributed's NCCL (gloo on the
    # CPU), which the comm op already times into nccl_perf; custom_allreduce_perf is a framework's own kernel.
    # verified_on: torch==2.13.0
    skip("torch-no-custom-allreduce", backend="torch", op="custom_allreduce"),
    # A framework's custom_allreduce table holds its own variants only (vLLM: vllm_graph, vllm_eager; SGLang:
    # sglang_graph, sglang_eager; TRT-LLM: trtllm); plans/comm.py dispatches another framework's variant to
    # not-this-framework, as this backend has no runner for it.
    skip("custom-allreduce-own-variants-only", op="custom_allreduce", dispatch="not-this-framework"),
    # vLLM's MLA is timed as its whole module (DeepseekV2MLAAttention: projections, norms, rope and the MLA
    # backend), into the module tables, as the reference collector records vLLM (mla/vllm/0.24.0 holds only
    # mla_*_module_perf); the kernel-only MLA tables are the other frameworks'. verified_on: vllm==0.24.0
    skip("vllm-mla-as-a-module", backend="vllm", op=["mla_context", "mla_generation"]),
    # TensorRT-LLM's MLA has no compute-dtype switch besides its KV cache (attention_backend/trtllm.py: the MLA
    # context and generation paths take the model's bf16 query), so an fp8 mla_dtype row would time the bf16
    # kernel on an fp8 cache under another label; the reference records mla_dtype bfloat16 only (aiconfigurator
    # collector/trtllm/collect_mla.py:654, collect_mla_module.py:158-159). The whole module too: its attention is
    # the same backend, and the reference sweeps compute_dtype bfloat16 only (collect_mla_module.py:175-197), where
    # the grid adds vLLM's fp8 prefill query on SM100/103 (cases/base_ops/mla_context_module.yaml by_sm).
    # verified_on: trtllm==1.3.0rc23
    skip("trtllm-mla-bf16-compute", backend="trtllm", op=[*MLA, *MLA_MODULE], mla_dtype="fp8"),
    # Plain PyTorch has no MLA module, and SGLang's reference holds the kernel tables only; TensorRT-LLM's
    # reference has both, and so do its plans. verified_on: sglang==0.5.14 torch==2.13.0
    skip("mla-module-not-timed", backend=["torch", "sglang"], op=["mla_context_module", "mla_generation_module"]),
    # The module's projections in block fp8 need the fp8 tensor cores of SM89 and newer, as fp8-block-needs-sm89.
    skip(
        "mla-module-fp8-block-needs-sm89",
        op=["mla_context_module", "mla_generation_module"],
        gemm_type="fp8_block",
        sm=["80", "86"],
    ),
    # vLLM 0.24.0 runs MLA's absorb BMMs in bf16 on NVIDIA GPUs: it dequantizes an fp8 kv_b_proj to bf16 W_UK_T /
    # W_UV at load ("we currently do not have quantized bmm's", model_executor/layers/attention/mla_attention.py:
    # 875-880) and multiplies with torch.bmm (:789, :1034); its fp8 BMM is ROCm AITER's only (:520, :768-776). An
    # fp8 row would time the bf16 kernel under another label; the reference collector times bfloat16 only
    # (collector/vllm/collect_mla_bmm.py _SUPPORTED_DTYPES). verified_on: vllm==0.24.0
    skip("vllm-mla-bmm-bf16-only", backend="vllm", op="mla_bmm", dtype="fp8"),
    # Plain PyTorch has no batched fp8 matmul (torch._scaled_mm is 2-D): a loop over heads is no kernel any framework
    # serves the absorb BMM with, and the torch runner refuses it (backends/torch/mla_bmm.py).
    # verified_on: torch==2.13.0
    skip("torch-no-fp8-bmm", backend="torch", op="mla_bmm", dtype="fp8"),
    # vLLM labels DeepSeek-V4's fp8 (e4m3) KV cache fp8 (collector/vllm/collect_dsv4_attn.py:550, 813), SGLang
    # fp8_e4m3 (collector/sglang/collect_dsv4_attn.py:373-375, deepseekv4_sparse_modules.py:685-698), each framework's
    # table holding its own label (the consumer reads both, aiconfigurator-core dsv4.rs:1315-1320): the other label's
    # cases would time the same cache under another name. The grids hold one sweep per label
    # (cases/base_ops/dsv4_*.yaml). verified_on: vllm==0.24.0 sglang==0.5.14
    skip("dsv4-vllm-labels-fp8", backend="vllm", op=DSV4, kv_cache_dtype="fp8_e4m3"),
    # SGLang's side of dsv4-vllm-labels-fp8: its DeepSeek-V4 tables name the e4m3 KV cache fp8_e4m3 (the server's
    # kv_cache_dtype, collector/sglang/collect_dsv4_attn.py:373-375), never fp8. verified_on: sglang==0.5.14
    skip("dsv4-sglang-labels-fp8-e4m3", backend="sglang", op=DSV4, kv_cache_dtype="fp8"),
    # DeepSeek-V4 has no attention backend below SM90 in vLLM 0.24.0 (_select_dsv4_attn_cls, models/deepseek_v4/
    # nvidia/model.py:738-769: FlashMLA sparse takes capability majors 9 and 10, sparse_mla.py:94-95, FlashInfer's
    # DSV4 backend 10 and 12, nvidia/flashinfer_sparse.py:85-86; the reference collector refuses SM89,
    # collect_dsv4_attn.py:250-261) nor in SGLang 0.5.14 (its dsv4 backend calls sgl_kernel's FlashMLA, Hopper and
    # Blackwell kernels, or its SM120 port, deepseek_v4_backend.py:1416-1436; the reference collector parks SM89,
    # collector/sglang/registry.py:148-198): neither serves the model there, its mHC mixing included.
    # verified_on: vllm==0.24.0 sglang==0.5.14
    skip("dsv4-needs-sm90", backend=["vllm", "sglang"], op=[*DSV4, "mhc"], sm=["80", "86", "89"]),
    # The torch backend's DeepSeek-V4 references compute in fp32 or bf16 (cases/base_ops/dsv4_*.yaml narrowed cpu);
    # an fp8 cache or query would be timed through a dequantize first, no kernel any framework serves (mismeasured).
    # verified_on: torch==2.13.0
    skip("torch-no-fp8-dsv4", backend="torch", op=DSV4, kv_cache_dtype=["fp8", "fp8_e4m3"]),
    # TensorRT-LLM serves DeepSeek-V4's attention on Blackwell only: the reference collector needs 1.3.0rc21 or newer
    # (collector/trtllm/collect_dsv4_attn.py:44) and refuses pre-Blackwell GPUs (collector/trtllm/registry.py:143-184);
    # the H200 reference holds no TensorRT-LLM dsv4 table. Its mHC runs on its own (plans/mhc.py).
    # verified_on: trtllm==1.3.0rc23
    skip("trtllm-no-dsv4-attention", backend="trtllm", op=DSV4, sm=["80", "86", "89", "90"]),
    # Only vLLM's collector times the HCA layer's sparse MLA alone (collector/vllm/collect_dsv4_attn.py:674-791); the
    # consumer reads no such table (aiconfigurator-core 0.12.0 has no loader for it), so another framework's would be
    # for nothing. TensorRT-LLM's collector times the four attention modules alone (collect_dsv4_attn.py:193-205).
    # verified_on: sglang==0.5.14 trtllm==1.3.0rc23
    skip("dsv4-hca-attn-vllm-only", backend=["sglang", "trtllm"], op="dsv4_hca_attn_module"),
    # The CSA indexer's paged MQA logits alone: vLLM's and SGLang's collectors time them, TensorRT-LLM's does not
    # (collect_dsv4_attn.py:193-205 builds the four modules only) and the H200 reference holds no such table of it.
    # verified_on: trtllm==1.3.0rc23
    skip("dsv4-paged-logits-not-trtllm", backend="trtllm", op="dsv4_paged_mqa_logits_module"),
    # The top-k calibration corrects SGLang's CSA module rows, whose dummy weights give the indexer all-equal scores
    # (collector/sglang/collect_dsv4_attn.py:949-959); vLLM's collector writes none (its rows are not corrected: the
    # consumer applies the file only where it exists, dsv4.rs:467-503), so a vLLM one would correct nothing.
    # TensorRT-LLM's collector writes none either (collect_dsv4_attn.py:193-205).
    # verified_on: vllm==0.24.0 trtllm==1.3.0rc23
    skip("dsv4-topk-calib-sglang-only", backend=["vllm", "trtllm"], op="dsv4_csa_topk_calib"),
    # SGLang 0.5.14's DeepSeek-V4 hook turns the decode top-k v2 off on SM120 (server_args.py:3796: it needs more
    # than SM120's 99 KB of shared memory), so decode runs v1 there and a v2 row would time a kernel SGLang does not
    # serve. verified_on: sglang==0.5.14
    skip(
        "sglang-topk-v2-off-on-sm120",
        backend="sglang",
        op="dsv4_csa_topk_calib",
        sm="120",
        score_mode=["v2_flat", "v2_top_last"],
    ),
    # Each framework sweeps the DSA, GLM-5 kernel and MSA modules its own way, so their grids are lists of sweeps,
    # each naming its backends (cases/base_ops/dsa_*.yaml, glm5_*.yaml, msa_*.yaml; plans/sparse_sweeps.py): a group
    # of another framework's sweep is no case of this backend. A backend no sweep names has no such table: SGLang no
    # MSA (0.5.14 has no MiniMax-M3 model), vLLM and TensorRT-LLM no GLM-5 kernel tables (the consumer reads them for
    # SGLang's context parallelism only), torch these modules on the CPU only (its references are no serving kernel).
    skip("sparse-module-sweep-of-another-framework", op=[*DSA, *MSA], dispatch="not-this-framework"),
    # DSA's indexer computes its fp8 MQA logits with DeepGEMM, whose kernels exist for SM90 and the SM100 family only:
    # vLLM 0.24.0's indexer refuses to build without it (model_executor/layers/sparse_attn_indexer.py:468-472) and its
    # only sparse MLA backends take capability majors 9 and 10 (v1/attention/backends/mla/flashmla_sparse.py:129-130,
    # flashinfer_mla_sparse.py:89-90; SM120's fails in DeepGEMM, collector/vllm/collect_mla_module.py:925-938);
    # TensorRT-LLM refuses DSA from SM120 (collector/trtllm/collect_mla_module.py:803-819: DeepGEMM attention.hpp
    # "Unsupported architecture") and below SM90 has no MLA kernel (:820-830); SGLang's DSA path runs the same
    # DeepGEMM logits and FlashMLA kernels (srt/layers/attention/dsa_backend.py; SM120 parked by the reference
    # collector, collector/sglang/registry.py:91-146). Every case would fail as a block.
    # verified_on: vllm==0.24.0 sglang==0.5.14 trtllm==1.3.0rc23
    skip("dsa-indexer-needs-deepgemm", backend=["vllm", "sglang", "trtllm"], op=DSA, sm=["80", "86", "89", "120"]),
    # TensorRT-LLM's MiniMax-M3 attention keeps the checkpoint's 4 index heads on every rank and asserts they divide
    # the rank's KV heads: at 128 heads a rank has 128 / 16 = 8 KV heads, "num_index_heads (4) must be divisible by
    # num_kv_heads (8)" (collector/trtllm/collect_msa_module.py:436-449; the rc23 reference's sidecar counts its 856
    # such failures), and serving never has more than 4 KV heads a rank. Every 128-head case fails as a block.
    # verified_on: trtllm==1.3.0rc23
    skip("trtllm-msa-index-heads-divide-kv-heads", backend="trtllm", op=MSA, num_heads=128),
    # MSA's fp8 projections and fp8 cache need the fp8 conversions of SM89 and newer, as fp8-block-needs-sm89 and
    # fp8-kv-cache-needs-sm89: vLLM's Triton MSA reads the fp8 cache as float8_e4m3fn (models/minimax_m3/common/
    # sparse_attention.py:298, :352), which Triton compiles from SM89 only.
    skip("msa-fp8-block-needs-sm89", op=MSA, gemm_type="fp8_block", sm=["80", "86"]),
    # The same for MSA's fp8 KV cache (msa-fp8-block-needs-sm89 says why).
    skip("msa-fp8-kv-cache-needs-sm89", op=MSA, kv_cache_dtype="fp8", sm=["80", "86"]),
    # Only TensorRT-LLM's collector times Mamba2's kernels (collector/trtllm/collect_mamba2.py, registered by
    # collector/trtllm/registry.py:84-97; vLLM's and SGLang's collectors register gdn alone, collector/vllm/
    # registry.py:173-176, collector/sglang/registry.py:326), and the H200 reference holds mamba2_perf for
    # TensorRT-LLM alone: plans/linear_attention.py dispatches the others to not-this-framework, which have no runner
    # for it.
    skip("mamba2-trtllm-only", op="mamba2", dispatch="not-this-framework"),
    # The torch backend's Gated DeltaNet and Mamba2 are references (backends/torch/linear_attention.py): Python loops
    # over chunks or tokens of ATen ops, no kernel any framework serves these layers with (FLA's Triton kernels, the
    # causal-conv1d and selective-scan CUDA kernels), so a GPU row would stand for nothing a framework runs; they
    # write the CPU's tables. verified_on: torch==2.13.0
    skip("torch-linear-attention-cpu-only", backend="torch", op=LINEAR, sm=list(GPU_SMS)),
    # TensorRT-LLM's DeepSeek-V4 attention modules on Blackwell (collector/trtllm/collect_dsv4_attn.py) have no runner
    # in opcollect: every case would fail as a block with "no runner". The H200 reference holds no such table, so
    # no plan of this entry's is held to one; every other framework op of the sparse, compressed and linear
    # attention families has its runner (backends/<fw>/{dsa,dsa_kernels,dsv4,dsv4_kernels,msa,mhc,gdn,
    # linear_attention}.py). Tests lift it (tests/conftest.py runner_pending_lifted) to hold the grid and dispatch.
    # verified_on: trtllm==1.3.0rc23
    skip("runner-pending", backend="trtllm", op=DSV4_MODULE),
]


@cache
def reasons() -> dict[str, str]:
    """Each entry's reason: the comment lines directly above it in this file."""
    source = Path(__file__).read_text()
    lines = source.splitlines()
    tree = ast.parse(source)
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "SKIPS":
            for element in node.value.elts:  # type: ignore[union-attr]
                call = element
                while isinstance(call.func, ast.Attribute):  # skip(...).unless(...): the name is skip()'s
                    call = call.func.value
                name = call.args[0].value  # type: ignore[attr-defined]
                comment: list[str] = []
                row = element.lineno - 2
                while row >= 0 and lines[row].strip().startswith("#"):
                    comment.insert(0, lines[row].strip().lstrip("#").strip())
                    row -= 1
                found[name] = " ".join(comment)
    return found


class GroupDecision(NamedTuple):
    """What the skips do to one group: the kept positions (None: all kept) and counts per entry."""

    kept: list[int] | None
    skipped: dict[str, int]


def decide(
    backend: str,
    op: str,
    sm: str,
    dispatch: str,
    group,
    architecture_of: Mapping[str, str],
    entries: list[Skip] = SKIPS,
) -> GroupDecision:
    fields = group.case_type._fields
    values = {"backend": backend, "op": op, "sm": sm, "dtype": group.dtype, "dispatch": dispatch}
    active: list[tuple[str, list]] = []
    for entry in entries:
        per_case: list = []
        if any(all(values[key] in allowed for key, allowed in exempt.items()) for exempt in entry.exempt):
            continue
        for key, allowed in entry.keys.items():
            if key in values:
                matched = values[key] in allowed
            elif key in group.constants:
                matched = group.constants[key] in allowed
            elif key == "model":
                per_case.append(("model", allowed))
                continue
            elif key in fields:
                per_case.append((fields.index(key), allowed))
                continue
            else:
                matched = False  # this op's cases have no such field
            if not matched:
                break
        else:
            active.append((entry.name, per_case))
    if not active:
        return GroupDecision(None, {})
    first_name, first_tests = active[0]
    if not first_tests:
        return GroupDecision([], {first_name: len(group.values)})

    def matches(values: tuple, tests) -> bool:
        for key, allowed in tests:
            if key == "model":
                models = group.models_of(values)
                if not models or not all(m in allowed or architecture_of.get(m) in allowed for m in models):
                    return False
            elif values[key] not in allowed:
                return False
        return True

    # the entries look at a few fields only: decide once per distinct projection onto them, in C loops
    tested = {key for _, tests in active for key, _ in tests}
    relevant = sorted({k for k in tested if k != "model"} | (set(group.shape_index) if "model" in tested else set()))
    project = operator.itemgetter(*relevant) if relevant else (lambda values: ())
    keys = list(map(project, group.values))
    verdict = {
        key: next((name for name, tests in active if matches(values, tests)), None)
        for key, values in dict(zip(keys, group.values)).items()
    }
    skipped: dict[str, int] = {}
    for key, n in Counter(keys).items():
        if verdict[key] is not None:
            skipped[verdict[key]] = skipped.get(verdict[key], 0) + n
    if not skipped:
        return GroupDecision(None, {})
    keep = {key: name is None for key, name in verdict.items()}
    kept = list(compress(range(len(keys)), map(keep.__getitem__, keys)))
    return GroupDecision(kept, skipped)
