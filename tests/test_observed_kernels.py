"""Rows that say what ran: after a case's samples the worker names the kernels one more call launched (ATen ops on
the CPU), the records and the tables' .opcollect/ extras keep them, each backend states what its labels mean in
kernel names, and a row whose kernels or label contradict it is counted by the run summary and by check R9."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest
from conftest import TESTS, fake_run, gemm_plan, run_cli

from opcollect.backends import kernels as kt
from opcollect.names import BACKENDS
from opcollect.plans.gemm import GemmCase
from opcollect.project import find_project
from opcollect.runtime.contract import Measured, Prepared, Runner
from opcollect.runtime.harness import Stats, TimingConfig
from opcollect.runtime.observe import MAX_NAME, MAX_NAMES, Observed, bounded
from opcollect.runtime.rundir import read_records
from opcollect.runtime.worker import run_task
from opcollect.tables.merge import merge
from opcollect.tables.observed import KERNELS, kernels_file
from opcollect.tables.rules import check_tables
from opcollect.tables.verify import verify_tables

torch = pytest.importorskip("torch")

from opcollect.runtime import timing  # noqa: E402
from opcollect.runtime.observe import observe  # noqa: E402

SMOKE_OPS = "gemm,attention_context,encoder_attention,mla_bmm"
LIAR = 17  # tests/lying_backend.py: a GEMM case of this k runs torch.bmm and says torch.nn.functional.linear
FLASHMLA = "sm90::flash_fwd_splitkv_mla_kernel"
SDPA_LABELS = {  # the ATen op SDPA dispatched to on the CPU -> the label the torch runner reports
    "aten::_scaled_dot_product_flash_attention_for_cpu": "sdpa.flash_attention",
    "aten::_scaled_dot_product_attention_math": "sdpa.math",
}
FAST = TimingConfig(max_noise=1.0, min_samples=3, max_case_seconds=0.01, warmup_seconds=0.0)


def _env() -> dict:
    return {"PYTHONPATH": str(TESTS) + os.pathsep + os.environ.get("PYTHONPATH", "")}


# ---- the one profiler helper, on the CPU


def test_observe_names_the_top_aten_ops_deduplicated_in_order():
    a, b = torch.rand(4, 8, 8), torch.rand(4, 8, 8)
    calls = []

    def call():
        calls.append(1)
        torch.bmm(a, b)
        torch.bmm(a, b)  # the same op twice is named once
        torch.add(a, b)

    seen = observe(call, "cpu")
    assert calls == [1]  # the call runs exactly once
    assert seen.kernels is not None and seen.why == ""
    assert seen.kernels.index("aten::bmm") < seen.kernels.index("aten::add")
    assert seen.kernels.count("aten::bmm") == 1
    assert seen.record() == {"kernels": list(seen.kernels)}


def test_observe_names_the_implementation_sdpa_dispatched_to():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.rand(1, 2, 16, 32)
    for backend, op in (
        (SDPBackend.FLASH_ATTENTION, "aten::_scaled_dot_product_flash_attention_for_cpu"),
        (SDPBackend.MATH, "aten::_scaled_dot_product_attention_math"),
    ):
        with sdpa_kernel([backend]):
            seen = observe(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q), "cpu")
        assert seen.kernels[:2] == ("aten::scaled_dot_product_attention", op)
        assert not any(n in seen.kernels for n in ("aten::empty", "aten::as_strided"))  # bookkeeping left out


def test_observe_without_a_profiler_runs_the_call_once_and_says_why(monkeypatch):
    import torch.profiler

    def no_profiler(**kwargs):
        raise RuntimeError("profiler busy")

    monkeypatch.setattr(torch.profiler, "profile", no_profiler)
    calls = []
    seen = observe(lambda: calls.append(1), "cpu")
    assert calls == [1]
    assert seen.kernels is None and "did not start" in seen.why and "profiler busy" in seen.why
    assert seen.record() == {"kernels_unread": seen.why}


def test_names_are_bounded():
    names = ["k\nwith a newline"] + [f"kernel_{i}" for i in range(3 * MAX_NAMES)] + ["x" * 5000]
    kept = bounded(names)
    assert len(kept) == MAX_NAMES and kept[0] == "k with a newline"
    assert all(len(n) <= MAX_NAME for n in bounded(["y" * 5000]))


def test_the_profiled_call_comes_after_the_samples():
    """The harness observes one more call after the samples: no timed call runs under the profiler."""
    under_profiler = []

    def prepare(case, dispatch, device, copies):
        x = torch.rand(16, 16)

        def call():
            under_profiler.append(torch.autograd.profiler._is_profiler_enabled)
            torch.mm(x, x)

        return Prepared(call, "torch.nn.functional.linear")

    [measured] = timing.measure_cases(Runner(lambda c: 0, prepare), "d", [GemmCase("float32", 16, 16, 16)], "cpu", FAST)
    assert under_profiler[-1] is True and not any(under_profiler[:-1])
    assert "aten::mm" in measured.observed.kernels
    assert measured.stats.samples >= 3


def test_the_worker_records_kernels_or_why_not():
    stats = Stats(1.0, 0.9, 1.1, 5, 0.02, "cpu", 8, 0.01, 0.0)
    observations = [Observed(("aten::bmm",)), Observed(None, "the profiler did not start: X"), None]
    backend = SimpleNamespace(
        footprint=lambda op, case: 0,
        free_memory=lambda device: 2**40,
        measure=lambda op, dispatch, cases, device, config: [Measured(stats, "b", observed=o) for o in observations],
    )
    cases = [GemmCase("float32", m, 8, 8) for m in (1, 2, 3)]
    task = {"row_id": "r", "op": "gemm", "dispatch": "torch.bmm", "case_ids": ["a", "b", "c"]}
    task["cases"] = [c._asdict() for c in cases]
    results = run_task(backend, task, "cpu", FAST)["results"]
    assert results[0]["kernels"] == ["aten::bmm"] and "kernels_unread" not in results[0]
    assert results[1]["kernels_unread"] == "the profiler did not start: X" and "kernels" not in results[1]
    assert "kernels" not in results[2] and "kernels_unread" not in results[2]  # a row runner that observes nothing


# ---- the label tables


def test_every_label_a_plan_dispatches_on_sm90_has_patterns_or_a_reason(planner):
    missing = []
    for backend in BACKENDS:
        for sm in ("90", "cpu") if backend == "torch" else ("90",):
            for op, selection in planner.plan(backend, sm).ops.items():
                for dispatch in sorted(set(selection.dispatch)):
                    found = kt.meaning(backend, dispatch, op)
                    if found is None:
                        missing.append((backend, sm, op, dispatch))
                    else:
                        assert found.patterns or found.unobservable.strip()
    assert missing == [], f"labels without a meaning in backends/<backend>/kernels.py: {missing}"


@pytest.mark.parametrize(
    ("backend", "label", "op", "ran", "lies"),
    [
        # vLLM: FA3 is not its FA2 fallback, nor FlashMLA
        ("vllm", "vllm_flash_attn_fa3", "attention_context",
         "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::Collective", False),
        ("vllm", "vllm_flash_attn_fa3", "attention_context",
         "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 32, 4, false, false, cutlass::half_t>", True),
        ("vllm", "FLASH_ATTN", "mla_context_module", f"void {FLASHMLA}<Traits<cutlass::bfloat16_t>", True),
        ("vllm", "FLASHMLA", "mla_generation_module", f"void {FLASHMLA}<Traits<cutlass::bfloat16_t>", False),
        # DeepGEMM vs CUTLASS block fp8
        ("vllm", "DeepGemmFp8BlockScaledMMKernel", "gemm", "void deep_gemm::sm90_fp8_gemm_1d2d_impl<0u, 4096u>", False),
        ("vllm", "DeepGemmFp8BlockScaledMMKernel", "gemm",
         "void cutlass::device_kernel<vllm::cutlass_3x_gemm_fp8_blockwise<cutlass::bfloat16_t, 1, 128, 128>", True),
        ("vllm", "CutlassFP8ScaledMMLinearKernel", "gemm",
         "void cutlass::device_kernel<vllm::cutlass_3x_gemm_fp8_blockwise<cutlass::bfloat16_t, 1, 128, 128>", True),
        ("vllm", "CutlassFP8ScaledMMLinearKernel", "gemm",
         "void cutlass::device_kernel<vllm::cutlass_3x_gemm_sm90_fp8<cutlass::float_e4m3_t, cutlass::half_t>", False),
        # Marlin vs fused MoE
        ("vllm", "vllm_unquantizedfusedmoe_triton_tritonexperts", "moe", "fused_moe_kernel", False),
        ("vllm", "vllm_unquantizedfusedmoe_triton_tritonexperts", "moe", "void marlin_moe_wna16::Marlin<256, 1>", True),
        ("vllm", "vllm_compressedtensorswna16marlinmoe_marlin_marlinexperts", "moe", "fused_moe_kernel", True),
        # SGLang: FA3 vs its Triton attention
        ("sglang", "fa3", "attention_generation", "_fwd_grouped_kernel_stage1", True),
        ("sglang", "triton", "attention_generation", "_fwd_grouped_kernel_stage1", False),
        ("sglang", "triton", "attention_context",
         "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<..>>>", True),
        # TensorRT-LLM: one label, a meaning per op
        ("trtllm", "torch_flow", "gemm", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", False),
        ("trtllm", "torch_flow", "attention_generation", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", True),
        ("trtllm", "torch_flow", "attention_context",
         "fmha_v2_flash_attention_bf16_64_128_S_q_paged_kv_128_tma_ws_sm90_kernel", False),
        # torch on the CPU
        ("torch", "torch.nn.functional.linear", "gemm", "aten::bmm", True),
        ("torch", "sdpa.flash_attention", "attention_context", "aten::_scaled_dot_product_attention_math", True),
        ("torch", "sdpa.math", "attention_context", "aten::_scaled_dot_product_attention_math", False),
    ],
)  # fmt: skip
def test_patterns_tell_the_kernels_apart(backend, label, op, ran, lies):
    assert kt.contradicts_label(backend, label, [ran], op) is lies


def test_a_finer_label_serves_the_plans_dispatch_and_an_unknown_label_is_no_contradiction():
    sdpa = "torch.nn.functional.scaled_dot_product_attention"
    assert not kt.contradicts_dispatch("torch", sdpa, "sdpa.flash_attention")
    assert kt.contradicts_dispatch("torch", sdpa, "torch.bmm")
    assert kt.contradicts_dispatch("vllm", "DeepGemmFp8BlockScaledMMKernel", "CutlassFp8BlockScaledMMKernel")
    assert not kt.contradicts_label("vllm", "vllm_flashinfer_somethingnew", ["anything"], "attention_context")
    assert not kt.contradicts_label("vllm", "NCCL", ["ncclDevKernel_AllReduce"], "comm")  # unobservable
    assert not kt.contradicts_label("torch", "torch.bmm", [], "mla_bmm")  # nothing observed: nothing to hold


# ---- end to end on the CPU


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """`collect torch --local --device cpu --smoke --ops SMOKE_OPS`: (run directory, TABLES, the process)."""
    tmp = tmp_path_factory.mktemp("observed")
    run_dir, tables = tmp / "run", tmp / "tables"
    done = run_cli(
        "collect", "torch", "--local", "--device", "cpu", "--smoke", "--ops", SMOKE_OPS,
        "--out", str(run_dir), "--tables", str(tables), timeout=600,
    )  # fmt: skip
    return run_dir, tables, done


def test_a_cpu_smoke_collection_records_the_aten_ops_of_every_row(smoke):
    run_dir, tables, done = smoke
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_records(run_dir)
    assert {r["op"] for r in records} == set(SMOKE_OPS.split(","))
    for r in records:
        assert r["status"] == "ok" and r["kernels"] and all(n.startswith("aten::") for n in r["kernels"]), r
        assert not kt.contradicts_label("torch", r["kernel_source"], r["kernels"], r["op"]), r
    attention = [r for r in records if r["op"] in ("attention_context", "encoder_attention")]
    for r in attention:  # the plan names the SDPA API; the row names the ATen op SDPA ran, and says so
        assert r["dispatch"] == "torch.nn.functional.scaled_dot_product_attention"
        implementation = r["kernels"][r["kernels"].index("aten::scaled_dot_product_attention") + 1]
        assert r["kernel_source"] == SDPA_LABELS[implementation]
    summary = f"kernels observed on {len(records)} of {len(records)} rows, each matching its label"
    assert summary in done.stdout and "every row ran the kernel its plan named" in done.stdout
    # the merged tables keep them per case in .opcollect/, never in the consumer's columns
    by_case = {r["case_id"]: r["kernels"] for r in records}
    files = sorted(tables.rglob("*_kernels.parquet"))
    assert len(files) == len(SMOKE_OPS.split(","))
    for path in files:
        assert path.parent.name == ".opcollect"
        kept = pq.read_table(path)
        assert kept.schema == KERNELS
        perf = pq.read_table(next(path.parent.parent.glob("*_perf.parquet")))
        assert "kernels" not in perf.column_names
        assert sorted(kept["case_id"].to_pylist()) == sorted(perf["case_id"].to_pylist())
        assert all(row["kernels"] == by_case[row["case_id"]] for row in kept.to_pylist())
    assert not [f for f in check_tables(tables, strict=True) if f.rule == "R9"]
    assert verify_tables(tables).clean


def test_a_row_whose_label_lies_fails_check_strict_naming_it(tmp_path):
    honest, liar = (4, 8, 16), (4, 8, LIAR)
    plan = gemm_plan(tmp_path / "plan.json", [honest, liar])
    run_dir, tables = tmp_path / "run", tmp_path / "tables"
    done = run_cli(
        "run", "--plan", str(plan), "--out", str(run_dir), "--device", "cpu", "--test-backend", "lying_backend",
        "--max-case-seconds", "0.05", env=_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lying_id = f"gemm:float32:m={liar[0]},n={liar[1]},k={liar[2]}"
    records = {r["case_id"]: r for r in read_records(run_dir)}
    assert "aten::bmm" in records[lying_id]["kernels"]
    assert "1 rows ran kernels their label does not name: torch.nn.functional.linear ran aten::bmm (1)" in done.stdout
    assert run_cli("merge", str(run_dir), "--into", str(tables)).returncode == 0
    plain = run_cli("check", str(tables))
    assert plain.returncode == 0 and "R9 warning" in plain.stdout and lying_id in plain.stdout
    strict = run_cli("check", str(tables), "--strict")
    assert strict.returncode == 1
    [line] = [x for x in strict.stdout.splitlines() if x.startswith("R9 violation")]
    assert "1 rows ran kernels their kernel_source does not name" in line
    assert f"{lying_id} (torch.nn.functional.linear ran " in line and "aten::bmm" in line
    assert "k=16" not in line  # the honest row is not named


# ---- runs and tables from before the field


def _add_kernels(run_dir: Path, names: list[str]) -> None:
    """Give every measured record of a fake run the kernels it observed, as the worker writes them."""
    for shard in (run_dir / "shards").glob("*.jsonl"):
        lines = [json.loads(x) for x in shard.read_text().splitlines()]
        for line in lines:
            if line.get("status") == "ok":
                line["kernels"] = names
        shard.write_text("".join(json.dumps(x) + "\n" for x in lines))


def _kept(tables: Path, written) -> list[dict]:
    return pq.read_table(tables / Path(written.path).parent / kernels_file("gemm_perf")).to_pylist()


def _forget_kernels_files(tables: Path) -> None:
    """Make TABLES look merged before kernels were kept: no kernels file, none in the manifest."""
    manifest = json.loads((tables / "manifest.json").read_text())
    for rel in [r for r in manifest["files"] if r.endswith("_kernels.parquet")]:
        (tables / rel).unlink()
        del manifest["files"][rel]
    (tables / "manifest.json").write_text(json.dumps(manifest))


def test_old_runs_and_old_tables_merge_and_check(tmp_path):
    label = "DeepGemmFp8BlockScaledMMKernel"
    old_cases = [GemmCase("fp8_block", m, 4096, 7168) for m in (1, 64)]
    old = fake_run(tmp_path / "old", old_cases, kernel_source=label)  # no kernels field: an older run
    tables = tmp_path / "tables"
    [written] = merge([old], tables, find_project())
    kept = _kept(tables, written)
    assert len(kept) == 2 and all(r["kernels"] is None for r in kept)
    _forget_kernels_files(tables)
    assert verify_tables(tables).clean and not [f for f in check_tables(tables) if f.rule == "R9"]
    # a new run merged over the older tree: its rows carry kernels, the stored rows none; check holds the new ones
    new = fake_run(tmp_path / "new", [GemmCase("fp8_block", 128, 4096, 7168)], kernel_source=label, run_id="r2")
    _add_kernels(new, ["void cutlass::device_kernel<vllm::cutlass_3x_gemm_fp8_blockwise<cutlass::bfloat16_t>"])
    merge([old, new], tables, find_project())
    kept = {r["case_id"]: r for r in _kept(tables, written)}
    assert len(kept) == 3 and sum(r["kernels"] is not None for r in kept.values()) == 1
    [finding] = [f for f in check_tables(tables, strict=True) if f.rule == "R9"]
    assert not finding.warning and "gemm:fp8_block:m=128,n=4096,k=7168" in finding.keys[0]
    # merged again, the stored observation stays with its row
    merge([old], tables, find_project())
    again = _kept(tables, written)
    assert sum(r["kernels"] is not None for r in again) == 1 and verify_tables(tables).clean
