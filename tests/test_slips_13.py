"""Behaviours of the release, tables-store and runtime-progress modules that no earlier test held: each test here
fails with a small plausible bug planted in the function it names. The release is built here without its venv
check (verify_wheel stands in), so nothing is installed."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import sys
import tarfile
import threading
import zipfile
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import fake_run

from opcollect.errors import InputError
from opcollect.plans.gemm import GemmCase
from opcollect.project import find_project
from opcollect.release import cut as release_cut
from opcollect.release import package
from opcollect.release import verify as release_verify
from opcollect.runtime import progress as progress_mod
from opcollect.tables import store
from opcollect.tables.merge import merge
from opcollect.tables.verify import MANIFEST, listed_files, read_manifest_files, verify_tables

DIR = "h200_sxm/gemm/vllm/0.24.0"
CASES = [GemmCase("bfloat16", m, 1024, 1024) for m in (1, 8)]


@pytest.fixture(scope="module")
def merged(tmp_path_factory) -> Path:
    """A TABLES tree of one vllm gemm run (read only: tests that change it copy it)."""
    base = tmp_path_factory.mktemp("merged")
    tables = base / "tables"
    merge([fake_run(base / "run", CASES)], tables, find_project(), say=lambda line: None)
    return tables


# ---- release/package.py ---------------------------------------------------------------------------------------


def test_index_lists_only_tables_on_disk_with_system_backend_version_and_sidecar(tmp_path):
    """package.index: one entry per sidecar table whose parquet is there, sorted, system the first path part."""
    (tmp_path / "b200/gemm/sglang/0.5").mkdir(parents=True)
    (tmp_path / "b200/gemm/sglang/0.5/moe_perf.parquet").write_bytes(b"x")
    (tmp_path / "b200/gemm/sglang/0.5/gemm_perf.parquet").write_bytes(b"x")
    (tmp_path / "a100/gemm/vllm/1.0").mkdir(parents=True)
    (tmp_path / "a100/gemm/vllm/1.0/gemm_perf.parquet").write_bytes(b"x")
    metas = {
        "b200/gemm/sglang/0.5/collection_meta.yaml": {
            "runtime": {"framework": "sglang", "version": "0.5"},
            "tables": {"moe_perf": {}, "gemm_perf": {}, "absent_perf": {}},
        },
        "a100/gemm/vllm/1.0/collection_meta.yaml": {"runtime": {"framework": "vllm", "version": "1.0"}, "tables": {}},
    }
    done = package.index(tmp_path, metas)
    assert done["sidecars"] is metas
    assert done["tables"] == [
        {
            "system": "b200",
            "backend": "sglang",
            "version": "0.5",
            "table": table,
            "path": f"b200/gemm/sglang/0.5/{table}.parquet",
            "sidecar": "b200/gemm/sglang/0.5/collection_meta.yaml",
        }
        for table in ("gemm_perf", "moe_perf")
    ]


def test_package_files_hold_the_tree_an_index_notices_and_a_manifest_of_the_rest(merged):
    """package.package_files: data/ is every tree file and manifest.json; MANIFEST.json hashes every other file."""
    files, frameworks = package.package_files(merged, "1.2.3")
    assert frameworks == ["vllm"]
    tree = [*listed_files(merged), MANIFEST]
    assert f"{DIR}/collection_meta.yaml" in tree
    extra = ["index.json", "THIRD_PARTY_NOTICES", "__init__.py", "__main__.py", "MANIFEST.json"]
    assert sorted(files) == sorted(
        [f"opcollect_tables/data/{rel}" for rel in tree] + [f"opcollect_tables/{n}" for n in extra]
    )
    for rel in tree:
        assert files[f"opcollect_tables/data/{rel}"] == (merged / rel).read_bytes(), rel
    assert set(package.sidecars(merged)) == {f"{DIR}/collection_meta.yaml"}
    index = json.loads(files["opcollect_tables/index.json"])
    assert [(e["system"], e["backend"], e["version"], e["table"]) for e in index["tables"]] == [
        ("h200_sxm", "vllm", "0.24.0", "gemm_perf")
    ]
    assert "\n- vLLM (Apache-2.0)\n" in files["opcollect_tables/THIRD_PARTY_NOTICES"].decode()
    assert files["opcollect_tables/__init__.py"] == (Path(package.__file__).parent / "data_api.py").read_bytes()
    manifest = json.loads(files["opcollect_tables/MANIFEST.json"])["files"]
    assert manifest == {
        name.split("/", 1)[1]: hashlib.sha256(data).hexdigest()
        for name, data in files.items()
        if name != "opcollect_tables/MANIFEST.json"
    }


def test_build_names_the_wheel_and_sdist_and_writes_their_metadata(merged, tmp_path):
    """package.build: <pkg>-<version>-py3-none-any.whl with dist-info METADATA; an sdist with pyproject and PKG-INFO."""
    wheel, sdist, files = package.build(merged, tmp_path / "out", "1.2.3", 1_700_000_000)
    assert (wheel, sdist) == (
        tmp_path / "out/opcollect_tables-1.2.3-py3-none-any.whl",
        tmp_path / "out/opcollect_tables-1.2.3.tar.gz",
    )
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = archive.read("opcollect_tables-1.2.3.dist-info/METADATA").decode()
        assert archive.read("opcollect_tables-1.2.3.dist-info/top_level.txt") == b"opcollect_tables\n"
    assert set(files) <= names and "opcollect_tables-1.2.3.dist-info/WHEEL" in names
    assert "Name: opcollect-tables\nVersion: 1.2.3\n" in metadata
    assert "Summary: Operator-latency tables collected by opcollect (vllm)\n" in metadata
    with tarfile.open(sdist) as archive:
        names = set(archive.getnames())
        pyproject = archive.extractfile("opcollect_tables-1.2.3/pyproject.toml").read().decode()
        info = archive.extractfile("opcollect_tables-1.2.3/PKG-INFO").read().decode()
    assert {f"opcollect_tables-1.2.3/src/{name}" for name in files} <= names
    assert 'name = "opcollect-tables"\nversion = "1.2.3"\n' in pyproject and "Version: 1.2.3\n" in info
    with pytest.raises(InputError, match="not a release version"):
        package.build(merged, tmp_path / "bad", "v1", 1_700_000_000)


# ---- release/cut.py -------------------------------------------------------------------------------------------


def test_check_out_refuses_a_file_the_tables_or_a_place_inside_them_only(tmp_path):
    """cut.check_out: --out a file, --tables itself or below it is refused; a sibling sharing a prefix is not."""
    tables = tmp_path / "tables"
    (tables / "sub").mkdir(parents=True)
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(InputError, match="is a file; give a directory"):
        release_cut.check_out(tables, tmp_path / "a_file")
    for inside in (tables, tables / "sub", tables / "sub" / "new" / "dist"):
        with pytest.raises(InputError, match="is inside --tables"):
            release_cut.check_out(tables, inside)
    release_cut.check_out(tables, tmp_path / "tables2")
    release_cut.check_out(tables, tmp_path)  # the tables' parent holds them; it is not inside them
    release_cut.check_out(tables, tmp_path / "dist")


def test_refuse_unsound_names_the_first_verify_difference(merged, tmp_path):
    """cut.refuse_unsound: a tree that verifies passes; a modified file is refused naming it."""
    tables = shutil.copytree(merged, tmp_path / "tables")
    release_cut.refuse_unsound(tables)
    perf = tables / DIR / "gemm_perf.parquet"
    data = bytearray(perf.read_bytes())
    data[len(data) // 2] ^= 1
    perf.write_bytes(bytes(data))
    with pytest.raises(InputError, match=rf"fails verify \(modified: {DIR}/gemm_perf.parquet\); restore"):
        release_cut.refuse_unsound(tables)


def _verified(calls):
    def verify_wheel(wheel):
        calls.append(sorted(p.name for p in wheel.parent.iterdir()))
        return release_verify.Installed(True, "verified")

    return verify_wheel


def test_cut_moves_the_three_verified_files_into_out_and_dates_the_version(merged, tmp_path, monkeypatch):
    """cut.cut: version from the epoch's UTC date, unpadded; wheel, sdist and statement end in --out, staging gone."""
    calls: list = []
    monkeypatch.setattr(release_cut, "verify_wheel", _verified(calls))
    epoch = int(datetime(2026, 1, 5, 23, 30, tzinfo=timezone.utc).timestamp())
    out = tmp_path / "dist"
    done = release_cut.cut(merged, out, None, epoch, find_project())
    names = ["opcollect_tables-2026.1.5-py3-none-any.whl", "opcollect_tables-2026.1.5.tar.gz"]
    names.append(names[0] + ".intoto.json")
    assert calls == [sorted(names)]  # verified while still in staging, all three already written
    assert sorted(p.name for p in out.iterdir()) == sorted(names)
    assert (done.wheel, done.sdist, done.statement) == tuple(out / n for n in names)
    assert (done.version, done.epoch, done.installed) == ("2026.1.5", epoch, release_cut.Installed(True, "verified"))
    assert done.packaged == len(package.package_files(merged, "2026.1.5")[0])
    statement = json.loads(done.statement.read_text())
    assert statement["subject"][0]["digest"]["sha256"] == hashlib.sha256(done.wheel.read_bytes()).hexdigest()


def test_cut_that_fails_verification_leaves_no_file_and_drops_an_out_it_made(merged, tmp_path, monkeypatch):
    """cut.cut: on an error the staging goes; --out goes too when the release made it, stays when it was there."""

    def broken(wheel):
        raise InputError("no pip")

    monkeypatch.setattr(release_cut, "verify_wheel", broken)
    made = tmp_path / "made"
    with pytest.raises(InputError, match="no pip"):
        release_cut.cut(merged, made, "1.0.0", 1_700_000_000, find_project())
    assert not made.exists()
    there = tmp_path / "there"
    there.mkdir()
    with pytest.raises(InputError, match="no pip"):
        release_cut.cut(merged, there, "1.0.0", 1_700_000_000, find_project())
    assert there.is_dir() and list(there.iterdir()) == []


# ---- release/verify.py ----------------------------------------------------------------------------------------


def test_run_group_runs_in_cwd_in_its_own_session_and_keeps_both_streams(tmp_path):
    """verify.run_group: the child runs in cwd with TMPDIR=cwd, leads a new session; stdout and stderr apart."""
    code = (
        "import os, sys; print(os.getcwd()); print(os.environ['TMPDIR']); print(os.getsid(0) == os.getpid()); "
        "sys.stderr.write('oops'); sys.exit(3)"
    )
    done = release_verify.run_group([sys.executable, "-c", code], str(tmp_path))
    assert done.returncode == 3 and done.stderr == "oops"
    assert done.stdout.splitlines() == [os.path.realpath(tmp_path), str(tmp_path), "True"]


@pytest.mark.parametrize("code, ok", [(0, True), (1, False), (2, False)])
def test_verify_wheel_installs_the_resolved_wheel_offline_and_reports_the_package_check(
    code, ok, tmp_path, monkeypatch
):
    """verify.verify_wheel: pip installs the wheel's absolute path without index or deps; ok is the check's code 0."""
    commands = []

    def run_group(command, cwd):
        commands.append(command)
        last = command[1:] == ["-I", "-m", "opcollect_tables"]
        return SimpleNamespace(returncode=code if last else 0, stdout=" 3 files \n" if last else "", stderr="bad\n")

    monkeypatch.setattr(release_verify, "run_group", run_group)
    monkeypatch.chdir(tmp_path)
    installed = release_verify.verify_wheel(Path("x.whl"))
    assert installed == release_verify.Installed(ok, "3 files \nbad")
    assert [c[1:] for c in commands] == [
        ["-Im", "ensurepip", "--upgrade", "--default-pip"],
        ["-m", "pip", "install", "-q", "--no-index", "--no-deps", str(tmp_path.resolve() / "x.whl")],
        ["-I", "-m", "opcollect_tables"],
    ]
    assert len({c[0] for c in commands}) == 1 and commands[0][0].endswith("/venv/bin/python")


# ---- tables/store.py ------------------------------------------------------------------------------------------


def test_recover_puts_back_tables_lost_between_the_renames_and_drops_leftovers(tmp_path):
    """store.recover: TABLES missing beside an .old copy is that copy again; staging and old leftovers go."""
    tables = tmp_path / "tables"
    (tmp_path / ".tables.old-0a0a").mkdir()
    (tmp_path / ".tables.old-0a0a" / "a.txt").write_text("previous")
    (tmp_path / ".tables.staging-1b1b").mkdir()
    (tmp_path / ".other.staging-2c2c").mkdir()  # another tree's: not ours to drop
    store.recover(tables)
    assert (tables / "a.txt").read_text() == "previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.staging-2c2c", "tables"]
    (tmp_path / ".tables.old-3d3d").mkdir()
    (tmp_path / ".tables.old-3d3d" / "a.txt").write_text("older")
    store.recover(tables)  # TABLES is there: the old copy is a leftover, never put over it
    assert (tables / "a.txt").read_text() == "previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.staging-2c2c", "tables"]


def test_locked_names_its_holder_refuses_without_wait_and_releases_on_exit(tmp_path):
    """store.locked: the lock file says only who holds it; a second holder with wait=False is refused; exit frees it."""
    real = tmp_path / "tables-2026"
    real.mkdir()
    link = tmp_path / "current"
    link.symlink_to(real.name)
    lock = store.lock_path(link)
    assert lock == tmp_path / ".tables-2026.lock"
    lock.write_text("stale holder " * 400)
    said = []
    with store.locked(link, say=said.append):
        held = lock.read_text()
        assert held.startswith(f"pid {os.getpid()} on ") and "stale" not in held
        second: list[str] = []  # in a thread, so that a wait=False that waits fails here instead of hanging

        def try_again():
            try:
                with store.locked(real, wait=False, say=second.append):
                    second.append("held")
            except InputError as exc:
                second.append(str(exc))

        thread = threading.Thread(target=try_again, daemon=True)
        thread.start()
        thread.join(20)
        assert not thread.is_alive() and len(second) == 1
        assert re.match(rf".*tables-2026: another merge holds it \(pid {os.getpid()} on .*--no-wait", second[0])
    with store.locked(real, wait=False, say=said.append):
        pass
    assert said == []


def test_check_into_refuses_a_file_a_foreign_directory_and_an_unsound_tree_only_when_verifying(merged, tmp_path):
    """store.check_into: new or empty is fine; a file or a non-empty non-tree is refused; verify=False skips verify."""
    store.check_into(tmp_path / "new")
    (tmp_path / "empty").mkdir()
    store.check_into(tmp_path / "empty")
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(InputError, match="is a file, not a TABLES directory"):
        store.check_into(tmp_path / "a_file")
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "photo.jpg").write_text("x")
    with pytest.raises(InputError, match="without manifest.json is not a TABLES tree"):
        store.check_into(tmp_path / "home")
    tables = shutil.copytree(merged, tmp_path / "tables")
    store.check_into(tables)
    (tables / DIR / "gemm_perf.parquet").write_bytes(b"edited")
    (tables / DIR / "zz.txt").write_text("planted")
    store.check_into(tables, verify=False)
    with pytest.raises(InputError, match=rf"fails verify \(modified: {DIR}/gemm_perf.parquet\); restore it"):
        store.check_into(tables)


def test_staging_commit_rehashes_written_files_keeps_others_and_leaves_a_link_a_link(merged, tmp_path):
    """store.Staging: written files are new (TABLES untouched until commit), the manifest rehashes only them."""
    tables = shutil.copytree(merged, tmp_path / "tables")
    link = tmp_path / "current"
    link.symlink_to("tables")
    before = read_manifest_files(tables)
    meta = f"{DIR}/collection_meta.yaml"
    old_meta = (tables / meta).read_bytes()
    staging = store.Staging(link)
    assert staging.root.parent == tmp_path and staging.root.name.startswith(".tables.staging-")
    staging.write(meta, b"tables: {}\n")
    staging.write("notes/new.txt", b"hello")
    assert (tables / meta).read_bytes() == old_meta  # a hard link replaced, never written through
    staging.commit()
    assert link.is_symlink() and sorted(p.name for p in tmp_path.iterdir()) == ["current", "tables"]
    after = read_manifest_files(tables)
    assert after[meta].sha256 == hashlib.sha256(b"tables: {}\n").hexdigest() and after[meta].size == 11
    assert after["notes/new.txt"].sha256 == hashlib.sha256(b"hello").hexdigest()
    assert {k: v for k, v in after.items() if k not in (meta, "notes/new.txt")} == {
        k: v for k, v in before.items() if k != meta
    }
    assert verify_tables(tables).clean
    fresh = store.Staging(tmp_path / "fresh")
    fresh.write("a.txt", b"a")
    fresh.commit()
    assert read_manifest_files(tmp_path / "fresh")["a.txt"].size == 1 and verify_tables(tmp_path / "fresh").clean


# ---- runtime/progress.py --------------------------------------------------------------------------------------


def test_line_logs_every_five_seconds_or_when_an_op_completes_with_an_eta_from_this_runs_rate(monkeypatch):
    """progress.Progress off a terminal: a line at most every 5 s or at an op's last case; eta from measured cases."""
    now = [100.0]
    monkeypatch.setattr(progress_mod, "time", SimpleNamespace(monotonic=lambda: now[0]))
    stream = io.StringIO()
    progress = progress_mod.Progress({"gemm": 4, "moe": 2}, {"gemm": 1}, stream=stream, terminal=False)
    for at, op, status, error in [
        (110.0, "gemm", "ok", None),  # 2 of 6 done, 1 measured in 10 s: 4 left take 40 s
        (112.0, "gemm", "failed", "oom"),  # 2 s after the last line, gemm not done: no line
        (115.0, "moe", "failed", None),  # 5 s after: a line; 3 measured in 15 s, 2 left: 10 s
        (116.0, "gemm", "ok", None),  # 1 s after, but gemm's last case: 4 measured in 16 s, 1 left: 4 s
    ]:
        now[0] = at
        progress.record(op, status, error)
    progress.close()
    assert stream.getvalue().splitlines() == [
        "[opcollect] gemm: 2/4 done, ok 1, failed 0, eta 40s",
        "[opcollect] moe: 1/2 done, ok 0, failed 1, eta 10s",
        "[opcollect] gemm: 4/4 done, ok 2, failed 1, eta 4s",
    ]
    assert progress.failures_by_class == {"oom": 1, "unexpected": 1}
    assert progress._eta() == "4s"
    assert progress_mod.Progress({"gemm": 1}, {}, stream=stream, terminal=False)._eta() == "?"
