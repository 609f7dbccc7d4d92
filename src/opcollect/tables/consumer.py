"""The consumer's contract: what aiconfigurator-core reads from a TABLES tree, in one place.

Read from aiconfigurator-core 0.12.0 (PyPI wheel, aiconfigurator_core/):
- sdk/perf_database.py: get_database (:1221) opens ``<root>/<system>.yaml`` and resolves its data_dir against
  the yaml's directory (:1304); collection_meta.yaml schema 2 is validated at :631-718 (runtime keys :641,
  collection keys :639, statuses :640); strict provenance (:1065-1140) takes every regular non-dot file of a
  family-layout version directory, but the names in NOT_TABLES, for a table named by its stem.
- sdk/operations/base.py:66,122-147: ``<data_dir>/<family>/<backend>/<version>/<table>.parquet``, family any
  first-level directory but trtllm, sglang, vllm, nccl, oneccl.
- sdk/operations/communication.py:141-175 and the Rust loader: NCCL only from
  ``<data_dir>/comm/nccl/<misc.nccl_version>/nccl_perf.parquet``; integers must be int64, latency double.
- sdk/common.py:1243-1326: the quant-mode enums a dtype column must name (KNOWN_VALUES); a value outside them
  makes the Python support matrix raise on that op.
- the Rust system spec (and the CLI's memory model, sdk/backends/base_backend.py:814,1496,1771): the keys of
  SystemSpec below; gpu.mem_bw and node's three figures are required to load, mem_capacity, nccl_mem,
  other_mem and each quant mode's FLOPS to estimate.
A new consumer release is checked against these sources and changed here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

CONSUMER = "aiconfigurator-core==0.12.0"

SIDECAR = "collection_meta.yaml"
# files of a version directory the consumer does not take for a table (perf_database.py:53-58)
NOT_TABLES = frozenset({SIDECAR, "reuse.yaml", "SHARED_LAYER_REUSE.txt", "INCOMPLETE.txt"})
NCCL_TABLE = "nccl_perf"
# first-level directories of a data_dir that are no family (operations/base.py:66): the legacy layout's backends
NOT_FAMILIES = frozenset({"trtllm", "sglang", "vllm", "nccl", "oneccl"})

# the enums' member names a column's values must be (GEMMQuantMode, MoEQuantMode, FMHAQuantMode,
# KVCacheQuantMode, CommQuantMode)
_GEMM = frozenset(
    {"bfloat16", "int8_wo", "int4_wo", "fp8", "fp8_static", "sq", "fp8_block", "fp8_ootb", "nvfp4", "nvfp4_wo"}
    | {"w4a16_nvfp4"}
)
_MOE = frozenset(
    {"bfloat16", "fp8", "int4_wo", "fp8_block", "w4afp8", "nvfp4", "nvfp4_wo", "w4a16_mxfp4", "w4a8_mxfp4_mxfp8"}
    | {"w4a8_mxfp4_mxfp8_trtllm", "w4a16_mxfp4_cutlass", "w4a16_nvfp4"}
)
_FMHA = frozenset({"bfloat16", "float16", "fp8", "fp8_block"})
KNOWN_VALUES: dict[str, frozenset[str]] = {
    "gemm_dtype": _GEMM,
    "gemm_type": _GEMM,
    "moe_dtype": _MOE,
    "attn_dtype": _FMHA,
    "mla_dtype": _FMHA,
    "kv_cache_dtype": frozenset({"bfloat16", "int8", "fp8"}),
    "nccl_dtype": frozenset({"half", "int8", "fp8"}),
}
# values a table's own loader takes beyond the enums: the DeepSeek-V4 module loader normalises fp8_e4m3 to fp8
# (aiconfigurator-core dsv4.rs:1315-1320), its paged-MQA and top-k loaders read no dtype column (:815-962), and no
# quant mode is built from these tables; SGLang's rows say fp8_e4m3, as the reference's do (plans/dsv4.py)
_DSV4_E4M3 = {"mla_dtype": frozenset({"fp8_e4m3"}), "kv_cache_dtype": frozenset({"fp8_e4m3"})}
TABLE_VALUES: dict[str, dict[str, frozenset[str]]] = {
    f"dsv4_{name}_perf": _DSV4_E4M3
    for name in ("csa_context_module", "csa_generation_module", "hca_context_module", "hca_generation_module")
    + ("paged_mqa_logits_module", "hca_attn_module", "csa_topk_calib")
}
# the GLM-5 kernel tables' loader reads no dtype column either (load_sparse_parquet, aiconfigurator-core
# perf_database/dsa.rs:1153-1210): SGLang's rows keep the reference's fp8_e4m3 labels (plans/dsa_kernels.py)
TABLE_VALUES.update({f"glm5_{name}_module_perf": _DSV4_E4M3 for name in ("mqa_logits", "topk", "dsa_attn")})


def known_values(table: str) -> dict[str, frozenset[str]]:
    """KNOWN_VALUES with what ``table``'s own loader takes besides (TABLE_VALUES)."""
    extra = TABLE_VALUES.get(table, {})
    return {column: known | extra.get(column, frozenset()) for column, known in KNOWN_VALUES.items()}


def read_as_table(name: str) -> bool:
    """Whether the consumer takes a file of this name in a version directory for a table."""
    return not name.startswith(".") and name not in NOT_TABLES


def table_names(directory: Path) -> list[str]:
    """The files of a version directory the consumer takes for tables, as it lists them
    (perf_database.py:1045-1062 _version_dir_data_filenames: every entry that is no dot-file nor a marker and
    that os.path.isfile, a link to a file among them)."""
    return sorted(name for name in os.listdir(directory) if read_as_table(name) and os.path.isfile(directory / name))


def stem(name: str) -> str:
    """The table name the consumer looks for in collection_meta.yaml (perf_database.py:1095, os.path.splitext):
    gemm_perf.parquet.bak is table 'gemm_perf.parquet'."""
    return os.path.splitext(name)[0]


def version_directory(system: str, family: str, backend: str, version: str) -> str:
    return f"{system}/{family}/{backend}/{version}"


def nccl_directory(system: str, nccl_version: str) -> str:
    """NCCL is one table per system and NCCL version, whatever framework collected it."""
    return f"{system}/comm/nccl/{nccl_version}"


def row_version(table: str, version: str, nccl_version: str | None) -> str | None:
    """The version column of a table's rows: NCCL's rows carry the NCCL version, as the reference's do."""
    return nccl_version if table == NCCL_TABLE else version


# ---- <root>/<system>.yaml ----


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Positive = Annotated[int | float, Field(gt=0)]  # as the yaml writes it: the Rust reader takes each as it is


class SpecGpu(_Spec):
    mem_bw: Positive  # bytes/s
    mem_bw_empirical_scaling_factor: Positive | None = None
    mem_empirical_constant_latency: Annotated[int | float, Field(ge=0)] | None = None  # seconds
    mem_capacity: Annotated[int, Field(gt=0)]  # bytes
    bfloat16_tc_flops: Positive
    int8_tc_flops: Positive | None = None
    fp8_tc_flops: Positive | None = None
    fp4_tc_flops: Positive | None = None
    power: Positive | None = None  # watts
    sm_version: int | None = None


class SpecNode(_Spec):
    num_gpus_per_node: Annotated[int, Field(gt=0)]
    inter_node_bw: Positive  # bytes/s per GPU, one direction
    intra_node_bw: Positive
    pcie_bw: Positive | None = None
    p2p_latency: Annotated[int | float, Field(ge=0)] | None = None
    num_gpus_per_rack: Annotated[int, Field(gt=0)] | None = None
    inter_rack_bw: Positive | None = None
    inter_rack_latency: Annotated[int | float, Field(ge=0)] | None = None


class SpecMisc(_Spec):
    nccl_mem: dict[Literal[1, 2, 4, 8], Annotated[int, Field(ge=0)]]  # bytes NCCL holds per TP size
    other_mem: Annotated[int, Field(ge=0)]


class SystemSpec(_Spec):
    """The consumer's system spec but data_dir and misc.nccl_version, which merge fills in."""

    gpu: SpecGpu
    node: SpecNode
    misc: SpecMisc


class SpecMiscFile(SpecMisc):
    nccl_version: str | None = None


class SpecFile(SystemSpec):
    """``<root>/<system>.yaml`` as merge writes it."""

    data_dir: str
    misc: SpecMiscFile


def system_spec_yaml(system: str, spec: SystemSpec, nccl_version: str | None) -> str:
    """``<root>/<system>.yaml``: its tables under ``<root>/<system>/``, NCCL under comm/nccl/<nccl_version>."""
    misc = spec.misc.model_dump()
    if nccl_version is not None:
        misc["nccl_version"] = nccl_version
    body = {
        "data_dir": system,
        "gpu": spec.gpu.model_dump(exclude_none=True),
        "node": spec.node.model_dump(exclude_none=True),
        "misc": misc,
    }
    header = f"# The system spec {CONSUMER} reads; written by opcollect merge from systems/{system}.yaml\n"
    return header + yaml.safe_dump(body, sort_keys=False, default_flow_style=False)


def spec_nccl_version(text: str) -> str | None:
    """misc.nccl_version of a system spec merge wrote, or None."""
    data = yaml.safe_load(text)
    misc = data.get("misc") if isinstance(data, dict) else None
    value = misc.get("nccl_version") if isinstance(misc, dict) else None
    return value if isinstance(value, str) else None


# ---- collection_meta.yaml, schema 2 ----

NonEmpty = Annotated[str, StringConstraints(min_length=1)]
Count = Annotated[int, Field(ge=0, strict=True)]
Status = Literal["complete", "partial"]


class _Meta(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class MetaRuntime(_Meta):
    framework: NonEmpty
    version: NonEmpty
    image: NonEmpty | None = None
    image_variant: NonEmpty | None = None
    image_digest: NonEmpty | None = None


class Collection(_Meta):
    collector_ref: NonEmpty
    collector_hash: NonEmpty
    case_plan_hash: NonEmpty
    collected_at: NonEmpty
    rows: Count
    status: Status


class MetaTable(_Meta):
    rows: Count
    status: Status
    collections: list[Collection] = Field(min_length=1)


class CollectionMeta(_Meta):
    schema_version: Literal[2]
    runtime: MetaRuntime
    tables: dict[str, MetaTable] = Field(min_length=1)


def dump_collection_meta(meta: CollectionMeta) -> str:
    """The file as the consumer validates it: absent optional fields are left out, never null."""
    return yaml.safe_dump(meta.model_dump(mode="json", exclude_none=True), sort_keys=False, default_flow_style=False)
