"""Behaviours of the selection files' readers, the re-check markers, the kernel-label tables, the backend registry,
the hashes, the coverage helpers, the contract's symbol resolution and the DeepSeek-V4 compressor's offsets that no
earlier test held: each test here fails with a small plausible bug planted in the function it names."""

from __future__ import annotations

import hashlib
import sys

import pytest

from opcollect.backends import kernels as kt
from opcollect.backends import load_backend, markers, symbols
from opcollect.errors import InputError
from opcollect.plans import coverage, hashes, selection, selection_sglang

# ---- plans/selection.py ------------------------------------------------------------------------------------------


@pytest.fixture
def selection_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(selection, "SELECTION", tmp_path)
    selection.table.cache_clear()
    yield tmp_path
    selection.table.cache_clear()


def test_selection_table_keys_every_sm_as_a_string_and_refuses_a_non_mapping(selection_dir):
    """selection.table: SM keys read as YAML ints come back as strings; a list file is refused; no file is {}."""
    (selection_dir / "ints.yaml").write_text("sm:\n  90:\n    mla: {fp8: A}\n  '100':\n    mla: {fp8: B}\n")
    (selection_dir / "list.yaml").write_text("- 1\n- 2\n")
    assert selection.table("ints.yaml") == {"90": {"mla": {"fp8": "A"}}, "100": {"mla": {"fp8": "B"}}}
    with pytest.raises(InputError, match="not a selection table"):
        selection.table("list.yaml")
    assert selection.table("absent.yaml") == {}


def test_selection_answer_is_a_string_label_and_never_a_refusal(monkeypatch):
    """selection._answer via vllm_mla: a label as is; ``unsupported ...`` or a non-string answer is None."""
    fake = {"90": {"mla": {"a": "FLASHMLA", "b": "unsupported (sm)", "c": {"x": 1}, "d": 7}}}
    monkeypatch.setattr(selection, "table", lambda name=selection.VLLM: fake)
    assert [selection.vllm_mla("90", kv) for kv in "abcde"] == ["FLASHMLA", None, None, None, None]
    assert selection.vllm_mla("100", "a") is None


# ---- plans/selection_sglang.py -----------------------------------------------------------------------------------

SG = {
    "100": {
        "moe/MixtralForCausalLM/fp8/ep1": {"moe_runner_backend": "tp_runner"},
        "moe/MixtralForCausalLM/fp8/ep8": {"moe_runner_backend": "ep_runner"},
        "moe/Qwen3MoeForCausalLM/fp8/ep1": {"moe_runner_backend": "qwen_runner"},
        "moe/MixtralForCausalLM/nvfp4/ep1": {"refused": "no", "moe_runner_backend": "x"},
        "attention/Arch/bfloat16": {"prefill_attention_backend": "fa3", "decode_attention_backend": "flashinfer"},
        "attention/Arch/fp8_e4m3": {"refused": "no", "prefill_attention_backend": "x"},
        "mla/DeepseekV3ForCausalLM/fp8": {"prefill_attention_backend": "fa3", "decode_attention_backend": "flashmla"},
        "mla/DeepseekV3ForCausalLM/bfloat16": {"refused": "no", "decode_attention_backend": "x"},
        "gemm/LlamaForCausalLM/fp8": {"cutlass_fp8_supported": True},
        "gemm/LlamaForCausalLM/fp8_block": {"refused": "no"},
    }
}


@pytest.fixture
def sglang_file(monkeypatch):
    monkeypatch.setattr(selection_sglang, "table", lambda name: SG if name == selection_sglang.FILE else {})


def test_sglang_moe_runner_reads_ep1_or_ep8_per_architecture_at_sm100_for_sm103(sglang_file):
    """selection_sglang.moe_runner_backend: EP 1 reads ep1, any larger EP ep8; SM103 reads SM100; refusals None."""
    generic, qwen = (1, 2, 3, 4), (6144, 2560, 8, 160)
    assert [selection_sglang.moe_runner_backend("103", generic, "fp8", ep) for ep in (1, 2, 8)] == [
        "tp_runner",
        "ep_runner",
        "ep_runner",
    ]
    assert selection_sglang.moe_runner_backend("100", qwen, "fp8", 1) == "qwen_runner"
    assert selection_sglang.moe_runner_backend("100", qwen, "fp8", 8) is None
    assert selection_sglang.moe_runner_backend("100", generic, "nvfp4", 1) is None  # refused
    assert selection_sglang.moe_runner_backend("90", generic, "fp8", 1) is None
    unknown = next(iter(selection_sglang.UNKNOWN_MOE))  # not the generic architecture's answer
    assert selection_sglang.moe_runner_backend("100", unknown, "fp8", 1) is None


def test_sglang_attention_mla_and_gemm_answers_honour_phase_and_refusals(sglang_file):
    """selection_sglang.attention_backend, mla_backend, fp8_gemm: the phase's key; a refused entry is None."""
    assert selection_sglang.attention_backend("103", "Arch", "bfloat16", "prefill") == "fa3"
    assert selection_sglang.attention_backend("100", "Arch", "bfloat16", "decode") == "flashinfer"
    assert selection_sglang.attention_backend("100", "Arch", "fp8_e4m3", "prefill") is None
    assert selection_sglang.mla_backend("103", "fp8", "decode") == "flashmla"
    assert selection_sglang.mla_backend("100", "fp8", "prefill") == "fa3"
    assert selection_sglang.mla_backend("100", "bfloat16", "decode") is None
    assert selection_sglang.fp8_gemm("103", "fp8") == {"cutlass_fp8_supported": True}
    assert selection_sglang.fp8_gemm("100", "fp8_block") is None


# ---- backends/markers.py -----------------------------------------------------------------------------------------


def _tree(tmp_path, skips: str = "X = 1\n", runners: dict[str, str] | None = None):
    (tmp_path / "src/opcollect/plans").mkdir(parents=True)
    (tmp_path / "src/opcollect/plans/skips.py").write_text(skips)
    for rel, text in (runners or {}).items():
        path = tmp_path / "src/opcollect/backends" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (tmp_path / "src/opcollect/backends").mkdir(parents=True, exist_ok=True)
    return tmp_path


def test_markers_of_one_backend_are_read_from_its_own_runners_only(tmp_path):
    """markers.find_markers(backend): skips.py and backends/<backend>/ only; a directory named *.py is no file."""
    root = _tree(
        tmp_path,
        runners={
            "vllm/gemm.py": "# a. verified_on: vllm==0.24.0\n",
            "sglang/gemm.py": "# b. verified_on: vllm==0.23.0 sglang==0.5.14\n",
            "vllm/nested/x.py": "# c. verified_on: vllm==0.22.0\n",
        },
    )
    (root / "src/opcollect/backends/vllm/odd.py").mkdir()
    found = markers.find_markers(root, "vllm")
    assert [(m.path, m.version, m.text) for m in found] == [
        ("src/opcollect/backends/vllm/gemm.py", "0.24.0", "a."),
        ("src/opcollect/backends/vllm/nested/x.py", "0.22.0", "c."),
    ]
    assert [(m.backend, m.version) for m in markers.find_markers(root)] == [
        ("vllm", "0.23.0"),
        ("sglang", "0.5.14"),
        ("vllm", "0.24.0"),
        ("vllm", "0.22.0"),
    ]


def test_a_skips_marker_looks_five_lines_down_for_its_entry(tmp_path):
    """markers._subject: the entry may be the fifth line below the marker, not the sixth."""
    five = "# r. verified_on: vllm==0.24.0\n#\n#\n#\n#\n" + 'skip("fifth", backend=("vllm",)),\n'
    six = "# s. verified_on: sglang==0.5.14\n#\n#\n#\n#\n#\n" + 'skip("sixth", backend=("sglang",)),\n'
    root = _tree(tmp_path, skips=five + six)
    assert [m.text for m in markers.find_markers(root)] == ["skip entry fifth", "s."]


def test_a_marker_alone_on_the_first_line_names_nothing_not_the_last_line(tmp_path):
    """markers._subject: a lone marker on line 1 has no line above: its text is empty, never the file's last line."""
    root = _tree(tmp_path, runners={"vllm/x.py": "# verified_on: vllm==0.24.0\nX = 1\nlast_line = 2\n"})
    [found] = markers.find_markers(root, "vllm")
    assert (found.line, found.text) == (1, "")


def test_behind_leaves_out_markers_of_backends_without_a_pin():
    """markers.behind: a marker of a backend the pins do not name is never behind."""
    found = [markers.Marker("a.py", 1, "vllm", "0.1.0", "x"), markers.Marker("a.py", 2, "trtllm", "0.1.0", "y")]
    assert markers.behind(found, {"vllm": "0.24.0"}) == found[:1]
    assert markers.behind(found, {}) == []


# ---- backends/kernels.py -----------------------------------------------------------------------------------------


def test_meaning_picks_the_ops_own_meaning_else_the_one_for_every_op(monkeypatch):
    """kernels.meaning: of a label's meanings, the first naming the op or naming no op; None when none fits."""
    own = kt.Meaning(patterns=("own_kernel",), ops=("gemm",))
    every = kt.Meaning(patterns=("any_kernel",))
    only = kt.Meaning(patterns=("moe_kernel",), ops=("moe",))
    table = {"L": (own, every), "M": (only,), "S": every}
    monkeypatch.setattr(kt, "table_of", lambda backend: table if backend == "b" else {})
    assert kt.meaning("b", "L", "gemm") is own and kt.meaning("b", "L", "attention") is every
    assert kt.meaning("b", "M", "gemm") is None and kt.meaning("b", "S", None) is every
    assert kt.meaning("b", None) is None and kt.meaning("other", "S") is None
    # matching is re.search, case-insensitive
    assert not kt.contradicts_label("b", "L", ["void OWN_KERNEL<128>"], "gemm")
    assert kt.contradicts_label("b", "L", ["void any_kernel"], "gemm")
    assert kt.contradicts_dispatch("b", "Z", "S") and not kt.contradicts_dispatch("b", None, "S")


def test_a_meaning_has_patterns_or_a_reason_never_both():
    """kernels.Meaning: patterns and unobservable together, or neither, is refused; either alone is kept."""
    with pytest.raises(ValueError):
        kt.Meaning(patterns=("x",), unobservable="why")
    with pytest.raises(ValueError):
        kt.Meaning()
    assert kt.Meaning(unobservable="why").patterns == ()


# ---- backends/__init__.py ----------------------------------------------------------------------------------------


def test_load_backend_tells_a_missing_backend_from_a_backend_missing_a_dependency(tmp_path, monkeypatch):
    """load_backend: no module of that name is InputError; the module's own missing import propagates as is."""
    (tmp_path / "needs_dep_s14.py").write_text("import no_such_dependency_s14\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(InputError, match="no module absent_backend_s14"):
        load_backend("absent_backend_s14", modules=("absent_backend_s14",))
    with pytest.raises(ModuleNotFoundError) as raised:
        load_backend("needs_dep_s14", modules=("needs_dep_s14",))
    assert raised.value.name == "no_such_dependency_s14"
    sys.modules.pop("needs_dep_s14", None)


# ---- plans/hashes.py ---------------------------------------------------------------------------------------------


def test_collector_files_take_the_hashed_suffixes_and_dockerfiles_only(tmp_path):
    """hashes.collector_files: .py .yaml .yml .sh .patch and Dockerfile[.x] under the hashed dirs, sorted; no
    dot directories, caches or other files."""
    for rel in (
        "src/opcollect/a.py",
        "cases/b.yml",
        "cases/c.yaml",
        "images/x/build.sh",
        "images/x/fix.patch",
        "images/x/Dockerfile",
        "images/x/Dockerfile.cuda",
        "images/x/notes.json",
        "images/x/Dockerfile_old",
        "images/.hidden/z.py",
        "cases/.draft.yaml",
        "systems/__pycache__/s.py",
        "systems/s.yaml",
        "tests/t.py",
    ):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    assert hashes.collector_files(tmp_path) == [
        "cases/b.yml",
        "cases/c.yaml",
        "images/x/Dockerfile",
        "images/x/Dockerfile.cuda",
        "images/x/build.sh",
        "images/x/fix.patch",
        "src/opcollect/a.py",
        "systems/s.yaml",
    ]
    digest = hashlib.sha256()
    for rel in hashes.collector_files(tmp_path):
        digest.update(f"{rel}\0{len(rel)}\0".encode() + rel.encode())
    assert hashes.collector_hash(tmp_path) == digest.hexdigest()


def test_canonical_lines_and_content_hash_spell_rows_and_shards_exactly():
    """hashes.canonical_lines and content_hash: 'id<TAB>dispatch[<TAB>row]'; shard 'i/n' or 'none'; selection
    as compact sorted JSON; lines sorted unless presorted."""
    assert hashes.canonical_lines(["a", "b"], ["d1", "d2"], None) == ["a\td1", "b\td2"]
    rows = [("r2", "x", ("c", "d")), ("r1", "y", ("e",))]
    assert hashes.canonical_lines(["c", "d", "e"], ["x", "x", "y"], rows) == ["c\tx\tr2", "d\tx\tr2", "e\ty\tr1"]
    header = 'backend=torch\nsm=cpu\nplan_hash=P\nshard=2/3\nselection={"a":[1],"b":null}\n'
    want = hashlib.sha256((header + "a\nb").encode()).hexdigest()
    assert hashes.content_hash("torch", "cpu", "P", (2, 3), {"b": None, "a": [1]}, ["b", "a"]) == want
    none = hashes.content_hash("torch", "cpu", "P", None, {}, ["a"])
    assert none == hashlib.sha256(b"backend=torch\nsm=cpu\nplan_hash=P\nshard=none\nselection={}\na").hexdigest()
    assert hashes.plan_hash(["h"], ["b", "a"], presorted=True) == hashlib.sha256(b"h\nb\na").hexdigest()


# ---- plans/coverage.py -------------------------------------------------------------------------------------------


def test_percent_rounds_to_one_decimal_but_never_to_0_or_100_falsely():
    """coverage._percent: 100.0 for no keys; 0.1 at least once one is covered; 99.9 at most while one is missing."""
    assert coverage._percent(0, 0) == 100.0 and coverage._percent(0, 5) == 0.0
    assert coverage._percent(1, 5000) == 0.1 and coverage._percent(4999, 5000) == 99.9
    assert coverage._percent(5, 5) == 100.0 and coverage._percent(1, 3) == 33.3 and coverage._percent(2, 3) == 66.7


def test_spread_takes_the_ends_and_evenly_spaced_keys_between():
    """coverage._spread: all keys when few; else count keys at j x (n - 1) // (count - 1), first and last kept."""
    keys = [(i,) for i in range(11)]
    assert coverage._spread(keys, 5) == [(0,), (2,), (5,), (7,), (10,)]
    assert coverage._spread(keys[:5], 5) == keys[:5] and coverage._spread(keys[:6], 5) == [(0,), (1,), (2,), (3,), (5,)]


def test_pairs_put_the_named_pairs_first_then_each_other_pair_once_in_column_order():
    """coverage._pairs: PAIRS present among the columns first, then every other pair once, by ``order``."""
    columns = ["m", "n", "k", "num_experts", "topk"]
    assert coverage._pairs(columns, [4, 0, 1, 2, 3]) == [
        (3, 4),
        (1, 2),
        (4, 0),
        (4, 1),
        (4, 2),
        (0, 1),
        (0, 2),
        (0, 3),
        (1, 3),
        (2, 3),
    ]


def test_labels_and_key_counts_read_as_the_report_prints_them():
    """coverage._label and _keys: 'a=1' or '(a,b)=(1,2)'; '1 key', '1,234 keys'."""
    assert coverage._label(["head_dim"], (256,)) == "head_dim=256"
    assert coverage._label(["n", "k"], (1, 2)) == "(n,k)=(1,2)"
    assert (coverage._keys(1), coverage._keys(0), coverage._keys(1234)) == ("1 key", "0 keys", "1,234 keys")


def test_sorted_keys_put_a_null_last_in_its_column():
    """coverage._sorted: plain order when comparable; with a None, None sorts after every value of its column."""
    assert coverage._sorted({(2, "b"), (1, "a")}) == [(1, "a"), (2, "b")]
    assert coverage._sorted({(None, 1), (3, 2), (1, None), (1, 0)}) == [(1, 0), (1, None), (3, 2), (None, 1)]


# ---- backends/symbols.py -----------------------------------------------------------------------------------------


def test_relative_imports_resolve_from_a_package_or_a_module_by_level(tmp_path):
    """symbols._absolute via resolve: `from ..x import n` climbs level - 1 packages above the module's own."""
    files = {
        "fw/__init__.py": "from .sub import f\n",
        "fw/sub/__init__.py": "from ..base import f\nfrom .leaf import g\n",
        "fw/sub/leaf.py": "from ..other import g\n",
        "fw/base.py": "def f(a):\n    pass\n",
        "fw/other.py": "def g(b):\n    pass\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    release = symbols.Release(tmp_path)
    assert symbols.resolve(release, "fw", "f").module == "fw.base"
    assert symbols.resolve(release, "fw.sub", "g").module == "fw.other"


# ---- backends/torch/dsv4.py: the Compressor's offsets ------------------------------------------------------------


@pytest.mark.parametrize(
    "ratio,step,queries,want",
    [  # (first, last, cached, pad, used)
        (4, 6, 5, (1, 2, 6, 0, 2)),  # CSA: the window reaches back one block (0..7), none below 0
        (4, 2, 3, (0, 1, 2, 4, 2)),  # the window's first block lies below position 0: 4 padded positions
        (4, 9, 8, (2, 4, 5, 0, 7)),  # two entries complete; the window starts at block 1 (position 4)
        (4, 3, 5, (0, 2, 3, 4, 5)),  # the new tokens end exactly on a block boundary: that block completes
        (128, 130, 200, (1, 2, 2, 0, 126)),  # HCA: no overlap, the cache holds the block's first 2 tokens
        (128, 100, 156, (0, 2, 100, 0, 156)),  # HCA ending on a block boundary
    ],
)
def test_the_compressor_caches_the_windows_seen_tokens_and_uses_the_new_ones_up_to_the_last_block(
    ratio, step, queries, want
):
    """dsv4.Compressor: first = step // r, last = (step + S) // r; the window starts (first - coff + 1) x r."""
    torch = pytest.importorskip("torch")
    from opcollect.backends.torch import dsv4

    made = dsv4.Compressor(16, 8, ratio, 2, step, queries, torch.float32, "cpu", 0)
    assert (made.first, made.last, made.cached, made.pad, made.used) == want
    assert made.state.shape == (2, want[2], 2 * made.coff * 8)
    assert made.cos.shape[0] == want[1] - want[0]
