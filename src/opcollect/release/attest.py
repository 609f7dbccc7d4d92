"""The in-toto Statement v1 with an SLSA provenance v1 predicate written beside the data wheel.

Subjects: the wheel, the sdist and every file of the TABLES tree, each with its sha256. The predicate records
what the tables were made from, read from each version directory's provenance record (.opcollect/
provenance.yaml): collector hashes and refs, plan and case-plan hashes, images and their digests, and the
pins the release was cut against. No wall-clock time goes in: the statement is as reproducible as the wheel.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath

from opcollect.files import write_atomic
from opcollect.tables.verify import MANIFEST, listed_files, sha256_file
from opcollect.yamlio import read_yaml

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "https://opcollect.dev/release/v1"
PROVENANCE = ".opcollect/provenance.yaml"
_TREE_FIX = "restore the tree from a backup, or merge the runs into a new TABLES"


def provenance_facts(tables: Path) -> dict:
    """Collector hashes and refs, plan hashes, images (ref -> digest) over every provenance record."""
    collectors, refs, plans, case_plans, images = set(), set(), set(), set(), {}
    for rel in listed_files(tables):
        if not rel.endswith(PROVENANCE):
            continue
        record = read_yaml(tables / rel, "provenance record", _TREE_FIX, tree=tables)
        for table in record.get("tables", {}).values():
            collectors.add(table["collector_hash"])
            refs.add(table["collector_ref"])
            case_plans.add(table["case_plan_hash"])
            for event in table.get("events", []):
                plans.add(event["plan_hash"])
                if event.get("image"):
                    images[event["image"]] = event.get("image_digest")
    return {
        "collector_hashes": sorted(collectors),
        "collector_refs": sorted(refs),
        "plan_hashes": sorted(plans),
        "case_plan_hashes": sorted(case_plans),
        "images": dict(sorted(images.items())),
    }


def statement(tables: Path, artifacts: list[Path], version: str, epoch: int, pins: dict, builder: str) -> dict:
    subjects = [{"name": a.name, "digest": {"sha256": sha256_file(a)}} for a in artifacts]
    subjects += [
        {"name": f"tables/{rel}", "digest": {"sha256": sha256_file(tables / rel, tables)}}  # never through a link
        for rel in [*listed_files(tables), MANIFEST]
    ]
    facts = provenance_facts(tables)
    dependencies = [
        {"uri": f"docker://{image}", "digest": {"sha256": digest.split(":", 1)[1]}}
        for image, digest in facts["images"].items()
        if digest and digest.startswith("sha256:")
    ]
    when = datetime.fromtimestamp(epoch, tz=timezone.utc).isoformat().replace("+00:00", "Z")
    return {
        "_type": STATEMENT_TYPE,
        "subject": subjects,
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {"tables": PurePosixPath(tables.name).as_posix(), "version": version},
                "internalParameters": {"source_date_epoch": epoch, "pins": pins, **facts},
                "resolvedDependencies": dependencies,
            },
            "runDetails": {
                "builder": {"id": builder},
                "metadata": {"invocationId": f"opcollect-release-{version}", "startedOn": when, "finishedOn": when},
            },
        },
    }


def write_statement(path: Path, data: dict) -> None:
    write_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n")
