"""Every server launch line README.md and docs/ show, and every server flag README names, parses
under the installed base's own CLI parser (the one `python -m sglang.launch_server` and `sglang
serve` build), so a documented command never dies on 'unrecognized arguments'.

The documents are read at test time: a launch line added to README is checked from then on.
Placeholders (`<GLM-5-NVFP4 checkpoint>`, `MODEL`) only fill a value, so they stand as they are
or become a path.
"""
import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
DOCS = [REPO / "README.md"] + sorted((REPO / "docs").rglob("*.md"))
LAUNCH = re.compile(r"(?:^|\s)(?:\S*python3?\s+-m\s+sglang\.launch_server|sglang\s+serve)(?=\s|$)(.*)")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)


def _code_lines(text: str):
    """The logical lines of the fenced code blocks (backslash continuations joined)."""
    for block in FENCE.findall(text):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            yield line


def launch_lines():
    """(document, argv after the command) of each launch line in a code block."""
    found = []
    for doc in DOCS:
        for line in _code_lines(doc.read_text()):
            m = LAUNCH.search(line)
            if m:
                argv = shlex.split(re.sub(r"<[^>]*>", "/placeholder", m.group(1)), comments=True)
                found.append((doc.relative_to(REPO).as_posix(), argv))
    return found


def _parser():
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    return parser


def _parse(argv):
    """Parse as the server would; an unknown flag or a bad value raises with argparse's message."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            return _parser().parse_args(argv)
        except SystemExit:
            raise AssertionError(err.getvalue().strip().splitlines()[-1]) from None


def test_readme_has_launch_lines():
    assert any(doc == "README.md" for doc, _ in launch_lines())


@pytest.mark.parametrize("doc,argv", launch_lines(), ids=lambda v: v if isinstance(v, str) else None)
def test_a_documented_launch_line_parses(doc, argv):
    _parse(argv)


def _tool_flags():
    """Flags of the fork's own commands README shows (the tiny-model generator, the demo), read
    from their --help."""
    from sglang.sm120 import demo
    from sglang.sm120.tiny import __main__ as tiny

    flags = set()
    for parse in (tiny.parse_args, demo.parse_args):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
            parse(["--help"])
        flags.update(re.findall(r"--[a-z0-9-]+", out.getvalue()))
    return flags - {"--help"}


def _readme_server_flags():
    """Flags README names as the server's: every inline `--flag ...` span outside code blocks
    that starts with a flag (the flags table among them), less the flags of the fork's own tools
    (`--arch glm_moe_dsa`). `{a,b}` spans stand for each choice."""
    text = FENCE.sub("", (REPO / "README.md").read_text())
    flags = set()
    for span in re.findall(r"`(--[^`\n]*)`", text):
        for word in re.findall(r"(?<![\w-])--[a-z0-9{},-]+", span):
            m = re.fullmatch(r"(--[a-z0-9-]*?)\{([a-z0-9,-]+)\}([a-z0-9-]*)", word)
            names = [m.group(1) + c + m.group(3) for c in m.group(2).split(",")] if m else [word]
            flags.update(n for n in names if re.fullmatch(r"--[a-z0-9]+(-[a-z0-9]+)*", n))
    return sorted(flags - _tool_flags())


def test_the_seeds_launch_line_parses():
    """GLM-5-NVFP4's published recipe, as the GPU launch-line test starts it (the seed's
    launch line), on a checkpoint path."""
    from test_glm5_launch_line import LAUNCH_LINE

    assert "--piecewise-cuda-graph-compiler" in LAUNCH_LINE
    _parse(["--model-path", "/placeholder", "--tp-size", "8"] + LAUNCH_LINE)


def test_readme_names_server_flags():
    assert "--enable-piecewise-cuda-graph" in _readme_server_flags()


@pytest.mark.parametrize("flag", _readme_server_flags())
def test_a_flag_readme_names_is_a_server_flag(flag):
    known = {o for a in _parser()._actions for o in a.option_strings}
    assert flag in known, f"README names {flag}, which this base's server CLI does not accept"
