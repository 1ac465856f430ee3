"""The overlay holds new files only: nothing under python/sglang may exist in the pinned upstream."""
import zipfile

from buildenv import REPO, pinned_wheel
from forkbuild.overlay import list_overlay


def test_overlay_shadows_nothing_upstream():
    overlay = list_overlay(REPO / "python")
    assert "sglang/sm120/__init__.py" in overlay
    with zipfile.ZipFile(pinned_wheel()) as z:
        upstream = set(z.namelist())
    assert sorted(set(overlay) & upstream) == []


def test_overlay_skips_generated_and_cache_files(tmp_path):
    pkg = tmp_path / "sglang" / "sm120"
    (pkg / "__pycache__").mkdir(parents=True)
    (pkg / "kernels" / "lib").mkdir(parents=True)
    (pkg / "mod.py").write_text("")
    (pkg / "_build_info.py").write_text("")
    (pkg / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"")
    (pkg / "kernels" / "lib" / "libk.so").write_bytes(b"")
    assert list(list_overlay(tmp_path)) == ["sglang/sm120/mod.py"]
