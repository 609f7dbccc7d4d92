"""`opcollect bump` on a git copy of the repository: only the backend's pins entry changes, comments intact; the
report holds the pins diff, the plan diff and the re-check list with file and line; `git status` shows pins.yaml
and the report, nothing else; the version contract fails until the markers move; bad requests exit 2."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml
from conftest import ROOT, run_cli

from opcollect.backends.markers import behind, find_markers

DIGEST = "sha256:" + "a" * 64
RC24 = f"nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc24@{DIGEST}"


def _git(repo, *args) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def repo(tmp_path):
    """A committed copy of the checkout's inputs and package source."""
    root = tmp_path / "repo"
    for name in ("cases", "systems", "images", "src"):
        shutil.copytree(ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pins.yaml", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, root / name)
    _git(root.parent, "init", "-q", str(root))
    _git(root, "add", "-A")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "copy")
    return root


def _comments(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.lstrip().startswith("#")]


def test_a_bump_changes_one_entry_and_writes_its_report(repo):
    before = (repo / "pins.yaml").read_text()
    done = run_cli("bump", "trtllm", "--version", "1.3.0rc24", "--image", RC24, "--keep-old", "--root", str(repo))
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(_git(repo, "status", "--porcelain", "--untracked-files=all").splitlines()) == [
        " M pins.yaml",
        "?? docs/bumps/trtllm-1.3.0rc24.md",
    ]
    after = (repo / "pins.yaml").read_text()
    assert _comments(after) == _comments(before) and _comments(before)
    old, new = yaml.safe_load(before), yaml.safe_load(after)
    assert {k: v for k, v in new["backends"].items() if k != "trtllm"} == {
        k: v for k, v in old["backends"].items() if k != "trtllm"
    }
    trtllm = new["backends"]["trtllm"]
    assert trtllm["current"] == "1.3.0rc24" and list(trtllm["versions"]) == ["1.3.0rc24", "1.3.0rc23", "1.3.0rc20"]
    changed = [line for line in _git(repo, "diff", "-U0", "pins.yaml").splitlines() if line[:1] in "+-"]
    assert all("1.3.0rc2" in line or line.startswith(("+++", "---")) for line in changed), changed

    report = (repo / "docs/bumps/trtllm-1.3.0rc24.md").read_text()
    assert report.strip() in done.stdout
    assert "```diff" in report and "+    current: 1.3.0rc24" in report and "-    current: 1.3.0rc23" in report
    # no trtllm runner serves rc24 yet: the ops leave the plan at every SM (NCCL, as torch times it, stays)
    rows = re.findall(r"^\| (\d+) \| (\w+) \| (\S+) \| (\d+) \| (\d+) \|$", report, re.M)
    assert ("90", "gemm", "torch_flow") in {r[:3] for r in rows}
    assert all(int(r[3]) > 0 and r[4] == "0" for r in rows) and not any(r[1] == "comm" for r in rows)
    assert "has no wheel to fetch" in report and "opcollect contract trtllm --image" in report
    # every trtllm marker is listed with its file and line, and each line holds that marker
    listed = re.findall(r"^- `([^`:]+):(\d+)` \(trtllm==1\.3\.0rc23\)", report, re.M)
    assert len(listed) == len(find_markers(repo, "trtllm")) > 10
    for path, line in listed:
        assert "trtllm==1.3.0rc23" in (repo / path).read_text().splitlines()[int(line) - 1]
    assert "skip entry trtllm-mla-bf16-compute" in report


def test_the_version_contract_fails_until_the_markers_move(repo):
    done = run_cli("bump", "vllm", "--version", "0.25.0", "--image", f"vllm/vllm-openai:v0.25.0@{DIGEST}",
                   "--root", str(repo))  # fmt: skip
    assert done.returncode == 0, done.stderr
    pins = yaml.safe_load((repo / "pins.yaml").read_text())["backends"]
    assert list(pins["vllm"]["versions"]) == ["0.25.0"]  # without --keep-old the old entry goes
    current = {name: entry["current"] for name, entry in pins.items()}
    late = behind(find_markers(repo), current)
    assert late and {m.backend for m in late} == {"vllm"}
    for path in {m.path for m in late}:
        file = repo / path
        file.write_text(file.read_text().replace("vllm==0.24.0", "vllm==0.25.0"))
    assert behind(find_markers(repo), current) == []


@pytest.mark.parametrize(
    "args, message",
    [
        (("--version", "1.3.0rc24", "--image", "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc24"), "no digest"),
        (("--version", "1.3.0rc24", "--image", f"nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc25@{DIGEST}"),
         "tag '1.3.0rc25' is not version 1.3.0rc24"),
        (("--version", "1.3.0rc20", "--image", f"nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc20@{DIGEST}"),
         "older than the current pin 1.3.0rc23 of trtllm; pass --allow-downgrade"),
        (("--version", "latest", "--image", RC24), "--version 'latest': not a version"),
    ],
)  # fmt: skip
def test_bad_bumps_exit_2_with_one_line_and_change_nothing(repo, args, message):
    done = run_cli("bump", "trtllm", *args, "--root", str(repo))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    assert _git(repo, "status", "--porcelain", "--untracked-files=all") == ""


def test_a_downgrade_is_pinned_when_allowed(repo):
    image = f"nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc20@{DIGEST}"
    done = run_cli("bump", "trtllm", "--version", "1.3.0rc20", "--image", image, "--allow-downgrade",
                   "--keep-old", "--root", str(repo))  # fmt: skip
    assert done.returncode == 0, done.stderr
    trtllm = yaml.safe_load((repo / "pins.yaml").read_text())["backends"]["trtllm"]
    assert trtllm["current"] == "1.3.0rc20" and trtllm["versions"]["1.3.0rc20"]["image"] == image


def test_resolve_says_clearly_when_no_registry_answers(repo, docker_client):
    tag = "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc24"
    done = run_cli(
        "bump", "trtllm", "--version", "1.3.0rc24", "--image", tag, "--resolve", "--root", str(repo), timeout=120
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "--resolve: no registry answers for nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc24" in done.stderr
    assert _git(repo, "status", "--porcelain", "--untracked-files=all") == ""


def _pins_copy(tmp_path):
    path = tmp_path / "pins.yaml"
    shutil.copy(ROOT / "pins.yaml", path)
    return path


def test_repinning_the_current_version_with_a_new_digest_is_no_downgrade(tmp_path):
    from opcollect.errors import InputError
    from opcollect.images.bump import BumpRequest, bump, check_request
    from opcollect.images.pins import load_pins

    pins = _pins_copy(tmp_path)
    current, pin = load_pins(pins).pin("trtllm")
    repushed = pin.name + "@sha256:" + ("f" if pin.digest[-1] != "f" else "e") * 64
    request = BumpRequest("trtllm", current, repushed, keep_old=True)  # no --allow-downgrade
    assert check_request(pins, request) == current
    after = yaml.safe_load(bump(pins, request).after)["backends"]["trtllm"]
    assert after["current"] == current and after["versions"][current]["image"] == repushed
    assert list(after["versions"]) == list(load_pins(pins).backends["trtllm"].versions)  # no entry lost or added
    with pytest.raises(InputError, match="is already pinned to"):  # the same digest again: nothing to bump
        check_request(pins, BumpRequest("trtllm", current, pin.image))
    older = [v for v in load_pins(pins).backends["trtllm"].versions if v != current][0]
    older_image = pin.name.rsplit(":", 1)[0] + f":{older}@sha256:" + "f" * 64
    with pytest.raises(InputError, match="older than the current pin"):  # an older version still needs the flag
        check_request(pins, BumpRequest("trtllm", older, older_image))


def test_a_bumps_dir_that_is_a_file_is_refused_before_the_report_is_made(repo, monkeypatch):
    from opcollect.errors import InputError
    from opcollect.images import bump_report
    from opcollect.images.bump import BumpRequest
    from opcollect.project import find_project

    (repo / "docs").mkdir()
    (repo / "docs" / "bumps").write_text("a file where the reports go\n")
    monkeypatch.setattr(bump_report, "report", lambda *a: pytest.fail("the slow report ran before the check"))
    with pytest.raises(InputError, match=re.escape(f"{repo / 'docs' / 'bumps'}: not a directory")):
        bump_report.apply_bump(find_project(repo), BumpRequest("trtllm", "1.3.0rc24", RC24, keep_old=True))
    (repo / "docs" / "bumps").unlink()
    (repo / "docs" / "bumps" / "trtllm-1.3.0rc24.md").mkdir(parents=True)
    with pytest.raises(InputError, match="trtllm-1.3.0rc24.md: not a regular file"):
        bump_report.apply_bump(find_project(repo), BumpRequest("trtllm", "1.3.0rc24", RC24, keep_old=True))
    (repo / "docs" / "bumps" / "trtllm-1.3.0rc24.md").rmdir()
    (repo / "docs" / "bumps").rmdir()
    (repo / "docs").rmdir()
    (repo / "docs").write_text("")  # a file higher up: the same one line
    done = run_cli("bump", "trtllm", "--version", "1.3.0rc24", "--image", RC24, "--root", str(repo))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"{repo / 'docs'}: not a directory" in done.stderr and "Traceback" not in done.stderr
    assert _git(repo, "status", "--porcelain", "--untracked-files=all") == "?? docs\n"  # pins.yaml untouched


@pytest.mark.parametrize(
    "args, message",
    [
        (("--version", "1.3.0rc24\n", "--image", RC24), "--version '1.3.0rc24\\n': not a version"),
        (("--version", "1.3.0rc24", "--image", RC24 + "\n"), "not an image reference"),
        (("--version", "1.3.0rc24", "--image", "\n" + RC24), "not an image reference"),
    ],
)
def test_a_version_or_image_is_matched_whole(tmp_path, args, message):
    from opcollect.errors import InputError
    from opcollect.images.bump import BumpRequest, check_request

    with pytest.raises(InputError, match=re.escape(message)):
        check_request(_pins_copy(tmp_path), BumpRequest("trtllm", args[1], args[3]))


def test_a_recollection_adds_the_rows_that_moved_to_the_re_check_list(repo, tmp_path):
    """After the bump, `bump --moved TABLES` compares every vllm table at the old version with the new one and
    lists the rows that really moved (beyond both rows' p25-p75 noise) under the re-check list, nothing else."""
    from conftest import fake_run

    from opcollect.plans.gemm import GemmCase
    from opcollect.project import find_project
    from opcollect.tables.merge import merge

    image = f"vllm/vllm-openai:v0.25.0@{DIGEST}"
    assert run_cli("bump", "vllm", "--version", "0.25.0", "--image", image, "--root", str(repo)).returncode == 0
    report = repo / "docs/bumps/vllm-0.25.0.md"
    assert "`opcollect bump vllm --version 0.25.0 --moved TABLES` adds here the rows" in report.read_text()
    before = report.read_text()

    cases = [GemmCase("bfloat16", m, n, 4096) for m in (1, 16, 256) for n in (1024, 4096)]
    slow = {(16, 1024), (256, 4096)}
    tables = tmp_path / "tables"
    say = lambda line: None  # noqa: E731
    merge([fake_run(tmp_path / "old", cases, version="0.24.0")], tables, find_project(), say=say)
    latency_of = lambda c: 1.2 if (c.m, c.n) in slow else 1.0  # noqa: E731
    new = fake_run(tmp_path / "new", cases, version="0.25.0", run_id="r2", latency_of=latency_of)
    merge([new], tables, find_project(), say=say)

    for _ in range(2):  # a second re-collection's rows replace the first's
        done = run_cli("bump", "vllm", "--version", "0.25.0", "--moved", str(tables), "--root", str(repo))
        assert done.returncode == 0, done.stdout + done.stderr
    text = report.read_text()
    assert text.startswith(before.rstrip("\n")) and text.count("### Rows that moved") == 1
    section = text.split("### Rows that moved (0.24.0 -> 0.25.0)\n", 1)[1]
    assert section.strip() in done.stdout
    assert "| h200_sxm/gemm/vllm/gemm_perf | 6 | 4 | 0 | 2 | 0 |" in section
    listed = re.findall(r"^- `op_name=gemm,gemm_dtype=bfloat16,m=(\d+),n=(\d+),k=4096`: slower x1\.200", section, re.M)
    assert {(int(m), int(n)) for m, n in listed} == slow and len(listed) == 2
    status = _git(repo, "status", "--porcelain", "--untracked-files=all").splitlines()
    # the contract check's wheels go to .cache/ (beside the checkout's own, which git ignores there)
    assert sorted(line for line in status if not line.startswith("?? .cache/")) == [
        " M pins.yaml",
        "?? docs/bumps/vllm-0.25.0.md",
    ]
    # no report of that version, no tables of the old one: one line each, exit 2, nothing written
    none = run_cli("bump", "vllm", "--version", "0.26.0", "--moved", str(tables), "--root", str(repo))
    assert none.returncode == 2 and none.stderr.count("\n") == 1 and "vllm-0.26.0.md: no bump report" in none.stderr
    empty = run_cli("bump", "vllm", "--version", "0.25.0", "--moved", str(tmp_path), "--root", str(repo))
    assert empty.returncode == 2 and empty.stderr.count("\n") == 1, empty.stderr
    assert "no vllm 0.24.0 table with a 0.25.0 counterpart" in empty.stderr and report.read_text() == text
    both = run_cli("bump", "vllm", "--version", "0.25.0", "--moved", str(tables), "--image", image, "--root", str(repo))
    assert both.returncode == 2 and "no --image" in both.stderr
    # the versions in two trees, OLD_TABLES NEW_TABLES, give the same rows
    apart_old, apart_new = tmp_path / "tables-old", tmp_path / "tables-new"
    merge([fake_run(tmp_path / "old-apart", cases, version="0.24.0")], apart_old, find_project(), say=say)
    merge([new], apart_new, find_project(), say=say)
    apart = run_cli(
        "bump", "vllm", "--version", "0.25.0", "--moved", str(apart_old), str(apart_new), "--root", str(repo)
    )
    assert apart.returncode == 0, apart.stdout + apart.stderr
    moved = report.read_text().split("### Rows that moved (0.24.0 -> 0.25.0)\n", 1)[1]
    assert f"{apart_old} against {apart_new}: 1 table" in moved
    assert moved.split(": 1 table", 1)[1] == section.split(": 1 table", 1)[1]


def _wheel(path, files: dict[str, str]):
    import zipfile

    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
    return path


def test_the_contract_section_says_why_it_did_not_run_and_what_it_left_unchecked(tmp_path, monkeypatch):
    from opcollect.images.bump_report import contract_section
    from opcollect.project import ProjectTree

    tree = ProjectTree(tmp_path / "tree")
    (tree.root / "src").mkdir(parents=True)
    (tree.root / "src" / "opcollect").symlink_to(ROOT / "src" / "opcollect", target_is_directory=True)
    assert contract_section(tree, "torch", "2.9.0", "img") == [
        "Not run: plain PyTorch has no framework release to check."
    ]
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip looks at no index: it fails at once, offline
    assert contract_section(tree, "vllm", "0.0.0", "img") == [
        "Not run: pip cannot fetch vllm==0.0.0 (ERROR: No matching distribution found for vllm==0.0.0)."
    ]
    # SGLang's wheel without its kernel package's modules: what the runners import from sgl_kernel is left out
    cache = tree.root / ".cache" / "wheels"
    cache.mkdir(parents=True, exist_ok=True)  # pip may have made it
    _wheel(cache / "sglang-9.9.9-py3-none-any.whl", {"sglang/__init__.py": ""})
    _wheel(cache / "sglang_kernel-0.4.4-py3-none-any.whl", {"sglang_kernel-0.4.4.dist-info/METADATA": "Name: x\n"})
    lines = contract_section(tree, "sglang", "9.9.9", "img")
    first = re.fullmatch(
        r"Against sglang-9\.9\.9-py3-none-any\.whl, sglang_kernel-0\.4\.4-py3-none-any\.whl: (\d+) uses checked, "
        r"(\d+) missing\.",
        lines[0],
    )
    assert first and int(first[1]) >= int(first[2]) > 0, lines[0]
    assert len(lines) == 2 + int(first[2]) and lines[-1] == "Not checked (no release of it): sgl_kernel."
    assert all(line.startswith("- `src/opcollect/backends/sglang/") for line in lines[1:-1]), lines[1:3]


def test_rows_that_moved_past_those_listed_are_counted_with_the_command_that_lists_them(tmp_path):
    from conftest import fake_run

    from opcollect.images.bump_report import MOVED_SHOWN, moved_section
    from opcollect.plans.gemm import GemmCase
    from opcollect.project import find_project
    from opcollect.tables.merge import merge
    from opcollect.tables.noise import DEFAULT_THRESHOLDS

    cases = [GemmCase("bfloat16", m, 1024, 4096) for m in range(1, MOVED_SHOWN + 4)]
    tables = tmp_path / "tables"
    say = lambda line: None  # noqa: E731
    merge([fake_run(tmp_path / "old", cases, version="0.24.0")], tables, find_project(), say=say)
    new = fake_run(tmp_path / "new", cases, version="0.25.0", run_id="r2", latency=1.5)
    merge([new], tables, find_project(), say=say)
    section = moved_section(tables, tables, "vllm", "0.24.0", "0.25.0", DEFAULT_THRESHOLDS)
    listed = [line for line in section.splitlines() if line.startswith("- `op_name=gemm")]
    assert len(listed) == MOVED_SHOWN
    assert section.endswith("\n- and 3 more: `opcollect compare` the two tables\n"), section[-300:]


@pytest.mark.parametrize(
    "first_line", ["# Notes on the bump", "# Pin bump: vllm 0.23.0 -> 0.24.0", "# Pin bump: sglang 0.24.0 -> 0.25.0"]
)
def test_a_report_that_does_not_start_with_its_bump_header_is_refused(tmp_path, first_line):
    from opcollect.errors import InputError
    from opcollect.images.bump_report import apply_moved
    from opcollect.project import ProjectTree

    report = tmp_path / "docs" / "bumps" / "vllm-0.25.0.md"
    report.parent.mkdir(parents=True)
    report.write_text(f"{first_line}\n\nmore\n")
    with pytest.raises(InputError) as refused:
        apply_moved(ProjectTree(tmp_path), "vllm", "0.25.0", tmp_path / "tables")
    assert str(refused.value) == f"{report}: its first line is no '# Pin bump: vllm OLD -> 0.25.0'; bump again"
    assert report.read_text() == f"{first_line}\n\nmore\n"
