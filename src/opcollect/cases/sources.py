"""Load every case source of the project once: the base-op grids and the model profiles."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import Field

from opcollect.cases.grids import GRID_TYPES, Frozen, OpFile
from opcollect.cases.profiles import ModelShapes, ModelSpec, derive_shapes, parse_config, read_hf_config
from opcollect.errors import InputError
from opcollect.yamlio import load_typed


class ProfileEntry(Frozen):
    name: str = Field(min_length=1)
    config: dict[str, object]


class ProfileFile(Frozen):
    schema_version: Literal[1]
    architecture: str
    models: list[ProfileEntry] = Field(min_length=1)


def load_grids(cases_dir: Path) -> dict[str, OpFile]:
    grids: dict[str, OpFile] = {}
    for op, grid_type in GRID_TYPES.items():
        path = cases_dir / "base_ops" / f"{op}.yaml"
        if not path.is_file():
            raise InputError(f"{path}: missing case grid for op {op!r}; restore it from the repository")
        op_file = load_typed(path, OpFile[grid_type])  # type: ignore[valid-type]
        if op_file.op != op:
            raise InputError(f"{path}: field 'op' is {op_file.op!r}; expected {op!r} (the file name)")
        grids[op] = op_file
    return grids


def load_profiles(cases_dir: Path) -> tuple[ModelSpec, ...]:
    specs: list[ModelSpec] = []
    for path in sorted((cases_dir / "models").glob("*.yaml")):
        profile = load_typed(path, ProfileFile)
        if profile.architecture != path.stem:
            raise InputError(
                f"{path}: field 'architecture' is {profile.architecture!r}; expected {path.stem!r} (the file name)"
            )
        for i, entry in enumerate(profile.models):
            specs.append(parse_config(f"{path}: models[{i}].config", profile.architecture, entry.name, entry.config))
    return tuple(specs)


@dataclass(frozen=True)
class CaseSources:
    """Everything a plan expands from. Shapes are derived once per TP list and reused."""

    grids: dict[str, OpFile]
    models: tuple[ModelSpec, ...]
    _shapes: dict = field(default_factory=dict, compare=False, repr=False)

    def shapes(self, tp_sizes: tuple[int, ...]) -> dict[str, ModelShapes]:
        """Per-model shapes at the given TP sizes, keyed by model name."""
        cached = self._shapes.get(tp_sizes)
        if cached is None:
            cached = {spec.name: derive_shapes(spec, list(tp_sizes)) for spec in self.models}
            self._shapes[tp_sizes] = cached
        return cached

    @cached_property
    def architecture_of(self) -> dict[str, str]:
        return {spec.name: spec.architecture for spec in self.models}


def load_sources(cases_dir: Path, model_configs: tuple[Path, ...] = ()) -> CaseSources:
    models = load_profiles(cases_dir) + tuple(read_hf_config(p) for p in model_configs)
    seen: dict[str, str] = {}
    for spec in models:
        if spec.name in seen:
            raise InputError(f"{spec.source}: model name {spec.name!r} also defined in {seen[spec.name]}; rename one")
        seen[spec.name] = spec.source
    return CaseSources(grids=load_grids(cases_dir), models=models)
