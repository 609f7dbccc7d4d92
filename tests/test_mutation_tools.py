"""The tools that measure the tests: scripts/covermap.py charges every line a test reaches (in its own process
and in the `python -m opcollect` children it starts) to that test, and scripts/mutants.py --map runs, for a
planted bug, exactly the tests that reach its lines."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT

CLI_TEST = "tests/test_bad_inputs.py::test_bad_input_is_one_line_and_exit_2[backend-unknown]"


def _script(name: str):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "scripts"))


def test_a_line_run_only_in_a_cli_child_is_charged_to_the_test_that_started_it(tmp_path):
    covermap = _script("covermap")
    site = covermap._site_packages(sys.executable)
    before = sorted(site.glob(f"{covermap.HOOK}*"))  # an outer map's hook, when this runs under one
    out = tmp_path / "map.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "covermap.py"), "--out", str(out), "--", CLI_TEST]
    # as an outer map runs this test: its test ID in the environment is not a test of this map
    outer = {**os.environ, covermap.TEST_VAR: "tests/test_outer.py::test_running_this_one"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=outer)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    found = json.loads(out.read_text())
    assert found["tests"] == [CLI_TEST] and found["failed"] == []
    assert list(found["seconds"]) == [CLI_TEST] and found["seconds"][CLI_TEST] > 0  # the child's start is in it
    # __main__ runs only in the `python -m opcollect` child; its last line is the exit
    main_lines = found["files"]["__main__.py"]
    last = len((ROOT / "src" / "opcollect" / "__main__.py").read_text().splitlines())
    assert main_lines[str(last)] == [0]
    assert any(ids == [0] for ids in found["files"]["cli/plan.py"].values())
    # the interpreter's site-packages is as it was
    assert sorted(site.glob(f"{covermap.HOOK}*")) == before


def test_a_map_made_inside_another_leaves_the_outer_hook_in_place(tmp_path):
    covermap = _script("covermap")
    hook = tmp_path / f"{covermap.HOOK}.pth"
    with covermap.installed_hook(tmp_path):
        assert hook.read_text() == f"import {covermap.HOOK}\n"
        with covermap.installed_hook(tmp_path):  # the covermap test, run by the outer map
            pass
        assert hook.is_file() and (tmp_path / f"{covermap.HOOK}.py").is_file()
    assert list(tmp_path.iterdir()) == []


def test_mapped_tests_are_those_reaching_the_snippet_else_those_reaching_the_module():
    mutants = _script("mutants")
    text = (ROOT / "src" / "opcollect" / "names.py").read_text().splitlines()
    body = next(i for i, line in enumerate(text, 1) if line.startswith("    ") and line.strip())
    covermap = {
        "tests": ["t::a", "t::b", "t::c", None],
        "files": {"names.py": {str(body): [1], str(body + 1): [2, 3], "1": []}},
    }
    assert mutants.mapped_tests(covermap, "names.py", text[body - 1]) == ("t::b",)
    two_lines = text[body - 1] + "\n" + text[body]
    assert mutants.mapped_tests(covermap, "names.py", two_lines) == ("t::b", "t::c")  # a failed test (None) is left out
    assert mutants.mapped_tests(covermap, "names.py", text[0]) == ("t::b", "t::c")  # import-time line: whole module
    assert mutants.mapped_tests(covermap, "flags.py", "import") == ()  # a module no test reaches


def test_mapped_tests_run_the_modules_own_files_first_then_the_cheapest_files_first():
    mutants = _script("mutants")
    own = mutants.covering_tests("tables/noise.py")[0]
    tests = [f"{own}::slow", "tests/test_b.py::x", "tests/test_a.py::y", "tests/test_a.py::z", f"{own}::fast"]
    seconds = {"tests/test_a.py::y": 3.0, "tests/test_a.py::z": 4.0, "tests/test_b.py::x": 5.0, f"{own}::slow": 60.0}
    covermap = {"tests": tests, "files": {"tables/noise.py": {"1": [0, 1, 2, 3, 4]}}, "seconds": seconds}
    # test_a's two tests took 7 s together, test_b's one 5 s: a file's tests stay together, the cheaper file first
    expected = (f"{own}::fast", f"{own}::slow", "tests/test_b.py::x", "tests/test_a.py::y", "tests/test_a.py::z")
    assert mutants.mapped_tests(covermap, "tables/noise.py", "import") == expected
    del covermap["seconds"]  # a map without durations: by name
    assert mutants.mapped_tests(covermap, "tables/noise.py", "import")[2:] == tuple(sorted(tests[1:4]))


def test_a_mapped_mutant_that_passes_runs_its_tests_files_and_its_modules_importers(tmp_path):
    """Where the mapped tests pass, the wider run holds the files importing the module first, then the mapped
    tests' other files (the slow ones last), with every test that failed in the map's run deselected, and the
    mapped tests too: they have just passed."""
    mutants = _script("mutants")
    text = (ROOT / "src" / "opcollect" / "tables" / "noise.py").read_text().splitlines()
    body = next(i for i, line in enumerate(text, 1) if line.startswith("    ") and line.strip())
    covermap = {
        "tests": ["tests/test_slurm.py::t", "tests/test_merge.py::a", "tests/test_compare.py::b"],
        "files": {"tables/noise.py": {str(body): [0, 1, 2]}},
        "failed": ["tests/test_compare.py::b"],
    }
    (tmp_path / "map.json").write_text(json.dumps(covermap))
    entry = {"name": "n", "path": "tables/noise.py", "old": text[body - 1], "new": text[body - 1] + "  # x"}
    (tmp_path / "blind.json").write_text(json.dumps([entry]))
    [mutant] = mutants.blind_mutants(tmp_path / "blind.json", tmp_path / "map.json")
    assert mutant.tests == ("tests/test_merge.py::a", "tests/test_slurm.py::t")  # the failed test left out
    own = mutants.covering_tests("tables/noise.py")
    assert "tests/test_compare_noise.py" in own
    deselected = ("--deselect=tests/test_compare.py::b", *(f"--deselect={t}" for t in mutant.tests))
    assert mutant.wider == (*own, "tests/test_merge.py", "tests/test_slurm.py", *deselected)
    [unmapped] = mutants.blind_mutants(tmp_path / "blind.json")
    assert unmapped.wider == () and unmapped.tests == own


def test_a_packages_init_is_covered_by_the_test_files_importing_the_package():
    """A test file's imports run at collection, outside every test's coverage context: the map charges a package's
    __init__ lines to the few tests that import it in a child process, so its own importers must be found by name."""
    mutants = _script("mutants")
    own = mutants.covering_tests("backends/sglang/__init__.py")
    assert "tests/test_sglang_dsv4.py" in own and "tests/test_sglang_dsa.py" in own
    assert "tests/test_merge.py" not in own


def test_mapped_mutants_run_cheapest_first_by_the_maps_durations(tmp_path):
    mutants = _script("mutants")
    text = (ROOT / "src" / "opcollect" / "tables" / "noise.py").read_text().splitlines()
    body = [i for i, line in enumerate(text, 1) if line.startswith("    ") and line.strip()][:3]
    covermap = {
        "tests": ["tests/test_merge.py::slow", "tests/test_merge.py::fast", "tests/test_compare.py::b"],
        "files": {"tables/noise.py": {str(body[0]): [0, 2], str(body[1]): [1], str(body[2]): [2]}},
        "seconds": {"tests/test_merge.py::slow": 9.0, "tests/test_merge.py::fast": 0.5, "tests/test_compare.py::b": 1},
    }
    (tmp_path / "map.json").write_text(json.dumps(covermap))
    entries = [
        {"name": str(i), "path": "tables/noise.py", "old": text[b - 1], "new": text[b - 1] + "  # x"}
        for i, b in enumerate(body)
    ]
    (tmp_path / "blind.json").write_text(json.dumps(entries))
    found = mutants.blind_mutants(tmp_path / "blind.json", tmp_path / "map.json")
    assert [mutant.name for mutant in found] == ["1", "2", "0"]  # 0.5 s, 1 s, 10 s


def test_a_module_that_runs_only_as_a_copy_is_tried_on_the_tests_reaching_the_line_that_copies_it(tmp_path):
    """release/data_api.py runs as the data wheel's __init__, outside the measured tree: the map holds none of its
    lines, so its mutants run the tests that reach the line of release/package.py naming it."""
    mutants = _script("mutants")
    package = (ROOT / "src" / "opcollect" / "release" / "package.py").read_text().splitlines()
    copying = next(i for i, line in enumerate(package, 1) if '"data_api.py"' in line)
    covermap = {
        "tests": ["tests/test_release.py::builds", "tests/test_release.py::other"],
        "files": {"release/package.py": {str(copying): [0], "1": [1]}},
    }
    (tmp_path / "map.json").write_text(json.dumps(covermap))
    api = (ROOT / "src" / "opcollect" / "release" / "data_api.py").read_text()
    entry = {"name": "n", "path": "release/data_api.py", "old": "def verify()", "new": "def verify_()"}
    assert api.count(entry["old"]) == 1
    (tmp_path / "blind.json").write_text(json.dumps([entry]))
    [mutant] = mutants.blind_mutants(tmp_path / "blind.json", tmp_path / "map.json")
    assert mutant.tests == ("tests/test_release.py::builds",)
    assert mutants.copied_module_tests(covermap, "flags.py") == ()  # a module nothing copies


def test_a_round_with_results_appends_each_verdict_and_resumes_without_rerunning_a_recorded_mutant(tmp_path, capsys):
    """--results FILE: a mutant the file holds with the same snippet and replacement is not run again and its
    verdict counts; one recorded with another replacement (edited since) runs anew and its verdict is appended."""
    mutants = _script("mutants")
    text = (ROOT / "src" / "opcollect" / "tables" / "noise.py").read_text().splitlines()
    body = next(i for i, line in enumerate(text, 1) if line.startswith("    ") and line.strip())
    line = text[body - 1]
    test = "tests/test_compare_noise.py::test_overlapping_intervals_are_never_a_change"
    (tmp_path / "map.json").write_text(json.dumps({"tests": [test], "files": {"tables/noise.py": {str(body): [0]}}}))
    recorded = {"name": "kept", "path": "tables/noise.py", "old": line, "new": line + "  # kept"}
    edited = {"name": "edited", "path": "tables/noise.py", "old": line, "new": line + " +"}  # a syntax error
    (tmp_path / "blind.json").write_text(json.dumps([recorded, edited]))
    results = tmp_path / "results.jsonl"
    stale = {**edited, "new": line + "  # before the edit"}
    results.write_text("".join(json.dumps({**e, "verdict": "MISSED"}) + "\n" for e in (recorded, stale)))
    argv = ["--blind", str(tmp_path / "blind.json"), "--map", str(tmp_path / "map.json"), "--results", str(results)]

    assert mutants.main(argv) == 0
    out = capsys.readouterr().out
    assert re.search(rf"^MISSED +kept +\(recorded in {re.escape(str(results))}\)$", out, re.M)  # not run
    assert "caught    edited" in out and "caught 1 / planted 2 (50%)" in out, out
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(lines) == 3 and lines[2]["name"] == "edited" and lines[2]["verdict"] == "caught"
    assert mutants.recorded(results)["edited"]["new"] == edited["new"]

    assert mutants.main(argv) == 0  # nothing left to run: the score is the file's
    out = capsys.readouterr().out
    assert "caught    edited" in out and "(recorded in" in out and "caught 1 / planted 2 (50%)" in out
    assert len(results.read_text().splitlines()) == 3

    results.write_text("not json\n")
    with pytest.raises(SystemExit, match=r"results.jsonl:1: not a JSON line"):
        mutants.main(argv)


def test_mutants_whose_tests_use_the_docker_engine_are_told_apart():
    """Two such mutants at once raced on the one engine (one's image prune removed the other's images)."""
    mutants = _script("mutants")
    assert mutants.uses_engine(("tests/test_images.py::test_prune_keeps_the_current_image_and_removes_the_older_one",))
    assert mutants.uses_engine(("tests/test_compare_noise.py", "--deselect=x", "tests/test_images.py"))
    assert not mutants.uses_engine(("tests/test_compare_noise.py", "tests/test_physics.py::t", "--deselect=x"))
