"""`python -m opcollect` puts the working directory first on sys.path; opcollect imports nothing from it.

A file such as ``torch.py`` or ``json.py`` in the directory a command runs in would otherwise be imported,
and run, in place of the real module. The entry point removes that entry before it imports anything else;
the pool starts its workers with ``WORKER_START`` (``python -c``), which removes it before importing opcollect.
"""

from __future__ import annotations

import os
import sys

# `python -c WORKER_START ARGS`: drop the '' that -c puts first (absent under -P), then run the worker's main
WORKER_START = (
    "import sys\n"
    "if sys.path[:1] == [''] and not getattr(sys.flags, 'safe_path', False): del sys.path[0]\n"
    "from opcollect.runtime.worker import main\n"
    "raise SystemExit(main())\n"
)


def working_directory_entry(path: list[str]) -> bool:
    """Whether ``path[0]`` is the entry `python -m` / `-c` added for the working directory."""
    if not path or getattr(sys.flags, "safe_path", False):  # -P / PYTHONSAFEPATH added none
        return False
    if path[0] == "":
        return True
    try:
        return os.path.realpath(path[0]) == os.path.realpath(os.getcwd())
    except OSError:  # the working directory is gone
        return False


def drop_working_directory() -> None:
    """Remove the working directory's entry from the front of sys.path, if `python -m` put it there."""
    if working_directory_entry(sys.path):
        del sys.path[0]
