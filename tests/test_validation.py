"""Bad YAML input fails with the file, the field path and the expected type, and exit code 2."""

from __future__ import annotations

import pytest
import yaml
from conftest import run_cli

from opcollect.cases.sources import load_grids, load_profiles
from opcollect.cases.systems import load_systems
from opcollect.errors import InputError
from opcollect.images.pins import load_pins


def edit_yaml(path, change):
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data))


@pytest.mark.parametrize(
    "change, needle",
    [
        (
            lambda d: d["grid"].update(mm=d["grid"].pop("m")),
            "field 'grid.mm': unknown field; remove it or fix its spelling (did you mean 'm'?)",
        ),
        (lambda d: d["grid"].pop("k"), "field 'grid.k': missing required field"),
        (lambda d: d["grid"]["m"].__setitem__(3, "four"), "field 'grid.m.3': Input should be a valid integer"),
        (lambda d: d["grid"]["dtypes"].append("fp6"), "field 'grid.dtypes.6': Input should be 'float32'"),
        (lambda d: d.pop("schema_version"), "field 'schema_version': missing required field"),
        (lambda d: d["narrowed"]["cpu"].update(m=[64, 8]), "m must be strictly ascending"),
        (lambda d: d["narrowed"].update(sm75=d["narrowed"]["cpu"]), "field 'narrowed.sm75"),
    ],
)
def test_gemm_grid_errors_name_file_and_field(tree_copy, change, needle):
    path = tree_copy / "cases" / "base_ops" / "gemm.yaml"
    edit_yaml(path, change)
    with pytest.raises(InputError) as err:
        load_grids(tree_copy / "cases")
    message = str(err.value)
    assert message.startswith(f"{path}: ") and needle in message and "\n" not in message


def test_cli_exits_2_on_a_broken_grid(tree_copy):
    path = tree_copy / "cases" / "base_ops" / "attention_context.yaml"
    edit_yaml(path, lambda d: d["grid"]["heads"][0].update(head_dim="128"))
    done = run_cli("plan", "--root", str(tree_copy))
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert "attention_context.yaml: field 'grid.heads.0.head_dim': Input should be a valid list" in done.stderr


def test_invalid_yaml_syntax_names_the_line(tree_copy):
    path = tree_copy / "cases" / "base_ops" / "comm.yaml"
    path.write_text("schema_version: 1\nop: comm\ngrid: {dtypes: [half\n")
    with pytest.raises(InputError, match=r"comm.yaml: line \d+ invalid YAML"):
        load_grids(tree_copy / "cases")


def test_op_must_match_file_name(tree_copy):
    edit_yaml(tree_copy / "cases" / "base_ops" / "moe.yaml", lambda d: d.update(op="mixture"))
    with pytest.raises(InputError, match=r"moe.yaml: field 'op' is 'mixture'; expected 'moe'"):
        load_grids(tree_copy / "cases")


def test_profile_config_typo_is_reported_with_its_model(tree_copy):
    path = tree_copy / "cases" / "models" / "MixtralForCausalLM.yaml"
    edit_yaml(path, lambda d: d["models"][1]["config"].update(num_local_expert=8))
    with pytest.raises(InputError) as err:
        load_profiles(tree_copy / "cases")
    assert f"{path}: models[1].config: field 'num_local_expert': unknown field" in str(err.value)


def test_systems_load_and_validate(project, tree_copy):
    systems = load_systems(project.systems)
    assert set(systems) == {
        "a100_sxm",
        "l40s",
        "h100_sxm",
        "h200_sxm",
        "b200_sxm",
        "gb200",
        "b300_sxm",
        "rtx_pro_6000",
        "cpu",
    }
    assert systems["h200_sxm"].devices == ["NVIDIA H200"] and systems["h200_sxm"].sm == "90"
    assert systems["b300_sxm"].sm == "103" and systems["rtx_pro_6000"].sm == "120"
    edit_yaml(tree_copy / "systems" / "l40s.yaml", lambda d: d.update(l2_bytes="96MB"))
    with pytest.raises(InputError, match=r"l40s.yaml: field 'l2_bytes': Input should be a valid integer"):
        load_systems(tree_copy / "systems")


DIGEST = "sha256:" + "a" * 64


@pytest.mark.parametrize(
    "change, needle",
    [
        (
            lambda d: d["backends"]["vllm"]["versions"]["0.24.0"].update(image="vllm/vllm-openai:v0.24.0"),
            "field 'backends.vllm.versions.0.24.0.image': Value error, must be repo:tag@sha256:<64 hex digits>",
        ),
        (
            lambda d: d["backends"]["sglang"]["versions"]["0.5.14"].update(image="lmsysorg/sglang@sha256:abc"),
            "must be repo:tag@sha256:<64 hex digits>",
        ),
        (
            lambda d: d["backends"].update(onnx={"current": "1", "versions": {"1": {"image": f"x/y:1@{DIGEST}"}}}),
            "field 'backends.onnx': Input should be 'torch', 'vllm', 'sglang' or 'trtllm'",
        ),
        (lambda d: d["backends"]["torch"].pop("current"), "field 'backends.torch.current': missing required field"),
        (lambda d: d["backends"]["torch"].update(current="9.9"), "current version '9.9' has no entry"),
    ],
)
def test_pins_are_refused_with_a_clear_message(tree_copy, change, needle):
    path = tree_copy / "pins.yaml"
    edit_yaml(path, change)
    with pytest.raises(InputError) as err:
        load_pins(path)
    assert str(err.value).startswith(f"{path}: ") and needle in str(err.value), str(err.value)


def test_checked_in_pins_hold_the_five_images(project):
    pins = load_pins(project.pins)
    images = {
        (backend, version): pin.image
        for backend, entry in pins.backends.items()
        for version, pin in entry.versions.items()
    }
    assert len(images) == 5
    assert images[("trtllm", "1.3.0rc20")].endswith("1532b38814b3faf2affdb5ef01ca91468685d314ffb7e8926a0567595355ed88")
    assert pins.pin("vllm") == ("0.24.0", pins.backends["vllm"].versions["0.24.0"])
    with pytest.raises(InputError, match="has no version '0.1'"):
        pins.pin("vllm", "0.1")


def test_the_runtime_knows_every_op_the_planner_plans_with_its_fields():
    from opcollect.plans.ops import OPS
    from opcollect.runtime.planfile import OP_FIELDS, TEXT_FIELDS

    assert OP_FIELDS == {name: (op.table, op.family, op.fields) for name, op in OPS.items()}
    for name, op in OPS.items():
        hints = {f: getattr(op.case_type.__annotations__[f], "__forward_arg__", None) for f in op.fields}
        assert set(hints.values()) <= {"str", "int"}, (name, hints)
        assert {f for f, kind in hints.items() if kind == "str"} == set(op.fields) & TEXT_FIELDS, name
