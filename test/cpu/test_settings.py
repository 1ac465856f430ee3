"""sglang.sm120.settings: every SGLANG_SM120_* name the repository mentions is registered, the
accessors validate, the overlay reads its variables only through them, docs/settings.md carries
the generated tables, and README.md names only registered variables and flags."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

from sglang.sm120 import settings

pytestmark = pytest.mark.base_independent

REPO = Path(__file__).resolve().parents[2]
OVERLAY = REPO / "python" / "sglang" / "sm120"
# Built at run time so that this file itself does not mention an unregistered name.
UNREGISTERED = settings.PREFIX + "NOT_A_REGISTERED_SETTING"


# ---------------------------------------------------------------------------------- the scan

def test_every_name_the_repository_mentions_is_registered():
    missing = settings.unregistered(settings.scanned_files(REPO))
    assert not missing, ("SGLANG_SM120_* names mentioned but not registered in "
                         f"python/sglang/sm120/settings.py: {missing}")


def test_the_scan_reports_an_unregistered_name_and_skips_copies(tmp_path):
    (tmp_path / "tool.sh").write_text(f'echo "${{{UNREGISTERED}:-x}}" "$SGLANG_SM120_LEAN_MOE"\n')
    (tmp_path / "notes.md").write_text(UNREGISTERED)  # not a scanned kind
    for skipped in (".venv/lib", "lab/scratch", "build"):
        (tmp_path / skipped).mkdir(parents=True)
        (tmp_path / skipped / "old.py").write_text(f'os.environ["{UNREGISTERED}_TOO"]\n')
    found = settings.unregistered(settings.scanned_files(tmp_path))
    assert found == {UNREGISTERED: [str(tmp_path / "tool.sh")]}
    # and the repository test above fails on it
    with pytest.raises(AssertionError, match=UNREGISTERED):
        assert not found, found


def test_the_scan_sees_every_scope_and_every_registered_name_is_used():
    mentioned = settings.mentioned_names(settings.scanned_files(REPO))
    files = {n: " ".join(w) for n, w in mentioned.items()}
    assert "forkbuild" in files["SGLANG_SM120_KERNELS"] and "test/gpu" in files["SGLANG_SM120_GPU_QUICK"]
    assert "tools/" in files["SGLANG_SM120_DEPS"] and "sm120/kernels" in files["SGLANG_SM120_PDL"]
    unused = sorted(set(settings.REGISTRY) - set(mentioned))
    assert not unused, f"registered but mentioned nowhere (remove them): {unused}"


# ---------------------------------------------------------------------------------- accessors

@pytest.mark.parametrize("name, raw, accessor", [
    ("SGLANG_SM120_LEAN_MOE_PREFILL_TOKENS", "4k", settings.integer),
    ("SGLANG_SM120_LEAN_MOE_PREFILL_TOKENS", "-1", settings.integer),
    ("SGLANG_SM120_WORKSPACE_MB", "eight", settings.number),
    ("SGLANG_SM120_W4A16_KERNEL", "gemv", settings.choice),
    ("SGLANG_SM120_FP4_LARGE_M", "w8a8", settings.choice),
    ("SGLANG_SM120_LEAN_MOE", "yes", settings.switch),
    ("SGLANG_SM120_PDL", "true", settings.switch),
    ("SGLANG_SM120_TRAPS", "bogus", settings.choice),
])
def test_a_malformed_value_is_an_error_naming_the_variable(name, raw, accessor, monkeypatch):
    monkeypatch.setenv(name, raw)
    with pytest.raises(ValueError, match=f"^{name}={raw!r}: expected "):
        accessor(name)
    with pytest.raises(ValueError, match=name):
        settings.get(name, {name: raw})


@pytest.mark.parametrize("raw", [None, "", "  "])
def test_unset_or_empty_is_the_default(raw, monkeypatch):
    env = {} if raw is None else {s.name: raw for s in settings.SETTINGS}
    for s in settings.SETTINGS:
        assert settings.get(s.name, env) == s.default, s.name
    monkeypatch.delenv("SGLANG_SM120_LEAN_MOE_PREFILL_TOKENS", raising=False)
    assert settings.integer("SGLANG_SM120_LEAN_MOE_PREFILL_TOKENS") == 4096
    assert settings.switch("SGLANG_SM120_PDL") is True and settings.choice("SGLANG_SM120_W4A16_WARPS") == "auto"


def test_values_parse_to_their_types():
    env = {"SGLANG_SM120_LEAN_MOE": "0", "SGLANG_SM120_LEAN_MOE_PREFILL_TOKENS": " 1024 ",
           "SGLANG_SM120_WORKSPACE_MB": "0.5", "SGLANG_SM120_FP4_LARGE_M": "W4A16",
           "SGLANG_SM120_TRAPS": "1", "SGLANG_SM120_TRAP_LOG": "/tmp/t.jsonl"}
    assert settings.switch("SGLANG_SM120_LEAN_MOE", env) is False
    assert settings.integer("SGLANG_SM120_LEAN_MOE_PREFILL_TOKENS", env) == 1024
    assert settings.number("SGLANG_SM120_WORKSPACE_MB", env) == 0.5
    assert settings.choice("SGLANG_SM120_FP4_LARGE_M", env) == "w4a16"  # case folded where registered so
    assert settings.choice("SGLANG_SM120_TRAPS", env) == "raise"  # alias
    assert settings.path("SGLANG_SM120_TRAP_LOG", env) == "/tmp/t.jsonl"
    with pytest.raises(ValueError, match="SGLANG_SM120_W4A16_KERNEL='SPLIT'"):
        settings.choice("SGLANG_SM120_W4A16_KERNEL", {"SGLANG_SM120_W4A16_KERNEL": "SPLIT"})


def test_an_unregistered_name_or_the_wrong_accessor_raises():
    with pytest.raises(KeyError, match=UNREGISTERED):
        settings.get(UNREGISTERED, {UNREGISTERED: "1"})
    with pytest.raises(KeyError, match=UNREGISTERED):
        settings.switch(UNREGISTERED)
    with pytest.raises(TypeError, match="SGLANG_SM120_LEAN_MOE is a switch"):
        settings.integer("SGLANG_SM120_LEAN_MOE")


def test_the_registry_is_well_formed():
    for s in settings.SETTINGS:
        assert s.scope in settings.SCOPES and s.kind in settings.KINDS
        assert s.doc.strip() and "\n" not in s.doc, s.name
        assert s.parse(None) == s.default
    with pytest.raises(ValueError, match="scope"):
        settings.Setting(settings.PREFIX + "X", "switch", False, "everywhere", "doc")


def test_the_module_needs_only_the_standard_library():
    code = ("import sys, importlib.util as u; sys.modules['torch'] = None; "
            f"spec = u.spec_from_file_location('settings_alone', {settings.__file__!r}); "
            "m = u.module_from_spec(spec); sys.modules['settings_alone'] = m; spec.loader.exec_module(m); "
            "print(len(m.SETTINGS))")
    proc = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and int(proc.stdout) == len(settings.SETTINGS), proc.stderr


# ----------------------------------------------------------- the overlay reads only through it

def _direct_reads(path: Path):
    """(line, what) for every os.environ.get / os.getenv / os.environ[...] read in `path` of a
    SGLANG_SM120_* name, given as a literal or a module-level constant."""
    tree = ast.parse(path.read_text())
    consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
              and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
              for t in n.targets if isinstance(t, ast.Name)}

    def sm120_name(node):
        value = node.value if isinstance(node, ast.Constant) else consts.get(getattr(node, "id", None))
        return isinstance(value, str) and value.startswith(settings.PREFIX)

    reads = []
    for node in ast.walk(tree):
        text = ast.unparse(node)
        if isinstance(node, ast.Call) and node.args and (text.startswith(("os.environ.get(", "os.getenv("))):
            if sm120_name(node.args[0]):
                reads.append((node.lineno, text))
        elif (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)
              and ast.unparse(node.value) == "os.environ" and sm120_name(node.slice)):
            reads.append((node.lineno, text))
    return reads


def test_the_overlay_reads_its_variables_only_through_the_registry(tmp_path):
    found = {str(p.relative_to(REPO)): r for p in sorted(OVERLAY.rglob("*.py"))
             if p.name != "settings.py" and (r := _direct_reads(p))}
    assert not found, f"read SGLANG_SM120_* through sglang.sm120.settings instead: {found}"
    sample = tmp_path / "sample.py"
    sample.write_text('import os\nENV = "SGLANG_SM120_PDL"\nA = os.environ.get(ENV, "1")\n'
                      'B = os.getenv("SGLANG_SM120_TP")\nC = os.environ["SGLANG_SM120_TINY_DIR"]\n'
                      'os.environ[ENV] = "0"\nD = os.environ.get("HOME")\n')
    assert [line for line, _ in _direct_reads(sample)] == [3, 4, 5]


# ------------------------------------------------------------------------- tables and README

def test_the_tables_list_every_setting_and_flag():
    table = settings.markdown()
    for s in settings.SETTINGS:
        row = next(line for line in table.splitlines() if line.startswith(f"| `{s.name}` |"))
        assert f"| {s.scope} |" in row and f"| {s.default_text()} |" in row
    for f in settings.FLAGS:
        assert f"| `{f.flag}` |" in table


def test_every_flag_the_patches_add_is_listed():
    import re

    added = set()
    for patch in sorted((REPO / "patches").glob("*/*.patch")):  # every base's series
        added |= set(re.findall(r'^\+\s+"(--[a-z0-9-]+)"', patch.read_text(), re.M))
    listed = {f.flag.split()[0] for f in settings.FLAGS}
    assert added and added <= listed, added - listed
    for f in settings.FLAGS:  # each names an existing patch
        numbers = re.findall(r"patches/(\d{4})", f.source)
        for n in numbers:
            assert list((REPO / "patches").glob(f"*/{n}-*.patch")), (f.flag, n)


def test_replace_block_and_the_command_line(tmp_path, capsys):
    doc = tmp_path / "README.md"
    doc.write_text(f"# title\n\n{settings.BEGIN_MARKER}\nstale\n{settings.END_MARKER}\n\nafter\n")
    assert settings.main(["--write-docs", str(doc)]) == 0
    content = doc.read_text()
    assert content.startswith("# title\n\n") and content.endswith(f"{settings.END_MARKER}\n\nafter\n")
    assert "stale" not in content and settings.marked_block(content) == settings.markdown()
    assert settings.main(["--write-docs", str(doc)]) == 0 and doc.read_text() == content
    assert "already current" in capsys.readouterr().out
    assert settings.main(["--markdown"]) == 0 and capsys.readouterr().out == settings.markdown()
    doc.write_text("no markers\n")
    assert settings.main(["--write-docs", str(doc)]) == 1
    assert settings.BEGIN_MARKER in capsys.readouterr().err


def test_settings_doc_carries_the_generated_tables():
    doc = (REPO / "docs" / "settings.md").read_text()
    block = settings.marked_block(doc)
    assert block is not None, (f"docs/settings.md lacks {settings.BEGIN_MARKER} ... {settings.END_MARKER}; add "
                               "them and run: python -m sglang.sm120.settings --write-docs docs/settings.md")
    assert block == settings.markdown(), ("docs/settings.md's tables are stale; run: "
                                          "python -m sglang.sm120.settings --write-docs docs/settings.md")


def _unknown_in_readme(text: str) -> list:
    """Variables and table flags a README names that the registry lacks."""
    import re

    flags = {f.flag.split()[0] for f in settings.FLAGS}
    named = set()
    for flag in re.findall(r"^\| `(--[a-z0-9{},-]+)", text, re.M):  # `--a-{b,c}` names --a-b and --a-c
        m = re.fullmatch(r"([^{]*)\{([^}]*)\}(.*)", flag)
        named |= {m.group(1) + alt + m.group(3) for alt in m.group(2).split(",")} if m else {flag}
    return sorted({n for n in settings.NAME_PATTERN.findall(text) if n not in settings.REGISTRY}
                  | (named - flags))


def test_readme_names_only_registered_variables_and_flags():
    readme = (REPO / "README.md").read_text()
    assert settings.BEGIN_MARKER not in readme  # the full tables live in docs/settings.md
    table = [n for n in settings.NAME_PATTERN.findall(readme) if f"| `{n}` |" in readme]
    assert 10 <= len(set(table)) <= 20, "README's operator table: the handful of variables an operator sets"
    assert _unknown_in_readme(readme) == []
    sample = (f"| `{UNREGISTERED}` | 0 | x |\n| `--not-a-fork-flag` | x |\n| `SGLANG_SM120_PDL` | 1 | y |\n"
              "| `--cuda-graph-backend-{decode,verify} layerwise` | z |\n")
    assert _unknown_in_readme(sample) == ["--cuda-graph-backend-verify", "--not-a-fork-flag", UNREGISTERED]
