"""tools/refresh.py regenerates a patch from an edited tree, keeping its header."""
import shutil
import subprocess
import sys

from buildenv import scratch_repo, series_dir


def refresh(repo, *args):
    return subprocess.run([sys.executable, "-m", "tools.refresh", *args],
                          capture_output=True, text=True, timeout=300, cwd=repo)


def test_update_roundtrip_and_new_patch(tmp_path):
    repo = scratch_repo(tmp_path / "repo")
    (repo / "tools").mkdir()
    for name in ("__init__.py", "refresh.py"):
        shutil.copy(scratch_repo.__globals__["REPO"] / "tools" / name, repo / "tools" / name)
    name = "0001-fork-version-identity.patch"
    original = (series_dir(repo) / name).read_text()
    tree = tmp_path / "tree"
    assert refresh(repo, "checkout", str(tree), "--upto", name).returncode == 0
    # An unedited tree regenerates the very same patch.
    proc = refresh(repo, "update", name, "--tree", str(tree))
    assert proc.returncode == 0, proc.stderr
    assert (series_dir(repo) / name).read_text() == original
    version = tree / "python" / "sglang" / "version.py"
    version.write_text(version.read_text() + "# one more line\n")
    proc = refresh(repo, "update", name, "--tree", str(tree))
    assert proc.returncode == 0, proc.stderr
    updated = (series_dir(repo) / name).read_text()
    assert updated.split("---\n", 1)[0] == original.split("---\n", 1)[0]  # header kept verbatim
    assert "+# one more line\n" in updated

    tree2 = tmp_path / "tree2"
    assert refresh(repo, "checkout", str(tree2)).returncode == 0
    (tree2 / "python" / "sglang" / "new_module.py").write_text("x = 1\n")
    proc = refresh(repo, "new", "0003-x.patch", "--tree", str(tree2), "--subject", "s", "--why", "w",
                   "--how", "h", "--upstream-status", "u", "--drop-when", "d")
    assert proc.returncode == 1 and "belong in the overlay" in proc.stderr
