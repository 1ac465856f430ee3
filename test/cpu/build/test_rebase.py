"""Rebase: identity onto the pinned release; conflicts reported and never silently merged."""
import json
import subprocess
import sys

import pytest

from buildenv import REPO, load_pin, series_dir
from forkbuild.errors import BuildError
from forkbuild.patches import file_diff, new_preamble, parse_patch
from forkbuild.rebase import CLEAN, CONFLICT, MERGED, rebase_series

FIELDS = {"Subject": "s", "Why": "w", "How": "h", "Upstream status": "not sent", "Drop when": "d"}
PATH = "python/sglang/mod.py"
OLD = "".join(f"line {i}\n" for i in range(1, 41))


def make_patch(name, old, new, path=PATH):
    return parse_patch(name, new_preamble(FIELDS) + file_diff(path, old, new))


def rebase(patches, old_files, new_files):
    return rebase_series(patches, old_files.get, new_files.get)


def edit(text, lineno, new):
    lines = text.splitlines(keepends=True)
    lines[lineno - 1] = new + "\n"
    return "".join(lines)


def test_identity_is_clean_and_byte_identical():
    p = make_patch("0001-a.patch", OLD, edit(OLD, 10, "ours"))
    (o,) = rebase([p], {PATH: OLD}, {PATH: OLD})
    assert o.status == CLEAN and o.text == p.preamble + p.raw_body


def test_unrelated_upstream_change_merges_and_refreshes_line_numbers():
    p = make_patch("0001-a.patch", OLD, edit(OLD, 30, "ours"))
    new_upstream = "new header\n" * 5 + OLD
    (o,) = rebase([p], {PATH: OLD}, {PATH: new_upstream})
    assert o.status == MERGED
    refreshed = parse_patch("0001-a.patch", o.text)
    assert refreshed.files[0].hunks[0].old_start == p.files[0].hunks[0].old_start + 5
    assert o.text.startswith(p.preamble)


def test_conflicting_upstream_change_is_reported_not_merged():
    p = make_patch("0001-a.patch", OLD, edit(OLD, 20, "ours"))
    theirs = edit(OLD, 20, "theirs")
    (o,) = rebase([p], {PATH: OLD}, {PATH: theirs})
    assert o.status == CONFLICT and o.text is None
    assert o.conflicts and o.conflicts[0]["file"] == PATH
    assert o.conflicts[0]["hunk"] == p.files[0].hunks[0].header
    assert "<<<<<<<" in o.merged_files[PATH] and "theirs" in o.merged_files[PATH]


def test_later_patches_see_refreshed_earlier_ones():
    a_new = edit(OLD, 5, "a")
    pa = make_patch("0001-a.patch", OLD, a_new)
    pb = make_patch("0002-b.patch", a_new, edit(a_new, 35, "b"))
    outs = rebase([pa, pb], {PATH: OLD}, {PATH: "x\n" + OLD})
    assert [o.status for o in outs] == [MERGED, MERGED]
    assert "+b\n" in outs[1].text


def test_file_removed_upstream_is_a_conflict():
    p = make_patch("0001-a.patch", OLD, edit(OLD, 2, "ours"))
    (o,) = rebase([p], {PATH: OLD}, {})
    assert o.status == CONFLICT and "no longer exists" in o.conflicts[0]["reason"]


def test_series_not_matching_old_base_is_an_error():
    p = make_patch("0001-a.patch", OLD, edit(OLD, 2, "ours"))
    with pytest.raises(BuildError, match="does not apply"):
        rebase([p], {PATH: edit(OLD, 2, "changed")}, {PATH: OLD})


def test_cli_onto_pinned_release_is_identity(tmp_path):
    out = tmp_path / "rebase"
    base = load_pin().version
    proc = subprocess.run([sys.executable, "-m", "tools.rebase", "--from", base, "--onto", base,
                           "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    for f in series_dir().iterdir():
        assert (out / "patches" / f.name).read_bytes() == f.read_bytes(), f.name
    report = json.loads((out / "report.json").read_text())
    assert report["summary"] == {"clean": len(report["patches"]), "merged": 0, "conflict": 0}
    # anchor status beside the patches': every anchor of the base holds on itself
    assert report["anchor_summary"]["MISSING"] == 0 and report["anchor_summary"]["ok"] > 0
    assert all(v == "ok" or v.startswith("absent (") for v in report["anchors"].values())
    md = (out / "report.md").read_text()
    assert md.startswith("# Rebase of the series") and f"## Upstream anchors on {base}" in md
