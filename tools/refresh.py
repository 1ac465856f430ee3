#!/usr/bin/env python3
"""Edit the patch series through a real source tree.

    python -m tools.refresh checkout DIR [--upto NAME]   DIR/python/sglang = upstream + series (up to NAME)
    python -m tools.refresh update NAME --tree DIR       rewrite patch NAME from the edited DIR
    python -m tools.refresh new NAME --tree DIR --subject S --why W --how H \
        --upstream-status U --drop-when D                append a new patch from the edited DIR

`update` expects DIR checked out with --upto NAME; `new` expects the whole series applied.
The series edited is the base's (patches/<version>/, SGLANG_SM120_BASE picks the base).
Headers are kept verbatim on update; the rest of the series must still apply strictly.
Run from the repository root (forkbuild/ is imported from there).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from forkbuild.build import patched_members
from forkbuild.config import load_pin
from forkbuild.errors import BuildError, log
from forkbuild.patches import (
    file_diff, load_series, new_preamble, parse_patch, read_series, render,
)
from forkbuild.tree import pinned_upstream, write_tree

REPO = Path(__file__).resolve().parent.parent


def diff_tree(base: dict[str, str], tree: Path, upstream_names: set[str]) -> list[str]:
    """Diffs of every upstream file that DIR changes relative to `base` (member -> text)."""
    root = tree / "python" / "sglang"
    if not root.is_dir():
        raise BuildError(f"{tree}: no python/sglang inside (make it with 'checkout')")
    on_disk = {
        "sglang/" + p.relative_to(root).as_posix()
        for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }
    wanted = {n for n in upstream_names if n.startswith("sglang/")}
    if extra := sorted(on_disk - wanted):
        raise BuildError(f"{tree}: new file python/{extra[0]}: new modules belong in the overlay, not a patch")
    if gone := sorted(wanted - on_disk):
        raise BuildError(f"{tree}: python/{gone[0]} was deleted: patches may only change upstream files")
    diffs = []
    for name in sorted(wanted):
        new = (tree / "python" / name).read_bytes()
        if new == base[name]:
            continue
        try:
            diffs.append(file_diff("python/" + name, base[name].decode(), new.decode()))
        except UnicodeDecodeError:
            raise BuildError(f"{tree}: python/{name} is binary: patches carry text changes only") from None
    return diffs


def base_texts(members, patches) -> dict[str, bytes]:
    """Member name -> bytes of upstream with `patches` applied."""
    data = {n: m.data for n, m in members.items() if n.startswith("sglang/")}
    data.update({n: t.encode() for n, t in patched_members(members, patches).items()})
    return data


def verify_series(members, patches) -> None:
    patched_members(members, patches)


def cmd_update(name: str, tree: Path, patch_dir: Path) -> None:
    names = read_series(patch_dir)
    if name not in names:
        raise BuildError(f"{name}: not in {patch_dir.name}/series")
    series = load_series(patch_dir)
    idx = names.index(name)
    members = pinned_upstream()
    diffs = diff_tree(base_texts(members, series[:idx]), tree, set(members))
    if not diffs:
        raise BuildError(f"{tree}: no changes against the series before {name}: nothing to write")
    text = render(series[idx].preamble, diffs)
    series[idx] = parse_patch(name, text)
    verify_series(members, series)
    (patch_dir / name).write_text(text)
    log(f"rewrote {patch_dir.relative_to(REPO)}/{name} ({len(diffs)} file(s)); the series still applies strictly")


def cmd_new(name: str, tree: Path, fields: dict[str, str], patch_dir: Path) -> None:
    if not name.endswith(".patch") or "/" in name:
        raise BuildError(f"{name}: patch names look like NNNN-what-it-does.patch")
    if (patch_dir / name).exists():
        raise BuildError(f"{patch_dir.relative_to(REPO)}/{name} exists: use 'update'")
    series = load_series(patch_dir)
    members = pinned_upstream()
    diffs = diff_tree(base_texts(members, series), tree, set(members))
    if not diffs:
        raise BuildError(f"{tree}: no changes against the current series: nothing to write")
    text = render(new_preamble(fields), diffs)
    verify_series(members, series + [parse_patch(name, text)])
    (patch_dir / name).write_text(text)
    series_text = (patch_dir / "series").read_text()
    sep = "" if series_text.endswith("\n") or not series_text else "\n"
    (patch_dir / "series").write_text(series_text + sep + name + "\n")
    log(f"added {patch_dir.relative_to(REPO)}/{name} ({len(diffs)} file(s)) to the end of its series")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("checkout")
    c.add_argument("dir")
    c.add_argument("--upto")
    u = sub.add_parser("update")
    u.add_argument("name")
    u.add_argument("--tree", required=True)
    n = sub.add_parser("new")
    n.add_argument("name")
    n.add_argument("--tree", required=True)
    for flag in ("subject", "why", "how", "upstream-status", "drop-when"):
        n.add_argument(f"--{flag}", required=True)
    a = ap.parse_args(argv)
    try:
        patch_dir = load_pin().patch_dir
        if a.cmd == "checkout":
            write_tree(Path(a.dir), upto=a.upto)
        elif a.cmd == "update":
            cmd_update(a.name, Path(a.tree), patch_dir)
        else:
            cmd_new(a.name, Path(a.tree), {
                "Subject": a.subject, "Why": a.why, "How": a.how,
                "Upstream status": a.upstream_status, "Drop when": a.drop_when,
            }, patch_dir)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
