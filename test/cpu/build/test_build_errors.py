"""The build refuses bad input with one actionable line, a nonzero exit and no wheel."""
import shutil

import pytest

from buildenv import error_line, load_pin, pinned_wheel, run_build, scratch_repo, series_dir
from forkbuild.patches import parse_patch


@pytest.fixture()
def repo(tmp_path):
    return scratch_repo(tmp_path / "repo")


@pytest.fixture(scope="module")
def wheel():
    return pinned_wheel()


def assert_refused(proc, out, *needles):
    assert proc.returncode != 0
    line = error_line(proc)
    for n in needles:
        assert n in line, line
    assert not out.exists() or not any(out.iterdir()), "a failed build left files behind"
    return line


def test_good_hash_builds(repo, tmp_path, wheel):
    out = tmp_path / "out"
    proc = run_build(repo, out, SGLANG_UPSTREAM_WHEEL=str(wheel))
    assert proc.returncode == 0, proc.stderr
    pin = load_pin()
    assert [p.name for p in out.iterdir()] == [wheel.name.replace(f"-{pin.version}-", f"-{pin.fork_version}-")]


def test_bad_hash_is_refused(repo, tmp_path, wheel):
    bad = tmp_path / "bad" / wheel.name
    bad.parent.mkdir()
    data = bytearray(wheel.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    out = tmp_path / "out"
    line = assert_refused(run_build(repo, out, SGLANG_UPSTREAM_WHEEL=str(bad.parent)), out, "sha256 mismatch")
    expected = load_pin().wheels[wheel.name]
    assert str(bad) in line and f"expected {expected}, actual " in line


def test_no_network_and_no_local_wheel(repo, tmp_path):
    out = tmp_path / "out"
    proc = run_build(repo, out, SGLANG_SM120_CACHE=str(tmp_path / "empty-cache"),
                     SGLANG_SM120_INDEX_URL="http://127.0.0.1:9/simple")
    assert_refused(proc, out, "cannot download", "SGLANG_UPSTREAM_WHEEL")


def test_unsupported_python(repo, tmp_path):
    out = tmp_path / "out"
    assert_refused(run_build(repo, out, "--python", "3.9"), out, "Python 3.9 is not supported", "cp311")


def test_series_names_missing_patch(repo, tmp_path, wheel):
    (series_dir(repo) / "series").write_text("0099-does-not-exist.patch\n")
    out = tmp_path / "out"
    assert_refused(run_build(repo, out, SGLANG_UPSTREAM_WHEEL=str(wheel)), out, "0099-does-not-exist.patch", "names no file")


def test_malformed_patch(repo, tmp_path, wheel):
    p = series_dir(repo) / "0001-fork-version-identity.patch"
    p.write_text(p.read_text().replace("Drop when:", "Dropped:"))
    out = tmp_path / "out"
    assert_refused(run_build(repo, out, SGLANG_UPSTREAM_WHEEL=str(wheel)), out,
                   "malformed patch 0001-fork-version-identity.patch", "Drop when")


def test_bad_hunk_counts_are_malformed(repo, tmp_path, wheel):
    p = series_dir(repo) / "0001-fork-version-identity.patch"
    p.write_text(p.read_text().replace("@@ -22,3 +22,9 @@", "@@ -22,3 +22,12 @@"))
    out = tmp_path / "out"
    assert_refused(run_build(repo, out, SGLANG_UPSTREAM_WHEEL=str(wheel)), out, "malformed patch", "line counts")


def test_patch_touching_file_upstream_lacks(repo, tmp_path, wheel):
    p = series_dir(repo) / "0001-fork-version-identity.patch"
    p.write_text(p.read_text().replace("python/sglang/version.py", "python/sglang/no_such_module.py"))
    out = tmp_path / "out"
    assert_refused(run_build(repo, out, SGLANG_UPSTREAM_WHEEL=str(wheel)), out, "no_such_module.py", "upstream lacks")


def _first_context_line(patch_file):
    """(header, file path, a context line found once in the patch) of the patch's first hunk."""
    text = patch_file.read_text()
    fd = parse_patch(patch_file.name, text).files[0]
    h = fd.hunks[0]
    for op, line in h.lines:
        if op == " " and len(line.strip()) > 8 and text.count(" " + line) == 1:
            return h.header, fd.path, line.rstrip("\n")
    raise AssertionError(f"{patch_file.name}: its first hunk has no unique context line")


def test_corrupted_context_names_patch_file_and_hunk(repo, tmp_path, wheel):
    p = series_dir(repo) / "0002-restore-enable-piecewise-cuda-graph.patch"
    header, path, context = _first_context_line(p)
    p.write_text(p.read_text().replace(" " + context + "\n", " Changed context line.\n"))
    out = tmp_path / "out"
    line = assert_refused(run_build(repo, out, SGLANG_UPSTREAM_WHEEL=str(wheel)), out,
                          "patch 0002-restore-enable-piecewise-cuda-graph.patch",
                          path, f"hunk #1 ({header})", "does not apply")
    assert "Changed context line." in line


def test_offset_hunk_is_not_applied_fuzzily(repo, tmp_path, wheel):
    """git apply would accept a shifted hunk; the strict series must not."""
    p = series_dir(repo) / "0002-restore-enable-piecewise-cuda-graph.patch"
    header = parse_patch(p.name, p.read_text()).files[0].hunks[0].header
    old, new = (int(x.split(",")[0][1:]) for x in header.split()[1:3])
    shifted = header.replace(f"-{old},", f"-{old - 2},", 1).replace(f"+{new},", f"+{new - 2},", 1)
    p.write_text(p.read_text().replace(header, shifted, 1))
    out = tmp_path / "out"
    assert_refused(run_build(repo, out, SGLANG_UPSTREAM_WHEEL=str(wheel)), out, "hunk #1", f"does not apply at line {old - 2}")


def test_overlay_shadowing_upstream_fails(repo, tmp_path, wheel):
    shadow = repo / "python" / "sglang" / "srt" / "server_args.py"
    shadow.parent.mkdir(parents=True, exist_ok=True)
    shadow.write_text("# a shadow copy\n")
    out = tmp_path / "out"
    assert_refused(run_build(repo, out, SGLANG_UPSTREAM_WHEEL=str(wheel)), out,
                   "overlay file python/sglang/srt/server_args.py exists in upstream")


def test_patch_creating_a_file_is_refused(repo, tmp_path, wheel):
    p = series_dir(repo) / "0001-fork-version-identity.patch"
    p.write_text(p.read_text().replace("--- a/python/sglang/version.py", "--- /dev/null"))
    out = tmp_path / "out"
    assert_refused(run_build(repo, out, SGLANG_UPSTREAM_WHEEL=str(wheel)), out, "creates python/sglang/version.py", "overlay")


def test_kernels_forced_without_nvcc(repo, tmp_path, wheel):
    out = tmp_path / "out"
    proc = run_build(repo, out, SGLANG_UPSTREAM_WHEEL=str(wheel), SGLANG_SM120_KERNELS="1",
                     PATH="/usr/bin:/bin", CUDA_HOME=str(tmp_path / "no-cuda"))
    assert_refused(proc, out, "SGLANG_SM120_KERNELS=1", "nvcc")
