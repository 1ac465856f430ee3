"""Every decision the wheelhouse made, as manifest records and as a readable report."""
from __future__ import annotations

from .compat import canonicalize_name
from .policy import Policy
from .resolve import Node, Resolution


def _needs(node: Node) -> list[str]:
    return [e.describe() for e in node.edges]


def decisions_from(res: Resolution, policy: Policy) -> list[dict]:
    """One record per package that is not simply shipped, plus the shipped-over-target ones."""
    out: list[dict] = []
    for n in res.of_kind("host"):
        out.append({"package": n.name, "action": "use-target", "target_version": str(n.host_version),
                    "needs": _needs(n)})
    for n in res.of_kind("host-conflict"):
        out.append({"package": n.name, "action": "keep-target-version", "target_version": str(n.host_version),
                    "violates": [e.describe() for e in n.violated], "reason": policy.conflict[n.name].reason})
    for n in res.of_kind("ship"):
        if n.host_version is not None or n.name in policy.conflict:
            out.append({"package": n.name, "action": "ship-over-target", "version": n.version,
                        "target_version": str(n.host_version) if n.host_version is not None else None,
                        "violates": [e.describe() for e in n.violated],
                        "reason": policy.conflict[n.name].reason if n.name in policy.conflict else ""})
    for n in res.of_kind("ship", "missing"):
        if n.name in policy.pin:
            out.append({"package": n.name, "action": "pin", "spec": policy.pin[n.name].version,
                        "version": n.version if n.kind == "ship" else None, "reason": policy.pin[n.name].reason})
    for n in res.of_kind("skip"):
        d = {"package": n.name, "action": "skip", "needs": _needs(n), "reason": policy.skip[n.name]}
        if n.host_version is not None:
            d["target_version"] = str(n.host_version)
        out.append(d)
    for n in res.of_kind("missing"):
        out.append({"package": n.name, "action": "missing", "needs": _needs(n), "error": n.error})
    for n in res.of_kind("undecided"):
        out.append({"package": n.name, "action": "undecided", "target_version": str(n.host_version),
                    "violates": [e.describe() for e in n.violated]})
    return out


def unused_policy(res: Resolution, policy: Policy, shipped: set[str]) -> list[str]:
    """Policy entries that had no effect on this resolution (stale, or meant for another target)."""
    seen = set(res.nodes)
    unused = [f"[skip] {k}" for k in policy.skip if k not in seen]
    for k in policy.conflict:
        n = res.nodes.get(k)
        if n is None or not (n.kind == "host-conflict" or (n.kind == "ship" and n.violated)):
            unused.append(f"[conflict.{k}] (no conflict on the target)")
    unused += [f"[pin.{k}] (not shipped)" for k in policy.pin if k not in shipped]
    unused += [f"[slim.{k}] (not shipped)" for k in policy.slim if k not in shipped]
    unused += [f"{e.label} (not shipped)" for e in policy.edits if canonicalize_name(e.package) not in shipped]
    return unused


def format_report(res: Resolution, decisions: list[dict], transforms: list[dict], unused: list[str],
                  header: list[str], parts: dict | None = None, warnings: list[str] = ()) -> str:
    lines = list(header)
    by = {}
    for d in decisions:
        by.setdefault(d["action"], []).append(d)
    ship = res.of_kind("ship")
    lines.append(f"ship: {len(ship) + 1} wheels ({res.root.candidate.name} {res.root.version} + {len(ship)} dependencies);"
                 f" walk restarted {res.restarts} time(s)" + (f", learned {res.learned}" if res.learned else ""))
    for d in by.get("ship-over-target", []):
        tv = f"target has {d['target_version']}" if d["target_version"] else "target lacks it"
        lines.append(f"  OVERRIDE {d['package']}=={d['version']} shipped, {tv}: violates "
                     f"{'; '.join(d['violates']) or 'nothing'} -- {d['reason']}")
    for d in by.get("keep-target-version", []):
        lines.append(f"  KEEP-TARGET {d['package']}=={d['target_version']} although {'; '.join(d['violates'])} -- {d['reason']}")
    for d in by.get("pin", []):
        lines.append(f"  PIN {d['package']}{d['spec']} -> {d['version']} -- {d['reason']}")
    for d in by.get("skip", []):
        on = f" (target has {d['target_version']})" if "target_version" in d else ""
        lines.append(f"  SKIP {d['package']}{on}: {'; '.join(d['needs'])} -- {d['reason']}")
    for t in transforms:
        if t.get("removed_count"):
            lines.append(f"  SLIM {t['filename']}: removed {', '.join(t['patterns'])} ({t['removed_count']} files, "
                         f"{t['removed_bytes'] / 1e6:.1f} MB unpacked); {t['size_before'] / 1e6:.1f} -> "
                         f"{t['size_after'] / 1e6:.1f} MB -- {t['slim_reason']}")
        for e in t.get("edited", []):
            lines.append(f"  EDIT {t['filename']}: {e['file']}: {e['pattern']!r} -> {e['replacement']!r} -- {e['reason']}")
    for d in by.get("missing", []):
        lines.append(f"  MISSING {d['package']}: {'; '.join(d['needs'])}: {d['error']}")
    for d in by.get("undecided", []):
        lines.append(f"  UNDECIDED {d['package']}: target has {d['target_version']}, but {'; '.join(d['violates'])}")
    lines.append(f"shipped wheels ({len(ship) + 1}):")
    lines.append(f"  {res.root.candidate.filename} (root)")
    for n in ship:
        parents = sorted({e.parent for e in n.edges})
        lines.append(f"  {n.candidate.filename} (for {', '.join(parents)})")
    host = by.get("use-target", [])
    lines.append(f"not shipped, the target already has them at suitable versions ({len(host)}):")
    for d in host:
        specs = sorted({n.split(" needs ", 1)[1].split(" ", 1)[1] for n in d["needs"]})
        lines.append(f"  target {d['package']}=={d['target_version']} (needs {', '.join(specs)})")
    for u in unused:
        lines.append(f"  note: policy entry had no effect: {u}")
    for w in warnings:
        lines.append(f"  warning: {w}")
    if parts:
        lines.append("parts:")
        for name, p in parts.items():
            pieces = f" and {p['pieces']} piece(s) of larger wheels" if p.get("pieces") else ""
            lines.append(f"  {name}: {p['bytes'] / 1e6:.1f} MB in {p['wheels']} wheels{pieces}")
    return "\n".join(lines) + "\n"
