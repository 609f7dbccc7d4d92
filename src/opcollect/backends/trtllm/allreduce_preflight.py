"""What the TensorRT-LLM all-reduce runner (allreduce.py) assumes of the installed tensorrt_llm, checked before any
rank starts and again inside each rank once TensorRT-LLM's objects are built.

The runner starts its ranks without mpirun: TLLM_DISABLE_MPI=1, a torch process group, a TorchDist whose
setup_local_comm is replaced by a one-machine group (allreduce.py's docstring says why). That holds only while the
installed release keeps the code paths it relies on, which moved across the TensorRT-LLM copies read; so:

- before any rank starts, ``check_installed`` reads the installed package's source files (without importing it,
  so no GPU or MPI is touched) and refuses, as a KernelLimit naming the file and the assumption, when one of
  ASSUMPTIONS does not hold;
- inside each rank, ``world_problems`` and ``allreduce_problem`` check what was built: MPI reported off, the
  replaced setup_local_comm the one TorchDist ran (its local_comm is the group it made), the TP ProcessGroup that
  AllReduce.forward hands to allreduce_pg present, and the AllReduce built on the allreduce_pg path.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from opcollect.backends.symbols import MAX_SOURCE_BYTES
from opcollect.backends.trtllm.torch_ops import definition, installed_root
from opcollect.errors import InputError
from opcollect.inputs import read_text
from opcollect.runtime.contract import KernelLimit


@dataclass(frozen=True)
class Assumption:
    """The function or method ``where`` (``name`` or ``Class.method``) of ``path`` (inside the tensorrt_llm package)
    exists and its source contains every one of ``needs``."""

    path: str
    where: str
    needs: tuple[str, ...]
    why: str


# Each as read in the TensorRT-LLM copies listed in docs/research/trtllm-1.3.0-runners.md (custom_allreduce).
ASSUMPTIONS = (
    Assumption(
        "_utils.py", "mpi_disabled", ("TLLM_DISABLE_MPI",), "TLLM_DISABLE_MPI=1 turns MPI off (_utils.py:521-523)"
    ),
    Assumption(
        "_torch/distributed/communicator.py",
        "TorchDist.__init__",
        ("self.setup_local_comm()", "self.local_comm"),
        "TorchDist builds its node-local group through setup_local_comm and hands local_comm to init_pg "
        "(communicator.py:1015-1016)",
    ),
    Assumption(
        "_torch/distributed/communicator.py",
        "TorchDist.setup_local_comm",
        ("self.local_comm",),
        "setup_local_comm sets local_comm, the attribute the runner's replacement sets (communicator.py:1099-1116)",
    ),
    Assumption(
        "_torch/distributed/ops.py",
        "AllReduce.__init__",
        ("mpi_disabled()", "_disable_mpi", "allreduce_pg"),
        "AllReduce runs allreduce_pg over the TP ProcessGroup when MPI is off (ops.py:698-700)",
    ),
)


def problems(root: Path) -> list[str]:
    """One line per assumption the tensorrt_llm package at ``root`` breaks: 'file: where: what is missing (why)'."""
    out = []
    for item in ASSUMPTIONS:
        path = root / item.path
        if not path.is_file():
            out.append(f"tensorrt_llm/{item.path}: missing ({item.why})")
            continue
        try:
            source = read_text(path, "TensorRT-LLM source", "run the pinned image", limit=MAX_SOURCE_BYTES)
        except InputError as exc:  # not a regular file, too large, not UTF-8: the assumption cannot be read
            out.append(str(exc))
            continue
        node = definition(ast.parse(source), item.where)
        if node is None:
            out.append(f"tensorrt_llm/{item.path}: no {item.where} ({item.why})")
            continue
        body = ast.get_source_segment(source, node) or ""
        missing = [need for need in item.needs if need not in body]
        if missing:
            out.append(f"tensorrt_llm/{item.path}: {item.where} no longer uses {', '.join(missing)} ({item.why})")
    return out


def check_installed(root: Path | None = None) -> None:
    """Refuse, with one line, to start the ranks where the installed tensorrt_llm breaks an assumption."""
    root = root if root is not None else installed_root()
    if root is None:
        raise KernelLimit("TensorRT-LLM's all-reduce: tensorrt_llm is not installed")
    found = problems(root)
    if found:
        extra = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise KernelLimit(f"TensorRT-LLM's all-reduce cannot start its ranks without MPI here: {found[0]}{extra}")


def world_problems(mpi_off: bool, comm, local_group, mapping) -> list[str]:
    """What a rank's built world breaks: ``comm`` the TorchDist, ``local_group`` the group the replaced
    setup_local_comm made (None: it never ran), ``mapping`` the Mapping AllReduce is built on."""
    out = []
    if not mpi_off:
        out.append("mpi_disabled() is False with TLLM_DISABLE_MPI=1: AllReduce would call MPI without mpirun")
    if local_group is None or getattr(comm, "local_comm", None) is not local_group:
        out.append("TorchDist did not take its local group from the replaced setup_local_comm")
    if getattr(mapping, "tp_group_pg", None) is None:
        out.append("Mapping has no tp_group_pg: AllReduce.forward asserts the TP ProcessGroup (ops.py:866-872)")
    return out


def allreduce_problem(allreduce) -> str | None:
    """Why the built AllReduce is not the allreduce_pg one the runner times (None: it is)."""
    if getattr(allreduce, "_disable_mpi", None) is not True:
        return "AllReduce was built for MPI (_disable_mpi is not True): it would call MPI without mpirun"
    return None
