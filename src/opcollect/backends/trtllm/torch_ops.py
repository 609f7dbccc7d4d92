"""The torch ops of TensorRT-LLM that the quantize, MLA-BMM and encoder-attention runners call, and what those runners
assume of the installed tensorrt_llm's sources, checked before a case is built.

The contract check (backends/symbols.py) and the run's preflight cover every ``from tensorrt_llm... import`` a runner
makes. They cannot see a torch op: torch.ops.trtllm.bmm_out is a Python custom op that importing
tensorrt_llm._torch.custom_ops registers (custom_ops/__init__.py imports torch_custom_ops.bmm_out), the FP8 quantize
and block-scaled BMM ops are C++ ops whose library is loaded by then (custom_ops/cpp_custom_ops.py registers fakes
for them), and a value read off an imported class (PredefinedAttentionMask.FULL) is not checked either. So:

- ``torch_op`` imports tensorrt_llm._torch.custom_ops and looks the op up, refusing the case as a KernelLimit that
  names the op when the installed TensorRT-LLM does not register it;
- ``check_installed(op)`` reads the installed package's sources (never importing them) and refuses, with one line
  naming the file, when serving no longer calls what the runner times (ASSUMPTIONS): FP8QDQLinearMethod.apply's two
  per-tensor quantize ops, MLA's absorb BMMs and its fp8 wrapper's kernels, the no-cache metadata and the FULL mask
  an encoder's attention runs with, mHC's pre_mapping, its tactics' entry points and post_mapping, and what the DSA
  module runner (dsa.py) builds on: the decoder layer's DSA attention, the sparse cache manager and its keywords,
  the DSA metadata's sparse_metadata_params; and what the MSA module runner (msa.py) builds on: the decoder layer's
  sparse attention, rc23's MiniMaxM3SparseAttentionConfig.implementation, the sparse cache manager; and the calls
  of the GDN and Mamba2 layers' forward that the linear-attention runners (linear_attention.py) make;
- ``fp8_bmm_wrapper`` reads whether the installed fp8 BMM wrapper runs its SM89/90 BMM into a fresh buffer and copies
  it to the output (the copies read do; the reference collector times the BMM without that copy), so mla_bmm times
  what the installed serving code does.

MLA and its fp8 wrapper live in _torch/modules/attention.py up to the copies read at 1.3.0rc20 (AIC
collect_mla_bmm.py cites attention.py:1151-1191@1.3.0rc20) and in _torch/modules/mla.py after PR #15648 (merged
2026-06-26; modules/mla.py @06d27b41): the runners import neither, and the check reads whichever file defines them.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from opcollect.backends.symbols import MAX_SOURCE_BYTES
from opcollect.errors import InputError
from opcollect.inputs import read_text
from opcollect.runtime.contract import KernelLimit

MLA_FILES = ("_torch/modules/attention.py", "_torch/modules/mla.py")
MHC_MODULE, MHC_CUDA = "_torch/modules/mhc/hyper_connection.py", "_torch/modules/mhc/mhc_cuda.py"
# DSA's backend, cache manager and metadata: one file up to the copies read at 00e3c1a5, a package later
DSA_FILES = tuple(f"_torch/attention_backend/sparse/dsa{p}.py" for p in ("", "/cache_manager", "/metadata"))
DSA_OPS = ("dsa_context_module", "dsa_generation_module")
MSA_OPS = ("msa_context_module", "msa_generation_module")
GDN_MIXER, MAMBA2_MIXER = "_torch/modules/mamba/gdn_mixer.py", "_torch/modules/mamba/mamba2_mixer.py"


@dataclass(frozen=True)
class Assumption:
    """The function, class or ``Class.method`` ``where``, defined in the first of ``paths`` (inside the tensorrt_llm
    package) that defines it, contains every one of ``needs``; the runners of ``ops`` rely on it."""

    ops: tuple[str, ...]
    paths: tuple[str, ...]
    where: str
    needs: tuple[str, ...]
    why: str


# Each as read in the TensorRT-LLM copies named in docs/research/trtllm-1.3.0-i22-runners.md.
ASSUMPTIONS = (
    Assumption(
        ("compute_scale", "scale_matrix"),
        ("_torch/modules/linear.py",),
        "FP8QDQLinearMethod.apply",
        ("torch.ops.tensorrt_llm.static_quantize_e4m3_per_tensor", "torch.ops.tensorrt_llm.quantize_e4m3_per_tensor"),
        "serving's per-tensor FP8 linear quantizes its activation with the static op given the checkpoint's "
        "input_scale, else with the dynamic one that computes the scale (linear.py:619-627 @00bbf71e)",
    ),
    Assumption(
        ("mla_bmm",),
        MLA_FILES,
        "MLA",
        ("torch.ops.trtllm.bmm_out", "fp8_block_scaling_bmm_out(", "k_b_proj_trans", "v_b_proj"),
        "MLA's absorb BMMs run torch.ops.trtllm.bmm_out on bf16 weights and fp8_block_scaling_bmm_out on fp8 block "
        "weights (MLA.forward_absorption_generation, attention.py @00547a25)",
    ),
    Assumption(
        ("mla_bmm",),
        MLA_FILES,
        "fp8_block_scaling_bmm_out",
        (
            "torch.ops.trtllm.fp8_batched_quantize_1x128_permute102",
            "torch.ops.trtllm.fp8_block_scaling_bmm_out",
            "per_token_quant_and_transform",
            "is_sm_100f",
            "mat2_dequant",
        ),
        "the fp8 absorb BMM: SM89/90 quantize the activation per 1x128 block, SM120 with "
        "per_token_quant_and_transform, then the block-scaled BMM; SM100f a bf16 torch.bmm on the dequantized weight "
        "(mla.py @06d27b41)",
    ),
    Assumption(
        ("encoder_attention",),
        ("_torch/attention_backend/trtllm.py",),
        "TrtllmAttentionMetadata",
        ("_max_seq_len_storage", "kv_cache_manager is None"),
        "an encoder's metadata has no KV cache manager and takes max_seq_len from _max_seq_len_storage (trtllm.py "
        "TrtllmAttentionMetadata.max_seq_len, prepare; AIC collect_attn_encoder.py builds it so)",
    ),
    Assumption(
        ("encoder_attention",),
        ("_torch/attention_backend/interface.py",),
        "PredefinedAttentionMask",
        ("FULL",),
        "a vision tower's attention is non-causal: attention_mask=PredefinedAttentionMask.FULL "
        "(modeling_qwen2vl.py Qwen2_5_VLVisionAttention.forward)",
    ),
    # mhc.py times mHC.pre_mapping / post_mapping and labels pre by the entry point its tuned tactic calls
    # (hyper_connection.py @10ce7685, mhc_cuda.py @07f9cd08; AIC collect_mhc_module.py:186-223)
    Assumption(
        ("mhc",),
        (MHC_MODULE,),
        "mHC.pre_mapping",
        ("mhc_pre_mapping_fused_cuda(",),
        "pre_mapping runs mhc_cuda.mhc_pre_mapping_fused, the autotuned GEMM + square sum and big fuse",
    ),
    Assumption(
        ("mhc",),
        (MHC_CUDA,),
        "mhc_pre_mapping_fused",
        ("choose_one(", "MhcPreMappingRunner"),
        "the AutoTuner picks pre_mapping's tactic among MhcPreMappingRunner's",
    ),
    Assumption(
        ("mhc",),
        (MHC_CUDA,),
        "MhcPreMappingRunner.forward",
        ("mhc_gemm_rms_fma_cuda(", "mhc_gemm_rms_dg_cuda("),
        "a tactic runs its GEMM + square sum through mhc_gemm_rms_fma_cuda or mhc_gemm_rms_dg_cuda (with its K "
        "splits), the calls the runner records to name the tactic (mhc_cuda.py:333-347 @1.3.0rc20 per the collector)",
    ),
    Assumption(
        ("mhc",),
        (MHC_MODULE,),
        "mHC.post_mapping",
        ("mhc_post_mapping_cuda(",),
        "post_mapping runs mhc_cuda.mhc_post_mapping_cuda, the one kernel torch.ops.trtllm.mhc_post_mapping",
    ),
    # dsa.py builds layer 0's attention as the reference collector does at rc20 (AIC collect_mla_module.py:534-776)
    Assumption(
        DSA_OPS,
        ("_torch/models/modeling_deepseekv3.py",),
        "DeepseekV3DecoderLayer",
        ("deepseek_v32",),
        "the decoder layer builds the DSA attention for model_type deepseek_v32, the type the runner gives "
        "DeepSeek-V3.2 and GLM-5 (modeling_deepseekv3.py, index id 3518086746: DeepseekV32Attention)",
    ),
    Assumption(
        DSA_OPS,
        ("_torch/pyexecutor/_util.py",),
        "get_kv_cache_manager_cls",
        ("sparse_attention_config", "get_sparse_attn_kv_cache_manager("),
        "a model with a sparse attention config gets its algorithm's cache manager, DSA's with the indexer's key pool "
        "(_util.py @00043967)",
    ),
    Assumption(
        DSA_OPS,
        DSA_FILES,
        "DSACacheManager.__init__",
        ("sparse_attention_config", "pretrained_config"),
        "the DSA cache manager takes the sparse and pretrained configs by these names (rc20's rename, AIC :688-697; "
        "a later copy, index id 57382607766); a name it drops into **kwargs leaves it without them",
    ),
    Assumption(
        DSA_OPS,
        DSA_FILES,
        "DSAtrtllmAttentionMetadata",
        ("sparse_metadata_params",),
        "the DSA metadata reads the lowered sparse_metadata_params the runner passes (AIC :714-722, :769; "
        "sparse/dsa/metadata.py @065ff9e9)",
    ),
    # msa.py builds MiniMax-M3's sparse layer as the reference collector does at rc23 (collect_msa_module.py:300-779)
    Assumption(
        MSA_OPS,
        ("_torch/models/modeling_minimaxm3.py",),
        "MiniMaxM3DecoderLayer",
        ("get_sparse_layer_ids(", "is_sparse_attention_layer="),
        "the decoder layer builds a sparse attention for a layer sparse_attention_freq marks, the one layer the runner "
        "gives it (modeling_minimaxm3.py, index id 55546326808)",
    ),
    Assumption(
        MSA_OPS,
        ("llmapi/llm_args.py",),
        "MiniMaxM3SparseAttentionConfig",
        ("implementation",),
        "rc23's MiniMax-M3 route: implementation 'msa' (fmha_sm100) on SM100/103, 'triton' elsewhere, the field the "
        "runner sets as serving does (collect_msa_module.py:358-367); without it there is no rc23 route",
    ),
    Assumption(
        MSA_OPS,
        ("_torch/pyexecutor/_util.py",),
        "get_kv_cache_manager_cls",
        ("sparse_attention_config", "get_sparse_attn_kv_cache_manager("),
        "a model with a sparse attention config gets its algorithm's cache manager, MiniMax-M3's KVCacheManagerV2 with "
        "the index-key side cache (collect_msa_module.py:563-571)",
    ),
    # linear_attention.py calls the kernels of the GDN and Mamba2 layers as their forward calls them (gdn_mixer.py
    # @0d4bd901, mamba2_mixer.py @02140fd4)
    Assumption(
        ("gdn",),
        (GDN_MIXER,),
        "Qwen3NextGatedDeltaNet.forward_extend",
        ("causal_conv1d_fn(", "chunk_gated_delta_rule(", "cache_indices=", "cu_seqlens=", "head_first=False"),
        "a prompt's GDN runs causal_conv1d_fn over the packed channels into the conv-state pool, then the chunked "
        "gated delta rule over cu_seqlens with the recurrent-state pool",
    ),
    Assumption(
        ("gdn",),
        (GDN_MIXER,),
        "Qwen3NextGatedDeltaNet.forward_decode",
        ("causal_conv1d_update(", "fused_sigmoid_gating_delta_rule_update(", "initial_state_indices=", "cu_seqlens="),
        "a decode step runs causal_conv1d_update, then the fused-gating recurrent step on the indexed state pool",
    ),
    Assumption(
        ("mamba2",),
        (MAMBA2_MIXER,),
        "Mamba2Mixer.forward",
        (
            "causal_conv1d_fn(",
            "mamba_chunk_scan_combined(",
            "return_varlen_states=True",
            "causal_conv1d_update(",
            "self.selective_state_update_func(",
            "state_batch_indices=",
        ),
        "Mamba2's prefill runs causal_conv1d_fn and the varlen SSD scan, its decode causal_conv1d_update and the "
        "selective state update the mixer picked, on the layer cache's pools",
    ),
)


def definition(tree: ast.Module, where: str) -> ast.AST | None:
    """The top-level function or class ``where``, or the method ``Class.method``, of ``tree`` (the last one defined)."""
    scope: list[ast.stmt] = tree.body
    *classes, name = where.split(".")
    for class_name in classes:
        found = [n for n in scope if isinstance(n, ast.ClassDef) and n.name == class_name]
        if not found:
            return None
        scope = found[-1].body
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    defs = [n for n in scope if isinstance(n, kinds) and n.name == name]
    return defs[-1] if defs else None


def _source(root: Path, paths: tuple[str, ...], where: str) -> tuple[str, str] | str:
    """(file, source of ``where``) from the first of ``paths`` that defines it, or one line saying why none does."""
    missing = []
    for rel in paths:
        path = root / rel
        if not path.is_file():
            missing.append(rel)
            continue
        try:
            text = read_text(path, "TensorRT-LLM source", "run the pinned image", limit=MAX_SOURCE_BYTES)
            tree = ast.parse(text)
        except InputError as exc:  # not a regular file, too large, not UTF-8
            return str(exc)
        except (SyntaxError, RecursionError, MemoryError):
            return f"tensorrt_llm/{rel}: not Python this interpreter parses"
        node = definition(tree, where)
        if node is not None:
            return rel, ast.get_source_segment(text, node) or ""
    files = " or ".join(f"tensorrt_llm/{rel}" for rel in paths)
    state = "missing" if len(missing) == len(paths) else f"no {where}"
    return f"{files}: {state}"


def problems(root: Path, op: str) -> list[str]:
    """One line per assumption of ``op``'s runner that the tensorrt_llm package at ``root`` breaks."""
    out = []
    for item in ASSUMPTIONS:
        if op not in item.ops:
            continue
        found = _source(root, item.paths, item.where)
        if isinstance(found, str):
            out.append(f"{found} ({item.why})")
            continue
        rel, body = found
        missing = [need for need in item.needs if need not in body]
        if missing:
            out.append(f"tensorrt_llm/{rel}: {item.where} no longer uses {', '.join(missing)} ({item.why})")
    return out


def installed_root() -> Path | None:
    """The installed tensorrt_llm package's directory, located as the run's preflight locates it (never imported)."""
    from opcollect.runtime.preflight import locate

    found = locate("tensorrt_llm")
    return found[0] if found and found[0].is_dir() else None


@lru_cache(maxsize=None)
def _installed_problems(op: str) -> tuple[str, ...] | None:
    root = installed_root()
    return None if root is None else tuple(problems(root, op))


def check_installed(op: str, root: Path | None = None) -> None:
    """Refuse, with one line, to build ``op``'s case where the tensorrt_llm at ``root`` (default: the installed one,
    read once per process) breaks an assumption of its runner."""
    found = problems(root, op) if root is not None else _installed_problems(op)
    if found is None:
        raise KernelLimit(f"TensorRT-LLM's {op} runner: tensorrt_llm is not installed")
    if found:
        extra = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise KernelLimit(f"TensorRT-LLM's {op} runner no longer times what serving runs: {found[0]}{extra}")


@dataclass(frozen=True)
class Fp8BmmWrapper:
    """What the installed fp8_block_scaling_bmm_out does besides its kernels: the file it is in, and whether its
    SM89/90 branch writes the BMM into a fresh buffer and copies that into the output."""

    path: str
    copies_output: bool


def fp8_bmm_wrapper(root: Path) -> Fp8BmmWrapper:
    found = _source(root, MLA_FILES, "fp8_block_scaling_bmm_out")
    if isinstance(found, str):
        raise KernelLimit(f"TensorRT-LLM's fp8 MLA BMM wrapper: {found}")
    rel, body = found
    # the copies read: `output = out.new_empty(...)`, the BMM into it, then `out.copy_(output)` (mla.py @06d27b41);
    # an older one (attention.py @c6d3bb2a) wrote the BMM into `out` itself
    return Fp8BmmWrapper(f"tensorrt_llm/{rel}", "out.copy_(" in body)


@lru_cache(maxsize=None)
def installed_fp8_bmm_wrapper() -> Fp8BmmWrapper:
    root = installed_root()
    if root is None:
        raise KernelLimit("TensorRT-LLM's fp8 MLA BMM wrapper: tensorrt_llm is not installed")
    return fp8_bmm_wrapper(root)


def torch_op(namespace: str, name: str):
    """torch.ops.<namespace>.<name> once TensorRT-LLM has registered its ops; a KernelLimit naming it when the
    installed TensorRT-LLM registers no such op."""
    import tensorrt_llm._torch.custom_ops  # noqa: F401  (registers the Python ops, loads the C++ ones)
    import torch

    try:
        return getattr(getattr(torch.ops, namespace), name)
    except (AttributeError, RuntimeError):
        raise KernelLimit(f"the installed TensorRT-LLM registers no torch.ops.{namespace}.{name}") from None
