"""SGLang's fp8 linear-kernel selection on a device of some SM: what Fp8LinearMethod.__init__ decides
(layers/quantization/fp8.py:341-362) with its helpers from the pinned wheel's own source.

fp8_utils.py and deep_gemm_wrapper/configurer.py import kernels at module level (sgl_kernel, flashinfer, triton,
deep_gemm), which a CPU venv lacks, so the selection functions are taken from their source text (ast) and run
against the real sglang.srt.utils helpers under selection_tables_sglang.device(): the same code, without the
kernel imports. The kernels themselves become named placeholders: a selection returns one by name.
Used by scripts/selection_tables_sglang.py (the "gemm/fp8" rows of cases/selection/sglang-<version>.yaml).
"""

from __future__ import annotations
import __future__

import ast
import builtins
import enum
import functools
import sys
import types
from pathlib import Path
from typing import Callable

# fp8_utils.py: the backend enum, the block-fp8 dispatch chain and the per-tensor predicates Fp8LinearMethod reads
FP8_UTILS = (
    "Fp8GemmRunnerBackend", "FP8_GEMM_RUNNER_BACKEND", "_check_cutlass_block_fp8_hardware_support",
    "dispatch_w8a8_block_fp8_linear", "_dispatch_explicit_backend", "_dispatch_auto_backend",
    "initialize_fp8_gemm_config", "get_fp8_gemm_runner_backend", "cutlass_fp8_supported",
    "can_auto_enable_marlin_fp8", "use_triton_w8a8_fp8_kernel", "_is_hip", "_is_cuda", "_is_musa", "_use_aiter",
)  # fmt: skip
CONFIGURER = ("_is_cuda", "_is_musa", "_compute_enable_deep_gemm")
UTILS = (
    "get_bool_env_var", "get_cuda_version", "get_device_capability", "get_device_sm", "is_blackwell_supported",
    "is_cuda", "is_flashinfer_available", "is_hip", "is_musa", "is_sm90_supported", "is_sm100_supported",
    "is_sm120_supported",
)  # fmt: skip


def _top_level(tree: ast.Module, names: tuple[str, ...]) -> list[ast.stmt]:
    """The module's statements that define one of ``names`` (defs, classes, plain and annotated assignments)."""
    picked = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined = {node.name}
        elif isinstance(node, ast.Assign):
            defined = {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined = {node.target.id}
        else:
            continue
        if defined & set(names):
            picked.append(node)
    return picked


def _placeholder(name: str) -> Callable:
    def kernel(*args, **kwargs):
        raise RuntimeError(f"{name} is a placeholder: the kernel is not run here")

    kernel.__name__ = kernel.__qualname__ = name
    return kernel


def _run(path: Path, names: tuple[str, ...], namespace: dict) -> dict:
    """Execute the statements of ``path`` that define ``names`` in ``namespace``; functions the module defines
    but the picked code only names (the kernels) are placeholders."""
    tree = ast.parse(path.read_text(), str(path))
    picked = _top_level(tree, names)
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    used = {n.id for stmt in picked for n in ast.walk(stmt) if isinstance(n, ast.Name)}
    for name in sorted((used & defined) - set(names)):
        namespace.setdefault(name, _placeholder(name))
    # the modules' own `from __future__ import annotations`: annotations stay unevaluated
    flags = __future__.annotations.compiler_flag
    exec(compile(ast.Module(picked, []), str(path), "exec", flags=flags, dont_inherit=True), namespace)
    return namespace


def _base_namespace(name: str) -> dict:
    common = sys.modules["sglang.srt.utils.common"]
    namespace = {"__name__": name, "__builtins__": builtins, "logger": types.SimpleNamespace(
        info=lambda *a, **k: None, warning=lambda *a, **k: None)}  # fmt: skip
    namespace.update({n: getattr(common, n) for n in UTILS})
    namespace.update(Enum=enum.Enum, lru_cache=functools.lru_cache, torch=sys.modules["torch"])
    return namespace


def fp8_choices(srt: Path, args, deep_gemm: bool) -> dict:
    """What SGLang serves fp8 linears with for ``args`` (a ServerArgs after __post_init__) on the device the caller
    set up; ``deep_gemm``: the deep_gemm package imports (sgl-deep-gemm is a dependency of the wheel)."""
    from unittest import mock

    from sglang.srt.environ import envs

    quant = srt / "layers" / "quantization"
    stub = types.ModuleType("deep_gemm") if deep_gemm else None  # None in sys.modules: ImportError
    with mock.patch.dict(sys.modules, {"deep_gemm": stub}):
        configurer = _run(
            srt / "layers" / "deep_gemm_wrapper" / "configurer.py", CONFIGURER, {**_base_namespace("cfg"), "envs": envs}
        )
        jit = configurer["_compute_enable_deep_gemm"]()
    fp8 = _base_namespace("fp8_utils")
    fp8["deep_gemm_wrapper"] = types.SimpleNamespace(ENABLE_JIT_DEEPGEMM=jit)
    fp8 = _run(quant / "fp8_utils.py", FP8_UTILS, fp8)
    fp8["initialize_fp8_gemm_config"](args)  # model_runner.py calls it with the server args before loading
    return {
        "fp8_gemm_runner_backend": args.fp8_gemm_runner_backend,
        "fp8_gemm_backend": fp8["get_fp8_gemm_runner_backend"]().value,
        "deep_gemm_jit": bool(jit),
        "block_fp8_linear": fp8["dispatch_w8a8_block_fp8_linear"]().__name__,
        "cutlass_fp8_supported": bool(fp8["cutlass_fp8_supported"]()),
        "fp8_marlin": bool(fp8["can_auto_enable_marlin_fp8"]()),
        "triton_w8a8_fp8_kernel": bool(fp8["use_triton_w8a8_fp8_kernel"]),
    }
