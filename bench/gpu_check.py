"""GPU check for a session with a device (one NVIDIA GPU, torch + triton + pyarrow, no Docker).

Times 20 bf16 GEMM shapes with the torch backend's harness and with triton.testing.do_bench_cudagraph
(ratio per shape, target within 3%), and compares the torch backend with the vLLM 0.24.0 H200 rows of
../shared/reference/aiconfigurator-h200 (median ratio, target 0.9-1.1).

Run from the repository root: `python bench/gpu_check.py` (src/ is put on sys.path, no install needed).
Note: do_bench_cudagraph replays the same inputs (warm L2 for small shapes); the harness rotates input
copies past 3x L2, so small shapes may legitimately read slower here.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

REFERENCE = (
    ROOT.parent / "shared" / "reference" / "aiconfigurator-h200" / "gemm" / "vllm" / "0.24.0" / "gemm_perf.parquet"
)
SHAPES = [
    (m, n, k) for m in (1, 16, 128, 1024, 4096) for n, k in ((4096, 4096), (7168, 2048), (2560, 8192), (16384, 5120))
]


def main() -> None:
    import pyarrow.parquet as pq
    import torch
    import torch.nn.functional as F
    import triton.testing

    from opcollect.backends.torch import measure
    from opcollect.plans.gemm import GemmCase
    from opcollect.runtime.harness import TimingConfig

    device = "cuda:0"
    config = TimingConfig.for_device("cuda")
    table = pq.read_table(REFERENCE, columns=["gemm_dtype", "m", "n", "k", "latency"]).to_pylist()
    reference = {(r["m"], r["n"], r["k"]): r["latency"] for r in table if r["gemm_dtype"] == "bfloat16"}
    print(f"device: {torch.cuda.get_device_name(0)}; torch {torch.__version__}; triton {triton.__version__}")
    header = [
        ("m", 6),
        ("n", 6),
        ("k", 6),
        ("harness ms", 11),
        ("timing", 7),
        ("l2", 10),
        ("triton ms", 10),
        ("h/t", 6),
        ("ref ms", 9),
        ("h/ref", 6),
    ]
    print(" ".join(f"{name:>{width}}" for name, width in header))
    vs_triton, vs_reference = [], []
    for m, n, k in SHAPES:
        [result] = measure("gemm", "torch.nn.functional.linear", [GemmCase("bfloat16", m, n, k)], device, config)
        x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
        w = torch.randn(n, k, dtype=torch.bfloat16, device=device)
        triton_ms = triton.testing.do_bench_cudagraph(lambda x=x, w=w: F.linear(x, w), rep=200)
        ratio = result.stats.latency / triton_ms
        vs_triton.append(ratio)
        ref = reference.get((m, n, k))
        ref_ratio = result.stats.latency / ref if ref else None
        if ref_ratio:
            vs_reference.append(ref_ratio)
        print(
            f"{m:6d} {n:6d} {k:6d} {result.stats.latency:11.4f} {result.stats.timing:>7} {result.stats.l2:>10} "
            f"{triton_ms:10.4f} {ratio:6.3f} {ref if ref else float('nan'):9.4f} {ref_ratio or float('nan'):6.3f}"
        )
    within = sum(1 for r in vs_triton if abs(r - 1) <= 0.03)
    print(f"harness/triton: median {statistics.median(vs_triton):.3f}, {within}/{len(vs_triton)} within 3%")
    if vs_reference:
        print(
            f"harness/reference (vLLM 0.24.0 H200): median {statistics.median(vs_reference):.3f} "
            f"over {len(vs_reference)} shapes (target 0.9-1.1)"
        )


if __name__ == "__main__":
    main()
