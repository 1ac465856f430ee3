"""UPSTREAM.toml: what upstream release is pinned, its artifact hashes, the fork version."""
from __future__ import annotations

import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .errors import BuildError

REPO = Path(__file__).resolve().parent.parent


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


def _changes(entries, key: str) -> tuple[RequirementChange, ...]:
    out = []
    for e in entries:
        if not isinstance(e, dict) or not e.get("requirement") or not e.get("reason"):
            raise BuildError(f"UPSTREAM.toml [requires_dist].{key}: every entry needs 'requirement' and 'reason'")
        out.append(RequirementChange(e["requirement"], e["reason"]))
    return tuple(out)


def load_pin(path: Path | None = None) -> Pin:
    path = path or REPO / "UPSTREAM.toml"
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise BuildError(f"{path}: missing") from None
    except tomllib.TOMLDecodeError as e:
        raise BuildError(f"{path}: {e}") from None
    try:
        up, fork = data["upstream"], data["fork"]
        req = data.get("requires_dist", {})
        return Pin(
            package=up["package"],
            version=up["version"],
            index=up.get("index", "https://pypi.org/simple"),
            local=fork["local"],
            wheels=dict(up["wheels"]),
            add=_changes(req.get("add", []), "add"),
            remove=_changes(req.get("remove", []), "remove"),
        )
    except KeyError as e:
        raise BuildError(f"{path}: missing key {e}") from None
