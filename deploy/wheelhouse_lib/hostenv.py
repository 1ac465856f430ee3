"""The target machine: its interpreter and platform tags, and the packages it already has."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from .compat import InvalidVersion, Version, canonicalize_name


class HostListError(ValueError):
    """A package list (pip freeze / pip list) that cannot be read."""


@dataclass(frozen=True)
class Target:
    """The interpreter and platform the wheels are for.

    pip matches --platform tags exactly (no implied older manylinux levels), so every level
    up to the target's glibc is listed; a missing level makes a package look absent.
    """

    python: str = "3.12"  # "3.12" or "3.12.3"
    glibc: str = "2.39"
    arch: str = "x86_64"

    def __post_init__(self):
        if not re.fullmatch(r"3\.\d+(\.\d+)?", self.python):
            raise ValueError(f"--python: expected a version like 3.12 or 3.12.3, got {self.python!r}")
        if not re.fullmatch(r"2\.\d+", self.glibc):
            raise ValueError(f"--glibc: expected a version like 2.39, got {self.glibc!r}")
        if not re.fullmatch(r"[a-z0-9_]+", self.arch):
            raise ValueError(f"--arch: expected a machine name like x86_64, got {self.arch!r}")

    @property
    def python_minor(self) -> str:
        return ".".join(self.python.split(".")[:2])

    @property
    def python_full(self) -> str:
        return self.python if self.python.count(".") == 2 else self.python + ".0"

    @property
    def cp_tag(self) -> str:
        return "cp" + self.python_minor.replace(".", "")

    def platforms(self) -> list[str]:
        """pip --platform values, most specific first (pip prefers earlier tags)."""
        glibc_minor = int(self.glibc.split(".")[1])
        tags = [f"manylinux_2_{m}_{self.arch}" for m in range(glibc_minor, 4, -1)]
        # Legacy aliases: manylinux2014 = glibc 2.17, manylinux2010 = 2.12, manylinux1 = 2.5.
        for alias, needs in (("manylinux2014", 17), ("manylinux2010", 12), ("manylinux1", 5)):
            if glibc_minor >= needs:
                tags.append(f"{alias}_{self.arch}")
        tags.append(f"linux_{self.arch}")
        return tags

    def marker_env(self, extra: str = "") -> dict[str, str]:
        """PEP 508 marker variables of the target (never of the interpreter running the tool)."""
        return {
            "implementation_name": "cpython",
            "implementation_version": self.python_full,
            "os_name": "posix",
            "platform_machine": self.arch,
            "platform_python_implementation": "CPython",
            "platform_release": "",
            "platform_system": "Linux",
            "platform_version": "",
            "python_full_version": self.python_full,
            "python_version": self.python_minor,
            "sys_platform": "linux",
            "extra": extra,
        }


@dataclass
class HostPackages:
    """Packages installed on the target: normalized name -> Version (None if unknown)."""

    versions: dict[str, Version | None] = field(default_factory=dict)
    spelled: dict[str, str] = field(default_factory=dict)  # normalized -> as written
    source: str = ""

    def version_of(self, name: str) -> Version | None:
        return self.versions.get(canonicalize_name(name))

    def has(self, name: str) -> bool:
        return canonicalize_name(name) in self.versions

    def __len__(self) -> int:
        return len(self.versions)


_FREEZE_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*===?\s*([^\s;#]+)")
_DIRECT_URL = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*@\s*(\S+)")
_EGG = re.compile(r"#egg=([A-Za-z0-9][A-Za-z0-9._-]*)")
_LIST_ROW = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s+(\S+)(\s+.*)?$")


def _version_from_url(name: str, url: str) -> str | None:
    """`pkg @ file:///x/pkg-1.2-py3-none-any.whl` -> "1.2" (the wheel file name carries it)."""
    base = url.rsplit("/", 1)[-1]
    m = re.match(r"^([^-]+)-([^-]+)-.*\.whl$", base)
    if m and canonicalize_name(m.group(1)) == canonicalize_name(name):
        return m.group(2)
    return None


def parse_host_list(text: str, source: str = "<text>") -> HostPackages:
    """Read `pip freeze`, `pip list` (columns or --format=freeze/json) output.

    Lines whose version cannot be known (editable installs, direct URLs without a wheel name)
    are kept with version None: the package is present, but no requirement counts as met by it.
    """
    host = HostPackages(source=source)

    def add(name: str, version: str | None, lineno: int):
        key = canonicalize_name(name)
        parsed: Version | None = None
        if version is not None:
            try:
                parsed = Version(version)
            except InvalidVersion:
                raise HostListError(f"{source}:{lineno}: invalid version {version!r} for {name}") from None
        host.versions[key] = parsed
        host.spelled[key] = name

    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise HostListError(f"{source}: looks like `pip list --format=json` but is not JSON: {e}") from None
        for i, row in enumerate(rows, 1):
            if not isinstance(row, dict) or "name" not in row or "version" not in row:
                raise HostListError(f"{source}: JSON entry {i} lacks name/version")
            add(row["name"], row["version"], i)
        return host

    lines = text.splitlines()
    columns = False
    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if re.match(r"^Package\s+Version\b", line):
            columns = True  # `pip list` table header
            continue
        if re.fullmatch(r"[-\s]+", line):
            continue  # the dashes under the header
        if line.startswith("-e ") or line.startswith("--editable"):
            egg = _EGG.search(line)
            if egg:
                add(egg.group(1), None, lineno)
                continue
            raise HostListError(f"{source}:{lineno}: editable line without #egg=NAME: {line!r}")
        if line.startswith("-"):
            continue  # pip options such as -i/--index-url in a requirements-style file
        m = _FREEZE_PIN.match(line)
        if m:
            add(m.group(1), m.group(2), lineno)
            continue
        m = _DIRECT_URL.match(line)
        if m:
            add(m.group(1), _version_from_url(m.group(1), m.group(2)), lineno)
            continue
        m = _LIST_ROW.match(line)
        if m and columns:
            add(m.group(1), m.group(2), lineno)
            continue
        raise HostListError(
            f"{source}:{lineno}: cannot read {line!r}; expected `pip freeze` (name==version) "
            "or `pip list` output"
        )
    return host


def load_host_list(path: str | Path) -> HostPackages:
    p = Path(path)
    if not p.is_file():
        raise HostListError(f"--exclude-from: {p} is not a file")
    return parse_host_list(p.read_text(encoding="utf-8"), source=str(p))
