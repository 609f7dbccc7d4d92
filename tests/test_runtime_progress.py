"""The run's progress display (runtime/progress.py) on a terminal: one bar per op that has cases, its count of
done cases and its ok/failed split, and no line logs beside it."""

from __future__ import annotations

import io
import re

from opcollect.runtime.progress import Progress


def test_on_a_terminal_each_op_with_cases_gets_a_bar_with_its_counts_and_no_line_logs(capsys):
    stream = io.StringIO()
    progress = Progress(
        {"gemm": 3, "moe": 0, "attention": 2}, {"gemm": 1, "attention": 1}, stream=stream, terminal=True
    )
    progress.record("gemm", "ok", None)
    progress.record("gemm", "failed", "timeout")
    progress.close()
    # the bars are drawn on the progress stream, never on stdout (the run's summary, perhaps a file)
    assert capsys.readouterr().out == ""
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", stream.getvalue())  # the terminal's colour and cursor codes
    lines = [line for line in shown.splitlines() if line.strip()][-2:]  # the last frame drawn
    assert "[opcollect]" not in shown  # no line logs on a terminal
    assert not any(line.startswith("moe") for line in shown.splitlines())  # moe has no case: no bar
    assert re.fullmatch(r"gemm\s+\S+ 3/3 ok 1 failed 1 \S+", lines[0]), lines[0]  # one done before, two now
    assert re.fullmatch(r"attention\s+\S+\s+1/2\s+\S+", lines[1]), lines[1]  # the one done before this run
    assert progress.failures_by_class == {"timeout": 1}
