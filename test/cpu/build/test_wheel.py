"""The built fork wheel: upstream's files + the series + the overlay, upstream's metadata."""
import base64
import csv
import hashlib
import io
import os
import re
import zipfile
from pathlib import Path

import pytest

from buildenv import load_pin, pinned_wheel, run_build, scratch_repo, series_dir



@pytest.fixture(scope="module")
def fork_wheel(tmp_path_factory) -> Path:
    """The wheel CI built (SGLANG_SM120_WHEEL), else a CPU-only build made here."""
    given = os.environ.get("SGLANG_SM120_WHEEL")
    if given:
        return Path(given)
    tmp = tmp_path_factory.mktemp("wheel")
    proc = run_build(scratch_repo(tmp / "repo"), tmp / "out")
    assert proc.returncode == 0, proc.stderr
    return next((tmp / "out").glob("*.whl"))


@pytest.fixture(scope="module")
def zips(fork_wheel):
    with zipfile.ZipFile(fork_wheel) as f, zipfile.ZipFile(pinned_wheel()) as u:
        yield f, u


def _read(z, name):
    return z.read(name).decode()


def test_name_and_tag(fork_wheel):
    pin = load_pin()
    m = re.fullmatch(r"sglang-(?P<v>[^-]+)-(?P<tag>cp3\d+-cp3\d+-manylinux_2_34_x86_64)\.whl", fork_wheel.name)
    assert m and m["v"] == f"{pin.version}+{pin.local}"
    assert re.fullmatch(r"sm120\.\d+", pin.local)


def test_metadata_matches_upstream(zips):
    f, u = zips
    pin = load_pin()
    fm = _read(f, f"sglang-{pin.fork_version}.dist-info/METADATA")
    um = _read(u, f"sglang-{pin.version}.dist-info/METADATA")
    assert re.search(r"^Version: (.*)$", fm, re.M)[1] == pin.fork_version
    reqs = lambda m: [l for l in m.splitlines() if l.startswith("Requires-Dist: ")]
    expected = [r for r in reqs(um) if r[len("Requires-Dist: "):] not in {c.requirement for c in pin.remove}]
    expected += [f"Requires-Dist: {c.requirement}" for c in pin.add]
    assert sorted(reqs(fm)) == sorted(expected)
    if not (pin.add or pin.remove):
        assert fm.replace(pin.fork_version, pin.version, 1) == um
    assert _read(f, f"sglang-{pin.fork_version}.dist-info/entry_points.txt") == \
        _read(u, f"sglang-{pin.version}.dist-info/entry_points.txt")
    wheel_meta = _read(f, f"sglang-{pin.fork_version}.dist-info/WHEEL")
    assert "Root-Is-Purelib: false" in wheel_meta
    assert re.search(r"^Tag: (.*)$", wheel_meta, re.M)[1] == re.search(
        r"^Tag: (.*)$", _read(u, f"sglang-{pin.version}.dist-info/WHEEL"), re.M)[1]


def test_record_is_complete_and_correct(zips):
    f, _ = zips
    pin = load_pin()
    record = f"sglang-{pin.fork_version}.dist-info/RECORD"
    rows = list(csv.reader(io.StringIO(_read(f, record))))
    listed = {r[0]: r for r in rows}
    names = [i.filename for i in f.infolist() if not i.is_dir()]
    assert set(listed) == set(names)
    for name in names:
        if name == record:
            continue
        data = f.read(name)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert listed[name][1:] == [f"sha256={digest}", str(len(data))], name


def test_upstream_files_kept_and_only_series_files_differ(zips):
    f, u = zips
    pin = load_pin()
    sys_patched = {fd.path[len("python/"):] for p in _series() for fd in p.files}
    fork = {i.filename for i in f.infolist()}
    upstream_di = f"sglang-{pin.version}.dist-info/"
    native = [n for n in u.namelist() if n.endswith(".so")]
    assert native, "upstream ships Rust extensions; the fork must keep them"
    differing = set()
    for name in (i.filename for i in u.infolist() if not i.is_dir()):
        if name.startswith(upstream_di):
            continue
        assert name in fork, f"upstream file {name} missing from the fork wheel"
        if f.read(name) != u.read(name):
            differing.add(name)
        if name in native:
            assert (f.getinfo(name).external_attr >> 16) == (u.getinfo(name).external_attr >> 16)
    assert differing == sys_patched


def test_overlay_and_build_info_present(zips):
    f, u = zips
    names = set(f.namelist())
    for rel in ("sglang/sm120/__init__.py", "sglang/sm120/__main__.py", "sglang/sm120/_build_info.py"):
        assert rel in names and rel not in set(u.namelist())
    info = _read(f, "sglang/sm120/_build_info.py")
    assert f"__version__ = '{load_pin().fork_version}'" in info
    for p in _series():
        assert p.name in info


def _series():
    from forkbuild.patches import load_series

    return load_series(series_dir())


def test_pip_install_dot_builds_and_installs_the_fork(tmp_path):
    """`pip install .` goes through the PEP 517 backend (build isolation included)."""
    import subprocess
    import sys

    repo = scratch_repo(tmp_path / "repo")
    target = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(target), str(repo)],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "SGLANG_SM120_KERNELS": "0", "SGLANG_UPSTREAM_WHEEL": str(pinned_wheel())},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    pin = load_pin()
    assert (target / f"sglang-{pin.fork_version}.dist-info" / "METADATA").is_file()
    assert (target / "sglang" / "sm120" / "_build_info.py").is_file()
    assert "sglang.sm120._build_info" in (target / "sglang" / "version.py").read_text()
