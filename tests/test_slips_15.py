"""What the CLI verbs pass on from their flags, the pin bump's checks and report, and the model-config parsing that
no earlier test held: each test here fails with a small plausible bug planted in the function it names."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import ROOT

from opcollect.cli import build_parser
from opcollect.cli import release as cli_release
from opcollect.cli import run as cli_run
from opcollect.cli import tables as cli_tables
from opcollect.errors import InputError
from opcollect.images import bump, bump_report

# ---- cli/run.py ------------------------------------------------------------------------------------------------


def test_run_passes_every_flag_to_its_own_run_option(monkeypatch, tmp_path):
    """cli.run.cmd_run/_run_options: each timing and provenance flag lands in the RunOptions field of its name."""
    import opcollect.runtime.run as runtime_run

    seen = {}
    monkeypatch.setattr(runtime_run, "run_plan", lambda plan, out, options: seen.update(plan=plan, out=out, o=options))
    monkeypatch.setattr(runtime_run, "describe", lambda summary: "ran")
    argv = ["run", "--plan", "p.json", "--out", "r", "--device", "cpu", "--retry-failed"]
    argv += ["--image", "img", "--image-digest", "dig", "--expect-version", "0.24.0", "--test-backend", "mod"]
    argv += ["--case-timeout", "7", "--max-noise", "0.03", "--min-samples", "6", "--max-case-seconds", "0.5"]
    argv += ["--workers", "3"]
    args = build_parser().parse_args(argv)
    assert cli_run.cmd_run(args) == 0
    assert seen["plan"] == Path("p.json") and seen["out"] == Path("r")
    assert seen["o"] == runtime_run.RunOptions(
        device="cpu",
        resume=False,  # --retry-failed alone: its own field, not --resume's
        retry_failed=True,
        case_timeout=7.0,
        max_noise=0.03,
        min_samples=6,
        max_case_seconds=0.5,
        workers=3,
        image="img",
        image_digest="dig",
        expect_version="0.24.0",
        test_backend="mod",
    )
    bare = build_parser().parse_args(["run", "--plan", "p.json", "--out", "r"])
    assert cli_run.cmd_run(bare) == 0 and seen["o"] == runtime_run.RunOptions()  # the defaults are RunOptions'


def _collect(monkeypatch, argv):
    import opcollect.collect as collect
    import opcollect.runtime.run as runtime_run

    seen = {}

    def local(tree, request):
        seen["request"] = request
        return SimpleNamespace(run_dir=Path("ran-here"))

    monkeypatch.setattr(collect, "collect_local", local)
    monkeypatch.setattr(collect, "finish", lambda tree, run_dir, tables: seen.update(finished=(run_dir, tables)) or 0)
    monkeypatch.setattr(runtime_run, "describe", lambda summary: "ran")
    monkeypatch.setattr(cli_run, "check_pins", lambda *a: seen.setdefault("pins", []).append(a))
    code = cli_run.cmd_collect(build_parser().parse_args(argv))
    return code, seen


def test_a_local_collect_passes_each_flag_into_its_request(monkeypatch, tmp_path):
    """cli.run.cmd_collect: backend, SM, device, ops, smoke, filter, configs, version and TABLES reach the request."""
    argv = ["collect", "vllm", "--local", "--sm", "90", "--device", "cpu", "--ops", "gemm, moe", "--smoke"]
    argv += ["--case-filter", "gemm:b", "--model-config", "a.json", "--model-config", "b.json", "--version", "0.24.0"]
    argv += ["--out", str(tmp_path / "run"), "--tables", str(tmp_path / "t"), "--root", str(ROOT), "--workers", "2"]
    code, seen = _collect(monkeypatch, argv)
    request = seen["request"]
    assert code == 0 and request.backend == "vllm" and request.sm == "90" and request.device == "cpu"
    assert request.plan_options.ops == ("gemm", "moe") and request.plan_options.smoke is True
    assert request.plan_options.case_filter == "gemm:b"
    assert request.model_configs == (Path("a.json"), Path("b.json")) and request.version == "0.24.0"
    assert request.run_options.expect_version == "0.24.0" and request.run_options.workers == 2
    assert request.out == tmp_path / "run" and (Path("ran-here"), request.tables) == seen["finished"]
    assert request.tables == tmp_path / "t"
    assert len(seen["pins"]) == 1 and seen["pins"][0][2:] == ("vllm", "0.24.0")  # the version is checked pinned
    code, seen = _collect(monkeypatch, ["collect", "torch", "--local", "--root", str(ROOT)])
    request = seen["request"]
    assert request.tables == ROOT / "tables" and request.version is None and request.run_options.expect_version is None
    assert request.plan_options.smoke is False and request.plan_options.case_filter is None
    assert "pins" not in seen  # a local collect of the current pin reads no pins


def test_a_slurm_collect_passes_each_slurm_flag_and_resume_needs_slurm(monkeypatch, tmp_path):
    """cli.run._collect_slurm: shards, partition, account, time, GPUs, runtime and resume reach the SlurmRequest."""
    import opcollect.cluster.submit as submit

    seen = {}
    monkeypatch.setattr(submit, "collect_on_slurm", lambda tree, request, slurm, tables, tag: seen.update(s=slurm))
    argv = ["collect", "torch", "--slurm", "--shards", "4", "--partition", "gpu", "--account", "perf"]
    argv += ["--time", "4:00:00", "--gpus-per-task", "2", "--container-runtime", "pyxis", "--root", str(ROOT)]
    assert cli_run.cmd_collect(build_parser().parse_args([*argv, "--resume", str(tmp_path)])) == 0
    assert seen["s"] == submit.SlurmRequest(4, "gpu", "perf", "4:00:00", 2, "pyxis", tmp_path)
    with pytest.raises(InputError, match=r"--resume RUN_DIR resubmits a Slurm collection: add --slurm"):
        cli_run.cmd_collect(build_parser().parse_args(["collect", "torch", "--resume", str(tmp_path)]))


# ---- cli/tables.py -----------------------------------------------------------------------------------------------


def test_merge_passes_its_plans_and_waits_unless_told_not_to(monkeypatch, tmp_path, capsys):
    """cli.tables.cmd_merge: --no-wait turns waiting off, each --plan is passed, each written table is printed."""
    import opcollect.tables.merge as merge

    seen = []
    written = [SimpleNamespace(path=Path("a/gemm_perf.parquet"), rows=3, failures=1, status="partial")]
    monkeypatch.setattr(
        merge, "merge", lambda runs, into, tree, wait, plans: seen.append((runs, wait, plans)) or written
    )
    base = ["merge", "r1", "r2", "--into", str(tmp_path), "--root", str(ROOT)]
    assert cli_tables.cmd_merge(build_parser().parse_args(base)) == 0
    assert cli_tables.cmd_merge(build_parser().parse_args([*base, "--no-wait", "--plan", "x", "--plan", "y"])) == 0
    assert seen == [([Path("r1"), Path("r2")], True, ()), ([Path("r1"), Path("r2")], False, (Path("x"), Path("y")))]
    assert f"{tmp_path / 'a/gemm_perf.parquet'}: 3 rows, 1 failures, partial" in capsys.readouterr().out


def test_check_fails_only_on_violations_and_counts_warnings_apart(monkeypatch, tmp_path, capsys):
    """cli.tables.cmd_check: exit 1 only when a finding is no warning; the summary counts each kind."""
    import opcollect.tables.physics as physics
    import opcollect.tables.rules as rules

    findings = []
    monkeypatch.setattr(rules, "check_tables", lambda root, strict, noise_bound: findings)
    findings[:] = [rules.Finding("R7", "x", "noisy", warning=True)]
    assert cli_tables.cmd_check(build_parser().parse_args(["check", str(tmp_path)])) == 0
    assert capsys.readouterr().out.endswith(f"check {tmp_path}: 0 violations, 1 warnings\n")
    findings[:] = [rules.Finding("R1", "x", "bad"), *findings, rules.Finding("R8", "y", "fast", warning=True)]
    assert cli_tables.cmd_check(build_parser().parse_args(["check", str(tmp_path)])) == 1
    assert capsys.readouterr().out.endswith(f"check {tmp_path}: 1 violations, 2 warnings\n")
    seen = {}
    monkeypatch.setattr(
        physics, "against_physics", lambda root, system, strict: seen.update(a=(root, system, strict)) or []
    )
    argv = ["check", "--against-physics", str(tmp_path), "--system", "b200_sxm", "--strict"]
    assert cli_tables.cmd_check(build_parser().parse_args(argv)) == 0
    assert seen["a"] == (tmp_path, "b200_sxm", True)


def test_verify_exits_1_unless_clean_and_compare_takes_its_tolerance(monkeypatch, tmp_path):
    """cli.tables.cmd_verify exit code and thresholds_of: each verdict flag lands in its Thresholds field."""
    import opcollect.tables.verify as verify
    from opcollect.tables.noise import Thresholds

    for clean, code in ((True, 0), (False, 1)):
        report = SimpleNamespace(render=lambda: "", clean=clean)
        monkeypatch.setattr(verify, "verify_tables", lambda root, report=report: report)
        assert cli_tables.cmd_verify(build_parser().parse_args(["verify", str(tmp_path)])) == code
    argv = ["compare", "a", "b", "--min-gap", "0.01", "--noise-ceiling", "0.3", "--min-samples", "4"]
    args = build_parser().parse_args([*argv, "--tolerance", "0.07"])
    assert cli_tables.thresholds_of(args) == Thresholds(min_gap=0.01, max_noise=0.3, min_samples=4, tolerance=0.07)
    assert cli_tables.thresholds_of(build_parser().parse_args(["compare", "a", "b"])) == Thresholds()


# ---- cli/release.py ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "epoch"), [(None, None), ("0", 0), ("1700000000", 1700000000)])
def test_source_date_epoch_is_a_count_of_seconds_when_set(monkeypatch, value, epoch):
    """cli.release._source_date_epoch: unset is None, digits are the epoch (0 too)."""
    if value is None:
        monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    else:
        monkeypatch.setenv("SOURCE_DATE_EPOCH", value)
    assert cli_release._source_date_epoch() == epoch


@pytest.mark.parametrize("value", ["", "-1", "1.5", "17e8", " 1"])
def test_source_date_epoch_refuses_anything_but_digits(monkeypatch, value):
    """cli.release._source_date_epoch: an empty, signed, fractional or spaced value is refused."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", value)
    with pytest.raises(InputError, match="not a count of seconds since 1970"):
        cli_release._source_date_epoch()


# ---- cases/profiles.py -------------------------------------------------------------------------------------------


def _spec(architecture: str = "LlamaForCausalLM", **keys):
    from opcollect.cases.profiles import parse_config

    return parse_config("cfg.json", architecture, "m", {"hidden_size": 1024, "num_attention_heads": 8, **keys})


@pytest.mark.parametrize(
    ("layers", "windows"),
    [(0, (4096,)), (14, (0, 4096)), (28, (0,)), (29, (0,)), (None, (4096,))],
)
def test_qwen2s_max_window_layers_splits_full_from_sliding_layers(layers, windows):
    """profiles._windows: the layers before max_window_layers attend fully, the ones from it on slide."""
    keys = {"max_window_layers": layers} if layers is not None else {}
    spec = _spec("Qwen2ForCausalLM", intermediate_size=2048, sliding_window=4096, use_sliding_window=True,
                 num_hidden_layers=28, **keys)  # fmt: skip
    assert spec.layout.attention.windows == windows
    unused = _spec("Qwen2ForCausalLM", intermediate_size=2048, sliding_window=4096, max_window_layers=0,
                   num_hidden_layers=28)  # fmt: skip
    assert unused.layout.attention.windows == (0,)  # Qwen's sliding_window is off unless use_sliding_window


def test_a_gemma3_pattern_of_one_slides_nowhere_and_gemma2_alternates():
    """profiles._windows: sliding_window_pattern 1 is all full; >1 mixes; Gemma2 alternates without one."""
    assert _spec(intermediate_size=64, sliding_window=512, sliding_window_pattern=1).layout.attention.windows == (0,)
    assert _spec(intermediate_size=64, sliding_window=512, sliding_window_pattern=2).layout.attention.windows == (
        0,
        512,
    )
    assert _spec("Gemma2ForCausalLM", intermediate_size=64).layout.attention.windows == (0, 4096)
    assert _spec("MistralForCausalLM", intermediate_size=64, sliding_window=512).layout.attention.windows == (512,)


def test_shared_experts_one_of_its_own_size_or_n_times_an_experts():
    """profiles._layout: shared_expert_intermediate_size wins; else n_shared_experts experts as one MLP."""
    from opcollect.cases.profiles import Mlp

    moe = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 256}
    both = _spec(**moe, shared_expert_intermediate_size=640, n_shared_experts=2)
    assert both.layout.experts.shared == Mlp(640, "shared_expert_intermediate_size")
    assert _spec(**moe, n_shared_experts=3).layout.experts.shared == Mlp(
        768, "n_shared_experts x moe_intermediate_size"
    )
    assert _spec(**moe, n_shared_experts=0).layout.experts.shared is None
    zero = _spec(**moe, shared_expert_intermediate_size=0, n_shared_experts=1)  # 0 is no shared expert of its own
    assert zero.layout.experts.shared == Mlp(256, "n_shared_experts x moe_intermediate_size")
    assert both.layout.experts.mlp == Mlp(256, "moe_intermediate_size") and both.layout.dense is None
    assert _spec(**{**moe, "num_experts_per_tok": 8}).layout.experts.topk == 8  # every expert per token is allowed
    with pytest.raises(InputError, match="'num_experts_per_tok': 9 is greater than num_experts 8"):
        _spec(**{**moe, "num_experts_per_tok": 9})


@pytest.mark.parametrize(
    ("keys", "dense"),
    [
        ({}, None),
        ({"decoder_sparse_step": 1}, None),
        ({"decoder_sparse_step": 2}, 2048),
        ({"moe_layer_freq": 1}, None),
        ({"moe_layer_freq": 2}, 2048),
        ({"moe_layer_freq": [1, 1, 1]}, None),
        ({"moe_layer_freq": [0, 1, 1]}, 2048),
        ({"first_k_dense_replace": 0}, None),
        ({"first_k_dense_replace": 1}, 2048),
        ({"first_k_dense_replace": 1, "dense_intermediate_size": 3072}, 3072),
        ({"mlp_only_layers": [0]}, 2048),
        ({"mlp_only_layers": []}, None),
    ],
)
def test_a_moe_model_has_a_dense_mlp_only_where_some_layers_are_dense(keys, dense):
    """profiles._layout: which keys make some layers of a MoE model dense, and the dense width they use."""
    spec = _spec(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256, intermediate_size=2048, **keys)
    assert (spec.layout.dense.inter if spec.layout.dense else None) == dense


def test_mla_projection_gemms_with_and_without_a_q_lora_rank():
    """profiles._Collector.mla_gemms: fused q_a/kv_a, q_b, kv_b and o per rank; q and kv_a without q_lora_rank."""
    from opcollect.cases.profiles import GemmShape, derive_shapes

    mla = {"kv_lora_rank": 128, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 48}
    common = {"intermediate_size": 2048, "vocab_size": 1001}
    dense_and_head = {GemmShape(2048, 1024), GemmShape(1024, 1024), GemmShape(501, 1024)}  # lm_head: ceil(1001 / 2)
    lora = derive_shapes(_spec("DeepseekV3ForCausalLM", q_lora_rank=256, **mla, **common), [2])
    # 4 heads a rank: q_b 4 x (32 + 16), kv_b 4 x (32 + 48), o 4 x 48
    want = {GemmShape(400, 1024), GemmShape(192, 256), GemmShape(320, 128), GemmShape(1024, 192)}
    assert lora.gemm == frozenset(want | dense_and_head)
    plain = derive_shapes(_spec("DeepseekV3ForCausalLM", **mla, **common), [2])
    want = {GemmShape(192, 1024), GemmShape(144, 1024), GemmShape(320, 128), GemmShape(1024, 192)}
    assert plain.gemm == frozenset(want | dense_and_head)
    assert {s.num_heads for s in plain.mla} == {8}


def test_an_output_gate_doubles_the_query_part_of_qkv_and_head_dim_defaults_to_hidden_over_heads():
    """profiles._Collector.gqa and _layout: q_proj twice as wide with attn_output_gate; head_dim = hidden / heads."""
    from opcollect.cases.profiles import GemmShape, HeadShape, derive_shapes

    gated = derive_shapes(_spec(num_key_value_heads=2, intermediate_size=64, attn_output_gate=True), [2])
    assert GemmShape((2 * 4 + 2 * 1) * 128, 1024) in gated.gemm and GemmShape(1024, 4 * 128) in gated.gemm
    plain = derive_shapes(_spec(num_key_value_heads=2, intermediate_size=64), [2])
    assert GemmShape((4 + 2) * 128, 1024) in plain.gemm and GemmShape(1280, 1024) not in plain.gemm
    assert plain.attention == frozenset({HeadShape(4, 1, 128, 0)})
    with pytest.raises(InputError, match="missing key 'head_dim'.*hidden_size 1020 is not a multiple of"):
        _spec(hidden_size=1020, intermediate_size=64)


# ---- images/bump.py, images/bump_report.py -----------------------------------------------------------------------


def _pins(tmp_path) -> Path:
    path = tmp_path / "pins.yaml"
    path.write_text((ROOT / "pins.yaml").read_text())
    return path


def test_a_version_is_up_to_64_characters_and_the_backend_one_opcollect_knows():
    """bump.check_names: 64 characters is a version, 65 is not; an unknown backend is refused."""
    bump.check_names(bump.BumpRequest("vllm", "1" + "0" * 63, ""))
    with pytest.raises(InputError, match="not a version"):
        bump.check_names(bump.BumpRequest("vllm", "1" + "0" * 64, ""))
    with pytest.raises(InputError, match="bump 'tgi': not a backend"):
        bump.check_names(bump.BumpRequest("tgi", "1.0", ""))


@pytest.mark.parametrize("ref", ["vllm/vllm-openai", "vllm/vllm-openai:v0.25.0@sha256:" + "a" * 64, "v:1\n"])
def test_resolve_takes_only_repo_and_tag_before_asking_any_registry(monkeypatch, ref):
    """bump.resolve_digest: a reference without a tag, or with a digest already, is refused before the engine."""
    import opcollect.images.engine as engine

    monkeypatch.setattr(engine, "connect", lambda: pytest.fail("reached the engine"))
    with pytest.raises(InputError, match="give repo:tag \\(without a digest\\) to look up"):
        bump.resolve_digest(ref)


def test_repinning_a_kept_older_version_with_its_own_image_is_a_bump(tmp_path):
    """bump.check_request: the same image is 'nothing to bump' only for the current version."""
    from opcollect.images.pins import load_pins

    pins = _pins(tmp_path)
    entry = load_pins(pins).backends["trtllm"]
    older = next(v for v in entry.versions if v != entry.current)
    request = bump.BumpRequest("trtllm", older, entry.versions[older].image, keep_old=True, allow_downgrade=True)
    assert bump.check_request(pins, request) == entry.current
    after = bump.rewrite_pins(pins.read_text(), request, entry.current)
    assert f"current: {older}\n" in after and after.index(f"      {older}:") < after.index(f"      {entry.current}:")


def test_the_bump_report_path_is_docs_bumps_and_a_link_there_is_refused(tmp_path):
    """bump_report.report_path and check_report_path: docs/bumps/<backend>-<version>.md, never a symlink."""
    from opcollect.project import ProjectTree

    tree = ProjectTree(tmp_path)
    path = bump_report.report_path(tree, "vllm", "0.25.0")
    assert path == tmp_path / "docs" / "bumps" / "vllm-0.25.0.md"
    bump_report.check_report_path(tree, path)  # nothing there yet
    path.parent.mkdir(parents=True)
    (tmp_path / "elsewhere.md").write_text("x")
    path.symlink_to(tmp_path / "elsewhere.md")
    with pytest.raises(InputError, match="vllm-0.25.0.md: not a regular file"):
        bump_report.check_report_path(tree, path)
