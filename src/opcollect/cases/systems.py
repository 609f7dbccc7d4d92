"""Typed models of systems/*.yaml: what each GPU (or the CPU) is, as datasheets and nvidia-smi say."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from opcollect.cases.grids import SM, Frozen, PosInt
from opcollect.errors import InputError
from opcollect.tables.consumer import SystemSpec
from opcollect.yamlio import load_typed

PosFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class DenseTflops(Frozen):
    """Dense (no 2:4 sparsity) tensor-core throughput per rate, TFLOP/s (int8: TOPS); the speed-of-light bound
    (tables/physics.py) computes each op at its dtype's rate (plans/work.py). A rate the GPU lacks is left out."""

    float32: PosFloat | None = None
    bfloat16: PosFloat | None = None
    fp8: PosFloat | None = None
    int8: PosFloat | None = None
    nvfp4: PosFloat | None = None

    @model_validator(mode="after")
    def _some(self) -> DenseTflops:
        if not self.rates():
            raise ValueError("no rate given; list at least bfloat16's")
        return self

    def rates(self) -> dict[str, float]:
        """FLOP/s by rate name, the rates given only."""
        return {name: value * 1e12 for name, value in self.model_dump().items() if value is not None}


class System(Frozen):
    schema_version: Literal[2]
    name: str = Field(pattern=r"^[a-z0-9_]+$")
    devices: list[str] = Field(min_length=1, description="device names as nvidia-smi reports them")
    sm: SM
    memory_bytes: PosInt
    bandwidth_bytes_per_s: PosInt  # memory (HBM) bandwidth
    l2_bytes: PosInt
    dense_tflops: DenseTflops
    gpus_per_node: PosInt
    # per GPU, one direction: NVLink (None: the GPU has none), over the GPUs one NVLink domain joins; PCIe; the
    # node's network to other nodes
    nvlink_bytes_per_s: PosInt | None
    nvlink_gpus: PosInt
    pcie_bytes_per_s: PosInt
    network_bytes_per_s: PosInt
    aiconfigurator: SystemSpec = Field(description="the consumer's system spec: TABLES/<name>.yaml")

    @model_validator(mode="after")
    def _nvlink(self) -> System:
        if self.nvlink_bytes_per_s is None and self.nvlink_gpus != 1:
            raise ValueError(
                f"nvlink_gpus is {self.nvlink_gpus} without nvlink_bytes_per_s; set 1, or give the bandwidth"
            )
        return self


def load_systems(systems_dir: Path) -> dict[str, System]:
    systems: dict[str, System] = {}
    owner: dict[str, Path] = {}  # device name -> the file that lists it: a device is one system
    for path in sorted(Path(systems_dir).glob("*.yaml")):
        system = load_typed(path, System)
        if system.name != path.stem:
            raise InputError(f"{path}: field 'name' is {system.name!r}; expected {path.stem!r} (the file name)")
        for device in system.devices:
            if device in owner:
                raise InputError(
                    f"{path}: field 'devices': {device!r} is also listed by {owner[device]}; "
                    "a device belongs to one system, remove it from one of them"
                )
            owner[device] = path
        systems[system.name] = system
    if not systems:
        raise InputError(f"{systems_dir}: no system YAML files; restore systems/ from the repository")
    return systems


def system_for_device(systems: dict[str, System], device_name: str) -> System | None:
    """The system whose nvidia-smi names include ``device_name``."""
    for system in systems.values():
        if device_name in system.devices:
            return system
    return None
