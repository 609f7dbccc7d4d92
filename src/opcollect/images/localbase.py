"""`opcollect base-image`: a local Python + torch CPU base image, built without reaching a registry.

debootstrap makes a minimal Debian with python3, `docker import` turns it into an image, and a build
on top adds the torch CPU wheel (and its dependencies) that pip provides on this machine. The result,
opcollect-local/torch-cpu:latest, is what `--base-image` names on machines without registry access.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

from opcollect.errors import InputError
from opcollect.images.context import download_wheels
from opcollect.images.engine import connect
from opcollect.project import ProjectTree

PYTHON_IMAGE = ("opcollect-local/python", "bookworm")
TORCH_IMAGE = "opcollect-local/torch-cpu:latest"
TORCH_REQUIREMENTS = ("torch==2.13.0", "numpy>=1.26")
PYTHON_TAG = "311"  # bookworm's python3
DEBIAN_MIRROR = "http://deb.debian.org/debian"


def _run(cmd: list[str], what: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise InputError(f"{what} failed ({' | '.join(tail)})")


def _python_image(client, say: Callable[[str], None]) -> str:
    from docker.errors import ImageNotFound

    ref = ":".join(PYTHON_IMAGE)
    try:
        client.images.get(ref)
        return ref
    except ImageNotFound:
        pass
    if shutil.which("debootstrap") is None:
        raise InputError("debootstrap is not installed; `apt-get install debootstrap` (Debian) and run again")
    with tempfile.TemporaryDirectory(prefix="opcollect-rootfs-") as tmp:
        root = Path(tmp) / "root"
        say(f"debootstrap: minimal Debian {PYTHON_IMAGE[1]} with python3 into {root}")
        _run(
            [
                "debootstrap",
                "--variant=minbase",
                "--include=python3,python3-pip,ca-certificates",
                PYTHON_IMAGE[1],
                str(root),
                DEBIAN_MIRROR,
            ],
            "debootstrap",
        )
        tarball = Path(tmp) / "root.tar"
        _run(["tar", "-C", str(root), "-cf", str(tarball), "."], "packing the root filesystem")
        say(f"docker import -> {ref}")
        client.api.import_image(src=str(tarball), repository=PYTHON_IMAGE[0], tag=PYTHON_IMAGE[1])
    return ref


def build_local_base(tree: ProjectTree, force: bool = False, say: Callable[[str], None] = print) -> str:
    from docker.errors import ImageNotFound

    client = connect()
    if not force:
        try:
            client.images.get(TORCH_IMAGE)
            say(f"{TORCH_IMAGE} exists (pass --force to rebuild it)")
            return TORCH_IMAGE
        except ImageNotFound:
            pass
    python_image = _python_image(client, say)
    with tempfile.TemporaryDirectory(prefix="opcollect-base-") as tmp:
        context = Path(tmp)
        wheels = context / "wheels"
        wheels.mkdir()
        (wheels / "requirements.txt").write_text("\n".join(TORCH_REQUIREMENTS) + "\n")
        say(f"pip download {' '.join(TORCH_REQUIREMENTS)} for cp{PYTHON_TAG}")
        download_wheels(TORCH_REQUIREMENTS, PYTHON_TAG, wheels)
        shutil.copy(tree.images / "local" / "Dockerfile", context / "Dockerfile")
        say(f"building {TORCH_IMAGE}")
        for chunk in client.api.build(
            path=str(context),
            tag=TORCH_IMAGE,
            buildargs={"BASE_IMAGE": python_image},
            decode=True,
            rm=True,
            forcerm=True,
        ):
            if "error" in chunk:
                raise InputError(f"building {TORCH_IMAGE} failed: {chunk['error'].strip()}")
            for line in chunk.get("stream", "").splitlines():
                if line.strip():
                    say(line)
    return TORCH_IMAGE
