"""Compare a plan (`plan --gpu auto --json`) with what a server started with the same flags on
that GPU logged: the fork's layerwise plan line (sizes) and each phase's graph memory (upstream's
"Capture ... CUDA graph end ... mem usage" line plus the layerwise capture report line).

    python -m sglang.sm120.plan.compare <plan.json> <server.log>   # JSON verdict; exit 1 on a mismatch

Sizes must agree exactly; the graph-memory estimate passes within MEMORY_TOLERANCE of the measured.
"""
from __future__ import annotations

import json
import re
import sys
from typing import Dict, List, Optional

MEMORY_TOLERANCE = 0.25
_PLAN = re.compile(r"layerwise CUDA graphs: decode (?P<decode>.*?), prefill (?P<prefill>.*)$")
_FULL = re.compile(r"full graphs for bs <= (\d+) \((\d+) sizes\)")
_LW = re.compile(r"layerwise (\d+)\.\.(\d+) \((\d+) sizes\)")
_PRE = re.compile(r"(\d+) token buckets (\d+)\.\.(\d+), (\d+) request slots")
_UPSTREAM_MEM = re.compile(r"Capture (?:target )?(decode|prefill) CUDA graph end\..*?mem usage=(-?[\d.]+) GB")
_LW_MEM = re.compile(r"layerwise (decode|prefill) capture: [\d.]+ s, (-?[\d.]+) GB")


def logged(log: str) -> dict:
    """What the server log says: the layerwise plan line's sizes and per-phase graph memory (GB)."""
    out: Dict[str, object] = {"memory_gb": {}}
    for line in log.splitlines():
        m = _PLAN.search(line)
        if m:
            dec, pre = m.group("decode"), m.group("prefill")
            f, lw, p = _FULL.search(dec), _LW.search(dec), _PRE.search(pre)
            out["decode"] = {"full_max": int(f.group(1)) if f else 0, "full_count": int(f.group(2)) if f else 0,
                             "layerwise": [int(lw.group(1)), int(lw.group(2)), int(lw.group(3))] if lw else None}
            out["prefill"] = ({"count": int(p.group(1)), "range": [int(p.group(2)), int(p.group(3))],
                               "slots": int(p.group(4))} if p else None)
        for rx in (_UPSTREAM_MEM, _LW_MEM):
            m = rx.search(line)
            if m:
                out["memory_gb"][m.group(1)] = out["memory_gb"].get(m.group(1), 0.0) + float(m.group(2))
    return out


def _span(sizes: List[int]) -> Optional[List[int]]:
    return [sizes[0], sizes[-1], len(sizes)] if sizes else None


def compare(plan: dict, log: str) -> dict:
    seen, fork = logged(log), plan["fork"]
    checks = []
    if "decode" in seen:
        full = fork["decode_full_sizes"]
        checks.append({"what": "decode full graphs (max, count)", "plan": [max(full) if full else 0, len(full)],
                       "server": [seen["decode"]["full_max"], seen["decode"]["full_count"]]})
        checks.append({"what": "decode layerwise sizes (first, last, count)",
                       "plan": _span(fork["decode_layerwise_sizes"]), "server": seen["decode"]["layerwise"]})
        if fork["prefill_backend"] == "layerwise":
            b = fork["prefill_buckets"]
            checks.append({"what": "prefill buckets (count, first, last, slots)",
                           "plan": [len(b), b[0], b[-1], fork["prefill_request_slots"]],
                           "server": None if seen["prefill"] is None else
                           [seen["prefill"]["count"], *seen["prefill"]["range"], seen["prefill"]["slots"]]})
    else:
        checks.append({"what": "the server's layerwise plan line", "plan": "present", "server": None})
    for c in checks:
        c["ok"] = c["plan"] == c["server"]
    memory = []
    for phase, measured in sorted(seen["memory_gb"].items()):
        est = fork["graph_memory_gb_estimate"].get(phase)
        ratio = None if est is None or measured <= 0 else est / measured
        memory.append({"phase": phase, "measured_gb": round(measured, 3), "estimate_gb": est,
                       "ratio": None if ratio is None else round(ratio, 3),
                       "ok": ratio is not None and abs(ratio - 1) <= MEMORY_TOLERANCE})
    return {"sizes": checks, "graph_memory": memory,
            "ok": all(c["ok"] for c in checks) and all(m["ok"] for m in memory)}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print(__doc__.splitlines()[3].strip(), file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        plan = json.load(f)
    with open(argv[1], errors="replace") as f:
        verdict = compare(plan, f.read())
    print(json.dumps(verdict, indent=1))
    return 0 if verdict["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
