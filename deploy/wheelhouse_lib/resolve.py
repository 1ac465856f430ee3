"""Dependency closure of one root wheel for the target, minus what the target already has.

Why not pip's own resolver: pip cannot (a) treat the target's installed packages as given when
it is not the target, (b) leave out a requirement on purpose (policy skips), or (c) keep a
package the target has at a version some requirement rejects (policy conflict use="host").
So the walk here is our own, breadth first, and pip only answers "which wheel of NAME satisfies
SPEC on the target, and what does it require" (see pipselect.PipSelector).

Rules, per package reached through requirements whose markers hold on the target:
  - skipped by policy: recorded, not followed;
  - the target has it and its version satisfies every requirement on it: "host", not followed
    (the target's own install is consistent; its requirements are its business), except that
    requested extras are followed;
  - the target has it at a version some requirement rejects: policy [conflict] decides
    ("host": keep it, not followed; "ship": ship the required version); no entry -> "undecided",
    which the tool reports as an error;
  - otherwise "ship": a wheel is selected for the combined specifier of all requirements seen,
    and its requirements are followed. A requirement found later that the selected version
    does not satisfy restarts the walk with that specifier learned (no backtracking beyond that).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

from .compat import InvalidRequirement, Requirement, SpecifierSet, Version, canonicalize_name
from .hostenv import HostPackages, Target
from .policy import Policy


class ResolveError(RuntimeError):
    pass


@dataclass
class Candidate:
    """One wheel: what a selector found for a requirement, or a local wheel."""

    name: str
    version: str
    requires_dist: list[str]
    filename: str
    url: str
    sha256: str | None = None
    requires_python: str = ""


class Selector(Protocol):
    def select(self, requirements: dict[str, str]) -> dict[str, "Candidate | str"]:
        """normalized name -> requirement string  =>  name -> Candidate, or an error text."""


@dataclass
class Edge:
    parent: str  # "name version" of the requiring package
    requirement: Requirement

    @property
    def spec_text(self) -> str:
        return str(self.requirement.specifier) or "any version"

    def describe(self) -> str:
        extras = f"[{','.join(sorted(self.requirement.extras))}]" if self.requirement.extras else ""
        return f"{self.parent} needs {self.requirement.name}{extras} {self.spec_text}"


@dataclass
class Node:
    name: str  # normalized
    kind: str  # ship | host | host-conflict | skip | missing | undecided | root
    edges: list[Edge] = field(default_factory=list)
    candidate: Candidate | None = None
    host_version: Version | None = None
    violated: list[Edge] = field(default_factory=list)
    error: str = ""
    extras_followed: set[str] = field(default_factory=set)

    @property
    def version(self) -> str:
        if self.candidate is not None:
            return self.candidate.version
        return str(self.host_version) if self.host_version is not None else "?"


@dataclass
class Resolution:
    root: Node
    nodes: dict[str, Node]
    restarts: int
    learned: dict[str, str]

    def of_kind(self, *kinds: str) -> list[Node]:
        return sorted((n for n in self.nodes.values() if n.kind in kinds), key=lambda n: n.name)


class _Restart(Exception):
    def __init__(self, name: str, why: str):
        super().__init__(why)
        self.name = name


def requirements_for(requires_dist: list[str], target: Target, extras: set[str], owner: str) -> list[Requirement]:
    """The requirements of a wheel that apply on the target, for its base and the given extras."""
    out = []
    for text in requires_dist:
        try:
            req = Requirement(text)
        except InvalidRequirement as e:
            raise ResolveError(f"{owner}: unreadable Requires-Dist {text!r}: {e}") from None
        if req.marker is None:
            out.append(req)
            continue
        for extra in [""] + sorted(extras):
            if req.marker.evaluate(target.marker_env(extra)):
                out.append(req)
                break
    return out


def extra_only_requirements(requires_dist: list[str], target: Target, extras: set[str], owner: str) -> list[Requirement]:
    """Requirements that hold for some of `extras` but not for the base install."""
    base = {str(r) for r in requirements_for(requires_dist, target, set(), owner)}
    return [r for r in requirements_for(requires_dist, target, extras, owner) if str(r) not in base]


def _combined(edges: list[Edge], *extra: str | None) -> SpecifierSet:
    spec = SpecifierSet(",".join(e for e in extra if e))
    for e in edges:
        spec &= e.requirement.specifier
    return spec


def _req_text(name: str, extras: set[str], spec: SpecifierSet) -> str:
    ex = f"[{','.join(sorted(extras))}]" if extras else ""
    return f"{name}{ex}{spec}"


def resolve(
    root: Candidate,
    target: Target,
    host: HostPackages,
    policy: Policy,
    selector: Selector,
    log: Callable[[str], None] = print,
    max_restarts: int = 25,
) -> Resolution:
    learned: dict[str, str] = {}
    for attempt in range(max_restarts + 1):
        try:
            root_node, nodes = _walk(root, target, host, policy, selector, learned, log)
            return Resolution(root=root_node, nodes=nodes, restarts=attempt, learned=dict(learned))
        except _Restart as r:
            log(f"  restart: {r}")
    raise ResolveError(f"no consistent set after {max_restarts} restarts; last learned constraints: {learned}")


def _walk(root, target, host, policy, selector, learned, log):
    root_key = canonicalize_name(root.name)
    root_node = Node(name=root_key, kind="root", candidate=root)
    nodes: dict[str, Node] = {}
    edges: dict[str, list[Edge]] = {}
    label = f"{root.name} {root.version}"
    queue: list[tuple[str, Requirement]] = [
        (label, r) for r in requirements_for(root.requires_dist, target, set(), label)
    ]
    rounds = 0
    while queue:
        rounds += 1
        touched: dict[str, None] = {}
        for parent, req in queue:
            key = canonicalize_name(req.name)
            edges.setdefault(key, []).append(Edge(parent, req))
            touched[key] = None
        queue = []
        to_select: dict[str, str] = {}
        host_extras: dict[str, str] = {}

        for key in touched:
            es = edges[key]
            extras = set().union(*(e.requirement.extras for e in es))
            pin = policy.pin.get(key)
            spec = _combined(es, learned.get(key), pin.version if pin else None)
            if key == root_key:
                root_node.edges = es
                continue
            if key in policy.skip:
                nodes[key] = Node(name=key, kind="skip", edges=es, host_version=host.version_of(key))
                continue
            node = nodes.get(key)
            if node is not None and node.kind == "ship":
                node.edges = es
                if not spec.contains(Version(node.candidate.version), prereleases=True):
                    learned[key] = str(spec)
                    raise _Restart(key, f"{key} {node.candidate.version} picked before a later requirement "
                                        f"({es[-1].describe()}); retrying with {key}{spec}")
                new = extras - node.extras_followed
                if new:
                    node.extras_followed |= new
                    owner = f"{node.candidate.name} {node.candidate.version}"
                    queue += [(owner, r) for r in extra_only_requirements(node.candidate.requires_dist, target, new, owner)]
                continue
            if host.has(key):
                hv = host.version_of(key)
                if hv is not None:
                    violated = [e for e in es if not e.requirement.specifier.contains(hv, prereleases=True)]
                else:  # version unknown (editable/direct URL): only unconstrained requirements are met
                    violated = [e for e in es if str(e.requirement.specifier)]
                if not violated:
                    prev = nodes.get(key)
                    followed = prev.extras_followed if prev is not None and prev.kind == "host" else set()
                    nodes[key] = Node(name=key, kind="host", edges=es, host_version=hv, extras_followed=followed)
                    if extras - followed and hv is not None:
                        host_extras[key] = _req_text(es[0].requirement.name, extras - followed, SpecifierSet(f"=={hv}"))
                    continue
                decision = policy.conflict.get(key)
                if decision is None:
                    nodes[key] = Node(name=key, kind="undecided", edges=es, host_version=hv, violated=violated)
                    continue
                if decision.use == "host":
                    nodes[key] = Node(name=key, kind="host-conflict", edges=es, host_version=hv, violated=violated)
                    continue
                # decision "ship": fall through and select the required version
            to_select[key] = _req_text(es[0].requirement.name, extras, spec)

        if to_select or host_extras:
            log(f"  round {rounds}: selecting {len(to_select)} wheel(s)"
                + (f", reading extras of {len(host_extras)} target package(s)" if host_extras else ""))
        if to_select:
            found = selector.select(to_select)
            for key, req_text in to_select.items():
                res = found.get(key, f"no answer for {req_text}")
                es = edges[key]
                hv = host.version_of(key) if host.has(key) else None
                if isinstance(res, str):
                    nodes[key] = Node(name=key, kind="missing", edges=es, error=res, host_version=hv)
                    continue
                extras = set().union(*(e.requirement.extras for e in es))
                node = Node(name=key, kind="ship", edges=es, candidate=res, host_version=hv, extras_followed=set(extras))
                if hv is not None:
                    node.violated = [e for e in es if not e.requirement.specifier.contains(hv, prereleases=True)]
                nodes[key] = node
                owner = f"{res.name} {res.version}"
                queue += [(owner, r) for r in requirements_for(res.requires_dist, target, extras, owner)]
        if host_extras:
            found = selector.select(host_extras)
            for key, req_text in host_extras.items():
                res = found.get(key)
                node = nodes[key]
                if not isinstance(res, Candidate):
                    raise ResolveError(f"cannot read the metadata of the target's {req_text} to follow its extras: {res}")
                new = set(Requirement(req_text).extras)
                node.extras_followed |= new
                owner = f"{res.name} {res.version} (on target)"
                queue += [(owner, r) for r in extra_only_requirements(res.requires_dist, target, new, owner)]
    return root_node, nodes
