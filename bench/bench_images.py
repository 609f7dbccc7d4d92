"""Image benchmark (needs a Docker engine and `nox -s base-image`): cold build of the torch image on the
local base, a cache hit, and a rebuild after a one-line source edit.

Each figure is the wall time of the `opcollect build` command (interpreter start included), median of
several runs. Baseline measured in the same run: the cold build (no layer cache), against which the
cache hit and the rebuild are given as ratios. Targets: cache hit < 2 s, rebuild after an edit < 30 s.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import docker

ROOT = Path(__file__).resolve().parents[1]
LOCAL = "opcollect-local/torch-cpu:latest"


def copy_tree(dest: Path) -> Path:
    for name in ("cases", "systems", "images"):
        shutil.copytree(ROOT / name, dest / name)
    shutil.copytree(ROOT / "src", dest / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pins.yaml", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, dest / name)
    return dest


def build(root: Path, *extra: str) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "opcollect", "build", "torch", "--base-image", LOCAL, "--root", str(root), *extra],
        capture_output=True,
        text=True,
        check=True,
    )
    return time.perf_counter() - start, done.stdout.strip().splitlines()[-1].split()[0]


def edit(root: Path, marker: str) -> None:
    path = root / "src" / "opcollect" / "plans" / "skips.py"
    path.write_text(path.read_text() + f"# {marker}\n")


def main() -> None:
    client = docker.from_env()
    client.images.get(LOCAL)
    tags = []
    with tempfile.TemporaryDirectory(prefix="opcollect-bench-images-") as tmp:
        root = copy_tree(Path(tmp) / "tree")
        colds, hits, rebuilds = [], [], []
        for i in range(3):
            edit(root, f"cold {i} {time.time()}")
            seconds, tag = build(root, "--no-cache")
            colds.append(seconds)
            tags.append(tag)
            hits += [build(root)[0] for _ in range(3)]
            edit(root, f"rebuild {i} {time.time()}")
            seconds, tag = build(root)
            rebuilds.append(seconds)
            tags.append(tag)
    for tag in tags:
        client.images.remove(tag, force=True)
    cold, hit, rebuild = statistics.median(colds), statistics.median(hits), statistics.median(rebuilds)
    print("opcollect image benchmark (torch image on opcollect-local/torch-cpu, `opcollect build` wall time)")
    print(f"  cold build (no layer cache):       {cold:6.2f} s   (median of {len(colds)})")
    print(
        f"  cache hit:                         {hit:6.2f} s   (median of {len(hits)}; ratio to cold "
        f"{hit / cold:.3f})   [target < 2 s]"
    )
    print(
        f"  rebuild after a one-line edit:     {rebuild:6.2f} s   (median of {len(rebuilds)}; ratio to cold "
        f"{rebuild / cold:.2f})   [target < 30 s]"
    )


if __name__ == "__main__":
    main()
