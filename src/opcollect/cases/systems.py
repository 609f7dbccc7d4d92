"""Typed models of systems/*.yaml: what each GPU (or the CPU) is, as datasheets and nvidia-smi say."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from opcollect.cases.grids import SM, Frozen, PosInt
from opcollect.errors import InputError
from opcollect.tables.consumer import SystemSpec
from opcollect.yamlio import load_typed


class System(Frozen):
    schema_version: Literal[2]
    name: str = Field(pattern=r"^[a-z0-9_]+$")
    devices: list[str] = Field(min_length=1, description="device names as nvidia-smi reports them")
    sm: SM
    memory_bytes: PosInt
    bandwidth_bytes_per_s: PosInt
    l2_bytes: PosInt
    dense_tflops: dict[str, float] = Field(min_length=1)
    gpus_per_node: PosInt
    aiconfigurator: SystemSpec = Field(description="the consumer's system spec: TABLES/<name>.yaml")


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
