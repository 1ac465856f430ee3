"""UPSTREAM.toml: the supported upstream releases (bases), their artifact hashes, the fork version.

One tree builds against several upstream releases. Each base has its own table (wheels and
their sha256, deliberate Requires-Dist changes) and its own patch series in patches/<version>/;
the overlay is shared. SGLANG_SM120_BASE picks the base; unset, the build takes
[upstream].default (the latest supported release).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from . import settings as build_settings
from .errors import BuildError
from .upstream_toml import REPO, bases, default_base  # noqa: F401 (callers import them from here)
from .upstream_toml import read as _read
ENV_BASE = "SGLANG_SM120_BASE"


@dataclass(frozen=True)
class RequirementChange:
    requirement: str
    reason: str


@dataclass(frozen=True)
class Pin:
    package: str
    version: str
    index: str
    local: str
    wheels: dict[str, str]
    add: tuple[RequirementChange, ...] = field(default_factory=tuple)
    remove: tuple[RequirementChange, ...] = field(default_factory=tuple)
    patch_dir: Path = REPO / "patches"
    verified: str = ""
    default: bool = False

    @property
    def fork_version(self) -> str:
        return f"{self.version}+{self.local}"

    def wheel_for(self, python_tag: str) -> str:
        """File name of the pinned x86_64 wheel for a CPython tag such as 'cp311'."""
        for name in self.wheels:
            if f"-{python_tag}-{python_tag}-" in name:
                return name
        supported = sorted({n.split("-")[2] for n in self.wheels})
        raise BuildError(
            f"Python {python_tag[2]}.{python_tag[3:]} is not supported: {self.package} {self.version} "
            f"wheels are pinned for {', '.join(supported)} (UPSTREAM.toml)"
        )


def running_python_tag() -> str:
    return f"cp{sys.version_info.major}{sys.version_info.minor}"


def _changes(entries, where: str) -> tuple[RequirementChange, ...]:
    out = []
    for e in entries:
        if not isinstance(e, dict) or not e.get("requirement") or not e.get("reason"):
            raise BuildError(f"UPSTREAM.toml {where}: every entry needs 'requirement' and 'reason'")
        out.append(RequirementChange(e["requirement"], e["reason"]))
    return tuple(out)


def load_pin(path: Path | None = None, base: str | None = None) -> Pin:
    """The pin of one base: `base`, else $SGLANG_SM120_BASE, else [upstream].default."""
    path = path or REPO / "UPSTREAM.toml"
    data = _read(path)
    try:
        up, fork, table = data["upstream"], data["fork"], data["base"]
        default = up["default"]
    except KeyError as e:
        raise BuildError(f"{path}: missing key {e}") from None
    from_env = None if base else build_settings.read(ENV_BASE)
    version = base or from_env or default
    if version not in table:
        how = f"{ENV_BASE}={version!r}" if from_env else f"base {version!r}"
        raise BuildError(f"{how}: expected one of {', '.join(table)} (the bases in UPSTREAM.toml)")
    b = table[version]
    try:
        req = b.get("requires_dist", {})
        where = f'[base."{version}".requires_dist]'
        return Pin(
            package=up["package"],
            version=version,
            index=up.get("index", "https://pypi.org/simple"),
            local=fork["local"],
            wheels=dict(b["wheels"]),
            add=_changes(req.get("add", []), where + ".add"),
            remove=_changes(req.get("remove", []), where + ".remove"),
            patch_dir=path.parent / "patches" / version,
            verified=b.get("verified", ""),
            default=version == default,
        )
    except KeyError as e:
        raise BuildError(f'{path}: [base."{version}"] lacks key {e}') from None
