#!/usr/bin/env python3
"""Build an offline wheelhouse for running the fork on a GPU host that has no package registry.

    python -m deploy.wheelhouse --python 3.12 --exclude-from HOST_FREEZE [--split-mb 56] --out DIR

The set is the closure of the upstream sglang wheel's Requires-Dist for the target (CPython
version, manylinux up to the target's glibc), minus what HOST_FREEZE (`pip freeze` or `pip list`
of the target) already has at versions meeting every requirement, with the deliberate
decisions of the policy file applied (skips, version conflicts, slimmed wheels, edits) and
reported. Output: DIR/part-NN/ (each at most --split-mb MB = 10^6 bytes, with a copy of the
manifest and installer; a wheel larger than that travels as pieces that the installer joins),
DIR/manifest.json, DIR/install.sh, DIR/report.txt.
Run from the repository root (the fork's pin is read through forkbuild/). See docs/gpu-host.md
for moving the parts and installing.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from .wheelhouse_lib.compat import canonicalize_name
from .wheelhouse_lib.forkpin import ForkPinError, fork_requires, load_fork_pin
from .wheelhouse_lib.hostenv import HostListError, HostPackages, Target, load_host_list
from .wheelhouse_lib.output import OutputError, WheelEntry, check_out_dir, write_wheelhouse
from .wheelhouse_lib.pack import PackError
from .wheelhouse_lib.pipselect import PipError, PipSelector, sha256_of
from .wheelhouse_lib.policy import PolicyError, load_policy
from .wheelhouse_lib.report import decisions_from, format_report, unused_policy
from .wheelhouse_lib.resolve import Candidate, ResolveError, resolve
from .wheelhouse_lib.wheelfile import WheelError, pth_files, read_metadata, rewrite_wheel, verify_record

DEFAULT_POLICY = Path(__file__).resolve().parent / "wheelhouse-policy.toml"
DEFAULT_PIN = Path(__file__).resolve().parent.parent / "UPSTREAM.toml"
DEFAULT_CACHE = Path("~/.cache/sglang-sm120/wheels")


class UsageError(RuntimeError):
    pass


def shown(path: Path) -> str:
    """A path as the user would type it: relative to the current folder when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def log(msg: str) -> None:
    print(msg, flush=True)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", help="target CPython version, e.g. 3.12 (default: policy [target] python, else 3.12)")
    ap.add_argument("--glibc", help="target glibc, e.g. 2.39: manylinux tags up to it are accepted (default: policy, else 2.39)")
    ap.add_argument("--arch", help="target machine (default: policy, else x86_64)")
    ap.add_argument("--exclude-from", metavar="FILE", help="`pip freeze` / `pip list` output of the target")
    # 56 MB (53.4 MiB): a part plus the checkout's tracked files (2.9 MiB in disk blocks; the
    # records test caps them at 3 MB of bytes, under 4 MiB of blocks) stays under the 64 MiB one
    # GPU-host call carries, with ~6 MiB to spare; the largest wheel (xgrammar, 45 MB) fits whole.
    ap.add_argument("--split-mb", type=float, default=56.0,
                    help="largest part in MB (10^6 bytes); a larger wheel travels as pieces; default 56")
    ap.add_argument("--out", required=True, type=Path, help="output directory")
    ap.add_argument("--policy", type=Path, default=DEFAULT_POLICY, help=f"decisions file (default {DEFAULT_POLICY})")
    ap.add_argument("--fork-wheel", type=Path, help="ship this prebuilt fork wheel instead of the upstream wheel")
    ap.add_argument("--upstream-pin", type=Path, default=DEFAULT_PIN,
                    help=f"the fork's upstream pin, checked against the policy and applied (default {DEFAULT_PIN})")
    ap.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE, help=f"download cache (default {DEFAULT_CACHE})")
    ap.add_argument("--resolve-only", action="store_true", help="print the decisions and stop before downloading")
    args = ap.parse_args(argv)
    if not args.split_mb > 0:
        ap.error(f"--split-mb: must be positive, got {args.split_mb}")
    if args.fork_wheel is not None and not args.fork_wheel.is_file():
        ap.error(f"--fork-wheel: {args.fork_wheel} is not a file")
    return args


def root_candidate(args, policy, selector, pin) -> tuple[Candidate, str]:
    if pin is not None and (canonicalize_name(pin.package), pin.version) != (
            canonicalize_name(policy.upstream_name), policy.upstream_version):
        raise UsageError(f"policy [upstream] {policy.upstream_name} {policy.upstream_version} differs from "
                         f"{shown(Path(pin.source))} {pin.package} {pin.version}; make them agree")
    if args.fork_wheel is not None:
        name, version, requires = read_metadata(args.fork_wheel)
        if canonicalize_name(name) != canonicalize_name(policy.upstream_name):
            raise UsageError(f"--fork-wheel: {args.fork_wheel.name} is {name}, expected {policy.upstream_name}")
        return Candidate(name=name, version=version, requires_dist=requires, filename=args.fork_wheel.name,
                         url=args.fork_wheel.resolve().as_uri(), sha256=sha256_of(args.fork_wheel)), "fork"
    req = f"{policy.upstream_name}=={policy.upstream_version}"
    found = selector.select({canonicalize_name(policy.upstream_name): req})[canonicalize_name(policy.upstream_name)]
    if isinstance(found, str):
        raise UsageError(f"cannot find {req} for the target: {found}")
    if pin is not None:
        expected = pin.wheels.get(found.filename)
        if expected and found.sha256 and expected != found.sha256:
            raise UsageError(f"{found.filename}: the index's sha256 {found.sha256} differs from "
                             f"{shown(Path(pin.source))}'s {expected}")
        # Resolve what the fork build will declare, not plain upstream.
        found.requires_dist = fork_requires(found.requires_dist, pin)
    return found, "upstream"


def transform(entry: WheelEntry, policy, derived_dir: Path) -> dict | None:
    """Apply the policy's slim/edits to one wheel (cached by input hash + policy entries)."""
    key = canonicalize_name(entry.name)
    slim = policy.slim.get(key)
    edits = policy.edits_for(key)
    if slim is None and not edits:
        return None
    recipe = json.dumps({"src": entry.sha256, "slim": slim and list(slim.remove),
                         "edits": [(e.file, e.pattern, e.replacement, e.count) for e in edits]}, sort_keys=True)
    dst = derived_dir / hashlib.sha256(recipe.encode()).hexdigest()[:16] / entry.filename
    info_file = dst.with_name(dst.name + ".json")
    if dst.is_file() and info_file.is_file():
        verify_record(dst)
        change = json.loads(info_file.read_text())
        log(f"rewrite: {entry.filename} reused from {dst.parent}")
    else:
        log(f"rewrite: {entry.filename} ({'slim' if slim else ''}{' + ' if slim and edits else ''}{'edit' if edits else ''})")
        change = rewrite_wheel(entry.path, dst, slim=slim, edits=edits)
        info_file.write_text(json.dumps(change))
    before = entry.size
    modified = {
        "original_sha256": entry.sha256,
        "original_size": before,
        "removed_patterns": list(slim.remove) if slim else [],
        "removed_count": len(change["removed"]),
        "removed_bytes_unpacked": change["removed_bytes"],
        "edits": change["edited"],
    }
    if slim:
        modified["slim_reason"] = slim.reason
    entry.path = dst
    entry.sha256 = sha256_of(dst)
    entry.size = dst.stat().st_size
    entry.modified = modified
    return {"filename": entry.filename, "patterns": list(slim.remove) if slim else [],
            "removed_count": len(change["removed"]), "removed_bytes": change["removed_bytes"],
            "size_before": before, "size_after": entry.size, "slim_reason": slim.reason if slim else "",
            "edited": change["edited"]}


def run(argv=None) -> int:
    args = parse_args(argv)
    policy = load_policy(args.policy)
    target = Target(python=args.python or policy.target.get("python", "3.12"),
                    glibc=args.glibc or policy.target.get("glibc", "2.39"),
                    arch=args.arch or policy.target.get("arch", "x86_64"))
    host = load_host_list(args.exclude_from) if args.exclude_from else HostPackages(source="(none)")
    split_bytes = int(args.split_mb * 1_000_000)
    check_out_dir(args.out)
    cache_dir = args.cache_dir.expanduser()

    log(f"target: CPython {target.python}, {target.cp_tag}, manylinux up to glibc {target.glibc} {target.arch}; "
        f"{len(host)} packages on the target ({host.source})")
    pin = load_fork_pin(args.upstream_pin, policy.upstream_version)  # the base the policy targets
    selector = PipSelector(target, log=log)
    root, role = root_candidate(args, policy, selector, pin)
    if pin is not None and role == "upstream" and (pin.add or pin.remove):
        log(f"fork Requires-Dist changes from {shown(Path(pin.source))}: "
            + ", ".join([f"+{r}" for r in pin.add] + [f"-{r}" for r in pin.remove]))
    log(f"resolving the closure of {root.name} {root.version} ({role}) for the target")
    res = resolve(root, target, host, policy, selector, log=log)
    decisions = decisions_from(res, policy)
    shipped = {n.name for n in res.of_kind("ship")}
    unused = unused_policy(res, policy, shipped)
    header = [f"wheelhouse for {root.name} {root.version} ({role}); target CPython {target.python} "
              f"manylinux<=2.{target.glibc.split('.')[1]} {target.arch}; target packages from {host.source}; "
              f"policy {shown(args.policy)}"]
    bad = [d for d in decisions if d["action"] in ("missing", "undecided")]
    if bad or args.resolve_only:
        sys.stdout.write(format_report(res, decisions, [], unused, header))
        if bad:
            kinds = sorted({d["action"] for d in bad})
            raise UsageError(
                f"{len(bad)} package(s) {'/'.join(kinds)}: {', '.join(d['package'] for d in bad)}; "
                f"add a [skip] or [conflict.NAME] entry with a reason to {shown(args.policy)} (see the report above)")
        return 0

    ship = res.of_kind("ship")
    wanted = [n.candidate for n in ship] + ([root] if role == "upstream" else [])
    files = selector.download(wanted, cache_dir)
    entries: list[WheelEntry] = []
    for n in ship:
        c = n.candidate
        p = files[c.filename]
        entries.append(WheelEntry(name=c.name, version=c.version, filename=c.filename, path=p, sha256=sha256_of(p),
                                  size=p.stat().st_size, role="dependency",
                                  required_by=sorted({e.parent for e in n.edges})))
    root_path = files[root.filename] if role == "upstream" else args.fork_wheel
    entries.append(WheelEntry(name=root.name, version=root.version, filename=root.filename, path=root_path,
                              sha256=sha256_of(root_path), size=root_path.stat().st_size, role=role))
    if pin is not None and role == "upstream" and pin.wheels.get(root.filename) not in (None, entries[-1].sha256):
        raise UsageError(f"{root.filename}: sha256 {entries[-1].sha256} differs from {shown(Path(pin.source))}")
    transforms = [t for t in (transform(e, policy, cache_dir / "derived") for e in entries) if t]
    warnings = [f"{e.filename} has top-level {', '.join(pth)}: not processed when installed with --target + PYTHONPATH"
                for e in entries for pth in [pth_files(e.path)] if pth]

    meta = {
        "created_by": "deploy/wheelhouse.py",
        "root": {"name": root.name, "version": root.version, "role": role},
        "target": {"python": target.python, "glibc": target.glibc, "arch": target.arch,
                   "platforms": target.platforms(), "packages_from": host.source},
        "policy": shown(args.policy),
    }
    # The report names the parts, which exist only once write_wheelhouse has packed them.
    manifest, dir_sizes = write_wheelhouse(args.out, entries, split_bytes, meta, decisions, "")
    report = format_report(res, decisions, transforms, unused, header, manifest["parts"], warnings)
    (args.out / "report.txt").write_text(report)
    sys.stdout.write(report)
    total = sum(e.size for e in entries)
    pieced = [e.filename for e in entries if e.pieces]
    if pieced:
        log(f"{len(pieced)} wheel(s) larger than a part travel as pieces, joined at install: {', '.join(pieced)}")
    log(f"wrote {args.out}: {len(entries)} wheels, {total / 1e6:.1f} MB in {len(dir_sizes)} part(s), largest part "
        f"{max(dir_sizes.values()) / 1e6:.2f} MB (limit {split_bytes / 1e6:g} MB); pip calls: {selector.calls}")
    return 0


def main(argv=None) -> int:
    try:
        return run(argv)
    except (UsageError, PolicyError, ForkPinError, HostListError, ResolveError, PipError, WheelError, PackError, OutputError,
            ValueError) as e:
        print(f"wheelhouse: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
