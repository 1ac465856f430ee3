"""Environment switches of the runner (0/1, or one of a few names), read where they apply and
checked at ServerArgs time; a malformed value is an error naming the variable."""
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


def choice(name: str, choices, default: str, note: str = "") -> str:
    """`name` unset or empty: `default`; else one of `choices`."""
    raw = os.environ.get(name, "").strip()
    if raw == "":
        return default
    if raw not in choices:
        raise ValueError(f"{name}={raw!r}: expected one of {', '.join(choices)} (default {default}"
                         + (f"; {note})" if note else ")"))
    return raw
