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
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Mapping, NamedTuple

from opcollect.names import GPU_SMS

GROUP_KEYS = ("backend", "op", "sm", "dtype", "dispatch")
ATTENTION = ["attention_context", "attention_generation"]
MLA = ["mla_context", "mla_generation"]


@dataclass(frozen=True)
class Skip:
    name: str
    keys: Mapping[str, frozenset]


def skip(name: str, **keys: object) -> Skip:
    return Skip(name, {k: frozenset(v if isinstance(v, (list, tuple, set)) else [v]) for k, v in keys.items()})


SKIPS: list[Skip] = [
    # vLLM, SGLang and TensorRT-LLM run only on NVIDIA GPUs; on the CPU only the torch backend runs.
    skip("frameworks-need-a-gpu", backend=["vllm", "sglang", "trtllm"], sm="cpu"),
    # fp8 tensor-core instructions arrive with Ada (SM89): earlier GPUs and the CPU have no fp8 GEMM,
    # attention or MoE kernel, so every such case would fail as a block.
    skip("fp8-needs-sm89", dtype="fp8", sm=["80", "86", "cpu"]),
    # 128x128 block-scaled fp8 kernels (DeepGEMM, CUTLASS blockwise) need Hopper (SM90) or newer.
    skip("fp8-block-needs-sm90", dtype="fp8_block", sm=["80", "86", "89", "cpu"]),
    # NVFP4 needs the FP4 tensor cores of Blackwell (SM100 and newer).
    skip("nvfp4-needs-sm100", dtype="nvfp4", sm=["80", "86", "89", "90", "cpu"]),
    # No serving framework runs float32 GEMMs, attention or experts on a GPU; float32 is the CPU's
    # native baseline for the torch backend only.
    skip("float32-only-on-cpu", dtype="float32", sm=list(GPU_SMS)),
    # Plain PyTorch has no block-scaled fp8, fp4 or int4 weight-only GEMM: each case would fail.
    skip("torch-no-quantized-gemm", backend="torch", op="gemm", dtype=["fp8_block", "nvfp4", "int4_wo"]),
    # The torch MoE and MLA runners are bf16/fp32 references: quantized experts or latent caches would be
    # timed through dequantize-then-compute, a different kernel from any serving one (mismeasured).
    skip("torch-no-quantized-moe-mla", backend="torch", op=["moe", *MLA], dtype=["fp8", "fp8_block", "nvfp4"]),
    # scaled_dot_product_attention takes no fp8 inputs; converting an fp8 KV cache first would time the
    # conversion too (mismeasured).
    skip("torch-sdpa-no-fp8-kv", backend="torch", op=[*ATTENTION, *MLA], kv_cache_dtype="fp8"),
    # gpt-oss attention has learned sinks on every layer; SDPA has none, so its head shapes timed
    # without them would be mismeasured. Shapes the base grid also has still run.
    skip("torch-sdpa-no-sinks", backend="torch", op=ATTENTION, model="GptOssForCausalLM"),
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
                name = element.args[0].value  # type: ignore[attr-defined]
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

    kept: list[int] = []
    skipped: dict[str, int] = {}
    for i, values in enumerate(group.values):
        for name, tests in active:
            if matches(values, tests):  # an entry without case-level keys matches every case
                skipped[name] = skipped.get(name, 0) + 1
                break
        else:
            kept.append(i)
    return GroupDecision(kept, skipped)
