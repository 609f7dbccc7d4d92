"""`opcollect build`, `base-image`, `contract` and `bump`: images, pins and the frameworks they hold."""

from __future__ import annotations

from pathlib import Path

from opcollect.cli.tables import add_verdict_flags, thresholds_of
from opcollect.errors import InputError


def _add_build(sub) -> None:
    p = sub.add_parser("build", help="build (or reuse) a backend's collector image through the Docker engine")
    p.add_argument("backend", nargs="?", help="torch, vllm, sglang or trtllm (with --prune: default every backend)")
    p.add_argument(
        "--prune",
        action="store_true",
        help="instead of building: remove the collector images no current pin or current input hash names",
    )
    p.add_argument("--pins", type=Path, help="pins file (default: pins.yaml of the checkout)")
    p.add_argument("--base-image", help="build on this image instead of the pin (a local image needs no digest)")
    p.add_argument("--version", help="one of the backend's pinned versions (default: its current pin)")
    p.add_argument("--no-cache", action="store_true", help="build every layer again, reusing nothing")
    p.add_argument("--root", type=Path, help="the opcollect checkout (default: the one this package is in)")
    p.set_defaults(func=cmd_build)


def check_pins(tree, pins: Path | None, backend: str | None = None, version: str | None = None) -> None:
    """Read the pins before planning or reaching the Docker engine: a broken pins.yaml, a backend it does not pin
    or a version it does not pin (the backend's current one when none is given) is named first."""
    from opcollect.images.pins import load_pins

    loaded = load_pins(pins or tree.pins)
    if backend is not None:
        loaded.pin(backend, version)


def cmd_build(args) -> int:
    from opcollect.images.build import build_image, prune_images
    from opcollect.project import find_project

    if args.prune:
        prune_images(find_project(args.root), [args.backend] if args.backend else None, args.pins)
        return 0
    if args.backend is None:
        raise InputError("build: name a backend (torch, vllm, sglang or trtllm), or pass --prune")
    check_pins(find_project(args.root), args.pins, args.backend, args.version)
    built = build_image(
        find_project(args.root), args.backend, args.pins, args.base_image, no_cache=args.no_cache, version=args.version
    )
    state = "cache hit" if built.cache_hit else "built"
    print(
        f"{built.tag} ({state} in {built.seconds:.1f} s; input hash {built.plan.input_hash[:12]}, "
        f"image {built.image_id[:19]})"
    )
    return 0


def _add_base_image(sub) -> None:
    p = sub.add_parser("base-image", help="build opcollect-local/torch-cpu without a registry (debootstrap)")
    p.add_argument("--force", action="store_true", help="rebuild it even if it exists")
    p.add_argument("--root", type=Path, help="the opcollect checkout (default: the one this package is in)")
    p.set_defaults(func=cmd_base_image)


def cmd_base_image(args) -> int:
    from opcollect.images.localbase import build_local_base
    from opcollect.project import find_project

    print(build_local_base(find_project(args.root), force=args.force))
    return 0


def _add_contract(sub) -> None:
    p = sub.add_parser(
        "contract", help="check the framework symbols a backend's runners use against its pinned release"
    )
    p.add_argument("backend", metavar="BACKEND", help="vllm, sglang or trtllm")
    p.add_argument(
        "--wheel", type=Path, action="append", default=[], help="a pinned wheel (pip download --no-deps); repeatable"
    )
    p.add_argument(
        "--source", type=Path, action="append", default=[], help="a directory of the release's packages; repeatable"
    )
    p.add_argument(
        "--image",
        nargs="?",
        const="",
        metavar="REF",
        help="copy the release out of a local image through the Docker engine (default: the pinned image)",
    )
    p.add_argument("--version", help="with --image and no REF: the pinned version whose image to read")
    p.add_argument("--pins", type=Path, help="pins file (default: pins.yaml of the checkout)")
    p.set_defaults(func=cmd_contract)


def cmd_contract(args) -> int:
    import tempfile

    from opcollect.backends.symbols import contract

    releases = [*args.wheel, *args.source]
    shown = [str(r) for r in releases]
    with tempfile.TemporaryDirectory(prefix="opcollect-contract-") as tmp:
        if args.image is not None:
            from opcollect.images.sources import image_release

            directory, ref = image_release(args.backend, args.image, args.version, args.pins, Path(tmp))
            releases.append(directory)
            shown.append(f"image {ref}")
        checked, misses, unchecked = contract(args.backend, releases, Path(__file__).resolve().parents[1] / "backends")
    if checked == 0 and not misses:
        raise InputError(
            f"contract {args.backend}: checked nothing: {', '.join(shown)} holds no {', '.join(unchecked)}; give the "
            "pinned release with --wheel PATH, --source DIR (the directory holding the package) or --image"
        )
    for miss in misses:
        print(miss.render())
    left = f"; not checked: {', '.join(unchecked)} (no release of it given)" if unchecked else ""
    print(f"contract {args.backend} against {', '.join(shown)}: {checked} uses checked, {len(misses)} missing{left}")
    return 1 if misses else 0


def _add_bump(sub) -> None:
    p = sub.add_parser("bump", help="move a backend's pin to a new framework version, with its report")
    p.add_argument("backend", metavar="BACKEND", help="torch, vllm, sglang or trtllm")
    p.add_argument("--version", required=True, help="the framework version to pin")
    p.add_argument("--image", metavar="REF@sha256:D", help="its image, by index digest")
    p.add_argument("--keep-old", action="store_true", help="keep the previous version's entry (TensorRT-LLM keeps two)")
    p.add_argument("--allow-downgrade", action="store_true", help="pin a version older than the current one")
    p.add_argument("--resolve", action="store_true", help="ask the registry for --image's (repo:tag) index digest")
    p.add_argument("--root", type=Path, help="the opcollect checkout (default: the one this package is in)")
    p.add_argument(
        "--moved",
        nargs="+",
        type=Path,
        metavar="TABLES",
        help="after the bump and a collection of the new version: add the rows that moved since the old version "
        "to the report (TABLES holding both versions, or OLD_TABLES NEW_TABLES)",
    )
    add_verdict_flags(p)
    p.set_defaults(func=cmd_bump)


def cmd_bump(args) -> int:
    from opcollect.images.bump import BumpRequest
    from opcollect.images.bump_report import apply_bump, apply_moved
    from opcollect.project import find_project

    if args.moved:
        if len(args.moved) > 2 or args.image:
            raise InputError("bump --moved: give TABLES or OLD_TABLES NEW_TABLES, and no --image (already pinned)")
        tree, thresholds = find_project(args.root), thresholds_of(args)
        section, path = apply_moved(tree, args.backend, args.version, *args.moved, thresholds=thresholds)
        print(section)
        print(f"wrote {path}")
        return 0
    if not args.image:
        raise InputError(f"bump {args.backend}: --image REF@sha256:D is required to move the pin")
    request = BumpRequest(args.backend, args.version, args.image, args.keep_old, args.allow_downgrade, args.resolve)
    tree = find_project(args.root)
    text, path = apply_bump(tree, request)
    print(text)
    print(f"wrote {tree.pins} and {path}")
    return 0


def add(sub) -> None:
    _add_build(sub)
    _add_base_image(sub)
    _add_contract(sub)
    _add_bump(sub)
