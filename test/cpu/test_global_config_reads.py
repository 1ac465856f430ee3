"""The fork reads no field off `get_server_args()`, the rule upstream 0.5.23's
test/unit/test_global_config_read_ratchet.py enforces over the whole package (its baseline is 0):
that record is the startup input and misses overrides made after the resolved config is
published. Resolved values come through `resolved` in python/sglang/sm120/upstream_api.py, which
reads each base's accessor (0.5.23: get_exec().<namespace>.<field>; 0.5.16: the record, resolved in place).

Checked without installing anything: the overlay has no such read at all, and no patch of either
series adds one (each file a series touches counts no more reads than upstream's own copy).
Forms counted: `get_server_args().f`, `getattr(get_server_args(), "f")`, and reads through a
name bound from the call (in a function or at module level, with name-to-name copies) or through
an instance attribute bound from it (`self._sa = get_server_args()` then `self._sa.f`)."""
from __future__ import annotations

import ast
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

from forkbuild.build import patched_members, read_upstream  # noqa: E402
from forkbuild.config import bases, load_pin, running_python_tag  # noqa: E402
from forkbuild.patches import load_series  # noqa: E402
from forkbuild.upstream import fetch_pinned  # noqa: E402

pytestmark = pytest.mark.base_independent

OVERLAY = REPO / "python" / "sglang" / "sm120"


def _is_record_call(node) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return (isinstance(f, ast.Name) and f.id == "get_server_args") or \
        (isinstance(f, ast.Attribute) and f.attr == "get_server_args")


def _getattr_field(node):
    """(object, field) of `getattr(object, "field"[, default])`, else None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
            and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
        return node.args[0], node.args[1].value
    return None


def _reads_on(scope: ast.AST, is_holder) -> list[tuple[int, str]]:
    """(line, field) of every `h.field` / getattr(h, "field") in `scope` where is_holder(h)."""
    out = []
    for n in ast.walk(scope):
        if isinstance(n, ast.Attribute) and is_holder(n.value):
            out.append((n.lineno, n.attr))
        elif (ga := _getattr_field(n)) and is_holder(ga[0]):
            out.append((n.lineno, ga[1]))
    return out


def _bound_names(scope: ast.AST) -> set[str]:
    """Names assigned from get_server_args() in `scope`, and names copied from those."""
    names: set[str] = set()
    assigns = [n for n in ast.walk(scope) if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None]
    changed = True
    while changed:
        changed = False
        for a in assigns:
            if _is_record_call(a.value) or (isinstance(a.value, ast.Name) and a.value.id in names):
                for t in (a.targets if isinstance(a, ast.Assign) else [a.target]):
                    if isinstance(t, ast.Name) and t.id not in names:
                        names.add(t.id)
                        changed = True
    return names


def record_reads(source: str) -> list[tuple[int, str]]:
    """Sorted (line, field) of every field read off get_server_args() in a module."""
    tree = ast.parse(source)
    reads = set(_reads_on(tree, _is_record_call))
    module_scope = ast.Module(body=[s for s in tree.body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                               ast.ClassDef))], type_ignores=[])
    module_names = _bound_names(module_scope)
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = _bound_names(n) | module_names
            reads |= set(_reads_on(n, lambda h, names=names: isinstance(h, ast.Name) and h.id in names))
        if isinstance(n, ast.ClassDef):
            attrs = {(t.value.id, t.attr) for a in ast.walk(n) if isinstance(a, (ast.Assign, ast.AnnAssign))
                     and a.value is not None and _is_record_call(a.value)
                     for t in (a.targets if isinstance(a, ast.Assign) else [a.target])
                     if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)}
            reads |= set(_reads_on(n, lambda h, attrs=attrs: isinstance(h, ast.Attribute)
                                   and isinstance(h.value, ast.Name) and (h.value.id, h.attr) in attrs))
    reads |= set(_reads_on(module_scope, lambda h: isinstance(h, ast.Name) and h.id in module_names))
    return sorted(reads)


def test_the_scan_sees_every_form():
    sample = (
        "from upstream import runtime_context as rc\n"
        "from upstream.runtime_context import get_server_args\n"
        "SA = get_server_args()\n"
        "def a():\n    return get_server_args().tp_size\n"
        "def b():\n    sa = get_server_args()\n    cfg = sa\n    return cfg.enable_deterministic_inference\n"
        "def c():\n    return getattr(rc.get_server_args(), 'pp_size', 1)\n"
        "def d():\n    return SA.dp_size\n"
        "class E:\n    def __init__(self):\n        self._sa = get_server_args()\n"
        "    def f(self):\n        return self._sa.enable_fused_moe_sum_all_reduce\n"
        "def fine(server_args):\n    return server_args.tp_size, get_exec().moe.enable_fused_moe_sum_all_reduce\n"
    )
    assert [f for _, f in record_reads(sample)] == [
        "tp_size", "enable_deterministic_inference", "pp_size", "dp_size", "enable_fused_moe_sum_all_reduce"]


def test_the_overlay_reads_no_field_off_get_server_args():
    found = {}
    for p in sorted(OVERLAY.rglob("*.py")):
        reads = record_reads(p.read_text())
        if reads:
            found[p.relative_to(REPO).as_posix()] = [f"line {ln}: .{f}" for ln, f in reads]
    assert not found, ("fields read off get_server_args() (0.5.23's ratchet forbids it; read them through "
                       f"upstream_api.resolved, declared in its RESOLVED_FIELDS): {found}")


@pytest.mark.parametrize("base", bases())
def test_no_patch_adds_a_field_read_off_get_server_args(base):
    pin = load_pin(base=base)
    members = read_upstream(fetch_pinned(pin, running_python_tag())[0])
    patched = patched_members(members, load_series(pin.patch_dir))
    assert patched
    grown = {}
    for name, text in sorted(patched.items()):
        if not name.endswith(".py"):
            continue
        before = record_reads(members[name].data.decode()) if name in members else []
        after = record_reads(text)
        if len(after) > len(before):
            grown[name] = {"upstream": len(before), "with the series": [f"line {ln}: .{f}" for ln, f in after]}
    assert not grown, f"base {base}: the series adds field reads off get_server_args(): {grown}"


def test_resolved_fields_are_declared_for_every_base():
    from importlib.util import module_from_spec, spec_from_file_location

    spec = spec_from_file_location("_upstream_api_under_test", OVERLAY / "upstream_api.py")
    api = module_from_spec(spec)
    spec.loader.exec_module(api)
    for field, where in api.RESOLVED_FIELDS.items():
        assert field in api.SERVER_ARGS_FIELDS
        assert set(where) == set(api.BASES), field
        for base, place in where.items():
            if place != "record":
                assert api.ANCHORS[f"{place}.{field}"][base], (field, base)
    # and the build's anchor check sees a reader that names no declared anchor
    api.RESOLVED_FIELDS["enable_fused_moe_sum_all_reduce"]["0.5.23"] = "exec.nowhere"
    wheel = fetch_pinned(load_pin(base="0.5.23"), running_python_tag())[0]
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())

        def read(path):
            member = path[len("python/"):]
            return z.read(member).decode() if member in names else None

        gone = api.missing(read, "0.5.23")
    assert gone == ["resolved enable_fused_moe_sum_all_reduce: exec.nowhere on 0.5.23 needs the anchors "
                    "runtime_context.get_exec and exec.nowhere.enable_fused_moe_sum_all_reduce"], gone
