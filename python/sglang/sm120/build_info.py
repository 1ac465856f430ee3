"""What this installation of the fork was built from (written by the build as _build_info.py)."""
from __future__ import annotations


def build_info() -> dict:
    try:
        from sglang.sm120 import _build_info as b
    except ImportError:
        return {"version": None, "note": "not a fork build (source checkout): no _build_info"}
    return {
        "version": b.__version__,
        "base": dict(b.BASE),
        "upstream": dict(b.UPSTREAM),
        "series": [dict(p) for p in b.SERIES],
        "kernels": dict(b.KERNELS),
    }
