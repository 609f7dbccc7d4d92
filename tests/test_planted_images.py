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
