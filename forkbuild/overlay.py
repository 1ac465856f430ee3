"""The overlay: new modules under python/sglang/ that upstream does not have."""
from __future__ import annotations

from pathlib import Path

from .errors import BuildError

# Produced by the build or by a local kernel build; never shipped from the source tree.
GENERATED = ("sglang/sm120/_build_info.py", "sglang/sm120/kernels/lib/")
SKIP_PARTS = ("__pycache__",)
SKIP_SUFFIXES = (".pyc", ".pyo", ".so", ".o")


def list_overlay(python_dir: Path) -> dict[str, Path]:
    """Wheel member name (sglang/...) -> source file, for every overlay file."""
    root = python_dir / "sglang"
    out = {}
    if not root.is_dir():
        return out
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(python_dir).as_posix()
        if any(p in SKIP_PARTS for p in path.parts) or path.suffix in SKIP_SUFFIXES:
            continue
        if rel in GENERATED or any(rel.startswith(g) for g in GENERATED if g.endswith("/")):
            continue
        out[rel] = path
    return out


def check_shadow(overlay: dict[str, Path], upstream_names) -> None:
    clash = sorted(set(overlay) & set(upstream_names))
    if clash:
        raise BuildError(
            f"overlay file python/{clash[0]} exists in upstream ({len(clash)} clash(es)): "
            "change upstream files with a patch, never by shadowing them"
        )
