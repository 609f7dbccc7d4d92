"""`opcollect release`: the tables of a smoke collection as a data wheel, installed into a fresh venv where every
hash is verified and the data API answers; built twice, byte-identical; a tampered table refused before any
packaging."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, run_cli


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def smoke_tables(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("release")
    done = run_cli(
        "collect", "torch", "--local", "--device", "cpu", "--smoke", "--ops", "gemm,comm",
        "--out", str(base / "run"), "--tables", str(base / "tables"),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return base / "tables"


def test_release_builds_reproducibly_and_verifies_installed(smoke_tables, tmp_path):
    first = run_cli("release", "--tables", str(smoke_tables), "--out", str(tmp_path / "a"), "--version", "1.0.0")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "installed into a fresh venv: " in first.stdout and "files checked against MANIFEST.json: verified" in (
        first.stdout
    )
    again = run_cli("release", "--tables", str(smoke_tables), "--out", str(tmp_path / "b"), "--version", "1.0.0")
    assert again.returncode == 0
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == [
        "opcollect_tables-1.0.0-py3-none-any.whl",
        "opcollect_tables-1.0.0-py3-none-any.whl.intoto.json",
        "opcollect_tables-1.0.0.tar.gz",
    ]
    for name in names:  # byte-identical builds
        assert _sha(tmp_path / "a" / name) == _sha(tmp_path / "b" / name), name

    wheel = tmp_path / "a" / names[0]
    with zipfile.ZipFile(wheel) as archive:
        listed = archive.namelist()
        assert listed == sorted(listed)
        assert {i.date_time for i in archive.infolist()} == {archive.infolist()[0].date_time}
        assert "opcollect_tables/data/manifest.json" in listed and "opcollect_tables/THIRD_PARTY_NOTICES" in listed
        assert any(n.endswith("/.opcollect/provenance.yaml") for n in listed)
    with tarfile.open(tmp_path / "a" / names[2]) as sdist:
        assert {m.mtime for m in sdist.getmembers()} == {sdist.getmembers()[0].mtime}
        assert all(m.uid == 0 and m.uname == "" for m in sdist.getmembers())

    statement = json.loads((tmp_path / "a" / names[1]).read_text())
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    subjects = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    assert subjects[names[0]] == _sha(wheel)
    table_files = [p for p in smoke_tables.rglob("*") if p.is_file()]
    for path in table_files:
        assert subjects[f"tables/{path.relative_to(smoke_tables).as_posix()}"] == _sha(path)
    internal = statement["predicate"]["buildDefinition"]["internalParameters"]
    # each hash list is the set of that field over every table of every provenance record, read here on its own
    records = [yaml.safe_load(p.read_text()) for p in smoke_tables.rglob("provenance.yaml")]
    stamped = [table for record in records for table in record["tables"].values()]
    assert internal["collector_hashes"] == sorted({t["collector_hash"] for t in stamped})
    assert internal["case_plan_hashes"] == sorted({t["case_plan_hash"] for t in stamped})
    assert internal["plan_hashes"] == sorted({e["plan_hash"] for t in stamped for e in t["events"]})
    assert internal["collector_hashes"] != internal["case_plan_hashes"]
    assert internal["pins"]["trtllm"]["versions"]["1.3.0rc20"].startswith("nvcr.io/nvidia/tensorrt-llm/release:")


def test_the_installed_package_serves_tables_and_sidecars(smoke_tables, tmp_path):
    done = run_cli("release", "--tables", str(smoke_tables), "--out", str(tmp_path), "--version", "2.0.0")
    assert done.returncode == 0, done.stderr
    site = tmp_path / "site"
    with zipfile.ZipFile(next(tmp_path.glob("*.whl"))) as archive:
        archive.extractall(site)
    script = (
        "import json, opcollect_tables as t\n"
        "tables = t.available()\n"
        "system, backend, version, table = next(x for x in tables if x[3] == 'gemm_perf')\n"
        "print(json.dumps({'tables': tables, 'path': str(t.table_path(system, backend, version, table)),\n"
        "  'meta': t.sidecar(system, backend, version, table), 'verify': t.verify()}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r})\n{script}"],
        capture_output=True,
        text=True,
        check=True,
    )
    answer = json.loads(out.stdout)
    assert ["cpu", "torch", answer["meta"]["runtime"]["version"], "gemm_perf"] in answer["tables"]
    assert Path(answer["path"]).is_file() and Path(answer["path"]).name == "gemm_perf.parquet"
    assert answer["meta"]["tables"]["gemm_perf"]["rows"] > 0
    checked, bad = answer["verify"]
    assert checked > 10 and bad == []


def test_a_tampered_table_is_refused_before_packaging(smoke_tables, tmp_path):
    copy = tmp_path / "tables"
    subprocess.run(["cp", "-a", str(smoke_tables), str(copy)], check=True)
    perf = next(copy.rglob("gemm_perf.parquet"))
    perf.write_bytes(perf.read_bytes()[:-8] + b"tampered")
    done = run_cli("release", "--tables", str(copy), "--out", str(tmp_path / "dist"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "fails verify (modified: " in done.stderr and "gemm_perf.parquet" in done.stderr
    assert not (tmp_path / "dist").exists()


def test_source_date_epoch_sets_the_timestamps_and_a_bad_one_is_refused(smoke_tables, tmp_path):
    env = {**os.environ, "SOURCE_DATE_EPOCH": "1700000000"}
    cmd = [sys.executable, "-m", "opcollect", "release", "--tables", str(smoke_tables), "--version", "3.0.0"]
    done = subprocess.run([*cmd, "--out", str(tmp_path / "a")], capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    with tarfile.open(next((tmp_path / "a").glob("*.tar.gz"))) as sdist:
        assert {m.mtime for m in sdist.getmembers()} == {1700000000}
    env["SOURCE_DATE_EPOCH"] = "yesterday"
    bad = subprocess.run([*cmd, "--out", str(tmp_path / "b")], capture_output=True, text=True, env=env, cwd=ROOT)
    assert bad.returncode == 2 and "SOURCE_DATE_EPOCH='yesterday'" in bad.stderr


def test_links_planted_in_out_are_replaced_never_written_through(smoke_tables, tmp_path):
    """D3: wheel, sdist and statement were written with Path.write_bytes, through a link planted in --out."""
    out = tmp_path / "dist"
    out.mkdir()
    victims = {}
    wheel = "opcollect_tables-4.0.0-py3-none-any.whl"
    for planted in (wheel, "opcollect_tables-4.0.0.tar.gz", f"{wheel}.intoto.json"):
        victim = tmp_path / f"victim-{planted}"
        victim.write_text("precious\n")
        (out / planted).symlink_to(victim)
        victims[planted] = victim
    done = run_cli("release", "--tables", str(smoke_tables), "--out", str(out), "--version", "4.0.0")
    assert done.returncode == 0, done.stdout + done.stderr
    assert all(v.read_text() == "precious\n" for v in victims.values())
    made = sorted(p.name for p in out.iterdir())
    assert sorted(victims) == made and not any((out / name).is_symlink() for name in made)


def _processes_naming(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_sigterm_during_release_leaves_no_venv_child_or_unverified_wheel(smoke_tables, tmp_path):
    """D6: a killed release left a 26 MB opcollect-release-venv-* in TMPDIR, orphan ensurepip/pip children, and a
    never-verified wheel and statement in --out."""
    import signal
    import time

    tmpdir, out = tmp_path / "tmp", tmp_path / "dist"
    tmpdir.mkdir()
    release = subprocess.Popen(
        [sys.executable, "-m", "opcollect", "release", "--tables", str(smoke_tables), "--out", str(out)],
        cwd=ROOT, env={**os.environ, "TMPDIR": str(tmpdir)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and release.poll() is None:
        if [p for p in _processes_naming(str(tmpdir)) if p != release.pid]:  # ensurepip (or pip) is running
            break
        time.sleep(0.05)
    assert release.poll() is None, release.communicate()
    assert list(tmpdir.glob("opcollect-release-venv-*")) and list(out.glob(".opcollect-release-*/*.whl"))
    release.send_signal(signal.SIGTERM)
    _, err = release.communicate(timeout=60)
    assert release.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    time.sleep(0.5)
    assert list(tmpdir.iterdir()) == [] and not out.exists()
    assert _processes_naming(str(tmpdir)) == []


def test_a_tree_with_warnings_alone_is_released(tmp_path):
    """check's warnings (a partial table here) do not stop a release; its violations do (test_bad_inputs D27)."""
    from conftest import fake_run

    from opcollect.plans.gemm import GemmCase
    from opcollect.project import find_project
    from opcollect.release.cut import refuse_unsound
    from opcollect.tables.merge import merge
    from opcollect.tables.rules import check_tables

    cases = [GemmCase("bfloat16", m, 1024, 1024) for m in (1, 2, 4)]
    tables = tmp_path / "tables"
    merge([fake_run(tmp_path / "run", cases, status={"gemm:bfloat16:m=4,n=1024,k=1024": "missing"})], tables,
          find_project(), say=lambda line: None)  # fmt: skip
    findings = check_tables(tables)
    assert "R4" in {f.rule for f in findings} and all(f.warning for f in findings)
    refuse_unsound(tables)
