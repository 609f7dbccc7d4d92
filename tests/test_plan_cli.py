"""The plan front door, run as users run it: real subprocesses, nox included."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, run_cli

BLOCKER = """
import importlib.abc, sys
BLOCKED = {"torch", "vllm", "sglang", "tensorrt_llm", "triton"}
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"blocked for this test: {name}")
        return None
sys.meta_path.insert(0, _Block())
"""


def test_nox_plans_every_backend_and_sm_with_frameworks_unimportable(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    probe = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True)
    assert probe.returncode != 0 and "blocked for this test" in probe.stderr
    nox = Path(sys.executable).with_name("nox")
    done = subprocess.run(
        [str(nox), "-s", "plan", "--", "--backend", "all", "--sm", "all", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summaries = json.loads(done.stdout)
    pairs = {(s["backend"], s["sm"]) for s in summaries}
    assert pairs == {
        (b, s)
        for b in ("torch", "vllm", "sglang", "trtllm")
        for s in ("80", "86", "89", "90", "100", "103", "120", "cpu")
    }
    by_pair = {(s["backend"], s["sm"]): s for s in summaries}
    # the frameworks plan real work on GPUs and nothing on the CPU, each case left out with its reason
    assert by_pair[("vllm", "90")]["ops"]["gemm"]["cases"] > 100_000
    cpu = by_pair[("vllm", "cpu")]
    assert cpu["cases"] == 0
    assert cpu["ops"]["gemm"]["skipped"]["frameworks-need-a-gpu"]["reason"].startswith("vLLM, SGLang")
    assert by_pair[("torch", "cpu")]["cases"] > 0
    for s in summaries:
        assert len(s["plan_hash"]) == 64 and len(s["collector_hash"]) == 64


def test_plan_json_summary_fields():
    done = run_cli("plan", "--backend", "sglang", "--sm", "100", "--json", "--ops", "gemm,moe")
    assert done.returncode == 0, done.stderr
    s = json.loads(done.stdout)
    assert set(s) >= {"backend", "sm", "collector_hash", "plan_hash", "ops"}
    assert list(s["ops"]) == ["gemm", "moe"]
    gemm = s["ops"]["gemm"]
    assert gemm["cases"] == sum(gemm["by_dtype"].values()) == sum(gemm["by_dispatch"].values())
    assert "nvfp4" in gemm["by_dtype"]  # SM100 has FP4 tensor cores
    assert gemm["skipped"]["float32-only-on-cpu"]["count"] > 0
    assert "float32" in gemm["skipped"]["float32-only-on-cpu"]["reason"]


def test_table_writes_one_csv_per_op_with_key_columns(tmp_path):
    done = run_cli("plan", "--backend", "torch", "--sm", "cpu", "--table", str(tmp_path))
    assert done.returncode == 0, done.stderr
    with open(tmp_path / "gemm.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["case_id", "dispatch", "gemm_dtype", "m", "n", "k"]
    first = rows[0]
    assert first["case_id"] == f"gemm:{first['gemm_dtype']}:m={first['m']},n={first['n']},k={first['k']}"
    with open(tmp_path / "attention_context.csv") as handle:
        header = next(csv.reader(handle))
    assert header[2:] == [
        "batch_size",
        "isl",
        "num_heads",
        "num_key_value_heads",
        "head_dim",
        "beam_width",
        "attn_dtype",
        "kv_cache_dtype",
        "step",
        "window_size",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"{op}.csv"
        for op in (
            "gemm",
            "compute_scale",
            "scale_matrix",
            "attention_context",
            "attention_generation",
            "moe",
            "mla_context",
            "mla_generation",
            "mla_context_module",  # no case for torch: a header only
            "mla_generation_module",
            "mla_bmm",
            "encoder_attention",
            "comm",
            "custom_allreduce",
            *("dsa_context_module", "dsa_generation_module", "msa_context_module", "msa_generation_module"),
            *("glm5_mqa_logits_module", "glm5_topk_module", "glm5_dsa_attn_module"),
            *("dsv4_csa_context_module", "dsv4_csa_generation_module", "dsv4_hca_context_module"),
            *("dsv4_hca_generation_module", "dsv4_paged_mqa_logits_module", "dsv4_hca_attn_module"),
            *("dsv4_csa_topk_calib", "mhc"),
            *("gdn", "mamba2"),
        )
    )


def test_piped_output_is_plain_text():
    done = run_cli("plan", "--backend", "torch", "--sm", "cpu", "--ops", "gemm")
    assert done.returncode == 0
    assert "\x1b[" not in done.stdout and "gemm" in done.stdout and "plan_hash" in done.stdout


def test_bad_flags_exit_2_with_one_line():
    for args, needle in [
        (("--sm", "75"), "--sm: unknown SM '75'"),
        (("--backend", "onnx"), "--backend: unknown backend 'onnx'"),
        (("--ops", "gemm,conv"), "--ops: unknown op 'conv'"),
        (("--shard", "3/3"), "need 0 <= i < N"),
        (("--backend", "all", "-o", "x.json"), "-o writes one plan"),
        (("--model-config", "/nonexistent/config.json"), "/nonexistent/config.json: cannot read"),
    ]:
        done = run_cli("plan", *args)
        assert done.returncode == 2, (args, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], (args, done.stderr)


def test_planning_imports_no_framework():
    code = (
        "import sys; from opcollect.cli import main;"
        "main(['plan','--backend','all','--sm','90','--json','--ops','gemm,comm']);"
        "bad=[m for m in ('torch','vllm','sglang','tensorrt_llm') if m in sys.modules]; sys.exit(3 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr


def test_ops_with_a_trailing_comma_plans_that_op():
    done = run_cli("plan", "--ops", "gemm,", "--smoke", "--json")
    assert done.returncode == 0, done.stderr
    assert list(json.loads(done.stdout)["ops"]) == ["gemm"]


def test_plot_to_an_upper_case_png_name_is_written(tmp_path):
    from conftest import REFERENCE

    out = tmp_path / "OUT.PNG"
    done = run_cli("compare", str(REFERENCE / "gemm"), str(REFERENCE / "gemm"), "--plot", str(out))
    assert done.returncode == 0, done.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_against_with_several_sms_is_refused(tmp_path):
    done = run_cli("plan", "--backend", "vllm", "--sm", "all", "--ops", "gemm", "--against", str(tmp_path))
    assert done.returncode == 2
    assert "--against compares one plan: give one --backend and one --sm" in done.stderr
    assert "Traceback" not in done.stderr


def test_smoke_keeps_the_one_case_an_op_has(planner):
    from opcollect.plans.planner import PlanOptions

    full = planner.plan("torch", "cpu", PlanOptions(ops=("gemm",)))
    ids = full.ops["gemm"].ids
    one = planner.plan("torch", "cpu", PlanOptions(ops=("gemm",), smoke=True, case_filter=ids[0]))
    assert one.ops["gemm"].ids == [ids[0]]  # the cheaper half of one case is that case


def test_smoke_picks_from_the_cheaper_half(planner):
    from opcollect.plans.ops import OPS
    from opcollect.plans.planner import PlanOptions

    full = planner.plan("torch", "cpu", PlanOptions(ops=("gemm",)))
    op = OPS["gemm"]
    costs = sorted(op.cost(op.case_type._make(v)) for v in full.ops["gemm"].values)
    median = costs[(len(costs) + 1) // 2 - 1]
    smoke = planner.plan("torch", "cpu", PlanOptions(ops=("gemm",), smoke=True))
    picked = [op.cost(op.case_type._make(v)) for v in smoke.ops["gemm"].values]
    assert len(picked) == 4 and max(picked) <= median and min(picked) == costs[0]


def test_the_plan_table_counts_the_cases_its_skips_left_out():
    from opcollect.plans.report import render

    done = run_cli("plan", "--backend", "sglang", "--sm", "100", "--json", "--ops", "gemm")
    summary = json.loads(done.stdout)
    text = render([summary], terminal=False)
    info = summary["ops"]["gemm"]
    left_out = sum(entry["count"] for entry in info["skipped"].values())
    assert left_out > len(info["skipped"])  # a skip entry leaves out more than one case
    [row] = [line.split() for line in text.splitlines() if line.split()[:3] == ["sglang", "100", "gemm"]]
    assert row[3:5] == [str(info["cases"]), str(left_out)], row


def test_a_terminal_gets_a_rich_table_and_an_uncosted_plan_says_so(planner):
    """On a terminal the same cells as the piped text, in a table titled 'opcollect plan', the footer below it;
    a summary without a cost (an SM no systems/*.yaml has) says so instead of a prediction."""
    from opcollect.plans.planner import PlanOptions
    from opcollect.plans.report import render, summary

    plan = planner.plan("torch", "cpu", PlanOptions(ops=("gemm",)))
    found = summary(plan)
    info = found["ops"]["gemm"]
    dtypes = ", ".join(f"{k}:{v}" for k, v in info["by_dtype"].items())
    cells = ["torch", "cpu", "gemm", str(plan.total_cases), "0", "-", dtypes, ", ".join(info["by_dispatch"])]
    footer = (
        f"torch cpu: {plan.total_cases} cases, plan_hash {plan.plan_hash[:16]}; "
        "no cost predicted (no systems/*.yaml has this SM)"
    )
    plain = render([found], terminal=False).splitlines()
    assert plain[1].split(None, 6)[:6] == cells[:6] and plain[2:] == [footer]
    lines = render([found], terminal=True).splitlines()
    assert lines[0].strip() == "opcollect plan"
    [header] = [line.strip("┃").split("┃") for line in lines if line.startswith("┃")]
    assert [c.strip() for c in header] == [
        "backend",
        "sm",
        "op",
        "cases",
        "skipped",
        "predicted",
        "by dtype",
        "dispatch",
    ]
    [row] = [line.strip("│").split("│") for line in lines if line.startswith("│")]
    assert [c.strip() for c in row] == cells
    assert lines[-1] == footer


def test_table_of_several_pairs_writes_each_pair_into_its_own_directory(tmp_path):
    """With more than one backend/SM pair, --table DIR holds DIR/<backend>-sm<sm>/, each the pair's own tables."""
    from opcollect.names import SMS

    every = tmp_path / "every"
    done = run_cli("plan", "--backend", "torch", "--sm", "all", "--ops", "gemm", "--table", str(every))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in every.iterdir()) == sorted(f"torch-sm{sm}" for sm in SMS)
    for sm in ("cpu", "90"):
        alone = tmp_path / sm
        assert run_cli("plan", "--backend", "torch", "--sm", sm, "--ops", "gemm", "--table", str(alone)).returncode == 0
        assert [p.name for p in (every / f"torch-sm{sm}").iterdir()] == ["gemm.csv"]
        assert (every / f"torch-sm{sm}" / "gemm.csv").read_text() == (alone / "gemm.csv").read_text()
    assert (every / "torch-smcpu" / "gemm.csv").read_text() != (every / "torch-sm90" / "gemm.csv").read_text()
