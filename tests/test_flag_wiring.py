"""Each command-line flag reaches what it sets: a flag the parser takes but the command drops (or passes to the
wrong parameter) leaves every default-valued test passing. Each test here gives the flag a value whose effect
differs from the default's and checks that effect in the command's own output or files."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, fake_run, gemm_plan, run_cli

from opcollect.plans.gemm import GemmCase
from opcollect.project import find_project
from opcollect.tables.merge import merge

NO_ENGINE = {"DOCKER_HOST": "tcp://127.0.0.1:1"}  # nothing listens there: a command that reaches Docker fails at once


@pytest.fixture(scope="module")
def old_new(tmp_path_factory):
    """Two TABLES trees of one GEMM row: OLD at 1.0, NEW at 1.03. fake_run's rows have p25/p75 at 0.99/1.01 of the
    median, 10 samples and noise 0.02, so the intervals [0.99, 1.01] and [1.0197, 1.0403] are disjoint, apart by
    0.96% of OLD's p75: slower under the default thresholds (gap 0.5%, noise 25%, 10 samples)."""
    tmp = tmp_path_factory.mktemp("old_new")
    trees = []
    for name, latency in (("old", 1.0), ("new", 1.03)):
        run = fake_run(tmp / f"{name}-run", [GemmCase("bfloat16", 8, 64, 64)], latency=latency)
        merge([run], tmp / name, find_project(), say=lambda line: None)
        trees.append(str(tmp / name))
    return trees


def _verdicts(done) -> str:
    assert done.returncode == 0, done.stderr
    return next(line for line in done.stdout.splitlines() if line.startswith("verdicts:"))


@pytest.mark.parametrize(
    ("flags", "counts"),
    [
        ((), "0 same, 0 faster, 1 slower, 0 ambiguous"),
        (("--min-gap", "0.02"), "0 same, 0 faster, 0 slower, 1 ambiguous"),  # 0.96% apart < 2%
        (("--min-gap", "0.009"), "0 same, 0 faster, 1 slower, 0 ambiguous"),
        (("--noise-ceiling", "0.01"), "0 same, 0 faster, 0 slower, 1 ambiguous"),  # noise 2% > 1%
        (("--noise-ceiling", "0.03"), "0 same, 0 faster, 1 slower, 0 ambiguous"),
        (("--min-samples", "11"), "0 same, 0 faster, 0 slower, 1 ambiguous"),  # 10 samples < 11
        (("--min-samples", "10"), "0 same, 0 faster, 1 slower, 0 ambiguous"),
    ],
)
def test_compare_takes_each_verdict_threshold_from_its_flag(old_new, flags, counts):
    assert counts in _verdicts(run_cli("compare", *old_new, *flags))


def test_compare_names_the_thresholds_it_used(old_new):
    done = run_cli("compare", *old_new, "--min-gap", "0.03", "--noise-ceiling", "0.4", "--min-samples", "7")
    assert "real change: disjoint by >= 3.0%; ambiguous: noise > 40% or < 7 samples" in done.stdout


def test_check_takes_the_noise_bound_from_its_flag(tmp_path):
    tables = tmp_path / "tables"
    merge([fake_run(tmp_path / "run", [GemmCase("bfloat16", 8, 64, 64)])], tables, find_project())
    quiet = run_cli("check", str(tables))  # noise 0.02 under the default bound 0.05
    assert quiet.returncode == 0 and "R7" not in quiet.stdout, quiet.stdout
    noisy = run_cli("check", str(tables), "--noise-bound", "0.01")
    assert noisy.returncode == 0 and "R7" in noisy.stdout, noisy.stdout  # a warning without --strict
    strict = run_cli("check", str(tables), "--noise-bound", "0.01", "--strict")
    assert strict.returncode == 1 and "R7" in strict.stdout, strict.stdout


@pytest.fixture
def pins_without_vllm(tmp_path):
    text = (ROOT / "pins.yaml").read_text()
    entry = "  vllm:\n    current: 0.24.0\n    versions:\n      0.24.0:\n        image: "
    assert entry in text
    path = tmp_path / "other-pins.yaml"
    path.write_text(text.replace(entry, "\n".join("  # " + line.lstrip() for line in entry.split("\n"))))
    return path


@pytest.mark.parametrize(
    "command",
    [
        ("build", "vllm"),
        ("collect", "vllm"),
        ("collect", "vllm", "--version", "0.24.0", "--local"),
        ("contract", "vllm", "--image"),
    ],
    ids=["build", "collect-container", "collect-version", "contract-image"],
)
def test_the_pins_flag_names_the_file_it_read(pins_without_vllm, command):
    done = run_cli(*command, "--pins", str(pins_without_vllm), env=NO_ENGINE)
    assert done.returncode == 2, done.stderr
    said = f"{pins_without_vllm}: no pin for backend 'vllm'; pinned: torch, sglang, trtllm"
    assert done.stderr == f"opcollect: error: {said}\n"


def test_run_records_the_image_and_digest_it_was_given(tmp_path):
    plan = gemm_plan(tmp_path / "plan.json", [(1, 8, 8)])
    digest = "sha256:" + "ab" * 32
    done = run_cli(
        "run", "--plan", str(plan), "--out", str(tmp_path / "run"), "--device", "cpu",
        "--image", "opcollect/torch:x", "--image-digest", digest, "--max-case-seconds", "0.01",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (event,) = (tmp_path / "run" / "events").glob("*.json")
    recorded = json.loads(event.read_text())
    assert (recorded["image"], recorded["image_digest"]) == ("opcollect/torch:x", digest)


def test_build_no_cache_rebuilds_an_image_that_exists(docker_client, tree_copy):
    def build(*flags):
        done = run_cli("build", "torch", "--base-image", "opcollect-local/torch-cpu:latest", "--root", str(tree_copy),
                       *flags)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    first = build()
    tag = first.strip().splitlines()[-1].split()[0]
    try:
        assert "(cache hit in" in build().strip().splitlines()[-1]
        rebuilt = build("--no-cache")
        assert "cache hit" not in rebuilt and f"{tag} (built in" in rebuilt.strip().splitlines()[-1]
        assert "---> Using cache" not in rebuilt  # every layer again
    finally:
        docker_client.images.remove(tag, force=True)
