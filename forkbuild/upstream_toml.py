"""UPSTREAM.toml as data: the file, its bases and its default base. No environment is read here,
so forkbuild.settings (which checks SGLANG_SM120_BASE against the bases) and forkbuild.config
(which builds a base's pin) both stand on this module."""
from __future__ import annotations

import tomllib
from pathlib import Path

from .errors import BuildError

REPO = Path(__file__).resolve().parent.parent


def read(path: Path | None = None) -> dict:
    path = path or REPO / "UPSTREAM.toml"
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise BuildError(f"{path}: missing") from None
    except tomllib.TOMLDecodeError as e:
        raise BuildError(f"{path}: {e}") from None


def bases(path: Path | None = None) -> list[str]:
    """Every supported upstream version, in file order."""
    return list(read(path).get("base", {}))


def default_base(path: Path | None = None) -> str | None:
    """The base a build takes when SGLANG_SM120_BASE is unset."""
    return read(path).get("upstream", {}).get("default")
