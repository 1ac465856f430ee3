"""The upstream anchors (sglang/sm120/upstream_api.py): declared once, checked per base at build
time and at import, and every upstream import in the overlay goes through a declared anchor."""
import ast
import importlib.util
import re
import subprocess
import sys

import pytest

from buildenv import REPO, error_line, load_pin, pinned_wheel, run_build, scratch_repo
from forkbuild.anchors import load_api, member_reader
from forkbuild.build import read_upstream

API = load_api(REPO)
OVERLAY = REPO / "python" / "sglang" / "sm120"
# upstream's packages the overlay may reach (sglang._version is read only to name a source tree's base)
UPSTREAM_PACKAGES = ("sglang.srt", "sglang.jit_kernel", "sglang.kernels")


def _tree(text_by_path):
    return lambda path: text_by_path.get(path)


def test_every_anchor_is_declared_for_every_base_with_reasons_for_absence():
    for name, where in API.ANCHORS.items():
        assert set(where) == set(API.BASES), name
        for base, spec in where.items():
            if spec is None:
                assert API.ABSENT.get(name), f"{name} absent on {base} without a reason"
            else:
                assert re.fullmatch(r"sglang(\.\w+)+(:\w+(\.\w+)*)?", spec), spec
    assert set(API.ABSENT) <= set(API.ANCHORS)


def test_bases_match_upstream_toml():
    from forkbuild.config import bases

    assert tuple(bases()) == API.BASES


def test_checker_finds_definitions_and_names_what_is_missing():
    module = "python/sglang/srt/m.py"
    src = (
        "import os\n"
        "X = 1\n"
        "if os.name:\n    def f():\n        pass\n"
        "class C:\n    a: int = 0\n    def g(self):\n        pass\n"
    )
    read = _tree({module: src})
    ok = [API._find(API._Tree(read), f"sglang.srt.m:{q}") for q in ("X", "f", "C", "C.a", "C.g", "os")]
    assert ok == [None] * 6
    assert API._find(API._Tree(read), "sglang.srt.m:C.h") == "C.h not defined in sglang.srt.m"
    assert API._find(API._Tree(read), "sglang.srt.gone:X") == "module sglang.srt.gone not found"
    assert API._find(API._Tree(read), "sglang.srt.m") is None


@pytest.mark.parametrize("base", ["0.5.16", "0.5.23"])
def test_all_anchors_hold_on_each_pinned_base(base):
    """The pristine upstream wheel of each base has every anchor declared for it."""
    from forkbuild.upstream import fetch_pinned
    from forkbuild.config import running_python_tag

    wheel = fetch_pinned(load_pin(base=base), running_python_tag())[0]
    read = member_reader(read_upstream(wheel))
    assert API.missing(read, base) == []
    status = API.status(read, base)
    assert all(v == "ok" or v.startswith("absent (") for v in status.values()), status


def test_missing_anchor_fails_the_build_naming_it(tmp_path):
    repo = scratch_repo(tmp_path / "repo")
    api = repo / "python" / "sglang" / "sm120" / "upstream_api.py"
    text = api.read_text()
    marker = "ANCHORS: Dict[str, Dict[str, Optional[str]]] = {\n"
    assert marker in text
    api.write_text(text.replace(marker, marker + '    "no_such_symbol": _both("sglang.srt.server_args:NoSuchSymbol"),\n'))
    out = tmp_path / "out"
    proc = run_build(repo, out, SGLANG_UPSTREAM_WHEEL=str(pinned_wheel()))
    assert proc.returncode != 0
    line = error_line(proc)
    assert "upstream anchor missing on base" in line and "no_such_symbol" in line and "NoSuchSymbol" in line, line
    assert not out.exists() or not any(out.iterdir())


def _overlay_upstream_imports():
    """(file, module, name) for every upstream import in the overlay: `from sglang.srt... import
    name`, `import sglang.srt...`, importlib.import_module("sglang.srt...")."""
    found = []
    for path in sorted(OVERLAY.rglob("*.py")):
        if path.name == "upstream_api.py" or "tiny" in path.relative_to(OVERLAY).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(UPSTREAM_PACKAGES):
                found += [(path.name, node.module, a.name) for a in node.names]
            elif isinstance(node, ast.Import):
                found += [(path.name, a.name, None) for a in node.names if a.name.startswith(UPSTREAM_PACKAGES)]
            elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module"
                  and node.args and isinstance(node.args[0], ast.Constant)
                  and str(node.args[0].value).startswith(UPSTREAM_PACKAGES)):
                found.append((path.name, node.args[0].value, None))
    return found


def test_every_upstream_import_in_the_overlay_is_a_declared_anchor():
    declared = {spec for where in API.ANCHORS.values() for spec in where.values() if spec}
    modules = {s.split(":")[0] for s in declared}
    undeclared = []
    for file, module, name in _overlay_upstream_imports():
        if name is None:
            ok = module in modules
        else:
            ok = f"{module}.{name}" in modules or any(
                s == f"{module}:{name}" or s.startswith(f"{module}:{name}.") for s in declared)
        if not ok:
            undeclared.append(f"{file}: {module}" + (f" import {name}" if name else ""))
    assert not undeclared, "declare these in sglang/sm120/upstream_api.py: " + "; ".join(undeclared)


def test_installed_base_passes_the_import_time_check():
    if importlib.util.find_spec("sglang.srt") is None:
        pytest.skip("no sglang installed in this interpreter")
    code = ("from sglang.sm120 import upstream_api as u\n"
            "print('BASE', u.check_installed())\n"
            "import sglang.sm120.runner.hooks\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"BASE {load_pin().version}" in proc.stdout


def test_require_on_an_absent_anchor_names_it_and_the_base():
    if importlib.util.find_spec("sglang.srt") is None:
        pytest.skip("no sglang installed in this interpreter")
    base = load_pin().version
    absent = next(n for n, w in API.ANCHORS.items() if w[base] is None)
    code = ("from sglang.sm120 import upstream_api as u\n"
            f"try:\n    u.require({absent!r})\nexcept u.UpstreamAnchorError as e:\n    print('ERR', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"ERR {absent} does not exist on base {base}" in proc.stdout


def test_dependency_pins_of_another_base_are_named():
    pins = {"torch": "2.14.1", "flashinfer-python": "0.7.2", "sglang-kernel": "0.4.10"}
    have = {"torch": "2.11.0+cu130", "flashinfer-python": "0.7.2"}  # sglang-kernel not installed
    assert API.dependency_mismatches(pins, have.get) == ["torch 2.11.0+cu130 (base needs ==2.14.1)"]
    assert API.dependency_mismatches({"torch": "2.11.0"}, have.get) == []  # local version suffix


def test_build_records_the_base_defining_pins():
    from forkbuild.build import exact_pins

    meta = ("Requires-Dist: flashinfer_python[cu13]==0.7.2\nRequires-Dist: torch==2.14.1\n"
            "Requires-Dist: torchvision\nRequires-Dist: sglang-kernel==0.4.10; extra == 'x'\n")
    assert exact_pins(meta) == {"flashinfer-python": "0.7.2", "torch": "2.14.1"}


def test_installed_info_names_base_and_anchor_check():
    if importlib.util.find_spec("sglang.srt") is None:
        pytest.skip("no sglang installed in this interpreter")
    import json

    proc = subprocess.run([sys.executable, "-m", "sglang.sm120", "info"], capture_output=True, text=True,
                          timeout=300, cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout)
    base = load_pin().version
    assert info["base"]["version"] == base
    assert info["anchors"] == f"all upstream anchors of base {base} present"


def test_the_gate_refuses_bases_the_step_is_not_ported_to(monkeypatch):
    """The lean MoE step reproduces the launches of the bases in LEAN_STEP_BASES (every declared
    base today); on any other base every layer keeps upstream's path and says why."""
    if importlib.util.find_spec("sglang.srt") is None:
        pytest.skip("no sglang installed in this interpreter")
    from sglang.sm120 import upstream_api
    from sglang.sm120.runner import lean_moe

    assert set(lean_moe.LEAN_STEP_BASES) <= set(API.BASES)
    other = next((b for b in API.BASES if b not in lean_moe.LEAN_STEP_BASES), "0.9.99")  # fictitious
    monkeypatch.setattr(upstream_api, "check_installed", lambda: other)
    assert lean_moe.layer_refusal(object()) == (
        f"the lean step is not ported to upstream sglang {other} (it reproduces {', '.join(lean_moe.LEAN_STEP_BASES)})")
