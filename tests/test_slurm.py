"""Scale-out on a real Slurm: the one-node cluster scripts/slurm_up.sh starts (.ci/run does) runs a torch CPU
collection as an array of plan shards plus a dependent merge job; a task cancelled part-way is resubmitted with
--resume and the tables end with every planned case exactly once; without sbatch or a controller, one line and
exit 2."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import run_cli

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
