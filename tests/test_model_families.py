"""Hugging Face config.json files of every supported family plan their exact per-rank shapes.

The configs under tests/data/configs hold public Hugging Face config values (only the keys that matter).
Each test writes the expected shapes by hand from those values: q heads split by tp; kv heads split,
or replicated once there are more ranks than kv heads; qkv n = (q + 2 kv) x head_dim, k = hidden;
o n = hidden, k = q x head_dim; gate_up n = 2 inter / tp, k = hidden; down n = hidden, k = inter / tp;
router n = experts; lm_head n = vocab / tp, k = hidden.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import cases_of, run_cli

from opcollect.cases.profiles import GemmShape as G
from opcollect.cases.profiles import HeadShape as H
from opcollect.cases.profiles import MlaShape, ModelShapes, derive_shapes, parse_config, read_hf_config
from opcollect.cases.profiles import MoeShape as M
from opcollect.errors import InputError
from opcollect.plans.planner import Planner, PlanOptions
from opcollect.project import find_project

CONFIGS = Path(__file__).resolve().parent / "data" / "configs"
TPS = (1, 2, 4, 8)


def shapes(name: str, tp: int) -> ModelShapes:
    return derive_shapes(read_hf_config(CONFIGS / f"{name}.json"), [tp])


def kv_per_rank(kv: int, tp: int) -> int:
    return kv // tp if kv >= tp else 1


@pytest.mark.parametrize("tp", TPS)
def test_llama(tp):
    s = shapes("Llama-3.1-8B", tp)  # no head_dim key: 4096 / 32 = 128
    q, kv = 32 // tp, kv_per_rank(8, tp)
    assert s.gemm == {
        G((q + 2 * kv) * 128, 4096),
        G(4096, q * 128),
        G(2 * 14336 // tp, 4096),
        G(4096, 14336 // tp),
        G(128256 // tp, 4096),
    }
    assert s.attention == {H(q, kv, 128, 0)}
    assert not s.moe and not s.mla and not s.left_out


@pytest.mark.parametrize("tp", TPS)
def test_mistral_slides_on_every_layer(tp):
    s = shapes("Mistral-7B-v0.1", tp)
    q, kv = 32 // tp, kv_per_rank(8, tp)
    assert s.gemm == {
        G((q + 2 * kv) * 128, 4096),
        G(4096, q * 128),
        G(2 * 14336 // tp, 4096),
        G(4096, 14336 // tp),
        G(32000 // tp, 4096),
    }
    assert s.attention == {H(q, kv, 128, 4096)}
    assert not s.moe and not s.mla


@pytest.mark.parametrize("tp", TPS)
def test_mixtral(tp):
    s = shapes("Mixtral-8x7B-v0.1", tp)  # experts of intermediate_size; sliding_window null
    q, kv = 32 // tp, kv_per_rank(8, tp)
    assert s.gemm == {
        G((q + 2 * kv) * 128, 4096),
        G(4096, q * 128),
        G(8, 4096),  # router
        G(2 * 14336 // tp, 4096),
        G(4096, 14336 // tp),
        G(32000 // tp, 4096),
    }
    assert s.attention == {H(q, kv, 128, 0)}
    assert s.moe == {M(4096, 14336, 2, 8)}
    assert not s.mla


@pytest.mark.parametrize("tp", TPS)
def test_qwen2_dense_is_planned(tp):
    s = shapes("Qwen2.5-72B-Instruct", tp)  # sliding_window 131072 with use_sliding_window false: full
    q, kv = 64 // tp, kv_per_rank(8, tp)
    assert s.gemm == {
        G((q + 2 * kv) * 128, 8192),
        G(8192, q * 128),
        G(2 * 29568 // tp, 8192),
        G(8192, 29568 // tp),
        G(152064 // tp, 8192),
    }
    assert s.attention == {H(q, kv, 128, 0)}
    assert not s.moe and not s.mla


@pytest.mark.parametrize("tp", TPS)
def test_qwen2_moe_has_a_shared_expert(tp):
    s = shapes("Qwen1.5-MoE-A2.7B", tp)
    q = kv = 16 // tp  # MHA: 16 heads, 16 kv heads
    assert s.gemm == {
        G((q + 2 * kv) * 128, 2048),
        G(2048, q * 128),
        G(60, 2048),  # router
        G(2 * 1408 // tp, 2048),  # routed expert
        G(2048, 1408 // tp),
        G(2 * 5632 // tp, 2048),  # shared expert
        G(2048, 5632 // tp),
        G(151936 // tp, 2048),
    }
    assert s.attention == {H(q, kv, 128, 0)}
    assert s.moe == {M(2048, 1408, 4, 60)}


@pytest.mark.parametrize("tp", TPS)
def test_qwen3(tp):
    s = shapes("Qwen3-8B", tp)
    q, kv = 32 // tp, kv_per_rank(8, tp)
    assert s.gemm == {
        G((q + 2 * kv) * 128, 4096),
        G(4096, q * 128),
        G(2 * 12288 // tp, 4096),
        G(4096, 12288 // tp),
        G(151936 // tp, 4096),
    }
    assert s.attention == {H(q, kv, 128, 0)}
    assert not s.moe and not s.mla


@pytest.mark.parametrize("tp", TPS)
def test_qwen3_moe_has_no_dense_layer(tp):
    s = shapes("Qwen3-30B-A3B", tp)  # intermediate_size 6144 is unused: every layer is a MoE layer
    q, kv = 32 // tp, kv_per_rank(4, tp)
    assert s.gemm == {
        G((q + 2 * kv) * 128, 2048),
        G(2048, q * 128),
        G(128, 2048),
        G(2 * 768 // tp, 2048),
        G(2048, 768 // tp),
        G(151936 // tp, 2048),
    }
    assert s.attention == {H(q, kv, 128, 0)}
    assert s.moe == {M(2048, 768, 8, 128)}


@pytest.mark.parametrize("tp", TPS)
def test_gemma2_alternates_sliding_and_full_layers(tp):
    s = shapes("gemma-2-9b", tp)  # head_dim 256: q x head_dim is not hidden
    q, kv = 16 // tp, kv_per_rank(8, tp)
    assert s.gemm == {
        G((q + 2 * kv) * 256, 3584),
        G(3584, q * 256),
        G(2 * 14336 // tp, 3584),
        G(3584, 14336 // tp),
        G(256000 // tp, 3584),
    }
    assert s.attention == {H(q, kv, 256, 0), H(q, kv, 256, 4096)}
    assert not s.moe and not s.mla


@pytest.mark.parametrize("tp", TPS)
def test_gemma3_reads_its_text_config(tp):
    s = shapes("gemma-3-27b-it", tp)  # five sliding layers (window 1024), then one full layer
    q, kv = 32 // tp, kv_per_rank(16, tp)
    assert s.gemm == {
        G((q + 2 * kv) * 128, 5376),
        G(5376, q * 128),
        G(2 * 21504 // tp, 5376),
        G(5376, 21504 // tp),
        G(262208 // tp, 5376),
    }
    assert s.attention == {H(q, kv, 128, 0), H(q, kv, 128, 1024)}
    assert not s.moe and not s.mla


@pytest.mark.parametrize("tp", TPS)
def test_phi3_fused_projections_are_the_same_math(tp):
    s = shapes("Phi-3-mini-4k-instruct", tp)  # head_dim 3072 / 32 = 96; sliding_window 2047 on every layer
    q = kv = 32 // tp
    assert s.gemm == {
        G((q + 2 * kv) * 96, 3072),
        G(3072, q * 96),
        G(2 * 8192 // tp, 3072),
        G(3072, 8192 // tp),
        G(32064 // tp, 3072),
    }
    assert s.attention == {H(q, kv, 96, 2047)}


@pytest.mark.parametrize("tp", TPS)
def test_deepseek_v2_lite_projects_q_from_hidden(tp):
    s = shapes("DeepSeek-V2-Lite", tp)  # q_lora_rank null; 1 dense layer; 64 routed + 2 shared experts
    q = 16 // tp
    assert s.gemm == {
        G(q * (128 + 64), 2048),  # q
        G(512 + 64, 2048),  # kv_a, replicated
        G(q * (128 + 128), 512),  # kv_b
        G(2048, q * 128),  # o
        G(2 * 10944 // tp, 2048),  # dense layer
        G(2048, 10944 // tp),
        G(64, 2048),  # router
        G(2 * 1408 // tp, 2048),  # routed expert
        G(2048, 1408 // tp),
        G(2 * (2 * 1408) // tp, 2048),  # the 2 shared experts as one MLP
        G(2048, 2 * 1408 // tp),
        G(102400 // tp, 2048),
    }
    assert not s.attention
    assert s.mla == {MlaShape(16)}
    assert s.moe == {M(2048, 1408, 6, 64)}


@pytest.mark.parametrize("tp", TPS)
def test_deepseek_v3(tp):
    s = shapes("DeepSeek-V3", tp)
    q = 128 // tp
    assert s.gemm == {
        G(1536 + 512 + 64, 7168),  # fused q_a / kv_a, replicated
        G(q * (128 + 64), 1536),  # q_b
        G(q * (128 + 128), 512),  # kv_b
        G(7168, q * 128),  # o
        G(2 * 18432 // tp, 7168),  # first 3 dense layers
        G(7168, 18432 // tp),
        G(256, 7168),
        G(2 * 2048 // tp, 7168),  # routed expert, and the one shared expert of the same size
        G(7168, 2048 // tp),
        G(129280 // tp, 7168),
    }
    assert not s.attention
    assert s.mla == {MlaShape(128)}
    assert s.moe == {M(7168, 2048, 8, 256)}


@pytest.mark.parametrize("tp", TPS)
def test_glm4_moe(tp):
    s = shapes("GLM-4.5-Air", tp)  # GQA with head_dim 128 (96 x 128 != 4096); first layer dense
    q, kv = 96 // tp, kv_per_rank(8, tp)
    assert s.gemm == {
        G((q + 2 * kv) * 128, 4096),
        G(4096, q * 128),
        G(2 * 10944 // tp, 4096),
        G(4096, 10944 // tp),
        G(128, 4096),
        G(2 * 1408 // tp, 4096),  # routed and the one shared expert
        G(4096, 1408 // tp),
        G(151552 // tp, 4096),
    }
    assert s.attention == {H(q, kv, 128, 0)}
    assert s.moe == {M(4096, 1408, 8, 128)}
    assert not s.mla


@pytest.mark.parametrize("tp", TPS)
def test_gpt_oss_layer_types(tp):
    s = shapes("gpt-oss-20b", tp)
    q, kv = 64 // tp, kv_per_rank(8, tp)
    assert s.gemm == {
        G((q + 2 * kv) * 64, 2880),
        G(2880, q * 64),
        G(32, 2880),
        G(2 * 2880 // tp, 2880),
        G(2880, 2880 // tp),
        G(201088 // tp, 2880),
    }
    assert s.attention == {H(q, kv, 64, 0), H(q, kv, 64, 128)}
    assert s.moe == {M(2880, 2880, 4, 32)}


def test_every_family_loads_known_and_lands_in_the_sweeps():
    """All configs at once: distinct names, no unknown-architecture note, every shape planned."""
    paths = sorted(CONFIGS.glob("*.json"))
    assert len(paths) == 16
    planner = Planner(find_project(), tuple(paths))
    given = [m for m in planner.sources.models if m.source.endswith(".json")]
    assert len({m.name for m in given}) == len(paths)
    ops = ("gemm", "attention_context", "moe", "mla_generation", "encoder_attention")
    plan = planner.plan("sglang", "90", PlanOptions(ops=ops))  # the kernel MLA table: vLLM times the module
    assert not any("unknown architecture" in note for note in plan.notes)
    assert "google/gemma-3-27b-it: Gemma3ForConditionalGeneration is planned from its text_config" in " ".join(
        plan.notes
    )
    gemm = {(v[2], v[3]) for v in plan.ops["gemm"].values}
    heads = {
        (c.num_heads, c.num_key_value_heads, c.head_dim, c.window_size) for c in cases_of(plan.ops["attention_context"])
    }
    moe = {(c.hidden_size, c.inter_size, c.topk, c.num_experts) for c in cases_of(plan.ops["moe"])}
    mla = {c.num_heads for c in cases_of(plan.ops["mla_generation"])}  # heads per rank
    encoder = {(c.num_heads, c.head_dim) for c in cases_of(plan.ops["encoder_attention"])}  # vision towers
    for spec in given:
        s = derive_shapes(spec, list(TPS))
        assert {tuple(x) for x in s.gemm} <= gemm, spec.name
        assert {tuple(x) for x in s.attention} <= heads, spec.name
        assert {tuple(x) for x in s.moe} <= moe, spec.name
        assert {x.num_heads // tp for x in s.mla for tp in TPS} <= mla, spec.name
        assert {tuple(x) for x in s.encoder} <= encoder, spec.name
    assert any(derive_shapes(spec, list(TPS)).encoder for spec in given)  # the VL configs bring vision heads


def _write(path: Path, config: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config))
    return path


LLAMA_KEYS = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336}


def test_unknown_architecture_is_planned_with_a_note(tmp_path):
    config = _write(
        tmp_path / "foo.json", {"architectures": ["FooForCausalLM"], "_name_or_path": "acme/foo", **LLAMA_KEYS}
    )
    done = run_cli("plan", "--backend", "vllm", "--sm", "90", "--ops", "gemm", "--json", "--model-config", str(config))
    assert done.returncode == 0, done.stderr
    notes = json.loads(done.stdout)["notes"]
    assert "acme/foo: unknown architecture FooForCausalLM, planned from its standard config.json keys" in notes
    s = derive_shapes(read_hf_config(config), [8])
    assert s.gemm == {G((4 + 2 * 1) * 128, 4096), G(4096, 4 * 128), G(2 * 14336 // 8, 4096), G(4096, 14336 // 8)}


def test_a_tp_that_does_not_divide_the_heads_is_left_out_with_its_reason():
    config = CONFIGS / "Qwen2.5-7B-Instruct.json"  # 28 heads: tp 8 does not divide them
    common = ("plan", "--backend", "vllm", "--sm", "90", "--json", "--model-config", str(config))
    done = run_cli(*common, "--ops", "gemm,attention_context")
    assert done.returncode == 0, done.stderr
    reason = (
        "Qwen/Qwen2.5-7B-Instruct: tp 8 does not divide 28 heads; its attention and qkv/o GEMM shapes at tp 8 are "
        "left out"
    )
    assert reason in json.loads(done.stdout)["notes"]
    s = derive_shapes(read_hf_config(config), [4, 8])
    assert s.attention == {H(7, 1, 128, 0)}  # tp 4 only
    assert G(3584, 7 * 128) in s.gemm and G(2 * 18944 // 8, 3584) in s.gemm  # the MLP still splits at tp 8
    only_moe = run_cli(*common, "--ops", "moe")  # MoE shapes do not depend on the heads
    assert only_moe.returncode == 0 and json.loads(only_moe.stdout)["notes"] == []


def test_uneven_kv_heads_and_intermediate_are_left_out():
    # 20 heads, 5 kv heads: tp 4 splits the heads but not the kv heads, tp 8 neither; 1004 splits by 4, not by 8
    data = {**LLAMA_KEYS, "num_attention_heads": 20, "num_key_value_heads": 5, "head_dim": 128}
    s = derive_shapes(parse_config("x", "LlamaForCausalLM", "m", {**data, "intermediate_size": 1004}), [4, 8])
    assert not s.attention
    assert s.notes_for("attention") == [
        "m: tp 4 does not split 5 kv heads evenly; its attention and qkv/o GEMM shapes at tp 4 are left out",
        "m: tp 8 does not divide 20 heads; its attention and qkv/o GEMM shapes at tp 8 are left out",
    ]
    assert (
        "m: tp 8 does not divide intermediate_size 1004; its dense MLP gate_up/down GEMM shapes at tp 8 are left out"
        in s.notes_for("gemm")
    )
    assert s.gemm == {G(2 * 1004 // 4, 4096), G(4096, 1004 // 4)}  # the MLP at tp 4 only


def test_configs_without_a_name_are_named_by_their_files(tmp_path):
    a = _write(tmp_path / "models" / "small.json", {"architectures": ["LlamaForCausalLM"], **LLAMA_KEYS})
    b = _write(tmp_path / "models" / "wide.json", {"architectures": ["LlamaForCausalLM"], **LLAMA_KEYS})
    c = _write(tmp_path / "My-Model" / "config.json", {"architectures": ["LlamaForCausalLM"], **LLAMA_KEYS})
    assert [read_hf_config(p).name for p in (a, b, c)] == ["small", "wide", "My-Model"]
    done = run_cli("plan", "--ops", "gemm", "--json", "--model-config", str(a), "--model-config", str(b))
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    "config, message",
    [
        ({**LLAMA_KEYS, "num_key_value_heads": 64}, "field 'num_key_value_heads': Value error, 64 is greater than"),
        ({**LLAMA_KEYS, "num_key_value_heads": 5}, "field 'num_key_value_heads': Value error, 5 does not divide"),
        (
            {**LLAMA_KEYS, "num_local_experts": 8, "num_experts_per_tok": 9},
            "field 'num_experts_per_tok': 9 is greater than num_local_experts 8",
        ),
        (
            {**LLAMA_KEYS, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64},
            "missing key 'v_head_dim' required for LlamaForCausalLM (multi-head latent attention",
        ),
        (
            {**LLAMA_KEYS, "n_routed_experts": 64, "num_experts_per_tok": 6, "moe_intermediate_size": 1408}
            | {"first_k_dense_replace": 1, "intermediate_size": None},
            "missing key 'intermediate_size' required for LlamaForCausalLM (the first 1 layers are dense)",
        ),
        ({**LLAMA_KEYS, "hidden_size": 4000, "num_attention_heads": 48, "num_key_value_heads": 8}, "'head_dim'"),
        (
            {"architectures": ["MambaForCausalLM"], "hidden_size": 768},
            "unknown architecture 'MambaForCausalLM' and no key 'num_attention_heads'",
        ),
        ({**LLAMA_KEYS, "layer_types": ["sliding_attention"]}, "missing key 'sliding_window'"),
    ],
    ids=["kv-above", "kv-not-dividing", "topk-above", "mla-key", "dense-key", "head-dim", "unknown", "window"],
)
def test_impossible_configs_are_one_line(tmp_path, config, message):
    path = _write(tmp_path / "config.json", {"architectures": ["LlamaForCausalLM"], **config})
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_hf_config(path)
    done = run_cli("plan", "--ops", "gemm", "--model-config", str(path))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and str(path) in done.stderr and "Traceback" not in done.stderr
