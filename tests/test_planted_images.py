"""The image input hash covers what an image is built from; checked without a Docker engine."""

from __future__ import annotations

import pytest
import yaml

from opcollect.errors import InputError
from opcollect.images.context import input_hash, plan_build
from opcollect.images.pins import load_pins
from opcollect.project import find_project

LOCAL = "opcollect-local/torch-cpu:latest"
ID_A = "sha256:" + "a" * 64
ID_B = "sha256:" + "b" * 64


@pytest.fixture(scope="module")
def tree():
    return find_project()


def test_local_base_id_enters_the_input_hash(tree):
    a = plan_build(tree, "torch", base_image=LOCAL, local_image_id=lambda ref: ID_A)
    again = plan_build(tree, "torch", base_image=LOCAL, local_image_id=lambda ref: ID_A)
    b = plan_build(tree, "torch", base_image=LOCAL, local_image_id=lambda ref: ID_B)
    assert a.base_image == b.base_image == LOCAL and a.local_base
    assert a.base_digest == ID_A and b.base_digest == ID_B  # the sidecar records the local image ID
    assert a.input_hash == again.input_hash
    assert a.input_hash != b.input_hash and a.tag != b.tag
    assert a.version is None and a.tag.startswith("opcollect/torch:local-")


def test_a_local_base_needs_the_engine_to_identify_it(tree):
    with pytest.raises(InputError, match="needs the Docker engine"):
        plan_build(tree, "torch", base_image=LOCAL)


def _pins_with_digest(tmp_path, tree, digest_hex):
    data = yaml.safe_load(tree.pins.read_text())
    entry = data["backends"]["torch"]
    pin = entry["versions"][entry["current"]]
    pin["image"] = pin["image"].split("@", 1)[0] + "@sha256:" + digest_hex
    path = tmp_path / f"pins-{digest_hex[:4]}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_pinned_digest_enters_the_input_hash(tree, tmp_path):
    one = plan_build(tree, "torch", pins_path=_pins_with_digest(tmp_path, tree, "1" * 64))
    two = plan_build(tree, "torch", pins_path=_pins_with_digest(tmp_path, tree, "2" * 64))
    assert one.base_digest == "sha256:" + "1" * 64 and two.base_digest == "sha256:" + "2" * 64
    assert one.input_hash != two.input_hash and one.tag != two.tag
    assert not one.local_base and one.version == load_pins(tree.pins).backends["torch"].current


def test_a_pinned_build_starts_from_the_image_by_digest(tree):
    version, pin = load_pins(tree.pins).pin("vllm")
    plan = plan_build(tree, "vllm")
    args = plan.buildargs()
    assert args["BASE_IMAGE"] == pin.image and args["BASE_IMAGE"].endswith("@" + pin.digest)
    assert args["BASE_DIGEST"] == pin.digest and args["INPUT_HASH"] == plan.input_hash
    assert plan.tag == f"opcollect/vllm:{version}-{plan.input_hash[:12]}"


def test_a_base_image_given_by_digest_is_no_local_base(tree):
    ref = "example.org/torch:1@" + ID_A
    plan = plan_build(tree, "torch", base_image=ref, local_image_id=lambda r: pytest.fail("not a local image"))
    assert plan.base_digest == ID_A and not plan.local_base and plan.base_image == ref


def test_input_hash_covers_each_input():
    base = ("img:1", ID_A, b"FROM x\n", b"[project]\n", "c" * 64)
    reference = input_hash(*base)
    for i, other in enumerate(("img:2", ID_B, b"FROM y\n", b"[project]\nname='x'\n", "d" * 64)):
        changed = list(base)
        changed[i] = other
        assert input_hash(*changed) != reference, i
    assert input_hash(*base) == reference


def test_the_pins_entry_label_follows_the_digest(tree, tmp_path):
    one = plan_build(tree, "torch", pins_path=_pins_with_digest(tmp_path, tree, "1" * 64))
    same = plan_build(tree, "torch", pins_path=_pins_with_digest(tmp_path, tree, "1" * 64))
    two = plan_build(tree, "torch", pins_path=_pins_with_digest(tmp_path, tree, "2" * 64))
    assert one.labels["pins_entry_hash"] == same.labels["pins_entry_hash"]
    assert one.labels["pins_entry_hash"] != two.labels["pins_entry_hash"]
    assert one.buildargs()["PINS_ENTRY_HASH"] != two.buildargs()["PINS_ENTRY_HASH"]


@pytest.mark.parametrize(
    "tag, version, names_it",
    [
        ("1.3.0rc23", "1.3.0rc23", True),
        ("1.3.0rc23", "1.3.0rc2", False),  # a tag is the version and then a separator, not a longer version
        ("1.3.0rc2", "1.3.0rc23", False),
        ("v0.24.0", "0.24.0", True),
        ("0.24.0", "0.24.01", False),
        ("2.8.0-cuda12.8-cudnn9-runtime", "2.8.0", True),
        ("2.8.0_x", "2.8.0", True),
        ("2.8.0+cu128", "2.8.0", True),
        ("2.8.01-cuda", "2.8.0", False),
        ("x2.8.0", "2.8.0", False),
        ("0.24.0", "0.24.0.", False),
        ("0x24.0", "0.24.0", False),  # the version's dots are dots
    ],
)
def test_a_tag_names_a_version_only_as_the_version_and_a_separator(tag, version, names_it):
    from opcollect.images.pins import tag_matches

    assert tag_matches(tag, version) is names_it


def test_the_tag_is_read_after_the_last_slash():
    from opcollect.images.pins import VersionPin

    digest = "@sha256:" + "c" * 64
    assert VersionPin(image="registry.example:5000/team/torch" + digest).tag is None  # host:port is not a tag
    assert VersionPin(image="registry.example:5000/team/torch:2.8.0" + digest).tag == "2.8.0"
    assert VersionPin(image="torch:2.8.0-cuda" + digest).tag == "2.8.0-cuda"
    assert VersionPin(image="localhost:5000/torch" + digest).name == "localhost:5000/torch"


def test_pins_refuse_a_tag_of_another_version_and_take_a_registry_port(tmp_path, tree):
    data = yaml.safe_load(tree.pins.read_text())
    entry = data["backends"]["trtllm"]
    digest = "@sha256:" + "d" * 64
    entry["versions"] = {"1.3.0rc2": {"image": "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc23" + digest}}
    entry["current"] = "1.3.0rc2"
    path = tmp_path / "pins.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InputError, match="version '1.3.0rc2' pins image tag '1.3.0rc23', which is another version"):
        load_pins(path)
    entry["versions"] = {"1.3.0rc2": {"image": "registry.example:5000/tensorrt-llm" + digest}}
    path.write_text(yaml.safe_dump(data))
    assert load_pins(path).pin("trtllm") == ("1.3.0rc2", load_pins(path).backends["trtllm"].versions["1.3.0rc2"])


def test_a_pinned_image_reference_is_matched_whole():
    from pydantic import ValidationError

    from opcollect.images.pins import VersionPin

    good = "vllm/vllm-openai:v0.24.0@sha256:" + "e" * 64
    assert VersionPin(image=good).digest == "sha256:" + "e" * 64
    for bad in (good + "\n", good + "\ntouch x", "\n" + good, good + "0", good.replace("e", "E")):
        with pytest.raises(ValidationError):
            VersionPin(image=bad)
