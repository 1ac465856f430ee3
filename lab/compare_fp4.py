"""Compare W4A16 times between bench_fp4_gemm.py result files of the same shapes (an A/B of two
kernel libraries, lab/fp4_ab.sh): per row and per M range, time new / base for the plain
and the PDL launch, and the Marlin target (>= 1.2x at M <= 16) counted on each file's own Marlin
column. Several --new files (repeat runs of the same library) are averaged per row, and their
spread is printed so a difference can be read against the run-to-run noise.

    python lab/compare_fp4.py --base old.json --new new1.json [new2.json ...] [--md out.md]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

RANGES = ((1, 8), (16, 16), (32, 128))
KEYS = ("ours_us", "ours_pdl_us")


def load(path):
    rows = json.loads(Path(path).read_text())["rows"]
    return {(r["shape"], r["M"]): r for r in rows}


def geo(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def marlin_ratio(r, key="ours_us"):
    return r["marlin_us"] / r[key] if r.get("marlin_us") and r.get(key) else None


def compare(base, news):
    common = sorted(set(base).intersection(*news), key=lambda k: (k[0], k[1]))
    if not common:
        raise SystemExit("compare_fp4: the files share no (shape, M) row")
    out = []
    for key in common:
        b = base[key]
        row = {"shape": key[0], "M": key[1]}
        for k in KEYS:
            vals = [n[key][k] for n in news]
            row[k] = statistics.fmean(vals)
            row[k + "_spread"] = (max(vals) - min(vals)) / row[k] if len(vals) > 1 else 0.0
            row[k + "_base"] = b[k]
            row[k + "_ratio"] = row[k] / b[k]
        row["marlin_base"] = marlin_ratio(b)
        row["marlin_new"] = geo([marlin_ratio(n[key]) for n in news])
        out.append(row)
    return out


def report(rows, base_name, new_names):
    L = [f"# W4A16 A/B: new / base time ({', '.join(new_names)} vs {base_name})", "",
         "| M range | plain new/base (geomean) | PDL new/base | worst plain row | rows |", "|---|---|---|---|---|"]
    for lo, hi in RANGES:
        sel = [r for r in rows if lo <= r["M"] <= hi]
        if not sel:
            continue
        worst = max(sel, key=lambda r: r["ours_us_ratio"])
        L.append(f"| {lo}-{hi} | {geo([r['ours_us_ratio'] for r in sel]):.3f} | "
                 f"{geo([r['ours_pdl_us_ratio'] for r in sel]):.3f} | "
                 f"{worst['shape']} M={worst['M']} {worst['ours_us_ratio']:.3f} | {len(sel)} |")
    judged = [r for r in rows if r["M"] <= 16 and r["marlin_base"] and r["marlin_new"]]
    if judged:
        below = lambda key: sum(r[key] < 1.2 for r in judged)  # noqa: E731
        L += ["", f"Marlin target (plain, M <= 16, each file's own Marlin column): rows below 1.2x "
                  f"{below('marlin_base')} -> {below('marlin_new')} of {len(judged)}; min "
                  f"{min(r['marlin_base'] for r in judged):.2f} -> {min(r['marlin_new'] for r in judged):.2f}"]
    spread = [r["ours_us_spread"] for r in rows]
    if any(spread):
        L += ["", f"New-vs-new spread (plain, (max - min) / mean over the new runs): median "
                  f"{statistics.median(spread):.3f}, max {max(spread):.3f}"]
    L += ["", "| shape | M | base us | new us | new/base | PDL base | PDL new | PDL new/base | x Marlin base | x Marlin new |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda v: f"{v:.2f}" if v else "n/a"  # noqa: E731
    for r in rows:
        L.append(f"| {r['shape']} | {r['M']} | {r['ours_us_base']:.2f} | {r['ours_us']:.2f} | "
                 f"{r['ours_us_ratio']:.3f} | {r['ours_pdl_us_base']:.2f} | {r['ours_pdl_us']:.2f} | "
                 f"{r['ours_pdl_us_ratio']:.3f} | {fmt(r['marlin_base'])} | {fmt(r['marlin_new'])} |")
    return "\n".join(L) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, type=Path)
    ap.add_argument("--new", required=True, nargs="+", type=Path)
    ap.add_argument("--md", type=Path, help="also write the report here")
    args = ap.parse_args(argv)
    text = report(compare(load(args.base), [load(p) for p in args.new]), args.base.name,
                  [p.name for p in args.new])
    sys.stdout.write(text)
    if args.md:
        args.md.write_text(text)


if __name__ == "__main__":
    main()
