"""Test modules marked base_independent run on the first base only (tools/run_tests.sh), so they
must not touch upstream sglang: their source names none of it, nor the fork's modules that wrap
it. Upstream-facing tests stay unmarked and run on every base."""
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.base_independent

HERE = Path(__file__).resolve().parent
MARK = re.compile(r"^pytestmark\s*=.*\bbase_independent\b", re.M)
# upstream sglang, and the overlay modules that import or patch it
UPSTREAM = re.compile(
    r"sglang\.srt|sglang\.kernels\b|sglang\.launch_server|sglang\.Engine|sglang\.jit_kernel|"
    r"^\s*import sglang\s*$|^\s*from sglang import|"
    r"sglang\.sm120\.(runner|fp4_|check|model_names|server_flags|upstream_api|tiny|demo|build_info)|"
    r"\bbuildenv\b|pip wheel|SGLANG_SM120_WHEEL", re.M)


def marked_modules():
    return sorted(p for p in HERE.rglob("test_*.py") if MARK.search(p.read_text()) and p != Path(__file__).resolve())


def test_marked_modules_name_no_upstream_sglang():
    mods = marked_modules()
    assert len(mods) >= 10, [m.name for m in mods]  # the marker is found where it is used
    bad = {m.name: sorted({x.group(0).strip() for x in UPSTREAM.finditer(m.read_text())}) for m in mods
           if UPSTREAM.search(m.read_text())}
    assert not bad, f"base_independent modules that touch upstream sglang (unmark them): {bad}"


def test_the_check_catches_an_upstream_import(tmp_path):
    src = "import pytest\n\npytestmark = pytest.mark.base_independent\n\nfrom sglang.srt.server_args import ServerArgs\n"
    assert MARK.search(src) and UPSTREAM.search(src)


def test_run_tests_skips_marked_modules_after_the_first_base():
    script = (HERE.parents[1] / "tools" / "run_tests.sh").read_text()
    assert 'select=(-m "not base_independent")' in script
