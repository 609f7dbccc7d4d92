"""`gpu_check.py --prepare`, on a machine with the project installed (the planner imports pydantic):

- bench/gpu_check_data/torch-sm<SM>.plan.json for every SM: the torch smoke plan of E2E_OPS, made by the
  real planner, for the plan_e2e check (git-ignored: it holds this checkout's collector_hash, so it is
  made again whenever src/ changes, and carried to the device with the checkout);
- bench/data/vllm-0.24.0-h200-gemm-bf16.csv, rewritten from the full reference table when
  ../shared/reference is here (the committed slice; the same rows every time, see bench/data/README.md).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from gpu_check_common import E2E_OPS, PREPARED, REFERENCE, ROOT, plan_path, rel

SHARED_TABLE = (
    ROOT.parent
    / "shared"
    / "reference"
    / "aiconfigurator-h200-pinned"
    / "gemm"
    / "vllm"
    / "0.24.0"
    / "gemm_perf.parquet"
)
SHARED_LICENSE = SHARED_TABLE.parents[3] / "LICENSE"
# the slice: every m of SLICE_M for every (n, k) of SLICE_NK, bf16 only, in the table's row order
SLICE_M = (1, 8, 16, 64, 128, 256, 1024, 4096, 8192)
SLICE_NK = (
    (256, 256),
    (512, 512),
    (1024, 512),
    (1024, 1024),
    (512, 2048),
    (2048, 1024),
    (3072, 1024),
    (2048, 2048),
    (4096, 4096),
    (7168, 2048),
    (2560, 8192),
    (6144, 4096),
    (12288, 4096),
    (8192, 8192),
    (16384, 5120),
    (5120, 16384),
    (51200, 4096),
    (4096, 12288),
)
HEADER = (
    "# SPDX-FileCopyrightText: Copyright (c) 2026 NVIDIA CORPORATION & AFFILIATES. All rights reserved.\n"
    "# SPDX-License-Identifier: Apache-2.0\n"
    "# bf16 rows of the H200 SXM vLLM 0.24.0 gemm_perf table of ai-dynamo/aiconfigurator (kept in\n"
    "# ../shared/reference/aiconfigurator-h200-pinned/gemm/vllm/0.24.0/), values unchanged; LICENSE beside it\n"
)


def prepare() -> int:
    from opcollect.names import SMS
    from opcollect.plans.planfile import write_plan
    from opcollect.plans.planner import Planner, PlanOptions
    from opcollect.project import find_project

    PREPARED.mkdir(parents=True, exist_ok=True)
    planner = Planner(find_project(ROOT))
    for sm in SMS:
        plan = planner.plan("torch", sm, PlanOptions(ops=E2E_OPS, smoke=True))
        write_plan(plan, plan_path(sm))
        print(f"{rel(plan_path(sm))}: {plan.total_cases} cases, collector {plan.collector_hash[:12]}")
    if SHARED_TABLE.is_file():
        changed = write_slice(SHARED_TABLE, REFERENCE)
        print(f"{rel(REFERENCE)}: {'rewritten' if changed else 'unchanged'} from {SHARED_TABLE}")
    else:
        print(f"{rel(REFERENCE)}: kept as committed ({SHARED_TABLE} is not here)")
    return 0


def slice_text(table: Path) -> str:
    import pyarrow.parquet as pq

    data = pq.read_table(table)
    wanted = {(m, n, k) for m in SLICE_M for n, k in SLICE_NK}
    out = io.StringIO()
    out.write(HEADER)
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(data.column_names)
    for row in data.to_pylist():
        if row["gemm_dtype"] == "bfloat16" and (row["m"], row["n"], row["k"]) in wanted:
            writer.writerow([repr(v) if isinstance(v, float) else v for v in row.values()])
    return out.getvalue()


def write_slice(table: Path, target: Path) -> bool:
    text = slice_text(table)
    old = target.read_text() if target.is_file() else None
    if old == text:
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    if SHARED_LICENSE.is_file():
        (target.parent / "LICENSE").write_bytes(SHARED_LICENSE.read_bytes())
    return True
