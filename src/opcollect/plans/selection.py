"""What a framework's own selection code chose per SM, read from cases/selection/<framework>-<version>.yaml.

scripts/selection_tables.py writes the vLLM file by running the pinned wheel's MoE oracles and attention selector
on a CPU with the platform reporting each SM; tests/test_vllm_selection.py regenerates and compares it. The plans'
vLLM dispatch asks here first and keeps its hand-written rule only where the file has no answer (an SM or dtype
it does not cover, or a choice vLLM makes per batch or in compiled code). Pure YAML: no framework import.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import Any

from opcollect.errors import InputError
from opcollect.yamlio import read_yaml

SELECTION = Path(__file__).resolve().parents[3] / "cases" / "selection"
VLLM = "vllm-0.24.0.yaml"


@cache
def table(name: str = VLLM) -> dict[str, Any]:
    """The file's per-SM answers keyed by SM string; empty when the file is absent (an installed wheel)."""
    path = SELECTION / name
    if not os.path.lexists(path):
        return {}
    data = read_yaml(path, "selection table", "restore it from the checkout") or {}
    if not isinstance(data, dict):
        raise InputError(f"{path}: not a selection table (a YAML mapping); restore it from the checkout")
    return {str(sm): answers for sm, answers in (data.get("sm") or {}).items()}


def _answer(value: Any) -> str | None:
    """A label, or None where the selection refused (``unsupported: ...``) or had nothing to say."""
    if not isinstance(value, str) or value.startswith("unsupported"):
        return None
    return value


def vllm_moe(sm: str, dtype: str, expert_parallel: bool | None = None) -> str | None:
    """The experts label vLLM's oracle gives ``dtype`` at ``sm``; with expert_parallel None, the label shared by
    TP and EP splits, or None where they differ."""
    entry = table().get(sm, {}).get("moe", {}).get(dtype)
    if not entry:
        return None
    if expert_parallel is None:
        return _answer(entry.get("tp")) if entry.get("tp") == entry.get("ep") else None
    return _answer(entry.get("ep" if expert_parallel else "tp"))


def vllm_attention(sm: str, kv_cache_dtype: str, head_dim: int) -> str | None:
    """The attention label vLLM's selector gives (FLASHINFER whole: its kernels are picked per batch)."""
    return _answer(table().get(sm, {}).get("attention", {}).get(kv_cache_dtype, {}).get(head_dim))


def vllm_mla(sm: str, kv_cache_dtype: str) -> str | None:
    """The MLA backend vLLM's selector gives DeepSeek's MLA at ``sm`` with this KV-cache dtype."""
    return _answer(table().get(sm, {}).get("mla", {}).get(kv_cache_dtype))
