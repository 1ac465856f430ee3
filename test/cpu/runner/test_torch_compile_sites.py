"""Every torch.compile site in each base's patched sglang tree is accounted for
(torch_compile_sites.toml beside this file): routed through the Dynamo-free switch (the series
replaced its `torch.compile` by compile_unless_dynamo_free (python/sglang/sm120/runner/dynamo_free.py),
which runs the plain function when SGLANG_SM120_DYNAMO_FREE=1, i.e. under the layerwise backend), or
not reachable when serving GLM-5 / DSA, GLM-4-MoE, Qwen3-MoE or DeepSeek MLA models, with the
reason. Fails on a site the table does not list (a new upstream helper, or a routed one the
series lost), on a routed entry whose site is not wrapped, and on a stale entry.

The tree is what the build installs: the base's pinned upstream wheel with its series applied
(forkbuild), plus the overlay. A site is a decorator or call whose callee is `torch.compile` (or
compile_unless_dynamo_free), or any other use of `torch.compile` as a value; it is keyed by file
and enclosing qualified name. The GPU traps (test/gpu) remain the proof on 0.5.16 that no Dynamo
frame runs during capture and replay."""
from __future__ import annotations

import ast
import tomllib
import warnings
from collections import Counter
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

from forkbuild.build import patched_members, read_upstream  # noqa: E402
from forkbuild.config import bases, load_pin, running_python_tag  # noqa: E402
from forkbuild.patches import load_series  # noqa: E402
from forkbuild.upstream import fetch_pinned  # noqa: E402

pytestmark = pytest.mark.base_independent

TABLE = Path(__file__).with_name("torch_compile_sites.toml")
SWITCH = "compile_unless_dynamo_free"
COMPILE, ROUTED = "torch.compile", "routed"


def _is_torch_compile(node) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "compile" and \
        isinstance(node.value, ast.Name) and node.value.id == "torch"


def _is_switch(node) -> bool:
    return (isinstance(node, ast.Name) and node.id == SWITCH) or (isinstance(node, ast.Attribute) and node.attr == SWITCH)


def sites(source: str) -> Counter:
    """(qualified name of the enclosing def/class, or <module>; kind) -> count, for one module.
    kind: torch.compile (a decorator, a call or any other use of torch.compile) or routed (a
    decorator or call of compile_unless_dynamo_free). A decorator counts for the function it
    decorates."""
    found: Counter = Counter()

    def visit(node, qual):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            inner = f"{qual}.{node.name}" if qual else node.name
            for d in node.decorator_list:
                callee = d.func if isinstance(d, ast.Call) else d
                if _is_torch_compile(callee):
                    found[(inner, COMPILE)] += 1
                elif _is_switch(callee):
                    found[(inner, ROUTED)] += 1
                else:
                    visit(d, qual)
            for child in ast.iter_child_nodes(node):
                if child not in node.decorator_list:
                    visit(child, inner)
            return
        if isinstance(node, ast.Call) and _is_switch(node.func):
            found[(qual or "<module>", ROUTED)] += 1
        if _is_torch_compile(node):
            found[(qual or "<module>", COMPILE)] += 1
        for child in ast.iter_child_nodes(node):
            visit(child, qual)

    with warnings.catch_warnings():  # upstream sources with invalid escape sequences
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        tree = ast.parse(source)
    visit(tree, "")
    return found


@lru_cache(maxsize=None)
def tree_sites(base: str) -> dict[tuple[str, str], Counter]:
    """(file, qualified name) -> Counter(kind -> n) over the patched tree of `base` and the overlay."""
    pin = load_pin(base=base)
    members = read_upstream(fetch_pinned(pin, running_python_tag())[0])
    patched = patched_members(members, load_series(pin.patch_dir))
    texts = {n: patched.get(n) or members[n].data.decode() for n in members
             if n.startswith("sglang/") and n.endswith(".py")}
    for p in (REPO / "python" / "sglang" / "sm120").rglob("*.py"):
        texts["sglang/" + p.relative_to(REPO / "python" / "sglang").as_posix()] = p.read_text()
    out: dict[tuple[str, str], Counter] = {}
    for name, text in sorted(texts.items()):
        if "compile" not in text:
            continue
        for (qual, kind), n in sites(text).items():
            out.setdefault((name, qual), Counter())[kind] += n
    return out


def load_table(path: Path = TABLE) -> tuple[dict, dict]:
    data = tomllib.loads(path.read_text())
    return data.get("prefix", {}), data.get("site", {})


def check(base: str, found: dict[tuple[str, str], Counter], prefixes: dict, entries: dict) -> list[str]:
    """Every problem of `found` (one base's sites) against the table, one line each."""
    problems = []
    listed = {}
    for key, entry in entries.items():
        if base not in entry.get("bases", bases()):
            continue
        path, _, qual = key.partition("::")
        listed[(path, qual)] = (key, entry)
    for (path, qual), kinds in sorted(found.items()):
        key = f"{path}::{qual}"
        if (path, qual) not in listed:
            if not any(path.startswith(p) for p in prefixes):
                problems.append(f"{key}: {dict(kinds)} not in the table (route it, or say why it is not reached)")
            continue
        _, entry = listed[(path, qual)]
        count = entry.get("count", 1)
        if "routed" in entry:
            if kinds[COMPILE] or kinds[ROUTED] != count:
                problems.append(f"{key}: listed as routed by {entry['routed']} but found {dict(kinds)} "
                                f"(expected {count} {SWITCH} and no torch.compile)")
        elif "unreachable" in entry:
            if kinds[ROUTED] or kinds[COMPILE] != count:
                problems.append(f"{key}: listed as unreachable but found {dict(kinds)} (expected {count} torch.compile)")
        elif "switch" in entry:
            if kinds[COMPILE] != count:
                problems.append(f"{key}: the switch's own torch.compile, found {dict(kinds)}")
        else:
            problems.append(f"{key}: an entry needs routed, unreachable or switch")
    for (path, qual), (key, _) in sorted(listed.items()):
        if (path, qual) not in found:
            problems.append(f"{key}: stale entry, no such site on {base}")
    return problems


def test_every_entry_is_well_formed():
    prefixes, entries = load_table()
    assert set(prefixes) == {"sglang/multimodal_gen/", "sglang/test/"}, prefixes
    for key, entry in entries.items():
        kinds = [k for k in ("routed", "unreachable", "switch") if k in entry]
        assert len(kinds) == 1 and str(entry[kinds[0]]).strip(), (key, entry)
        assert set(entry.get("bases", bases())) <= set(bases()), key
        if "routed" in entry:
            assert any((REPO / "patches").glob(f"*/{entry['routed']}-*.patch")), key
        if "switch" in entry:
            assert key.startswith("sglang/sm120/runner/dynamo_free.py::"), key


@pytest.mark.parametrize("base", bases())
def test_every_torch_compile_site_is_routed_or_unreachable(base):
    prefixes, entries = load_table()
    found = tree_sites(base)
    assert sum(c[COMPILE] for c in found.values()) > 20  # the walk sees the tree
    problems = check(base, found, prefixes, entries)
    assert not problems, f"base {base}:\n" + "\n".join(problems)


@pytest.mark.parametrize("base", bases())
def test_routed_sites_are_the_serving_path_ones(base):
    """The sites the issue names as serving path are routed on both bases."""
    found = tree_sites(base)
    for key in ("sglang/srt/layers/sampler.py::multinomial_with_seed",
                "sglang/srt/sampling/penaltylib/repetition_penalty.py::apply_scaling_penalties",
                "sglang/srt/layers/rotary_embedding/base.py::RotaryEmbedding.__init__",
                "sglang/srt/managers/overlap_utils.py::_assert_nonneg_and_invalidate",
                "sglang/srt/layers/quantization/kvfp4_tensor.py::FP4MXBlock16KVQuantizeUtil.batched_quantize",
                "sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe.py::moe_sum_reduce_torch_compile"):
        path, _, qual = key.partition("::")
        assert found[(path, qual)] == Counter({ROUTED: 1}), (key, found.get((path, qual)))


def test_the_walk_and_the_check_catch_each_failure():
    src = (
        "import torch\n"
        "@torch.compile\ndef a(x): return x\n"
        "@torch.compile(dynamic=True)\ndef b(x): return x\n"
        "@compile_unless_dynamo_free(dynamic=True)\ndef c(x): return x\n"
        "class K:\n"
        "    @staticmethod\n    @compile_unless_dynamo_free\n    def d(x): return x\n"
        "    def __init__(self):\n        self.f = torch.compile(dynamic=True)(a)\n"
        "        self.g = compile_unless_dynamo_free(dynamic=True)(a)\n"
        "compiler = torch.compile\n"
    )
    assert sites(src) == Counter({("a", COMPILE): 1, ("b", COMPILE): 1, ("c", ROUTED): 1, ("K.d", ROUTED): 1,
                                  ("K.__init__", COMPILE): 1, ("K.__init__", ROUTED): 1,
                                  ("<module>", COMPILE): 1})
    found = {("x.py", "a"): Counter({COMPILE: 1}), ("x.py", "c"): Counter({ROUTED: 1}),
             ("x.py", "new"): Counter({COMPILE: 1}), ("gen/y.py", "z"): Counter({COMPILE: 1})}
    entries = {"x.py::a": {"routed": "0106"},              # claims routed, is not wrapped
               "x.py::c": {"routed": "0106"},              # fine
               "x.py::gone": {"unreachable": "only for model X"}}  # stale
    problems = check("0.5.23", found, {"gen/": "elsewhere"}, entries)
    assert [p.split(":")[0] + "::" + p.split("::")[1].split(":")[0] for p in problems] == [
        "x.py::a", "x.py::new", "x.py::gone"], problems
    assert "not in the table" in problems[1] and "stale entry" in problems[2]
