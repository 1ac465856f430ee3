"""Three-way rebase of the patch series onto another upstream release.

For each patch, in order, and each file it touches:
  base  = old upstream + earlier patches        (what the patch was written against)
  other = base + this patch                      (what the patch wants)
  ours  = new upstream + earlier refreshed patches
If the patch applies strictly to `ours` it is *clean* and kept byte for byte. Otherwise
`git merge-file ours base other` decides: no conflict -> *merged* and the patch is rewritten
against `ours`; any conflict -> *conflict*, reported by file and hunk, never written as merged.
"""
from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass, field

from .errors import BuildError
from .patches import FileDiff, Patch, apply_file, file_diff, parse_patch, render

CLEAN, MERGED, CONFLICT = "clean", "merged", "conflict"


@dataclass
class Outcome:
    name: str
    status: str
    files: list[str]
    text: str | None  # refreshed patch text (None on conflict)
    conflicts: list[dict] = field(default_factory=list)
    merged_files: dict[str, str] = field(default_factory=dict)  # with conflict markers, for hand fixing


def merge_file(ours: str, base: str, other: str) -> tuple[str, int]:
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for tag, text in (("ours", ours), ("base", base), ("other", other)):
            p = os.path.join(d, tag)
            with open(p, "w") as f:
                f.write(text)
            paths.append(p)
        r = subprocess.run(
            ["git", "merge-file", "-p", "-L", "new-upstream", "-L", "old-upstream", "-L", "patch", *paths],
            capture_output=True, text=True,
        )
    if r.returncode < 0 or r.returncode > 127:
        raise BuildError(f"git merge-file failed: {r.stderr.strip()}")
    return r.stdout, r.returncode


def _conflict_regions(merged: str) -> list[tuple[int, int]]:
    regions, start = [], None
    for n, line in enumerate(merged.splitlines(), 1):
        if line.startswith("<<<<<<< "):
            start = n
        elif line.startswith(">>>>>>> ") and start is not None:
            regions.append((start, n))
            start = None
    return regions


def _failing_hunks(fd: FileDiff, text: str) -> list[str]:
    """Hunks whose removed/context lines no longer appear verbatim in the new upstream file."""
    return [h.header for h in fd.hunks if "".join(h.old_lines()) not in text]


def rebase_series(patches: list[Patch], read_old, read_new) -> list[Outcome]:
    """read_old/read_new: source path -> text or None."""
    old_state: dict[str, str] = {}
    new_state: dict[str, str] = {}
    outcomes = []
    for p in patches:
        files = [fd.path for fd in p.files]
        base = {f: old_state[f] if f in old_state else read_old(f) for f in files}
        if any(v is None for v in base.values()):
            raise BuildError(f"patch {p.name}: touches a file the old upstream lacks")
        other = {fd.path: apply_file(p, fd, base[fd.path]) for fd in p.files}
        ours = {f: new_state[f] if f in new_state else read_new(f) for f in files}
        old_state.update(other)

        missing = [f for f, t in ours.items() if t is None]
        if missing:
            outcomes.append(Outcome(p.name, CONFLICT, files, None, [
                {"file": f, "hunk": "(whole file)", "reason": "file no longer exists upstream"} for f in missing
            ]))
            continue
        try:
            applied = {fd.path: apply_file(p, fd, ours[fd.path]) for fd in p.files}
            outcomes.append(Outcome(p.name, CLEAN, files, p.preamble + p.raw_body))
            new_state.update(applied)
            continue
        except BuildError:
            pass
        merged, conflicts, marked = {}, [], {}
        for fd in p.files:
            text, n = merge_file(ours[fd.path], base[fd.path], other[fd.path])
            if n:
                marked[fd.path] = text
                regions = ", ".join(f"{a}-{b}" for a, b in _conflict_regions(text))
                failing = _failing_hunks(fd, ours[fd.path])
                for h in failing or ["(all hunks' context present; upstream changed lines next to them)"]:
                    conflicts.append({
                        "file": fd.path, "hunk": h, "lines": regions,
                        "reason": "upstream changed the lines this hunk changes" if failing
                        else "upstream edits adjacent to the patch",
                    })
            else:
                merged[fd.path] = text
        if conflicts:
            outcomes.append(Outcome(p.name, CONFLICT, files, None, conflicts, marked))
            continue
        diffs = [file_diff(f, ours[f], merged[f]) for f in files if merged[f] != ours[f]]
        text = render(p.preamble, diffs)
        refreshed = parse_patch(p.name, text)  # must apply strictly to the new base
        for fd in refreshed.files:
            apply_file(refreshed, fd, ours[fd.path])
        outcomes.append(Outcome(p.name, MERGED, files, text))
        new_state.update(merged)
    return outcomes

