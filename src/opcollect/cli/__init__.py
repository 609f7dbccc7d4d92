"""`opcollect <verb>`: the one front door. Each verb family parses its flags in its own module (plan, run,
images, tables, cluster, release) and calls one room's function; this module assembles the parser and turns
errors and interrupts into one line and an exit code."""

from __future__ import annotations

import argparse
import sys

from opcollect.cli import cluster, images, plan, release, run, tables
from opcollect.errors import FrameworkMissing, InputError, Terminated
from opcollect.flags import Parser, fs_error


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="opcollect", description=__doc__)
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for verbs in (plan, run, images, tables, cluster, release):
        verbs.add(sub)
    return parser


def _pinned_image(backend: str, version: str | None) -> str:
    """`` <image> (...)`` for the backend's pin (``version``, else its current one), or nothing when pins.yaml
    cannot tell."""
    from opcollect.images.pins import load_pins
    from opcollect.project import find_project

    try:
        _, pin = load_pins(find_project().pins).pin(backend, version)
    except (InputError, OSError, AttributeError):
        return ""
    flag = f" --version {version}" if version else ""
    return f" {pin.image} (`opcollect collect {backend}{flag}` builds on it and runs the plan inside)"


def _terminate(signum, frame) -> None:
    raise Terminated(signum)


def _kept(args) -> str:
    """What an interrupted command leaves, and how to go on."""
    if args.verb == "run":
        return f"the cases recorded in {args.out} are kept; the same command with --resume finishes the run"
    if args.verb == "collect" and not args.slurm:
        return "the cases recorded in the run directory are kept; the same command again resumes the collection"
    return "nothing half-written is kept; run the same command again"


def main(argv: list[str] | None = None) -> int:
    import signal
    import threading

    # `docker stop` and `kill` send SIGTERM, which PID 1 of a container ignores unless handled: it unwinds the
    # command as Ctrl-C does (workers killed, containers stopped, temporary files removed), then one line
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return _main(argv)
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)


def _main(argv: list[str] | None) -> int:
    import signal

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM as Terminated: finally blocks have run on the way here
        signum = exc.signum if isinstance(exc, Terminated) else signal.SIGINT
        print(f"opcollect: interrupted ({signal.Signals(signum).name}): {_kept(args)}", file=sys.stderr)
        return 128 + signum
    except MemoryError:
        print(
            "opcollect: error: out of memory; select less at once (one --backend and --sm, fewer --ops) "
            "or raise the memory limit (ulimit -v)",
            file=sys.stderr,
        )
        return InputError.exit_code
    except FrameworkMissing as exc:
        pinned = _pinned_image(exc.backend, getattr(args, "version", None) or getattr(args, "expect_version", None))
        print(f"opcollect: error: {exc}{pinned}", file=sys.stderr)
        return exc.exit_code
    except InputError as exc:
        print(f"opcollect: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        return 0
    except OSError as exc:
        message = fs_error(exc, args)
        if message is None:
            raise  # any other OSError is a bug to see whole
        print(f"opcollect: error: {message}", file=sys.stderr)
        return InputError.exit_code
