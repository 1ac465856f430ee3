"""The upstream anchors (python/sglang/sm120/upstream_api.py) checked against a source tree.

upstream_api.py is the overlay's one declaration of the upstream symbols it and the series rely
on. It is stdlib-only, so the build loads it by path (no sglang, no torch) and runs its own
checker over the patched upstream members: a missing anchor fails the build, naming it.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from .errors import BuildError

API_FILE = Path("python/sglang/sm120/upstream_api.py")


def load_api(repo: Path):
    path = repo / API_FILE
    if not path.is_file():
        raise BuildError(f"{API_FILE}: missing (the overlay must declare its upstream anchors there)")
    spec = importlib.util.spec_from_file_location("_sm120_upstream_api", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def member_reader(members: dict, patched: dict[str, str] | None = None):
    """python/sglang/... -> text of the upstream wheel's member (patched where given)."""
    patched = patched or {}

    def read(path: str) -> str | None:
        name = path[len("python/"):]
        if name in patched:
            return patched[name]
        m = members.get(name)
        return m.data.decode() if m is not None else None

    return read


def check_anchors(repo: Path, read, base: str) -> int:
    """Fail the build on the first missing anchor (all of them listed); returns how many hold."""
    api = load_api(repo)
    gone = api.missing(read, base)
    if gone:
        raise BuildError(f"upstream anchor missing on base {base}: {gone[0]}"
                         + (f" (and {len(gone) - 1} more: {'; '.join(gone[1:])})" if len(gone) > 1 else "")
                         + f" -- declared in {API_FILE}")
    return sum(1 for w in api.ANCHORS.values() if w.get(base)) + len(api.SERVER_ARGS_FIELDS)
