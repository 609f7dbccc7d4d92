"""Tie a child process's life to its parent: PDEATHSIG where Linux offers it, plus a parent check.

PR_SET_PDEATHSIG delivers SIGKILL when the parent thread that started the child exits. It cannot cover
a parent that died before the child armed it, so the child also compares its parent pid with the one
it was started by, now and then every half second.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1


def arm_pdeathsig() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except OSError:
        return False


def hold(parent_pid: int, interval: float = 0.5) -> None:
    """Die with ``parent_pid``: arm PDEATHSIG, check once, then keep checking from a daemon thread."""
    arm_pdeathsig()
    if os.getppid() != parent_pid:
        os._exit(137)

    def watch() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != parent_pid:
                os._exit(137)

    threading.Thread(target=watch, name="lifeline", daemon=True).start()
