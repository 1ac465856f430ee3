"""The checked-in wheelhouse policy: every deliberate deviation from plain resolution, with why.

Sections (see deploy/wheelhouse-policy.toml):
  [upstream]            name, version of the upstream wheel the fork replaces
  [target]              optional defaults: python, glibc, arch
  [skip]                NAME = "reason": never shipped, its own requirements not followed
  [conflict.NAME]       use = "host" | "ship", reason: what to do when the target's installed
                        version does not satisfy a requirement on it
  [pin.NAME]            version = "SPEC", reason: extra specifier when NAME is shipped (e.g. to
                        pick the release that matches a package the target already has)
  [slim.NAME]           remove = [paths; "dir/" removes a tree], reason
  [[edit]]              package, file ("{dist_info}/..." allowed), pattern (regex), replacement,
                        count (matches expected, default 1), reason
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .compat import InvalidSpecifier, SpecifierSet, canonicalize_name, tomllib


class PolicyError(ValueError):
    """The policy file is malformed; the message names the file and the key."""


_NAME = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)


@dataclass(frozen=True)
class Conflict:
    use: str  # "host" or "ship"
    reason: str


@dataclass(frozen=True)
class Pin:
    version: str  # a specifier set, e.g. "==1.84.0" or "<1.85"
    reason: str


@dataclass(frozen=True)
class Slim:
    remove: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class Edit:
    package: str
    file: str
    pattern: str
    replacement: str
    count: int
    reason: str
    index: int  # position among [[edit]] entries, for messages

    @property
    def label(self) -> str:
        return f"[[edit]] #{self.index + 1} ({self.package}: {self.file})"


@dataclass
class Policy:
    upstream_name: str = "sglang"
    upstream_version: str = ""
    target: dict = field(default_factory=dict)
    skip: dict[str, str] = field(default_factory=dict)  # normalized name -> reason
    conflict: dict[str, Conflict] = field(default_factory=dict)
    pin: dict[str, Pin] = field(default_factory=dict)
    slim: dict[str, Slim] = field(default_factory=dict)
    edits: list[Edit] = field(default_factory=list)
    source: str = "<policy>"

    def edits_for(self, name: str) -> list[Edit]:
        key = canonicalize_name(name)
        return [e for e in self.edits if canonicalize_name(e.package) == key]


def _reason(where: str, table: dict, src: str) -> str:
    reason = table.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise PolicyError(f"{src}: {where} needs a non-empty reason = \"...\" (every decision says why)")
    return reason.strip()


def _check_keys(where: str, table, allowed: set[str], src: str):
    if not isinstance(table, dict):
        raise PolicyError(f"{src}: {where} must be a table")
    extra = sorted(set(table) - allowed)
    if extra:
        raise PolicyError(f"{src}: {where} has unknown key {extra[0]!r}; allowed: {', '.join(sorted(allowed))}")


def _name(where: str, name: str, src: str) -> str:
    if not _NAME.match(name):
        raise PolicyError(f"{src}: {where}: {name!r} is not a valid package name")
    return canonicalize_name(name)


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PolicyError(f"{source}: not valid TOML: {e}") from None
    _check_keys("top level", data, {"upstream", "target", "skip", "conflict", "pin", "slim", "edit"}, source)
    pol = Policy(source=source)

    up = data.get("upstream")
    if up is None:
        raise PolicyError(f"{source}: missing [upstream] with name and version of the wheel the fork replaces")
    _check_keys("[upstream]", up, {"name", "version"}, source)
    for key in ("name", "version"):
        if not isinstance(up.get(key), str) or not up[key]:
            raise PolicyError(f"{source}: [upstream] {key} must be a non-empty string")
    pol.upstream_name = up["name"]
    pol.upstream_version = up["version"]

    tgt = data.get("target", {})
    _check_keys("[target]", tgt, {"python", "glibc", "arch"}, source)
    for key, val in tgt.items():
        if not isinstance(val, str):
            raise PolicyError(f"{source}: [target] {key} must be a string")
    pol.target = dict(tgt)

    skip = data.get("skip", {})
    if not isinstance(skip, dict):
        raise PolicyError(f"{source}: [skip] must be a table of NAME = \"reason\"")
    for name, reason in skip.items():
        key = _name(f"[skip] {name}", name, source)
        if not isinstance(reason, str) or not reason.strip():
            raise PolicyError(f"{source}: [skip] {name} needs a non-empty reason string")
        pol.skip[key] = reason.strip()

    conflicts = data.get("conflict", {})
    _check_keys("[conflict]", conflicts, set(conflicts), source)
    for name, table in conflicts.items():
        where = f"[conflict.{name}]"
        key = _name(where, name, source)
        _check_keys(where, table, {"use", "reason"}, source)
        use = table.get("use")
        if use not in ("host", "ship"):
            raise PolicyError(
                f"{source}: {where} use: expected \"host\" (keep the target's version) or \"ship\" "
                f"(ship the required version, shadowing the target's), got {use!r}"
            )
        pol.conflict[key] = Conflict(use=use, reason=_reason(where, table, source))

    pins = data.get("pin", {})
    _check_keys("[pin]", pins, set(pins), source)
    for name, table in pins.items():
        where = f"[pin.{name}]"
        key = _name(where, name, source)
        _check_keys(where, table, {"version", "reason"}, source)
        spec = table.get("version")
        try:
            if not isinstance(spec, str) or not spec.strip():
                raise InvalidSpecifier(repr(spec))
            SpecifierSet(spec)
        except InvalidSpecifier:
            raise PolicyError(f"{source}: {where} version must be a version specifier such as \"==1.2.3\" or \"<2\", got {spec!r}") from None
        pol.pin[key] = Pin(version=spec.strip(), reason=_reason(where, table, source))

    slims = data.get("slim", {})
    _check_keys("[slim]", slims, set(slims), source)
    for name, table in slims.items():
        where = f"[slim.{name}]"
        key = _name(where, name, source)
        _check_keys(where, table, {"remove", "reason"}, source)
        remove = table.get("remove")
        if not isinstance(remove, list) or not remove or not all(isinstance(r, str) and r for r in remove):
            raise PolicyError(f"{source}: {where} remove must be a non-empty list of paths inside the wheel")
        for r in remove:
            if r.startswith("/") or ".." in r.split("/") or ".dist-info/" in r:
                raise PolicyError(f"{source}: {where} remove: {r!r} must be a relative path outside .dist-info")
        pol.slim[key] = Slim(remove=tuple(remove), reason=_reason(where, table, source))

    edits = data.get("edit", [])
    if not isinstance(edits, list):
        raise PolicyError(f"{source}: edits are written [[edit]] (an array of tables)")
    for i, table in enumerate(edits):
        where = f"[[edit]] #{i + 1}"
        _check_keys(where, table, {"package", "file", "pattern", "replacement", "count", "reason"}, source)
        for key in ("package", "file", "pattern", "replacement"):
            if not isinstance(table.get(key), str) or (key != "replacement" and not table[key]):
                raise PolicyError(f"{source}: {where} {key} must be a{' non-empty' if key != 'replacement' else ''} string")
        _name(where, table["package"], source)
        try:
            re.compile(table["pattern"])
        except re.error as e:
            raise PolicyError(f"{source}: {where} pattern is not a valid regular expression: {e}") from None
        count = table.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise PolicyError(f"{source}: {where} count must be an integer >= 1")
        pol.edits.append(Edit(
            package=table["package"], file=table["file"], pattern=table["pattern"],
            replacement=table["replacement"], count=count, reason=_reason(where, table, source), index=i,
        ))

    for key in pol.skip:
        for section, names in (("conflict", pol.conflict), ("pin", pol.pin), ("slim", pol.slim)):
            if key in names:
                raise PolicyError(f"{source}: {key} is both skipped and in [{section}.{key}]; a skipped package is never shipped")
        if pol.edits_for(key):
            raise PolicyError(f"{source}: {key} is both skipped and edited by [[edit]]; a skipped package is never shipped")
    return pol


def load_policy(path: str | Path) -> Policy:
    p = Path(path)
    if not p.is_file():
        raise PolicyError(f"--policy: {p} is not a file")
    return parse_policy(p.read_text(encoding="utf-8"), source=str(p))
