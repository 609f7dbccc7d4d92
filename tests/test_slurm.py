"""Scale-out on a real Slurm: the one-node cluster scripts/slurm_up.sh starts (.ci/run does) runs a torch CPU
collection as an array of plan shards plus a dependent merge job; a task cancelled part-way is resubmitted with
--resume and the tables end with every planned case exactly once; without sbatch or a controller, one line and
exit 2."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import run_cli, slurm_says

CPU_SMOKE = ("--sm", "cpu", "--smoke", "--ops", "gemm,attention_context,moe")


@pytest.fixture(scope="module")
def cluster(request):
    """A Slurm controller that answers with an idle node; CI passes --require-slurm so these never skip there."""
    ok = shutil.which("sinfo") is not None and subprocess.run(
        ["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30
    ).stdout.split()[:1] in (["idle"], ["mixed"], ["allocated"])
    if not ok:
        if request.config.getoption("--require-slurm"):
            pytest.fail("a Slurm cluster is required (scripts/slurm_up.sh starts one)")
        pytest.skip("no Slurm controller answers; scripts/slurm_up.sh starts a one-node cluster")


def _wait_for(job: str, seconds: float = 600) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        queued = subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip()
        if not queued:
            return
        time.sleep(1)
    pytest.fail(f"job {job} still queued after {seconds} s")


def _jobs(stdout: str) -> tuple[str, str]:
    words = stdout.split()
    return words[words.index("array") + 2], words[words.index("merge") + 2]


def _table_keys(tables: Path) -> dict[str, list[str]]:
    """case_ids per table (perf and failures together), sorted, duplicates kept."""
    keys: dict[str, list[str]] = {}
    for perf in sorted(tables.rglob("*_perf.parquet")):
        name = perf.name.removesuffix("_perf.parquet")
        failures = perf.parent / ".opcollect" / f"{name}_failures.parquet"
        ids = (
            pq.read_table(perf, columns=["case_id"])["case_id"].to_pylist()
            if "case_id" in pq.read_schema(perf).names
            else []
        )
        if failures.is_file():
            ids += pq.read_table(failures, columns=["case_id"])["case_id"].to_pylist()
        keys[name] = sorted(ids)
    return keys


def _planned(plan: Path) -> list[str]:
    return sorted(cid for op in json.loads(plan.read_text())["ops"].values() for cid in op["case_id"])


def test_an_array_of_three_shards_and_its_merge_equal_a_local_run(cluster, tmp_path):
    root, tables = tmp_path / "run", tmp_path / "tables"
    done = run_cli(
        "collect", "torch", "--slurm", "--shards", "3", *CPU_SMOKE, "--out", str(root), "--tables", str(tables)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    array, merge = _jobs(done.stdout)
    assert f"squeue -j {array},{merge}" in done.stdout
    for script in ("collect.sbatch", "merge.sbatch"):
        assert (root / script).read_text().startswith("#!/bin/bash\n#SBATCH --job-name=")
    assert "#SBATCH --array=0-2" in (root / "collect.sbatch").read_text()
    # the shards are disjoint and together the plan; each run directory names its shard
    shard_ids = [_planned(root / f"shard-{i}" / "plan.json") for i in range(3)]
    assert sorted(sum(shard_ids, [])) == _planned(root / "plan.json") and all(shard_ids)
    _wait_for(merge)
    for i in range(3):
        assert json.loads((root / f"shard-{i}" / "run.json").read_text())["shard"] == f"{i}/3"
    status = run_cli("status", str(root))
    assert status.returncode == 0 and "3 shards: 3 done" in status.stdout, status.stdout

    local = tmp_path / "local"
    ran = run_cli("run", "--plan", str(root / "plan.json"), "--out", str(local), "--device", "cpu")
    assert ran.returncode == 0, ran.stderr
    merged = run_cli("merge", str(local), "--into", str(tmp_path / "local-tables"))
    assert merged.returncode == 0, merged.stderr
    assert _table_keys(tables) == _table_keys(tmp_path / "local-tables") != {}
    log = (root / "logs" / f"opcollect-merge-{merge}.out").read_text()
    assert "check " in log and " 0 violations" in log


def test_a_cancelled_task_is_resubmitted_and_every_case_lands_once(cluster, tmp_path):
    root, tables = tmp_path / "run", tmp_path / "tables"
    args = ("--sm", "cpu", "--ops", "gemm", "--case-filter", "gemm:float32", "--max-case-seconds", "0.2")
    done = run_cli("collect", "torch", "--slurm", "--shards", "3", *args, "--out", str(root), "--tables", str(tables))
    assert done.returncode == 0, done.stdout + done.stderr
    array, merge = _jobs(done.stdout)
    victim = root / "shard-1"
    end = time.monotonic() + 300
    while time.monotonic() < end:  # cancel task 1 part-way: some of its cases recorded, not all
        recorded = sum(1 for p in (victim / "shards").glob("*.jsonl") for line in p.read_text().splitlines()
                       if '"case_id"' in line) if (victim / "shards").is_dir() else 0  # fmt: skip
        if recorded >= 2:
            break
        time.sleep(0.2)
    subprocess.run(["scancel", f"{array}_1"], check=True)
    _wait_for(merge)
    status = run_cli("status", str(root)).stdout
    assert "shard 1: failed" in status and "--resume" in status, status
    planned = _planned(root / "plan.json")
    partial = _table_keys(tables)["gemm"]
    assert 0 < len(partial) < len(planned)
    meta = (next(tables.rglob("gemm/torch/*/collection_meta.yaml"))).read_text()
    assert "status: partial" in meta

    again = run_cli("collect", "torch", "--slurm", "--resume", str(root), "--max-case-seconds", "0.2")
    assert again.returncode == 0, again.stdout + again.stderr
    array2, merge2 = _jobs(again.stdout)
    assert "(tasks 1)" in again.stdout
    _wait_for(merge2)
    assert _table_keys(tables)["gemm"] == planned  # every planned case exactly once
    assert "status: complete" in next(tables.rglob("gemm/torch/*/collection_meta.yaml")).read_text()
    assert "3 shards: 3 done" in run_cli("status", str(root)).stdout
    nothing = run_cli("collect", "torch", "--slurm", "--resume", str(root))
    assert nothing.returncode == 0 and "every shard is done" in nothing.stdout


def test_without_sbatch_or_a_controller_it_is_one_line_and_exit_2(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    done = run_cli("collect", "torch", "--slurm", *CPU_SMOKE, "--out", str(tmp_path / "a"), env={"PATH": str(empty)})
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "sbatch not found on PATH" in done.stderr
    assert not (tmp_path / "a").exists()
    if shutil.which("sbatch") is None:
        pytest.skip("no Slurm client commands here for the controller check")
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "ClusterName=nowhere\nSlurmctldHost=localhost\nSlurmctldPort=6999\nMessageTimeout=2\nAuthType=auth/munge\n"
        "NodeName=localhost CPUs=1 State=UNKNOWN\nPartitionName=p Nodes=localhost Default=YES\n"
    )
    done = run_cli(
        "collect", "torch", "--slurm", *CPU_SMOKE, "--out", str(tmp_path / "b"), env={"SLURM_CONF": str(conf)}
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "the Slurm controller does not answer" in done.stderr and not (tmp_path / "b").exists()


def test_each_container_runtime_runs_the_collector_image_in_the_array_script(tmp_path):
    from opcollect.cluster.scripts import SlurmOptions, array_script, merge_script

    image = "opcollect/vllm:0.24.0-0123456789ab"
    base = dict(shards=4, partition="gpu", account="perf", time="4:00:00", gpus_per_task=1, image=image)
    expected = {
        "pyxis": f"srun --ntasks=1 --container-image={image} --container-mounts=",
        "apptainer": f"apptainer exec --nv --bind {tmp_path}:{tmp_path} docker://{image} python3 -m opcollect run",
        "docker": 'docker run --rm --ipc=host --gpus "device=${CUDA_VISIBLE_DEVICES:-all}" '
        f"-v {tmp_path}:{tmp_path} {image} run",
        "none": "-m opcollect run",
    }
    for runtime, command in expected.items():
        script = array_script(tmp_path, SlurmOptions(runtime=runtime, run_flags=("--max-noise", "0.1"), **base))
        assert command in script, (runtime, script)
        for line in ("#SBATCH --array=0-3", "#SBATCH --partition=gpu", "#SBATCH --account=perf",
                     "#SBATCH --time=4:00:00", "#SBATCH --gpus-per-task=1"):  # fmt: skip
            assert line in script.splitlines(), (runtime, line)
        assert '--device cuda --max-noise 0.1 "${resume[@]}"' in script
        # the script runs as bash parses it
        assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    merge = merge_script(tmp_path / "run root", tmp_path / "tables", SlurmOptions(shards=4), tmp_path)
    assert f"root='{tmp_path / 'run root'}'" in merge and '--plan "$root/plan.json"' in merge
    assert "--array" not in merge and subprocess.run(["bash", "-n"], input=merge, text=True).returncode == 0


def test_gpus_per_task_is_as_asked_zero_too_else_one_on_a_gpu_and_none_on_the_cpu(tmp_path):
    from opcollect.cluster.scripts import SlurmOptions, array_script
    from opcollect.cluster.submit import SlurmRequest

    def ask(gpus):
        return SlurmRequest(shards=2, partition=None, account=None, time=None, gpus_per_task=gpus, runtime="none",
                            resume=None)  # fmt: skip

    found = {(gpus, sm): ask(gpus).gpus_for(sm) for gpus in (None, 0, 2) for sm in ("90", "cpu")}
    assert found == {(None, "90"): 1, (None, "cpu"): 0, (0, "90"): 0, (0, "cpu"): 0, (2, "90"): 2, (2, "cpu"): 2}
    lines = array_script(tmp_path, SlurmOptions(shards=2, gpus_per_task=ask(0).gpus_for("90"))).splitlines()
    assert not [line for line in lines if "--gpus" in line]


# -- every value that reaches an #SBATCH line is validated where it enters (no Slurm needed) ---------------

GOOD = dict(shards=4, partition="gpu", account="perf", time="4:00:00", gpus_per_task=1, cpus_per_task=2,
            runtime="docker", image="opcollect/vllm:0.24.0-0123456789ab", device="cuda")  # fmt: skip


@pytest.mark.parametrize(
    "field, value, flag",
    [
        ("time", "1:00:00\ntouch x", "--time"),  # anchored at the end: the next line would be bash's
        ("time", "1:00:00\n", "--time"),
        ("time", "touch x\n1:00:00", "--time"),  # and at the start
        ("time", "1:00:00 --uid=0", "--time"),
        ("time", "4:00:00#x", "--time"),
        ("time", "\u0661:00:00", "--time"),  # an Arabic-Indic digit is no ASCII digit
        ("partition", "gpu\ntouch x", "--partition"),
        ("partition", "gpu\n", "--partition"),
        ("partition", "touch x\ngpu", "--partition"),
        ("partition", "gpu --uid=0", "--partition"),
        ("partition", "", "--partition"),
        ("account", "perf\ntouch x", "--account"),
        ("account", "perf\n", "--account"),
        ("account", "perf#x", "--account"),
        ("gpus_per_task", 65, "--gpus-per-task"),
        ("gpus_per_task", -1, "--gpus-per-task"),
        ("gpus_per_task", "1\ntouch x", "--gpus-per-task"),
        ("gpus_per_task", True, "--gpus-per-task"),
        ("cpus_per_task", 0, "--cpus-per-task"),
        ("cpus_per_task", "2\ntouch x", "--cpus-per-task"),
        ("shards", 0, "--shards"),
        ("shards", 1001, "--shards"),
        ("device", "cuda\ntouch x", "--device"),
        ("runtime", "docker\n", "--container-runtime"),
        ("image", "opcollect/vllm:1\n", "collector image"),
        ("image", "opcollect/vllm:1 --privileged", "collector image"),
    ],
)
def test_each_sbatch_value_is_validated_where_it_enters(tmp_path, field, value, flag):
    from opcollect.cluster.scripts import SlurmOptions, array_script
    from opcollect.errors import InputError

    script = array_script(tmp_path, SlurmOptions(**GOOD))  # the good options render, with every value present
    for line in ("#SBATCH --partition=gpu", "#SBATCH --account=perf", "#SBATCH --time=4:00:00",
                 "#SBATCH --gpus-per-task=1", "#SBATCH --cpus-per-task=2", "#SBATCH --array=0-3"):  # fmt: skip
        assert line in script.splitlines()
    with pytest.raises(InputError, match=re.escape(flag)):
        SlurmOptions(**{**GOOD, field: value})


def test_slurm_time_limits_in_each_of_sbatchs_forms_are_accepted():
    from opcollect.cluster.scripts import SlurmOptions

    for time_limit in ("90", "1440", "30:00", "4:00:00", "1-00", "1-12:00", "2-00:00:00", "0"):
        assert SlurmOptions(1, time=time_limit).time == time_limit


def test_the_run_root_reaches_sbatch_in_its_own_quoting_and_is_refused_where_it_cannot(tmp_path):
    from opcollect.cluster.scripts import SlurmOptions, array_script, check_root, merge_script
    from opcollect.errors import InputError

    root = tmp_path / 'a b%j#c"d'
    collect, merge = array_script(root, SlurmOptions(2)), merge_script(root, tmp_path / "t", SlurmOptions(2), tmp_path)
    logs = str(root / "logs").replace("%", "%%").replace('"', '\\"').replace("#", "\\#")
    assert f'#SBATCH --output="{logs}/%x-%A_%a.out"' in collect.splitlines()
    assert f'#SBATCH --output="{logs}/%x-%j.out"' in merge.splitlines()
    for script in (collect, merge):  # the body is bash's: shell-quoted, and parses
        assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    for bad in ("a\nb", "a\rb", "a\tb", "a\\b", "a\udcffb"):
        with pytest.raises(InputError, match="--out"):
            check_root(tmp_path / bad, "--out")
        with pytest.raises(InputError):
            array_script(tmp_path / bad, SlurmOptions(1))
    check_root(tmp_path / "x:y", "--out")  # a colon is fine in a log path ...
    for runtime in ("docker", "pyxis", "apptainer"):  # ... not in a mount spec
        for bad in ("x:y", "x,y"):
            with pytest.raises(InputError, match=f"the {runtime} runtime mounts"):
                check_root(tmp_path / bad, "--out", runtime)


def test_sbatch_writes_the_log_of_a_run_root_with_spaces_quotes_hashes_and_percents(cluster, tmp_path):
    from opcollect.cluster.scripts import SlurmOptions, _header

    root = tmp_path / 'a b%j#c"d'
    (root / "logs").mkdir(parents=True)
    script = root / "t.sbatch"
    script.write_text("\n".join([*_header("opcollect-quoting", SlurmOptions(1, time="5"), root / "logs", True),
                                 "echo the-task-ran"]) + "\n")  # fmt: skip
    job = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=True)
    job_id = job.stdout.strip().split(";")[0]
    _wait_for(job_id, 120)
    log = root / "logs" / f"opcollect-quoting-{job_id}_0.out"
    end = time.monotonic() + 30
    while not log.is_file() and time.monotonic() < end:
        time.sleep(0.2)
    assert log.read_text().strip() == "the-task-ran", sorted(p.name for p in (root / "logs").iterdir())


# -- status counts what each shard's own plan holds ----------------------------------------------------------


def _status_root(tmp_path, shards: int = 2):
    from opcollect.cluster.record import SlurmRecord, Submission, write_record
    from opcollect.cluster.submit import prepare_root
    from opcollect.plans.planner import PlanOptions
    from opcollect.project import find_project

    root, planned = prepare_root(find_project(), "torch", "cpu", PlanOptions(ops=("gemm",), smoke=True), shards,
                                 tmp_path / "run")  # fmt: skip
    write_record(root, SlurmRecord(shards, (Submission("999999990", "999999991", tuple(range(shards))),), None))
    return root, planned


def _record(shard, case_ids, status="ok"):
    (shard / "run.json").write_text("{}")
    (shard / "shards").mkdir(exist_ok=True)
    with open(shard / "shards" / "w0.jsonl", "a") as out:
        for case_id in case_ids:
            out.write(json.dumps({"case_id": case_id, "status": status, "attempt": 1}) + "\n")


def test_status_counts_only_the_records_of_each_shards_own_plan(tmp_path):
    from opcollect.cluster.status import describe, planned_ids, shard_states

    root, planned = _status_root(tmp_path)
    mine, theirs = (sorted(planned_ids(root / f"shard-{i}" / "plan.json")) for i in (0, 1))
    assert mine and theirs and not set(mine) & set(theirs)
    _record(root / "shard-0", theirs)  # shard 1's records, copied into shard 0: none is shard 0's progress
    _record(root / "shard-0", ["gemm:float32:m=1,n=1,k=1", "not a case"])
    states = shard_states(root)
    assert [(s.measured, s.failed, s.planned) for s in states] == [(0, 0, len(mine)), (0, 0, len(theirs))]
    assert all(s.state != "done" for s in states)
    assert f"0/{planned} planned cases recorded" in describe(root, states)
    _record(root / "shard-0", mine[:1], status="failed")
    _record(root / "shard-0", mine[1:])
    [zero, one] = shard_states(root)
    assert (zero.state, zero.measured, zero.failed) == ("done", len(mine) - 1, 1) and one.state != "done"


def test_status_says_how_to_resubmit_exactly_when_a_shard_is_failed_or_incomplete(tmp_path):
    from opcollect.cluster.status import ShardStatus, describe

    hint = f"resubmit the shards not done: opcollect collect ... --slurm --resume {tmp_path}"
    done, running = ShardStatus(0, "done", 4, 0, 4, "COMPLETED"), ShardStatus(1, "running", 1, 2, 4, "RUNNING")
    for other, says in (("failed", True), ("incomplete", True), ("pending", False), ("running", False)):
        text = describe(tmp_path, [done, ShardStatus(2, other, 0, 0, 4, None), running])
        assert (hint in text.splitlines()) is says, other
        # a failed case is recorded: 4 + 1 measured and 2 failed
        assert f"{tmp_path}: 3 shards: " in text and "7/12 planned cases recorded" in text


def test_a_requeued_task_is_pending_and_a_failed_one_failed(tmp_path, monkeypatch):
    """Slurm's states as its own sacct and squeue print them (array job 999999990, _status_root's): a task requeued
    (after a node failure or a preemption) will run again, so its shard is pending, not failed."""
    from opcollect.cluster.status import shard_states

    root, _ = _status_root(tmp_path)
    slurm_says(tmp_path, monkeypatch, "999999990_0|REQUEUED\n999999990_1|FAILED\n")
    assert [(s.state, s.slurm) for s in shard_states(root)] == [("pending", "REQUEUED"), ("failed", "FAILED")]


def test_status_refuses_a_shard_plan_of_another_shard(tmp_path):
    from opcollect.cluster.status import shard_states
    from opcollect.errors import InputError

    root, _ = _status_root(tmp_path)
    shutil.copy(root / "shard-1" / "plan.json", root / "shard-0" / "plan.json")
    with pytest.raises(InputError, match="the plan of shard 1/2, not 0/2"):
        shard_states(root)


def test_the_slurm_record_round_trips_and_each_damage_is_named(tmp_path):
    from opcollect.cluster.record import SlurmRecord, Submission, read_record, write_record
    from opcollect.errors import InputError

    record = SlurmRecord(3, (Submission("12", "13", (0, 1, 2)), Submission("20", "21", (1,))), "/t")
    write_record(tmp_path, record)
    assert read_record(tmp_path) == record
    damaged = {
        '{"shards": 3, "submissions": [': "invalid JSON at line 1",
        "[1, 2]": "a JSON list, not an object",
        "{}": "field 'shards': missing",
        '{"shards": 3}': "field 'submissions': missing",
        '{"shards": "3", "submissions": []}': "field 'shards': '3' is not a whole number",
        '{"shards": 3, "submissions": {}}': "field 'submissions': not a list",
        '{"shards": 3, "submissions": [7]}': "field 'submissions[0]': not an object",
        '{"shards": 3, "submissions": [{"array_job": "1;x", "merge_job": "2", "tasks": [0]}]}':
            "field 'submissions[0].array_job': '1;x' is not a Slurm job ID",
        '{"shards": 3, "submissions": [{"array_job": "1\\n", "merge_job": "2", "tasks": [0]}]}':
            "field 'submissions[0].array_job'",
        '{"shards": 3, "submissions": [{"array_job": "1", "merge_job": "2", "tasks": [3]}]}':
            "field 'submissions[0].tasks': 3 is not a whole number from 0 to 2",
        '{"shards": 3, "submissions": [{"array_job": "1", "merge_job": "2"}]}': "field 'submissions[0].tasks': missing",
        '{"shards": 3, "submissions": [], "tables": 5}': "field 'tables': not a path",
        "[" * 100_000: "JSON nested too deeply",
    }  # fmt: skip
    for text, message in damaged.items():
        (tmp_path / "slurm.json").write_text(text)
        with pytest.raises(InputError, match=re.escape(message)):
            read_record(tmp_path)
    (tmp_path / "slurm.json").write_bytes(b'{"shards": "\xe9"}')
    with pytest.raises(InputError, match="not UTF-8"):
        read_record(tmp_path)
    (tmp_path / "slurm.json").unlink()
    os.mkfifo(tmp_path / "slurm.json")
    with pytest.raises(InputError, match="not a regular file"):
        read_record(tmp_path)
    (tmp_path / "slurm.json").unlink()
    (tmp_path / "elsewhere.json").write_text(json.dumps(record.to_json()))
    (tmp_path / "slurm.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(InputError, match="a symlink"):
        read_record(tmp_path)


def test_a_submission_the_controller_refuses_is_one_line_naming_its_reason(cluster, tmp_path):
    from opcollect.cluster import slurm
    from opcollect.errors import InputError

    script = tmp_path / "refused.sh"
    script.write_text("#!/bin/bash\n#SBATCH --partition=no-such-partition\n#SBATCH --output=/dev/null\ntrue\n")
    with pytest.raises(InputError) as refused:
        slurm.sbatch(script)
    said = str(refused.value)
    assert said.startswith("sbatch refused.sh: the Slurm controller refused or did not answer (sbatch: error: ")
    assert "invalid partition" in said.lower() and "\n" not in said


def test_task_states_read_the_queue_of_an_array_and_a_job_slurm_does_not_know_is_none(cluster, tmp_path):
    from opcollect.cluster import slurm

    script = tmp_path / "sleepers.sh"
    script.write_text("#!/bin/bash\n#SBATCH --array=0-1\n#SBATCH --output=/dev/null\nsleep 120\n")
    job = slurm.sbatch(script)
    try:
        states = slurm.task_states(job)
    finally:
        subprocess.run(["scancel", job], check=False)
    # squeue answers for both tasks (sacct refuses here: this cluster keeps no accounting storage)
    assert sorted(states) == [0, 1] and set(states.values()) <= {"PENDING", "RUNNING", "CONFIGURING"}, states
    # a job ID the queue does not know: squeue refuses it and sacct has no accounting: Slurm does not say
    assert slurm.task_states("999999") is None
