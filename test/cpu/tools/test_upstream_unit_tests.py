"""tools/upstream_unit_tests.py runs a test folder against two wheels, each unpacked where
upstream's tests look for the package (<root>/python/sglang), and reports every test whose outcome
differs. Driven here with two small stand-in wheels and a stand-in test folder."""
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
TOOL = REPO / "tools" / "upstream_unit_tests.py"

pytestmark = pytest.mark.base_independent


def _wheel(path: Path, variant: str) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("sglang/__init__.py", f"VARIANT = {variant!r}\n")
        if variant == "fork":
            z.writestr("sglang/sm120/__init__.py", "")
            z.writestr("sglang/sm120/reads.py", "def f():\n    return get_server_args().tp_size\n")
        z.writestr("sglang-0.0.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: sglang\nVersion: 0.0.0\n")
    return path


TESTS = {
    "unit/test_same.py": "import sglang\n\ndef test_imports():\n    assert sglang.VARIANT in ('upstream', 'fork')\n",
    # what upstream's ratchet does: scan <repo>/python/sglang next to the test folder
    "unit/test_scan_ratchet.py": (
        "from pathlib import Path\n"
        "ROOT = Path(__file__).resolve().parents[2] / 'python' / 'sglang'\n\n"
        "def test_no_reads():\n"
        "    hits = [p for p in ROOT.rglob('*.py') if 'get_server_args().' in p.read_text()]\n"
        "    assert not hits, hits\n"
    ),
    "unit/test_other.py": "def test_not_chosen():\n    assert False\n",
}


@pytest.fixture()
def layout(tmp_path):
    tests = tmp_path / "checkout" / "test"
    for rel, text in TESTS.items():
        (tests / rel).parent.mkdir(parents=True, exist_ok=True)
        (tests / rel).write_text(text)
    return tests, _wheel(tmp_path / "up.whl", "upstream"), _wheel(tmp_path / "fork.whl", "fork")


def _run(tests, up, fork, work, *files):
    return subprocess.run([sys.executable, "-m", "tools.upstream_unit_tests", "--tests", str(tests), "--python", sys.executable,
                           "--upstream-wheel", str(up), "--fork-wheel", str(fork), "--work", str(work), *files],
                          capture_output=True, text=True, timeout=300, cwd=REPO)


def test_a_test_the_fork_fails_is_reported(layout, tmp_path):
    tests, up, fork = layout
    proc = _run(tests, up, fork, tmp_path / "work", "unit/test_same.py", "unit/test_scan_ratchet.py")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert any(ln.startswith("[upstream-tests] upstream (up.whl): 2 passed in ") for ln in lines), proc.stdout
    assert any(ln.startswith("[upstream-tests] fork (fork.whl): 1 failed, 1 passed in ") for ln in lines), proc.stdout
    assert [ln for ln in lines if "DIFFERENT" in ln] == [
        "[upstream-tests] DIFFERENT test.unit.test_scan_ratchet::test_no_reads: upstream passed, fork failed"]
    assert lines[-1] == "[upstream-tests] 1 difference(s) over 2 tests"


def test_the_same_outcomes_exit_0(layout, tmp_path):
    tests, up, _ = layout
    proc = _run(tests, up, up, tmp_path / "work", "unit/test_same.py", "unit/test_other.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1] == "[upstream-tests] no difference over 2 tests"


def test_default_files_and_a_missing_file(layout, tmp_path):
    tests, up, fork = layout
    from tools import upstream_unit_tests as tool

    assert tool.default_files(tests) == ["unit/test_scan_ratchet.py"]
    proc = _run(tests, up, fork, tmp_path / "work", "unit/test_nope.py")
    assert proc.returncode == 2 and "unit/test_nope.py" in proc.stderr, proc.stderr
