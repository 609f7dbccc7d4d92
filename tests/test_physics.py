"""Speed of light (check R8): each family's bound against arithmetic done by hand, the rule on a crafted table,
--against-physics on the reference's own H200 GEMM rows, the CPU's probed figures in a run's records, and the
systems' figures as validated input.

Hand computations use round figures (Figures below: 1 PFLOP/s bf16, 2 fp8, 1 TB/s memory, 100 GB/s NVLink over 8
GPUs), so each expected time is FLOPs / 1e15 or bytes / 1e12 written out.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from conftest import ROOT, TESTS, fake_run, gemm_plan, run_cli

from opcollect.cases.systems import load_systems
from opcollect.errors import InputError
from opcollect.plans import attention, comm, encoder_attention, gemm, mla, mla_bmm, mla_module, moe, quantize
from opcollect.plans.bound import Figures, bound, datasheet
from opcollect.project import find_project
from opcollect.tables.merge import merge
from opcollect.tables.physics import against_physics
from opcollect.tables.provenance import PROVENANCE, read_provenance
from opcollect.tables.rules import check_tables

SLICE = TESTS / "data" / "reference" / "physics_slice"
ROUND = Figures(
    system="round",
    rates={"bfloat16": 1e15, "fp8": 2e15},
    memory=1e12,
    cache_bytes=50 * 2**20,
    warm=False,
    nvlink=1e11,
    nvlink_gpus=8,
    pcie=5e10,
    network=1e10,
    gpus_per_node=8,
)


def us(seconds: float) -> float:
    return seconds * 1e6


def test_gemm_bound_compute_and_memory():
    # bf16 4096^3: 2 * 4096^3 = 137,438,953,472 FLOPs -> 137.44 us; bytes (x, w, out) 3 * 4096^2 * 2 = 100,663,296
    # -> 100.66 us: compute-bound
    b = bound(gemm.work(gemm.GemmCase("bfloat16", 4096, 4096, 4096)), ROUND)
    assert b.limit == "compute" and us(b.seconds) == pytest.approx(137.438953472)
    # fp8 m=16, n=k=8192: FLOPs 2 * 16 * 8192^2 = 2,147,483,648 at 2e15 -> 1.07 us; bytes x 16*8192*1 + w 8192^2*1
    # + out 16*8192*2 = 131,072 + 67,108,864 + 262,144 = 67,502,080 -> 67.50 us
    b = bound(gemm.work(gemm.GemmCase("fp8", 16, 8192, 8192)), ROUND)
    assert b.limit == "memory" and us(b.seconds) == pytest.approx(67.50208)
    # int4 weight-only: bf16 x (2 B), 0.5 B weights: 16*8192*2 + 8192^2/2 + 16*8192*2 = 262,144 + 33,554,432 +
    # 262,144 = 34,078,720 -> 34.08 us
    assert us(bound(gemm.work(gemm.GemmCase("int4_wo", 16, 8192, 8192)), ROUND).seconds) == pytest.approx(34.07872)


def test_gemm_bound_on_the_h200_datasheet():
    """The reference row m=32768, n=32, k=512 (bf16): x 32768*512*2 = 33,554,432 B, w 32*512*2 = 32,768, out
    32768*32*2 = 2,097,152: 35,684,352 B / 4.8e12 B/s = 7.4342 us; FLOPs 2*32768*32*512 = 1,073,741,824 / 989e12 =
    1.086 us. The table's 7.0267 us is faster than HBM allows."""
    h200 = datasheet(load_systems(find_project().systems)["h200_sxm"])
    b = bound(gemm.work(gemm.GemmCase("bfloat16", 32768, 32, 512)), h200)
    assert b.limit == "memory" and b.bytes == 35_684_352 and us(b.seconds) == pytest.approx(35_684_352 / 4.8e6)
    assert 7.0267 < us(b.seconds)


def test_attention_bounds_context_causal_window_and_generation():
    # context b=2, isl=1024, 8 heads, 2 KV heads, head 128, bf16: causal pairs 1024*1025/2 = 524,800;
    # FLOPs 4 * 2 * 8 * 128 * 524,800 = 4,299,161,600 -> 4.30 us; bytes Q+O 2*1024*8*128*2*2 = 8,388,608,
    # K+V 2*1024*2*128*2*2 = 2,097,152: 10,485,760 -> 10.49 us
    case = attention.AttentionCase(2, 1024, 8, 2, 128, 1, "bfloat16", "bfloat16", 0, 0)
    w = attention.work(case)
    assert w.flops == {"bfloat16": 4_299_161_600} and w.bytes == 10_485_760
    assert us(bound(w, ROUND).seconds) == pytest.approx(10.48576)
    # window 256: queries 1..256 see 1..256 keys (32,896 pairs), the other 768 see 256 (196,608): 229,504
    w = attention.work(case._replace(window_size=256))
    assert w.flops == {"bfloat16": 4.0 * 2 * 8 * 128 * 229_504}
    # generation b=4, 32 heads, 8 KV heads, head 128, step 4095 (4096 keys), fp8 cache: FLOPs 4*4*32*128*4096 =
    # 268,435,456; bytes Q+O 4*128*2*32*2 = 65,536, K+V 4*128*2*4096*8*1 = 33,554,432: 33,619,968 -> 33.62 us
    gen = attention.AttentionCase(4, 1, 32, 8, 128, 1, "bfloat16", "fp8", 4095, 0)
    w = attention.work(gen)
    assert w.flops == {"bfloat16": 268_435_456} and w.bytes == 33_619_968
    assert bound(w, ROUND).limit == "memory" and us(bound(w, ROUND).seconds) == pytest.approx(33.619968)
    # a 1024 window keeps 1024 of the 4096 keys: K+V 4*128*2*1024*8 = 8,388,608 (+65,536)
    assert attention.work(gen._replace(window_size=1024)).bytes == 8_454_144


def test_encoder_attention_bound_is_not_causal():
    # b=2, isl=256, 16 heads, head 64: every query sees 256 keys: 4*2*16*64*256^2 = 536,870,912 FLOPs;
    # Q, K, V, O: 4 * 2*256*16*64*2 = 4 * 1,048,576 = 4,194,304 B
    w = encoder_attention.work(encoder_attention.EncoderAttentionCase(2, 256, 16, 64, "bfloat16"))
    assert w.flops == {"bfloat16": 536_870_912} and w.bytes == 4_194_304


def test_moe_bound_routed_tokens_per_local_expert_weights_once():
    # 1024 tokens, hidden 4096, inter 1024 at TP 2 (512 per rank), top-8 of 64 experts at EP 4 (16 per rank):
    # rank 0's pairs 1024*8/4 = 2048 over at least ceil(2048/1024) = 2 experts; one expert 3*4096*512 = 6,291,456
    # weights. FLOPs 2 * 2048 * 6,291,456 = 25,769,803,776 -> 25.77 us; bytes: 2 experts * 6,291,456 * 2 B =
    # 25,165,824 + tokens ceil(2048/8) = 256 * 4096 * (2 in + 2 out) = 4,194,304: 29,360,128 -> 29.36 us
    case = moe.MoeCase("bfloat16", 1024, 4096, 1024, 8, 64, 2, 4, "balanced")
    w = moe.work(case)
    assert w.flops == {"bfloat16": 25_769_803_776} and w.bytes == 29_360_128
    assert bound(w, ROUND).limit == "memory" and us(bound(w, ROUND).seconds) == pytest.approx(29.360128)
    # fp8 at one token, EP 1: 8 pairs over 8 experts, weights 1 B: 8 * 6,291,456 + 1 token * 4096 * (1 + 2)
    w = moe.work(case._replace(moe_dtype="fp8", num_tokens=1, moe_ep_size=1))
    assert w.flops == {"fp8": 2.0 * 8 * 6_291_456} and w.bytes == 8 * 6_291_456 + 4096 * 3


def test_mla_kernel_and_module_bounds():
    # generation b=2, 16 heads, step 1023 (1024 keys), fp8 cache: pairs 2*16*1024, 2*(192+128) FLOPs each =
    # 20,971,520; bytes Q (192) + O (128) 2*16*320*2 = 20,480, latent 2*1024*576*1 = 1,179,648: 1,200,128
    w = mla.work(mla.MlaCase("bfloat16", "fp8", 16, 2, 1, 1, 1023))
    assert w.flops == {"bfloat16": 20_971_520} and w.bytes == 1_200_128
    # DeepSeek-V3's module, context b=1, isl=128, 16 heads, bf16 everything:
    # pairs 128*129/2 = 8,256 -> 16*640*8,256 = 84,541,440; kv_b absorbed per query 16*128*2*512*256 = 536,870,912;
    # weights 7168*(1536+576) + 1536*16*192 + 512*16*256 + 16*128*7168 = 15,138,816 + 4,718,592 + 2,097,152 +
    # 14,680,064 = 36,634,624; projections but kv_b 2*128*(36,634,624 - 2,097,152) = 8,841,592,832
    case = mla_module.MlaModuleCase(
        "deepseek-ai/DeepSeek-V3", "DeepseekV3ForCausalLM", "bfloat16", "bfloat16", "bfloat16", 16, 1, 128, 1, 0
    )
    w = mla_module.work(case)
    assert w.flops == {"bfloat16": 8_841_592_832 + 536_870_912 + 84_541_440}
    # bytes: weights 36,634,624*2 + hidden in and out 128*7168*2*2 = 3,670,016 + Q/O 16*128*320*2 = 1,310,720
    # + latent 128*576*2 = 147,456
    assert w.bytes == 73_269_248 + 3_670_016 + 1_310_720 + 147_456
    assert mla_module.work(case._replace(architecture="SomeOtherForCausalLM")) is None  # no dimensions, no bound


def test_quantize_and_bmm_bounds():
    # scale_matrix m=1024, k=4096: bf16 in and fp8 out, 1024*4096*3 = 12,582,912 B -> 12.58 us
    w = quantize.scale_matrix_work(quantize.QuantizeCase(1024, 4096, "fp8"))
    assert w.flops == {} and w.bytes == 12_582_912 and us(bound(w, ROUND).seconds) == pytest.approx(12.582912)
    assert quantize.COMPUTE_SCALE.work is None  # a difference of two timings has no bound
    # mla_gen_pre bf16, 64 tokens, 16 heads: [64,128] x [128,512] per head: 2*16*64*128*512 = 134,217,728 FLOPs;
    # bytes 16 * (64*128*2 + 128*512*2 + 64*512*2) = 3,407,872
    w = mla_bmm.work(mla_bmm.MlaBmmCase("mla_gen_pre", "bfloat16", 64, 16))
    assert w.flops == {"bfloat16": 134_217_728} and w.bytes == 3_407_872


def test_comm_bounds_as_nccl_tests_counts_them():
    # half, 2^20 elements = 2,097,152 B. all_reduce: every element's sum needs each GPU's value: S leaves each GPU
    # -> 2,097,152 / 1e11 = 20.97 us over NVLink; all_gather: 7/8 of S = 1,835,008 -> 18.35 us
    reduce = comm.work(comm.CommCase("half", "all_reduce", 8, 2**20))
    assert reduce.link_bytes == 2_097_152 and us(bound(reduce, ROUND).seconds) == pytest.approx(20.97152)
    gather = comm.work(comm.CommCase("half", "all_gather", 8, 2**20))
    assert gather.link_bytes == 1_835_008 and bound(gather, ROUND).limit == "link"
    # 16 GPUs, two nodes of 8: inside 15/16 * S = 1,966,080 / 1e11 = 19.66 us; across, the 8 of 15 peers' share
    # over a node's 8 NICs: 1,966,080 * 8/15 / 8 = 131,072 B / 1e10 = 13.11 us; the larger holds
    across = comm.work(comm.CommCase("half", "all_gather", 16, 2**20))
    assert us(bound(across, ROUND).seconds) == pytest.approx(19.6608)
    slow_network = Figures(**{**ROUND.__dict__, "network": 1e9})
    assert us(bound(across, slow_network).seconds) == pytest.approx(131.072)
    # without NVLink the NICs are shared by the node's 8 GPUs, not by one: across two PCIe nodes on the slow network,
    # 131,072 B per NIC / 1e9 = 131.07 us (above PCIe's 1,966,080 / 5e10 = 39.32 us)
    pcie_nodes = Figures(**{**ROUND.__dict__, "nvlink": None, "nvlink_gpus": 1, "network": 1e9})
    assert us(bound(across, pcie_nodes).seconds) == pytest.approx(131.072)
    # an NVLink domain wider than a node (72 GPUs over trays of 4): 144 GPUs send (144 - 72)/143 of their bytes out
    # of the domain, over its 72 GPUs' NICs
    rack = Figures(**{**ROUND.__dict__, "nvlink_gpus": 72, "gpus_per_node": 4, "network": 1e8})
    wide = comm.work(comm.CommCase("half", "all_gather", 144, 2**20))
    assert bound(wide, rack).seconds == pytest.approx(wide.link_bytes * 72 / 143 / 72 / 1e8)
    # without NVLink, a node's GPUs share PCIe: 2,097,152 / 5e10 = 41.94 us
    pcie = Figures(**{**ROUND.__dict__, "nvlink": None, "nvlink_gpus": 1})
    assert us(bound(reduce, pcie).seconds) == pytest.approx(41.94304)
    custom = comm.work_custom(comm.CustomAllreduceCase("bfloat16", 4, 2**20, "vllm_graph"))
    assert custom.link_bytes == 2_097_152 and custom.gpus == 4


def test_rates_the_system_lacks_and_the_cpu_cache():
    # float32 at bf16's rate (above TF32's); an unknown rate at the highest listed (fp8's 2e15): looser, never tighter
    # fp32 8192^3: 2*8192^3 = 1,099,511,627,776 FLOPs at 1e15 -> 1099.5 us, above its 3*8192^2*4 B -> 805.3 us
    w = gemm.work(gemm.GemmCase("float32", 8192, 8192, 8192))
    assert bound(w, ROUND).limit == "compute" and us(bound(w, ROUND).seconds) == pytest.approx(1099.511627776)
    w = gemm.work(gemm.GemmCase("mxfp6", 4096, 4096, 4096))
    assert bound(w, ROUND).seconds == pytest.approx(2 * 4096**3 / 2e15)
    # on a warm-cache host, bytes within the cache cost nothing; beyond it they do
    warm = Figures(**{**ROUND.__dict__, "warm": True, "cache_bytes": 64 * 2**20})
    small = quantize.scale_matrix_work(quantize.QuantizeCase(1024, 4096, "fp8"))  # 12 MiB
    assert bound(small, warm).seconds == 0.0
    big = quantize.scale_matrix_work(quantize.QuantizeCase(16384, 4096, "fp8"))  # 192 MiB
    assert us(bound(big, warm).seconds) == pytest.approx(16384 * 4096 * 3 / 1e6)


# --- R8 on a crafted table --------------------------------------------------------------------------------------
# bf16 GEMMs on an H200 (989 TFLOP/s, 4.8 TB/s), each row at a chosen fraction of its bound:
# 4096^3: 2*4096^3 / 989e12 = 138.97 us (compute); 1024^3: 2*1024^3/989e12 = 2.171 us vs 3*1024^2*2/4.8e12 =
# 1.311 us (compute); m=16, n=k=4096: bytes 16*4096*2 + 4096^2*2 + 16*4096*2 = 33,816,576 / 4.8e12 = 7.045 us
ROWS = {  # (m, n, k) -> (bound in ms by hand, fraction of speed of light the row runs at)
    (4096, 4096, 4096): (2 * 4096**3 / 989e12 * 1e3, 2.0),  # twice as fast as the H200 allows
    (1024, 1024, 1024): (2 * 1024**3 / 989e12 * 1e3, 0.5),
    (16, 4096, 4096): (33_816_576 / 4.8e12 * 1e3, 0.25),
    (1, 4096, 4096): ((4096 * 2 + 4096**2 * 2 + 4096 * 2) / 4.8e12 * 1e3, 0.005),  # under 1% of it
}


@pytest.fixture
def crafted(tmp_path):
    cases = [gemm.GemmCase("bfloat16", *shape) for shape in ROWS]

    def latency(case):
        bound_ms, fraction = ROWS[(case.m, case.n, case.k)]
        return bound_ms / fraction

    tables = tmp_path / "tables"
    merge([fake_run(tmp_path / "run", cases, latency_of=latency)], tables, find_project())
    return tables


def test_r8_names_the_row_faster_than_the_system_and_the_fraction(crafted):
    findings = [f for f in check_tables(crafted) if f.rule == "R8"]
    fast = [f for f in findings if "faster than the h200_sxm allows" in f.message]
    assert len(fast) == 1 and fast[0].warning and fast[0].message.startswith("1 rows faster")
    assert len(fast[0].keys) == 1 and fast[0].keys[0].startswith("gemm_dtype=bfloat16,m=4096,n=4096,k=4096: latency")
    assert "(compute)" in fast[0].keys[0]
    # fractions 2.0, 0.5, 0.25, 0.005: median (0.25 + 0.5) / 2 = 37.5%, p10 the lowest of four: 0.5%; one under 1%
    [sol] = [f for f in findings if "speed of light" in f.message]
    assert sol.warning and "median 37.5%, p10 0.5% of 4 rows; 1 rows under 1% of it" in sol.message
    assert sol.keys == ("gemm_dtype=bfloat16,m=1,n=4096,k=4096",)
    strict = [f for f in check_tables(crafted, strict=True) if f.rule == "R8" and not f.warning]
    assert len(strict) == 1 and "faster than the h200_sxm" in strict[0].message
    done = run_cli("check", str(crafted))
    assert done.returncode == 0 and "R8 warning" in done.stdout
    done = run_cli("check", str(crafted), "--strict")
    assert done.returncode == 1 and "R8 violation" in done.stdout and "m=4096,n=4096,k=4096" in done.stdout


# --- --against-physics over the reference's H200 GEMM rows --------------------------------------------------------
FAST = ("m=32768,n=32,k=512", "m=32768,n=64,k=512", "m=16384,n=32,k=1024")


def _fast_rows(stdout: str, table: str) -> list[str]:
    [line] = [x for x in stdout.splitlines() if table in x and "faster than the h200_sxm allows" in x]
    return line


@pytest.mark.parametrize("framework", ["vllm/0.24.0", "trtllm/1.3.0rc20"])
def test_against_physics_names_the_reference_rows_faster_than_the_h200(framework):
    done = run_cli("check", "--against-physics", str(SLICE))
    assert done.returncode == 0, done.stderr
    line = _fast_rows(done.stdout, f"gemm/{framework}/gemm_perf.parquet")
    assert ": 3 rows faster than the h200_sxm allows" in line
    for key in FAST:
        assert f"gemm_dtype=bfloat16,{key}: latency" in line
    assert "fit the 50 MiB L2: timed warm" in line
    strict = run_cli("check", "--against-physics", str(SLICE), "--strict")
    assert strict.returncode == 1 and "R8 violation" in strict.stdout


def test_against_physics_reads_the_tables_layout_and_needs_a_system(tmp_path):
    tables = tmp_path / "TABLES"
    shutil.copytree(SLICE / "gemm", tables / "h200_sxm" / "gemm")
    shutil.copy(SLICE / "h200_sxm.yaml", tables / "h200_sxm.yaml")
    done = run_cli("check", "--against-physics", str(tables))
    assert done.returncode == 0 and done.stdout.count("3 rows faster than the h200_sxm allows") == 2
    bare = tmp_path / "bare"
    shutil.copytree(SLICE / "gemm", bare / "gemm")
    done = run_cli("check", "--against-physics", str(bare))
    assert done.returncode == 2 and "pass --system NAME" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    done = run_cli("check", "--against-physics", str(bare), "--system", "h200_sxm")
    assert done.returncode == 0 and done.stdout.count("3 rows faster than the h200_sxm allows") == 2
    done = run_cli("check", "--against-physics", str(bare), "--system", "h300")
    assert done.returncode == 2 and "--system h300: no such system" in done.stderr


# --- the CPU: the run's own figures ------------------------------------------------------------------------------
def test_cpu_run_records_its_probe_and_check_bounds_by_it(tmp_path):
    plan = gemm_plan(tmp_path / "plan.json", [(8, 64, 64), (64, 256, 256)])
    run = tmp_path / "run"
    done = run_cli("run", "--plan", str(plan), "--out", str(run), "--device", "cpu", "--max-case-seconds", "0.05")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(x) for p in sorted((run / "shards").glob("*.jsonl")) for x in p.read_text().splitlines()]
    [runtime] = [x for x in lines if x.get("kind") == "runtime"]
    figures = runtime["host_figures"]
    assert figures["dense_tflops"]["float32"] > 0 and figures["dense_tflops"]["bfloat16"] > 0
    assert figures["bandwidth_bytes_per_s"] > 0 and figures["threads"] >= 1
    tables = tmp_path / "tables"
    merge([run], tables, find_project())
    [record] = list(tables.rglob(PROVENANCE))
    host = read_provenance(record).system.host_figures
    assert host is not None and host.dense_tflops["float32"] == figures["dense_tflops"]["float32"]
    r8 = [f for f in check_tables(tables) if f.rule == "R8"]
    assert any("speed of light on cpu" in f.message and "of 2 rows" in f.message for f in r8), r8


def test_a_cpu_table_without_probed_figures_has_no_bound(tmp_path):
    cases = [gemm.GemmCase("float32", 8, 64, 64)]
    tables = tmp_path / "tables"
    run = fake_run(tmp_path / "run", cases, device="cpu", sm="cpu", backend="torch", version="2.8.0", nccl_version=None)
    merge([run], tables, find_project())
    [finding] = [f for f in check_tables(tables) if f.rule == "R8"]
    assert finding.warning and "no bound: its runs recorded no host figures" in finding.message


# --- the systems' figures are validated input --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("  fp8: 1979\n", "  fp8: -1979\n", "h200_sxm.yaml: field 'dense_tflops.fp8': Input should be greater than 0"),
        ("  fp8: 1979\n", "  fp6: 1979\n", "h200_sxm.yaml: field 'dense_tflops.fp6': unknown field"),
        (
            "nvlink_bytes_per_s: 450000000000\n",
            "nvlink_bytes_per_s: 450GB/s\n",
            "h200_sxm.yaml: field 'nvlink_bytes_per_s': Input should be a valid integer",
        ),
        ("network_bytes_per_s: 50000000000\n", "", "h200_sxm.yaml: field 'network_bytes_per_s': missing required"),
        ("nvlink_bytes_per_s: 450000000000\n", "nvlink_bytes_per_s: null\n", "nvlink_gpus is 8 without nvlink"),
    ],
)
def test_bad_system_figures_are_one_line_input_errors(tmp_path, old, new, message):
    systems = tmp_path / "systems"
    shutil.copytree(ROOT / "systems", systems)
    path = systems / "h200_sxm.yaml"
    text = path.read_text()
    assert text.count(old) == 1
    path.write_text(text.replace(old, new))
    with pytest.raises(InputError, match=message.replace("(", r"\(")) as raised:
        load_systems(systems)
    assert "\n" not in str(raised.value)


def test_every_system_has_the_figures_the_bound_needs():
    for name, system in load_systems(Path(ROOT / "systems")).items():
        rates = system.dense_tflops.rates()
        if system.sm != "cpu":
            assert "bfloat16" in rates, name
            assert system.pcie_bytes_per_s > 0 and system.network_bytes_per_s > 0, name
        figures = datasheet(system)
        assert figures.rate("bfloat16") == rates.get("bfloat16"), name


# --- --against-physics: what it does not bound ---------------------------------------------------------------------
def test_against_physics_needs_a_directory(tmp_path):
    with pytest.raises(InputError) as raised:
        against_physics(tmp_path / "absent")
    assert (
        str(raised.value) == f"--against-physics {tmp_path / 'absent'}: no such directory; give an aiconfigurator tree"
    )
    (tmp_path / "gemm_perf.parquet").write_bytes(b"")
    with pytest.raises(InputError, match="gemm_perf.parquet: no such directory; give an aiconfigurator tree$"):
        against_physics(tmp_path / "gemm_perf.parquet")


def test_against_physics_names_the_tables_it_has_no_bound_for_and_skips_hidden_files(tmp_path):
    """A table opcollect does not plan and computescale (a difference of timings) have no bound: one warning at the
    root names them; a dot-directory's files (our failures and plans) are not read; a GEMM table without a key
    column has no bound either. TABLES layout: <root>/h200_sxm/gemm/..."""
    root = tmp_path / "tree"
    directory = root / "h200_sxm/gemm/vllm/0.24.0"
    directory.mkdir(parents=True)
    shutil.copy(SLICE / "h200_sxm.yaml", root)
    table = pq.read_table(SLICE / "gemm/vllm/0.24.0/gemm_perf.parquet")
    pq.write_table(table.drop_columns(["k"]), directory / "gemm_perf.parquet")
    for name in ("custom_perf.parquet", "computescale_perf.parquet", ".opcollect/gemm_perf.parquet"):
        (directory / name).parent.mkdir(exist_ok=True)
        (directory / name).write_bytes(b"not parquet")
    (directory / ".opcollect/extras_perf.parquet").write_bytes(b"not parquet")
    assert [(f.path, f.message, f.keys, f.warning) for f in against_physics(root)] == [
        (str(directory / "gemm_perf.parquet"), "no bound: key columns missing", ("k",), True),
        (str(root), "no bound for these tables", ("computescale_perf", "custom_perf"), True),
    ]
    pq.write_table(table.drop_columns(["latency"]), directory / "gemm_perf.parquet")
    assert [f.keys for f in against_physics(root)][0] == ("latency",)


def test_against_physics_bounds_a_cpu_table_by_its_records_probe(tmp_path):
    """A CPU table is bounded by the host figures its provenance record holds; without a record, or a record
    without them, it has no bound. 1 GFLOP/s float32 x 4 (CPU_HEADROOM): 2*8*64*64 FLOPs take 16.384 us."""
    tables = tmp_path / "tables"
    cases = [gemm.GemmCase("float32", 8, 64, 64)]
    run = fake_run(
        tmp_path / "run",
        cases,
        device="cpu",
        sm="cpu",
        backend="torch",
        version="2.8.0",
        nccl_version=None,
        latency=0.01,
    )
    merge([run], tables, find_project())
    directory = tables / "cpu/gemm/torch/2.8.0"
    perf, record = directory / "gemm_perf.parquet", directory / PROVENANCE
    none = [(str(perf), "no bound: a CPU table without host figures", (), True)]
    assert [(f.path, f.message, f.keys, f.warning) for f in against_physics(tables)] == none
    data = yaml.safe_load(record.read_text())
    data["system"]["host_figures"] = {
        "dense_tflops": {"float32": 0.001},
        "bandwidth_bytes_per_s": 10**9,
        "cache_bytes": 1024,
    }
    record.write_text(yaml.safe_dump(data, sort_keys=False))
    fast, sol = against_physics(tables)
    assert fast.message == "1 rows faster than the cpu allows (latency < speed-of-light bound)" and fast.warning
    assert fast.keys == ("gemm_dtype=float32,m=8,n=64,k=64: latency 0.01 ms < bound 0.016384 ms (compute)",)
    assert sol.message == "speed of light on cpu: median 163.8%, p10 163.8% of 1 rows; 0 rows under 1% of it"
    record.unlink()
    assert [(f.path, f.message, f.keys, f.warning) for f in against_physics(tables)] == none


def test_r8_a_record_naming_a_system_the_project_lacks(tmp_path):
    tables = tmp_path / "tables"
    merge([fake_run(tmp_path / "run", [gemm.GemmCase("bfloat16", 8, 64, 64)])], tables, find_project())
    [record] = tables.rglob(PROVENANCE)
    data = yaml.safe_load(record.read_text())
    data["system"]["name"] = "h300_sxm"
    record.write_text(yaml.safe_dump(data, sort_keys=False))
    [finding] = [f for f in check_tables(tables) if f.rule == "R8"]
    assert (finding.message, finding.warning) == ("no bound: no systems/h300_sxm.yaml", True)


def test_r8_broken_project_systems_are_a_warning_of_check(tmp_path, tree_copy):
    """systems/*.yaml that do not load leave R8 without a bound: a warning naming the error, the other rules run."""
    tables = tmp_path / "tables"
    merge([fake_run(tmp_path / "run", [gemm.GemmCase("bfloat16", 8, 64, 64)])], tables, find_project())
    spec = tree_copy / "systems/h200_sxm.yaml"
    spec.write_text(spec.read_text().replace("  fp8: 1979\n", "  fp8: -1979\n"))
    done = run_cli("check", str(tables), cwd=tree_copy, env={"PYTHONPATH": str(tree_copy / "src")})
    path = tables / "h200_sxm/gemm/vllm/0.24.0/gemm_perf.parquet"
    assert done.returncode == 0, done.stderr
    assert f"R8 warning: {path}: no bound: {spec}: field 'dense_tflops.fp8': Input should be greater than 0" in (
        done.stdout
    )


def test_system_names_the_system_of_every_per_system_directory(tmp_path):
    """--system judges a TABLES tree's directories by the named system, not by the directory names."""
    from opcollect.tables.physics import system_roots

    systems = load_systems(find_project().systems)
    for name in ("h200_sxm", "h100_sxm"):
        (tmp_path / name / "gemm").mkdir(parents=True)
    assert system_roots(tmp_path, systems, None) == [
        (tmp_path / "h100_sxm", systems["h100_sxm"]),
        (tmp_path / "h200_sxm", systems["h200_sxm"]),
    ]
    chosen = system_roots(tmp_path, systems, "b200_sxm")
    assert chosen == [(tmp_path / "h100_sxm", systems["b200_sxm"]), (tmp_path / "h200_sxm", systems["b200_sxm"])]


def test_the_host_probe_counts_a_copy_as_a_read_and_a_write(monkeypatch):
    """bandwidth = 2 x bytes / seconds (the copy reads and writes its buffer); TFLOP/s = 2 n^3 / seconds."""
    pytest.importorskip("torch")
    from opcollect.runtime import hostprobe

    monkeypatch.setattr(hostprobe, "cache_bytes", lambda: 48 * 2**20)
    seconds = {2: 0.5, 1: 0.25}  # the matmuls take at least two calls, the copy at least one
    monkeypatch.setattr(hostprobe, "_best_seconds", lambda call, budget, at_least=2: seconds[at_least])
    figures = hostprobe.host_figures("cpu")
    size = 96 * 2**20  # twice the cache, between the floor and the ceiling
    assert figures["bandwidth_bytes_per_s"] == int(2 * size / 0.25)
    assert figures["cache_bytes"] == 48 * 2**20
    assert figures["dense_tflops"] == {name: 2.0 * n**3 / 0.5 / 1e12 for name, n in hostprobe.MATMUL_SIZE.items()}
    assert hostprobe.host_figures("cuda:0") is None


def test_the_host_cache_is_the_largest_cache_linux_lists_for_cpu0(tmp_path):
    """The copy buffer and R8's warm-cache allowance size by the last-level cache, not L1: sizes in K, M, G or
    bytes, an unreadable or malformed entry skipped, None when none is listed."""
    from opcollect.runtime.hostprobe import cache_bytes

    for index, size in enumerate(["32K", "48K", "2048K", "32M", "oops", "512"]):
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "size").write_text(size + "\n")
    (tmp_path / "index9").mkdir()
    (tmp_path / "index9" / "size").mkdir()  # not a readable file
    assert cache_bytes(tmp_path) == 32 * 2**20
    (tmp_path / "index6").mkdir()
    (tmp_path / "index6" / "size").write_text("1G\n")
    assert cache_bytes(tmp_path) == 2**30
    assert cache_bytes(tmp_path / "absent") is None
