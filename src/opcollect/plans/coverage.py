"""How much of an existing TABLES tree one plan covers: key rows per table, and the missing ones as patterns.

A table's key rows are the distinct tuples of its key columns that are also the op's case fields (plus
``op_name``, so nccl_perf's all_gather rows never count as the all-reduce plan's). Each missing key goes to
the first reason found: a column value the plan never has (``head_dim=256``), else a pair of columns whose
combination the plan never has (``(num_heads,num_key_value_heads)=(12,4)``), else "other combinations".
pyarrow is imported inside the functions: a plan without ``--against`` never pays for it.
"""

from __future__ import annotations

import gc
from collections import Counter
from operator import itemgetter
from pathlib import Path

from opcollect.errors import InputError
from opcollect.names import sm_label
from opcollect.plans.base import OpPlan
from opcollect.plans.planner import Plan

FAMILIES = ("gemm", "quantize", "attention", "moe", "mla", "mla_bmm", "encoder_attention", "comm")
FAMILIES += ("msa",)  # MiniMax-M3 (plans/msa.py); DSA and the GLM-5 kernels are sparse_attention
FAMILIES += ("sparse_attention", "mhc")  # DeepSeek-V4 (plans/dsv4.py, dsv4_kernels.py) and its mHC (plans/mhc.py)
FAMILIES += ("linear_attention",)  # Gated DeltaNet and Mamba2 (plans/linear_attention.py)
NCCL = "nccl"  # comm/nccl/<nccl version>/: backend-independent
TOP_PATTERNS = 8
EXAMPLES = 5
NO_OP = "no op plans this table"
# pairs that read as one thing (a head layout, a parallel split, a dtype pair, a weight shape): tried first
PAIRS = (
    ("attn_dtype", "kv_cache_dtype"),
    ("mla_dtype", "kv_cache_dtype"),
    ("num_heads", "num_key_value_heads"),
    ("head_dim", "window_size"),
    ("num_key_value_heads", "head_dim"),
    ("moe_tp_size", "moe_ep_size"),
    ("num_experts", "topk"),
    ("hidden_size", "inter_size"),
    ("num_heads", "tp_size"),
    ("n", "k"),
    ("nccl_dtype", "num_gpus"),
)
TREE_HELP = "give a TABLES tree: [<system>/]<family>/<backend>/<version>/<table>_perf.parquet"


def table_files(root: Path, backend: str) -> list[tuple[str, Path]]:
    """(path relative to root, file) of every table of ``backend`` and of NCCL, in tree order."""
    root = Path(root)
    if not root.is_dir():
        what = "not a directory" if root.exists() else "no such directory"
        raise InputError(f"--against {root}: {what}; {TREE_HELP}")
    systems = [root] if _has_family(root) else [d for d in _subdirs(root) if _has_family(d)]
    if not systems:
        raise InputError(f"--against {root}: not a TABLES tree (no {', '.join(FAMILIES)} directory); {TREE_HELP}")
    found = []
    for system in systems:
        for family in FAMILIES:
            for owner in (backend, NCCL) if family == "comm" else (backend,):
                for version in _subdirs(system / family / owner):
                    for path in sorted(version.glob("*_perf.parquet")):
                        if path.name.startswith("."):
                            continue
                        if not path.is_file():  # a table that cannot be read is named, never left out
                            what = "a directory" if path.is_dir() else "not a regular file"
                            raise InputError(
                                f"--against {root}: {path.relative_to(root).as_posix()} is {what}, not a table; "
                                "restore it or leave it out of TABLES"
                            )
                        found.append((path.relative_to(root).as_posix(), path))
    if not found:
        raise InputError(f"--against {root}: no table of backend {backend} (nor nccl) in this tree; {TREE_HELP}")
    return found


def _has_family(directory: Path) -> bool:
    return any((directory / family).is_dir() for family in FAMILIES)


def _subdirs(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(d for d in directory.iterdir() if d.is_dir() and not d.name.startswith("."))


def coverage(plan: Plan, root: Path) -> dict:
    """Per table of the plan's backend (and NCCL) under ``root``: keys, covered keys, missing patterns."""
    by_table = {selection.op.table: selection for selection in plan.ops.values()}
    tables = []
    collecting = gc.isenabled()
    gc.disable()  # a million key tuples, none of them cyclic: the collector would only rescan them
    try:
        for rel, path in table_files(root, plan.backend):
            name = path.name[: -len(".parquet")]
            selection = by_table.get(name)
            if selection is None:
                tables.append({"table": name, "path": rel, "op": None, "note": NO_OP})
            else:
                found = table_coverage(selection.op, selection.values, path, plan.backend, selection.dispatch)
                tables.append({"table": name, "path": rel, **found})
    finally:
        if collecting:
            gc.enable()
    return {
        "tables_root": str(Path(root).resolve()),
        "backend": plan.backend,
        "sm": plan.sm,
        "plan_hash": plan.plan_hash,
        "cases": plan.total_cases,
        "tables": tables,
    }


def table_coverage(
    op: OpPlan, values: list[tuple], path: Path, backend: str = "", dispatch: list[str] | None = None
) -> dict:
    """Coverage of one table file by one op's planned value tuples (in ``op.fields`` order), and with the
    plan's ``dispatch`` per case, how many of the table's rows at covered keys name that as kernel_source."""
    import pyarrow as pa

    from opcollect.tables.schema import read_parquet, schema_for_op

    table = read_parquet(path)
    present = set(table.column_names)
    rename = getattr(op, "columns", {}).get(backend, {})  # a case field the backend's table names otherwise
    wanted = [  # (table column, position in the case tuple, arrow type)
        (rename.get(name, name), op.fields.index(name), kind)
        for name, kind in schema_for_op(op.name).field_types()
        if rename.get(name, name) in present
    ]
    if not wanted:
        raise InputError(
            f"{path}: none of the {op.name} key columns ({', '.join(op.fields)}) is in this table; "
            "is it a table of another op? Restore it or leave it out of TABLES"
        )
    constant = op.op_name is not None and "op_name" in present and "op_name" not in op.fields
    if constant:  # the plan's op_name is the op's, not a case field
        wanted.insert(0, ("op_name", None, pa.string()))
    columns = [name for name, _, _ in wanted]
    typed = {}
    for name, _, kind in wanted:
        try:
            typed[name] = table.column(name).cast(kind)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise InputError(
                f"{path}: column {name} is {table.column(name).type}, the plan's {name} is {kind}; "
                "fix the table's column type"
            ) from None
    distinct = pa.table(typed).group_by(columns).aggregate([])
    keys = set(zip(*(distinct.column(name).to_pylist() for name in columns)))

    positions = [i for _, i, _ in wanted if i is not None]
    project = itemgetter(*positions)
    prefix = (op.op_name,) if constant else ()
    if len(positions) == 1:
        plan_keys = {(*prefix, project(v)) for v in values}
    else:
        plan_keys = {prefix + project(v) for v in values}

    missing = _sorted(keys - plan_keys)
    dtypes = tuple(rename.get(name, name) for name in op.dtype_fields)
    patterns = attribute(missing, plan_keys, columns, dtypes)
    agreement = None
    if dispatch is not None and "kernel_source" in present:
        rows = zip(*(typed[name].to_pylist() for name in columns), table.column("kernel_source").to_pylist())
        agreement = dispatch_agreement(prefix, project, values, dispatch, ((r[:-1], r[-1]) for r in rows))
    return {
        "op": op.name,
        "key_columns": columns,
        "keys": len(keys),
        "covered": len(keys) - len(missing),
        "percent": _percent(len(keys) - len(missing), len(keys)),
        "missing": len(missing),
        "plan_keys": len(plan_keys),
        "patterns": patterns[:TOP_PATTERNS],
        "patterns_left_off": len(patterns) - min(len(patterns), TOP_PATTERNS),
        "examples": [dict(zip(columns, key)) for key in _spread(missing, EXAMPLES)],
        "dispatch": agreement,
    }


def dispatch_agreement(prefix: tuple, project, values: list[tuple], dispatch: list[str], rows) -> dict:
    """Of the table's rows at keys the plan has, the share whose kernel_source is the plan's dispatch there,
    and the most frequent (dispatch, kernel_source) disagreements."""
    single = not isinstance(project(values[0]), tuple) if values else False
    planned: dict[tuple, set[str]] = {}
    for v, d in zip(values, dispatch):
        key = (*prefix, project(v)) if single else prefix + project(v)
        planned.setdefault(key, set()).add(d)
    shared = agreeing = 0
    wrong: Counter[tuple[str, str]] = Counter()
    for key, kernel in rows:
        names = planned.get(tuple(key))
        if names is None:
            continue
        shared += 1
        if kernel in names:
            agreeing += 1
        else:
            wrong[(" or ".join(sorted(names)), kernel)] += 1
    return {
        "rows": shared,
        "agreeing": agreeing,
        "percent": _percent(agreeing, shared),
        "disagreements": [{"dispatch": d, "kernel_source": k, "rows": n} for (d, k), n in wrong.most_common(5)],
    }


def attribute(
    missing: list[tuple], plan_keys: set[tuple], columns: list[str], first: tuple[str, ...] = ()
) -> list[dict]:
    """Missing keys grouped by their first reason, the largest group first (ties in order of discovery).

    Single columns are tried in the order ``first`` (the dtypes), then by how few distinct values they have
    among the missing keys: head dims and parallel sizes read better than the sweep axes.
    """
    plan_columns = list(zip(*plan_keys)) if plan_keys else [() for _ in columns]
    spread = {i: len({key[i] for key in missing}) for i in range(len(columns))}
    rank = {name: n for n, name in enumerate(first)}
    order = sorted(range(len(columns)), key=lambda i: (rank.get(columns[i], len(rank)), spread[i], i))
    counts: Counter[tuple] = Counter()
    example: dict[tuple, tuple] = {}
    remaining = missing
    for i in order:
        have = set(plan_columns[i])
        kept = []
        for key in remaining:
            if key[i] in have:
                kept.append(key)
            else:
                reason = ((i,), (key[i],))
                counts[reason] += 1
                example.setdefault(reason, key)
        remaining = kept
    for i, j in _pairs(columns, order):
        if not remaining:
            break
        have = set(zip(plan_columns[i], plan_columns[j]))
        kept = []
        for key in remaining:
            if (key[i], key[j]) in have:
                kept.append(key)
            else:
                reason = ((i, j), (key[i], key[j]))
                counts[reason] += 1
                example.setdefault(reason, key)
        remaining = kept
    patterns = [
        {
            "pattern": _label([columns[i] for i in where], values),
            "columns": [columns[i] for i in where],
            "values": list(values),
            "keys": n,
            "examples": [dict(zip(columns, example[(where, values)]))],
        }
        for (where, values), n in counts.most_common()
    ]
    if remaining:
        patterns.append(
            {
                "pattern": "other combinations",
                "columns": [],
                "values": [],
                "keys": len(remaining),
                "examples": [dict(zip(columns, key)) for key in _spread(remaining, 3)],
            }
        )
        patterns.sort(key=lambda p: -p["keys"])  # stable: ties keep their order
    return patterns


def _percent(covered: int, keys: int) -> float:
    """One decimal; never 100.0 while a key is missing, nor 0.0 while one is covered."""
    if not keys:
        return 100.0
    value = round(100.0 * covered / keys, 1)
    return min(max(value, 0.1 if covered else 0.0), 99.9 if covered < keys else 100.0)


def _pairs(columns: list[str], order: list[int]) -> list[tuple[int, int]]:
    """Every pair of columns once: the PAIRS that exist first, then by the order of single columns."""
    index = {name: i for i, name in enumerate(columns)}
    pairs = [(index[a], index[b]) for a, b in PAIRS if a in index and b in index]
    seen = {frozenset(p) for p in pairs}
    for x, i in enumerate(order):
        for j in order[x + 1 :]:
            if frozenset((i, j)) not in seen:
                pairs.append((i, j))
                seen.add(frozenset((i, j)))
    return pairs


def _label(names: list[str], values: tuple) -> str:
    if len(names) == 1:
        return f"{names[0]}={values[0]}"
    return f"({','.join(names)})=({','.join(str(v) for v in values)})"


def _sorted(keys: set[tuple]) -> list[tuple]:
    """Keys in a stable order (string hashing differs per process); a null sorts last in its column."""
    try:
        return sorted(keys)
    except TypeError:
        return sorted(keys, key=lambda key: tuple((v is None, "" if v is None else v) for v in key))


def _spread(keys: list[tuple], count: int) -> list[tuple]:
    """Up to ``count`` keys spread evenly over a sorted list."""
    if len(keys) <= count:
        return list(keys)
    return [keys[(j * (len(keys) - 1)) // (count - 1)] for j in range(count)]


def _keys(count: int) -> str:
    return f"{count:,} key" + ("" if count == 1 else "s")


def _key_text(example: dict) -> str:
    return ",".join(f"{name}={value}" for name, value in example.items())


def render_coverage(report: dict) -> str:
    """The coverage report as text: one block per table, its top missing patterns below it."""
    lines = [
        f"coverage of {report['tables_root']} by the {sm_label(report['backend'], report['sm'])} plan "
        f"({report['cases']:,} cases, plan_hash {report['plan_hash'][:16]})"
    ]
    for t in report["tables"]:
        if t["op"] is None:
            lines.append(f"  {t['path']}: {t['note']}")
            continue
        lines.append(
            f"  {t['path']} ({t['op']}): {t['covered']:,} of {t['keys']:,} keys covered ({t['percent']:.1f}%), "
            f"{t['missing']:,} missing; the plan has {t['plan_keys']:,} keys"
        )
        agreement = t.get("dispatch")
        if agreement is not None and agreement["rows"] == 0:
            lines.append("      dispatch: no row of the table at a key the plan has")
        elif agreement is not None:
            lines.append(
                f"      dispatch names the table's kernel_source in {agreement['agreeing']:,} of "
                f"{agreement['rows']:,} rows at covered keys ({agreement['percent']:.1f}%)"
            )
            for d in agreement["disagreements"]:
                lines.append(
                    f"        plan {d['dispatch']} where the table has {d['kernel_source']}: {d['rows']:,} rows"
                )
        for p in t["patterns"]:
            example = f", e.g. {_key_text(p['examples'][0])}" if not p["columns"] and p["examples"] else ""
            lines.append(f"      {p['pattern']}: {_keys(p['keys'])}{example}")
        if t["patterns_left_off"]:
            shown = sum(p["keys"] for p in t["patterns"])
            lines.append(f"      ... {t['patterns_left_off']:,} more patterns: {_keys(t['missing'] - shown)}")
    return "\n".join(lines) + "\n"
