"""The overlay's import graph, read statically (every import statement, also those inside
functions): no cycle, and the serving path takes nothing from the `check` CLI kit (only the CLI
entry, sglang.sm120.__main__, imports it)."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

OVERLAY = Path(__file__).resolve().parents[2] / "python" / "sglang" / "sm120"
ROOT_PACKAGE = "sglang.sm120"
CHECK_KIT = ROOT_PACKAGE + ".check"


def _modules(package_dir: Path, package: str) -> Dict[str, Path]:
    """Dotted name -> file of every module of the package (a package is its __init__.py)."""
    out = {}
    for path in package_dir.rglob("*.py"):
        parts = list(path.relative_to(package_dir).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join([package, *parts])] = path
    return out


def _imported(module: str, path: Path, node, known: Dict[str, Path]) -> List[str]:
    """The package's modules one import statement names: `from pkg import sub` is the submodule
    when there is one, else pkg; a name that is not a module is its nearest module parent."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = module.split(".")
            if path.name != "__init__.py":
                base = base[:-1]
            base = base[:len(base) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        names = [f"{target}.{a.name}" if f"{target}.{a.name}" in known else target for a in node.names]
    found = []
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != module:
            found.append(name)
    return found


def import_graph(package_dir: Path, package: str) -> Dict[str, Set[str]]:
    known = _modules(package_dir, package)
    graph = {m: set() for m in known}
    for module, path in known.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[module].update(_imported(module, path, node, known))
    return graph


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def check_kit_importers(graph: Dict[str, Set[str]], package: str = ROOT_PACKAGE) -> Dict[str, List[str]]:
    """Modules outside the check kit (and its CLI entry) that import it: {module: [kit modules]}."""
    kit = package + ".check"
    entry = {package + ".__main__"}
    return {m: sorted(d for d in deps if d == kit or d.startswith(kit + "."))
            for m, deps in sorted(graph.items())
            if m not in entry and not (m == kit or m.startswith(kit + "."))
            and any(d == kit or d.startswith(kit + ".") for d in deps)}


def test_the_overlay_has_no_import_cycle():
    graph = import_graph(OVERLAY, ROOT_PACKAGE)
    assert len(graph) > 40 and graph[ROOT_PACKAGE + ".fp4_linear"]  # the whole overlay was read
    assert not cycles(graph), f"import cycles in the overlay: {cycles(graph)}"


def test_only_the_cli_entry_imports_the_check_kit():
    graph = import_graph(OVERLAY, ROOT_PACKAGE)
    assert CHECK_KIT + ".cli" in graph[ROOT_PACKAGE + ".__main__"]  # the entry is seen importing it
    bad = check_kit_importers(graph)
    assert not bad, f"modules outside sglang.sm120.check that import it (move what they need out): {bad}"


def _package(tmp_path: Path, files: Dict[str, str]) -> Path:
    root = tmp_path / "sglang" / "sm120"
    for name, text in {"__init__.py": "", **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_checks_catch_a_lazy_cycle_and_a_serving_import_of_the_kit(tmp_path):
    """The shape the overlay had: a serving module and its self-check importing each other inside
    functions, the self-check taking its tolerance from the check kit."""
    root = _package(tmp_path, {
        "linear.py": "def process():\n    from sglang.sm120 import selfcheck\n",
        "selfcheck.py": "def verify():\n    from . import linear\n    from .check.tolerance import compare\n",
        "check/__init__.py": "",
        "check/tolerance.py": "import torch\n",
        "check/cli.py": "from .tolerance import compare\n",
        "__main__.py": "from sglang.sm120.check.cli import main\n",
    })
    graph = import_graph(root, ROOT_PACKAGE)
    assert cycles(graph) == [[ROOT_PACKAGE + ".linear", ROOT_PACKAGE + ".selfcheck"]]
    assert check_kit_importers(graph) == {ROOT_PACKAGE + ".selfcheck": [CHECK_KIT + ".tolerance"]}
