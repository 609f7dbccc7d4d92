"""Nothing lost, nothing escapes: concurrent merges, crafted names, run identity, edited plans, merge targets."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest
from conftest import ROOT, fake_run, run_cli

from opcollect.plans.gemm import GemmCase
from opcollect.project import find_project
from opcollect.runtime.rundir import read_records
from opcollect.tables.merge import merge
from opcollect.tables.provenance import PROVENANCE, read_provenance
from opcollect.tables.sidecar import read_sidecar
from opcollect.tables.verify import verify_tables

DIR = "h200_sxm/gemm/vllm/0.24.0"
LEFT = [GemmCase("bfloat16", m, 4096, 4096) for m in (1, 2, 4)]
RIGHT = [GemmCase("bfloat16", m, 7168, 4096) for m in (8, 16)]
FAST = ["--device", "cpu", "--max-case-seconds", "0.02", "--min-samples", "3"]


def _ids(tables, directory=DIR, table="gemm_perf") -> list[str]:
    return sorted(pq.read_table(tables / directory / f"{table}.parquet", columns=["case_id"])["case_id"].to_pylist())


def _merge_in_child(run_dir, tables, barrier, codes, slot):
    from opcollect.cli import main

    barrier.wait()
    codes[slot] = main(["merge", str(run_dir), "--into", str(tables)])


def test_concurrent_merges_into_one_tables_keep_both_runs(tmp_path):
    """Two merges started together, 20 rounds: the lock serializes them and both runs' rows stay."""
    left = fake_run(tmp_path / "left", LEFT, run_id="left")
    right = fake_run(tmp_path / "right", RIGHT, run_id="right")
    expected = sorted(
        json.loads((left / "plan.json").read_text())["ops"]["gemm"]["case_id"]
        + json.loads((right / "plan.json").read_text())["ops"]["gemm"]["case_id"]
    )
    context = multiprocessing.get_context("fork")
    for round_ in range(20):
        tables = tmp_path / f"tables{round_}"
        barrier = context.Barrier(2)
        codes = context.Array("i", [-1, -1])
        children = [
            context.Process(target=_merge_in_child, args=(run, tables, barrier, codes, slot))
            for slot, run in enumerate((left, right))
        ]
        for child in children:
            child.start()
        for child in children:
            child.join(120)
        assert list(codes) == [0, 0], round_
        assert _ids(tables) == expected, round_
        assert verify_tables(tables).clean
        events = read_provenance(tables / "h200_sxm/gemm/vllm/0.24.0" / PROVENANCE).tables["gemm_perf"].events
        assert sorted(e.run_id for e in events) == ["left", "right"]


def test_a_held_lock_makes_merge_wait_naming_the_holder_or_refuse(tmp_path):
    from opcollect.tables.store import locked

    run = fake_run(tmp_path / "run", LEFT)
    tables = tmp_path / "tables"
    with locked(tables, say=lambda _: None):
        refused = run_cli("merge", str(run), "--into", str(tables), "--no-wait")
        assert refused.returncode == 2
        assert f"{tables}: another merge holds it (pid " in refused.stderr and "drop --no-wait" in refused.stderr
        waiting = subprocess.Popen(
            [sys.executable, "-m", "opcollect", "merge", str(run), "--into", str(tables)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(3)
        assert waiting.poll() is None and not tables.exists()  # still waiting, nothing written
    out, err = waiting.communicate(timeout=120)
    assert waiting.returncode == 0, err
    assert f"waiting for the merge into {tables} held by pid " in out
    assert len(_ids(tables)) == len(LEFT)


@pytest.mark.parametrize("value", ["../../../escaped", ".hidden", "a/b", "..", ""])
def test_a_crafted_version_never_becomes_a_path(tmp_path, value):
    run = fake_run(tmp_path / "runs" / "run", LEFT, version=value)
    tables = tmp_path / "runs" / "tables"
    done = run_cli("merge", str(run), "--into", str(tables))
    assert done.returncode == 2, done.stderr
    assert f"runtime field 'version': {value!r} cannot name a directory" in done.stderr
    assert not tables.exists() and sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["run", "run-plan.json"]
    assert not list(tmp_path.rglob("escaped"))


def test_run_json_altered_to_another_backend_is_refused(tmp_path):
    run = fake_run(tmp_path / "run", LEFT)
    identity = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**identity, "backend": "../../x"}))
    done = run_cli("merge", str(run), "--into", str(tmp_path / "tables"))
    assert done.returncode == 2 and "does not describe its plan.json" in done.stderr
    assert not (tmp_path / "tables").exists()


def test_merge_into_a_file_a_foreign_directory_or_a_tampered_tree_is_refused(tmp_path):
    run = fake_run(tmp_path / "run", LEFT)
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine\n")
    done = run_cli("merge", str(run), "--into", str(a_file))
    assert done.returncode == 2 and "is a file, not a TABLES directory" in done.stderr
    assert a_file.read_text() == "mine\n" and sorted(p.name for p in tmp_path.iterdir()) == [
        "notes.txt",
        "run",
        "run-plan.json",
    ]

    foreign = tmp_path / "home"
    foreign.mkdir()
    (foreign / "photo.jpg").write_bytes(b"\xff\xd8")
    done = run_cli("merge", str(run), "--into", str(foreign))
    assert done.returncode == 2 and "without manifest.json is not a TABLES tree" in done.stderr
    assert [p.name for p in foreign.iterdir()] == ["photo.jpg"]

    tables = tmp_path / "tables"
    assert run_cli("merge", str(run), "--into", str(tables)).returncode == 0
    planted = tables / DIR / "planted.parquet"
    planted.write_bytes(b"not ours")
    done = run_cli("merge", str(run), "--into", str(tables))
    assert done.returncode == 2 and "fails verify (unexpected: " in done.stderr
    assert f"unexpected: {DIR}/planted.parquet" in verify_tables(tables).render()  # still caught afterwards
    planted.unlink()
    perf = tables / DIR / "gemm_perf.parquet"
    data = bytearray(perf.read_bytes())
    data[len(data) // 2] ^= 0xFF
    perf.write_bytes(bytes(data))
    done = run_cli("merge", str(run), "--into", str(tables))
    assert done.returncode == 2 and f"fails verify (modified: {DIR}/gemm_perf.parquet)" in done.stderr


def test_garbage_shard_lines_are_counted_in_the_output_and_the_sidecar(tmp_path):
    run = fake_run(tmp_path / "run", LEFT)
    [shard] = list((run / "shards").glob("*.jsonl"))
    with open(shard, "a") as handle:
        handle.write("not json at all\n{}\n[1, 2]\n\n")
    tables = tmp_path / "tables"
    done = run_cli("merge", str(run), "--into", str(tables))
    assert done.returncode == 0, done.stderr
    assert f"{run}: skipped 4 garbage shard lines" in done.stdout
    [event] = read_provenance(tables / DIR / PROVENANCE).tables["gemm_perf"].events
    assert event.garbage_lines == 4 and len(_ids(tables)) == len(LEFT)


def _torch_plan(tmp_path, name, *extra):
    path = tmp_path / f"{name}.json"
    done = run_cli("plan", "--backend", "torch", "--sm", "cpu", "--ops", "gemm", "--smoke", *extra, "-o", str(path))
    assert done.returncode == 0, done.stderr
    return path


def test_shards_have_their_own_identity_and_merge_like_one_run(tmp_path):
    shard0, shard1 = _torch_plan(tmp_path, "s0", "--shard", "0/2"), _torch_plan(tmp_path, "s1", "--shard", "1/2")
    whole = _torch_plan(tmp_path, "whole")
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    assert run_cli("run", "--plan", str(shard0), "--out", str(a), *FAST).returncode == 0
    refused = run_cli("run", "--plan", str(shard1), "--out", str(a), "--resume", *FAST)
    assert refused.returncode == 2
    assert " shard 0/2 (gemm smoke), not plan_hash " in refused.stderr and " shard 1/2 (gemm smoke)" in refused.stderr
    assert run_cli("run", "--plan", str(shard1), "--out", str(b), *FAST).returncode == 0
    assert run_cli("run", "--plan", str(whole), "--out", str(c), *FAST).returncode == 0
    assert {r["case_id"] for r in read_records(a)}.isdisjoint({r["case_id"] for r in read_records(b)})
    sharded, single = tmp_path / "sharded", tmp_path / "single"
    assert run_cli("merge", str(a), str(b), "--into", str(sharded)).returncode == 0
    assert run_cli("merge", str(c), "--into", str(single)).returncode == 0
    directory = next(p.parent for p in sharded.rglob("gemm_perf.parquet")).relative_to(sharded)
    keys = ["gemm_dtype", "m", "n", "k", "case_id", "kernel_source"]
    assert (
        pq.read_table(sharded / directory / "gemm_perf.parquet", columns=keys).to_pylist()
        == pq.read_table(single / directory / "gemm_perf.parquet", columns=keys).to_pylist()
    )
    assert _ids(sharded, directory, ".opcollect/gemm_plan") == _ids(single, directory, ".opcollect/gemm_plan")
    meta = read_sidecar(sharded / directory / "collection_meta.yaml").tables["gemm_perf"]
    assert meta.status == "complete" and meta.rows == len(_ids(single, directory))
    assert len(meta.collections) == 2  # one per shard's run


def _edit_plan(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    "change, needle",
    [
        (lambda d: d["ops"]["gemm"]["columns"]["m"].__setitem__(0, 7), "field 'ops.gemm.columns': case gemm:"),
        (lambda d: d.update(plan_hash="0" * 64), "field 'plan_hash': differs from the hash of the cases"),
        (lambda d: d["ops"]["gemm"]["dispatch"].__setitem__(0, "other"), "field 'plan_hash': differs"),
        (lambda d: d["selection"].update(smoke=False), "field 'content_hash': differs"),
        (lambda d: d.update(sm="90"), "field 'plan_hash': differs"),
    ],
)
def test_an_edited_plan_file_is_refused(tmp_path, change, needle):
    plan = _torch_plan(tmp_path, "plan")
    _edit_plan(plan, change)
    done = run_cli("run", "--plan", str(plan), "--out", str(tmp_path / "run"), *FAST)
    assert done.returncode == 2 and needle in done.stderr, done.stderr
    assert "the plan was edited or is damaged, re-plan" in done.stderr and not (tmp_path / "run").exists()


def test_collect_out_of_another_selection_is_refused(tmp_path):
    out, tables = tmp_path / "run", tmp_path / "tables"
    common = ["collect", "torch", "--local", "--smoke", "--out", str(out), "--tables", str(tables), *FAST]
    assert run_cli(*common, "--ops", "gemm").returncode == 0
    before = sorted(p.name for p in out.rglob("*"))
    done = run_cli(*common, "--ops", "attention_context")
    assert done.returncode == 2
    assert "(gemm smoke), this collection is plan_hash " in done.stderr and "(attention_context smoke)" in done.stderr
    assert sorted(p.name for p in out.rglob("*")) == before
    again = run_cli(*common, "--ops", "gemm")  # the same selection resumes: nothing left to measure
    assert again.returncode == 0 and "measured 0 this run" in again.stdout


def test_a_shard_is_part_of_the_identity_even_when_it_holds_every_case(planner):
    from opcollect.plans.planfile import to_json
    from opcollect.plans.planner import PlanOptions

    whole = to_json(planner.plan("torch", "cpu", PlanOptions(ops=("gemm",), smoke=True)))
    single = to_json(planner.plan("torch", "cpu", PlanOptions(ops=("gemm",), smoke=True, shard=(0, 1))))
    assert whole["ops"]["gemm"]["case_id"] == single["ops"]["gemm"]["case_id"]
    assert whole["plan_hash"] == single["plan_hash"] and whole["content_hash"] != single["content_hash"]


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs: a real file system that fills (root with CAP_SYS_ADMIN, as in CI)."""
    target = tmp_path / "disk"
    target.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "opcollect-test", str(target)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs ({done.stderr.decode().strip()}): needs root, as in CI")
    yield target
    subprocess.run(["umount", "-l", str(target)], capture_output=True)


def _fill(directory) -> None:
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:  # ENOSPC: the disk is full to the last page
        pass
    finally:
        os.close(fd)


def test_a_disk_that_fills_during_a_run_stops_it_in_one_line_and_it_resumes_when_space_is_back(tmp_path, small_disk):
    from conftest import gemm_plan

    shapes = [(m, n, 16) for m in (1, 2, 3, 4, 5, 6) for n in (8, 16, 24, 32, 40)]
    plan = gemm_plan(tmp_path / "plan.json", shapes)
    run_dir = small_disk / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "opcollect", "run", "--plan", str(plan), "--out", str(run_dir), *FAST],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if (run_dir / "shards").is_dir() and len(read_records(run_dir)) >= 3:
            break
        time.sleep(0.02)
    _fill(small_disk)
    out, err = proc.communicate(timeout=120)
    recorded = len(read_records(run_dir))
    assert proc.returncode == 2 and recorded < len(shapes), (proc.returncode, recorded, err[-2000:])
    errors = [line for line in err.splitlines() if not line.startswith("[opcollect] ")]  # progress lines
    assert "Traceback" not in err and len(errors) == 1
    assert errors[0].startswith(f"opcollect: error: --out {run_dir}: no space left on the device")
    (small_disk / "filler").unlink()
    done = run_cli("run", "--plan", str(plan), "--out", str(run_dir), "--resume", *FAST)
    assert done.returncode == 0, done.stderr[-2000:]
    counts = {}
    for record in read_records(run_dir):
        counts[record["case_id"]] = counts.get(record["case_id"], 0) + 1
    assert len(counts) == len(shapes) and set(counts.values()) == {1}


# --- one writer for files we create; TABLES holds no links (issue 21: D3, D4, D5, D16, D22, D39, D41) -----


def _merged(tmp_path, name="tables"):
    from opcollect.project import find_project
    from opcollect.tables.merge import merge

    run = fake_run(tmp_path / f"run-{name}", LEFT)
    merge([run], tmp_path / name, find_project())
    return tmp_path / name


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o002, 0o664)])
def test_tables_and_manifest_are_as_readable_as_the_umask_says(tmp_path, umask, mode):
    """D16: a group sharing TABLES reads it (mkstemp made every file 0600 whatever the umask)."""
    previous = os.umask(umask)
    try:
        tables = _merged(tmp_path)
    finally:
        os.umask(previous)
    modes = {p.relative_to(tables).as_posix(): p.stat().st_mode & 0o777 for p in tables.rglob("*") if p.is_file()}
    assert "manifest.json" in modes and f"{DIR}/gemm_perf.parquet" in modes
    assert set(modes.values()) == {mode}, modes


def test_the_writer_replaces_a_planted_link_and_leaves_its_target_alone(tmp_path):
    from opcollect.files import write_atomic

    outside = tmp_path / "outside.txt"
    outside.write_text("precious\n")
    target = tmp_path / "out" / "p.json"
    target.parent.mkdir()
    target.symlink_to(outside)
    write_atomic(target, "{}\n")
    assert outside.read_text() == "precious\n"
    assert not target.is_symlink() and target.read_text() == "{}\n"


def test_a_write_error_names_the_target_and_its_flag_never_the_temporary_file(tmp_path, monkeypatch):
    """D41: EACCES named '/…/.p.json.hccttx91.tmp'; as root no directory refuses, so os.open refuses here."""
    import argparse
    import errno

    from opcollect import files
    from opcollect.flags import fs_error

    target = tmp_path / "p.json"

    def refuse(path, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(files.os, "open", refuse)
    with pytest.raises(PermissionError) as caught:
        files.write_atomic(target, "{}")
    assert caught.value.filename == str(target)
    line = fs_error(caught.value, argparse.Namespace(output=target, verb="plan"))
    assert line == f"-o {target}: permission denied; choose a path you may use, or fix its permissions"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name, code", [("a" * 256 + ".json", "ENAMETOOLONG"), ("\ud800.json", "EILSEQ")])
def test_a_name_the_file_system_cannot_hold_is_refused_before_writing(tmp_path, name, code):
    import errno

    from opcollect.files import write_atomic

    with pytest.raises(OSError) as caught:
        write_atomic(tmp_path / "sub" / name, "{}")
    assert caught.value.errno == getattr(errno, code) and caught.value.filename == str(tmp_path / "sub" / name)
    assert list(tmp_path.iterdir()) == []  # refused before the directory was made


def test_a_symlinked_directory_leaving_tables_is_seen_by_verify_and_refused_by_merge(tmp_path):
    """D4: `cpu/gemm/torch/2.13.1 -> /elsewhere` was invisible to verify (rglob does not enter it)."""
    tables = _merged(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "gemm_perf.parquet").write_bytes(b"x")
    link = tables / "cpu" / "gemm" / "torch" / "2.13.1"
    link.parent.mkdir(parents=True)
    link.symlink_to(elsewhere)
    report = verify_tables(tables)
    assert not report.clean and f"symbolic link (not followed): cpu/gemm/torch/2.13.1 -> {elsewhere}" in report.render()
    done = run_cli("verify", str(tables))
    assert done.returncode == 1 and "symbolic link (not followed): cpu/gemm/torch/2.13.1" in done.stdout
    done = run_cli("check", str(tables))  # check sees it too: the consumer's walk would read it
    assert (
        done.returncode == 1
        and "R5" in done.stdout
        and "symbolic link (not followed): cpu/gemm/torch/2.13.1" in done.stdout
    )
    run = fake_run(tmp_path / "again", LEFT)
    done = run_cli("merge", str(run), "--into", str(tables))
    assert done.returncode == 2 and "fails verify (symbolic link (not followed): cpu/gemm/torch/2.13.1" in done.stderr
    assert link.is_symlink() and [p.name for p in elsewhere.iterdir()] == ["gemm_perf.parquet"]


def test_a_table_file_linked_outside_is_never_followed_even_with_its_hash_in_the_manifest(tmp_path):
    """D5: a perf file that is a link to an outside file with the right sha256 verified, and was packaged."""
    tables = _merged(tmp_path)
    perf = tables / DIR / "gemm_perf.parquet"
    outside = tmp_path / "outside.parquet"
    outside.write_bytes(perf.read_bytes())
    perf.unlink()
    perf.symlink_to(outside)
    report = verify_tables(tables)
    assert not report.clean and report.missing == [] and report.modified == []
    assert report.links == [f"{DIR}/gemm_perf.parquet -> {outside}"]


def test_merge_into_a_link_to_tables_updates_the_tree_it_points_to(tmp_path):
    """D22: the exchange swapped the link itself, then rmtree refused it, and `.X.staging-*` stayed."""
    tables = _merged(tmp_path, "tables-2026")
    current = tmp_path / "current"
    current.symlink_to(tables)
    run = fake_run(tmp_path / "right", RIGHT, run_id="right")
    done = run_cli("merge", str(run), "--into", str(current))
    assert done.returncode == 0, done.stderr
    assert current.is_symlink() and current.resolve() == tables.resolve()
    assert len(_ids(tables)) == len(LEFT) + len(RIGHT) and verify_tables(tables).clean
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == [".tables-2026.lock"]


def test_compare_plot_replaces_a_planted_link(tmp_path):
    """D3 (compare --plot): matplotlib's savefig wrote through a link planted at the .png path."""
    tables = _merged(tmp_path)
    outside = tmp_path / "outside.png"
    outside.write_bytes(b"precious")
    plot = tmp_path / "ratio.png"
    plot.symlink_to(outside)
    done = run_cli("compare", str(tables), str(tables), "--plot", str(plot))
    assert done.returncode == 0, done.stderr
    assert outside.read_bytes() == b"precious" and not plot.is_symlink() and plot.read_bytes()[:4] == b"\x89PNG"


def test_verify_owns_the_manifest_and_imports_no_store():
    """Housekeeping: tables/store.py and tables/verify.py imported each other."""
    code = "import sys, opcollect.tables.verify; print('opcollect.tables.store' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr


def test_merge_into_an_empty_directory_makes_it_tables(tmp_path):
    tables = tmp_path / "tables"
    tables.mkdir()
    merge([fake_run(tmp_path / "run", LEFT)], tables, find_project())
    assert verify_tables(tables).clean and len(_ids(tables)) == len(LEFT)


def test_a_kill_between_the_fallback_renames_is_undone_by_the_next_merge(tmp_path):
    """Where the file system cannot exchange, commit renames TABLES to .TABLES.old-* and staging to TABLES; a kill
    between the two leaves no TABLES: the next merge puts the old tree back first and drops killed staging."""
    tables = tmp_path / "tables"
    merge([fake_run(tmp_path / "left", LEFT)], tables, find_project())
    tables.rename(tmp_path / ".tables.old-0123abcd")
    (tmp_path / ".tables.staging-4567cdef" / DIR).mkdir(parents=True)
    merge([fake_run(tmp_path / "right", RIGHT, run_id="r2")], tables, find_project())
    assert len(_ids(tables)) == len(LEFT) + len(RIGHT) and verify_tables(tables).clean
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".tables")) == [".tables.lock"]


def test_a_write_that_fails_midway_leaves_the_old_file_and_no_temporary_one(tmp_path):
    """A file size limit (RLIMIT_FSIZE, which a full disk acts like) stops the write after the temporary file is
    made: the error names the target, the target keeps its old bytes and the temporary file is gone. In a child
    process, so the limit binds nothing else."""
    target = tmp_path / "p.json"
    target.write_text("old\n")
    code = (
        "import errno, resource, sys\n"
        "from opcollect.files import write_atomic\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (16, 16))\n"
        "try:\n"
        "    write_atomic(sys.argv[1], 'x' * 100)\n"
        "except OSError as exc:\n"
        "    print(errno.errorcode[exc.errno], exc.filename)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == f"EFBIG {target}\n", done.stdout + done.stderr
    assert target.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["p.json"]


def test_a_file_system_error_is_named_by_its_flag_its_file_or_its_command(tmp_path):
    import argparse
    import errno

    from opcollect.flags import fs_error

    plan = argparse.Namespace(output=None, verb="plan")
    assert fs_error(OSError(errno.EPERM, "Operation not permitted", "/x"), plan) is None  # not one it words
    missing = OSError(errno.ENOENT, "No such file or directory", str(tmp_path / "cases.yaml"))
    assert fs_error(missing, plan) == f"{tmp_path / 'cases.yaml'}: no such file or directory; check the path"
    full = OSError(errno.ENOSPC, "No space left on device")  # no file named, no output flag given
    assert fs_error(full, argparse.Namespace(verb="merge")) == (
        "opcollect merge: no space left on the device; free space there, or choose a directory on another file system"
    )


def test_a_file_system_error_is_blamed_on_a_flag_only_for_its_own_path_its_contents_or_its_parents(tmp_path):
    import argparse
    import errno

    from opcollect.flags import fs_error

    out = tmp_path / "out"
    args = argparse.Namespace(out=out, verb="run")
    what, fix = "permission denied", "choose a path you may use, or fix its permissions"
    inside, parent, sibling = out / "shards" / "w0.jsonl", tmp_path, tmp_path / "out2" / "plan.json"

    def denied(path):
        return fs_error(OSError(errno.EACCES, "Permission denied", str(path)), args)

    assert denied(inside) == f"--out {out}: {what} (at {inside}); {fix}"
    assert denied(parent) == f"--out {out}: {what} (at {parent}); {fix}"
    # a sibling whose name begins with the flag's is another path: it is named itself, not blamed on --out
    assert denied(sibling) == f"{sibling}: {what}; {fix}"


def test_a_working_directory_that_is_gone_is_no_entry_of_the_path(tmp_path, monkeypatch):
    from opcollect.safepath import working_directory_entry

    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    assert working_directory_entry([str(gone), "/usr/lib"]) is True
    gone.rmdir()
    assert working_directory_entry([str(gone), "/usr/lib"]) is False
