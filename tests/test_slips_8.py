"""Behaviours of the planning code (plans/cost.py, plans/bound.py, cases/) that no other test held exactly: each test
here fails with a small plausible bug planted in the function its docstring names."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_cost import FIGURES, NOISY

from opcollect.cases import linear
from opcollect.cases.dsv4 import Dsv4Attention
from opcollect.cases.profiles import HeadShape, Mlp, derive_shapes, parse_config, read_hf_config
from opcollect.cases.quantization import COMPRESSED_TENSORS, static_fp8
from opcollect.cases.systems import load_systems
from opcollect.plans.bound import Figures, bound, probed
from opcollect.plans.cost import Costing, moe_weights, system_for_sm
from opcollect.plans.ops import OPS
from opcollect.plans.planner import plan_of_cases
from opcollect.plans.work import Work
from opcollect.project import find_project
from opcollect.runtime.harness import TimingConfig
from opcollect.tables.provenance import HostFigures

CPU = TimingConfig(max_noise=0.01, min_samples=5, max_case_seconds=0.25, warmup_seconds=0.002)


def _costing(kind: str, backend: str = "torch") -> Costing:
    return Costing(backend, kind, FIGURES, 10**11, CPU, NOISY)


# ---- plans/cost.py ---------------------------------------------------------------------------------------------


def test_system_for_sm_takes_the_least_bandwidth_then_the_name():
    """system_for_sm: of the SM's systems the one with the least bandwidth, a tie broken by name; None without."""
    s = [
        SimpleNamespace(name="zeta", sm="90", bandwidth_bytes_per_s=3),
        SimpleNamespace(name="beta", sm="90", bandwidth_bytes_per_s=2),
        SimpleNamespace(name="alpha", sm="90", bandwidth_bytes_per_s=2),
        SimpleNamespace(name="aaa", sm="100", bandwidth_bytes_per_s=1),
    ]
    systems = {x.name: x for x in s}
    assert system_for_sm(systems, "90").name == "alpha"
    assert system_for_sm(systems, "100").name == "aaa"
    assert system_for_sm(systems, "86") is None


def test_moe_weights_are_every_local_experts_three_tp_split_matrices():
    """moe_weights: num_experts / ep local experts x 3 x hidden x inter / tp x the weight's bytes per element."""
    case = SimpleNamespace(
        num_experts=64, moe_ep_size=4, hidden_size=1024, inter_size=512, moe_tp_size=2, moe_dtype="w4a16_mxfp4"
    )
    # 16 local experts x 3 x 1024 x 256 x 0.5 B (mxfp4 weights under bf16 activations)
    assert moe_weights(case) == 16 * 3 * 1024 * 256 * 0.5
    assert moe_weights(SimpleNamespace(**{**vars(case), "moe_dtype": "bfloat16"})) == 16 * 3 * 1024 * 256 * 2


def test_an_ops_own_floor_replaces_the_devices_where_one_is_set():
    """Costing.floor: FLOORS per (device kind, op), else the harness's floor_seconds."""
    cpu, cuda = _costing("cpu"), _costing("cuda")
    assert (cpu.floor("moe"), cpu.floor("comm"), cpu.floor("gemm")) == (0.03, 3e-4, 1e-5)
    assert (cuda.floor("custom_allreduce"), cuda.floor("comm"), cuda.floor("moe")) == (8e-6, 20e-6, 1e-5)


def test_a_single_device_row_adds_no_ranks_start():
    """Costing.units: a batch row of one-device cases costs the sum of its cases, without row_start_seconds."""
    comm = OPS["comm"].case_type
    whole = plan_of_cases(
        "torch",
        "cpu",
        "comm",
        [comm("half", "all_reduce", 1, 1024), comm("half", "all_gather", 1, 1024)],
        "g",
        "x" * 64,
    )
    sel = whole.ops["comm"]
    costing = _costing("cpu")
    each = sum(costing.case(sel.op, c).seconds for c in sel.values)
    [(_, cost)] = costing.units(sel.op, sel.values, sel.ids, sel.rows)
    assert cost.devices == 1 and cost.seconds == pytest.approx(each, rel=1e-12)
    assert costing.op_device_seconds(sel.op, sel.values, sel.ids, sel.rows) == pytest.approx(each, rel=1e-12)


def test_op_device_seconds_of_a_collective_without_rows_counts_every_rank():
    """Costing.op_device_seconds: a collective's cases without rows still count seconds x num_gpus each."""
    comm = OPS["comm"].case_type
    cases = [comm("half", "all_reduce", 2, 1024), comm("half", "all_reduce", 4, 4096)]
    op = OPS["comm"]
    costing = _costing("cpu")
    expected = sum(costing.case(op, c).seconds * c.num_gpus for c in cases)
    assert costing.op_device_seconds(op, cases, ["a", "b"], None) == pytest.approx(expected, rel=1e-12)


# ---- plans/bound.py --------------------------------------------------------------------------------------------


def test_a_warm_cache_holds_bytes_up_to_its_size_inclusive():
    """bound: on a warm-cache host, bytes equal to cache_bytes cost no memory time; one byte more does."""
    warm = Figures(**{**FIGURES.__dict__, "warm": True})
    assert bound(Work({}, 2**20), warm).seconds == 0.0
    assert bound(Work({}, 2**20 + 1), warm).seconds == pytest.approx((2**20 + 1) / 1e10)


def test_probed_figures_scale_the_hosts_probe_and_fall_back_to_the_systems_cache():
    """probed: rates TFLOP/s x 1e12 x CPU_HEADROOM, memory/pcie/network the probed copy x 4, cache else the L2's."""
    cpu = load_systems(find_project().systems)["cpu"]
    host = HostFigures(dense_tflops={"float32": 0.5}, bandwidth_bytes_per_s=10**9)
    f = probed(cpu, host)
    assert f.rates == {"float32": 2e12} and f.memory == f.pcie == f.network == 4e9
    assert f.warm and f.nvlink is None and f.nvlink_gpus == 1 and f.cache_bytes == cpu.l2_bytes
    assert (
        probed(cpu, HostFigures(dense_tflops={"float32": 0.5}, bandwidth_bytes_per_s=1, cache_bytes=7)).cache_bytes == 7
    )


# ---- cases/quantization.py -------------------------------------------------------------------------------------


def _group(weights: dict, inputs: dict | None) -> dict:
    return {
        "quant_method": "compressed-tensors",
        "config_groups": {"g": {"weights": weights, "input_activations": inputs}},
    }


def test_compressed_tensors_needs_float8_weights_and_static_symmetric_float8_inputs():
    """static_fp8: compressed-tensors' 8-bit float args (num_bits defaults to 8), int weights or asymmetric not."""
    fp8 = {"type": "float"}  # num_bits 8, dynamic false, symmetric true and strategy tensor by default
    assert static_fp8("c", _group(fp8, fp8)) == COMPRESSED_TENSORS
    assert static_fp8("c", _group({"type": "int", "num_bits": 8}, fp8)) is None  # W8A8 int weights
    assert static_fp8("c", _group(fp8, {**fp8, "symmetric": False})) is None
    assert static_fp8("c", _group(fp8, {**fp8, "num_bits": 16})) is None  # float16 inputs
    # a group that is not an object is passed over; a later static group still counts
    later = {
        "quant_method": "compressed-tensors",
        "config_groups": {"a": None, "b": _group(fp8, fp8)["config_groups"]["g"]},
    }
    assert static_fp8("c", later) == COMPRESSED_TENSORS


# ---- cases/linear.py -------------------------------------------------------------------------------------------

GDN = {"linear_num_key_heads": 4, "linear_key_head_dim": 64, "linear_num_value_heads": 8}
GDN |= {"linear_value_head_dim": 32, "linear_conv_kernel_dim": 4}


def test_full_attention_interval_makes_every_interval_th_layer_full():
    """linear_attention: without layer_types, layer i (0-based) is full attention iff (i + 1) % interval == 0."""
    five = linear.linear_attention("c", "Qwen3NextForCausalLM", {**GDN, "full_attention_interval": 2}, 512, None, 5)
    assert (five.layers, five.attention_layers) == (3, 2)  # layers 1 and 3 are full, 0, 2 and 4 linear
    six = linear.linear_attention("c", "Qwen3NextForCausalLM", GDN, 512, None, 6)  # the default interval, 4
    assert (six.layers, six.attention_layers) == (5, 1)


def test_gdn_rank_gemms_are_qkvz_ba_and_out_and_need_both_head_counts_split():
    """rank_gemms (GDN): qkvz 2 (nk hk + nv hv) / tp, ba 2 nv / tp, out nv hv / tp; a tp dividing nv alone fails."""
    layer = linear.linear_attention("c", "Qwen3NextForCausalLM", GDN, 512, None, 4)
    assert linear.rank_gemms(layer, 2) == ((((2 * (2 * 64 + 4 * 32)), 512), (8, 512), (512, 4 * 32)), None, "", ())
    assert linear.gdn_rank_heads(layer, 4) == (1, 2)
    assert linear.gdn_rank_heads(layer, 8) is None  # 8 divides the 8 value heads, not the 4 key heads
    refused = linear.rank_gemms(layer, 8)
    assert refused.shapes == () and refused.families == ("gemm", "linear_attention")


MAMBA = {"mamba_num_heads": 8, "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 2, "conv_kernel": 4}
MAMBA |= {"chunk_size": 256, "hybrid_override_pattern": "M*M-"}


def test_mamba2_rank_gemms_split_heads_and_groups_or_replicate_one_group():
    """rank_gemms (Mamba2): in_proj 2 d_inner / tp + 2 (groups / tp) N + heads / tp, out d_inner / tp; 1 group kept."""
    layer = linear.linear_attention("c", "NemotronHForCausalLM", MAMBA, 1024, None, 4)
    assert (layer.layers, layer.attention_layers, layer.mlp_layers) == (2, 1, 1)
    # tp 2: 4 heads x 64 = 256 inner, 1 group: 2 x 256 + 2 x 128 + 4
    assert linear.rank_gemms(layer, 2).shapes == ((2 * 256 + 2 * 128 + 4, 1024), (1024, 256))
    assert linear.rank_gemms(layer, 1).shapes == ((2 * 512 + 2 * 2 * 128 + 8, 1024), (1024, 512))
    assert linear.rank_gemms(layer, 4).shapes == () and linear.rank_gemms(layer, 4).families == ("gemm",)
    one = layer._replace(n_groups=1)  # a single group is replicated on every rank
    assert linear.rank_gemms(one, 4).shapes == ((2 * 128 + 2 * 128 + 2, 1024), (1024, 128))


def test_layers_block_type_words_count_as_the_patterns_letters():
    """_pattern: layers_block_type's mamba/attention/dense/moe words read as M, *, - and E."""
    keys = {k: v for k, v in MAMBA.items() if k != "hybrid_override_pattern"}
    words = ["mamba", "attention", "mamba", "dense", "moe", "mlp", "mamba"]
    layer = linear.linear_attention("c", "NemotronHForCausalLM", {**keys, "layers_block_type": words}, 1024, None, 7)
    assert (layer.layers, layer.attention_layers, layer.mlp_layers) == (3, 1, 2)


# ---- cases/dsv4.py ---------------------------------------------------------------------------------------------

FLASH_CONFIG = Path(__file__).parent / "data" / "dsv4_configs" / "sgl-project--DeepSeek-V4-Flash-FP8_config.json"


def _flash(tmp_path, **change) -> Dsv4Attention:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**json.loads(FLASH_CONFIG.read_text()), **change}))
    return read_hf_config(config).layout.attention


def test_sliding_window_only_layers_count_as_hca_and_ratio_four_as_csa():
    """Dsv4Attention.has_hca: an HCA or a sliding-window-only layer; has_csa: a ratio-4 layer."""
    base = dict.fromkeys(Dsv4Attention._fields, 1)
    assert Dsv4Attention(**{**base, "ratios": (0, 4)}).has_hca
    assert not Dsv4Attention(**{**base, "ratios": (4,)}).has_hca
    assert (
        Dsv4Attention(**{**base, "ratios": (128,)}).has_hca
        and not Dsv4Attention(**{**base, "ratios": (0, 128)}).has_csa
    )


def test_compress_ratios_may_cover_exactly_the_layers_and_hca_only_drops_the_indexer(tmp_path):
    """attention_of: one ratio per layer is enough; without CSA layers the index_* keys read as 0."""
    exact = _flash(tmp_path, compress_ratios=[0, 4, 128] * 14 + [0])  # 43 entries for 43 layers, no MTP entry
    assert exact.ratios == (0, 4, 128) and exact.index_topk == 512
    hca = _flash(tmp_path, compress_ratios=[0, 128] * 22)  # the index_* keys still in the config
    assert (hca.index_n_heads, hca.index_head_dim, hca.index_topk) == (0, 0, 0) and hca.ratios == (0, 128)


# ---- cases/profiles.py -----------------------------------------------------------------------------------------

GQA = {"hidden_size": 1536, "num_attention_heads": 12, "num_key_value_heads": 3, "head_dim": 128}


def test_kv_heads_replicate_only_where_the_tp_size_is_a_multiple_of_them():
    """derive_shapes: 3 kv heads split at no tp of 2 or 4 (left out), replicate to 1 a rank at tp 6."""
    spec = parse_config("c", "LlamaForCausalLM", "m", {**GQA, "intermediate_size": 1536})
    shapes = derive_shapes(spec, [2, 4, 6])
    assert shapes.attention == {HeadShape(2, 1, 128, 0)}
    assert shapes.notes_for("attention") == [
        f"m: tp {tp} does not split 3 kv heads evenly; its attention and qkv/o GEMM shapes at tp {tp} are left out"
        for tp in (2, 4)
    ]


def test_an_expert_count_of_zero_is_a_dense_model():
    """parse_config: num_experts 0 means no experts (the next expert key is read), not a MoE of 0 experts."""
    dense = parse_config("c", "Qwen3MoeForCausalLM", "m", {**GQA, "num_experts": 0, "intermediate_size": 1536})
    assert dense.layout.experts is None and dense.layout.dense == Mlp(1536, "intermediate_size")
    moe = {**GQA, "num_experts": 0, "num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 512}
    assert parse_config("c", "MixtralForCausalLM", "m", moe).layout.experts.count == 8
