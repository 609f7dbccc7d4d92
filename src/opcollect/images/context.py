"""What an image is built from: the base, the Dockerfile, the project's wheel and the collector hash.

The input hash covers the base image reference (and, for a local base, its image ID), the Dockerfile,
the wheel's inputs (the package source, through the collector hash, and pyproject.toml), the runtime
requirements and the collector hash. An image tagged with it is reused without building.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from opcollect import __version__
from opcollect.errors import InputError
from opcollect.images.pins import load_pins
from opcollect.plans.hashes import collector_hash
from opcollect.project import ProjectTree

# what the collector needs inside the container (merge, check and the Docker SDK stay on the host)
RUNTIME_REQUIREMENTS = ("pyyaml>=6.0", "pydantic>=2.6", "rich>=13.0")


@dataclass(frozen=True)
class BuildPlan:
    backend: str
    version: str | None  # the pinned framework version; None for a --base-image override
    base_image: str
    base_digest: str  # the pin's sha256 digest, or a local base's image ID
    local_base: bool
    dockerfile: Path
    collector_hash: str
    input_hash: str
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def tag(self) -> str:
        return f"opcollect/{self.backend}:{self.version or 'local'}-{self.input_hash[:12]}"

    def buildargs(self) -> dict[str, str]:
        return {
            "BASE_IMAGE": self.base_image,
            "BASE_DIGEST": self.base_digest,
            "OCI_CREATED": self.labels["created"],
            "OCI_SOURCE": self.labels["source"],
            "OCI_REVISION": self.labels["revision"],
            "OCI_VERSION": __version__,
            "COLLECTOR_HASH": self.collector_hash,
            "PINS_ENTRY_HASH": self.labels["pins_entry_hash"],
            "INPUT_HASH": self.input_hash,
        }


def input_hash(base_image: str, base_digest: str, dockerfile: bytes, pyproject: bytes, collector: str) -> str:
    digest = hashlib.sha256()
    for part in (
        base_image.encode(),
        base_digest.encode(),
        dockerfile,
        pyproject,
        collector.encode(),
        "\n".join(RUNTIME_REQUIREMENTS).encode(),
    ):
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()


def plan_build(
    tree: ProjectTree,
    backend: str,
    pins_path: Path | None = None,
    base_image: str | None = None,
    local_image_id=None,
    version: str | None = None,
) -> BuildPlan:
    """Everything a build needs; ``local_image_id(ref)`` gives a local base's image ID; ``version`` picks one of
    the backend's pinned versions (default: its current one)."""
    dockerfile = tree.images / backend / "Dockerfile"
    if not dockerfile.is_file():
        raise InputError(
            f"{dockerfile}: no Dockerfile for backend {backend!r}; known: "
            + ", ".join(sorted(p.name for p in tree.images.iterdir() if (p / "Dockerfile").is_file()))
        )
    pins = load_pins(pins_path or tree.pins)
    version, pin = pins.pin(backend, version)
    entry_hash = hashlib.sha256(
        json.dumps({"backend": backend, "version": version, "image": pin.image}, sort_keys=True).encode()
    ).hexdigest()
    if base_image is None:
        base, digest, local = pin.image, pin.digest, False
    elif "@sha256:" in base_image:
        base, digest, local = base_image, base_image.split("@", 1)[1], False
    else:  # a local image: no digest, its image ID stands for it
        if local_image_id is None:
            raise InputError(f"--base-image {base_image}: a local image needs the Docker engine to identify it")
        base, digest, local = base_image, local_image_id(base_image), True
    collector = collector_hash(tree.root)
    source = tree.git("config", "--get", "remote.origin.url") or "unknown"
    labels = {
        "created": tree.git("log", "-1", "--format=%cI") or "unknown",
        "revision": tree.git("rev-parse", "HEAD") or "unknown",
        "source": source,
        "pins_entry_hash": entry_hash,
    }
    return BuildPlan(
        backend=backend,
        version=None if base_image else version,
        base_image=base,
        base_digest=digest,
        local_base=local,
        dockerfile=dockerfile,
        collector_hash=collector,
        input_hash=input_hash(
            base, digest, dockerfile.read_bytes(), (tree.root / "pyproject.toml").read_bytes(), collector
        ),
        labels=labels,
    )


def build_wheel(tree: ProjectTree, collector: str, dest: Path) -> Path:
    """The project's py3-none-any wheel, with the collector hash written into the package."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "src-tree"
        shutil.copytree(tree.root / "src", copy / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(tree.root / name, copy / name)
        (copy / "src" / "opcollect" / "collector_hash.txt").write_text(collector + "\n")
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "-q",
                "-w",
                str(dest),
                str(copy),
            ],
            capture_output=True,
            text=True,
        )
        if done.returncode:
            last = (done.stderr.strip().splitlines() or [f"pip wheel exited with code {done.returncode}"])[-1]
            raise InputError(f"building the opcollect wheel failed: {last}")
    [wheel] = sorted(Path(dest).glob("opcollect-*.whl"))
    return wheel


def download_wheels(requirements: tuple[str, ...], python_tag: str, dest: Path) -> None:
    """Binary wheels of ``requirements`` for a base image's CPython (e.g. '311') on x86-64 Linux, for builds
    that install without an index."""
    platforms = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--only-binary=:all:",
        "--python-version",
        python_tag,
        "--implementation",
        "cp",
        *(arg for p in platforms for arg in ("--platform", p)),
        "-d",
        str(dest),
        *requirements,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
        raise InputError(f"downloading wheels of {', '.join(requirements)} for cp{python_tag} failed: {tail}")


def render_context(plan: BuildPlan, tree: ProjectTree, dest: Path, python_tag: str | None = None) -> Path:
    """The build context directory: Dockerfile, requirements.txt, wheels/ (offline only), dist/."""
    dest = Path(dest)
    (dest / "wheels").mkdir(parents=True, exist_ok=True)
    (dest / "wheels" / ".keep").write_text("")
    shutil.copy(plan.dockerfile, dest / "Dockerfile")
    (dest / "requirements.txt").write_text("\n".join(RUNTIME_REQUIREMENTS) + "\n")
    build_wheel(tree, plan.collector_hash, dest / "dist")
    if python_tag:
        download_wheels(RUNTIME_REQUIREMENTS, python_tag, dest / "wheels")
    return dest
