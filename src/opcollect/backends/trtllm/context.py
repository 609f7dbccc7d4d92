"""What every TensorRT-LLM runner builds the same way: the quantization a case's dtype names, a one-rank
Mapping and the ModelConfig that TensorRT-LLM's PyTorch-flow modules are built from.

The pure tables (QUANT_ALGOS, GROUP_SIZES, KV_CACHE_ALGOS) need no framework: the runners' input builders and
their CPU tests read them. tensorrt_llm is imported only inside the functions, which run on the GPU.
Sources: tensorrt_llm/quantization/mode.py (QuantAlgo), tensorrt_llm/models/modeling_utils.py (QuantConfig),
tensorrt_llm/mapping.py (Mapping), tensorrt_llm/_torch/model_config.py (ModelConfig); commits in
docs/research/trtllm-1.3.0-runners.md.
"""

from __future__ import annotations

import weakref
from typing import Callable

from opcollect.runtime.contract import KernelLimit

# the two pins of pins.yaml this backend's runners are written and checked against; another installed
# version gets no runner (Registry.find) until its re-checks are done
SERVED_VERSIONS = frozenset({"1.3.0rc20", "1.3.0rc23"})

# a case's dtype -> the QuantAlgo member a served checkpoint of that format declares (None: unquantized bf16)
QUANT_ALGOS = {
    "bfloat16": None,
    "fp8": "FP8",
    "fp8_block": "FP8_BLOCK_SCALES",
    "nvfp4": "NVFP4",
    "int4_wo": "W4A16_AWQ",
    "w4a16_mxfp4": "W4A16_MXFP4",
    "w4a8_mxfp4_mxfp8": "W4A8_MXFP4_MXFP8",
}
# QuantConfig.group_size per format: block fp8 scales 128 x 128 blocks, NVFP4 one scale per 16 values,
# AWQ int4 groups of 128 along k, MXFP4 one scale per 32 values
GROUP_SIZES = {"fp8_block": 128, "nvfp4": 16, "int4_wo": 128, "w4a16_mxfp4": 32, "w4a8_mxfp4_mxfp8": 32}
# a case's kv_cache_dtype -> QuantConfig.kv_cache_quant_algo
KV_CACHE_ALGOS = {"bfloat16": None, "fp8": "FP8"}


def quant_algo(dtype: str) -> str | None:
    try:
        return QUANT_ALGOS[dtype]
    except KeyError:
        raise KernelLimit(f"the TensorRT-LLM runners have no quantization for dtype {dtype!r}") from None


def quant_config(dtype: str = "bfloat16", kv_cache_dtype: str = "bfloat16", exclude_modules: tuple[str, ...] = ()):
    """The QuantConfig a served checkpoint of ``dtype`` weights and ``kv_cache_dtype`` cache declares, leaving
    the modules ``exclude_modules`` names (fnmatch patterns) unquantized as that checkpoint does."""
    from tensorrt_llm.models.modeling_utils import QuantAlgo, QuantConfig

    algo = quant_algo(dtype)
    kv = KV_CACHE_ALGOS.get(kv_cache_dtype)
    if kv_cache_dtype not in KV_CACHE_ALGOS:
        raise KernelLimit(f"the TensorRT-LLM runners have no KV cache quantization for {kv_cache_dtype!r}")
    kwargs = {}
    if algo is not None:
        kwargs["quant_algo"] = QuantAlgo[algo]
    if dtype in GROUP_SIZES:
        kwargs["group_size"] = GROUP_SIZES[dtype]
    if kv is not None:
        kwargs["kv_cache_quant_algo"] = QuantAlgo[kv]
    if exclude_modules:
        kwargs["exclude_modules"] = list(exclude_modules)
    return QuantConfig(**kwargs)


def one_rank_mapping():
    """The Mapping of a single GPU: no tensor, pipeline or expert parallelism."""
    from tensorrt_llm.mapping import Mapping

    return Mapping(world_size=1, rank=0, tp_size=1, pp_size=1)


def prepare_metadata(metadata):
    """``metadata.prepare()``, then a device sync, and the metadata. prepare() stages a batch's block offsets in the
    KV cache manager's one pinned host buffer and copies them to the metadata's device table with non_blocking=True
    (resource_manager.py KVCacheManager.copy_batch_block_offsets, index id 3501434665): the next prepare() on the
    same manager (the next input set's) would overwrite that buffer before the copy has run. The sync lets every
    copy land before anything else is staged."""
    import torch

    metadata.prepare()
    torch.cuda.synchronize()
    return metadata


def installed_version() -> str:
    from tensorrt_llm.version import __version__

    return __version__


# releasing what a case allocates outside torch
# A KVCacheManager's pools are released by its shutdown() (resource_manager.py:487-488 impl.release_pools()), not by
# torch's allocator, and Prepared has no release hook. Each case registers its release here: it runs once, when the
# case's call() is garbage collected (the harness drops the Prepared when the case is measured), and at the latest
# when the next case starts preparing (release_pending), so pools never outlive their case.
_pending: list[Callable[[], None]] = []


def hold_until_dropped(owner, release: Callable[[], None]) -> Callable[[], None]:
    """Run ``release`` once: when ``owner`` is collected or at the next release_pending(); returns the once-call."""
    done: list[bool] = []

    def once() -> None:
        if not done:
            done.append(True)
            release()

    _pending.append(once)
    weakref.finalize(owner, once)
    return once


def release_pending() -> int:
    """Release what earlier cases still hold; returns how many releases were pending."""
    count = 0
    while _pending:
        _pending.pop()()
        count += 1
    return count
