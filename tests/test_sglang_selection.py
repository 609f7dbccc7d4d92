"""SGLang's MoE runner choice comes from its own ServerArgs (cases/selection/sglang-0.5.14.yaml), per SM and model.

The tests marked needs_wheel run the pinned wheel's selection code (scripts/selection_tables_sglang.py) in a
subprocess and are skipped where the wheel is not downloaded (`nox -s contract-sglang` fetches it; CI runs that
first). The others hold the planner to the committed file without importing SGLang.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from opcollect.plans import moe
from opcollect.plans.moe import MoeCase

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "selection_tables_sglang.py"
WHEELS = sorted((ROOT / ".cache" / "wheels").glob("sglang-0.5.14-*.whl"))
needs_wheel = pytest.mark.skipif(
    not WHEELS, reason="no sglang 0.5.14 wheel in .cache/wheels (run `nox -s contract-sglang` to download it)"
)


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


@needs_wheel
def test_committed_file_is_what_the_pinned_wheel_selects():
    done = _run(str(SCRIPT), "--check")
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert "matches sglang 0.5.14's selection code" in done.stdout


@needs_wheel
def test_triton_kernel_runner_needs_quantization_unset_and_ep_1():
    # server_args.py:3914-3934: gpt-oss takes triton_kernel only with triton_kernels installed, EP 1 and no
    # --quantization; the real ServerArgs decides, on a device reporting SM90
    code = textwrap.dedent(
        """
        import dataclasses, sys
        sys.path.insert(0, "scripts")
        import selection_tables_sglang as g
        sa = g.load_server_args(g.default_source())
        m = g.ModelClass("gpt-oss", "GptOssForCausalLM", g.MXFP4, attention_sinks=True)
        env = {"triton_kernels": True}
        for model, environment in [(m, env), (dataclasses.replace(m, quantization="mxfp4"), env),
                                   (dataclasses.replace(m, ep_size=8), env), (m, None)]:
            print(g.evaluate(sa, model, "90", environment)["moe_runner_backend"])
        """
    )
    done = _run("-c", code)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["triton_kernel", "auto", "auto", "auto"]


@needs_wheel
def test_fp8_linear_selection_runs_sglang_own_dispatch_per_sm_and_environment():
    # fp8_utils.py:489-507 auto order: DeepGEMM when JIT DeepGEMM is on (configurer.py:17-35: SM90+ but not SM120,
    # deep_gemm importable), else FlashInfer on Blackwell, else CUTLASS from Hopper; SM120 is set to triton
    # (:510-519); fp8 Marlin below SM89 (:1731-1737); the real functions decide, on a device reporting the SM
    code = textwrap.dedent(
        """
        import sys
        sys.path.insert(0, "scripts")
        import selection_tables_sglang as g
        sa = g.load_server_args(g.default_source())
        g.SMS.update({"120": (12, 0), "80": (8, 0)}); g.DEVICE_MIB.update({"120": 97887, "80": 81920})
        m = g.ModelClass("gemm/LlamaForCausalLM/fp8_block", "LlamaForCausalLM", g.FP8_BLOCK)
        for sm, env in [("90", None), ("100", None), ("90", {"deep_gemm": False}), ("100", {"deep_gemm": False}),
                        ("120", None), ("80", None)]:
            row = g.evaluate(sa, m, sm, env)
            print(row["block_fp8_linear"], row["fp8_marlin"])
        """
    )
    done = _run("-c", code)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [
        "deepgemm_w8a8_block_fp8_linear_with_fallback", "False",
        "deepgemm_w8a8_block_fp8_linear_with_fallback", "False",
        "cutlass_w8a8_block_fp8_linear_with_fallback", "False",
        "flashinfer_gemm_w8a8_block_fp8_linear_with_fallback", "False",
        "triton_w8a8_block_fp8_linear", "False",
        "triton_w8a8_block_fp8_linear", "True",
    ]  # fmt: skip


def test_mla_rows_cover_both_table_models_and_agree():
    """The MLA tables' heads are DeepSeek-V3's and Kimi-K2.5's: both take ServerArgs' DeepSeek branch, so the one
    backend the plan asks for (selection_sglang.MLA_ARCHITECTURE) is theirs alike."""
    from opcollect.plans import selection_sglang

    for sm in ("90", "100"):
        for kv in ("bfloat16", "fp8"):
            for phase in ("prefill", "decode"):
                deepseek = selection_sglang.mla_backend(sm, kv, phase)
                assert deepseek is not None
                assert selection_sglang.mla_backend(sm, kv, phase, "KimiK25ForConditionalGeneration") == deepseek


def _dispatch(sm: str, case: MoeCase) -> str:
    group = moe._sglang(sm, SimpleNamespace(dtype=case.moe_dtype))
    return (
        moe._sglang_case(sm, group, case)
        if moe._sglang_case.dispatches is None or group in (moe._sglang_case.dispatches)
        else group
    )


def _case(dtype: str, hidden: int, inter: int, topk: int, experts: int, ep: int = 1) -> MoeCase:
    return MoeCase(dtype, 64, hidden, inter, topk, experts, 1, ep, "balanced")


def test_sm100_moe_runner_follows_server_args_per_model():
    # Qwen3 MoE on SM100: flashinfer_trtllm for bf16 and fp8 (server_args.py:4152-4177)
    assert _dispatch("100", _case("bfloat16", 6144, 2560, 8, 160)) == "sglang_flashinfer_trtllm_moe"
    # GLM-5 takes the DeepSeek branch (server_args.py:3519-3527, 3683-3737) though its hidden size is 6144
    assert _dispatch("100", _case("fp8_block", 6144, 2048, 8, 256)) == "sglang_flashinfer_trtllm_moe"
    # DeepSeek-V4 has its own hook (arg_groups/deepseek_v4_hook.py): block fp8 stays auto, so Triton
    assert _dispatch("100", _case("fp8_block", 7168, 3072, 6, 384)) == "sglang_fused_moe_triton"
    # ... and its hybrid NVFP4 checkpoint runs flashinfer_trtllm_routed
    assert _dispatch("100", _case("nvfp4", 4096, 2048, 6, 256)) == "sglang_flashinfer_trtllm_routed_moe"
    # a model without a branch (MiniMax-M2.5) keeps auto: Triton for block fp8
    assert _dispatch("100", _case("fp8_block", 3072, 1536, 8, 256)) == "sglang_fused_moe_triton"
    assert _dispatch("103", _case("bfloat16", 6144, 2560, 8, 160)) == "sglang_flashinfer_trtllm_moe"


def test_sm90_moe_runner_is_unchanged():
    assert _dispatch("90", _case("bfloat16", 2688, 1856, 6, 128)) == "sglang_flashinfer_cutlass_moe"  # NemotronH
    assert _dispatch("90", _case("bfloat16", 6144, 2560, 8, 160)) == "sglang_fused_moe_triton"
    # gpt-oss: the image has no triton_kernels, so auto (the file's environment), Triton
    assert _dispatch("90", _case("w4a16_mxfp4", 2880, 2880, 4, 128)) == "sglang_fused_moe_triton"
    assert _dispatch("90", _case("int4_wo", 7168, 2048, 8, 384)) == "sglang_marlin_moe"
    # Kimi-K3 is no architecture of 0.5.14: its hand rule stays
    assert _dispatch("90", _case("w4a16_mxfp4", 3584, 3072, 16, 896)) == "sglang_marlin_moe_situ_as_silu"


def test_every_expert_parallel_size_above_one_reads_the_files_ep8_answer():
    """The file asks ServerArgs at EP 1 and EP 8: its MoE branches test ep_size == 1 against more than one
    (server_args.py:3914-3934), so EP 2, 4, 16 or 64 takes EP 8's answer, not the hand rules' fallback."""
    from opcollect.plans import selection_sglang as sel

    file = sel.table(sel.FILE)
    asked = 0
    for sm, entries in file.items():
        for shape, arch in sel.MOE_ARCHITECTURE.items():
            for key in entries:
                prefix = f"moe/{arch}/"
                if not (key.startswith(prefix) and key.endswith("/ep8")):
                    continue
                dtype = key.removeprefix(prefix).removesuffix("/ep8")
                want = sel.moe_runner_backend(sm, shape, dtype, 8)
                assert [sel.moe_runner_backend(sm, shape, dtype, ep) for ep in (2, 4, 16, 64)] == [want] * 4
                asked += want is not None
    assert asked > 20


def test_sm_outside_the_file_keeps_the_hand_rules():
    assert _dispatch("120", _case("w4a16_mxfp4", 2880, 2880, 4, 128)) == "sglang_marlin_moe"
    assert _dispatch("120", _case("bfloat16", 6144, 2560, 8, 160)) == "sglang_fused_moe_triton"


def test_planning_reads_the_file_without_importing_sglang():
    code = textwrap.dedent(
        """
        import sys
        from types import SimpleNamespace
        from opcollect.plans import moe
        case = moe.MoeCase("bfloat16", 8, 6144, 2560, 8, 160, 1, 1, "balanced")
        print(moe._sglang_case("100", moe._sglang("100", SimpleNamespace(dtype="bfloat16")), case))
        print("sglang" in sys.modules)
        """
    )
    done = _run("-c", code)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["sglang_flashinfer_trtllm_moe", "False"]
