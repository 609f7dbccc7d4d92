"""compare's verdicts: same, faster, slower or ambiguous from each row's p25-p75 interval (tables/noise.py).

Two real CPU collections of one plan: a re-run is "same" for most rows and never faster or slower where the two
intervals overlap; a 20% slowdown planted in 10 rows of a copy of NEW is slower for exactly those 10. The classifier
on crafted intervals, and the ratio rule of rows without quartiles (the reference tables)."""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from conftest import REFERENCE, ROOT, run_cli

from opcollect.plans.gemm import GemmCase
from opcollect.plans.hashes import collector_hash
from opcollect.plans.planfile import write_plan
from opcollect.plans.planner import plan_of_cases, shard_of
from opcollect.project import find_project
from opcollect.tables.compare import compare_tables
from opcollect.tables.merge import merge
from opcollect.tables.noise import AMBIGUOUS, FASTER, MOVED, SAME, SLOWER, Measured, Thresholds, classify

T = Thresholds()
COUNTS = re.compile(r"^verdicts: (\d+) same, (\d+) faster, (\d+) slower, (\d+) ambiguous", re.M)


def m(latency: float, spread: float = 0.01, samples: int = 10) -> Measured:
    """A row at ``latency`` whose p25 and p75 lie ``spread`` (relative) below and above it."""
    return Measured(latency, latency * (1 - spread), latency * (1 + spread), samples)


# --- the classifier on crafted intervals


def test_overlapping_intervals_are_never_a_change():
    """Any pair of intervals that share a point is same or ambiguous, however far apart the medians are."""
    rng = random.Random(23)
    seen = set()
    for _ in range(20000):
        a = sorted(rng.uniform(0.5, 2.0) for _ in range(3))
        b = sorted(rng.uniform(0.5, 2.0) for _ in range(3))
        old, new = Measured(a[1], a[0], a[2], rng.choice([3, 5, 50])), Measured(b[1], b[0], b[2], 50)
        verdict = classify(old, new, Thresholds(max_noise=10.0)).verdict
        seen.add(verdict)
        if max(old.p25, new.p25) <= min(old.p75, new.p75):
            assert verdict in (SAME, AMBIGUOUS), (old, new, verdict)
    assert seen == {SAME, FASTER, SLOWER, AMBIGUOUS}  # the sweep reached every verdict
    # touching at one point, medians 25% apart: no change, and not the same either
    assert classify(Measured(1.0, 0.9, 1.1, 50), Measured(1.25, 1.1, 1.4, 50)).verdict == AMBIGUOUS


def test_disjoint_by_more_than_noise_is_a_change():
    assert classify(m(1.0), m(1.2)) == (SLOWER, "intervals apart by 17.6%")  # (1.188 - 1.01) / 1.01
    assert classify(m(1.2), m(1.0)).verdict == FASTER
    assert classify(m(1.0), m(1.05)).verdict == SLOWER  # 5% beyond two 1% noises
    # apart, but by less than the clear gap (nvbench's 0.5%): ambiguous, and a wider gap setting decides the same
    close = (m(1.0, 0.001), m(1.01, 0.001))
    assert classify(*close).verdict == SLOWER
    assert classify(*close, Thresholds(min_gap=0.01)) == (AMBIGUOUS, "intervals apart by 0.80% < 1.0%")


def test_few_samples_or_much_noise_is_ambiguous():
    assert classify(m(1.0, samples=9), m(2.0)) == (AMBIGUOUS, "9 samples < 10")
    assert classify(m(1.0), m(2.0, samples=1)).verdict == AMBIGUOUS
    assert classify(m(1.0, samples=4), m(2.0), Thresholds(min_samples=3)).verdict == SLOWER
    noisy = (m(1.0, 0.2), m(2.0, 0.2))  # relative IQR 40% on both sides: ambiguous under the default ceiling
    assert classify(*noisy) == (AMBIGUOUS, "noise 40.0% > 25%")
    assert classify(*noisy, Thresholds(max_noise=0.5)).verdict == SLOWER
    # quartiles that do not hold the median: no interval to judge
    assert classify(Measured(1.0, 1.1, 1.2, 10), m(1.0)).verdict == AMBIGUOUS


def test_same_needs_the_medians_closer_than_either_iqr():
    assert classify(m(1.0, 0.05), m(1.03, 0.05)) == (SAME, "medians 3.0% apart, within both IQRs")
    assert classify(m(1.0, 0.01), m(1.0, 0.10)).verdict == SAME
    assert classify(Measured(1.0, 1.0, 1.0, 10), Measured(1.0, 1.0, 1.0, 10)).verdict == SAME  # no spread, no shift
    # overlapping, the medians 5% apart: beyond OLD's 2% IQR, neither the same nor a change
    assert classify(m(1.0, 0.01), m(1.05, 0.05)) == (AMBIGUOUS, "intervals overlap, medians 5.0% apart: beyond an IQR")


def test_rows_without_quartiles_compare_by_ratio():
    assert classify(Measured(1.0), Measured(1.2)) == (SLOWER, "ratio 1.200 >= 1.050, no quartiles")
    assert classify(Measured(1.0), Measured(1.04)).verdict == SAME
    assert classify(Measured(1.0), Measured(0.95)).verdict == FASTER  # 1/0.95 = 1.053: beyond the tolerance
    assert classify(Measured(1.0), Measured(0.96)).verdict == SAME
    assert classify(Measured(1.0), Measured(1.2), Thresholds(tolerance=0.25)).verdict == SAME
    assert classify(Measured(1.0), m(1.2)).verdict == SLOWER  # one side without quartiles: the ratio decides


def test_reference_tables_compare_by_ratio_with_the_stated_tolerance(tmp_path):
    """The reference GEMM table against a copy with every row of 10 keys 20% slower: those 10 are slower."""
    path = REFERENCE / "gemm/vllm/0.24.0/gemm_perf.parquet"
    table = pq.read_table(path)
    keys = ["op_name", "gemm_dtype", "m", "n", "k"]
    planted = table.select(keys).group_by(keys).aggregate([]).sort_by([(k, "ascending") for k in keys]).slice(0, 10)
    labels = {",".join(f"{k}={r[k]}" for k in keys) for r in planted.to_pylist()}
    hit = pc.is_in(
        pc.binary_join_element_wise(*[pc.cast(table[k], pa.string()) for k in keys], "|"),
        value_set=pa.array(["|".join(str(r[k]) for k in keys) for r in planted.to_pylist()]),
    )
    latency = pc.if_else(hit, pc.multiply(table["latency"], 1.2), table["latency"])
    slow = tmp_path / "gemm_perf.parquet"
    pq.write_table(table.set_column(table.schema.get_field_index("latency"), "latency", latency), slow)

    c = compare_tables(path, slow)
    assert {r.key for r in c.rows if r.verdict == SLOWER} == labels
    assert c.counts == {SAME: c.shared - 10, FASTER: 0, SLOWER: 10, AMBIGUOUS: 0} and c.by_ratio == c.shared
    done = run_cli("compare", str(path), str(slow))
    assert done.returncode == 0, done.stderr
    counts = f"verdicts: {c.shared - 10} same, 0 faster, 10 slower, 0 ambiguous ({c.shared} of them by ratio"
    assert counts in done.stdout
    assert "the same when NEW/OLD is within [0.952, 1.050] (tolerance 5%)" in done.stdout
    wide = run_cli("compare", str(path), str(slow), "--tolerance", "0.25")
    assert f"verdicts: {c.shared} same, 0 faster, 0 slower" in wide.stdout and "(tolerance 25%)" in wide.stdout
    bad = run_cli("compare", str(path), str(slow), "--tolerance", "-1")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--tolerance" in bad.stderr


# --- two real CPU collections of one plan

SHAPES = [(m, n, k) for m in (1, 4, 8, 32) for n in (64, 128, 256) for k in (64, 256, 1024, 4096)]
SHARDS = 4


@pytest.fixture(scope="module")
def reruns(tmp_path_factory):
    """OLD and NEW: two collections of one float32 GEMM plan on this CPU, each merged into its own TABLES.

    Each is the whole plan run as SHARDS shards (as a Slurm collection runs it), the two taken in turn (OLD 0, NEW 0,
    OLD 1, ...) so a change of the machine's load over the minute falls on both alike: on a shared machine a run
    can be 10% slower throughout than the one before it, a change the classifier rightly reports. Two workers of one
    thread each: a single-threaded GEMM is timed without waiting on a preempted second thread. At least 10 samples a
    case (the CPU default stops at 5), so the quartiles of every row pass compare's sample floor."""
    tmp_path = tmp_path_factory.mktemp("reruns")
    cases = [GemmCase("float32", *shape) for shape in SHAPES]
    whole = plan_of_cases("torch", "cpu", "gemm", cases, "torch.nn.functional.linear", collector_hash(ROOT))
    write_plan(whole, tmp_path / "plan.json")
    runs: dict[str, list[Path]] = {"old": [], "new": []}
    for index in range(SHARDS):
        shard = tmp_path / f"plan-{index}.json"
        write_plan(shard_of(whole, index, SHARDS), shard)
        for name, dirs in runs.items():
            dirs.append(tmp_path / f"{name}-run-{index}")
            args = ("--plan", str(shard), "--out", str(dirs[-1]), "--device", "cpu", "--workers", "2")
            done = run_cli("run", *args, "--min-samples", "10", timeout=600)
            assert done.returncode == 0, done.stderr[-2000:]
    tables = {name: tmp_path / f"{name}-tables" for name in runs}
    for name, dirs in runs.items():
        merge(dirs, tables[name], find_project(), plans=(tmp_path / "plan.json",), say=lambda line: None)
    return tmp_path, runs, tables


def _perf(tables):
    [path] = tables.rglob("gemm_perf.parquet")
    return path


def _label(row: dict) -> str:
    return ",".join(f"{k}={row[k]}" for k in ("op_name", "gemm_dtype", "m", "n", "k"))


def test_a_rerun_is_same_exactly_where_the_rule_says_and_never_moves_where_intervals_overlap(reruns):
    """Verdicts on two real collections follow each row's own intervals. How many rows a re-run leaves "same" is a
    property of the machine (on a shared VM a process can run 5% slower throughout than the one before it while its
    10 samples agree within 1%), so the counts are printed for the record and the rule is checked row by row."""
    _, _, tables = reruns
    old, new = tables["old"], tables["new"]
    done = run_cli("compare", str(old), str(new), "--op", "gemm")
    assert done.returncode == 0, done.stderr
    print(done.stdout)  # the counts of this machine's re-run, for the record
    same, faster, slower, ambiguous = map(int, COUNTS.search(done.stdout).groups())
    assert same + faster + slower + ambiguous == len(SHAPES)
    before = {_label(r): r for r in pq.read_table(_perf(old)).to_pylist()}
    overlapping, close, apart = set(), set(), set()
    for r in pq.read_table(_perf(new)).to_pylist():
        o = before[_label(r)]
        quiet = all(x["samples"] >= T.min_samples and x["noise"] <= T.max_noise for x in (r, o))
        low, high = sorted((r, o), key=lambda x: x["latency"])
        if max(r["latency_p25"], o["latency_p25"]) <= min(r["latency_p75"], o["latency_p75"]):
            overlapping.add(_label(r))
            shift = abs(r["latency"] - o["latency"])
            if quiet and shift <= min(x["latency_p75"] - x["latency_p25"] for x in (r, o)):
                close.add(_label(r))
        elif quiet and high["latency_p25"] >= low["latency_p75"] * (1 + T.min_gap):
            apart.add(_label(r))
    c = compare_tables(old, new)
    assert {r.key for r in c.rows if r.verdict == SAME} == close and same == len(close)
    assert {r.key for r in c.rows if r.verdict in MOVED}.isdisjoint(overlapping)
    changes = done.stdout.split("beyond both rows' noise):\n", 1)[1].split("largest deviations:", 1)[0]
    assert not any(f"{key}:" in changes for key in overlapping), changes
    assert {r.key for r in c.rows if r.verdict in MOVED} == apart and faster + slower == len(apart)


def test_a_planted_slowdown_of_10_rows_is_slower_for_exactly_those(reruns):
    tmp_path, runs, tables = reruns
    new = tables["new"]
    planted_runs = [tmp_path / f"planted-{run_dir.name}" for run_dir in runs["new"]]
    for run_dir, copy in zip(runs["new"], planted_runs):
        shutil.copytree(run_dir, copy)
    shards = sorted(shard for run_dir in planted_runs for shard in (run_dir / "shards").glob("*.jsonl"))
    # 10 rows whose noise lets a 20% change show: 1.2 * p25 clears p75 by the clear gap, and a verdict is allowed
    stats = {}
    for shard in shards:
        for line in shard.read_text().splitlines():
            record = json.loads(line)
            if record.get("status") == "ok":
                stats[record["case_id"]] = record["stats"]
    fit = [
        case
        for case, s in sorted(stats.items())
        if 1.2 * s["latency_p25"] > s["latency_p75"] * (1 + T.min_gap)
        and s["noise"] <= T.max_noise
        and s["samples"] >= T.min_samples
    ]
    assert len(fit) >= 10, f"only {len(fit)} rows of {len(stats)} are quiet enough for a 20% change to show"
    chosen = set(random.Random(10).sample(fit, 10))
    for shard in shards:
        lines = []
        for line in shard.read_text().splitlines():
            record = json.loads(line)
            if record.get("case_id") in chosen:
                for column in ("latency", "latency_p25", "latency_p75"):
                    record["stats"][column] *= 1.2
                line = json.dumps(record, separators=(",", ":"))
            lines.append(line)
        shard.write_text("\n".join(lines) + "\n")
    planted = tmp_path / "planted-tables"
    merge(planted_runs, planted, find_project(), plans=(tmp_path / "plan.json",), say=lambda line: None)  # our writer
    rows = pq.read_table(_perf(planted)).to_pylist()
    labels = {_label(r) for r in rows if r["case_id"] in chosen}
    assert len(labels) == 10

    c = compare_tables(new, planted)
    assert {r.key for r in c.rows if r.verdict == SLOWER} == labels
    assert all(r.verdict in (SAME, AMBIGUOUS) for r in c.rows if r.key not in labels)
    assert all(r.ratio == pytest.approx(1.2) for r in c.rows if r.key in labels)
    done = run_cli("compare", str(new), str(planted), "--plot", str(tmp_path / "planted.png"))
    assert done.returncode == 0, done.stderr
    assert "largest real changes (10 rows faster or slower beyond both rows' noise):" in done.stdout
    assert all(f"  {key}: slower x1.200" in done.stdout for key in labels), done.stdout
    assert (tmp_path / "planted.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
