"""Behaviours the third blind round (scripts/blind_mutants_3.json) found unguarded: keywords passed to a framework
function or class that takes **kwargs are not reported missing by the contract check; SGLang's int4 Marlin check
asks N % 64 and K % 128 (not the tiles swapped); the TensorRT-LLM all-reduce preflight looks for each needed text in
the named function's body, not anywhere in its file; a compressed-tensors input-activation config without
``strategy`` is per tensor; and ``--gpus all`` asks Docker for every GPU (count -1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import made_release, made_runner

from opcollect.backends.sglang import gemm
from opcollect.backends.symbols import contract
from opcollect.backends.trtllm import allreduce_preflight as preflight
from opcollect.cases.profiles import derive_shapes, read_hf_config
from opcollect.cases.quantization import COMPRESSED_TENSORS, QuantizeShape, quantize_shapes, static_fp8
from opcollect.images.container import ContainerRun, container_options
from opcollect.plans.gemm import GemmCase
from opcollect.runtime.contract import KernelLimit

DATA = Path(__file__).parent / "data"


# ---- backends/symbols.py: **kwargs takes any keyword


def test_keywords_to_a_kwargs_function_or_class_are_not_missing(tmp_path):
    api = (
        "def opened(a, **kwargs):\n    pass\n\n"
        "def closed(a):\n    pass\n\n"
        "class Wide:\n    def __init__(self, x, **extra):\n        pass\n"
    )
    release = made_release(tmp_path / "release", {"tensorrt_llm/__init__.py": "", "tensorrt_llm/api.py": api})
    run = (
        "def f():\n    from tensorrt_llm.api import Wide, closed, opened\n"
        "    opened(a=1, anything=2)\n"
        "    Wide(x=1, y=2)\n"
        "    closed(a=1, b=2)\n"
    )
    _, misses, _ = contract("trtllm", [release], made_runner(tmp_path, "trtllm", run, "run.py"))
    assert [m.render() for m in misses] == [
        "src/opcollect/backends/trtllm/run.py:5: tensorrt_llm.api.closed: no parameter 'b'"
    ]


# ---- backends/sglang/gemm.py: Marlin's minimum tile is (n 64, k 128)


def test_int4_marlin_takes_n_an_odd_multiple_of_64_and_refuses_n_off_64():
    gemm.check_shape(GemmCase("int4_wo", 4, 192, 256))  # n = 3 * 64, k = 2 * 128: Marlin runs it
    gemm.check_shape(GemmCase("int4_wo", 4, 64, 128))
    with pytest.raises(KernelLimit, match="n % 64 == 0"):
        gemm.check_shape(GemmCase("int4_wo", 4, 160, 256))  # n % 64 == 32


# ---- backends/trtllm/allreduce_preflight.py: the needed text inside the named function


def _trtllm(tmp_path: Path, ops: str) -> Path:
    root = tmp_path / "tensorrt_llm"
    sources = {
        "_utils.py": 'import os\n\ndef mpi_disabled() -> bool:\n    return os.environ.get("TLLM_DISABLE_MPI") == "1"\n',
        "_torch/distributed/communicator.py": (
            "class TorchDist:\n"
            "    def __init__(self, mapping):\n"
            "        self.setup_local_comm()\n"
            "        init_pg(self.local_comm)\n\n"
            "    def setup_local_comm(self):\n"
            "        self.local_comm = None\n"
        ),
        "_torch/distributed/ops.py": ops,
    }
    for rel, text in sources.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_preflight_reports_a_need_found_only_outside_the_named_function(tmp_path):
    kept = (
        "class AllReduce:\n"
        "    def __init__(self, mapping):\n"
        "        self._disable_mpi = mpi_disabled()\n"
        "        self.op = torch.ops.trtllm.allreduce_pg if self._disable_mpi else None\n"
    )
    assert preflight.problems(_trtllm(tmp_path / "kept", kept)) == []
    # allreduce_pg moved out of __init__ into forward: the file still names it, __init__ no longer does
    moved = (
        "class AllReduce:\n"
        "    def __init__(self, mapping):\n"
        "        self._disable_mpi = mpi_disabled()\n\n"
        "    def forward(self, x):\n"
        "        return torch.ops.trtllm.allreduce_pg(x)\n"
    )
    [line] = preflight.problems(_trtllm(tmp_path / "moved", moved))
    assert line.startswith("tensorrt_llm/_torch/distributed/ops.py: AllReduce.__init__ no longer uses allreduce_pg (")


# ---- cases/quantization.py: compressed-tensors' strategy defaults to tensor

STATIC_NO_STRATEGY = {
    "quant_method": "compressed-tensors",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
            "input_activations": {"num_bits": 8, "type": "float", "dynamic": False},  # no strategy: per tensor
        }
    },
}


def test_compressed_tensors_static_fp8_without_strategy_is_per_tensor(tmp_path):
    assert static_fp8("cfg", STATIC_NO_STRATEGY) == COMPRESSED_TENSORS
    assert quantize_shapes(static_fp8("cfg", STATIC_NO_STRATEGY), {4096}) == {QuantizeShape(4096)}
    per_channel = json.loads(json.dumps(STATIC_NO_STRATEGY))
    per_channel["config_groups"]["group_0"]["input_activations"]["strategy"] = "channel"
    assert static_fp8("cfg", per_channel) is None
    # QuantizationArgs' defaults: an activation config without `dynamic` is static, with dynamic true it is not
    for dynamic, expected in ((None, COMPRESSED_TENSORS), (True, None)):
        args = json.loads(json.dumps(STATIC_NO_STRATEGY))
        activations = args["config_groups"]["group_0"]["input_activations"]
        del activations["dynamic"]
        if dynamic is not None:
            activations["dynamic"] = dynamic
        assert static_fp8("cfg", args) == expected
    # through a config.json: its layers' input widths at TP 8 (qkv/gate_up/lm_head 5120, o 1024, down 3200)
    config = json.loads((DATA / "quant_bmm_configs" / "Qwen3-32B-FP8-Static.json").read_text())
    config["quantization_config"] = STATIC_NO_STRATEGY
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    spec = read_hf_config(path)
    assert spec.static_fp8 == COMPRESSED_TENSORS
    assert derive_shapes(spec, [8]).quantize == {QuantizeShape(k) for k in (5120, 1024, 3200)}


# ---- images/container.py: --gpus all


def test_gpus_all_asks_docker_for_every_gpu(tmp_path):
    def requests(gpus: str, device: str = "cuda"):
        run = ContainerRun("image", tmp_path / "plan.json", tmp_path / "run", device, gpus, ())
        return container_options(run, ["run"])["device_requests"]

    assert requests("all", device="cpu") is None

    [every] = requests("all")
    assert (every.count, every.device_ids, every.capabilities) == (-1, [], [["gpu"]])  # docker run --gpus all
    [chosen] = requests("0, 1")
    assert (chosen.count, chosen.device_ids, chosen.capabilities) == (0, ["0", "1"], [["gpu"]])
