"""Model profiles and Hugging Face config.json files add their per-rank shapes to the sweeps."""

from __future__ import annotations

import csv
import json

import pytest
from conftest import cases_of, llama_config, run_cli

from opcollect.cases.profiles import derive_shapes, read_hf_config
from opcollect.errors import InputError
from opcollect.plans.planner import Planner, PlanOptions
from opcollect.project import find_project

# Llama-3.1-70B, public config.json values
LLAMA_70B = {
    "architectures": ["LlamaForCausalLM"],
    "_name_or_path": "meta-llama/Llama-3.1-70B",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "num_hidden_layers": 80,
    "vocab_size": 128256,
    "rope_theta": 500000.0,
    "torch_dtype": "bfloat16",
}


def llama70b_pairs() -> set[tuple[int, int]]:
    """qkv, o, gate_up, down, lm_head (n, k) per rank at TP 1, 2, 4, 8, from the public shape rules."""
    pairs = set()
    for tp in (1, 2, 4, 8):
        q, kv = 64 // tp, max(8 // tp, 1)
        pairs |= {((q + 2 * kv) * 128, 8192), (8192, q * 128), (2 * 28672 // tp, 8192), (8192, 28672 // tp)}
        pairs.add((128256 // tp, 8192))
    return pairs


def _gemm_pairs(table_dir) -> set[tuple[int, int]]:
    with open(table_dir / "gemm.csv") as handle:
        return {(int(r["n"]), int(r["k"])) for r in csv.DictReader(handle)}


def test_llama70b_config_adds_its_shapes_only_when_given(tree_copy, tmp_path):
    (tree_copy / "cases" / "models" / "LlamaForCausalLM.yaml").unlink()  # no profile brings these shapes
    (tree_copy / "cases" / "models" / "NemotronHForCausalLM.yaml").unlink()  # its 64 heads at tp 8: qkv 1280 x 8192
    config = tmp_path / "Llama-3.1-70B" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(LLAMA_70B))
    common = ["plan", "--root", str(tree_copy), "--backend", "vllm", "--sm", "90", "--ops", "gemm"]
    without, with_config = tmp_path / "without", tmp_path / "with"
    assert run_cli(*common, "--table", str(without)).returncode == 0
    done = run_cli(*common, "--model-config", str(config), "--table", str(with_config))
    assert done.returncode == 0, done.stderr
    expected = llama70b_pairs()
    assert len(expected) == 20
    base, extended = _gemm_pairs(without), _gemm_pairs(with_config)
    assert expected <= extended
    lacking = expected - base
    assert {(57344, 8192), (8192, 28672), (1280, 8192)} <= lacking  # not on the base feature grid
    assert extended - base == lacking  # the config adds exactly the shapes nothing else brings


def test_config_and_profile_give_the_same_shapes(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA_70B))
    from_config = read_hf_config(config)
    planner = Planner(find_project())
    from_profile = next(m for m in planner.sources.models if m.name == "Llama-3.1-70B")
    assert derive_shapes(from_config, [1, 2, 4, 8]) == derive_shapes(from_profile, [1, 2, 4, 8])
    assert {tuple(s) for s in derive_shapes(from_config, [1, 2, 4, 8]).gemm} == llama70b_pairs()


def test_unknown_architecture_with_standard_keys_is_planned(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**LLAMA_70B, "architectures": ["MambaForCausalLM"]}))
    spec = read_hf_config(config)
    assert spec.notes == (
        "meta-llama/Llama-3.1-70B: unknown architecture MambaForCausalLM, planned from its standard config.json keys",
    )
    assert {tuple(s) for s in derive_shapes(spec, [1, 2, 4, 8]).gemm} == llama70b_pairs()


def test_unknown_architecture_without_standard_keys_lists_the_known(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"architectures": ["MambaForCausalLM"], "hidden_size": 768}))
    with pytest.raises(
        InputError, match=r"unknown architecture 'MambaForCausalLM' and no key 'num_attention_heads'.*LlamaForCausalLM"
    ):
        read_hf_config(config)


def test_qwen2_is_no_longer_refused(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**LLAMA_70B, "architectures": ["Qwen2ForCausalLM"]}))
    spec = read_hf_config(config)
    assert spec.architecture == "Qwen2ForCausalLM" and spec.notes == ()


def test_missing_key_is_named(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({k: v for k, v in LLAMA_70B.items() if k != "intermediate_size"}))
    done = run_cli("plan", "--model-config", str(config))
    assert done.returncode == 2
    assert "missing key 'intermediate_size' required for LlamaForCausalLM" in done.stderr
    assert str(config) in done.stderr


def test_every_profile_shape_is_in_the_sweeps(planner):
    """Each model's per-rank GEMM, attention, MoE, MLA and vision-tower shapes appear among the planned cases."""
    plan = planner.plan("trtllm", "100")
    gemm = {(v[2], v[3]) for v in plan.ops["gemm"].values}
    heads = {
        (c.num_heads, c.num_key_value_heads, c.head_dim, c.window_size) for c in cases_of(plan.ops["attention_context"])
    }
    moe = {(c.hidden_size, c.inter_size, c.topk, c.num_experts) for c in cases_of(plan.ops["moe"])}
    mla = {c.num_heads for c in cases_of(plan.ops["mla_generation"])}  # heads per rank
    encoder = {(c.num_heads, c.head_dim) for c in cases_of(plan.ops["encoder_attention"])}  # vision towers per rank
    for spec in planner.sources.models:
        shapes = derive_shapes(spec, [1, 2, 4, 8])
        assert {tuple(s) for s in shapes.encoder} <= encoder, spec.name
        assert {tuple(s) for s in shapes.gemm} <= gemm, spec.name
        assert {tuple(s) for s in shapes.attention} <= heads, spec.name
        assert {tuple(s) for s in shapes.moe} <= moe, spec.name
        assert {s.num_heads // tp for s in shapes.mla for tp in (1, 2, 4, 8)} <= mla, spec.name


def test_moe_splits_follow_the_rules(planner):
    # TensorRT-LLM runs combined TP x EP splits; vLLM runs TP-only or EP-only ones (skips.py)
    plan = planner.plan("trtllm", "90", PlanOptions(ops=("moe",)))
    seen = set()
    for c in cases_of(plan.ops["moe"]):
        assert c.moe_ep_size <= c.num_experts and c.num_experts % c.moe_ep_size == 0
        assert c.inter_size % c.moe_tp_size == 0
        seen.add((c.num_experts, c.moe_tp_size, c.moe_ep_size))
    assert (256, 1, 8) in seen and (256, 8, 1) in seen and (8, 8, 8) in seen  # DeepSeek-V3 and Mixtral
    assert not any(experts == 8 and ep == 16 for experts, _, ep in seen)  # 8 experts cannot spread over 16


def test_qkv_replicates_kv_heads_beyond_their_count(planner):
    spec = next(m for m in planner.sources.models if m.name == "Qwen3-235B-A22B")  # 4 kv heads
    shapes = derive_shapes(spec, [8])
    assert (64 // 8, 1, 128, 0) in {tuple(h) for h in shapes.attention}
    assert ((8 + 2 * 1) * 128, 4096) in {tuple(g) for g in shapes.gemm}


_spec = llama_config


def test_lm_head_rows_per_rank_are_padded_up_on_an_uneven_vocabulary_split(tmp_path):
    shapes = derive_shapes(_spec(tmp_path, vocab_size=1001), [1, 2, 4, 8])
    lm_head = {n for n, k in shapes.gemm if k == 1024 and n in (1001, 501, 251, 126)}
    assert lm_head == {1001, 501, 251, 126}  # ceil(1001 / tp): 500.5 -> 501, 250.25 -> 251, 125.125 -> 126


@pytest.mark.parametrize(
    "max_window_layers, windows",
    [(24, {0}), (30, {0}), (0, {512}), (12, {0, 512})],
    ids=["equal-to-the-layers", "beyond-the-layers", "none-full", "half"],
)
def test_qwen2_max_window_layers_decides_the_windows(tmp_path, max_window_layers, windows):
    spec = _spec(
        tmp_path,
        architectures=["Qwen2ForCausalLM"],
        num_hidden_layers=24,
        sliding_window=512,
        use_sliding_window=True,
        max_window_layers=max_window_layers,
    )
    assert {shape.window_size for shape in derive_shapes(spec, [1]).attention} == windows


@pytest.mark.parametrize(("flag", "windows"), [({}, {4096}), ({"use_sliding_window": True}, {4096}),
                                              ({"use_sliding_window": False}, {0})])  # fmt: skip
def test_a_sliding_window_applies_unless_the_config_turns_it_off(tmp_path, flag, windows):
    """Mistral's config gives sliding_window with no use_sliding_window key: every layer slides."""
    spec = _spec(tmp_path, architectures=["MistralForCausalLM"], sliding_window=4096, **flag)
    assert {shape.window_size for shape in derive_shapes(spec, [1]).attention} == windows


def test_zero_experts_per_token_is_named_not_called_missing(tmp_path):
    with pytest.raises(InputError) as raised:
        _spec(tmp_path, num_local_experts=8, num_experts_per_tok=0)
    assert "field 'num_experts_per_tok': 0 routes a token to no expert" in str(raised.value)
    assert "missing" not in str(raised.value)
    with pytest.raises(InputError, match="missing key 'num_experts_per_tok'"):
        _spec(tmp_path, num_local_experts=8)


def test_a_token_may_take_every_expert_but_not_more(tmp_path):
    every = derive_shapes(_spec(tmp_path, num_local_experts=8, num_experts_per_tok=8), [1])
    assert {(shape.topk, shape.num_experts) for shape in every.moe} == {(8, 8)}
    with pytest.raises(InputError) as raised:
        _spec(tmp_path, num_local_experts=8, num_experts_per_tok=9)
    message = "field 'num_experts_per_tok': 9 is greater than num_local_experts 8; set it to at most 8"
    assert message in str(raised.value)


@pytest.mark.parametrize("value", [10**400, 1.5, True, -1])  # past 2**40: the test below
def test_model_config_sizes_are_bounded_ints(tmp_path, value):
    with pytest.raises(InputError, match="hidden_size"):
        _spec(tmp_path, hidden_size=value)


def test_a_model_size_past_2_40_is_refused_for_its_size(tmp_path):
    """2**40 + 8 splits evenly over 8 heads, so only the size bound can refuse it."""
    with pytest.raises(InputError, match=r"'hidden_size': Input should be less than or equal to 1099511627776"):
        _spec(tmp_path, hidden_size=2**40 + 8)
