"""Source trees of upstream + series, for checking the series and for editing patches."""
from __future__ import annotations

from pathlib import Path

from .anchors import check_anchors, member_reader
from .build import patched_members, read_upstream
from .config import REPO, load_pin, running_python_tag
from .errors import BuildError, log
from .overlay import check_shadow, list_overlay
from .patches import load_series, read_series
from .upstream import fetch_pinned


def pinned_upstream():
    return read_upstream(fetch_pinned(load_pin(), running_python_tag())[0])


def check() -> None:
    pin = load_pin()
    patches = load_series(pin.patch_dir)
    members = pinned_upstream()
    patched = patched_members(members, patches)
    check_shadow(list_overlay(REPO / "python"), members)
    n = check_anchors(REPO, member_reader(members, patched), pin.version)
    log(f"base {pin.version}: series of {len(patches)} patch(es) applies strictly; overlay shadows nothing "
        f"upstream; all {n} upstream anchors present")


def write_tree(out: Path, upto: str | None = None) -> None:
    """out/python/sglang/... = upstream's package with the series (up to `upto`) applied."""
    patch_dir = load_pin().patch_dir
    names = read_series(patch_dir)
    if upto is not None:
        if upto not in names:
            raise BuildError(f"--upto {upto}: not in {patch_dir.name}/series")
        names = names[: names.index(upto) + 1]
    patches = [p for p in load_series(patch_dir) if p.name in names]
    if out.exists() and any(out.iterdir()):
        raise BuildError(f"{out}: exists and is not empty")
    members = pinned_upstream()
    for name, text in patched_members(members, patches).items():
        members[name].data = text.encode()
    for name, m in members.items():
        if name.startswith("sglang/"):
            dest = out / "python" / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(m.data)
    log(f"wrote {out}/python/sglang with {len(patches)} patch(es) applied")
