"""sglang-sm120 build: PEP 517 backend (`pip install .`, `pip wheel .`) and a small CLI.

    python setup.py wheel [--out DIR] [--python 3.12]   build the fork wheel
    python setup.py check                               apply the series + overlay checks only
    python setup.py tree DIR [--upto PATCH]             write upstream + series as a source tree

The real work lives in forkbuild/; this file only adapts it to its two front doors.
"""
from __future__ import annotations

import argparse
import sys
import tarfile
from pathlib import Path

if sys.version_info < (3, 11):
    print(f"error: Python {sys.version_info[0]}.{sys.version_info[1]} is not supported: "
          "the sglang-sm120 build needs CPython 3.11, 3.12 or 3.13", file=sys.stderr)
    raise SystemExit(1)

# forkbuild/ sits beside this file: `python setup.py` has this folder on sys.path, and PEP 517
# builds get it from pyproject.toml's backend-path.
from forkbuild.errors import BuildError  # noqa: E402


def _fail(e: BuildError):
    print(f"error: {e}", file=sys.stderr, flush=True)
    raise SystemExit(1)


# --- PEP 517 hooks ----------------------------------------------------------------------------
def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    from forkbuild.build import build_wheel as build

    try:
        return build(Path(wheel_directory)).name
    except BuildError as e:
        _fail(e)


def build_sdist(sdist_directory, config_settings=None):
    from forkbuild.config import load_pin
    from forkbuild.sdist import source_files

    root = Path(__file__).resolve().parent
    name = f"sglang-{load_pin().fork_version}"
    out = Path(sdist_directory) / f"{name}.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        for rel in source_files(root):
            tar.add(root / rel, arcname=f"{name}/{rel}")
    return out.name


# --- CLI --------------------------------------------------------------------------------------
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="setup.py", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("wheel", help="build the fork wheel")
    w.add_argument("--out", default="dist", help="output folder (default: dist)")
    w.add_argument("--python", help="target CPython version, e.g. 3.12 (default: this interpreter)")
    sub.add_parser("check", help="apply the series and check the overlay, write nothing")
    t = sub.add_parser("tree", help="write upstream + series as a python/sglang/... source tree")
    t.add_argument("dir")
    t.add_argument("--upto", help="apply the series up to and including this patch")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "wheel":
            from forkbuild.build import build_wheel as build

            tag = "cp" + args.python.replace(".", "") if args.python else None
            print(build(Path(args.out), python_tag=tag))
        elif args.cmd == "check":
            from forkbuild.tree import check

            check()
        else:
            from forkbuild.tree import write_tree

            write_tree(Path(args.dir), upto=args.upto)
    except BuildError as e:
        _fail(e)


if __name__ == "__main__":
    main()
