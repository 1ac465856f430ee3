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
# Wheels are looked up as DIR/part-NN/FILE, DIR being this script's directory; a wheel larger
# than a part comes as pieces (part-NN/FILE.piece-I-of-N), each checked, then joined into
# DIR/joined/FILE and checked whole. Needs python3 with pip (PYTHON=... to choose the
# interpreter). Any missing part or hash mismatch refuses.
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


def files_of(w):
    """(part, file, sha256) of what travels for wheel w: the wheel itself, or its pieces."""
    if w.get("pieces"):
        return [(p["part"], p["file"], p["sha256"]) for p in w["pieces"]]
    return [(w["part"], w["filename"], w["sha256"])]


travelling = [f for w in wheels for f in files_of(w)]

if args.status:
    for name in sorted(parts):
        fs = [f for f in travelling if f[0] == name]
        have = sum((here / name / f[1]).is_file() for f in fs)
        state = "present" if have == len(fs) else ("missing" if have == 0 else f"incomplete ({have}/{len(fs)} files)")
        print(f"{name}: {state}, {len(fs)} files, {parts[name]['bytes'] / 1e6:.1f} MB")
    sys.exit(0)

if args.part and args.part not in parts:
    die(f"--part {args.part}: not in the manifest (parts: {', '.join(sorted(parts))})")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_files(files):
    missing = {}
    for part, name, _ in files:
        if not (here / part / name).is_file():
            missing.setdefault(part, []).append(name)
    if missing:
        part, names = sorted(missing.items())[0]
        more = f" (and {len(missing) - 1} more part(s))" if len(missing) > 1 else ""
        die(f"{part} is missing or incomplete: {len(names)} file(s) absent, e.g. {names[0]}; "
            f"copy {part}/ into {here}{more}")
    for part, name, want in files:
        got = sha256(here / part / name)
        if got != want:
            die(f"sha256 mismatch for {part}/{name}: expected {want}, got {got}; copy {part}/ again")


def joined(w):
    """The wheel w joined from its checked pieces into here/joined/, checked whole."""
    path = here / "joined" / w["filename"]
    if not (path.is_file() and sha256(path) == w["sha256"]):
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as out:
            for part, name, _ in files_of(w):
                out.write((here / part / name).read_bytes())
        got = sha256(tmp)
        if got != w["sha256"]:
            tmp.unlink()
            die(f"{w['filename']} joined from its pieces has sha256 {got}, expected {w['sha256']}")
        tmp.replace(path)
    return path


def verify(selected):
    verify_files([f for w in selected for f in files_of(w)])
    return [joined(w) if w.get("pieces") else here / w["part"] / w["filename"] for w in selected]


if args.verify_only:
    files = [f for f in travelling if not args.part or f[0] == args.part]
    verify_files(files)
    print(f"verified {len(files)} file(s)" + (f" of {args.part}" if args.part else f" in {len(parts)} part(s)"))
    sys.exit(0)

if args.print_wheel:
    selected = [w for w in wheels if w["role"] == args.print_wheel]
    if len(selected) != 1:
        die(f"--print-wheel {args.print_wheel}: the manifest has {len(selected)} wheel(s) with that role")
    print(verify(selected)[0])
    sys.exit(0)

path_of = dict(zip((w["filename"] for w in wheels), verify(wheels)))  # all parts, before touching the target
has_fork = any(w["role"] == "fork" for w in wheels)
install = [w for w in wheels if w["role"] == "dependency"
           or (not args.deps_only and w["role"] == ("fork" if has_fork else "upstream"))]
paths = [path_of[w["filename"]] for w in install]
print(f"installing {len(paths)} wheel(s) into {args.target} (pip --no-index --no-deps)", flush=True)
cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--upgrade",
       "--disable-pip-version-check", "--quiet", "--target", args.target, *map(str, paths)]
rc = subprocess.call(cmd)
if rc != 0:
    die(f"pip install into {args.target} failed (exit {rc})")
print(f"installed {len(paths)} wheel(s); use them with: export PYTHONPATH={args.target}")
PYEOF
