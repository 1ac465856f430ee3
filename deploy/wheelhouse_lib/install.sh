#!/usr/bin/env bash
# Offline installer of a wheelhouse built by deploy/wheelhouse.py (copied next to manifest.json).
#
#   install.sh [TARGET]              verify every wheel, then install dependencies and the
#                                    sglang wheel (the fork if present, else upstream) into
#                                    TARGET (default /tmp/site) with pip --no-index --no-deps
#   install.sh --deps-only [TARGET]  same, without any sglang wheel (the fork is built later)
#   install.sh --verify-only [--part part-NN]   check sha256 of all wheels (or one part's)
#   install.sh --status              which parts are present next to this script
#   install.sh --print-wheel ROLE    path of the verified wheel with role upstream|fork
#   install.sh --has-role ROLE       exit 0 if the manifest has a wheel with that role
#
# Wheels are looked up as DIR/part-NN/FILE, DIR being this script's directory. Needs python3
# with pip (PYTHON=... to choose the interpreter). Any missing part or hash mismatch refuses.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PIP_ROOT_USER_ACTION=ignore  # quiet pip's root warning; older pips ignore the variable
exec "${PYTHON:-python3}" - "$HERE" "$@" <<'PYEOF'
import argparse, hashlib, json, subprocess, sys
from pathlib import Path

here = Path(sys.argv[1])
ap = argparse.ArgumentParser(prog="install.sh", description="verify and install an offline wheelhouse")
mode = ap.add_mutually_exclusive_group()
mode.add_argument("--deps-only", action="store_true")
mode.add_argument("--verify-only", action="store_true")
mode.add_argument("--status", action="store_true")
mode.add_argument("--print-wheel", metavar="ROLE")
mode.add_argument("--has-role", metavar="ROLE")
ap.add_argument("--part")
ap.add_argument("target", nargs="?", default="/tmp/site")
args = ap.parse_args(sys.argv[2:])


def die(msg):
    print(f"install.sh: error: {msg}", file=sys.stderr)
    sys.exit(1)


mpath = here / "manifest.json"
if not mpath.is_file():
    die(f"no manifest.json in {here}; run install.sh from a wheelhouse directory")
try:
    manifest = json.loads(mpath.read_text())
    wheels = manifest["wheels"]
    parts = manifest["parts"]
except (ValueError, KeyError) as e:
    die(f"{mpath} is not a wheelhouse manifest ({e})")

if args.has_role:
    sys.exit(0 if any(w["role"] == args.has_role for w in wheels) else 1)

if args.status:
    for name in sorted(parts):
        ws = [w for w in wheels if w["part"] == name]
        have = sum((here / name / w["filename"]).is_file() for w in ws)
        state = "present" if have == len(ws) else ("missing" if have == 0 else f"incomplete ({have}/{len(ws)} wheels)")
        print(f"{name}: {state}, {len(ws)} wheels, {parts[name]['bytes'] / 1e6:.1f} MB")
    sys.exit(0)

if args.part and args.part not in parts:
    die(f"--part {args.part}: not in the manifest (parts: {', '.join(sorted(parts))})")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify(selected):
    missing = {}
    for w in selected:
        if not (here / w["part"] / w["filename"]).is_file():
            missing.setdefault(w["part"], []).append(w["filename"])
    if missing:
        part, files = sorted(missing.items())[0]
        more = f" (and {len(missing) - 1} more part(s))" if len(missing) > 1 else ""
        die(f"{part} is missing or incomplete: {len(files)} wheel(s) absent, e.g. {files[0]}; "
            f"copy {part}/ into {here}{more}")
    for w in selected:
        path = here / w["part"] / w["filename"]
        got = sha256(path)
        if got != w["sha256"]:
            die(f"sha256 mismatch for {w['part']}/{w['filename']}: expected {w['sha256']}, got {got}; "
                f"copy {w['part']}/ again")
    return [here / w["part"] / w["filename"] for w in selected]


if args.verify_only:
    selected = [w for w in wheels if not args.part or w["part"] == args.part]
    verify(selected)
    print(f"verified {len(selected)} wheel(s)" + (f" of {args.part}" if args.part else f" in {len(parts)} part(s)"))
    sys.exit(0)

if args.print_wheel:
    selected = [w for w in wheels if w["role"] == args.print_wheel]
    if len(selected) != 1:
        die(f"--print-wheel {args.print_wheel}: the manifest has {len(selected)} wheel(s) with that role")
    print(verify(selected)[0])
    sys.exit(0)

verify(wheels)  # all parts, before touching the target
has_fork = any(w["role"] == "fork" for w in wheels)
install = [w for w in wheels if w["role"] == "dependency"
           or (not args.deps_only and w["role"] == ("fork" if has_fork else "upstream"))]
paths = [here / w["part"] / w["filename"] for w in install]
print(f"installing {len(paths)} wheel(s) into {args.target} (pip --no-index --no-deps)", flush=True)
cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--upgrade",
       "--disable-pip-version-check", "--quiet", "--target", args.target, *map(str, paths)]
rc = subprocess.call(cmd)
if rc != 0:
    die(f"pip install into {args.target} failed (exit {rc})")
print(f"installed {len(paths)} wheel(s); use them with: export PYTHONPATH={args.target}")
PYEOF
