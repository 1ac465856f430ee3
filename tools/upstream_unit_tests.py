#!/usr/bin/env python3
"""Run upstream SGLang's own unit tests against the fork and against upstream alone; report any
test whose outcome differs.

Upstream's tests are not in its wheel (nor on PyPI), so they come from a checkout of upstream's
repository at the base's release tag: pass its `test/` folder. Both packages run with the same
interpreter (a venv holding the base's dependencies, e.g. `.venv` or `.venv-0.5.16`): each wheel
is unpacked into WORK/<variant>/python/ with the test folder copied beside it as
WORK/<variant>/test/, the layout upstream's tests expect (the ratchet tests find the package at
`<repo>/python/sglang`), and that python/ goes first on PYTHONPATH, so the venv's own sglang is
not the one tested.

    python -m tools.upstream_unit_tests --tests ~/sglang-v0.5.23/test [--python .venv/bin/python]
        [--fork-wheel dist/0.5.23/sglang-*.whl] [--upstream-wheel FILE] [--work DIR] [FILE ...]

FILE: test files relative to --tests (default: those of DEFAULT_FILES that exist there). The
base is SGLANG_SM120_BASE or UPSTREAM.toml's default; the upstream wheel defaults to its pinned
one (cache or index, hash-checked), the fork wheel to dist/<base>/sglang-*.whl (tools/venv.sh
writes it there). Exit status: 0 the same outcome for every test, 1 a difference, 2 usage error.
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

from forkbuild.config import load_pin  # noqa: E402
from forkbuild.errors import BuildError  # noqa: E402
from forkbuild.upstream import fetch_pinned  # noqa: E402

# Upstream's guardrail tests over the whole package (the fork's overlay and patched files are
# part of it) and its server-args / runtime-context unit tests (the surfaces the series hooks).
# Globs relative to the test folder; the layout moved between releases (test/unit/ in 0.5.23,
# test/registered/unit/ later).
DEFAULT_FILES = (
    "**/unit/**/test_*ratchet*.py",
    "**/unit/**/test_server_args*.py",
    "**/unit/**/test_runtime_context*.py",
    "**/unit/**/test_cuda_graph_config*.py",
)
VARIANTS = ("upstream", "fork")


def default_files(tests: Path) -> list[str]:
    found = set()
    for pattern in DEFAULT_FILES:
        for p in glob.glob(str(tests / pattern), recursive=True):
            found.add(Path(p).relative_to(tests).as_posix())
    return sorted(found)


def python_tag(python: str) -> str:
    out = subprocess.run([python, "-c", "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def prepare(work: Path, variant: str, wheel: Path, tests: Path) -> Path:
    """WORK/<variant>/{python/<the wheel's files>, test/<a copy of tests>}; returns its root."""
    root = work / variant
    if root.exists():
        shutil.rmtree(root)
    (root / "python").mkdir(parents=True)
    with zipfile.ZipFile(wheel) as z:
        z.extractall(root / "python")
    shutil.copytree(tests, root / "test", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def run_variant(python: str, root: Path, files: list[str], timeout: float) -> tuple[dict[str, str], float, str]:
    """(test id -> passed/failed/error/skipped, seconds, pytest's last lines)."""
    report = root / "junit.xml"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "python"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    t0 = time.monotonic()
    proc = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                           *[f"test/{f}" for f in files]], cwd=root, env=env, capture_output=True, text=True,
                          timeout=timeout)
    seconds = time.monotonic() - t0
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
    return outcomes(report), seconds, tail


def outcomes(report: Path) -> dict[str, str]:
    if not report.is_file():
        return {}
    out = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        out[test_id] = ("failed" if "failure" in kinds else "error" if "error" in kinds
                        else "skipped" if "skipped" in kinds else "passed")
    return out


def differences(upstream: dict[str, str], fork: dict[str, str]) -> list[str]:
    return [f"{t}: upstream {upstream.get(t, 'absent')}, fork {fork.get(t, 'absent')}"
            for t in sorted(set(upstream) | set(fork)) if upstream.get(t) != fork.get(t)]


def summary(result: dict[str, str]) -> str:
    counts = {}
    for outcome in result.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "no tests ran"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.upstream_unit_tests", description=__doc__.splitlines()[0])
    ap.add_argument("--tests", type=Path, required=True, help="upstream's test/ folder at the base's tag")
    ap.add_argument("--python", default=None, help="interpreter of a venv with the base's dependencies")
    ap.add_argument("--fork-wheel", type=Path, default=None)
    ap.add_argument("--upstream-wheel", type=Path, default=None)
    ap.add_argument("--work", type=Path, default=None, help="working folder (default: a temporary one)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per variant (default 1800)")
    ap.add_argument("files", nargs="*", help="test files relative to --tests (default: DEFAULT_FILES)")
    args = ap.parse_args(argv)
    try:
        pin = load_pin()
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not args.tests.is_dir():
        print(f"error: --tests {args.tests}: not a folder (upstream's test/ at tag v{pin.version})", file=sys.stderr)
        return 2
    python = args.python or str(REPO / (".venv" if pin.default else f".venv-{pin.version}") / "bin" / "python")
    if not os.access(python, os.X_OK):
        print(f"error: --python {python}: not an interpreter (set up the base's venv with tools/venv.sh)", file=sys.stderr)
        return 2
    fork = args.fork_wheel or next(iter(sorted((REPO / "dist" / pin.version).glob("sglang-*.whl"))), None)
    if fork is None or not Path(fork).is_file():
        print(f"error: no fork wheel (--fork-wheel, or dist/{pin.version}/ from tools/venv.sh)", file=sys.stderr)
        return 2
    try:
        upstream = args.upstream_wheel or fetch_pinned(pin, python_tag(python))[0]
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    files = args.files or default_files(args.tests)
    missing = [f for f in files if not (args.tests / f).is_file()]
    if not files or missing:
        print(f"error: no such test file(s) under {args.tests}: {missing or list(DEFAULT_FILES)}", file=sys.stderr)
        return 2

    work = args.work or Path(tempfile.mkdtemp(prefix="upstream-unit-tests-"))
    print(f"[upstream-tests] base {pin.version}, {len(files)} file(s), {python}; work folder {work}")
    results = {}
    for variant, wheel in zip(VARIANTS, (upstream, fork)):
        root = prepare(work, variant, Path(wheel), args.tests)
        result, seconds, tail = run_variant(python, root, files, args.timeout)
        results[variant] = result
        print(f"[upstream-tests] {variant} ({Path(wheel).name}): {summary(result)} in {seconds:.0f} s")
        if not result:
            print(tail)
    diff = differences(results["upstream"], results["fork"])
    for line in diff:
        print(f"[upstream-tests] DIFFERENT {line}")
    print(f"[upstream-tests] {'no difference' if not diff else f'{len(diff)} difference(s)'} "
          f"over {len(set(results['upstream']) | set(results['fork']))} tests")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
