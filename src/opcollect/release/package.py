"""`opcollect release --tables DIR --out DIST`: the tables as a data wheel and an sdist, built reproducibly,
with an in-toto statement beside the wheel, then verified from a fresh virtual environment.

The wheel holds one package, ``opcollect_tables``: ``data/`` is the TABLES tree as merged (a systems root for
aiconfigurator), ``index.json`` lists every table with its parsed sidecar, ``MANIFEST.json`` the sha256 of
every other file, and ``__init__.py`` the Python API (release/data_api.py). Its timestamps come from the epoch
the CLI passes (SOURCE_DATE_EPOCH, else the newest collection in the sidecars), so the same tables give the
same bytes.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path, PurePosixPath

from opcollect.errors import InputError
from opcollect.files import ensure_dir
from opcollect.release.archives import write_sdist, write_wheel
from opcollect.tables.verify import MANIFEST, listed_files, read_tree_file
from opcollect.yamlio import read_yaml

DIST = "opcollect-tables"
PACKAGE = "opcollect_tables"
SIDECAR = "collection_meta.yaml"
VERSION = re.compile(r"^[0-9]+(\.[0-9]+)*([a-z]+[0-9]+)?(\+[a-z0-9.]+)?$")
NOTICES = """THIRD-PARTY NOTICES

The tables in this package are latency measurements of operators of third-party software, collected by
opcollect (Apache-2.0). They contain no code of that software. The frameworks and images whose kernels were
timed, each under its own license:
{frameworks}
The table layout and column names follow aiconfigurator's (ai-dynamo/aiconfigurator, Apache-2.0) so that
aiconfigurator-core can read them.
"""
SETUP_CFG = b"[options]\npackage_dir =\n    = src\npackages = find:\n\n[options.packages.find]\nwhere = src\n"
LICENSES = {
    "torch": "PyTorch (BSD-3-Clause)",
    "vllm": "vLLM (Apache-2.0)",
    "sglang": "SGLang (Apache-2.0)",
    "trtllm": "TensorRT-LLM (Apache-2.0)",
    "nccl": "NCCL (BSD-3-Clause)",
}


@dataclass(frozen=True)
class Built:
    wheel: Path
    sdist: Path
    statement: Path
    files: int  # table files packaged (TABLES tree, manifest included)
    version: str
    epoch: int


_TREE_FIX = "restore the tree from a backup, or merge the runs into a new TABLES"


def check_version(version: str) -> str:
    if not VERSION.match(version):
        raise InputError(f"--version {version!r}: not a release version; give e.g. 2026.12.1 or 1.0.0")
    return version


def sidecars(tables: Path) -> dict[str, dict]:
    """Every collection_meta.yaml under TABLES, parsed, keyed by its path relative to TABLES."""
    return {
        rel: read_yaml(tables / rel, "sidecar", _TREE_FIX, tree=tables)
        for rel in listed_files(tables)
        if PurePosixPath(rel).name == SIDECAR
    }


def newest_collection(metas: dict[str, dict]) -> int:
    """The epoch second of the newest collected_at in the sidecars: the tables' own date."""
    stamps = [
        datetime.fromisoformat(c["collected_at"]).timestamp()
        for meta in metas.values()
        for table in meta.get("tables", {}).values()
        for c in table.get("collections", [])
    ]
    if not stamps:
        raise InputError("--tables: no collection in any collection_meta.yaml; merge a run into it first")
    return int(max(stamps))


def index(tables: Path, metas: dict[str, dict]) -> dict:
    """The tables the package serves: (system, backend, version, table) -> file and sidecar."""
    entries = []
    for rel, meta in sorted(metas.items()):
        directory = PurePosixPath(rel).parent
        system = directory.parts[0]
        backend, version = meta["runtime"]["framework"], meta["runtime"]["version"]
        for table in sorted(meta.get("tables", {})):
            path = directory / f"{table}.parquet"
            if (tables / path).is_file():
                entries.append(
                    {
                        "system": system,
                        "backend": backend,
                        "version": version,
                        "table": table,
                        "path": path.as_posix(),
                        "sidecar": rel,
                    }  # fmt: skip
                )
    return {"tables": entries, "sidecars": metas}


def _metadata(version: str, frameworks: list[str]) -> bytes:
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {DIST}",
        f"Version: {version}",
        "Summary: Operator-latency tables collected by opcollect (" + ", ".join(frameworks) + ")",
        "License: Apache-2.0",
        "Requires-Python: >=3.10",
        "",
    ]
    return "\n".join(lines).encode()


def package_files(tables: Path, version: str) -> tuple[dict[str, bytes], list[str]]:
    """(files of the package, relative to site-packages; the frameworks it holds tables of)."""
    metas = sidecars(tables)
    frameworks = sorted({meta["runtime"]["framework"] for meta in metas.values()})
    files: dict[str, bytes] = {}
    for rel in [*listed_files(tables), MANIFEST]:  # regular files of the tree, never through a link
        files[f"{PACKAGE}/data/{rel}"] = read_tree_file(tables / rel, tables)
    files[f"{PACKAGE}/index.json"] = json.dumps(index(tables, metas), indent=1, sort_keys=True).encode()
    notices = "\n".join(f"- {LICENSES.get(f, f)}" for f in frameworks)
    files[f"{PACKAGE}/THIRD_PARTY_NOTICES"] = NOTICES.format(frameworks=notices).encode()
    files[f"{PACKAGE}/__init__.py"] = (Path(__file__).parent / "data_api.py").read_bytes()
    files[f"{PACKAGE}/__main__.py"] = b"from opcollect_tables import main\n\nraise SystemExit(main())\n"
    manifest = {"files": {k.split("/", 1)[1]: hashlib.sha256(v).hexdigest() for k, v in sorted(files.items())}}
    files[f"{PACKAGE}/MANIFEST.json"] = json.dumps(manifest, indent=1, sort_keys=True).encode()
    return files, frameworks


def build(tables: Path, out: Path, version: str, epoch: int) -> tuple[Path, Path, dict[str, bytes]]:
    """Write the wheel and the sdist into ``out``; (wheel, sdist, the package's files)."""
    files, frameworks = package_files(tables, check_version(version))
    ensure_dir(out)
    dist_info = f"{PACKAGE}-{version}.dist-info"
    wheel_files = {
        **files,
        f"{dist_info}/METADATA": _metadata(version, frameworks),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: opcollect\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{dist_info}/top_level.txt": f"{PACKAGE}\n".encode(),
    }
    wheel = out / f"{PACKAGE}-{version}-py3-none-any.whl"
    write_wheel(wheel, wheel_files, f"{dist_info}/RECORD", epoch)
    root = f"{PACKAGE}-{version}"
    pyproject = (
        '[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n\n'
        f'[project]\nname = "{DIST}"\nversion = "{version}"\nrequires-python = ">=3.10"\n\n'
        f'[tool.setuptools.package-data]\n{PACKAGE} = ["**/*", "data/**/.opcollect/*"]\n'
    ).encode()
    sdist_files = {
        **{f"{root}/src/{name}": data for name, data in files.items()},
        f"{root}/pyproject.toml": pyproject,
        f"{root}/PKG-INFO": _metadata(version, frameworks),
        f"{root}/setup.cfg": SETUP_CFG,
    }
    sdist = out / f"{root}.tar.gz"
    write_sdist(sdist, sdist_files, epoch)
    return wheel, sdist, files
