"""The re-check markers: every skips.py entry of a backend and every comment where a runner deliberately differs
from serving says which framework version it was checked on, as ``verified_on: <backend>==<version>`` (several
backends on one marker: ``verified_on: vllm==0.24.0 sglang==0.5.14``). A pin bump lists the markers behind the
new pin (the re-check list), and the version contract (tests/test_version_contract.py) fails while any marker
is behind its backend's current pin.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

MARKER = re.compile(r"verified_on:((?:\s+[a-z]+==[A-Za-z0-9.+-]*[A-Za-z0-9+])+)")
PAIR = re.compile(r"([a-z]+)==([A-Za-z0-9.+-]*[A-Za-z0-9+])")
SKIPS = Path("src/opcollect/plans/skips.py")
BACKENDS = Path("src/opcollect/backends")


@dataclass(frozen=True)
class Marker:
    path: str  # relative to the checkout
    line: int
    backend: str
    version: str
    text: str  # what is marked: the skips.py entry's name, else the marked line, stripped

    def render(self) -> str:
        return f"{self.path}:{self.line}: {self.backend}=={self.version}: {self.text}"


ENTRY = re.compile(r'^\s*(?:skip\(\s*)?"([a-z0-9-]+)"')


def _subject(lines: list[str], index: int, is_skips: bool) -> str:
    """The skips.py entry a marker's comment precedes (``skip entry <name>``), else the marked line without the
    marker (the line above, when the marker stands alone)."""
    if is_skips:
        for line in lines[index + 1 : index + 6]:
            if line.lstrip().startswith("#"):
                continue
            match = ENTRY.match(line) or ENTRY.match(line.replace("skip(", "", 1))
            if match:
                return f"skip entry {match.group(1)}"
    for line in (lines[index], lines[index - 1] if index else ""):
        text = MARKER.sub("", line).strip().strip('#"').strip()
        if text:
            return text
    return ""


def _files(root: Path, backend: str | None) -> list[Path]:
    files = [root / SKIPS]
    directories = (
        [root / BACKENDS / backend] if backend else sorted(p for p in (root / BACKENDS).iterdir() if p.is_dir())
    )
    for directory in directories:
        files += sorted(directory.rglob("*.py"))
    return [f for f in files if f.is_file()]


def find_markers(root: Path, backend: str | None = None) -> list[Marker]:
    """Every marker under the checkout ``root`` (skips.py and the backends' runners), of ``backend`` if given."""
    found = []
    for path in _files(Path(root), backend):
        lines = path.read_text().splitlines()
        rel = path.relative_to(root).as_posix()
        for index, line in enumerate(lines):
            for match in MARKER.finditer(line):
                for name, version in PAIR.findall(match.group(1)):
                    if backend is None or name == backend:
                        subject = _subject(lines, index, rel == SKIPS.as_posix())
                        found.append(Marker(rel, index + 1, name, version, subject))
    return found


def version_key(version: str) -> tuple:
    """A version ordered as PEP 440 orders it (1.3.0rc20 < 1.3.0rc23 < 1.3.0)."""
    from packaging.version import Version

    return (Version(version),)


def behind(markers: list[Marker], pins: dict[str, str]) -> list[Marker]:
    """The markers whose version is older than their backend's pin (``pins``: backend -> version)."""
    return [m for m in markers if m.backend in pins and version_key(m.version) < version_key(pins[m.backend])]
