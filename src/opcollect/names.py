"""The names the project knows (backends, SMs, frameworks) and the one rule for a name that becomes a path.

Every value read from data (a run's backend, a worker's framework version, a system's name) that
becomes a directory of a TABLES tree or a run passes ``path_name`` first, so crafted data such as
``../../x`` can never write outside the tree it belongs to.
"""

from __future__ import annotations

import re

from opcollect.errors import InputError

BACKENDS = ("torch", "vllm", "sglang", "trtllm")
GPU_SMS = ("80", "86", "89", "90", "100", "103", "120")
SMS = (*GPU_SMS, "cpu")
# the `framework` column of the tables, as the aiconfigurator reference writes it
FRAMEWORK_NAMES = {"torch": "Torch", "vllm": "VLLM", "sglang": "SGLang", "trtllm": "TRTLLM"}
# where one table's reference rows name the framework otherwise: vLLM's own all-reduce says 'vLLM'
_TABLE_FRAMEWORK_NAMES = {("vllm", "custom_allreduce_perf"): "vLLM"}


# SGLang's --moe-runner-backend values as the reference labels their MoE rows (collector/sglang/collect_moe.py:
# 598-604): what the planner predicts and what the SGLang runner reports and installs
SGLANG_MOE_LABELS = {
    "triton": "sglang_fused_moe_triton",
    "triton_kernel": "sglang_triton_kernel_moe",
    "marlin": "sglang_marlin_moe",
    "flashinfer_trtllm": "sglang_flashinfer_trtllm_moe",
    "flashinfer_cutlass": "sglang_flashinfer_cutlass_moe",
    "flashinfer_mxfp4": "sglang_flashinfer_trtllm_moe",
    "deep_gemm": "sglang_deepgemm_moe",
}


def framework_name(backend: str, table: str) -> str:
    """The `framework` column of ``backend``'s rows in ``table``, as the reference writes it."""
    return _TABLE_FRAMEWORK_NAMES.get((backend, table), FRAMEWORK_NAMES.get(backend, backend))


# letters, digits and ._+- with no leading dot: never '..', never a hidden file, never a separator
_PATH_NAME = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9._+-]{0,127}")


def path_name(value: object, what: str) -> str:
    """``value`` when it may name one directory; else InputError naming ``what`` (file and field)."""
    if not isinstance(value, str) or _PATH_NAME.fullmatch(value) is None:
        raise InputError(
            f"{what}: {value!r} cannot name a directory; it must be letters, digits and ._+- "
            "(at most 128, no leading dot, no '/'); fix or re-create that data"
        )
    return value


def sm_label(backend: str, sm: str) -> str:
    """How a (backend, SM) pair reads in messages: 'torch cpu', 'vllm sm90'."""
    return f"{backend} {sm if sm == 'cpu' else 'sm' + sm}"
