"""The preflight of `opcollect run` (runtime/preflight.py): every framework symbol, keyword and module the runners
use, checked against the framework installed where the run executes (located with find_spec, never imported),
before a run directory or a device exists. A copy of the TensorRT-LLM skeleton (tests/data/trtllm-release) on
PYTHONPATH stands for the installed tensorrt_llm; its __init__ raises, so any import of it would show. The vLLM
case uses the pinned wheel's files when .cache/wheels holds it."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT, run_cli

from opcollect.runtime.preflight import FrameworkMismatch, preflight

TREE = Path(__file__).parent / "data" / "trtllm-release"
WHEELS = ROOT / ".cache" / "wheels"
NOT_IMPORTED = 'raise ImportError("the preflight imported the framework")\n'


def _install_trtllm(tmp_path: Path) -> Path:
    """A site directory whose tensorrt_llm is the skeleton: find_spec finds it, importing it raises."""
    site = tmp_path / "site"
    shutil.copytree(TREE / "tensorrt_llm", site / "tensorrt_llm")
    (site / "tensorrt_llm" / "__init__.py").write_text(NOT_IMPORTED)
    return site


def _doctor(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path}: {old!r} not found"
    path.write_text(text.replace(old, new, 1))


def _drop_parameter(path: Path, cls: str, parameter: str) -> None:
    """Remove ``parameter`` from the signature of ``cls.__init__`` in the file at ``path``."""
    text = path.read_text()
    start = text.index("def __init__(", text.index(f"class {cls}("))
    end = text.index("):", start)
    signature = re.sub(rf"\b{parameter}\b[^,]*,\s*", "", text[start:end], count=1)
    assert signature != text[start:end], f"{path}: {cls}.__init__ has no {parameter}"
    path.write_text(text[:start] + signature + text[end:])


def _plan(tmp_path: Path, backend: str) -> Path:
    plan = tmp_path / f"{backend}-plan.json"
    done = run_cli("plan", "--backend", backend, "--sm", "90", "--ops", "gemm", "--smoke", "-o", str(plan))
    assert done.returncode == 0, done.stderr
    return plan


def _run(plan: Path, out: Path, site: Path):
    path = str(site) + os.pathsep + os.environ.get("PYTHONPATH", "")
    return run_cli("run", "--plan", str(plan), "--out", str(out), "--device", "cpu", env={"PYTHONPATH": path})


def _names_a_runner_line(line: str, symbol: str) -> None:
    """The line names a runner's file:line, and that line (or the import statement it starts) uses ``symbol``."""
    found = re.search(r"(src/opcollect/backends/\w+/\w+\.py):(\d+): ", line)
    assert found, line
    source = (ROOT / found[1]).read_text().splitlines()
    start = int(found[2]) - 1
    assert symbol in "\n".join(source[start : start + 8]), (found[0], source[start])


def test_a_doctored_installed_trtllm_stops_the_run_with_one_line_and_exit_2(tmp_path):
    site = _install_trtllm(tmp_path)
    _doctor(site / "tensorrt_llm/_torch/modules/linear.py", "class Linear(", "class LinearLayer(")
    done = _run(_plan(tmp_path, "trtllm"), tmp_path / "run", site)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("opcollect: error: preflight: the installed tensorrt_llm ")
    assert "tensorrt_llm._torch.modules.linear.Linear: not defined in tensorrt_llm._torch.modules.linear" in lines[0]
    _names_a_runner_line(lines[0], "Linear")
    assert "imported the framework" not in done.stderr
    assert not (tmp_path / "run").exists()  # it stopped before the run directory, so before any device


def test_the_undoctored_trtllm_passes_the_preflight_and_stops_later(tmp_path):
    site = _install_trtllm(tmp_path)
    done = _run(_plan(tmp_path, "trtllm"), tmp_path / "run", site)
    assert done.returncode == 2 and "preflight" not in done.stderr, done.stderr
    assert "the plan is for sm 90 but cpu is sm cpu" in done.stderr  # the device check, after the preflight


def test_every_miss_is_counted_and_the_framework_is_never_imported(tmp_path, monkeypatch):
    site = _install_trtllm(tmp_path)
    _doctor(site / "tensorrt_llm/_torch/modules/linear.py", "class Linear(", "class LinearLayer(")
    _drop_parameter(site / "tensorrt_llm/mapping.py", "Mapping", "tp_size")
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(FrameworkMismatch) as refused:
        preflight("trtllm")
    message = str(refused.value)
    assert "\n" not in message and refused.value.exit_code == 2
    more = re.search(r"\(and (\d+) more: `opcollect contract trtllm --source (\S+)` lists them\)", message)
    assert more and Path(more[2]) == site, message
    assert "tensorrt_llm" not in sys.modules
    # the command the line names lists the first miss and every other one, the dropped keyword among them
    listed = run_cli("contract", "trtllm", "--source", more[2])
    misses = [line for line in listed.stdout.splitlines() if line.startswith("src/")]
    assert listed.returncode == 1 and len(misses) == 1 + int(more[1]), listed.stdout
    assert any("Mapping: no parameter 'tp_size'" in line for line in misses)


def test_a_single_miss_names_no_more(tmp_path, monkeypatch):
    site = _install_trtllm(tmp_path)
    _doctor(site / "tensorrt_llm/_torch/modules/linear.py", "class Linear(", "class LinearLayer(")
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(FrameworkMismatch) as refused:
        preflight("trtllm")
    message = str(refused.value)
    assert "tensorrt_llm._torch.modules.linear.Linear: not defined" in message
    assert "more:" not in message and "opcollect contract" not in message, message


def test_nothing_to_check_without_an_installed_framework(monkeypatch):
    assert preflight("torch") is None  # the torch backend uses no framework
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    assert preflight("light_backend") is None  # a backend outside the package: no pinned framework
    if importlib.util.find_spec("tensorrt_llm") is not None:
        pytest.skip("tensorrt_llm is installed here")
    assert preflight("trtllm") is None  # not installed: the backend's identity names the pinned image


def test_a_doctored_vllm_from_the_pinned_wheel(tmp_path, monkeypatch):
    found = sorted(WHEELS.glob("vllm-0.24.0-*.whl"))
    if not found:
        pytest.skip("no pinned vLLM wheel in .cache/wheels; `nox -s contract-vllm` downloads it (.ci/run does)")
    site = tmp_path / "site"
    with zipfile.ZipFile(found[-1]) as wheel:
        wheel.extractall(site, [n for n in wheel.namelist() if n.startswith("vllm/") and n.endswith(".py")])
    monkeypatch.syspath_prepend(str(site))
    assert preflight("vllm") > 50 and "vllm" not in sys.modules
    state = site / "vllm/distributed/parallel_state.py"
    _doctor(state, "def ensure_model_parallel_initialized(", "def ensure_model_parallel_ready(")
    done = _run(_plan(tmp_path, "vllm"), tmp_path / "run", site)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "preflight: the installed vllm " in lines[0], lines
    assert "ensure_model_parallel_initialized: not defined" in lines[0]
    _names_a_runner_line(lines[0], "ensure_model_parallel_initialized")
    assert not (tmp_path / "run").exists()


def _package(site: Path, name: str, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (site / name / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / name / rel).write_text(text)
    return site


def test_a_framework_installed_without_its_kernel_package_is_named_in_the_line(tmp_path, monkeypatch):
    """SGLang's runners import sglang and sgl_kernel: sglang alone is checked and the line says sgl_kernel is not
    installed; with sgl_kernel installed elsewhere, the `opcollect contract` command it names gives both places."""
    site = _package(tmp_path / "site", "sglang", {"__init__.py": NOT_IMPORTED})
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(FrameworkMismatch) as refused:
        preflight("sglang")
    message = str(refused.value)
    assert message.startswith(f"preflight: the installed sglang ({site / 'sglang'}), without sgl_kernel, lacks what ")
    assert "lists them); run sglang plans in the backend's pinned image" in message
    assert f"`opcollect contract sglang --source {site}` lists them" in message
    kernels = _package(tmp_path / "kernels", "sgl_kernel", {"__init__.py": NOT_IMPORTED})
    monkeypatch.syspath_prepend(str(kernels))
    with pytest.raises(FrameworkMismatch) as refused:
        preflight("sglang")
    message = str(refused.value)
    assert message.startswith(f"preflight: the installed sglang ({site / 'sglang'}) lacks what a runner uses: ")
    assert f"`opcollect contract sglang --source {site} --source {kernels}` lists them" in message
    assert "sglang" not in sys.modules and "sgl_kernel" not in sys.modules


def test_locate_finds_packages_and_single_modules_and_nothing_else(tmp_path, monkeypatch):
    from opcollect.runtime.preflight import locate

    site = _package(tmp_path / "site", "pkg_dir", {"__init__.py": NOT_IMPORTED, "sub/mod.py": "X = 1\n"})
    (site / "pkg_single.py").write_text(NOT_IMPORTED)
    monkeypatch.syspath_prepend(str(site))
    assert locate("pkg_dir") == (site / "pkg_dir",)
    assert locate("pkg_single") == (site / "pkg_single.py",)  # a package installed as one module
    assert locate("no_such_package_here") is None
    assert locate("sys") is None  # built in: no Python source to check
    monkeypatch.setitem(sys.modules, "spec_less", type(sys)("spec_less"))  # in sys.modules without a spec
    assert locate("spec_less") is None
    assert "pkg_dir" not in sys.modules and "pkg_single" not in sys.modules


def test_the_installed_files_map_lists_reads_and_refuses_by_release_name(tmp_path):
    from opcollect.runtime.preflight import InstalledFiles, InstalledRelease

    site = _package(tmp_path / "site", "fw", {"__init__.py": "A = 1\n", "sub/mod.py": "B = 2\n", "data.txt": "x"})
    (site / "solo.py").write_text("C = 3\n")
    located = {"fw": (site / "fw",), "solo": (site / "solo.py",)}
    files = InstalledFiles(located)
    assert list(files) == ["fw/__init__.py", "fw/sub/mod.py", "solo.py"] and len(files) == 3
    assert files["fw/sub/mod.py"] == "B = 2\n" and files["solo.py"] == "C = 3\n"
    for absent in ("fw/gone.py", "other/x.py", "solo/x.py", "fw.py"):
        assert absent not in files
        with pytest.raises(KeyError):
            files[absent]
    release = InstalledRelease(located)
    assert release.packages() == {"fw", "solo"}
    assert release.module_file("fw.sub.mod") == "fw/sub/mod.py" and release.module_file("solo") == "solo.py"
