"""Bad input and a bad environment: exit 2 and ONE line naming the file, flag or value and the fix; no traceback.

ROWS is the table: each row prepares files under tmp_path (a tree copy, a corrupt file, a plan, a full or
read-only tmpfs), runs `python -m opcollect ARGS` in a real subprocess and checks the exit code, a fragment
of the message, that the message is one line, and that nothing printed a traceback. `check` reports what
it finds in a table as a violation on stdout and exits 1; its rows say so (code=1).

Placeholders in the arguments and paths: {tmp} (tmp_path), {tree} (a copy of the checkout's inputs),
{tables} (a merged TABLES tree), {run} (a run directory), {plan} (a CPU plan file of one GEMM case).
Rows marked runs_plan get as far as loading the backend (the subprocess imports torch): they are few.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Callable

import pytest
from conftest import REFERENCE, ROOT, fake_run, gemm_plan, run_cli
from crafted_plans import crafted, rename_op, set_column, set_key, set_op_key

from opcollect.plans.gemm import GemmCase
from opcollect.project import find_project
from opcollect.tables.merge import merge

CASES = [GemmCase("bfloat16", m, 1024, 1024) for m in (1, 8)]
DIR = "h200_sxm/gemm/vllm/0.24.0"
NO_ENGINE = {"DOCKER_HOST": "tcp://127.0.0.1:1"}  # nothing listens there: no Docker engine, at once
LATIN1 = "# r\xe9glages\n".encode("latin-1")  # a comment saved as Latin-1: not UTF-8


@pytest.fixture(scope="module")
def tables_template(tmp_path_factory) -> Path:
    """One merged TABLES tree (two rows of gemm on an H200, vLLM 0.24.0) that rows copy and damage."""
    base = tmp_path_factory.mktemp("template")
    merge([fake_run(base / "run", CASES)], base / "tables", find_project())
    return base / "tables"


class Ctx:
    """What a row's setup and arguments refer to; each part is made only when a row uses it."""

    def __init__(self, tmp: Path, request):
        self.tmp = tmp
        self._request = request
        self.cleanups: list[Callable[[], object]] = []

    @cached_property
    def tree(self) -> Path:
        return self._request.getfixturevalue("tree_copy")

    @cached_property
    def tables(self) -> Path:
        return Path(shutil.copytree(self._request.getfixturevalue("tables_template"), self.tmp / "tables"))

    @cached_property
    def run(self) -> Path:
        return fake_run(self.tmp / "run", CASES)

    @cached_property
    def plan(self) -> Path:
        return gemm_plan(self.tmp / "plan.json", [(1, 8, 8)])

    def __getitem__(self, key: str) -> Path:  # str.format_map: "{tree}" -> self.tree
        return getattr(self, key)

    def path(self, template: str) -> Path:
        return Path(template.format_map(self))

    def mount(self, name: str, readonly: bool = False, fill: bool = False) -> Path:
        """A small tmpfs at {tmp}/NAME, read-only or filled to the last byte; unmounted after the row.

        A real file system error, as CI (root) can make it; elsewhere the row is skipped, saying why.
        """
        target = self.tmp / name
        target.mkdir()
        options = "size=256k" + (",ro" if readonly else "")
        try:
            done = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", options, "opcollect-test", str(target)], capture_output=True, text=True
            )
        except OSError as exc:
            pytest.skip(f"no mount command ({exc.strerror}): a tmpfs needs root with CAP_SYS_ADMIN, as in CI")
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs ({done.stderr.strip()}): needs root with CAP_SYS_ADMIN, as in CI")
        self.cleanups.append(lambda: subprocess.run(["umount", "-l", str(target)], capture_output=True))
        if fill:
            fd = os.open(target / "fill", os.O_WRONLY | os.O_CREAT)
            try:
                while True:
                    os.write(fd, b"\0" * 4096)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
            finally:
                os.close(fd)
        return target


# --- setups: small functions of a Ctx ------------------------------------------------------------------


def replace(where: str, old: str, new: str):
    """Replace the first `old` by `new` in the text file at `where`."""

    def setup(c: Ctx) -> None:
        path = c.path(where)
        text = path.read_text()
        assert old in text, (path, old)
        path.write_text(text.replace(old, new, 1))

    return setup


def write(where: str, data: bytes | str):
    def setup(c: Ctx) -> None:
        path = c.path(where)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data if isinstance(data, bytes) else data.encode())

    return setup


def prepend(where: str, data: bytes):
    def setup(c: Ctx) -> None:
        path = c.path(where)
        path.write_bytes(data + path.read_bytes())

    return setup


def edit_json(where: str, change: Callable[[object], object]):
    """Load the JSON file at `where`, let `change` edit it in place, write it back."""

    def setup(c: Ctx) -> None:
        path = c.path(where)
        data = json.loads(path.read_text())
        change(data)
        path.write_text(json.dumps(data))

    return setup


def both(*setups):
    def setup(c: Ctx) -> None:
        for one in setups:
            one(c)

    return setup


def model_config(**config) -> Callable[[Ctx], None]:
    base = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336}
    return write("{tmp}/config.json", json.dumps({"architectures": ["LlamaForCausalLM"], **base, **config}))


def rehash(rel: str):
    """Make manifest.json agree with the file at TABLES/rel again: a tree that verifies but does not read."""

    def setup(c: Ctx) -> None:
        manifest = c.tables / "manifest.json"
        data = json.loads(manifest.read_text())
        path = c.tables / rel
        data["files"][rel] = {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "size": path.stat().st_size}
        manifest.write_text(json.dumps(data, indent=1) + "\n")

    return setup


def full(c: Ctx) -> None:
    c.mount("full", fill=True)


def readonly(c: Ctx) -> None:
    c.mount("ro", readonly=True)


def drop(*keys: str):
    """Delete a nested key of a JSON object: drop('ops', 'gemm', 'columns')."""

    def change(data) -> None:
        for key in keys[:-1]:
            data = data[key]
        del data[keys[-1]]

    return change


# --- value rules (issue 21): merge admits only rows that pass them, check enforces them ---------------------


def perf_column(column: str, value, row: int | None = None):
    """Set a column of the template's gemm_perf.parquet to ``value`` (in one ``row``, or all)."""

    def setup(c: Ctx) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = c.path(PERF)
        table = pq.read_table(path)
        values = table[column].to_pylist()
        values = [value if row is None or i == row else v for i, v in enumerate(values)]
        index = table.schema.get_field_index(column)
        pq.write_table(table.set_column(index, column, pa.array(values, table.schema.field(column).type)), path)

    return setup


def run_plan_of(k: object):
    """Replace {run}'s plan by one whose single GEMM case has this k (hashes made to agree: a crafted plan)."""

    def setup(c: Ctx) -> None:
        from opcollect.plans.hashes import collector_hash
        from opcollect.plans.planfile import write_plan
        from opcollect.plans.planner import plan_of_cases

        plan = plan_of_cases("vllm", "90", "gemm", [GemmCase("bfloat16", 1, 8, k)], "cutlass", collector_hash(ROOT))
        write_plan(plan, c.run / "plan.json")
        identity = json.loads((c.run / "run.json").read_text())
        stored = json.loads((c.run / "plan.json").read_text())
        identity.update(plan_hash=stored["plan_hash"], content_hash=stored["content_hash"])
        (c.run / "run.json").write_text(json.dumps(identity))

    return setup


def table_a_directory(c: Ctx) -> None:
    path = c.path(PERF)
    path.unlink()
    path.mkdir()


def event_field(key: str, value=None, *, remove: bool = False):
    def change(data) -> None:
        if remove:
            del data[key]
        else:
            data[key] = value

    return edit_json("{run}/events/r1.json", change)


def link_outside(c: Ctx, rel: str, directory: bool = False) -> None:
    """Make TABLES/rel a symbolic link out of the tree: to {tmp}/elsewhere (a directory), or to
    {tmp}/outside.parquet holding the file's own bytes (so its manifest hash still agrees)."""
    path = c.tables / rel
    if directory:
        (c.tmp / "elsewhere").mkdir()
        (c.tmp / "elsewhere" / "gemm_perf.parquet").write_bytes(b"x")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(c.tmp / "elsewhere")
        return
    (c.tmp / "outside.parquet").write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(c.tmp / "outside.parquet")


# --- the table -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    id: str
    args: tuple[str, ...]
    needle: str  # a fragment of the one-line message
    setup: Callable[[Ctx], None] | None = None
    code: int = 2  # 1: a `check` violation, reported on stdout
    env: dict | None = None
    runs_plan: bool = False  # the subprocess loads the backend (imports torch)
    timeout: float = 120


PLAN = ("plan", "--ops", "gemm", "--smoke")
PLAN_TREE = (*PLAN, "--root", "{tree}")
MERGE_TREE = ("merge", "{run}", "--into", "{tmp}/new-tables", "--root", "{tree}")
BUILD_TREE = ("build", "vllm", "--root", "{tree}")
RUN = ("run", "--plan", "{plan}", "--out", "{tmp}/out", "--device", "cpu")
COMPARE = ("compare", "{tables}", "{tables}")
GEMM_YAML = "{tree}/cases/base_ops/gemm.yaml"
PERF = "{tables}/" + DIR + "/gemm_perf.parquet"
FAILURES = "{tables}/" + DIR + "/.opcollect/gemm_failures.parquet"
MANIFEST = "{tables}/manifest.json"
PINS = "{tree}/pins.yaml"
CHECK = ("check", "{tables}")
MERGE_RUN = ("merge", "{run}", "--into", "{tmp}/new-tables")
PERF_RULE = "{tables}/" + DIR + "/gemm_perf.parquet: "
EVENT = "{run}/events/r1.json: "

# pins.yaml without its vLLM entry: the commands that need that pin name it before anything else
UNPIN_VLLM = replace(
    PINS,
    "  vllm:\n    current: 0.24.0\n    versions:\n      0.24.0:\n        image: ",
    "  # vllm:\n    # current: 0.24.0\n    # versions:\n      # 0.24.0:\n        # image: ",
)

ROWS = [
    # --- case YAML, model profiles, systems, pins -------------------------------------------------------
    Row("case-yaml-not-utf8", PLAN_TREE, "gemm.yaml: not UTF-8 (byte 0xe9", prepend(GEMM_YAML, LATIN1)),
    Row(
        "profile-yaml-not-utf8",
        PLAN_TREE,
        "LlamaForCausalLM.yaml: not UTF-8",
        prepend("{tree}/cases/models/LlamaForCausalLM.yaml", LATIN1),
    ),
    Row("case-yaml-syntax", PLAN_TREE, "gemm.yaml: line 8 invalid YAML", replace(GEMM_YAML, "int4_wo]", "int4_wo")),
    Row(
        "grid-duplicate-dtype",
        PLAN_TREE,
        "field 'grid.dtypes': Value error, 'bfloat16' is listed twice; list each value once",
        replace(GEMM_YAML, "dtypes: [float32, bfloat16, fp8", "dtypes: [float32, bfloat16, bfloat16, fp8"),
    ),
    Row(
        "narrowed-grid-duplicate-dtype",
        PLAN_TREE,
        "field 'narrowed.cpu.dtypes': Value error, 'float32' is listed twice",
        replace(GEMM_YAML, "dtypes: [float32, bfloat16, int4_wo]", "dtypes: [float32, float32, bfloat16, int4_wo]"),
    ),
    Row(
        "moe-duplicate-distribution",
        PLAN_TREE,
        "field 'grid.distributions': Value error, 'balanced' is listed twice",
        replace("{tree}/cases/base_ops/moe.yaml", "[balanced, power_law_1.01", "[balanced, balanced, power_law_1.01"),
    ),
    Row(
        "attention-duplicate-precision",
        PLAN_TREE,
        "field 'grid.precisions': Value error, {{'attn_dtype': 'bfloat16', 'kv_cache_dtype': 'fp8'}} is listed twice",
        replace(
            "{tree}/cases/base_ops/attention_context.yaml",
            "    - {attn_dtype: bfloat16, kv_cache_dtype: fp8}\n",
            "    - {attn_dtype: bfloat16, kv_cache_dtype: fp8}\n    - {attn_dtype: bfloat16, kv_cache_dtype: fp8}\n",
        ),
    ),
    Row(
        "profile-kv-heads-above-heads",
        PLAN_TREE,
        "models[0].config: field 'num_key_value_heads': Value error, 64 is greater than num_attention_heads 32",
        replace("{tree}/cases/models/LlamaForCausalLM.yaml", "num_key_value_heads: 8", "num_key_value_heads: 64"),
    ),
    Row(
        "systems-yaml-not-utf8",
        MERGE_TREE,
        "h200_sxm.yaml: not UTF-8 (byte 0xe9",
        prepend("{tree}/systems/h200_sxm.yaml", LATIN1),
    ),
    Row(
        "systems-same-device-twice",
        MERGE_TREE,
        "h200_sxm.yaml: field 'devices': 'NVIDIA H100 80GB HBM3' is also listed by",
        replace("{tree}/systems/h200_sxm.yaml", "  - NVIDIA H200\n", "  - NVIDIA H200\n  - NVIDIA H100 80GB HBM3\n"),
    ),
    Row(
        "systems-yaml-schema-1",
        MERGE_TREE,
        "h200_sxm.yaml: field 'schema_version': Input should be 2 (got 1)",
        replace("{tree}/systems/h200_sxm.yaml", "schema_version: 2\n", "schema_version: 1\n"),
    ),
    Row(
        "systems-yaml-consumer-spec-misspelled",
        MERGE_TREE,
        "h200_sxm.yaml: field 'aiconfigurator.gpu.memory_bw': unknown field; remove it or fix its spelling "
        "(did you mean 'mem_bw'?)",
        replace("{tree}/systems/h200_sxm.yaml", "    mem_bw: ", "    memory_bw: "),
    ),
    Row(
        "systems-figure-negative",
        MERGE_TREE,
        "h200_sxm.yaml: field 'dense_tflops.fp8': Input should be greater than 0 (got -1979)",
        replace("{tree}/systems/h200_sxm.yaml", "  fp8: 1979\n", "  fp8: -1979\n"),
    ),
    Row(
        "pins-tag-is-another-version",
        BUILD_TREE,
        "pins.yaml: field 'backends.vllm': Value error, version '0.24.0' pins image tag 'v0.23.0'",
        replace(PINS, "vllm/vllm-openai:v0.24.0@", "vllm/vllm-openai:v0.23.0@"),
        env=NO_ENGINE,
    ),
    Row(
        "pins-tag-with-suffix-is-another-version",
        ("build", "torch", "--root", "{tree}"),
        "version '2.8.0' pins image tag '2.7.1-cuda12.8-cudnn9-runtime'",
        replace(PINS, "pytorch/pytorch:2.8.0-cuda", "pytorch/pytorch:2.7.1-cuda"),
        env=NO_ENGINE,
    ),
    Row(
        "pins-tag-is-a-prefix-of-the-version",
        ("build", "trtllm", "--root", "{tree}"),
        "version '1.3.0rc23' pins image tag '1.3.0rc2'",
        replace(PINS, "release:1.3.0rc23@", "release:1.3.0rc2@"),
        env=NO_ENGINE,
    ),
    Row("pins-not-utf8", BUILD_TREE, "pins.yaml: not UTF-8", prepend(PINS, LATIN1), env=NO_ENGINE),
    Row(
        "pins-broken-before-collect-plans",
        ("collect", "vllm", "--sm", "90", "--out", "{tmp}/out", "--root", "{tree}"),
        "pins.yaml: line",
        replace(PINS, "backends:", "backends: ["),
        env=NO_ENGINE,
    ),
    # --- --model-config JSON -----------------------------------------------------------------------------
    Row(
        "model-config-not-utf8",
        (*PLAN, "--model-config", "{tmp}/config.json"),
        "config.json: not UTF-8 (byte 0xff",
        write("{tmp}/config.json", b'{"architectures": ["LlamaForCausalLM"], "x": "\xff"}'),
    ),
    Row(
        "model-config-architectures-nested",
        (*PLAN, "--model-config", "{tmp}/config.json"),
        "config.json: field 'architectures' is [['X']]; it must be a list of names",
        model_config(architectures=[["X"]]),
    ),
    Row(
        "model-config-architectures-a-string",
        (*PLAN, "--model-config", "{tmp}/config.json"),
        "config.json: field 'architectures' is 'LlamaForCausalLM'; it must be a list of names, "
        'e.g. ["LlamaForCausalLM"]',
        model_config(architectures="LlamaForCausalLM"),
    ),
    Row(
        "model-config-architectures-missing",
        (*PLAN, "--model-config", "{tmp}/config.json"),
        "config.json: missing key 'architectures'",
        write("{tmp}/config.json", '{"hidden_size": 8}'),
    ),
    Row(
        "model-config-architecture-unknown",
        (*PLAN, "--model-config", "{tmp}/config.json"),
        "config.json: unknown architecture 'MambaForCausalLM' and no key 'num_attention_heads'",
        write("{tmp}/config.json", '{"architectures": ["MambaForCausalLM"], "hidden_size": 768}'),
    ),
    Row(
        "model-config-kv-heads-above-heads",
        (*PLAN, "--model-config", "{tmp}/config.json"),
        "config.json: field 'num_key_value_heads': Value error, 64 is greater than num_attention_heads 32; "
        "set it to a divisor of 32",
        model_config(num_key_value_heads=64),
    ),
    Row(
        "model-config-kv-heads-not-dividing",
        (*PLAN, "--model-config", "{tmp}/config.json"),
        "field 'num_key_value_heads': Value error, 5 does not divide num_attention_heads 32",
        model_config(num_key_value_heads=5),
    ),
    Row(
        "model-config-dsv4-compress-ratio-unknown",
        (*PLAN, "--model-config", "{tmp}/config.json"),
        "config.json: field 'compress_ratios': 8 at layer 1 is no DeepSeek-V4 compression; use 0 (sliding window "
        "only), 4 (CSA) or 128 (HCA)",
        write(
            "{tmp}/config.json",
            (ROOT / "tests/data/dsv4_configs/sgl-project--DeepSeek-V4-Flash-FP8_config.json")
            .read_text()
            .replace('"compress_ratios": [\n    0,\n    0,', '"compress_ratios": [\n    0,\n    8,', 1),
        ),
    ),
    Row(
        "model-config-dsa-skip-offset-zero",
        (*PLAN, "--model-config", "{tmp}/config.json"),
        "config.json: field 'index_skip_topk_offset': 0 makes layer 0 reuse a top-k no earlier layer made "
        "(index_topk_freq 4); set it to 1 or more (GLM-5.2: 3)",
        write(
            "{tmp}/config.json",
            (ROOT / "tests/data/sparse_configs/zai-org--GLM-5.2-FP8_config.json")
            .read_text()
            .replace('"index_skip_topk_offset": 3,', '"index_skip_topk_offset": 0,', 1),
        ),
    ),
    Row(
        "model-config-moe-layer-flag-not-0-or-1",
        (*PLAN, "--model-config", "{tmp}/config.json"),
        "config.json: field 'moe_layer_freq': Value error, set it to a positive int (every k-th layer is MoE) or one "
        "0/1 flag per layer (got [0, 2, 1])",
        write(
            "{tmp}/config.json",
            json.dumps(
                {
                    **json.loads((ROOT / "tests/data/sparse_configs/MiniMaxAI--MiniMax-M3_config.json").read_text()),
                    "moe_layer_freq": [0, 2, 1],
                }
            ),
        ),
    ),
    Row(
        "model-config-gdn-value-heads-not-a-multiple",
        (*PLAN, "--model-config", "{tmp}/config.json"),
        "config.json: field 'linear_num_value_heads': 40 is not a multiple of linear_num_key_heads 16; each key head "
        "leads linear_num_value_heads / linear_num_key_heads value heads, set it to a multiple of 16",
        write(
            "{tmp}/config.json",
            (ROOT / "tests/data/linear_configs/Qwen--Qwen3.5-27B_config.json")
            .read_text()
            .replace('"linear_num_value_heads": 48,', '"linear_num_value_heads": 40,', 1),
        ),
    ),
    Row(
        "model-config-not-an-object",
        (*PLAN, "--model-config", "{tmp}/config.json"),
        "config.json: a model config is a JSON object, not list",
        write("{tmp}/config.json", "[1, 2]"),
    ),
    Row(
        "model-config-invalid-json",
        (*PLAN, "--model-config", "{tmp}/config.json"),
        "config.json: invalid JSON at line 1",
        write("{tmp}/config.json", '{"architectures": '),
    ),
    Row(
        "model-config-a-directory",
        (*PLAN, "--model-config", "{tmp}"),
        ": cannot read model config (Is a directory)",
    ),
    # --- plan files ----------------------------------------------------------------------------------------
    Row(
        "plan-random-bytes",
        ("run", "--plan", "{tmp}/random.json", "--out", "{tmp}/out"),
        "random.json: not a plan file",
        write("{tmp}/random.json", bytes(range(256)) * 4),
    ),
    Row(
        "plan-diff-random-bytes",
        ("plan-diff", "{tmp}/random.json", "{plan}"),
        "random.json: not a plan file",
        write("{tmp}/random.json", b"\x89PNG\r\n\x1a\n\xff\xfe"),
    ),
    Row("plan-without-ops", RUN, "plan.json: field 'ops': missing", edit_json("{plan}", drop("ops"))),
    Row("plan-without-backend", RUN, "plan.json: field 'backend': missing", edit_json("{plan}", drop("backend"))),
    Row(
        "plan-op-without-columns",
        RUN,
        "plan.json: field 'ops.gemm.columns': missing",
        edit_json("{plan}", drop("ops", "gemm", "columns")),
    ),
    Row(
        "plan-not-an-object",
        ("run", "--plan", "{tmp}/list.json", "--out", "{tmp}/out"),
        "list.json: not an opcollect plan file",
        write("{tmp}/list.json", "[]"),
    ),
    Row(
        "plan-missing",
        ("run", "--plan", "{tmp}/nope.json", "--out", "{tmp}/out"),
        "nope.json: cannot read plan (No such file or directory)",
    ),
    Row(
        "plan-unreadable",
        ("run", "--plan", "{tmp}", "--out", "{tmp}/out"),
        ": cannot read plan (Is a directory)",
    ),
    Row(
        "plan-of-another-format-version",
        RUN,
        "plan.json: plan format_version 99; this opcollect reads 2; re-plan",
        edit_json("{plan}", set_key("format_version", 99)),
    ),
    Row(
        "plan-for-an-unknown-sm",
        RUN,
        "plan.json: field 'sm': '77' is not one of 80, 86, 89, 90, 100, 103, 120, cpu; the plan was edited or is "
        "damaged, re-plan",
        edit_json("{plan}", set_key("sm", "77")),
    ),
    Row(
        "plan-op-name-not-an-identifier",
        RUN,
        "plan.json: field 'ops.gemm-x': is not an op name; the plan was edited or is damaged, re-plan",
        edit_json("{plan}", rename_op("gemm", "gemm-x")),
    ),
    Row(
        "plan-op-label-not-a-string",
        RUN,
        "plan.json: field 'ops.gemm.op_name': not a string; the plan was edited or is damaged, re-plan",
        edit_json("{plan}", set_op_key("op_name", 5)),
    ),
    # --- run directories -------------------------------------------------------------------------------
    Row(
        "merge-run-json-corrupt",
        ("merge", "{run}", "--into", "{tmp}/new-tables"),
        "run.json: not valid JSON",
        write("{run}/run.json", b"\x00\x01{garbage"),
    ),
    Row(
        "merge-run-json-not-an-object",
        ("merge", "{run}", "--into", "{tmp}/new-tables"),
        "run.json: field 'plan_hash' is missing",
        write("{run}/run.json", "[1, 2, 3]"),
    ),
    *(
        Row(
            f"merge-run-json-without-{key}",
            ("merge", "{run}", "--into", "{tmp}/new-tables"),
            f"run.json: field '{key}' is missing; the run directory is damaged",
            edit_json("{run}/run.json", lambda identity, key=key: identity.pop(key)),
        )
        for key in ("backend", "sm", "collector_hash")
    ),
    Row(
        "merge-not-a-run-directory",
        ("merge", "{tmp}", "--into", "{tmp}/new-tables"),
        "not a run directory (no run.json)",
    ),
    Row(
        "resume-run-json-corrupt",
        ("run", "--plan", "{run}/plan.json", "--out", "{run}", "--resume"),
        "run.json: not valid JSON",
        write("{run}/run.json", "{not json"),
    ),
    Row(
        "run-trtllm-where-it-is-not-installed",
        ("run", "--plan", "{tmp}/trtllm-plan.json", "--out", "{tmp}/out", "--device", "cpu"),
        "TensorRT-LLM is not installed here: run TensorRT-LLM plans in the backend's pinned image "
        "nvcr.io/nvidia/tensorrt-llm/release:",
        lambda c: gemm_plan(c.tmp / "trtllm-plan.json", [(1, 8, 8)], backend="trtllm", dtype="bfloat16"),
        runs_plan=True,
    ),
    Row(
        "run-sglang-where-it-is-not-installed",
        ("run", "--plan", "{tmp}/sglang-plan.json", "--out", "{tmp}/out", "--device", "cpu"),
        "SGLang is not installed here: run SGLang plans in the backend's pinned image lmsysorg/sglang:",
        lambda c: gemm_plan(c.tmp / "sglang-plan.json", [(1, 8, 8)], backend="sglang", dtype="bfloat16"),
        runs_plan=True,
    ),
    Row(
        "run-vllm-where-it-is-not-installed",
        ("run", "--plan", "{tmp}/vllm-plan.json", "--out", "{tmp}/out", "--device", "cpu"),
        "vLLM is not installed here: run vLLM plans in the backend's pinned image vllm/vllm-openai:v0.24.0@sha256:",
        lambda c: gemm_plan(c.tmp / "vllm-plan.json", [(1, 8, 8)], backend="vllm", dtype="bfloat16"),
        runs_plan=True,
    ),
    Row(
        "resume-nothing-there",
        (*RUN[:-2], "--resume"),
        "out: does not exist, so there is nothing to resume; drop --resume",
    ),
    # --- tables trees --------------------------------------------------------------------------------------
    Row(
        "check-perf-not-parquet",
        ("check", "{tables}"),
        "R1 violation: " + "{tables}/" + DIR + "/gemm_perf.parquet: not a readable parquet table",
        write(PERF, "latency,m\n1.0,1\n"),
        code=1,
    ),
    Row(
        "check-failures-truncated",
        ("check", "{tables}"),
        "gemm_failures.parquet: not a readable parquet table",
        write(FAILURES, b"PAR1\x00\x00"),
        code=1,
    ),
    Row(
        "merge-into-corrupt-perf",
        ("merge", "{run}", "--into", "{tables}"),
        "fails verify (modified: " + DIR + "/gemm_perf.parquet)",
        write(PERF, b"\x00" * 64),
    ),
    Row(
        "merge-into-corrupt-table-that-verifies",
        ("merge", "{run}", "--into", "{tables}"),
        "gemm_failures.parquet: not a readable parquet table (",
        both(write(FAILURES, b"not parquet"), rehash(DIR + "/.opcollect/gemm_failures.parquet")),
    ),
    Row(
        "compare-old-not-parquet",
        ("compare", "{tmp}/old", "{tables}"),
        "old/gemm_perf.parquet: not a readable parquet table",
        write("{tmp}/old/gemm_perf.parquet", "not parquet"),
    ),
    Row(
        "compare-new-not-parquet",
        ("compare", "{tables}", "{tmp}/new"),
        "new/gemm_perf.parquet: not a readable parquet table",
        write("{tmp}/new/gemm_perf.parquet", b"PAR1garbagePAR1"),
    ),
    Row("verify-manifest-invalid-json", ("verify", "{tables}"), "manifest.json: invalid JSON", write(MANIFEST, "{")),
    Row(
        "verify-manifest-not-utf8",
        ("verify", "{tables}"),
        "manifest.json: not UTF-8 (byte 0xff at offset 0); restore it from a backup",
        write(MANIFEST, b"\xff{}"),
    ),
    Row(
        "verify-manifest-a-list",
        ("verify", "{tables}"),
        "manifest.json: field '(top level)': Input should be a valid dictionary",
        write(MANIFEST, "[]"),
    ),
    Row(
        "verify-manifest-entry-a-string",
        ("verify", "{tables}"),
        "manifest.json: field 'files.x.parquet': Input should be a valid dictionary",
        write(MANIFEST, '{"schema_version": 1, "files": {"x.parquet": "abc"}}'),
    ),
    Row(
        "verify-manifest-entry-without-sha256",
        ("verify", "{tables}"),
        "field 'files.x.parquet.sha256': missing required field",
        write(MANIFEST, '{"schema_version": 1, "files": {"x.parquet": {"size": 3}}}'),
    ),
    Row(
        "check-manifest-invalid",
        ("check", "{tables}"),
        "R5 violation: {tables}/manifest.json: invalid JSON at line 1",
        write(MANIFEST, "{"),
        code=1,
    ),
    Row(
        "merge-into-manifest-invalid",
        ("merge", "{run}", "--into", "{tables}"),
        "manifest.json: invalid JSON",
        write(MANIFEST, "not json"),
    ),
    # --- flag values ---------------------------------------------------------------------------------------
    Row("workers-negative", (*RUN, "--workers", "-1"), "argument --workers: '-1': must be a whole number > 0"),
    Row("workers-zero", (*RUN, "--workers", "0"), "argument --workers: '0': must be a whole number > 0"),
    Row("workers-fraction", (*RUN, "--workers", "1.5"), "argument --workers: '1.5': must be a whole number"),
    Row("case-timeout-zero", (*RUN, "--case-timeout", "0"), "argument --case-timeout: '0': must be a finite number"),
    Row("case-timeout-negative", (*RUN, "--case-timeout", "-5"), "argument --case-timeout: '-5': must be"),
    Row("case-timeout-inf", (*RUN, "--case-timeout", "inf"), "argument --case-timeout: 'inf': must be a finite"),
    Row("max-case-seconds-nan", (*RUN, "--max-case-seconds", "nan"), "argument --max-case-seconds: 'nan': must be"),
    Row("max-case-seconds-negative", (*RUN, "--max-case-seconds", "-1"), "--max-case-seconds: '-1': must be"),
    Row("max-noise-negative", (*RUN, "--max-noise", "-0.1"), "--max-noise: '-0.1': must be a finite number >= 0"),
    Row("max-noise-nan", (*RUN, "--max-noise", "nan"), "argument --max-noise: 'nan': must be a finite number >= 0"),
    Row("min-samples-zero", (*RUN, "--min-samples", "0"), "argument --min-samples: '0': must be a whole number > 0"),
    Row(
        "collect-workers-zero",
        ("collect", "torch", "--local", "--workers", "0"),
        "opcollect collect: argument --workers: '0'",
    ),
    Row("check-noise-bound-nan", ("check", "{tmp}", "--noise-bound", "nan"), "argument --noise-bound: 'nan'"),
    Row("shard-negative", (*PLAN, "--shard", "-1/2"), "argument --shard: -1/2: need 0 <= i < N"),
    Row("shard-past-the-end", (*PLAN, "--shard", "2/2"), "argument --shard: 2/2: need 0 <= i < N"),
    Row("shard-zero-shards", (*PLAN, "--shard", "0/0"), "argument --shard: 0/0: need 0 <= i < N"),
    Row("shard-not-numbers", (*PLAN, "--shard", "a/b"), "argument --shard: 'a/b': expected i/N"),
    Row("plot-not-png", (*COMPARE, "--plot", "{tmp}/x.txt"), "x.txt: the plot is a PNG image; give a file name ending"),
    Row("plot-a-directory", (*COMPARE, "--plot", "{tmp}"), ": is a directory; give a file name in it, e.g."),
    Row("plot-directory-missing", (*COMPARE, "--plot", "{tmp}/no/x.png"), "no/x.png: its directory"),
    Row("ops-unknown", ("plan", "--ops", "nope"), "--ops: unknown op 'nope'; known: gemm"),
    Row("backend-unknown", ("plan", "--backend", "nope"), "--backend: unknown backend 'nope'; known: torch"),
    Row("sm-unknown", ("plan", "--sm", "75"), "--sm: unknown SM '75'; known: 80"),
    Row("collect-backend-unknown", ("collect", "nope", "--local", "--device", "cpu"), "unknown backend 'nope'"),
    Row("verb-unknown", ("frobnicate",), "argument VERB: invalid choice: 'frobnicate'"),
    Row("flag-missing", ("run", "--plan", "{plan}"), "the following arguments are required: --out"),
    # --- the environment -------------------------------------------------------------------------------
    Row(
        "no-docker-engine",
        ("build", "torch"),
        "no Docker engine answers",
        env=NO_ENGINE,
        timeout=60,
    ),
    Row(
        "no-docker-engine-collect",
        ("collect", "torch", "--device", "cpu", "--ops", "gemm", "--smoke", "--out", "{tmp}/out"),
        "no Docker engine answers",
        env=NO_ENGINE,
        timeout=60,
    ),
    Row(
        "empty-selection-filter",
        (*PLAN, "--case-filter", "nomatch", "-o", "{tmp}/p.json"),
        "p.json: torch cpu with --ops gemm selects 0 cases (--case-filter 'nomatch'); nothing to run",
    ),
    Row(
        "empty-selection-all-skipped",
        ("plan", "--backend", "vllm", "--sm", "cpu", "--ops", "gemm", "-o", "{tmp}/p.json"),
        # the count moves with the grid and the model profiles; the message is what this row checks
        "left out by skip 'frameworks-need-a-gpu'); nothing to run",
    ),
    Row(
        "empty-selection-shard",
        (*PLAN, "--shard", "7/8", "-o", "{tmp}/p.json"),
        "selects 0 cases (--shard 7/8); nothing to run",
    ),
    Row(
        "empty-selection-collect",
        ("collect", "vllm", "--local", "--device", "cpu", "--ops", "gemm", "--out", "{tmp}/out"),
        "collect vllm: vllm cpu with --ops gemm selects 0 cases",
    ),
    Row(
        "unpinned-version-collect",
        ("collect", "trtllm", "--version", "1.3.0rc99", "--local", "--sm", "90", "--out", "{tmp}/out"),
        "pins.yaml: backend 'trtllm' has no version '1.3.0rc99'; pinned: 1.3.0rc23, 1.3.0rc20",
    ),
    Row(
        "unpinned-version-contract-image",
        ("contract", "trtllm", "--image", "--version", "1.3.0rc99"),
        "pins.yaml: backend 'trtllm' has no version '1.3.0rc99'; pinned: 1.3.0rc23, 1.3.0rc20",
    ),
    Row(
        "bad-image-ref-contract",
        ("contract", "trtllm", "--image", "nvcr.io/x;rm -rf /"),
        "--image 'nvcr.io/x;rm -rf /': not an image reference; give repo:tag or repo:tag@sha256:<64 hex>",
    ),
    Row(
        "no-release-contract-trtllm",
        ("contract", "trtllm"),
        "contract trtllm: checked nothing: give the pinned release with --wheel PATH, --source DIR or --image",
    ),
    Row(  # D17: a release that holds none of the framework's packages checks nothing: it must not pass
        "contract-vllm-source-without-vllm",
        ("contract", "vllm", "--source", "{tmp}"),
        "contract vllm: checked nothing: ",
    ),
    Row(
        "slurm-zero-shards",
        ("collect", "torch", "--slurm", "--sm", "cpu", "--shards", "0", "--out", "{tmp}/out"),
        "--shards 0: give 1 to 1000 array tasks",
    ),
    Row(  # four smoke cases over five array tasks: one task would run nothing
        "slurm-more-shards-than-cases",
        (
            "collect",
            "torch",
            "--slurm",
            "--sm",
            "cpu",
            "--ops",
            "gemm",
            "--smoke",
            "--shards",
            "5",
            "--out",
            "{tmp}/out",
        ),
        "--shards 5: shards [4] would hold no case (4 planned); give fewer shards",
    ),
    Row(
        "slurm-partition-injection",
        ("collect", "torch", "--slurm", "--sm", "cpu", "--partition", "gpu;rm -rf /", "--out", "{tmp}/out"),
        "--partition 'gpu;rm -rf /': not a Slurm name (letters, digits, _ . -)",
    ),
    Row(
        "slurm-bad-time",
        ("collect", "torch", "--slurm", "--sm", "cpu", "--time", "soon", "--out", "{tmp}/out"),
        "--time 'soon': not a Slurm time limit; give e.g. 90, 4:00:00 or 1-00:00:00",
    ),
    Row(
        "status-of-a-local-run",
        ("status", "{tmp}"),
        "{tmp}: no slurm.json; give the run directory of `opcollect collect ... --slurm`",
    ),
    Row(
        "resume-without-slurm",
        ("collect", "torch", "--local", "--device", "cpu", "--resume", "{tmp}"),
        "--resume RUN_DIR resubmits a Slurm collection: add --slurm",
    ),
    Row(  # the reproducible-builds convention: a set but malformed value is an error, an empty one included
        "release-source-date-epoch-empty",
        ("release", "--tables", "{tables}", "--out", "{tmp}/dist"),
        "SOURCE_DATE_EPOCH='': not a count of seconds since 1970; unset it or give one",
        env={"SOURCE_DATE_EPOCH": ""},
    ),
    Row(
        "release-source-date-epoch-negative",
        ("release", "--tables", "{tables}", "--out", "{tmp}/dist"),
        "SOURCE_DATE_EPOCH='-5': not a count of seconds since 1970",
        env={"SOURCE_DATE_EPOCH": "-5"},
    ),
    Row(
        "release-of-no-tables",
        ("release", "--tables", "{tmp}/none", "--out", "{tmp}/dist"),
        "{tmp}/none: no manifest.json; give the TABLES directory of `opcollect merge`",
    ),
    Row(
        "disk-full-plan",
        (*PLAN, "-o", "{tmp}/full/p.json"),
        "-o {tmp}/full/p.json: no space left on the device",
        full,
    ),
    Row(
        "disk-full-plan-table",
        (*PLAN, "--table", "{tmp}/full/csv"),
        "--table {tmp}/full/csv: no space left on the device",
        full,
    ),
    Row(
        "read-only-plan",
        (*PLAN, "-o", "{tmp}/ro/p.json"),
        "-o {tmp}/ro/p.json: read-only file system; choose",  # the target, never its temporary file (D41)
        readonly,
    ),
    Row(
        "disk-full-run",
        ("run", "--plan", "{plan}", "--out", "{tmp}/full/run", "--device", "cpu"),
        "--out {tmp}/full/run: no space left on the device",
        full,
        runs_plan=True,
    ),
    Row(
        "read-only-run",
        ("run", "--plan", "{plan}", "--out", "{tmp}/ro/run", "--device", "cpu"),
        "--out {tmp}/ro/run: read-only file system; choose a writable directory",
        readonly,
        runs_plan=True,
    ),
    Row(
        "disk-full-merge",
        ("merge", "{run}", "--into", "{tmp}/full/tables"),
        "--into {tmp}/full/tables: no space left on the device; free space there",
        full,
    ),
    Row(
        "read-only-merge",
        ("merge", "{run}", "--into", "{tmp}/ro/tables"),
        "--into {tmp}/ro/tables: read-only file system (at {tmp}/ro/",
        readonly,
    ),
    # --- value rules (issue 21): merge admits only rows that pass them, check enforces them --------------
    Row(
        "check-samples-zero", CHECK, "R3 violation: " + PERF_RULE + "samples below 1", perf_column("samples", 0), code=1
    ),
    Row("check-samples-negative", CHECK, PERF_RULE + "samples below 1", perf_column("samples", -3, row=1), code=1),
    Row("check-noise-nan", CHECK, PERF_RULE + "noise not finite and >= 0", perf_column("noise", float("nan")), code=1),
    Row("check-noise-negative", CHECK, PERF_RULE + "noise not finite and >= 0", perf_column("noise", -0.5), code=1),
    Row(
        "check-noise-nan-is-noisy-too",
        (*CHECK, "--strict"),
        "R7 violation: " + PERF_RULE + "1 rows with noise above 0.05",
        perf_column("noise", float("nan"), row=0),
        code=1,
    ),
    Row(
        "check-timing-bogus",
        CHECK,
        PERF_RULE + "timing not one of graph, eager, cpu",
        perf_column("timing", "bogus"),
        code=1,
    ),
    Row(
        "check-latency-zero",
        CHECK,
        PERF_RULE + "latency not finite and positive",
        perf_column("latency", 0.0, row=0),
        code=1,
    ),
    Row(
        "check-key-contradicts-case-id",
        CHECK,
        "R6 violation: " + PERF_RULE + "m is not the one its case ID names: gemm:bfloat16:m=8,n=1024,k=1024",
        perf_column("m", 4096, row=1),
        code=1,
    ),
    Row(
        "check-provenance-collected-at-not-a-date",
        CHECK,
        "R5 violation: {tables}/" + DIR + "/.opcollect/provenance.yaml: field 'tables.gemm_perf.events.0.collected_at'"
        ": Value error, 'not a date' is not an ISO 8601 time",
        replace(
            "{tables}/" + DIR + "/.opcollect/provenance.yaml",
            "collected_at: '2026-",
            "collected_at: 'not a date' # '2026-",
        ),
        code=1,
    ),
    Row(  # D27: release read the date and raised ValueError; a tree whose record holds one fails check first
        "release-provenance-collected-at-not-a-date",
        ("release", "--tables", "{tables}", "--out", "{tmp}/dist"),
        "'not a date' is not an ISO 8601 time",
        both(
            replace(
                "{tables}/" + DIR + "/.opcollect/provenance.yaml",
                "collected_at: '2026-",
                "collected_at: 'not a date' # '2026-",
            ),
            rehash(DIR + "/.opcollect/provenance.yaml"),
        ),
    ),
    Row(
        "check-a-file-the-consumer-takes-for-a-table",
        CHECK,
        "{tables}/" + DIR + ": taken for tables by the consumer, not in collection_meta.yaml: gemm_perf.parquet.bak",
        lambda c: shutil.copy(c.path(PERF), c.path(PERF + ".bak")),
        code=1,
    ),
    Row(
        "check-a-version-directory-without-sidecar",
        CHECK,
        "h200_sxm/gemm/vllm/0.25.0: taken for tables by the consumer, no collection_meta.yaml: gemm_perf.parquet",
        lambda c: shutil.copytree(
            c.path(PERF).parent,
            c.tables / "h200_sxm/gemm/vllm/0.25.0",
            ignore=shutil.ignore_patterns("collection_meta.yaml"),
        ),
        code=1,
    ),
    Row(
        "merge-event-collected-at-not-a-date",
        MERGE_RUN,
        EVENT + "field 'collected_at': Value error, 'not a date' is not an ISO 8601 time",
        event_field("collected_at", "not a date"),
    ),
    Row(
        "merge-event-collected-at-a-number",
        MERGE_RUN,
        EVENT + "field 'collected_at': Input should be a valid string",
        event_field("collected_at", 12345),
    ),
    Row(
        "merge-event-collected-at-in-the-future",
        MERGE_RUN,
        EVENT + "field 'collected_at': Value error, '2999-01-01T00:00:00+00:00' is in the future",
        event_field("collected_at", "2999-01-01T00:00:00+00:00"),
    ),
    Row(
        "merge-event-collected-at-without-offset",
        MERGE_RUN,
        "'2026-11-30T00:00:00' has no UTC offset",
        event_field("collected_at", "2026-11-30T00:00:00"),
    ),
    Row(
        "merge-event-finished-at-not-a-date",
        MERGE_RUN,
        EVENT + "field 'finished_at': Value error, 'soon' is not",
        event_field("finished_at", "soon"),
    ),
    Row(
        "merge-event-without-finished-at",
        MERGE_RUN,
        EVENT + "field 'finished_at': missing required field",
        event_field("finished_at", remove=True),
    ),
    Row(
        "merge-event-without-shard",
        MERGE_RUN,
        EVENT + "field 'shard': missing required field",
        event_field("shard", remove=True),
    ),
    Row(
        "merge-event-a-list", MERGE_RUN, EVENT + "not a run event (a JSON object)", write("{run}/events/r1.json", "[]")
    ),
    Row("merge-plan-k-beyond-int64", MERGE_RUN, "plan.json: field 'ops.gemm.columns.k'", run_plan_of(10**400)),
    Row("merge-plan-k-infinite", MERGE_RUN, "plan.json: field 'ops.gemm.columns.k'", run_plan_of(float("inf"))),
    Row(
        "plan-against-a-table-that-is-a-directory",
        ("plan", "--backend", "vllm", "--sm", "90", "--ops", "gemm", "--smoke", "--against", "{tables}"),
        "--against {tables}: " + DIR + "/gemm_perf.parquet is a directory, not a table",
        table_a_directory,
    ),
    Row(
        "compare-tables-of-two-ops",
        ("compare", "{tables}", str(REFERENCE / "attention")),
        "attention: no gemm_perf table to compare with OLD's {tables}/" + DIR + "/gemm_perf.parquet (found: "
        "context_attention_perf, generation_attention_perf); give two tables of one op",
    ),
    # plans, backends and interrupts (issue 21 D2, D14, D15, D40, D43): crafted plans carry hashes that agree
    Row(
        "run-plan-backend-a-module",
        RUN,
        "field 'backend': 'this' is not one of torch",
        crafted(set_key("backend", "this")),
    ),
    Row(
        "run-plan-backend-a-dotted-module",
        RUN,
        "field 'backend': 'os.path' is not one of torch",
        crafted(set_key("backend", "os.path")),
    ),
    Row("run-plan-op-unknown", RUN, "field 'ops.foo': is not an op opcollect runs", crafted(rename_op("gemm", "foo"))),
    Row(
        "run-plan-op-other-fields",
        RUN,
        "field 'ops.gemm.fields': ['gemm_dtype', 'm', 'n'] are not the fields of gemm",
        crafted(set_op_key("fields", ["gemm_dtype", "m", "n"])),
    ),
    Row(
        "run-plan-m-infinite",
        RUN,
        "field 'ops.gemm.columns.m': inf is not an integer",
        crafted(set_column("m", float("inf"))),
    ),
    Row(
        "run-plan-m-negative",
        RUN,
        "field 'ops.gemm.columns.m': -5 is not an integer from 1",
        crafted(set_column("m", -5)),
    ),
    Row("run-plan-m-zero", RUN, "field 'ops.gemm.columns.m': 0 is not an integer from 1", crafted(set_column("m", 0))),
    Row("run-plan-m-a-float", RUN, "field 'ops.gemm.columns.m': 1.5 is not an integer", crafted(set_column("m", 1.5))),
    Row("run-plan-m-a-bool", RUN, "field 'ops.gemm.columns.m': True is not an integer", crafted(set_column("m", True))),
    Row(
        "run-plan-k-beyond-the-bound",
        RUN,
        "field 'ops.gemm.columns.k': an integer of 1329 bits is not an integer from 1 to 2**40",
        crafted(set_column("k", 10**400)),
    ),
    Row(
        "run-plan-k-2-40-plus-1", RUN, "field 'ops.gemm.columns.k': 1099511627777", crafted(set_column("k", 2**40 + 1))
    ),
    Row(
        "run-plan-dtype-not-a-name",
        RUN,
        "field 'ops.gemm.columns.gemm_dtype'",
        crafted(set_column("gemm_dtype", "x" * 200)),
    ),
    Row(
        "run-plan-dispatch-list-short",
        RUN,
        "field 'ops.gemm.columns': column or dispatch lengths differ from the 1 case IDs",
        crafted(set_op_key("dispatch", [])),
    ),
    Row(
        "run-plan-dispatch-not-a-string",
        RUN,
        "field 'ops.gemm.dispatch': holds a value that is not a string",
        crafted(set_op_key("dispatch", [["x"]])),
    ),
    Row(
        "run-plan-rows-miss-a-case",
        RUN,
        "field 'ops.gemm.rows': do not hold every case ID exactly once",
        crafted(set_op_key("rows", [{"row_id": "r", "dispatch": "x", "case_ids": []}])),
    ),
    Row(
        "run-plan-rows-time-a-case-twice",
        RUN,
        "field 'ops.gemm.rows': do not hold every case ID exactly once",
        crafted(
            set_op_key(
                "rows",
                [{"row_id": r, "dispatch": "x", "case_ids": ["gemm:float32:m=1,n=8,k=8"]} for r in ("r1", "r2")],
            )
        ),
    ),
    Row(
        "run-plan-rows-a-string",
        RUN,
        "field 'ops.gemm.rows.case_ids': not a list",
        crafted(set_op_key("rows", [{"row_id": "r", "dispatch": "x", "case_ids": "gemm:float32:m=1,n=8,k=8"}])),
    ),
    Row(
        "run-plan-table-other", RUN, "field 'ops.gemm.table': moe_perf (gemm)", crafted(set_op_key("table", "moe_perf"))
    ),
    Row(
        "run-plan-shard-a-float",
        RUN,
        "field 'shard.index': not a int",
        crafted(set_key("shard", {"index": 0.5, "count": 2})),
    ),
    Row(
        "run-plan-shard-beyond",
        RUN,
        "field 'shard': 3/2 is not the i-th of N",
        crafted(set_key("shard", {"index": 3, "count": 2})),
    ),
    Row(
        "run-test-backend-unknown-module",
        (*RUN, "--test-backend", "no_such_module_here"),
        "backend 'no_such_module_here': no module no_such_module_here",
    ),
    Row(
        "plan-model-config-hidden-size-huge",
        (*PLAN, "--model-config", "{tmp}/config.json"),
        "hidden_size",
        model_config(hidden_size=10**400),
    ),
    Row(
        "plan-model-config-hidden-size-beyond-the-bound",
        (*PLAN, "--model-config", "{tmp}/config.json"),
        "field 'hidden_size': Input should be less than or equal to 1099511627776 (got 1099511627784)",
        model_config(hidden_size=2**40 + 8),  # splits evenly over the heads: only the bound refuses it
    ),
    Row(
        "plan-model-config-topk-0",
        (*PLAN, "--model-config", "{tmp}/config.json"),
        "field 'num_experts_per_tok': 0 routes a token to no expert, but num_local_experts is 8",
        model_config(num_local_experts=8, num_experts_per_tok=0),
    ),
    Row(
        "collect-tables-is-the-run-directory",
        (
            "collect",
            "torch",
            "--local",
            "--device",
            "cpu",
            "--smoke",
            "--ops",
            "gemm",
            "--out",
            "{tmp}/x",
            "--tables",
            "{tmp}/x",
        ),
        "--tables {tmp}/x and the run directory {tmp}/x overlap",
    ),  # fmt: skip
    Row(
        "collect-tables-inside-the-run-directory",
        (
            "collect",
            "torch",
            "--local",
            "--device",
            "cpu",
            "--smoke",
            "--ops",
            "gemm",
            "--out",
            "{tmp}/x",
            "--tables",
            "{tmp}/x/tables",
        ),
        "--tables {tmp}/x/tables and the run directory {tmp}/x overlap",
    ),  # fmt: skip
    Row(
        "collect-tables-a-foreign-directory",
        (
            "collect",
            "torch",
            "--local",
            "--device",
            "cpu",
            "--smoke",
            "--ops",
            "gemm",
            "--out",
            "{tmp}/x",
            "--tables",
            "{tmp}/foreign",
        ),
        "--tables {tmp}/foreign: a non-empty directory without manifest.json",
        write("{tmp}/foreign/notes.txt", "mine"),
    ),  # fmt: skip
    # --- cluster and images: slurm.json and shard plans read by status/--resume, #SBATCH values, DOCKER_HOST, bump
    Row(
        "status-slurm-json-truncated",
        ("status", "{tmp}"),
        "{tmp}/slurm.json: invalid JSON at line 1",
        write("{tmp}/slurm.json", '{"shards": 2, "submi'),
    ),
    Row(
        "status-slurm-json-a-list",
        ("status", "{tmp}"),
        "{tmp}/slurm.json: a JSON list, not an object",
        write("{tmp}/slurm.json", "[1, 2]"),
    ),
    Row(
        "status-slurm-json-keyless",
        ("status", "{tmp}"),
        "{tmp}/slurm.json: field 'shards': missing",
        write("{tmp}/slurm.json", '{"submissions": []}'),
    ),
    Row(
        "status-slurm-json-not-utf8",
        ("status", "{tmp}"),
        "{tmp}/slurm.json: not UTF-8 (byte 0xe9",
        write("{tmp}/slurm.json", b'{"shards": "\xe9"}'),
    ),
    Row(
        "status-slurm-json-deeply-nested",
        ("status", "{tmp}"),
        "{tmp}/slurm.json: JSON nested too deeply",
        write("{tmp}/slurm.json", "[" * 100_000),
    ),
    Row(
        "status-slurm-json-a-fifo",
        ("status", "{tmp}"),
        "{tmp}/slurm.json: not a regular file",
        lambda c: os.mkfifo(c.tmp / "slurm.json"),
        timeout=30,
    ),
    Row(  # JSON's true is Python's 1: a count must be a number, not a flag
        "status-slurm-json-shards-a-bool",
        ("status", "{tmp}"),
        "{tmp}/slurm.json: field 'shards': True is not a whole number from 1 to",
        write("{tmp}/slurm.json", '{"shards": true, "submissions": []}'),
    ),
    Row(
        "status-slurm-json-task-a-bool",
        ("status", "{tmp}"),
        "field 'submissions[0].tasks': False is not a whole number from 0 to 1",
        write(
            "{tmp}/slurm.json", '{"shards": 2, "submissions": [{"array_job": "1", "merge_job": "2", "tasks": [false]}]}'
        ),
    ),
    Row(
        "status-slurm-json-bad-job-id",
        ("status", "{tmp}"),
        "field 'submissions[0].array_job': '1;id' is not a Slurm",
        write(
            "{tmp}/slurm.json", '{"shards": 1, "submissions": [{"array_job": "1;id", "merge_job": "2", "tasks": [0]}]}'
        ),
    ),
    Row(
        "status-shard-plan-truncated",
        ("status", "{tmp}"),
        "{tmp}/shard-0/plan.json: not a plan file",
        both(write("{tmp}/slurm.json", '{"shards": 1, "submissions": []}'), write("{tmp}/shard-0/plan.json", "{")),
    ),
    Row(
        "slurm-resume-slurm-json-a-list",
        ("collect", "torch", "--slurm", "--resume", "{tmp}"),
        "{tmp}/slurm.json: a JSON list, not an object",
        write("{tmp}/slurm.json", "[1]"),
    ),
    Row(
        "slurm-time-rides-a-newline",
        ("collect", "torch", "--slurm", "--sm", "cpu", "--time", "1:00:00\ntouch x", "--out", "{tmp}/out"),
        "--time '1:00:00\\ntouch x': not a Slurm time limit",
    ),
    Row(
        "slurm-time-trailing-newline",
        ("collect", "torch", "--slurm", "--sm", "cpu", "--time", "1:00:00\n", "--out", "{tmp}/out"),
        "--time '1:00:00\\n': not a Slurm time limit",
    ),
    Row(
        "slurm-partition-rides-a-newline",
        ("collect", "torch", "--slurm", "--sm", "cpu", "--partition", "gpu\ntouch x", "--out", "{tmp}/out"),
        "--partition 'gpu\\ntouch x': not a Slurm name",
    ),
    Row(
        "slurm-account-trailing-newline",
        ("collect", "torch", "--slurm", "--sm", "cpu", "--account", "perf\n", "--out", "{tmp}/out"),
        "--account 'perf\\n': not a Slurm name",
    ),
    Row(
        "slurm-gpus-per-task-65",
        ("collect", "torch", "--slurm", "--sm", "cpu", "--gpus-per-task", "65", "--out", "{tmp}/out"),
        "--gpus-per-task 65: give a whole number from 0 to 64",
    ),
    Row(
        "slurm-run-root-with-a-newline",
        ("collect", "torch", "--slurm", "--sm", "cpu", "--out", "{tmp}/a\nb"),
        "a\\nb': a Slurm run root cannot hold a control character",
    ),
    Row(
        "slurm-run-root-with-a-colon-for-docker",
        ("collect", "torch", "--slurm", "--sm", "cpu", "--container-runtime", "docker", "--out", "{tmp}/a:b"),
        "the docker runtime mounts the run root by a spec",
    ),
    Row(
        "build-docker-host-port-out-of-range",
        ("build", "torch"),
        "DOCKER_HOST 'tcp://256.1.1.1:99999': not an engine address (Port out of range 0-65535)",
        env={"DOCKER_HOST": "tcp://256.1.1.1:99999"},
    ),
    Row(
        "bump-when-docs-bumps-is-a-file",
        (
            "bump",
            "trtllm",
            "--version",
            "1.3.0rc24",
            "--image",
            "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc24@sha256:" + "a" * 64,
            "--keep-old",
            "--root",
            "{tree}",
        ),
        "{tree}/docs/bumps: not a directory",
        write("{tree}/docs/bumps", "not a directory\n"),
    ),
    Row(
        "bump-version-trailing-newline",
        (
            "bump",
            "vllm",
            "--version",
            "0.25.0\n",
            "--image",
            "vllm/vllm-openai:v0.25.0@sha256:" + "a" * 64,
            "--root",
            "{tree}",
        ),
        "--version '0.25.0\\n': not a version",
    ),
    Row(
        "bump-image-trailing-newline",
        (
            "bump",
            "vllm",
            "--version",
            "0.25.0",
            "--image",
            "vllm/vllm-openai:v0.25.0@sha256:" + "a" * 64 + "\n",
            "--root",
            "{tree}",
        ),
        "not an image reference",
    ),
    # --- end of cluster and images
    # --- one writer, TABLES without links, release --out (issue 21: D4, D5, D18, D24, D39, D41) ----------
    Row("plan-output-a-directory", (*PLAN, "-o", "{tmp}"), "-o {tmp}: is a directory; give a file name"),
    Row(
        "plan-table-a-file",
        (*PLAN, "--table", "{tmp}/csv"),
        "--table {tmp}/csv: a file stands where a directory is needed",
        write("{tmp}/csv", "mine\n"),
    ),
    Row(
        "plan-output-below-a-file",
        (*PLAN, "-o", "{tmp}/notes/p.json"),
        "-o {tmp}/notes/p.json: a file stands where a directory is needed (at {tmp}/notes)",
        write("{tmp}/notes", "mine\n"),
    ),
    Row(
        "plan-output-name-too-long",
        (*PLAN, "-o", "{tmp}/" + "p" * 300 + ".json"),
        "a name in it is too long for the file system; give names of at most 255 bytes",
    ),
    Row(
        "run-out-name-too-long",
        ("run", "--plan", "{plan}", "--out", "{tmp}/" + "r" * 300, "--device", "cpu"),
        "--out {tmp}/" + "r" * 300 + ": a name in it is too long for the file system",
        runs_plan=True,
    ),
    Row(
        "release-out-a-file",
        ("release", "--tables", "{tables}", "--out", "{tmp}/dist"),
        "--out {tmp}/dist: is a file; give a directory for the wheel, sdist and statement",
        write("{tmp}/dist", "mine\n"),
    ),
    Row(
        "release-out-inside-tables",
        ("release", "--tables", "{tables}", "--out", "{tables}/dist"),
        "--out {tables}/dist: is inside --tables {tables}",
    ),
    Row(
        "release-table-file-linked-outside",
        ("release", "--tables", "{tables}", "--out", "{tmp}/dist"),
        "fails verify (symbolic link (not followed): " + DIR + "/gemm_perf.parquet -> {tmp}/outside.parquet)",
        lambda c: link_outside(c, DIR + "/gemm_perf.parquet"),
    ),
    Row(
        "merge-into-tables-with-a-directory-linked-outside",
        ("merge", "{run}", "--into", "{tables}"),
        "fails verify (symbolic link (not followed): cpu/gemm/torch/2.13.1 -> {tmp}/elsewhere)",
        lambda c: link_outside(c, "cpu/gemm/torch/2.13.1", directory=True),
    ),
    Row(
        "verify-a-directory-linked-outside",
        ("verify", "{tables}"),
        "symbolic link (not followed): cpu/gemm/torch/2.13.1 -> {tmp}/elsewhere",
        lambda c: link_outside(c, "cpu/gemm/torch/2.13.1", directory=True),
        code=1,
    ),
    # --- end of one writer
    # --- one reader (issue 21: D29, D31): every JSON reader bounds nesting; plan-diff types a --json summary ---
    Row(
        "run-plan-deeply-nested",
        ("run", "--plan", "{tmp}/p.json", "--out", "{tmp}/out", "--device", "cpu"),
        "--plan {tmp}/p.json: not a plan file (JSON nested too deeply)",
        write("{tmp}/p.json", "[" * 100_000),
    ),
    Row(
        "model-config-deeply-nested",
        (*PLAN, "--model-config", "{tmp}/config.json"),
        "{tmp}/config.json: JSON nested too deeply",
        write("{tmp}/config.json", "[" * 100_000),
    ),
    Row(
        "plan-diff-old-deeply-nested",
        ("plan-diff", "{tmp}/old.json", "{plan}"),
        "{tmp}/old.json: not a plan file (JSON nested too deeply)",
        write("{tmp}/old.json", "[" * 100_000),
    ),
    Row(
        "verify-manifest-deeply-nested",
        ("verify", "{tables}"),
        "manifest.json: JSON nested too deeply; restore it from a backup",
        write(MANIFEST, "[" * 100_000),
    ),
    Row(
        "merge-run-json-deeply-nested",
        MERGE_RUN,
        "{run}/run.json: not valid JSON (nested too deeply)",
        write("{run}/run.json", "[" * 100_000),
    ),
    Row(
        "merge-event-deeply-nested",
        MERGE_RUN,
        EVENT + "not valid JSON (nested too deeply)",
        write("{run}/events/r1.json", '{"run_id": ' * 100_000),
    ),
    Row(
        "plan-diff-summary-without-counts",
        ("plan-diff", "{tmp}/s.json", "{tmp}/s.json"),
        "{tmp}/s.json: field 'ops.gemm.cases': missing required field",
        write("{tmp}/s.json", '{"plan_hash": "x", "ops": {"gemm": {}}}'),
    ),
    Row(
        "plan-diff-summary-ops-a-list",
        ("plan-diff", "{tmp}/s.json", "{tmp}/s.json"),
        "{tmp}/s.json: field 'ops': Input should be a valid dictionary",
        write("{tmp}/s.json", '{"plan_hash": "x", "ops": [1, 2]}'),
    ),
    Row(
        "plan-diff-summary-op-a-number",
        ("plan-diff", "{tmp}/s.json", "{tmp}/s.json"),
        "{tmp}/s.json: field 'ops.gemm': Input should be a valid dictionary",
        write("{tmp}/s.json", '{"plan_hash": "x", "ops": {"gemm": 3}}'),
    ),
    Row(
        "plan-diff-summary-count-a-string",
        ("plan-diff", "{tmp}/s.json", "{tmp}/s.json"),
        "{tmp}/s.json: field 'ops.gemm.by_dtype.bfloat16': Input should be a valid integer",
        write(
            "{tmp}/s.json",
            '{"plan_hash": "x", "ops": {"gemm": {"cases": 1, "by_dtype": {"bfloat16": "1"}, "by_dispatch": {}}}}',
        ),
    ),
    Row(
        "plan-diff-summary-unknown-op",
        ("plan-diff", "{tmp}/s.json", "{tmp}/s.json"),
        "{tmp}/s.json: field 'ops.foo': Input should be 'gemm'",
        write("{tmp}/s.json", '{"plan_hash": "x", "ops": {"foo": {"cases": 1, "by_dtype": {}, "by_dispatch": {}}}}'),
    ),
    # --- end of one reader
    # --- refusals audit A
    Row(
        "refusals-a-build-names-no-backend",
        ("build",),
        "build: name a backend (torch, vllm, sglang or trtllm), or pass --prune",
        env=NO_ENGINE,
    ),
    Row(
        "refusals-a-bump-without-image",
        ("bump", "vllm", "--version", "0.25.0", "--root", "{tree}"),
        "bump vllm: --image REF@sha256:D is required to move the pin",
    ),
    Row(
        "refusals-a-bump-moved-three-trees",
        ("bump", "vllm", "--version", "0.25.0", "--moved", "{tmp}/a", "{tmp}/b", "{tmp}/c", "--root", "{tree}"),
        "bump --moved: give TABLES or OLD_TABLES NEW_TABLES, and no --image (already pinned)",
    ),
    Row("refusals-a-check-given-nothing", ("check",), "check: give TABLES, or --against-physics TREE (one of them)"),
    Row(
        "refusals-a-check-system-without-against-physics",
        ("check", "{tmp}", "--system", "h200_sxm"),
        "--system: only with --against-physics; our tables name their system",
    ),
    Row(
        "refusals-a-plan-shard-not-i-of-n",
        (*PLAN, "--shard", "1-4"),
        "argument --shard: '1-4': expected i/N, e.g. 0/4 (shards are counted from 0)",
    ),
    Row(
        "refusals-a-plan-shard-index-past-count",
        (*PLAN, "--shard", "4/4"),
        "argument --shard: 4/4: need 0 <= i < N (shards are counted from 0), e.g. 0/4",
    ),
    Row(
        "refusals-a-collect-slurm-without-sm",
        ("collect", "torch", "--slurm", "--root", "{tree}"),
        "--slurm: give --sm, the SM of the cluster's GPUs (cpu for a CPU collection)",
        env=NO_ENGINE,
    ),
    Row(
        "refusals-a-bump-resolve-a-digest-ref",
        ("bump", "vllm", "--version", "0.25.0", "--image", "v:0.25.0@sha256:" + "0" * 64, "--resolve"),
        "--resolve --image 'v:0.25.0@sha256:" + "0" * 64 + "': give repo:tag (without a digest) to look up",
        env=NO_ENGINE,
    ),
    Row(
        "refusals-a-bump-not-a-backend",
        ("bump", "nope", "--version", "0.25.0", "--image", "x", "--root", "{tree}"),
        "bump 'nope': not a backend; give one of torch, vllm, sglang, trtllm",
    ),
    Row(
        "refusals-a-bump-version-not-pep440",
        ("bump", "vllm", "--version", "0.25.0x.y", "--image", "x", "--root", "{tree}"),
        "--version '0.25.0x.y': not a version (PEP 440, e.g. 0.25.0 or 1.3.0rc24)",
    ),
    Row(
        "refusals-a-bump-a-backend-pins-yaml-does-not-pin",
        ("bump", "vllm", "--version", "0.25.0", "--image", "v:0.25.0@sha256:" + "0" * 64, "--root", "{tree}"),
        "{tree}/pins.yaml: no pin for backend 'vllm'; pinned: torch, sglang, trtllm",
        UNPIN_VLLM,
    ),
    Row(
        "refusals-a-bump-moved-before-the-bump",
        ("bump", "vllm", "--version", "9.9.9", "--moved", "{tmp}", "--root", "{tree}"),
        "{tree}/docs/bumps/vllm-9.9.9.md: no bump report; bump first (opcollect bump vllm --version 9.9.9 --image "
        "REF@sha256:D)",
    ),
    Row(
        "refusals-a-case-grid-file-missing",
        PLAN_TREE,
        "{tree}/cases/base_ops/comm.yaml: missing case grid for op 'comm'; restore it from the repository",
        lambda c: (c.tree / "cases" / "base_ops" / "comm.yaml").unlink(),
    ),
    Row(
        "refusals-a-model-config-name-of-a-profile",
        (*PLAN, "--model-config", "{tmp}/config.json"),
        "config.json: model name 'Llama-3.1-8B' also defined in ",
        model_config(_name_or_path="Llama-3.1-8B"),
    ),
    Row(
        "refusals-a-systems-folder-empty",
        PLAN_TREE,
        "{tree}/systems: no system YAML files; restore systems/ from the repository",
        lambda c: [path.unlink() for path in (c.tree / "systems").glob("*.yaml")],
    ),
    Row(
        "refusals-a-systems-no-dense-rate",
        PLAN_TREE,
        "h200_sxm.yaml: field 'dense_tflops': Value error, no rate given; list at least bfloat16's",
        replace(
            "{tree}/systems/h200_sxm.yaml",
            "dense_tflops:\n  bfloat16: 989\n  fp8: 1979\n  int8: 1979\n",
            "dense_tflops: {}\n",
        ),
    ),
    Row(
        "refusals-a-profile-vision-heads-twice",
        PLAN_TREE,
        "Qwen3VLForConditionalGeneration.yaml: models[0].config: field 'vision_config': Value error, give the vision "
        "tower's heads as num_heads or as num_attention_heads, once",
        replace(
            "{tree}/cases/models/Qwen3VLForConditionalGeneration.yaml",
            "num_heads: 16}",
            "num_heads: 16, num_attention_heads: 16}",
        ),
    ),
    Row(
        "refusals-a-model-config-gdn-without-layer-types",
        (*PLAN, "--model-config", "{tmp}/config.json"),
        "config.json: missing key 'layer_types' required for Qwen3_5ForConditionalGeneration's Gated DeltaNet layers "
        "(or num_hidden_layers with full_attention_interval)",
        both(
            write("{tmp}/config.json", (ROOT / "tests/data/linear_configs/Qwen--Qwen3.5-27B_config.json").read_text()),
            edit_json(
                "{tmp}/config.json", lambda d: [d["text_config"].pop(k) for k in ("layer_types", "num_hidden_layers")]
            ),
        ),
    ),
    Row(
        "refusals-a-model-config-hybrid-pattern-a-list",
        (*PLAN, "--model-config", "{tmp}/config.json"),
        "config.json: field 'hybrid_override_pattern' is a list; it is a string of M, *, - and E, one per layer",
        both(
            write(
                "{tmp}/config.json",
                (ROOT / "tests/data/linear_configs/nvidia--Nemotron-H-56B-Base-8K_config.json").read_text(),
            ),
            edit_json(
                "{tmp}/config.json", lambda d: d.update(hybrid_override_pattern=list(d["hybrid_override_pattern"]))
            ),
        ),
    ),
    Row(
        "refusals-a-model-config-layers-block-type-a-string",
        (*PLAN, "--model-config", "{tmp}/config.json"),
        "config.json: field 'layers_block_type' is a str; it is a list of block types, one per layer",
        both(
            write(
                "{tmp}/config.json",
                (ROOT / "tests/data/linear_configs/nvidia--Nemotron-H-56B-Base-8K_config.json").read_text(),
            ),
            edit_json("{tmp}/config.json", lambda d: d.update(hybrid_override_pattern=None, layers_block_type="mamba")),
        ),
    ),
    Row(
        "refusals-a-model-config-static-fp8-block-wise",
        (*PLAN, "--model-config", "{tmp}/config.json"),
        "config.json: quantization_config has activation_scheme static with weight_block_size; block-wise fp8 takes "
        "dynamic activations only",
        both(
            write("{tmp}/config.json", (ROOT / "tests/data/quant_bmm_configs/Qwen3-32B-FP8-Static.json").read_text()),
            edit_json("{tmp}/config.json", lambda d: d["quantization_config"].update(weight_block_size=[128, 128])),
        ),
    ),
    Row(
        "refusals-a-model-config-dsa-without-mla",
        (*PLAN, "--model-config", "{tmp}/config.json"),
        "config.json: field 'index_topk': DSA indexes an MLA cache, but the config has no kv_lora_rank; add the MLA "
        "keys",
        both(
            write(
                "{tmp}/config.json", (ROOT / "tests/data/sparse_configs/zai-org--GLM-5.2-FP8_config.json").read_text()
            ),
            edit_json("{tmp}/config.json", lambda d: d.pop("kv_lora_rank")),
        ),
    ),
    # --- refusals audit B
    Row(
        "plan-gdn-tp-not-splitting-the-heads",
        ("plan", "--ops", "gdn", "--smoke", "--root", "{tree}"),
        "cases/base_ops/gdn.yaml: model 'Qwen/Qwen3.5-35B-A3B': tp 3 does not divide its 16 key and 32 value heads",
        replace("{tree}/cases/base_ops/gdn.yaml", "tp_sizes: [16]}]", "tp_sizes: [3]}]"),
    ),
    Row(
        "run-into-a-run-of-the-same-plan-without-resume",
        ("run", "--plan", "{run}/plan.json", "--out", "{run}", "--device", "cpu"),
        "{run}: already holds a run of this plan; pass --resume to finish it",
    ),
    Row(
        "run-worker-dies-before-ready",
        (*RUN, "--test-backend", "dies_early"),
        "torch worker failed to start: worker exited with code 3 before it was ready: no device here",
        write(
            "{tmp}/dies_early.py",
            "import sys\nfrom light_backend import *  # noqa: F403\n\n\ndef setup_worker(device, threads):\n"
            "    print('no device here', file=sys.stderr)\n    sys.exit(3)\n",
        ),
        env={"PYTHONPATH": os.pathsep.join(["{tmp}", str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])},
    ),
    Row(  # a lone surrogate reads as JSON but cannot be encoded to hash the plan's lines
        "run-plan-dispatch-a-lone-surrogate",
        RUN,
        "malformed plan (UnicodeEncodeError: ",
        edit_json("{plan}", lambda data: data["ops"]["gemm"]["dispatch"].__setitem__(0, "\ud800")),
    ),
    Row(  # named before the Docker engine is reached (none answers here)
        "build-a-backend-pins-yaml-does-not-pin",
        BUILD_TREE,
        "pins.yaml: no pin for backend 'vllm'; pinned: torch, sglang, trtllm",
        UNPIN_VLLM,
        env=NO_ENGINE,
    ),
    Row(
        "collect-a-backend-pins-yaml-does-not-pin",
        ("collect", "vllm", "--version", "0.24.0", "--root", "{tree}"),
        "pins.yaml: no pin for backend 'vllm'; pinned: torch, sglang, trtllm",
        UNPIN_VLLM,
        env=NO_ENGINE,
    ),
]


def _param(row: Row):
    return pytest.param(row, id=row.id, marks=[pytest.mark.runs_plan] if row.runs_plan else [])


def test_the_table_is_large_and_its_ids_unique():
    assert len(ROWS) >= 60 and len({row.id for row in ROWS}) == len(ROWS)


@pytest.mark.parametrize("row", [_param(row) for row in ROWS])
def test_bad_input_is_one_line_and_exit_2(row: Row, tmp_path, request):
    ctx = Ctx(tmp_path, request)
    try:
        if row.setup is not None:
            row.setup(ctx)
        args = [arg.format_map(ctx) for arg in row.args]
        env = {k: v.format_map(ctx) for k, v in (row.env or {}).items()}
        start = time.monotonic()
        done = run_cli(*args, env=env, timeout=row.timeout)
        seconds = time.monotonic() - start
    finally:
        for cleanup in reversed(ctx.cleanups):
            cleanup()
    needle = row.needle.format_map(ctx)
    shown = f"exit {done.returncode} after {seconds:.1f} s\nstdout: {done.stdout[-1500:]}\nstderr: {done.stderr[-900:]}"
    assert "Traceback" not in done.stdout + done.stderr, shown
    assert done.returncode == row.code, shown
    if row.code == 2:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("opcollect: error: "), shown
        assert needle in lines[0], f"{needle!r} not in the error line\n{shown}"
    else:  # a `check` violation: one line of its report
        assert [line for line in done.stdout.splitlines() if needle in line], f"{needle!r} not reported\n{shown}"
        assert done.stderr.strip() == "", shown


def test_plan_summary_names_the_cpu_and_gpu_sms_plainly():
    cpu = run_cli(*PLAN)
    gpu = run_cli("plan", "--backend", "vllm", "--sm", "90", "--ops", "gemm", "--smoke")
    assert cpu.returncode == 0 and gpu.returncode == 0, cpu.stderr + gpu.stderr
    assert "torch cpu: 4 cases" in cpu.stdout and "smcpu" not in cpu.stdout
    assert "vllm sm90: 4 cases" in gpu.stdout


def test_a_broken_pins_yaml_breaks_only_the_sessions_that_need_it(tree_copy):
    """nox reads no pins at import: `nox -l` and `plan` work; `build-vllm` fails with the pins' one line."""
    shutil.copy(Path(__file__).resolve().parents[1] / "noxfile.py", tree_copy / "noxfile.py")
    (tree_copy / "pins.yaml").write_text("schema_version: 1\nbackends: [\n")
    nox = [str(Path(sys.executable).with_name("nox")), "-f", str(tree_copy / "noxfile.py")]
    env = {**os.environ, **NO_ENGINE}

    def nox_run(*args: str):
        return subprocess.run([*nox, *args], capture_output=True, text=True, timeout=120, env=env, cwd=tree_copy)

    listed = nox_run("-l")
    assert listed.returncode == 0, listed.stderr
    assert all(f"{name} ->" in listed.stdout for name in ("tests", "lint", "plan", "build-vllm", "collect-torch"))
    planned = nox_run("-s", "plan", "--", *PLAN_TREE[1:-1], str(tree_copy))
    assert planned.returncode == 0 and "torch cpu: 4 cases" in planned.stdout, planned.stderr
    built = nox_run("-s", "build-vllm", "--", "--root", str(tree_copy))
    output = built.stdout + built.stderr  # nox passes the command's stderr on to its stdout
    errors = [line for line in output.splitlines() if line.startswith("opcollect: error: ")]
    assert built.returncode != 0 and "Traceback" not in output, output
    assert len(errors) == 1 and f"{tree_copy / 'pins.yaml'}: line 3 invalid YAML" in errors[0], output
