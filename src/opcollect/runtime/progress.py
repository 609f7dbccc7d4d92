"""Progress per op while a run goes: a rich display on a terminal, line logs otherwise."""

from __future__ import annotations

import sys
import time
from collections import Counter
from typing import TextIO

LOG_INTERVAL_SECONDS = 5.0


class Progress:
    def __init__(
        self,
        totals: dict[str, int],
        already: dict[str, int],
        stream: TextIO | None = None,
        terminal: bool | None = None,
    ):
        self.stream = stream or sys.stderr
        self.totals = totals
        self.done = Counter(already)
        self.ok: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self.failures_by_class: Counter[str] = Counter()
        self.started = time.monotonic()
        self.terminal = self.stream.isatty() if terminal is None else terminal
        self._last_log = 0.0
        self._rich = None
        if self.terminal:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            # on the progress stream (stderr), the one whose terminal was asked: stdout keeps the run's summary
            self._rich = RichProgress(
                TextColumn("{task.description:22s}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[status]}"),
                TimeRemainingColumn(),
                console=Console(file=self.stream, force_terminal=self.terminal),
                transient=False,
            )
            self._tasks = {
                op: self._rich.add_task(op, total=n, completed=self.done[op], status="")
                for op, n in totals.items()
                if n
            }
            self._rich.start()

    def record(self, op: str, status: str, error_class: str | None) -> None:
        self.done[op] += 1
        if status == "ok":
            self.ok[op] += 1
        else:
            self.failed[op] += 1
            self.failures_by_class[error_class or "unexpected"] += 1
        if self._rich is not None:
            self._rich.update(
                self._tasks[op], completed=self.done[op], status=f"ok {self.ok[op]} failed {self.failed[op]}"
            )
        elif time.monotonic() - self._last_log >= LOG_INTERVAL_SECONDS or self.done[op] == self.totals[op]:
            self._last_log = time.monotonic()
            print(
                f"[opcollect] {op}: {self.done[op]}/{self.totals[op]} done, ok {self.ok[op]}, "
                f"failed {self.failed[op]}, eta {self._eta()}",
                file=self.stream,
                flush=True,
            )

    def _eta(self) -> str:
        total, done = sum(self.totals.values()), sum(self.done.values())
        measured = sum(self.ok.values()) + sum(self.failed.values())
        if not measured:
            return "?"
        rate = measured / max(time.monotonic() - self.started, 1e-9)
        return f"{(total - done) / rate:.0f}s"

    def close(self) -> None:
        if self._rich is not None:
            self._rich.stop()
