"""Patch headers and the lines the patches add (both series), and the overlay's docstrings and
comments, cite no file that does not exist: every path-like token (`docs/runner.md`,
`csrc/common.cuh`, `arg_groups/pipeline.py`, a bare `README.md`) names a file of this repository
or of the upstream release the text belongs to (a patch: its base's wheel; the overlay: either
base). Files the code writes rather than cites are listed in WRITTEN, with why."""
from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
import zipfile
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

from forkbuild.config import bases, load_pin, running_python_tag  # noqa: E402
from forkbuild.upstream import fetch_pinned  # noqa: E402

pytestmark = pytest.mark.base_independent

SUFFIXES = ("md", "py", "toml", "sh", "cu", "cuh", "h", "cpp", "json", "jsonl", "txt", "patch",
            "yaml", "yml", "ini", "cfg")
# A path-like token starts after a character that cannot belong to a path (so the tail of a URL,
# a glob such as `csrc/*.cu` or a placeholder such as `patches/<base>/x.patch` is not one).
TOKEN = re.compile(r"(?<![\w./\-*<>{}$:])((?:[\w.-]+/)*[\w-][\w.-]*\.(?:" + "|".join(SUFFIXES) + r"))(?![\w/])")

# Names the overlay writes (a generated model folder, the build's output), not files it cites.
WRITTEN = {
    "config.json": "tiny / full-size model folders: written by python/sglang/sm120/tiny/",
    "generation_config.json": "tiny model folders: written by python/sglang/sm120/tiny/",
    "hf_quant_config.json": "NVFP4 tiny model folders: written by python/sglang/sm120/tiny/quantize.py",
    "special_tokens_map.json": "tiny model tokenizer: written by python/sglang/sm120/tiny/tokenizer.py",
    "tokenizer.json": "tiny model tokenizer: written by python/sglang/sm120/tiny/tokenizer.py",
    "tokenizer_config.json": "tiny model tokenizer: written by python/sglang/sm120/tiny/tokenizer.py",
    "tiny_reference.json": "tiny model folders: the reference answers python/sglang/sm120/tiny/ writes",
    "fullsize_model.json": "full-size shape folders: written by python/sglang/sm120/tiny/fullsize.py",
    "model.safetensors.index.json": "full-size shape folders: written by python/sglang/sm120/tiny/fullsize.py",
    "_build_info.py": "sglang/sm120/_build_info.py: generated into the wheel by forkbuild/build.py",
}


def patch_text(content: str) -> str:
    """A patch's header and the lines it adds (context and removed lines are upstream's)."""
    head, _, diff = content.partition("\n---\n")
    added = [ln[1:] for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    return "\n".join([head, *added])


def prose_text(source: str) -> str:
    """Docstrings and comments of a Python source."""
    out = [d for node in ast.walk(ast.parse(source))
           if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
           and (d := ast.get_docstring(node, clean=False))]
    out += [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]
    return "\n".join(out)


def cited(text: str) -> set[str]:
    return set(TOKEN.findall(text))


def resolves(token: str, files: frozenset[str]) -> bool:
    """`token` is a file of `files` (repository-relative paths), or the tail of one."""
    return token in files or any(f.endswith("/" + token) for f in files)


@lru_cache(maxsize=None)
def repo_files() -> frozenset[str]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout.split()
    return frozenset(out)


@lru_cache(maxsize=None)
def upstream_files(base: str) -> frozenset[str]:
    """The base's upstream wheel members as source paths (python/sglang/...)."""
    wheel = fetch_pinned(load_pin(base=base), running_python_tag())[0]
    with zipfile.ZipFile(wheel) as z:
        return frozenset("python/" + n for n in z.namelist())


def missing_citations(texts: dict[str, str], pools: list[frozenset[str]]) -> dict[str, list[str]]:
    bad = {}
    for where, text in texts.items():
        gone = sorted(t for t in cited(text) if t not in WRITTEN and not any(resolves(t, p) for p in pools))
        if gone:
            bad[where] = gone
    return bad


@pytest.mark.parametrize("base", bases())
def test_patches_cite_only_existing_files(base):
    texts = {p.relative_to(REPO).as_posix(): patch_text(p.read_text()) for p in sorted((REPO / "patches" / base).glob("*.patch"))}
    assert texts
    bad = missing_citations(texts, [repo_files(), upstream_files(base)])
    assert not bad, f"patches cite files that exist neither in this repository nor in upstream {base}: {bad}"


def test_overlay_docstrings_and_comments_cite_only_existing_files():
    texts = {p.relative_to(REPO).as_posix(): prose_text(p.read_text())
             for p in sorted((REPO / "python" / "sglang" / "sm120").rglob("*.py"))}
    bad = missing_citations(texts, [repo_files(), *(upstream_files(b) for b in bases())])
    assert not bad, f"overlay docstrings / comments cite files that exist nowhere: {bad}"


def test_every_written_name_is_still_written():
    """An allow-list entry whose name no overlay text mentions any more is stale."""
    overlay = "\n".join(p.read_text() for p in (REPO / "python" / "sglang" / "sm120").rglob("*.py"))
    stale = sorted(n for n in WRITTEN if n not in overlay)
    assert not stale, f"WRITTEN entries no overlay file mentions (remove them): {stale}"


def test_the_scan_finds_paths_and_skips_urls_globs_and_placeholders():
    text = ("see docs/runner.md and REFERENCE.md (csrc/common.cuh, arg_groups/pipeline.py); "
            "https://example.com/a/b.py csrc/*.cu patches/<base>/0201-x.patch sglang.sm120.settings "
            "`tools/venv.sh`, test/cpu/test_settings.py.")
    assert cited(text) == {"docs/runner.md", "REFERENCE.md", "csrc/common.cuh", "arg_groups/pipeline.py",
                           "tools/venv.sh", "test/cpu/test_settings.py"}
    pool = frozenset({"docs/runner.md", "csrc/common.cuh", "python/sglang/srt/arg_groups/pipeline.py",
                      "tools/venv.sh", "test/cpu/test_settings.py"})
    assert missing_citations({"x.patch": text}, [pool]) == {"x.patch": ["REFERENCE.md"]}
    # a patch's removed and context lines are upstream's text, not citations
    sample = "Subject: s\nWhy: see docs/runner.md\n---\n--- a/f.py\n+++ b/f.py\n@@ -1 +1 @@\n-# GONE.md\n # OLD.md\n+# NEW.md\n"
    assert cited(patch_text(sample)) == {"docs/runner.md", "NEW.md"}
