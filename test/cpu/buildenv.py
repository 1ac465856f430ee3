"""Helpers for tests that drive the fork build (setup.py) in a scratch copy of the repo."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from forkbuild.config import bases, load_pin, running_python_tag
from forkbuild.upstream import fetch_pinned

REPO = Path(__file__).resolve().parents[2]

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


def write_patched_tree(dest: Path):
    """Upstream's sglang/ sources with the whole series applied, written under dest/python, the
    overlay linked in. Returns (root, series names, {patched member: text}); raises
    UpstreamUnavailable when the pinned wheel cannot be had."""
    from forkbuild.build import patched_members
    from forkbuild.patches import parse_patch, read_series
    from forkbuild.tree import pinned_upstream

    try:
        members = pinned_upstream()
    except Exception as e:  # noqa: BLE001
        raise UpstreamUnavailable(f"pinned upstream wheel unavailable (needs PyPI or SGLANG_UPSTREAM_WHEEL): {e}") from e
    series = series_dir()
    names = read_series(series)
    changed = patched_members(members, [parse_patch(n, (series / n).read_text()) for n in names])
    root = dest / "python"
    for name, m in members.items():
        if name.startswith("sglang/"):
            out = root / name
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(changed[name].encode() if name in changed else m.data)
    (root / "sglang" / "sm120").symlink_to(REPO / "python" / "sglang" / "sm120")
    return root, names, changed


class UpstreamUnavailable(RuntimeError):
    pass
