#!/usr/bin/env python3
"""Plant one small bug at a time in a copy of the project and check that the tests notice it.

Each mutant is a source file under src/opcollect, an exact snippet in it, its replacement, a short name
and the narrowest tests that should catch it. For each mutant the project's inputs (src, cases, systems,
images, tests, scripts, bench, pins.yaml, pyproject.toml, README.md, noxfile.py) are copied into a temporary
directory, the one replacement is applied there (the snippet must occur exactly once), and

    python -m pytest -x -q -p no:cacheprovider <tests>

runs in the copy with PYTHONPATH=<copy>/src, so the copy's code is imported (find_project() follows the
package location, so the copy's cases/ and tests/ are used too). The checkout itself is never modified.
A mutant is caught when its tests fail (or hang past the timeout), missed when they pass.

    .venv/bin/python scripts/mutants.py                 # all mutants, one line each, then the score
    .venv/bin/python scripts/mutants.py --only NAME     # one mutant (repeatable)
    .venv/bin/python scripts/mutants.py --check         # only check that every snippet is found once
    .venv/bin/python scripts/mutants.py --list
    .venv/bin/python scripts/mutants.py --blind scripts/blind_mutants.json   # mutants written without the tests

A blind file lists mutants ({"name", "path", "old", "new"}) written by someone who has not read the tests; each
runs against the test files that import its module (covering_tests), so nobody picks the tests that catch it.
With --map JSON (scripts/covermap.py) each runs the tests that execute its lines, and where those pass, the
whole files of those tests and the files importing its module: a test reads a line through a session-scoped
planner or a cache that an earlier test filled, charged to that test alone (all of them run in CI). Mapped
mutants run cheapest first, by the summed map durations of their tests.

With --results FILE each verdict is appended to FILE (one JSON line: name, path, old, new, verdict, seconds,
detail) as it comes, and a mutant FILE already holds with the same path, old and new is not run again; its
recorded verdict counts in the score. A stopped round resumes where it was; an edited mutant runs anew.

Before the mutants, a baseline runs every mutant's tests on an unmodified copy: a test that already
fails would "catch" anything, so a failing baseline stops the script (``--no-baseline`` skips it).
Always exits 0 unless the script itself cannot run (a snippet not found exactly once, a failing baseline).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COPIED_DIRS = ("src", "cases", "systems", "images", "tests", "scripts", "bench")
COPIED_FILES = ("pins.yaml", "pyproject.toml", "README.md", "noxfile.py")
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", ".pytest_cache", ".ruff_cache")

PLANS = "tests/test_planted_plans.py"
DISPATCH = "tests/test_vllm_dispatch.py"
SGLANG = "tests/test_sglang_dispatch.py"
REFERENCE = "tests/test_dispatch_vs_reference.py"
VLLM_GEMM_MOE = "tests/test_vllm_gemm_moe.py"
VLLM_AR = "tests/test_vllm_allreduce.py"
SGLANG_ATTN = "tests/test_sglang_attention_mla.py"
CONTRACT = "tests/test_contract.py"
BACKEND = "tests/test_backend_contract.py"
RUNTIME = "tests/test_planted_runtime.py"
POOL = "tests/test_planted_pool.py"
TABLES = "tests/test_planted_tables.py"
IMAGES = "tests/test_planted_images.py"
SAFETY = "tests/test_data_safety.py"
COMM = "tests/test_comm_plans.py"
CHECK = "tests/test_check_verify.py"
MERGE = "tests/test_merge.py"
BAD = "tests/test_bad_inputs.py::test_bad_input_is_one_line_and_exit_2[resume-nothing-there]"


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # under src/opcollect
    old: str
    new: str
    tests: tuple[str, ...]  # test files or node IDs, relative to the project root
    # --map only: what runs when ``tests`` pass: the whole files of the mapped tests and the files importing the
    # module (tests sharing a module- or session-scoped fixture, or a cache, with a mapped test read what the
    # mutated line computed for it), each test that failed in the map's run deselected
    wider: tuple[str, ...] = ()


def m(name: str, path: str, old: str, new: str, *tests: str) -> Mutant:
    return Mutant(name, path, old, new, tests)


def _importers(dotted: str, files) -> list[Path]:
    package, _, module = dotted.rpartition(".")
    pattern = re.compile(rf"\b{re.escape(dotted)}\b|from {re.escape(package)} import [^\n]*\b{module}\b")
    return [f for f in files if pattern.search(f.read_text())]


def covering_tests(path: str) -> tuple[str, ...]:
    """The test files that import the module at ``path`` (under src/opcollect), by its dotted name or as
    ``from opcollect.<package> import <module>``: the tests a module's author would run. For a module no test
    imports, the test files named for it (test_*<module>*.py), else those importing a module that imports it."""
    dotted = "opcollect." + path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    tests = sorted((ROOT / "tests").glob("test_*.py"))
    found = _importers(dotted, tests) or [t for t in tests if dotted.rpartition(".")[2] in t.stem]
    if not found:
        src = ROOT / "src"
        parents = _importers(dotted, sorted(src.rglob("*.py")))
        dotted_parents = [".".join(p.relative_to(src).with_suffix("").parts) for p in parents]
        found = sorted({t for parent in dotted_parents for t in _importers(parent, tests)})
    return tuple(str(test.relative_to(ROOT)) for test in found)


# test files whose tests start clusters, containers or whole collections: run after the others
SLOW = frozenset(
    f"tests/{name}.py"
    for name in ("test_slurm", "test_images", "test_interrupts", "test_collect_local", "test_planted_images")
)


def mapped_tests(covermap: dict, path: str, old: str) -> tuple[str, ...]:
    """The tests that execute the lines of ``old`` in ``path``, by a map from scripts/covermap.py: what
    CI runs against a bug there. Lines run only at import carry no test; they are charged to every test
    that reaches the module. A module no test reaches has none."""
    lines = covermap["files"].get(path, {})
    text = (ROOT / "src" / "opcollect" / path).read_text()
    first = text[: text.index(old)].count("\n") + 1
    span = range(first, first + old.rstrip("\n").count("\n") + 1)
    ids = {i for line in span for i in lines.get(str(line), ())}
    if not ids:
        ids = {i for found in lines.values() for i in found}
    tests = [t for t in (covermap["tests"][i] for i in sorted(ids)) if t is not None]
    # -x stops at the first failure: the module's own test files first, then the rest, the slow files last, and
    # in each group the files whose reaching tests took least in the map's run first (a file's tests stay
    # together, so its module fixtures are built once)
    own = set(covering_tests(path))
    took: dict[str, float] = {}
    for t in tests:
        took[t.partition("::")[0]] = took.get(t.partition("::")[0], 0.0) + covermap.get("seconds", {}).get(t, 0.0)

    def order(test: str) -> tuple:
        file = test.partition("::")[0]
        return file not in own, file in SLOW, took[file], test

    return tuple(sorted(tests, key=order))


def copied_module_tests(covermap: dict, path: str) -> tuple[str, ...]:
    """For a module the map never saw run because it runs as a copy (release/data_api.py becomes the data wheel's
    __init__): the tests reaching the lines of src/opcollect that name its file in a string."""
    quoted = (f'"{Path(path).name}"', f"'{Path(path).name}'")
    tests: dict[str, None] = {}
    for source in sorted((ROOT / "src" / "opcollect").rglob("*.py")):
        for line in source.read_text().splitlines():
            if any(q in line for q in quoted):
                rel = source.relative_to(ROOT / "src" / "opcollect").as_posix()
                tests.update(dict.fromkeys(mapped_tests(covermap, rel, line)))
    return tuple(tests)


def blind_mutants(path: Path, covermap: Path | None = None) -> list[Mutant]:
    entries = json.loads(path.read_text())
    if covermap is None:
        return [Mutant(e["name"], e["path"], e["old"], e["new"], covering_tests(e["path"])) for e in entries]
    found = json.loads(covermap.read_text())
    if found.get("failed"):
        print(f"{len(found['failed'])} tests failed in the map's run and are left out: {found['failed'][:3]}")
        failed = set(found["failed"])
        found["tests"] = [t if t not in failed else None for t in found["tests"]]
    failed = [f"--deselect={node}" for node in found.get("failed", ())]
    mutants = []
    for e in entries:
        tests = mapped_tests(found, e["path"], e["old"]) or copied_module_tests(found, e["path"])
        own = covering_tests(e["path"])
        files = [*own, *sorted({t.partition("::")[0] for t in tests} - set(own), key=lambda f: (f in SLOW, f))]
        # the wider run follows a passed mapped run: those tests are not run again
        passed = [f"--deselect={node}" for node in tests]
        wider = (*files, *failed, *passed) if files else ()
        mutants.append(Mutant(e["name"], e["path"], e["old"], e["new"], tests, wider))
    # cheapest first by the map's durations: a round stopped early has measured the most mutants
    took = found.get("seconds", {})
    return sorted(mutants, key=lambda mutant: sum(took.get(test, 0.0) for test in mutant.tests))


MUTANTS: list[Mutant] = [
    # ---- plans: hashes, skips, shards, case IDs, dispatch, MoE splits ------------------------------
    m(
        "plan-hash-ignores-dispatch",
        "plans/hashes.py",
        'return list(map("%s\\t%s".__mod__, zip(ids, dispatch)))',
        'return list(map("%s".__mod__, ids))',
        f"{PLANS}::test_plan_hash_changes_with_the_dispatch_of_an_unbatched_op",
        f"{PLANS}::test_plan_hash_changes_when_the_planner_dispatches_differently",
    ),
    m(
        "plan-hash-ignores-sm",
        "plans/hashes.py",
        'return [f"backend={backend}", f"sm={sm}"]',
        'return [f"backend={backend}"]',
        f"{PLANS}::test_plan_hash_changes_with_the_sm_for_the_same_cases",
    ),
    m(
        "collector-hash-ignores-paths",
        "plans/hashes.py",
        'digest.update(f"{rel}\\0{len(content)}\\0".encode())',
        'digest.update(f"{len(content)}\\0".encode())',
        f"{PLANS}::test_collector_hash_changes_when_a_hashed_file_is_renamed",
    ),
    m(
        "fp8-skip-misses-sm86",
        "plans/skips.py",
        'skip("fp8-needs-sm89", dtype="fp8", sm=["80", "86", "cpu"])',
        'skip("fp8-needs-sm89", dtype="fp8", sm=["80", "cpu"])',
        f"{PLANS}::test_fp8_gemm_is_not_planned_before_sm89",
    ),
    m(
        "fp8-skip-covers-sm89",
        "plans/skips.py",
        'skip("fp8-needs-sm89", dtype="fp8", sm=["80", "86", "cpu"])',
        'skip("fp8-needs-sm89", dtype="fp8", sm=["80", "86", "89", "cpu"])',
        f"{PLANS}::test_fp8_gemm_is_planned_from_sm89",
    ),
    m(
        "skip-model-matches-any-model",
        "plans/skips.py",
        "not all(m in allowed or architecture_of.get(m) in allowed for m in models)",
        "not any(m in allowed or architecture_of.get(m) in allowed for m in models)",
        f"{PLANS}::test_a_model_skip_leaves_shapes_another_model_also_needs",
    ),
    m(
        "shard-index-may-equal-count",
        "plans/planner.py",
        "if count < 1 or not 0 <= index < count:",
        "if count < 1 or not 0 <= index <= count:",
        f"{PLANS}::test_shard_index_must_be_below_the_count",
    ),
    m(
        "shard-batched-rows-off-by-one",
        "plans/planner.py",
        "rows = sorted(selection.rows, key=lambda r: r.row_id)[index::count]",
        "rows = sorted(selection.rows, key=lambda r: r.row_id)[index + 1 :: count]",
        f"{PLANS}::test_shards_partition_unbatched_and_batched_ops_and_keep_run_order",
    ),
    m(
        "shard-loses-run-order",
        "plans/planner.py",
        "mine = sorted(order[index::count])",
        "mine = order[index::count]",
        f"{PLANS}::test_shards_partition_unbatched_and_batched_ops_and_keep_run_order",
    ),
    m(
        "smoke-five-cases",
        "plans/planner.py",
        "SMOKE_CASES = 4",
        "SMOKE_CASES = 5",
        f"{PLANS}::test_smoke_plans_at_most_four_cases_per_op",
    ),
    m(
        "case-id-drops-kv-cache-dtype",
        "runtime/planfile.py",
        "if name == dtype_field:",
        'if name.endswith("dtype"):',
        f"{PLANS}::test_every_case_id_names_every_non_dtype_field",
    ),
    m(
        "case-id-leading-comma",
        "runtime/planfile.py",
        'body += ("," if "=" in body else "") + f"{name}=%s"',
        'body += ("," if body else "") + f"{name}=%s"',
        f"{PLANS}::test_case_id_reads_as_documented",
    ),
    m(
        "sm-at-least-exclusive",
        "plans/base.py",
        'return sm != "cpu" and int(sm) >= minimum',
        'return sm != "cpu" and int(sm) > minimum',
        f"{PLANS}::test_sm_at_least_is_inclusive",
        f"{PLANS}::test_dispatch_switches_at_the_documented_sm",
    ),
    m(
        "moe-split-drops-pure-ep",
        "plans/moe.py",
        "if ep <= experts and experts % ep == 0 and inter % tp == 0:",
        "if ep < experts and experts % ep == 0 and inter % tp == 0:",
        PLANS + "::test_moe_pure_expert_parallel_split_is_kept",
        PLANS + "::test_moe_splits_are_every_valid_tp_ep_pair",
    ),
    m(
        "moe-split-uneven-experts",
        "plans/moe.py",
        "if ep <= experts and experts % ep == 0 and inter % tp == 0:",
        "if ep <= experts and inter % tp == 0:",
        PLANS + "::test_moe_pure_expert_parallel_split_is_kept",
        PLANS + "::test_moe_splits_are_every_valid_tp_ep_pair",
    ),
    # ---- runtime: resume, failure classes, worker and pool, harness ---------------------------------
    m(
        "resume-takes-earliest-attempt",
        "runtime/rundir.py",
        'record.get("attempt", 1) >= previous.get("attempt", 1)',
        'record.get("attempt", 1) <= previous.get("attempt", 1)',
        f"{RUNTIME}::test_resume_takes_the_latest_attempt_across_shard_files",
        f"{RUNTIME}::test_resume_takes_the_latest_attempt_within_one_shard",
    ),
    m(
        "retry-failed-inverted",
        "runtime/rundir.py",
        "        if retry_failed:\n",
        "        if not retry_failed:\n",
        f"{RUNTIME}::test_retry_failed_runs_failed_cases_again_and_plain_resume_does_not",
    ),
    m(
        "unrecorded-case-counts-one-attempt",
        "runtime/rundir.py",
        'return int(record.get("attempt", 1)) if record else 0',
        'return int(record.get("attempt", 1)) if record else 1',
        f"{RUNTIME}::test_tasks_skip_done_cases_and_number_attempts",
    ),
    m(
        "tasks-ignore-recorded-cases",
        "runtime/run.py",
        "todo = tuple(cid for cid in row.case_ids if cid not in skip)",
        "todo = tuple(row.case_ids)",
        f"{RUNTIME}::test_tasks_skip_done_cases_and_number_attempts",
    ),
    m(
        "tasks-repeat-the-attempt-number",
        "runtime/run.py",
        "attempt = 1 + max(attempts(cid) for cid in todo)",
        "attempt = max(1, max(attempts(cid) for cid in todo))",
        f"{RUNTIME}::test_tasks_skip_done_cases_and_number_attempts",
    ),
    m(
        "corrupt-shard-line-ends-the-read",
        "runtime/shards.py",
        "        except NotJson:\n            continue\n",
        "        except NotJson:\n            return\n",
        f"{RUNTIME}::test_a_corrupt_line_inside_a_shard_is_skipped_not_the_rest",
    ),
    m(
        "sticky-error-not-fatal",
        "runtime/failures.py",
        'return Failure("unexpected", _first_line(exc), fatal=True)',
        'return Failure("unexpected", _first_line(exc), fatal=False)',
        f"{RUNTIME}::test_sticky_cuda_errors_are_fatal",
    ),
    m(
        "sticky-pattern-device-assert-missing",
        "runtime/failures.py",
        '    "device-side assert",\n',
        "",
        f"{RUNTIME}::test_sticky_cuda_errors_are_fatal",
    ),
    m(
        "oom-only-by-exception-type",
        "runtime/failures.py",
        'if type(exc).__name__ == "OutOfMemoryError" or "out of memory" in text or isinstance(exc, MemoryError):',
        'if type(exc).__name__ == "OutOfMemoryError" or isinstance(exc, MemoryError):',
        f"{RUNTIME}::test_out_of_memory_is_oom_and_not_fatal",
    ),
    m(
        "kernel-limit-pattern-only-supports-missing",
        "runtime/failures.py",
        '    "only supports",\n',
        "",
        f"{RUNTIME}::test_kernel_limit_messages",
    ),
    m(
        "kernel-limit-ignores-not-implemented-error",
        "runtime/failures.py",
        "if isinstance(exc, NotImplementedError) or any(p in text for p in _LIMIT_PATTERNS):",
        "if any(p in text for p in _LIMIT_PATTERNS):",
        f"{RUNTIME}::test_kernel_limit_exceptions",
    ),
    m(
        "worker-drops-fatal-flag",
        "runtime/worker.py",
        "fatal = failure.fatal",
        "fatal = False",
        f"{RUNTIME}::test_worker_marks_a_sticky_error_fatal_and_others_not",
        f"{POOL}::test_a_sticky_cuda_error_replaces_the_worker",
    ),
    m(
        "capacity-check-without-margin",
        "runtime/worker.py",
        "if need > CAPACITY_SHARE * free:",
        "if need > free:",
        f"{RUNTIME}::test_capacity_check_keeps_a_margin_of_the_free_memory",
    ),
    m(
        "pool-ignores-fatal-answers",
        "runtime/pool.py",
        'if message.get("fatal"):',
        'if message.get("fatal_error"):',
        f"{POOL}::test_a_sticky_cuda_error_replaces_the_worker",
    ),
    m(
        "pool-replaces-after-every-failure",
        "runtime/pool.py",
        'if message.get("fatal"):',
        'if message.get("fatal") is not None:',
        f"{POOL}::test_an_out_of_memory_error_keeps_the_worker",
    ),
    m(
        "pool-timeout-recorded-as-crash",
        "runtime/pool.py",
        'self._fail(worker, "timeout", ',
        'self._fail(worker, "crash", ',
        f"{POOL}::test_a_hanging_case_times_out_and_the_next_runs_on_a_new_worker",
    ),
    m(
        "latency-is-the-mean",
        "runtime/harness.py",
        "latency=median * 1e3,",
        "latency=sum(raw.samples) / len(raw.samples) * 1e3,",
        f"{RUNTIME}::test_latency_is_the_median_not_the_mean",
    ),
    m(
        "quartiles-exclusive-method",
        "runtime/harness.py",
        'statistics.quantiles(samples, n=4, method="inclusive")',
        "statistics.quantiles(samples, n=4)",
        f"{RUNTIME}::test_p25_and_p75_are_the_inclusive_quartiles",
    ),
    m(
        "quartiles-p25-p75-swapped",
        "runtime/harness.py",
        "    return p25, median, p75\n",
        "    return p75, median, p25\n",
        f"{RUNTIME}::test_p25_and_p75_are_the_inclusive_quartiles",
    ),
    m(
        "one-sample-has-no-quartiles",
        "runtime/harness.py",
        "if len(samples) == 1:",
        "if not samples:",
        f"{RUNTIME}::test_a_single_sample_is_its_own_median_and_quartiles",
    ),
    m(
        "noise-bound-exclusive",
        "runtime/harness.py",
        "if relative_iqr(kept) <= config.max_noise:",
        "if relative_iqr(kept) < config.max_noise:",
        f"{RUNTIME}::test_a_perfectly_quiet_case_stops_at_min_samples_even_with_zero_noise_allowed",
    ),
    m(
        "default-noise-bound-two-percent",
        "runtime/harness.py",
        "max_noise: float = 0.01",
        "max_noise: float = 0.02",
        f"{RUNTIME}::test_default_noise_bound_is_one_percent",
    ),
    m(
        "first-noise-check-one-sample-late",
        "runtime/harness.py",
        "next_check = config.min_samples\n",
        "next_check = config.min_samples + 1\n",
        f"{RUNTIME}::test_a_perfectly_quiet_case_stops_at_min_samples_even_with_zero_noise_allowed",
    ),
    # ---- tables: rules, merge, manifest, compare -----------------------------------------------------
    m(
        "r1-blind-to-column-order",
        "tables/rules.py",
        "if names != wanted:",
        "if sorted(names) != sorted(wanted):",
        f"{TABLES}::test_r1_notices_swapped_columns",
    ),
    m(
        "r3-ignores-p75",
        "tables/values.py",
        "pc.and_(pc.less_equal(p25, latency), pc.less_equal(latency, p75))",
        "pc.less_equal(p25, latency)",
        f"{TABLES}::test_r3_notices_latency_above_p75",
    ),
    m(
        "r4-ignores-failures-outside-the-plan",
        "tables/rules.py",
        'for name, table in (("rows", perf), ("failures", failures)):',
        'for name, table in (("rows", perf),):',
        f"{TABLES}::test_r4_notices_a_failure_outside_the_plan",
    ),
    m(
        "r4-missing-cases-never-warnings",
        "tables/rules.py",
        "                warning=partial,\n",
        "                warning=False,\n",
        f"{TABLES}::test_a_table_with_unrecorded_cases_is_partial",
    ),
    m(
        "r5-ignores-failure-count",
        "tables/rules.py",
        "if (perf.num_rows, failures.num_rows) != (entry.rows, entry.failures):",
        "if perf.num_rows != entry.rows:",
        f"{TABLES}::test_r5_notices_a_wrong_failure_count",
    ),
    m(
        "r6-ignores-version",
        "tables/rules.py",
        '        ("version", version),\n',
        "",
        f"{TABLES}::test_r6_notices_a_wrong_version",
    ),
    m(
        "merge-failure-replaces-measured-row",
        "tables/candidates.py",
        '("rank", "ascending")',
        '("rank", "descending")',
        f"{TABLES}::test_a_newer_measurement_replaces_an_older_one_and_a_failure_never_does",
    ),
    m(
        "merge-oldest-record-wins",
        "tables/candidates.py",
        '("recorded_at", "ascending")',
        '("recorded_at", "descending")',
        f"{TABLES}::test_a_newer_measurement_replaces_an_older_one_and_a_failure_never_does",
        f"{TABLES}::test_the_latest_record_wins_within_one_merge",
    ),
    m(
        "merge-status-complete-with-gaps",
        "tables/merge.py",
        'pc.is_in(planned["case_id"], value_set=done)',
        'pc.is_in(done, value_set=planned["case_id"])',
        f"{TABLES}::test_a_table_with_unrecorded_cases_is_partial",
    ),
    m(
        "merge-event-counts-swapped",
        "tables/merge.py",
        'rows=counts[(e["run_id"], True)],',
        'rows=counts[(e["run_id"], False)],',
        f"{TABLES}::test_sidecar_events_count_each_runs_rows_and_failures",
    ),
    m(
        "manifest-keeps-stale-hashes",
        "tables/store.py",
        "if old is not None and rel not in self.written:",
        "if old is not None:",
        f"{TABLES}::test_a_newer_measurement_replaces_an_older_one_and_a_failure_never_does",
    ),
    m(
        "compare-slowest-old-kernel",
        "tables/compare.py",
        'old = old.group_by(keys).aggregate([("old", "min")])',
        'old = old.group_by(keys).aggregate([("old", "max")])',
        f"{TABLES}::test_compare_takes_the_fastest_kernel_of_old_and_of_new",
    ),
    m(
        "compare-slowest-new-kernel",
        "tables/compare.py",
        'new = new.group_by(keys).aggregate([("new", "min")])',
        'new = new.group_by(keys).aggregate([("new", "max")])',
        f"{TABLES}::test_compare_takes_the_fastest_kernel_of_old_and_of_new",
    ),
    m(
        "compare-steps-across-kernels",
        "tables/compare.py",
        'others = [k for k in _key(schema) if k != axis] + ["kernel_source"]',
        "others = [k for k in _key(schema) if k != axis]",
        f"{TABLES}::test_non_monotonic_steps_are_found_per_kernel",
    ),
    # ---- tables: the consumer's layout, collection_meta.yaml held to .opcollect/provenance.yaml ---------
    m(
        "r5-collection-meta-not-held-to-the-record",
        "tables/rules.py",
        "        pv.check_sidecar_matches(directory / sc.SIDECAR, meta, record)\n",
        "",
        f"{CHECK}::test_edited_sidecar",
    ),
    m(
        "r5-planted-file-not-flagged",
        "tables/rules.py",
        "if consumer.stem(name) not in meta.tables]",
        "if consumer.stem(name) not in meta.tables and False]",
        f"{CHECK}::test_a_planted_file_is_unexpected_and_taken_for_a_table",
    ),
    m(
        "r5-system-spec-not-checked",
        "tables/rules.py",
        "        found += _system_specs(root)",
        "        pass",
        f"{CHECK}::test_a_missing_or_broken_system_spec",
    ),
    m(
        "r6-unknown-dtype-only-a-warning",
        "tables/rules.py",
        'warning=runtime.framework == "torch"',
        "warning=True",
        f"{CHECK}::test_r6_a_dtype_the_consumer_does_not_know_in_a_framework_table",
    ),
    m(
        "r6-unknown-dtype-in-torch-a-violation",
        "tables/rules.py",
        'warning=runtime.framework == "torch"',
        "warning=False",
        f"{CHECK}::test_r6_a_dtype_the_consumer_does_not_know_in_a_torch_table_is_a_warning",
    ),
    m(
        "verify-looks-for-perf-in-the-dot-directory",
        "tables/verify.py",
        "directory = record_path.parent.parent",
        "directory = record_path.parent",
        f"{CHECK}::test_flipped_byte_in_parquet",
    ),
    m(
        "extras-beside-the-tables",
        "tables/schema.py",
        'return f"{table}.parquet", f"{EXTRAS}/{stem}_failures.parquet", f"{EXTRAS}/{stem}_plan.parquet"',
        'return f"{table}.parquet", f"{stem}_failures.parquet", f"{stem}_plan.parquet"',
        f"{MERGE}::test_layout_columns_and_sidecar",
    ),
    m(
        "nccl-beside-the-framework-tables",
        "tables/merge.py",
        "if schema.name == consumer.NCCL_TABLE:",
        "if False:",
        f"{COMM}::test_merge_of_custom_allreduce_and_nccl_runs_writes_the_reference_columns",
    ),
    m(
        "ingest-drops-nccl-version",
        "tables/ingest.py",
        '    "nccl_version",\n',
        "",
        f"{MERGE}::test_layout_columns_and_sidecar",
        f"{COMM}::test_merge_of_custom_allreduce_and_nccl_runs_writes_the_reference_columns",
    ),
    # ---- images: the input hash and the base -----------------------------------------------------------
    m(
        "input-hash-ignores-base-digest",
        "images/context.py",
        "        base_digest.encode(),\n",
        "",
        f"{IMAGES}::test_local_base_id_enters_the_input_hash",
        f"{IMAGES}::test_input_hash_covers_each_input",
    ),
    m(
        "input-hash-ignores-pyproject",
        "images/context.py",
        "        pyproject,\n",
        "",
        f"{IMAGES}::test_input_hash_covers_each_input",
    ),
    m(
        "local-base-id-not-asked",
        "images/context.py",
        "base, digest, local = base_image, local_image_id(base_image), True",
        "base, digest, local = base_image, base_image, True",
        f"{IMAGES}::test_local_base_id_enters_the_input_hash",
    ),
    m(
        "pinned-base-by-tag-not-digest",
        "images/context.py",
        "base, digest, local = pin.image, pin.digest, False",
        "base, digest, local = pin.name, pin.digest, False",
        f"{IMAGES}::test_a_pinned_build_starts_from_the_image_by_digest",
    ),
    # ---- the floor: run identity, plan verification, merge lock and targets, path names -----------
    m(
        "content-hash-ignores-shard",
        "plans/hashes.py",
        "f\"shard={'none' if shard is None else f'{shard[0]}/{shard[1]}'}\",",
        '"shard=any",',
        f"{SAFETY}::test_a_shard_is_part_of_the_identity_even_when_it_holds_every_case",
    ),
    m(
        "plan-ids-not-rederived",
        "runtime/planfile.py",
        "    if derived != ids:",
        "    if False:",
        f"{SAFETY}::test_an_edited_plan_file_is_refused",
    ),
    m(
        "plan-hash-not-recomputed",
        "runtime/planfile.py",
        "if shard is None and plan_hash(plan_header(backend, sm), lines, presorted=True) != whole:",
        "if False:",
        f"{SAFETY}::test_an_edited_plan_file_is_refused",
    ),
    m(
        "resume-identity-by-plan-hash-only",
        "runtime/rundir.py",
        'if held["content_hash"] != plan.content_hash:',
        'if held["plan_hash"] != plan.plan_hash:',
        f"{SAFETY}::test_shards_have_their_own_identity_and_merge_like_one_run",
    ),
    m(
        "resume-of-nothing-accepted",
        "runtime/rundir.py",
        "    if resume and not run_dir.is_dir():",
        "    if False:",
        f"{BAD}",
    ),
    m(
        "collect-resumes-any-selection",
        "collect.py",
        'if held["content_hash"] != data["content_hash"]:',
        "if False:",
        f"{SAFETY}::test_collect_out_of_another_selection_is_refused",
    ),
    m(
        "merge-without-lock",
        "tables/store.py",
        "            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)",
        "            pass",
        f"{SAFETY}::test_a_held_lock_makes_merge_wait_naming_the_holder_or_refuse",
    ),
    m(
        "merge-into-tampered-tree",
        "tables/store.py",
        "    if not report.clean:",
        "    if False:",
        f"{SAFETY}::test_merge_into_a_file_a_foreign_directory_or_a_tampered_tree_is_refused",
    ),
    m(
        "merge-into-foreign-directory",
        "tables/store.py",
        "        if any(tables.iterdir()):",
        "        if False:",
        f"{SAFETY}::test_merge_into_a_file_a_foreign_directory_or_a_tampered_tree_is_refused",
    ),
    m(
        "path-name-allows-leading-dot",
        "names.py",
        '_PATH_NAME = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9._+-]{0,127}")',
        '_PATH_NAME = re.compile(r"[A-Za-z0-9._+-][A-Za-z0-9._+-]{0,127}")',
        f"{SAFETY}::test_a_crafted_version_never_becomes_a_path",
    ),
    m(
        "version-not-checked",
        "tables/merge.py",
        "    path_name(version, f\"{run.run_dir / 'shards'}: runtime field 'version'\")",
        "    pass",
        f"{SAFETY}::test_a_crafted_version_never_becomes_a_path",
    ),
    m(
        "run-json-backend-trusted",
        "tables/ingest.py",
        'held = (identity["content_hash"], identity["backend"], identity["collector_hash"])',
        'held = (identity["content_hash"], verified.backend, identity["collector_hash"])',
        f"{SAFETY}::test_run_json_altered_to_another_backend_is_refused",
    ),
    m(
        "garbage-objects-not-counted",
        "tables/ingest.py",
        'garbage += lines.filter(pc.and_(pc.is_null(lines["case_id"]), pc.is_null(lines["kind"]))).num_rows',
        "garbage += 0",
        f"{SAFETY}::test_garbage_shard_lines_are_counted_in_the_output_and_the_sidecar",
    ),
    # ---- communication: elements, the collective in op_name, the variant in the key ------------------
    m(
        "comm-message-size-in-bytes",
        "backends/torch/comm.py",
        "        return message_size, 0\n",
        "        return message_size // 2, 0\n",
        f"{COMM}::test_message_size_counts_elements_of_the_dtype",
    ),
    m(
        "r6-ignores-the-case-s-op-name",
        "tables/rules.py",
        "    found += [Finding(f.rule, str(path), f.what, _ids(perf, f.mask)) for f in key_faults(perf, schema)]\n",
        "",
        f"{COMM}::test_check_flags_an_op_name_other_than_the_case_s",
    ),
    m(
        "custom-allreduce-variant-before-latency",
        "plans/comm.py",
        '    after_latency=("backend",),\n',
        "",
        f"{COMM}::test_the_variant_is_part_of_the_custom_allreduce_key",
    ),
    # ---- vLLM dispatch, the runtime's contract and plan reader, the symbol contract ---------------------
    m(
        "fp8-block-flashinfer-threshold-off-by-one",
        "plans/gemm.py",
        'return "FlashInferFp8BlockScaledMMKernel" if case.m < 32 else',
        'return "FlashInferFp8BlockScaledMMKernel" if case.m <= 32 else',
        f"{DISPATCH}::test_fp8_block_gemm_by_shape",
    ),
    m(
        "fp8-block-alignment-ignores-k",
        "plans/gemm.py",
        'aligned = case.n % 64 == 0 and case.k % 128 == 0\n        if aligned and sm == "90":',
        'aligned = case.n % 64 == 0\n        if aligned and sm == "90":',
        f"{DISPATCH}::test_fp8_block_gemm_by_shape",
    ),
    m(
        "attention-fa4-from-head-256",
        "plans/attention.py",
        'return "vllm_flash_attn_fa4" if case.head_dim > 256 else "vllm_flash_attn_fa3"',
        'return "vllm_flash_attn_fa4" if case.head_dim >= 256 else "vllm_flash_attn_fa3"',
        f"{DISPATCH}::test_attention_kernel_by_sm_and_head",
    ),
    m(
        "mla-prefill-threshold-flashmla-512",
        "plans/mla.py",
        'threshold = {"FLASH_ATTN_MLA": 512, "FLASHMLA": 128}.get(dispatch, 1)',
        'threshold = {"FLASH_ATTN_MLA": 512, "FLASHMLA": 512}.get(dispatch, 1)',
        f"{DISPATCH}::test_mla_context_runs_the_prefill_backend_past_the_decode_threshold",
    ),
    m(
        "moe-fp8-block-split-by-tp",
        "plans/moe.py",
        'if sm == "90" and case.moe_ep_size > 1:',
        'if sm == "90" and case.moe_tp_size > 1:',
        f"{DISPATCH}::test_moe_fp8_block_by_expert_split_and_mxfp4_by_model",
    ),
    m(
        "planner-ignores-case-dispatch",
        "plans/planner.py",
        "refine = op.case_dispatch.get(backend)",
        "refine = None",
        f"{REFERENCE}::test_sm90_dispatch_names_the_reference_kernel_source",
    ),
    m(
        "registry-ignores-version",
        "runtime/contract.py",
        "if runner.versions is None or version in runner.versions:",
        "if True:",
        f"{BACKEND}::test_registry_routes_by_version_and_dispatch",
    ),
    m(
        "registry-any-before-exact",
        "runtime/contract.py",
        "for key in ((op, dispatch), (op, ANY_DISPATCH)):",
        "for key in ((op, ANY_DISPATCH), (op, dispatch)):",
        f"{BACKEND}::test_registry_routes_by_version_and_dispatch",
    ),
    m(
        "plan-reader-trusts-columns",
        "runtime/planfile.py",
        'columns = [_field(raw_columns, f, list, f"{where}columns.") for f in fields]',
        "columns = [raw_columns.get(f, []) for f in fields]",
        f"{BACKEND}::test_the_runtime_reads_a_plan_as_typed_cases",
    ),
    m(
        "contract-ignores-keywords",
        "backends/symbols.py",
        "if keyword not in names and not open_ended:",
        "if False:",
        f"{CONTRACT}::test_a_doctored_release_is_reported_at_the_runners_line",
    ),
    m(
        "contract-star-import-ignores-all",
        "backends/symbols.py",
        "if exported is None or name in exported:",
        "if exported is not None and name in exported:",
        f"{CONTRACT}::test_every_use_of_the_runner_resolves",
    ),
    m(
        "contract-base-init-unfollowed",
        "backends/symbols.py",
        "return _parameters(release, parents[0], depth + 1) if parents else None",
        "return None",
        f"{CONTRACT}::test_a_doctored_release_is_reported_at_the_runners_line",
    ),
    m(
        "sglang-block-fp8-alignment-ignores-n",
        "plans/gemm.py",
        'aligned = case.n % 64 == 0 and case.k % 128 == 0\n        return "sglang_deepgemm',
        'aligned = case.k % 128 == 0\n        return "sglang_deepgemm',
        f"{SGLANG}::test_gemm_by_dtype_and_shape",
    ),
    m(
        "sglang-gemma4-window-ignored",
        "plans/attention.py",
        "return case.head_dim == 512 or (case.head_dim == 256 and case.window_size == 1024)",
        "return case.head_dim == 512",
        f"{SGLANG}::test_gemma4_heads_run_on_triton_below_sm100",
        f"{REFERENCE}::test_sm90_dispatch_names_the_reference_kernel_source",
    ),
    m(
        "sglang-nemotron-moe-on-triton",
        "plans/moe.py",
        'if _nemotron_h(case) and dispatch == "bfloat16":',
        "if False:",
        f"{SGLANG}::test_moe_by_model",
    ),
    m(
        "trtllm-nongated-by-topk",
        "plans/moe.py",
        'if dispatch == "moe_torch_flow_cutlass" and _nemotron_h(case):',
        'if dispatch == "moe_torch_flow_cutlass" and case.topk in (6, 22):',
        f"{SGLANG}::test_trtllm_labels_as_its_reference_collector",
        f"{REFERENCE}::test_sm90_dispatch_names_the_reference_kernel_source",
    ),
    # ---- the framework runners' input builders ------------------------------------------------------------
    m(
        "vllm-block-scales-floor",
        "backends/vllm/gemm.py",
        'scales=(("weight_scale_inv", (ceil_div(n, BLOCK), ceil_div(k, BLOCK)), "float32"),),',
        'scales=(("weight_scale_inv", (n // BLOCK, k // BLOCK), "float32"),),',
        VLLM_GEMM_MOE,
    ),
    m(
        "vllm-moe-ep-splits-inter",
        "backends/vllm/moe.py",
        "return case.num_experts // ep, case.inter_size, ep, True",
        "return case.num_experts // ep, case.inter_size // ep, ep, True",
        VLLM_GEMM_MOE,
    ),
    m(
        "vllm-custom-allreduce-limit-inclusive",
        "backends/vllm/allreduce.py",
        "nbytes < custom_ar_max_bytes(world, sm, symm_mem)",
        "nbytes <= custom_ar_max_bytes(world, sm, symm_mem)",
        VLLM_AR,
    ),
    m(
        "sglang-page-size-16",
        "backends/sglang/attention.py",
        'return TRTLLM_PAGE_SIZE if backend.startswith("trtllm") else 1',
        'return TRTLLM_PAGE_SIZE if backend.startswith("trtllm") else 16',
        SGLANG_ATTN,
    ),
    m(
        "planner-refines-once-per-group",
        "plans/planner.py",
        "        key = key_of(values)\n",
        "        key = 0\n",
        f"{REFERENCE}::test_sm90_dispatch_names_the_reference_kernel_source",
    ),
    m(
        "sglang-gemm-rule-reads-too-little",
        "plans/gemm.py",
        '@refines(("n", "k"), ("fp8", "fp8_block"))',
        '@refines(("n",), ("fp8", "fp8_block"))',
        f"{REFERENCE}::test_each_case_rule_reads_only_the_fields_it_declares",
    ),
    # ---- TensorRT-LLM runners, version routes, contract tree ---------------------------------------
    m(
        "trtllm-gemm-label-ignores-sm100",
        "backends/trtllm/gemm.py",
        'return "deepgemm" if dtype == "fp8_block" and sm_100f and deep_gemm else "torch_flow"',
        'return "deepgemm" if dtype == "fp8_block" and deep_gemm else "torch_flow"',
        "tests/test_trtllm_gemm.py",
    ),
    m(
        "trtllm-serves-every-version",
        "backends/trtllm/context.py",
        'SERVED_VERSIONS = frozenset({"1.3.0rc20", "1.3.0rc23"})',
        "SERVED_VERSIONS = None",
        "tests/test_trtllm_routes.py",
    ),
    m(
        "contract-dataclass-open-ended",
        "backends/symbols.py",
        "return names, False",
        "return names, True",
        f"{CONTRACT}::test_a_dataclass_takes_its_fields_and_its_dataclass_bases_fields",
    ),
    # ---- bumps, markers, releases, Slurm -----------------------------------------------------------
    m(
        "marker-behind-compares-equal",
        "backends/markers.py",
        "version_key(m.version) < version_key(pins[m.backend])",
        "version_key(m.version) <= version_key(pins[m.backend])",
        "tests/test_version_contract.py",
    ),
    m(
        "bump-accepts-any-tag",
        "images/bump.py",
        "if pin.tag is None or not tag_matches(pin.tag, request.version):",
        "if pin.tag is None:",
        "tests/test_bump.py::test_bad_bumps_exit_2_with_one_line_and_change_nothing",
    ),
    m(
        "bump-drops-keep-old",
        "images/bump.py",
        "if not request.keep_old and old_version != request.version:",
        "if old_version != request.version:",
        "tests/test_bump.py::test_a_bump_changes_one_entry_and_writes_its_report",
    ),
    m(
        "release-wheel-entries-unsorted",
        "release/archives.py",
        "        for name in sorted(entries):",
        "        for name in entries:",
        "tests/test_release.py::test_release_builds_reproducibly_and_verifies_installed",
    ),
    m(
        "release-skips-verify",
        "release/cut.py",
        "    if not report.clean:",
        "    if False:",
        "tests/test_release.py::test_a_tampered_table_is_refused_before_packaging",
    ),
    m(
        "merge-plan-ignored",
        "tables/merge.py",
        "        members[:0] = [p for p in planned_only if any(p.plan_hash == m.plan_hash for m in members)]",
        "        members[:0] = []",
        f"{MERGE}::test_merge_against_the_whole_plan_leaves_a_missing_shard_partial",
    ),
]


def _copy_project(dest: Path) -> None:
    for name in COPIED_DIRS:
        shutil.copytree(ROOT / name, dest / name, ignore=IGNORED)
    for name in COPIED_FILES:
        shutil.copy2(ROOT / name, dest / name)
    if (ROOT / ".cache").is_dir():  # the pinned wheels and the consumer's venv the tests read, shared, not copied
        (dest / ".cache").symlink_to((ROOT / ".cache").resolve(), target_is_directory=True)


def _apply(copy: Path, mutant: Mutant) -> None:
    path = copy / "src" / "opcollect" / mutant.path
    text = path.read_text()
    found = text.count(mutant.old)
    if found != 1:
        raise SystemExit(
            f"mutant {mutant.name}: the snippet occurs {found} times in src/opcollect/{mutant.path} "
            f"(need exactly 1); update it in scripts/mutants.py:\n{mutant.old}"
        )
    path.write_text(text.replace(mutant.old, mutant.new))


def _env(copy: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(PYTHONPATH=str(copy / "src"), PYTHONDONTWRITEBYTECODE="1", PYTHONHASHSEED="0")
    return env


def _python() -> str:
    venv = ROOT / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def _check_import(python: str, copy: Path) -> None:
    """The copy's package, not the checkout's, is what the tests will import."""
    code = "import opcollect.project as p; print(p.find_project().root)"
    done = subprocess.run([python, "-c", code], cwd=copy, env=_env(copy), capture_output=True, text=True)
    found = done.stdout.strip()
    if done.returncode or Path(found).resolve() != copy.resolve():
        raise SystemExit(f"the copy does not import its own opcollect (got {found!r}): {done.stderr[-500:]}")


def _pytest(
    python: str, copy: Path, tests: tuple[str, ...], timeout: float, verbose: bool = False
) -> tuple[str, float, str]:
    """('passed' | 'failed' | 'timeout' | 'error', seconds, the first failure line)."""
    start = time.monotonic()
    cmd = [python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    try:
        done = subprocess.run(cmd, cwd=copy, env=_env(copy), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", time.monotonic() - start, ""
    seconds = time.monotonic() - start
    lines = (done.stdout + done.stderr).splitlines()
    if verbose:
        print("\n".join(lines[-40:]), flush=True)
    first = next((line for line in lines if line.startswith(("FAILED", "ERROR"))), lines[-1] if lines else "")
    if done.returncode == 0:
        return "passed", seconds, ""
    if done.returncode in (1, 2):  # tests failed, or collection broke on the planted code
        return "failed", seconds, first
    # node IDs in a file that no longer imports: pytest reports the file's collection error, then a usage error
    if done.returncode == 4 and any(line.startswith("ERROR tests/") for line in lines):
        return "failed", seconds, first
    return "error", seconds, "\n".join(lines[-15:])


def uses_engine(tests: tuple[str, ...]) -> bool:
    """Whether any of these test files (or node IDs) is one that speaks of Docker."""
    files = {t.partition("::")[0] for t in tests if not t.startswith("-")}
    return any("docker" in (ROOT / f).read_text() for f in files if (ROOT / f).is_file())


def recorded(results: Path | None) -> dict[str, dict]:
    """The verdicts --results FILE holds, by mutant name (the last line of a name wins)."""
    if results is None or not results.exists():
        return {}
    found = {}
    for number, line in enumerate(results.read_text().splitlines(), 1):
        if line.strip():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                raise SystemExit(f"{results}:{number}: not a JSON line; remove it or the file") from None
            found[entry["name"]] = entry
    return found


def _is_recorded(entry: dict | None, mutant: Mutant) -> bool:
    return entry is not None and (entry["path"], entry["old"], entry["new"]) == (mutant.path, mutant.old, mutant.new)


def _baseline(python: str, mutants: list[Mutant], timeout: float) -> None:
    tests = tuple(dict.fromkeys(t for mutant in mutants for t in mutant.tests))
    with tempfile.TemporaryDirectory(prefix="opcollect-mutant-base-") as tmp:
        copy = Path(tmp)
        _copy_project(copy)
        outcome, seconds, detail = _pytest(python, copy, tests, timeout * 4)
    if outcome != "passed":
        raise SystemExit(f"baseline: the tests fail without any mutant ({outcome}): {detail}")
    print(f"baseline  {len(tests)} tests pass unmodified ({seconds:.1f} s)", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", metavar="NAME", help="run only this mutant (repeatable)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per mutant (default 120)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmodified run of the tests")
    parser.add_argument("--check", action="store_true", help="only check that every snippet is found once")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--blind", type=Path, metavar="FILE", help="the mutants of a JSON file, tests chosen by import")
    parser.add_argument(
        "--map", type=Path, metavar="JSON", help="with --blind: run the tests that reach the changed lines"
    )
    parser.add_argument("--jobs", type=int, default=1, help="mutants run at once (default 1)")
    parser.add_argument("--skip", action="append", metavar="NAME", default=[], help="leave this mutant out")
    parser.add_argument(
        "--results", type=Path, metavar="FILE", help="append each verdict here; skip mutants it already holds"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="print the tail of each pytest output")
    args = parser.parse_args(argv)

    if args.map and not args.blind:
        raise SystemExit("--map chooses the tests of --blind mutants; give --blind FILE too")
    mutants = blind_mutants(args.blind, args.map) if args.blind else MUTANTS
    names = [mutant.name for mutant in mutants]
    if len(set(names)) != len(names):
        raise SystemExit("two mutants share a name")
    uncovered = [mutant.name for mutant in mutants if not mutant.tests]
    if uncovered and not args.map:
        raise SystemExit(f"no test file imports the module of {', '.join(uncovered)}")
    chosen = mutants
    if args.only:
        unknown = sorted(set(args.only) - set(names))
        if unknown:
            raise SystemExit(f"--only: unknown mutant {unknown[0]!r}; see --list")
        chosen = [mutant for mutant in mutants if mutant.name in args.only]
    chosen = [mutant for mutant in chosen if mutant.name not in args.skip]
    if args.list:
        for mutant in chosen:
            print(f"{mutant.name:45} src/opcollect/{mutant.path}  {' '.join(mutant.tests)}")
        return 0
    for mutant in chosen:
        if mutant.old == mutant.new:
            raise SystemExit(f"mutant {mutant.name}: the replacement equals the snippet")
        found = (ROOT / "src" / "opcollect" / mutant.path).read_text().count(mutant.old)
        if found != 1:
            raise SystemExit(
                f"mutant {mutant.name}: the snippet occurs {found} times in src/opcollect/{mutant.path} "
                f"(need exactly 1); update it in scripts/mutants.py:\n{mutant.old}"
            )
    if args.check:
        print(f"{len(chosen)} snippets found exactly once")
        return 0

    done = recorded(args.results)
    kept = [done[mutant.name] for mutant in chosen if _is_recorded(done.get(mutant.name), mutant)]
    measured = {entry["name"] for entry in kept}
    chosen = [mutant for mutant in chosen if mutant.name not in measured]
    python = _python()
    with tempfile.TemporaryDirectory(prefix="opcollect-mutant-import-") as tmp:
        _copy_project(Path(tmp))
        _check_import(python, Path(tmp))
    if not args.no_baseline and not args.map:  # a map's own suite run is its baseline
        _baseline(python, chosen, args.timeout)
    caught = sum(entry["verdict"] == "caught" for entry in kept)
    missed = [entry["name"] for entry in kept if entry["verdict"] != "caught"]
    for entry in kept:
        print(f"{entry['verdict']:9} {entry['name']:45} (recorded in {args.results})", flush=True)
    started = time.monotonic()

    def attempt(mutant: Mutant) -> tuple[str, float, str]:
        if not mutant.tests:
            return "unreached", 0.0, "no test executes this module"
        with tempfile.TemporaryDirectory(prefix="opcollect-mutant-") as tmp:
            copy = Path(tmp)
            _copy_project(copy)
            _apply(copy, mutant)
            with engine if uses_engine(mutant.tests) else contextlib.nullcontext():
                outcome = _pytest(python, copy, mutant.tests, args.timeout, args.verbose)
            if outcome[0] == "passed" and mutant.wider:
                with engine if uses_engine(mutant.wider) else contextlib.nullcontext():
                    wider = _pytest(python, copy, mutant.wider, args.timeout, args.verbose)
                return wider[0], outcome[1] + wider[1], f"(wider) {wider[2]}" if wider[2] else "(wider)"
            return outcome

    # each mutant runs in its own copy, so --jobs of them can run at once (each pytest is one process); those whose
    # tests talk to the one Docker engine take turns: one's image prune would remove the other's images
    engine = threading.Lock()

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(attempt, mutant): mutant for mutant in chosen}
        for future in as_completed(futures):
            mutant = futures[future]
            outcome, seconds, detail = future.result()
            # Without a map, the chosen files are narrow and a timeout means the mutant hangs them. With one,
            # a timeout may only mean many tests reach the line: it is reported, not counted as caught.
            if outcome == "failed" or (outcome == "timeout" and not args.map):
                caught += 1
                verdict = "caught"
            else:
                missed.append(mutant.name)
                verdict = {"passed": "MISSED", "timeout": "TIMEOUT", "unreached": "UNREACHED"}.get(outcome, "ERROR")
            shown = detail.splitlines()[0][:110] if detail and outcome != "error" else detail
            print(f"{verdict:9} {mutant.name:45} {seconds:6.1f} s {len(mutant.tests):5} tests  {shown}", flush=True)
            if args.results is not None:
                line = {"name": mutant.name, "path": mutant.path, "old": mutant.old, "new": mutant.new}
                line.update(verdict=verdict, seconds=round(seconds, 1), detail=shown)
                with args.results.open("a") as out:
                    out.write(json.dumps(line) + "\n")
    planted = len(kept) + len(chosen)
    print(f"missed: {', '.join(missed)}" if missed else "missed: none")
    print(f"({time.monotonic() - started:.0f} s)")
    print(f"caught {caught} / planted {planted} ({100.0 * caught / planted:.0f}%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
