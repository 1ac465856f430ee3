"""Helpers for tests that drive the fork build (setup.py) in a scratch copy of the repo."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from forkbuild.config import bases, load_pin, running_python_tag  # noqa: E402
from forkbuild.upstream import fetch_pinned  # noqa: E402

BUILD_PARTS = ("setup.py", "pyproject.toml", "UPSTREAM.toml", "forkbuild", "patches", "python")


def series_dir(repo: Path = REPO) -> Path:
    """The chosen base's patch series folder (patches/<version>/) in `repo`."""
    return repo / "patches" / load_pin().version


def gpu_verified_base() -> str:
    """The base UPSTREAM.toml marks as verified on the GPU host (the one its tooling serves)."""
    return next(b for b in bases() if load_pin(base=b).verified.startswith("GPU"))


def pinned_wheel() -> Path:
    return fetch_pinned(load_pin(), running_python_tag())[0]


def scratch_repo(dest: Path) -> Path:
    dest.mkdir(parents=True)
    for part in BUILD_PARTS:
        src = REPO / part
        if src.is_dir():
            shutil.copytree(src, dest / part, ignore=shutil.ignore_patterns("__pycache__", "_build_info.py", "lib"))
        else:
            shutil.copy(src, dest / part)
    return dest


def run_build(repo: Path, out: Path, *args: str, **env_extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SGLANG_SM120_KERNELS": "0", **env_extra}
    return subprocess.run(
        [sys.executable, str(repo / "setup.py"), "wheel", "--out", str(out), *args],
        capture_output=True, text=True, env=env, timeout=300,
    )


def error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [l for l in proc.stderr.splitlines() if l.startswith("error: ")]
    assert len(lines) == 1, proc.stderr
    return lines[0]
