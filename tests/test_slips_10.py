"""Behaviours of the grids (cases/grids*.py) and the plans (plans/moe.py, plans/attention.py,
plans/planner.py) that no other test held exactly: each test here fails with a small
plausible bug planted in the function its docstring names."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from opcollect.cases import grids_dsv4, grids_linear, grids_sparse
from opcollect.cases.grids import (
    GRID_TYPES,
    CommGrid,
    ContextAttentionGrid,
    CustomAllreduceGrid,
    EncoderAttentionGrid,
    GemmGrid,
    GenerationAttentionGrid,
    HeadSweep,
    MlaBmmGrid,
    ModelHeads,
    OpFile,
    QuantizeGrid,
)
from opcollect.errors import InputError
from opcollect.plans import attention, moe
from opcollect.plans.attention import AttentionCase, context_lengths
from opcollect.plans.gemm import GemmCase
from opcollect.plans.planner import PlanOptions, _Picked, _smoke

# ---- cases/grids*.py: the validators ---------------------------------------------------------------------------

GEMM = {"dtypes": ["bfloat16"], "m": [1, 2], "n": [8, 16], "k": [8, 16], "model_tp_sizes": [1, 2]}
QUANT = {"dtypes": ["fp8"], "m": [1, 2], "k": [8, 16], "model_tp_sizes": [1, 2]}
BMM = {"dtypes": ["bfloat16"], "num_tokens": {"mla_gen_pre": [1, 2]}, "num_heads": [8, 16], "model_tp_sizes": [1, 2]}
COMM = {"op_names": ["all_reduce"], "dtypes": ["half"], "num_gpus": [2, 4], "message_size": {"half": [1, 2]}}
ALLREDUCE = {"dtypes": ["bfloat16"], "num_gpus": [2, 4], "message_size": [1, 2]}
# fmt: off
ENCODER = {"attn_dtypes": ["bfloat16"], "batch_size": [1, 2], "isl": [16, 32], "max_tokens": 64,
           "heads": [{"num_heads": [8], "head_dim": [64]}], "model_tp_sizes": [1, 2]}
CONTEXT_SHAPES = {"batch_size": [1, 2], "isl": [4, 8], "step": [0, 4]}
DECODE_SHAPES = {"batch_size": [1, 2], "step": [4, 8]}
DSV4_SWEEP = {"precisions": [{"mla_dtype": "bfloat16", "kv_cache_dtype": "fp8"}], "gemm_types": ["fp8_block"],
              "tp_sizes": [1, 2]}
MHC = {"op_names": ["pre"], "num_tokens": [1, 2], "num_sites": 2}
SPARSE = {"backends": ["sglang"], "models": [{"model": "m", "profile": "p"}], "num_heads": [8, 16], "max_tokens": 16,
          "precisions": [{"mla_dtype": "bfloat16", "kv_cache_dtype": "bfloat16"}], "batch_size": [1, 2]}
GDN_SHAPE = {"d_model": 8, "d_conv": 4, "num_k_heads": 2, "head_k_dim": 4, "num_v_heads": 2, "head_v_dim": 4}
GDN = {"context_batch_size": [1, 2], "context_seq_len": [4, 8], "generation_batch_size": [1, 2],
       "models": [{"model": "g", "shape": GDN_SHAPE, "tp_sizes": [1]}], "model_tp_sizes": [1]}
SORTED_AXES = (
    (GemmGrid, GEMM, "m n k model_tp_sizes"),
    (QuantizeGrid, QUANT, "m k model_tp_sizes"),
    (MlaBmmGrid, BMM, "num_tokens.mla_gen_pre num_heads model_tp_sizes"),
    (CommGrid, COMM, "num_gpus message_size.half"),
    (CustomAllreduceGrid, ALLREDUCE, "num_gpus message_size"),
    (EncoderAttentionGrid, ENCODER, "batch_size isl model_tp_sizes"),
    (grids_dsv4.ContextShapes, CONTEXT_SHAPES, "batch_size isl step"),
    (grids_dsv4.DecodeShapes, DECODE_SHAPES, "batch_size step"),
    (grids_dsv4.Dsv4Sweep, {**DSV4_SWEEP, "decode": DECODE_SHAPES}, "tp_sizes"),
    (grids_dsv4.MhcGrid, MHC, "num_tokens"),
    (grids_sparse.ModuleSweep, SPARSE, "batch_size num_heads"),
    (grids_linear.GdnGrid, GDN, "context_batch_size context_seq_len generation_batch_size"),
)
# fmt: on
ASCENDING = [(grid, data, tuple(axis.split("."))) for grid, data, axes in SORTED_AXES for axis in axes.split()]


def _with(data: dict, path: tuple[str, ...], value) -> dict:
    if len(path) == 1:
        return {**data, path[0]: value}
    return {**data, path[0]: _with(data[path[0]], path[1:], value)}


@pytest.mark.parametrize(("grid", "data", "path"), ASCENDING, ids=lambda v: ".".join(v) if isinstance(v, tuple) else "")
def test_each_sorted_axis_of_a_grid_must_ascend_without_repeats(grid, data, path):
    """_ascending_unique and each grid's _sorted: every listed axis refuses a descending list and a repeat."""
    grid.model_validate(data)  # the baseline: ascending lists load
    assert grid.model_validate(_with(data, path, [2, 5])) is not None
    name = ".".join(path)
    for bad in ([5, 2], [3, 3], [2, 5, 3]):
        with pytest.raises(ValidationError, match=rf"{name} must be strictly ascending without repeats"):
            grid.model_validate(_with(data, path, bad))


def test_model_heads_take_as_many_kv_heads_as_query_heads_but_not_more():
    """ModelHeads._kv_divides: kv_heads == num_heads (MHA) loads; more kv heads than query heads do not."""
    base = {"model": "x", "head_dim": 64, "tp_sizes": [1]}
    assert ModelHeads.model_validate({**base, "num_heads": 8, "kv_heads": 8}).kv_heads == 8
    assert ModelHeads.model_validate({**base, "num_heads": 8, "kv_heads": 1}).window_size == [0]
    with pytest.raises(ValidationError, match="kv_heads 16 must divide num_heads 8"):
        ModelHeads.model_validate({**base, "num_heads": 8, "kv_heads": 16})


def test_grid_integer_bounds_and_defaults():
    """PosInt > 0, NonNegInt >= 0, GpuCount >= 2 (strict ints), and the defaults the generation grids document."""
    assert HeadSweep.model_validate({"num_heads": [8], "kv_heads": [0], "head_dim": [64]}).window_size == [0]
    with pytest.raises(ValidationError):
        HeadSweep.model_validate({"num_heads": [0], "kv_heads": [0], "head_dim": [64]})
    with pytest.raises(ValidationError):
        HeadSweep.model_validate({"num_heads": ["8"], "kv_heads": [0], "head_dim": [64]})
    assert CustomAllreduceGrid.model_validate({**ALLREDUCE, "num_gpus": [2]}).num_gpus == [2]
    with pytest.raises(ValidationError):
        CustomAllreduceGrid.model_validate({**ALLREDUCE, "num_gpus": [1, 2]})
    with pytest.raises(ValidationError, match="extra"):
        CustomAllreduceGrid.model_validate({**ALLREDUCE, "note": "x"})
    generation = GenerationAttentionGrid.model_validate(
        {
            "precisions": [{"attn_dtype": "bfloat16", "kv_cache_dtype": "bfloat16"}],
            "batch_size": [1],
            "heads": [{"num_heads": [8], "kv_heads": [0], "head_dim": [64]}],
            "max_tokens_mha": 8,
            "max_tokens_gqa": 8,
            "model_tp_sizes": [1],
            "step": [1],
        }
    )
    assert (generation.cap_rules, generation.min_batch_sizes_per_step) == (["tokens"], 1)
    assert generation.drop_longest_step_from_batch is None and generation.model_heads == []
    sweep = grids_sparse.GenerationSweep.model_validate({**SPARSE, "step": [4]})
    assert (sweep.cap_counts_new_token, sweep.more_models, sweep.tp_sizes, sweep.gemm_types) == (
        False,
        False,
        None,
        None,
    )
    assert (sweep.batch_one_steps, sweep.step_ceilings, sweep.skip_indexer_models, sweep.long) == ([], [], [], None)
    assert grids_linear.GdnGrid.model_validate(GDN).more_models is False


def test_message_sizes_per_dtype_and_bmm_token_lists():
    """CommGrid: one size list per dtype, none missing or extra; MlaBmmGrid: an op_name's token list is not empty."""
    both = {**COMM, "dtypes": ["half", "int8"], "message_size": {"half": [1], "int8": [2]}}
    assert set(CommGrid.model_validate(both).message_size) == {"half", "int8"}
    with pytest.raises(
        ValidationError, match=r"message_size lists sizes for \['half', 'int8'\], dtypes are \['half'\]"
    ):
        CommGrid.model_validate({**both, "dtypes": ["half"]})
    with pytest.raises(ValidationError, match=r"num_tokens\.mla_gen_post is empty"):
        MlaBmmGrid.model_validate({**BMM, "num_tokens": {"mla_gen_pre": [1], "mla_gen_post": []}})


def test_by_sm_additions_grow_only_the_named_sms_and_leave_the_grid_whole():
    """OpFile._fold_additions, grid_for, additions_for: each named SM gets the grid plus every entry's values."""
    data = {
        "schema_version": 1,
        "op": "gemm",
        "grid": GEMM,
        "narrowed": {"cpu": {**GEMM, "m": [1]}},
        "by_sm": [
            {"sms": ["100", "103"], "why": "a", "add": {"dtypes": ["nvfp4"]}},
            {"sms": ["100"], "why": "b", "add": {"dtypes": ["fp8_block"], "m": [4]}},
        ],
    }
    loaded = OpFile[GemmGrid].model_validate(data)
    assert loaded.grid.dtypes == ["bfloat16"] and loaded.grid.m == [1, 2]
    assert loaded.grid_for("90") is loaded.grid and loaded.grid_for("cpu").m == [1]
    assert loaded.grid_for("100").dtypes == ["bfloat16", "nvfp4", "fp8_block"] and loaded.grid_for("100").m == [1, 2, 4]
    assert loaded.grid_for("103").dtypes == ["bfloat16", "nvfp4"] and loaded.grid_for("103").m == [1, 2]
    assert [e.why for e in loaded.additions_for("100")] == ["a", "b"]
    assert [e.why for e in loaded.additions_for("103")] == ["a"] and loaded.additions_for("90") == []
    assert GEMM["dtypes"] == ["bfloat16"]  # the input dict is not grown either


def test_dsv4_sweeps_need_shapes_and_each_op_its_own_kind():
    """Dsv4Sweep._some_shapes and _only: context grids take context shapes only, generation grids decode only."""
    context = {**DSV4_SWEEP, "context": CONTEXT_SHAPES}
    decode = {**DSV4_SWEEP, "decode": DECODE_SHAPES}
    both = {**context, "decode": DECODE_SHAPES}
    with pytest.raises(ValidationError, match="a sweep needs context or decode shapes"):
        grids_dsv4.Dsv4Sweep.model_validate(DSV4_SWEEP)
    assert grids_dsv4.Dsv4ContextGrid.model_validate({"sweeps": [context]}).models is None
    assert grids_dsv4.Dsv4GenerationGrid.model_validate({"sweeps": [decode, decode]}).sweeps[1].context is None
    for grid, bad, wanted in (
        (grids_dsv4.Dsv4ContextGrid, [context, decode], "context"),
        (grids_dsv4.Dsv4ContextGrid, [context, both], "context"),
        (grids_dsv4.Dsv4GenerationGrid, [decode, context], "decode"),
        (grids_dsv4.Dsv4GenerationGrid, [decode, both], "decode"),
    ):
        with pytest.raises(ValidationError, match=rf"sweeps\.1: this op's sweeps have {wanted} shapes only"):
            grid.model_validate({"sweeps": bad})
    assert len(grids_dsv4.Dsv4KernelGrid.model_validate({"sweeps": [both, context, decode]}).sweeps) == 3


def _kernel_sweep(backends: list[str]) -> dict:
    return {
        "backends": backends,
        "model": {"model": "m", "profile": "p"},
        "labels": {"mla_dtype": "bfloat16", "kv_cache_dtype": "bfloat16", "gemm_type": "bfloat16"},
        "batch_size": [1],
        "isl": [4],
        "prefix": [0],
        "max_tokens": 8,
        "max_kv_tokens": 8,
        "step": [4],
        "max_decode_tokens": 8,
    }


def test_every_sparse_grid_gives_each_backend_one_sweep():
    """_one_sweep_per_backend in ContextModuleGrid, GenerationModuleGrid and KernelGrid, naming both sweeps."""
    context = {**SPARSE, "isl": [4], "prefix": [0]}
    generation = {**SPARSE, "step": [4]}
    for grid, sweep in (
        (grids_sparse.ContextModuleGrid, lambda b: {**context, "backends": b}),
        (grids_sparse.GenerationModuleGrid, lambda b: {**generation, "backends": b}),
        (grids_sparse.KernelGrid, _kernel_sweep),
    ):
        ok = [sweep(["sglang"]), sweep(["vllm", "trtllm"])]
        assert len(grid.model_validate({"sweeps": ok}).sweeps) == 2
        with pytest.raises(ValidationError, match="backend vllm is in sweeps 1 and 2; give each backend one sweep"):
            grid.model_validate({"sweeps": [*ok, sweep(["vllm"])]})


def test_a_linear_model_names_its_profile_or_its_shape_not_both():
    """_Model._profile_or_shape: exactly one of profile and shape."""
    model = grids_linear.GdnModel
    assert model.model_validate({"model": "a", "profile": "p", "tp_sizes": [1]}).shape is None
    assert model.model_validate({"model": "a", "shape": GDN_SHAPE, "tp_sizes": [1]}).profile is None
    for bad in ({"profile": "p", "shape": GDN_SHAPE}, {}):
        with pytest.raises(ValidationError, match="model 'a': give its profile or its shape, one of the two"):
            model.model_validate({"model": "a", "tp_sizes": [1], **bad})


def test_the_grid_types_registered_for_the_sparse_dsv4_and_linear_ops():
    """SPARSE_GRID_TYPES, DSV4_GRID_TYPES and LINEAR_GRID_TYPES: each op's file loads as its phase's grid."""
    sparse, dsv4, linear = grids_sparse, grids_dsv4, grids_linear
    expected = {
        **dict.fromkeys(("dsa_context_module", "msa_context_module"), sparse.ContextModuleGrid),
        **dict.fromkeys(("dsa_generation_module", "msa_generation_module"), sparse.GenerationModuleGrid),
        **dict.fromkeys(("glm5_mqa_logits_module", "glm5_topk_module", "glm5_dsa_attn_module"), sparse.KernelGrid),
        **dict.fromkeys(("dsv4_csa_context_module", "dsv4_hca_context_module"), dsv4.Dsv4ContextGrid),
        **dict.fromkeys(("dsv4_csa_generation_module", "dsv4_hca_generation_module"), dsv4.Dsv4GenerationGrid),
        **dict.fromkeys(("dsv4_paged_mqa_logits_module", "dsv4_hca_attn_module"), dsv4.Dsv4KernelGrid),
        "dsv4_csa_topk_calib": dsv4.Dsv4TopkGrid,
        "mhc": dsv4.MhcGrid,
        "gdn": linear.GdnGrid,
        "mamba2": linear.Mamba2Grid,
    }
    assert {op: GRID_TYPES[op] for op in expected} == expected


# ---- images/: references, sources out of an image, container settings, build log ---------------------------------
def test_moe_work_counts_token_rows_by_the_local_experts_and_two_matrices_for_relu2_experts():
    """moe.work: tokens with a pair here are pairs / min(topk, local experts); NemotronH's experts hold 2 matrices."""
    # top-8 of 64 experts at EP 16 (4 per rank): pairs 1024*8/16 = 512 over ceil(512/1024) = 1 expert, one expert
    # 3*4096*1024 = 12,582,912 weights; rows ceil(512/4) = 128 tokens: 12,582,912*2 + 128*4096*(2+2) = 27,262,976 B
    w = moe.work(moe.MoeCase("bfloat16", 1024, 4096, 1024, 8, 64, 1, 16, "balanced"))
    assert w.flops == {"bfloat16": 2.0 * 512 * 12_582_912} and w.bytes == 27_262_976
    # NemotronH (hidden 2688, inter 1856, top-6 of 128): 6 tokens -> 36 pairs over 6 experts of 2*2688*1856 weights
    nemotron = moe.work(moe.MoeCase("bfloat16", 6, 2688, 1856, 6, 128, 1, 1, "balanced"))
    assert nemotron.flops == {"bfloat16": 2.0 * 36 * 9_977_856}
    assert nemotron.bytes == 6 * 9_977_856 * 2 + 6 * 2688 * 4


def test_moe_and_attention_plan_costs_by_hand():
    """moe._cost, attention._context_cost and _generation_cost: the relative costs smoke plans and dealing rank by."""
    # 6 * 100 tokens * top-2 * 64 * (128 / tp 2) / EP 4 = 1,228,800, plus 3 * (8 / 4) experts * 64 * 64 = 24,576
    assert moe._cost(moe.MoeCase("bfloat16", 100, 64, 128, 2, 8, 2, 4, "balanced")) == 1_253_376
    ctx = AttentionCase(2, 100, 4, 1, 64, 1, "bfloat16", "bfloat16", 0, 0)
    assert attention._context_cost(ctx) == 4 * 2 * 100 * 100 * 4 * 64  # 20,480,000
    assert attention._context_cost(ctx._replace(window_size=30)) == 4 * 2 * 100 * 30 * 4 * 64
    assert attention._context_cost(ctx._replace(window_size=200)) == 20_480_000
    gen = AttentionCase(2, 1, 4, 1, 64, 1, "bfloat16", "bfloat16", 99, 0)
    assert attention._generation_cost(gen) == 4 * 2 * 100 * 1 * 64 + 2 * 100 * 4  # 52,000
    assert attention._generation_cost(gen._replace(window_size=30)) == 4 * 2 * 30 * 64 + 2 * 30 * 4
    assert attention._generation_cost(gen._replace(window_size=101)) == 52_000


def _context_grid(**more) -> ContextAttentionGrid:
    data = {
        "precisions": [{"attn_dtype": "bfloat16", "kv_cache_dtype": "bfloat16"}],
        "batch_size": [1, 2, 4],
        "isl": [2, 4, 8],
        "heads": [{"num_heads": [8], "kv_heads": [1, 8], "head_dim": [64]}],
        "max_tokens_mha": 8,
        "max_tokens_gqa": 16,
        "model_tp_sizes": [1],
    }
    return ContextAttentionGrid.model_validate({**data, **more})


def test_context_lengths_cap_mha_batches_and_kv_elements_strictly():
    """attention.context_lengths: max_batch_mha caps MHA batches only (inclusive); K+V elements stay below the cap."""
    capped = _context_grid(max_batch_mha=2)
    assert context_lengths(capped, 8, 8, 64) == [(1, 2), (1, 4), (1, 8), (2, 2), (2, 4)]
    gqa = [(1, 2), (1, 4), (1, 8), (2, 2), (2, 4), (2, 8), (4, 2), (4, 4)]
    assert context_lengths(capped, 8, 1, 64) == gqa
    # GQA, 1 kv head of 64: tokens * 64 * 2 < 1024 keeps fewer than 8 tokens
    assert context_lengths(_context_grid(max_kv_elements=1024), 8, 1, 64) == [(1, 2), (1, 4), (2, 2)]


def test_sglang_architecture_names_the_one_model_of_a_head_config():
    """attention._sglang_architecture: Gemma-4, Step-3.5, MiMo-V2-Flash and Qwen3.5 at TP 4/8; None elsewhere."""
    case = AttentionCase(1, 16, 8, 1, 128, 1, "bfloat16", "bfloat16", 0, 0)
    named = {
        (8, 1, 512, 0): "Gemma4ForConditionalGeneration",
        (8, 1, 256, 1024): "Gemma4ForConditionalGeneration",
        (8, 1, 128, 512): "Step3p5ForCausalLM",
        (8, 1, 192, 0): "MiMoV2FlashForCausalLM",
        (3, 1, 256, 0): "Qwen3_5ForConditionalGeneration",
        (6, 1, 256, 0): "Qwen3_5ForConditionalGeneration",
        (8, 1, 256, 0): None,
        (6, 2, 256, 0): None,
        (8, 1, 128, 0): None,
        (8, 1, 256, 512): None,
        (8, 1, 128, 1024): None,
    }
    for (heads, kv, head_dim, window), architecture in named.items():
        shape = case._replace(num_heads=heads, num_key_value_heads=kv, head_dim=head_dim, window_size=window)
        assert attention._sglang_architecture(shape) == architecture, (heads, kv, head_dim, window)


def test_smoke_keeps_four_cases_spread_over_the_cheaper_half():
    """planner._smoke: cost-ranked, the first ceil(n/2), picks j*(len-1)//(count-1); groups without a pick drop."""
    op = SimpleNamespace(case_type=GemmCase, cost=lambda c: c.m)

    def group(ms):
        return SimpleNamespace(values=[("float32", m, 1, 1) for m in ms], ids=[f"c{m:03d}" for m in ms])

    odd, even, dear = group([1, 3, 5, 7, 9]), group([2, 4, 6, 8]), group([100])
    picked = [_Picked(odd, "a", [0, 1, 2, 3, 4]), _Picked(even, "b", [0, 1, 2, 3]), _Picked(dear, "c", [0])]
    # 10 cases: the cheaper half is m 1..5, and 4 picks at ranks 0, 1, 2, 4 are m 1, 2, 3 and 5
    kept = _smoke(op, picked)
    assert [(p.group, p.dispatch, p.positions) for p in kept] == [(odd, "a", [0, 1, 2]), (even, "b", [0])]
    # 9 cases (m 9 left out): still m 1..5 as the half, so the same picks
    kept = _smoke(op, [_Picked(odd, "a", [0, 1, 2, 3]), _Picked(even, "b", [0, 1, 2, 3]), _Picked(dear, "c", [0])])
    assert [p.positions for p in kept] == [[0, 1, 2], [0]]
    # 3 cases (m 2, 4, 8): the half rounds up to 2 cases, both kept
    assert [p.positions for p in _smoke(op, [_Picked(even, "b", [0, 1, 3])])] == [[0, 1]]


def test_plan_options_refuse_unknown_ops_and_shards_outside_the_count():
    """PlanOptions.__post_init__: 0 <= index < count and count >= 1; ops are known ops."""
    assert PlanOptions(ops=("gemm",), shard=(0, 1)).shard == (0, 1)
    assert PlanOptions(shard=(2, 3)).shard == (2, 3)
    for shard in ((1, 1), (-1, 2), (0, 0), (3, 2)):
        with pytest.raises(InputError, match=rf"--shard {shard[0]}/{shard[1]}: need 0 <= i < N"):
            PlanOptions(shard=shard)
    with pytest.raises(InputError, match="--ops: unknown op 'conv'; known: gemm, "):
        PlanOptions(ops=("gemm", "conv", "nope"))


# ---- cli/: argument checks before any work ----------------------------------------------------------------------
