"""Folders reach each other by import, not by path wiring: no file but a conftest.py inserts into
sys.path or a package's __path__ (pytest.ini's `pythonpath` is the tests' one list), and nothing
outside test/ imports a module that lives under test/."""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, Iterable, List

import pytest

from sglang.sm120 import settings

pytestmark = pytest.mark.base_independent

REPO = Path(__file__).resolve().parents[2]
# insert/append/extend on sys.path or a package's __path__, `+=` or slice assignment to either,
# pytest monkeypatch's path prepend, site.addsitedir
INSERTION = re.compile(
    r"\bsys\s*\.\s*path\s*(?:\.\s*(?:insert|append|extend)\s*\(|\+=|\[[^\]]*\]\s*=)"
    r"|__path__\s*(?:\.\s*(?:insert|append|extend)\s*\(|\+=)"
    r"|\bsyspath_prepend\s*\(|\bsite\s*\.\s*addsitedir\s*\(")


def _code_files(root: Path) -> List[Path]:
    """The repository's Python and shell files (settings' scan: no .venv, caches, build output)."""
    return [p for p in settings.scanned_files(root) if p.suffix in (".py", ".sh")]


def path_insertions(root: Path, files: Iterable[Path]) -> Dict[str, List[str]]:
    """{file: [line, ...]} of path insertions outside conftest.py files."""
    found = {}
    for f in files:
        if f.name == "conftest.py":
            continue
        lines = [f"{i}: {ln.strip()}" for i, ln in enumerate(f.read_text(errors="replace").splitlines(), 1)
                 if INSERTION.search(ln)]
        if lines:
            found[str(f.relative_to(root))] = lines
    return found


def imports_from_test(root: Path, files: Iterable[Path]) -> Dict[str, List[str]]:
    """{file outside test/: [module]} of imports of a module whose file is under test/ (or of a
    package named `test`)."""
    test_dir = root / "test"
    files = list(files)
    under_test = {p.stem for p in files if p.suffix == ".py" and p.is_relative_to(test_dir)} | {"test"}
    found = {}
    for f in files:
        if f.suffix != ".py" or f.is_relative_to(test_dir):
            continue
        names = []
        for node in ast.walk(ast.parse(f.read_text(errors="replace"), str(f))):
            if isinstance(node, ast.Import):
                names += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.append(node.module)
        bad = sorted({n for n in names if n.split(".")[0] in under_test})
        if bad:
            found[str(f.relative_to(root))] = bad
    return found


def test_only_conftest_files_insert_import_paths():
    files = _code_files(REPO)
    assert any(f.name == "launcher.py" for f in files) and any(f.suffix == ".sh" for f in files)
    found = path_insertions(REPO, files)
    assert not found, f"import-path insertions outside conftest.py (import instead, or run as -m): {found}"


def test_nothing_outside_test_imports_from_test():
    found = imports_from_test(REPO, _code_files(REPO))
    assert not found, f"imports of test/ modules from outside test/ (move the shared code out of test/): {found}"


def test_the_checks_catch_each_kind(tmp_path):
    sp, pp, mp = "sys.path", "__path__", "syspath_prepend"  # so that this file shows no insertion itself
    samples = {
        "a.py": f"import sys\n{sp}.insert(0, 'x')\n",
        "b.py": f"import sglang\nsglang.{pp}.append('y')\n",
        "c.py": f"{sp} += ['z']\n",
        "d.sh": f'python - <<EOF\nimport sys; {sp}.append(".")\nEOF\n',
        "e.py": f"def t(monkeypatch):\n    monkeypatch.{mp}('w')\n",
        "conftest.py": f"import sys\n{sp}.insert(0, 'ok here')\n",
        "f.py": f"for p in {sp}:\n    print(p)\n",  # reading is fine
        "test/gpu/helper.py": "X = 1\n",
        "lab/probe.py": "import helper\nfrom helper import X\n",
        "lab/fine.py": "from . import helper\nimport json\n",
    }
    for name, text in samples.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    files = _code_files(tmp_path)
    assert sorted(path_insertions(tmp_path, files)) == ["a.py", "b.py", "c.py", "d.sh", "e.py"]
    assert imports_from_test(tmp_path, files) == {"lab/probe.py": ["helper"]}
