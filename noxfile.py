"""nox sessions: one per verb, each a thin call of the opcollect CLI with the session's posargs.

Sessions run in the environment nox itself runs in (python=False): set it up once with
`python3 -m venv .venv && .venv/bin/pip install -e '.[test]'` (see README).
"""

from __future__ import annotations

import sys

import nox

nox.options.sessions = ["tests"]


def _opcollect(session: nox.Session, *args: str) -> None:
    session.run(sys.executable, "-m", "opcollect", *args, *session.posargs, external=True)


@nox.session(python=False)
def plan(session: nox.Session) -> None:
    """Plan on the CPU which cases a backend times on an SM: `nox -s plan -- --backend all --sm all --json`."""
    _opcollect(session, "plan")


@nox.session(name="plan-diff", python=False)
def plan_diff(session: nox.Session) -> None:
    """Compare two plan files or --json summaries: `nox -s plan-diff -- OLD NEW`."""
    _opcollect(session, "plan-diff")


def _backends() -> list[str]:
    """Every backend opcollect knows gets its build and collect sessions.

    pins.yaml is not read here: a broken one would break every session, `tests` and `lint` included.
    `opcollect build` and `collect` read it first and fail with its one-line error instead.
    """
    from opcollect.names import BACKENDS

    return list(BACKENDS)


def _backend_sessions(backend: str) -> None:
    def build(session: nox.Session) -> None:
        session.run(sys.executable, "-m", "opcollect", "build", backend, *session.posargs, external=True)

    def collect(session: nox.Session) -> None:
        session.run(sys.executable, "-m", "opcollect", "collect", backend, *session.posargs, external=True)

    build.__doc__ = f"Build (or reuse) the {backend} collector image from pins.yaml: `nox -s build-{backend}`."
    collect.__doc__ = (
        f"Collect {backend} tables in its image: plan, build, run, merge, check "
        f"(`nox -s collect-{backend} -- --sm 100`; `--local` runs without a container)."
    )
    nox.session(name=f"build-{backend}", python=False, default=False)(build)
    nox.session(name=f"collect-{backend}", python=False, default=False)(collect)


for _backend in _backends():
    _backend_sessions(_backend)


def _contract_session(backend: str) -> None:
    def contract(session: nox.Session) -> None:
        from pathlib import Path

        from opcollect.backends.symbols import fetch_wheels
        from opcollect.errors import InputError
        from opcollect.images.pins import load_pins

        try:
            version, _ = load_pins(Path("pins.yaml")).pin(backend)
            wheels = fetch_wheels(backend, version, Path(".cache") / "wheels")
        except InputError as exc:
            session.error(str(exc))
        _opcollect(session, "contract", backend, *[arg for wheel in wheels for arg in ("--wheel", str(wheel))])

    contract.__doc__ = (
        f"Check the {backend} runners' framework symbols against the pinned release's wheels "
        f"(downloaded once into .cache/wheels): `nox -s contract-{backend}`."
    )
    nox.session(name=f"contract-{backend}", python=False, default=False)(contract)


_contract_session("vllm")
_contract_session("sglang")  # with sglang-kernel's wheel: SGLang's kernels ship in their own package


@nox.session(name="contract-trtllm", python=False, default=False)
def contract_trtllm(session: nox.Session) -> None:
    """Check the TensorRT-LLM runners' symbols against the pinned image's tensorrt_llm (no wheel exists; the
    image must be pulled): `nox -s contract-trtllm` (`-- --version 1.3.0rc20`; `-- --source DIR` instead)."""
    args = () if "--source" in session.posargs else ("--image",)
    _opcollect(session, "contract", "trtllm", *args)


def _import_check_session(backend: str, extra: tuple[str, ...]) -> None:
    def import_check(session: nox.Session) -> None:
        from pathlib import Path

        from opcollect.images.pins import load_pins

        version, _ = load_pins(Path("pins.yaml")).pin(backend)
        venv = Path(".cache") / f"import-check-{backend}"
        python = venv / "bin" / "python"
        if not python.exists():
            session.run(sys.executable, "-m", "venv", str(venv), external=True)
        pip = [str(python), "-m", "pip", "install", "-q", f"{backend}=={version}", *extra, "-e", "."]
        session.run(*pip, external=True)
        session.run(str(python), "scripts/import_check.py", backend, external=True)

    import_check.__doc__ = (
        f"Import the {backend} runners' symbols with the pinned {backend} (and the torch it pins) installed: a "
        f"venv in .cache/import-check-{backend}, several GB, so outside CI: `nox -s import-check-{backend}`."
    )
    nox.session(name=f"import-check-{backend}", python=False, default=False)(import_check)


_import_check_session("vllm", ())
_import_check_session("sglang", ("sglang-kernel==0.4.4",))


@nox.session(python=False, default=False)
def bump(session: nox.Session) -> None:
    """Move a backend's pin, writing the bump report: `nox -s bump -- vllm --version 0.25.0 --image REF@sha256:D`."""
    _opcollect(session, "bump")


@nox.session(python=False, default=False)
def release(session: nox.Session) -> None:
    """Package verified tables as a data wheel and sdist: `nox -s release -- --tables tables --out dist`."""
    _opcollect(session, "release")


@nox.session(python=False, default=False)
def prune(session: nox.Session) -> None:
    """Remove collector images no current pin or input hash names: `nox -s prune` (`-- torch`: one backend)."""
    session.run(sys.executable, "-m", "opcollect", "build", "--prune", *session.posargs, external=True)


@nox.session(name="base-image", python=False, default=False)
def base_image(session: nox.Session) -> None:
    """Build opcollect-local/torch-cpu:latest without a registry (debootstrap + docker import + torch CPU wheel)."""
    _opcollect(session, "base-image")


@nox.session(python=False, default=False)
def merge(session: nox.Session) -> None:
    """Merge run directories into tables: `nox -s merge -- RUN_DIR... --into TABLES`."""
    _opcollect(session, "merge")


@nox.session(python=False, default=False)
def check(session: nox.Session) -> None:
    """Data rules R1-R7 over a tables tree: `nox -s check -- TABLES [--strict]`."""
    _opcollect(session, "check")


@nox.session(python=False, default=False)
def verify(session: nox.Session) -> None:
    """Recompute every hash of a tables tree against its manifest and provenance records: `nox -s verify -- TABLES`."""
    _opcollect(session, "verify")


@nox.session(python=False, default=False)
def compare(session: nox.Session) -> None:
    """Compare two tables on their keys: `nox -s compare -- OLD NEW [--op gemm] [--plot out.png]`."""
    _opcollect(session, "compare")


@nox.session(python=False)
def tests(session: nox.Session) -> None:
    """Run the test suite (pytest); posargs go to pytest."""
    session.run(sys.executable, "-m", "pytest", *(session.posargs or ["-q"]), external=True)


@nox.session(python=False)
def lint(session: nox.Session) -> None:
    """ruff: lint and formatting check over src, tests, bench and this file."""
    paths = ["src", "tests", "bench", "scripts", "noxfile.py"]
    session.run(sys.executable, "-m", "ruff", "check", *paths, external=True)
    session.run(sys.executable, "-m", "ruff", "format", "--check", *paths, external=True)


@nox.session(python=False, default=False)
def bench(session: nox.Session) -> None:
    """Run the benchmarks under bench/ and print their figures: `nox -s bench -- plan [--anchor DIR ...]`.

    Names come first; the flags after them go to each benchmark (bench_plan takes --anchor, --anchor-python).
    """
    first_flag = next((i for i, arg in enumerate(session.posargs) if arg.startswith("-")), len(session.posargs))
    names = session.posargs[:first_flag] or ["plan", "harness", "merge"]
    for name in names:
        session.run(sys.executable, f"bench/bench_{name}.py", *session.posargs[first_flag:], external=True)
