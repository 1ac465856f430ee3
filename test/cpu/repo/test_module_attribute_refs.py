"""Every `module.name` that the GPU tests, the benchmarks and the lab scripts read from a module of
this repository (sglang.sm120.*, test/gpu's helpers, benchmarks' own modules) exists there.

No GPU runs these files here, and a name that moved (tinymodels.tiny_model went to
sglang.sm120.tiny.serving) fails only once a GPU has been lent, after staging: the first H200
run of test_same_tokens.py died on it in a fixture, where collection does not look."""
import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SCANNED = sorted([*REPO.glob("test/gpu/*.py"), *REPO.glob("benchmarks/*.py"), *REPO.glob("lab/*.py")])
LOCAL_DIRS = ("test/gpu", "benchmarks", "test/cpu")


def _ours(module: str) -> bool:
    if module == "sglang.sm120" or module.startswith("sglang.sm120."):
        return True
    return "." not in module and any((REPO / d / f"{module}.py").is_file() for d in LOCAL_DIRS)


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def module_bindings(tree: ast.AST) -> dict:
    """{local name: module} for this repository's modules the file imports as a name."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and _ours(a.name):
                    out[a.asname] = a.name
                elif not a.asname and "." not in a.name and _ours(a.name):
                    out[a.name] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if _ours(full) and _is_module(full):
                    out[a.asname or a.name] = full
    return out


def missing_refs(path: Path) -> list:
    tree = ast.parse(path.read_text(), str(path))
    bound = module_bindings(tree)
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
            mod = bound[node.value.id]
            if not hasattr(importlib.import_module(mod), node.attr) and not _is_module(f"{mod}.{node.attr}"):
                bad.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value.id}.{node.attr} ({mod} has no {node.attr})")
    return bad


@pytest.mark.parametrize("path", SCANNED, ids=lambda p: str(p.relative_to(REPO)))
def test_names_read_from_our_modules_exist(path):
    assert missing_refs(path) == []


def test_a_moved_name_is_reported(tmp_path, monkeypatch):
    monkeypatch.setattr("test_module_attribute_refs.REPO", tmp_path)
    f = tmp_path / "t.py"
    f.write_text("import tinymodels\nfrom sglang.sm120.tiny import serving\n"
                 "tinymodels.tiny_model\nserving.tiny_model\nserving.no_such_name\n")
    (tmp_path / "test" / "gpu").mkdir(parents=True)
    (tmp_path / "test" / "gpu" / "tinymodels.py").write_text("")
    assert [b.split(": ", 1)[1] for b in missing_refs(f)] == [
        "tinymodels.tiny_model (tinymodels has no tiny_model)",
        "serving.no_such_name (sglang.sm120.tiny.serving has no no_such_name)"]
