"""The one error type for bad input or environment: the CLI prints it on one line and exits 2."""

from __future__ import annotations


class InputError(Exception):
    """Bad input or environment. The message names the file, field or value and how to fix it."""

    exit_code = 2


class FrameworkMissing(InputError):
    """A framework backend asked to run where its framework is not installed; the CLI names the pinned image."""

    def __init__(self, backend: str, message: str):
        super().__init__(message)
        self.backend = backend


class Terminated(KeyboardInterrupt):
    """SIGTERM (`docker stop`, `kill`, a Slurm job's end) raised as Ctrl-C's exception: every command unwinds the
    same way, its finally blocks stop workers and containers and remove what is half-written, and the CLI ends
    with one line. A KeyboardInterrupt, so the code that stops a container on Ctrl-C stops it here too."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
