"""The fork's UPSTREAM.toml, read so the wheelhouse matches what the fork build will produce.

The build pins the upstream release and the sha256 of each upstream wheel, and lists the
fork's deliberate Requires-Dist changes ([requires_dist] add/remove, exact strings). The
wheelhouse must agree on all three, or the host would build a fork whose requirements the
wheelhouse did not resolve.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# UPSTREAM.toml has one reader: the fork build's own (forkbuild/ at the repository root, which
# `python -m deploy.wheelhouse` from there puts on sys.path).
from forkbuild.config import bases, default_base, load_pin
from forkbuild.errors import BuildError


class ForkPinError(ValueError):
    pass


@dataclass(frozen=True)
class ForkPin:
    package: str
    version: str
    wheels: dict[str, str]  # upstream wheel file name -> sha256
    add: tuple[str, ...]
    remove: tuple[str, ...]
    source: str


def load_fork_pin(path: Path, version: str | None = None) -> ForkPin | None:
    """The pin of base `version` when that UPSTREAM.toml has it, else of its default base (not
    SGLANG_SM120_BASE: that picks this checkout's build, and the pin file may be another's)."""
    if not path.is_file():
        return None
    try:
        pin = load_pin(path, base=version if version in bases(path) else default_base(path))
    except BuildError as e:
        raise ForkPinError(f"--upstream-pin {path}: cannot read the upstream pin ({e})") from None
    return ForkPin(
        package=pin.package, version=pin.version, wheels=dict(pin.wheels),
        add=tuple(c.requirement for c in pin.add), remove=tuple(c.requirement for c in pin.remove),
        source=str(path),
    )


def fork_requires(upstream_requires: list[str], pin: ForkPin) -> list[str]:
    """Upstream's Requires-Dist with the fork's changes, the way the fork build applies them."""
    out = list(upstream_requires)
    for req in pin.remove:
        if req not in out:
            raise ForkPinError(f"{pin.source} removes Requires-Dist {req!r}, which upstream does not have")
        out.remove(req)
    return out + list(pin.add)
