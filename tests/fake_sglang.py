"""What the SGLang runner tests share: the EnvField stand-in their fake envs hold, and SGLang's pinned wheels in
.cache/wheels (`nox -s contract-sglang` downloads them; .ci/run does), which the tests read the modelled facts from
and resolve the runners' imports in."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
from conftest import ROOT

WHEELS = ROOT / ".cache" / "wheels"
SGLANG, KERNEL = "sglang-0.5.14-*", "sglang_kernel-0.4.4-*.whl"  # pins.yaml; noxfile.py's sglang-kernel pin


class Field:
    """An EnvField (srt/environ.py:41-98): get (the value set, else the default), is_set and override."""

    def __init__(self, default, value=None):
        self.default, self.value = default, value

    def get(self):
        return self.default if self.value is None else self.value

    def is_set(self):
        return self.value is not None

    @contextmanager
    def override(self, value):
        before, self.value = self.value, value
        try:
            yield
        finally:
            self.value = before


def sglang_source(rel: str) -> str:
    """The pinned wheel's file ``rel`` (from its unpacked copy where there is one); the test skips without it."""
    unpacked = sorted(WHEELS.glob(f"{SGLANG}.unpacked"))
    if unpacked:
        return (unpacked[-1] / rel).read_text()
    wheels = sorted(WHEELS.glob(f"{SGLANG}.whl"))
    if not wheels:
        pytest.skip("no pinned SGLang wheel in .cache/wheels; `nox -s contract-sglang` downloads it (.ci/run does)")
    import zipfile

    with zipfile.ZipFile(wheels[-1]) as wheel:
        return wheel.read(rel).decode()


def sglang_uses(part: str) -> list:
    """The sglang and sgl_kernel symbols the SGLang runners import (backends/symbols.py), those of the files whose
    place names ``part``."""
    from opcollect.backends.symbols import runner_uses

    uses = runner_uses(ROOT / "src" / "opcollect" / "backends" / "sglang", ("sglang", "sgl_kernel"), ROOT)
    return [u for u in uses if part in u.where]


def pinned_problems(uses) -> list:
    """What the contract check finds of ``uses`` in the pinned sglang and sglang-kernel wheels; none where either
    wheel is missing (CI downloads both)."""
    from opcollect.backends.symbols import Release, check

    sglang, kernel = sorted(WHEELS.glob(f"{SGLANG}.whl")), sorted(WHEELS.glob(KERNEL))
    return check(uses, Release(sglang[-1], kernel[-1])) if sglang and kernel else []
