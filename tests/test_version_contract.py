"""The version contract: every skips.py entry of a pinned backend, and every comment where a runner differs from
serving, says which version it was checked on (``verified_on: <backend>==<version>``), and no marker may be behind
its backend's current pin: after a pin bump this test fails, naming each re-check, until the markers move."""

from __future__ import annotations

import re

from conftest import ROOT

from opcollect.backends.markers import behind, find_markers
from opcollect.images.pins import load_pins
from opcollect.plans import skips


def current_pins(root=ROOT) -> dict[str, str]:
    return {name: entry.current for name, entry in load_pins(root / "pins.yaml").backends.items()}


def test_no_marker_is_behind_its_current_pin():
    late = behind(find_markers(ROOT), current_pins())
    assert not late, "re-check these for the new pin, then move their markers:\n" + "\n".join(m.render() for m in late)


def test_every_skip_of_a_pinned_backend_carries_a_marker_for_it():
    markers = find_markers(ROOT)
    pinned = set(current_pins())
    source = (ROOT / "src/opcollect/plans/skips.py").read_text().splitlines()
    for entry in skips.SKIPS:
        named = sorted(set(entry.keys.get("backend", ())) & pinned)
        if not named:
            continue
        line = next(i for i, text in enumerate(source, 1) if re.search(rf'"{re.escape(entry.name)}"', text))
        # the entry's reason comment ends on the line above `skip(` (or above its name, when split)
        above = [m for m in markers if m.path.endswith("skips.py") and line - 3 <= m.line < line]
        assert {m.backend for m in above} >= set(named), (entry.name, named, [m.render() for m in above])


def test_a_marker_behind_the_pin_is_found_with_its_file_and_line(tmp_path):
    tree = tmp_path / "tree"
    (tree / "src/opcollect/plans").mkdir(parents=True)
    (tree / "src/opcollect/backends/vllm").mkdir(parents=True)
    (tree / "src/opcollect/plans/skips.py").write_text("# a reason. verified_on: vllm==0.24.0 sglang==0.5.14\nX = 1\n")
    (tree / "src/opcollect/backends/vllm/gemm.py").write_text("\n\n# rows err high. verified_on: vllm==0.25.0rc1\n")
    found = find_markers(tree)
    assert [(m.path, m.line, m.backend, m.version) for m in found] == [
        ("src/opcollect/plans/skips.py", 1, "vllm", "0.24.0"),
        ("src/opcollect/plans/skips.py", 1, "sglang", "0.5.14"),
        ("src/opcollect/backends/vllm/gemm.py", 3, "vllm", "0.25.0rc1"),
    ]
    late = behind(found, {"vllm": "0.25.0", "sglang": "0.5.14"})
    # PEP 440 order: 0.25.0rc1 is behind 0.25.0; a marker at the pin is not
    assert [(m.path, m.version) for m in late] == [
        ("src/opcollect/plans/skips.py", "0.24.0"),
        ("src/opcollect/backends/vllm/gemm.py", "0.25.0rc1"),
    ]
    assert late[0].render() == "src/opcollect/plans/skips.py:1: vllm==0.24.0: a reason."
    assert late[1].text == "rows err high."


def test_a_skips_marker_names_the_entry_below_it_across_further_comment_lines(tmp_path):
    """The re-check list names a skips.py marker by its entry: the next `skip("name"` (or a name on the line after
    `skip(`) within five lines, past any more comment lines; a marker with no entry there names its own line."""
    tree = tmp_path / "tree"
    (tree / "src/opcollect/plans").mkdir(parents=True)
    (tree / "src/opcollect/backends").mkdir(parents=True)
    (tree / "src/opcollect/plans/skips.py").write_text(
        "# a reason. verified_on: vllm==0.24.0\n"
        "# the reason goes on\n"
        "#   and on\n"
        'skip("after-comments", backend=("vllm",)),\n'
        "# split. verified_on: sglang==0.5.14\n"
        "skip(\n"
        '    "split-name",\n'
        ")\n"
        "# stray. verified_on: trtllm==1.3.0rc23\n"
        "X = 1\n"
    )
    found = find_markers(tree)
    assert [m.text for m in found] == ["skip entry after-comments", "skip entry split-name", "stray."]
    real = [m for m in find_markers(ROOT) if m.path.endswith("skips.py")]
    assert real and all(m.text.startswith("skip entry ") for m in real), [m.render() for m in real]
