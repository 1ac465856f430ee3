"""Import this checkout's sglang.sm120 kernels, also where an installed sglang comes first on the
path: upstream (no sm120), or a fork wheel of another commit (whose sm120 would be stale)."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def import_kernels():
    """(sglang.sm120.kernels, sglang.sm120.nvfp4) from REPO/python; SystemExit if that fails."""
    if str(REPO / "python") not in sys.path:
        sys.path.insert(0, str(REPO / "python"))
    overlay = REPO / "python" / "sglang"
    try:
        import sglang
    except ImportError:
        sglang = None
    if sglang is not None and overlay.resolve() not in [Path(d).resolve() for d in sglang.__path__]:
        sglang.__path__.insert(0, str(overlay))
        sm120 = importlib.import_module("sglang.sm120")  # may be the installed one, already imported
        if str(overlay / "sm120") not in list(sm120.__path__):
            sm120.__path__.insert(0, str(overlay / "sm120"))
        for name in [n for n in sys.modules if n.startswith(("sglang.sm120.kernels", "sglang.sm120.nvfp4", "sglang.sm120.check"))]:
            del sys.modules[name]  # loaded from the installed copy: reload from the checkout
    kernels, nvfp4 = importlib.import_module("sglang.sm120.kernels"), importlib.import_module("sglang.sm120.nvfp4")
    if not Path(kernels.__file__).resolve().is_relative_to(overlay.resolve()):
        raise SystemExit(f"error: imported {kernels.__file__}, not this checkout's {overlay}")
    return kernels, nvfp4
