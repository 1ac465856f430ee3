#!/usr/bin/env python3
"""Rebase a base's patch series onto another upstream sglang release.

    python -m tools.rebase --from 0.5.16 --onto 0.5.23 --out DIR     (from the repository root)

--from names a base in UPSTREAM.toml (default: $SGLANG_SM120_BASE, else the default base); its
series is patches/<from>/. --onto may be another pinned base (its wheel is hash-checked) or any
release on the index. Writes DIR/patches/ (series + refreshed patches; conflicting ones commented out in the series
and kept unrefreshed), DIR/report.json and DIR/report.md; with --keep-merged also
DIR/conflicts/ (the merged files with conflict markers, to resolve by hand). `--onto` the --from version is the identity.
Upstream wheels are cached (SGLANG_SM120_CACHE), never committed.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from forkbuild.anchors import load_api
from forkbuild.build import read_upstream, source_reader
from forkbuild.config import bases, load_pin, running_python_tag
from forkbuild.errors import BuildError, log
from forkbuild.patches import load_series
from forkbuild.rebase import CLEAN, CONFLICT, MERGED, rebase_series
from forkbuild.upstream import _index_files, cache_dir, fetch_pinned, fetch_wheel, sha256_of

REPO = Path(__file__).resolve().parent.parent


def upstream_wheel(version: str, pin, given: str | None) -> Path:
    if given:
        p = Path(given)
        if not p.is_file():
            raise BuildError(f"{given}: no such wheel")
        return p
    tag = running_python_tag()
    if version in bases():
        return fetch_pinned(load_pin(base=version), tag)[0]
    prefix = f"{pin.package}-{version}-{tag}-{tag}-"
    cached = sorted(cache_dir().glob(prefix + "*x86_64.whl"))
    if cached:
        return cached[0]
    try:
        names = [n for n in _index_files(pin.index, pin.package) if n.startswith(prefix) and n.endswith("x86_64.whl")]
    except OSError as e:
        raise BuildError(f"cannot list {pin.package} on {pin.index} ({e}); pass --onto-wheel PATH") from None
    if not names:
        raise BuildError(f"{pin.package} {version} has no {tag} x86_64 wheel on {pin.index}")
    return fetch_wheel(sorted(names)[0], pin.package, pin.index, None)[0]


def anchor_status(read_new, from_base: str, onto: str) -> dict[str, str]:
    """Each upstream anchor on the new release: its declaration for `onto` when upstream_api.py
    has that base, else the --from base's declaration (does it still hold there?)."""
    api = load_api(REPO)
    return api.status(read_new, onto if onto in api.BASES else from_base)


def write_outputs(out: Path, outcomes, base: dict, onto: dict, keep_merged: bool,
                  series_dir: Path, anchors: dict[str, str] | None = None) -> dict:
    pdir = out / "patches"
    if pdir.exists():
        shutil.rmtree(pdir)
    pdir.mkdir(parents=True)
    conflicted = set()
    for o in outcomes:
        if o.status == CONFLICT:
            conflicted.add(o.name)
            shutil.copy(series_dir / o.name, pdir / o.name)
            for f, text in o.merged_files.items() if keep_merged else ():
                dest = out / "conflicts" / o.name / f
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_text(text)
        else:
            (pdir / o.name).write_text(o.text)
    # The series file is kept as it is (comments too) so that a rebase onto the same release is
    # the identity; a conflicting patch is commented out, never dropped silently.
    lines = (series_dir / "series").read_text().splitlines(keepends=True)
    (pdir / "series").write_text("".join(
        f"# CONFLICT (see report.md): {l}" if l.strip() in conflicted else l for l in lines
    ))
    counts = {s: sum(o.status == s for o in outcomes) for s in (CLEAN, MERGED, CONFLICT)}
    anchors = anchors or {}
    anchor_counts = {k: sum(v.startswith(k) for v in anchors.values()) for k in ("ok", "absent", "MISSING")}
    report = {
        "base": base, "onto": onto, "summary": counts, "anchor_summary": anchor_counts, "anchors": anchors,
        "patches": [{"name": o.name, "status": o.status, "files": o.files, "conflicts": o.conflicts} for o in outcomes],
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    md = [
        f"# Rebase of the series: {base['package']} {base['version']} -> {onto['version']}", "",
        f"Base wheel `{base['wheel']}` (sha256 `{base['sha256']}`); onto `{onto['wheel']}` (sha256 `{onto['sha256']}`).", "",
        f"Summary: {counts[CLEAN]} clean, {counts[MERGED]} merged, {counts[CONFLICT]} conflict; upstream anchors "
        f"(sglang/sm120/upstream_api.py): {anchor_counts['ok']} ok, {anchor_counts['absent']} declared absent, "
        f"{anchor_counts['MISSING']} missing.", "",
        "| patch | status | files | conflicts |", "|---|---|---|---|",
    ]
    for o in outcomes:
        conf = "; ".join(f"{c['file']} {c['hunk']}" + (f" (merged lines {c['lines']})" if "lines" in c else "")
                         for c in o.conflicts) or "-"
        md.append(f"| {o.name} | {o.status} | {', '.join(o.files)} | {conf} |")
    if anchors:
        md += ["", f"## Upstream anchors on {onto['version']}", "", "| anchor | status |", "|---|---|"]
        md += [f"| {name} | {st} |" for name, st in anchors.items()]
    (out / "report.md").write_text("\n".join(md) + "\n")
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="base", help="base whose series to rebase (default: $SGLANG_SM120_BASE, "
                    "else UPSTREAM.toml's default)")
    ap.add_argument("--onto", required=True, help="upstream version to rebase onto, e.g. 0.5.23")
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--onto-wheel", help="use this wheel as the new upstream (offline)")
    ap.add_argument("--base-wheel", help="use this wheel as the old upstream instead of the pinned one")
    ap.add_argument("--keep-merged", action="store_true",
                    help="write each conflicting file, merged with conflict markers, under DIR/conflicts/ "
                    "(upstream text: keep it out of commits)")
    a = ap.parse_args(argv)
    try:
        pin = load_pin(base=a.base)
        patches = load_series(pin.patch_dir)
        old_wheel = upstream_wheel(pin.version, pin, a.base_wheel)
        new_wheel = upstream_wheel(a.onto, pin, a.onto_wheel)
        log(f"rebasing {len(patches)} patch(es): {old_wheel.name} -> {new_wheel.name}")
        read_new = source_reader(read_upstream(new_wheel))
        outcomes = rebase_series(patches, source_reader(read_upstream(old_wheel)), read_new)
        anchors = anchor_status(read_new, pin.version, a.onto)
        desc = lambda v, w: {"package": pin.package, "version": v, "wheel": w.name, "sha256": sha256_of(w)}
        report = write_outputs(Path(a.out), outcomes, desc(pin.version, old_wheel), desc(a.onto, new_wheel), a.keep_merged,
                               pin.patch_dir, anchors)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for p in report["patches"]:
        log(f"  {p['status']:8s} {p['name']}")
    s = report["anchor_summary"]
    log(f"anchors on {a.onto}: {s['ok']} ok, {s['absent']} declared absent, {s['MISSING']} missing")
    log(f"report: {Path(a.out) / 'report.md'}")
    return 2 if report["summary"][CONFLICT] else 0


if __name__ == "__main__":
    sys.exit(main())
