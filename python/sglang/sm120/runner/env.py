"""0/1 environment switches of the runner, read where they apply and checked at ServerArgs time."""
from __future__ import annotations

import os


def switch(name: str, default: bool, on: str, off: str) -> bool:
    """`name` unset or empty: `default`; 1 / 0: on / off; anything else: an error naming it."""
    raw = os.environ.get(name, "").strip()
    if raw == "":
        return default
    if raw in ("0", "1"):
        return raw == "1"
    raise ValueError(f"{name}={raw!r}: expected 1 ({on}) or 0 ({off})")
