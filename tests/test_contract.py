"""`opcollect contract`: the framework symbols runners use, resolved in a release without importing it.

Runs against a made-up release and runner in tests/data/contract (see its README), then against copies
doctored to lose a used symbol, a used parameter and a used module attribute: each is reported with the
runner's file and line.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import made_release, made_runner, run_cli

from opcollect.backends.symbols import Release, check, contract, runner_uses
from opcollect.errors import InputError

DATA = Path(__file__).parent / "data" / "contract"


@pytest.fixture
def tree(tmp_path) -> tuple[Path, Path]:
    """(backends dir holding vllm/gemm.py, release dir) as copies a test may doctor."""
    backends = tmp_path / "src" / "opcollect" / "backends"
    shutil.copytree(DATA / "runners", backends)
    shutil.copytree(DATA / "release", tmp_path / "release")
    return backends, tmp_path / "release"


def test_every_use_of_the_runner_resolves(tree):
    backends, release = tree
    uses = runner_uses(backends / "vllm", ("vllm",), backends.parents[2])
    labels = {u.label for u in uses}
    assert {
        "vllm.VllmConfig",
        "vllm.envs",
        "vllm.config.set_current_vllm_config",
        "vllm.distributed.ensure_model_parallel_initialized",
        "vllm.model_executor.layers.linear.RowParallelLinear",
        "vllm.envs.VLLM_USE_DEEP_GEMM",
    } <= labels
    keywords = {u.label: u.keywords for u in uses if u.keywords}
    assert keywords["vllm.model_executor.layers.linear.RowParallelLinear"] == ("bias", "disable_tp")
    assert keywords["vllm.model_executor.layers.linear.ReplicatedLinear"] == ("quant_config",)  # the base's __init__
    assert check(uses, Release(release)) == []
    checked, misses, unchecked = contract("vllm", [release], backends)
    assert checked == len(uses) and misses == [] and unchecked == []


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_a_doctored_release_is_reported_at_the_runners_line(tree):
    backends, release = tree
    _edit(release / "vllm/config/vllm.py", "def set_current_vllm_config(", "def set_vllm_config(")
    _edit(release / "vllm/model_executor/layers/linear.py", "*, disable_tp=False", "*, disable_tp_group=False")
    _edit(release / "vllm/envs.py", "VLLM_USE_DEEP_GEMM", "VLLM_DEEP_GEMM")
    # ReplicatedLinear takes LinearBase's __init__: a parameter gone there is gone for it
    _edit(
        release / "vllm/model_executor/layers/linear.py",
        "params_dtype=None, quant_config=None):",
        "params_dtype=None):",
    )
    _, misses, _ = contract("vllm", [release], backends)
    lines = sorted(m.render() for m in misses)
    runner = "src/opcollect/backends/vllm/gemm.py"
    linear = "vllm.model_executor.layers.linear"
    assert any(line.startswith(f"{runner}:6: vllm.config.set_current_vllm_config: not defined") for line in lines)
    assert f"{runner}:13: {linear}.RowParallelLinear: no parameter 'disable_tp'" in lines, lines
    assert f"{runner}:14: {linear}.ReplicatedLinear: no parameter 'quant_config'" in lines, lines
    assert any(line.startswith(f"{runner}:15: vllm.envs.VLLM_USE_DEEP_GEMM: not defined") for line in lines), lines
    assert len(misses) == 4


def test_the_cli_passes_fails_and_refuses(tree, tmp_path):
    backends, release = tree
    wheel = shutil.make_archive(str(tmp_path / "vllm-0.0-py3-none-any"), "zip", release)
    wheel = Path(wheel).rename(tmp_path / "vllm-0.0-py3-none-any.whl")
    assert contract("vllm", [wheel], backends)[1] == []  # a wheel is read in place
    # a package no given release holds (SGLang's sgl_kernel without its wheel) is left out and named
    (backends / "sglang").mkdir()
    (backends / "sglang" / "gemm.py").write_text(
        "def f():\n    from sgl_kernel import fp8_scaled_mm\n    from sglang.srt import utils\n    return utils\n"
    )
    (tmp_path / "sglang-release" / "sglang" / "srt").mkdir(parents=True)
    for name in ("__init__.py", "srt/__init__.py", "srt/utils.py"):
        (tmp_path / "sglang-release" / "sglang" / name).write_text("X = 1\n")
    assert contract("sglang", [tmp_path / "sglang-release"], backends) == (1, [], ["sgl_kernel"])
    with pytest.raises(InputError, match="checked nothing: give the pinned release"):
        contract("vllm", [], backends)
    with pytest.raises(InputError, match="holds no runner yet"):
        contract("trtllm", [release], backends)
    done = run_cli("contract", "vllm", "--source", str(tmp_path / "nowhere"))
    assert (
        done.returncode == 2
        and "neither a .whl file nor a source directory" in done.stderr
        or ("holds no runner yet" in done.stderr)
    )


WHEELS = Path(__file__).resolve().parents[1] / ".cache" / "wheels"


def test_the_pinned_vllm_wheel_and_a_doctored_copy():
    """The real runners against the pinned wheel (.ci/run downloads it first with `nox -s contract-vllm`), then
    against a copy without a symbol and a parameter that vllm/context.py uses."""
    found = sorted(WHEELS.glob("vllm-0.24.0-*.whl"))
    if not found:
        pytest.skip("no pinned vLLM wheel in .cache/wheels; `nox -s contract-vllm` downloads it (.ci/run does)")
    backends = Path(__file__).resolve().parents[1] / "src" / "opcollect" / "backends"
    uses = runner_uses(backends / "vllm", ("vllm",), backends.parents[2])
    release = Release(found[-1])
    assert len(uses) > 50 and check(uses, release) == []
    state = "vllm/distributed/parallel_state.py"
    release.files[state] = (
        release.files[state]
        .replace("def ensure_model_parallel_initialized(", "def ensure_model_parallel_ready(")
        .replace('    distributed_init_method: str = "env://",', '    init_method: str = "env://",')
    )
    release._trees.clear()
    lines = [m.render() for m in check(uses, release)]
    context = "src/opcollect/backends/vllm/context.py"
    assert any(line.startswith(context) and "ensure_model_parallel_initialized: not defined" in line for line in lines)
    assert any(line.startswith(context) and "no parameter 'distributed_init_method'" in line for line in lines)


def test_the_pinned_sglang_wheels_and_a_doctored_copy():
    """SGLang's runners against its pinned wheel and sglang-kernel's (.ci/run downloads both with `nox -s
    contract-sglang`), then against a copy without a symbol and a parameter that sglang/context.py uses."""
    found = sorted(WHEELS.glob("sglang-0.5.14-*.whl")) + sorted(WHEELS.glob("sglang_kernel-0.4.4-*.whl"))
    if len(found) < 2:
        pytest.skip("no pinned SGLang wheels in .cache/wheels; `nox -s contract-sglang` downloads them (.ci/run does)")
    backends = Path(__file__).resolve().parents[1] / "src" / "opcollect" / "backends"
    uses = runner_uses(backends / "sglang", ("sglang", "sgl_kernel"), backends.parents[2])
    release = Release(*found)
    assert len(uses) > 50 and {u.module.split(".")[0] for u in uses} == {"sglang", "sgl_kernel"}
    assert check(uses, release) == []
    state = "sglang/srt/distributed/parallel_state.py"
    release.files[state] = (
        release.files[state]
        .replace("def model_parallel_is_initialized(", "def model_parallel_ready(")
        .replace("    expert_model_parallel_size: int = 1,", "    moe_model_parallel_size: int = 1,", 1)
    )
    release._trees.clear()
    lines = [m.render() for m in check(uses, release)]
    context = "src/opcollect/backends/sglang/context.py"
    assert any(line.startswith(context) and "model_parallel_is_initialized: not defined" in line for line in lines)
    assert any(line.startswith(context) and "no parameter 'expert_model_parallel_size'" in line for line in lines)


def test_a_dataclass_takes_its_fields_and_its_dataclass_bases_fields(tmp_path):
    """A dataclass has no __init__ in its source: its keywords are its annotated fields (ClassVar ones left out)
    and those of the dataclass bases it extends, the way TensorRT-LLM's QuantConfig and ModelConfig are built."""
    config = (
        "import dataclasses\nfrom dataclasses import dataclass\nfrom typing import ClassVar\n\n"
        "@dataclass\nclass Base:\n    quant_algo: str = None\n\n"
        "@dataclasses.dataclass(kw_only=True)\nclass Quant(Base):\n    group_size: int = 128\n"
        "    registry: ClassVar[dict] = {}\n\n"
        "class Plain(Base):\n    pass\n"
    )
    release = made_release(tmp_path / "release", {"tensorrt_llm/__init__.py": "", "tensorrt_llm/config.py": config})
    backends = made_runner(
        tmp_path,
        "trtllm",
        "def f():\n    from tensorrt_llm.config import Plain, Quant\n"
        "    Quant(quant_algo='FP8', group_size=128)\n"
        "    Quant(registry={}, scale=1)\n"
        "    Plain(quant_algo='FP8', other=1)\n",
    )
    _, misses, _ = contract("trtllm", [release], backends)
    assert sorted(m.render() for m in misses) == [
        "src/opcollect/backends/trtllm/gemm.py:4: tensorrt_llm.config.Quant: no parameter 'registry'",
        "src/opcollect/backends/trtllm/gemm.py:4: tensorrt_llm.config.Quant: no parameter 'scale'",
        # a plain subclass of a dataclass takes the base's generated __init__
        "src/opcollect/backends/trtllm/gemm.py:5: tensorrt_llm.config.Plain: no parameter 'other'",
    ]


def test_star_imports_and_keyword_only_parameters_resolve_as_python_reads_them(tmp_path):
    """`from x import *` re-exports every public name of a module without __all__, and only the listed ones of a
    module with it; a keyword-only parameter is a parameter."""
    release = made_release(
        tmp_path / "release",
        {
            "vllm/__init__.py": "from vllm.open import *\nfrom vllm.listed import *\n",
            "vllm/open.py": "def unlisted(a, *, block_size=16):\n    pass\n",
            "vllm/listed.py": "__all__ = ['kept']\n\ndef kept(x):\n    pass\n\ndef hidden(x):\n    pass\n",
        },
    )
    backends = made_runner(
        tmp_path,
        "vllm",
        "def f():\n    from vllm import hidden, kept, unlisted\n"
        "    unlisted(1, block_size=32)\n"
        "    unlisted(1, page=2)\n"
        "    kept(1)\n"
        "    hidden(1)\n",
    )
    checked, misses, _ = contract("vllm", [release], backends)
    assert sorted(m.render() for m in misses) == [
        "src/opcollect/backends/vllm/gemm.py:2: vllm.hidden: not defined in vllm (nor re-exported there)",
        "src/opcollect/backends/vllm/gemm.py:4: vllm.unlisted: no parameter 'page'",
    ]


def test_release_shapes_python_itself_resolves_are_found_and_the_others_reported(tmp_path):
    """A submodule of a namespace package imported by name, a module re-exported with `import x.y as z`, an
    `__all__` that is not a literal (every public name then exported), a module that does not parse, a star-import
    cycle (followed to a bound, then reported), and a dataclass whose base is a plain class (its parameters are
    unknown, so no keyword is reported): each resolves or is reported as Python would read it."""
    release = made_release(
        tmp_path / "release",
        {
            "vllm/__init__.py": "from vllm.ns import sub\nfrom vllm.dyn import *\n",
            "vllm/ns/sub.py": "X = 1\n",  # vllm/ns has no __init__.py: a namespace package
            "vllm/compat.py": "import torch.nn.functional as F\n",
            "vllm/dyn.py": "__all__ = ['kept'] + EXTRA\n\ndef kept():\n    pass\n\ndef spare(a):\n    pass\n",
            "vllm/broken.py": "def f(:\n",
            "vllm/loop_a.py": "from vllm.loop_b import *\n",
            "vllm/loop_b.py": "from vllm.loop_a import *\n",
            "vllm/config.py": (
                "from dataclasses import dataclass\n\nclass Plain:\n    def __init__(self, a):\n        pass\n\n"
                "@dataclass\nclass Mixed(Plain):\n    b: int = 0\n"
            ),
        },
    )
    backends = made_runner(
        tmp_path,
        "vllm",
        "def f():\n    from vllm import sub, spare\n    from vllm.compat import F\n"
        "    from vllm.broken import g\n    from vllm.loop_a import nowhere\n    from vllm.config import Mixed\n"
        "    spare(a=1)\n    Mixed(a=1, z=2)\n",
    )
    checked, misses, unchecked = contract("vllm", [release], backends)
    runner = "src/opcollect/backends/vllm/gemm.py"
    assert sorted(m.render() for m in misses) == [
        f"{runner}:4: vllm.broken.g: not defined in vllm.broken (nor re-exported there)",
        f"{runner}:5: vllm.loop_a.nowhere: not defined in vllm.loop_a (nor re-exported there)",
    ]
    assert (checked, unchecked) == (8, [])


def test_a_missing_module_a_bad_wheel_and_a_runner_without_the_framework_are_named(tmp_path):
    release = made_release(tmp_path / "release", {"vllm/__init__.py": "X = 1\n"})
    backends = made_runner(tmp_path, "vllm", "def f():\n    import vllm.gone\n    from vllm.absent import Y\n")
    _, misses, _ = contract("vllm", [release], backends)
    runner = "src/opcollect/backends/vllm/gemm.py"
    assert [m.render() for m in misses] == [
        f"{runner}:2: vllm.gone: no such module in the release",
        f"{runner}:3: vllm.absent.Y: no module vllm.absent in the release",
    ]
    wheel = tmp_path / "vllm-0.0-py3-none-any.whl"
    wheel.write_bytes(b"not a zip archive")
    with pytest.raises(InputError) as refused:
        contract("vllm", [wheel], backends)
    assert str(refused.value) == f"{wheel}: not a wheel (bad zip); download it again with pip download"
    with pytest.raises(InputError) as refused:
        contract("torch", [release], backends)
    assert str(refused.value) == (
        "contract torch: not a framework backend (vllm, sglang, trtllm); the torch backend has no pin"
    )
    (backends / "sglang").mkdir()
    (backends / "sglang" / "gemm.py").write_text("import vllm\nimport torch\n")
    with pytest.raises(InputError) as refused:
        contract("sglang", [release], backends)
    assert str(refused.value) == (
        f"contract sglang: checked nothing: no runner under {backends / 'sglang'} imports sglang"
    )


def test_fetching_wheels_refuses_a_backend_without_one_and_names_pips_failure(tmp_path, monkeypatch):
    from opcollect.backends.symbols import NO_WHEEL, fetch_wheels

    with pytest.raises(InputError) as refused:
        fetch_wheels("trtllm", "1.0", tmp_path)
    assert str(refused.value) == NO_WHEEL["trtllm"]
    with pytest.raises(InputError) as refused:
        fetch_wheels("torch", "2.0", tmp_path)
    assert str(refused.value) == "torch has no framework release to check"
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip looks at no index: it fails at once, offline
    with pytest.raises(InputError) as refused:
        fetch_wheels("vllm", "0.0.0", tmp_path, timeout=120)
    # pip's last line of stderr says why
    assert str(refused.value) == "pip cannot fetch vllm==0.0.0 (ERROR: No matching distribution found for vllm==0.0.0)"


def test_a_name_a_release_defines_in_an_if_else_or_an_import_fallback_is_defined(tmp_path):
    """Import-time code of a release module runs its `except ImportError:` fallbacks and its if/else branches: a
    function defined only there is defined, with the parameters of that definition."""
    compat = (
        "import sys\n\n"
        "try:\n    import _fast_ops\nexcept ImportError:\n    _fast_ops = None\n\n    def fused(x, scale=1.0):\n"
        "        pass\n\n"
        "if sys.platform == 'never':\n    pass\nelse:\n    def either(b):\n        pass\n"
    )
    release = made_release(tmp_path / "release", {"vllm/__init__.py": "", "vllm/compat.py": compat})
    backends = made_runner(
        tmp_path,
        "vllm",
        "def f():\n    from vllm.compat import either, fused, missing\n"
        "    fused(1, scale=2.0)\n"
        "    fused(1, bias=2)\n"
        "    either(b=1)\n",
    )
    _, misses, _ = contract("vllm", [release], backends)
    rendered = sorted(m.render() for m in misses)
    missing = "vllm.compat.missing: not defined in vllm.compat (nor re-exported there)"
    assert rendered[0] == f"src/opcollect/backends/vllm/gemm.py:2: {missing}"
    assert rendered[1:] == ["src/opcollect/backends/vllm/gemm.py:4: vllm.compat.fused: no parameter 'bias'"]
