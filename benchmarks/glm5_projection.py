#!/usr/bin/env python3
"""Projection (an ESTIMATE) of GLM-5-NVFP4 decode on 8x RTX PRO 6000 at TP 8 from the rank twin.

    python benchmarks/glm5_projection.py [--inputs benchmarks/glm5-projection-inputs.json]

Per decode step at concurrency bs:
    step = twin GPU ms x (twin card's bandwidth / target card's)            (a step is bound by weight reads)
         + layers x all-reduces per layer x (latency + 2 (tp-1)/tp x bs x hidden x bytes / bus bandwidth)
    output tok/s = bs / step
All inputs live in the one JSON file (an SM120 owner replaces them with measured values, e.g. the
step time from `check` and NCCL's bus bandwidth). It refuses to project while the measured twin
step time is missing (null).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

INPUTS = Path(__file__).resolve().parent / "glm5-projection-inputs.json"


class MissingMeasurement(ValueError):
    pass


def allreduce_ms(bs: int, p: dict) -> float:
    """All-reduce time per step: ring all-reduce moves 2 (tp-1)/tp of the message per GPU."""
    msg = bs * p["hidden"] * p["bytes_per_element"]
    one = p["allreduce_latency_us"] * 1e-3 + 2 * (p["tp"] - 1) / p["tp"] * msg / (p["pcie_allreduce_bus_gbs"] * 1e9) * 1e3
    return p["layers"] * p["allreduces_per_layer"] * one


def project(p: dict) -> dict:
    out = {}
    for bs_s, twin_ms in p["twin_gpu_ms_per_step"].items():
        if twin_ms is None:
            raise MissingMeasurement(f"twin_gpu_ms_per_step[{bs_s}] is not measured yet (null): run "
                                     "benchmarks/bench_twin.py on a GPU and fill it in")
        bs = int(bs_s)
        gpu = twin_ms * p["twin_bandwidth_tbs"] / p["target_bandwidth_tbs"]
        comm = allreduce_ms(bs, p)
        step = gpu + comm
        ref = p.get("reference_tok_s", {}).get(bs_s)
        out[bs_s] = {"gpu_ms": round(gpu, 3), "allreduce_ms": round(comm, 3), "step_ms": round(step, 3),
                     "output_tok_s": round(bs / step * 1e3, 1), "reference": ref}
    return out


def render(p: dict, proj: dict) -> str:
    lines = [p["label"], f"assumed PCIe all-reduce bus bandwidth {p['pcie_allreduce_bus_gbs']} GB/s, "
             f"{p['allreduce_latency_us']} us per all-reduce; bandwidth {p['twin_bandwidth_tbs']} -> "
             f"{p['target_bandwidth_tbs']} TB/s"]
    for bs, r in proj.items():
        ref = r["reference"]
        lines.append(f"concurrency {bs}: ~{r['output_tok_s']:.0f} output tok/s (estimate: GPU {r['gpu_ms']:.2f} ms + "
                     f"all-reduce {r['allreduce_ms']:.2f} ms per step)"
                     + (f"; reference {ref['value']} tok/s ({ref['what']})" if ref else ""))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", default=str(INPUTS))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    p = json.loads(Path(a.inputs).read_text())
    try:
        proj = project(p)
    except MissingMeasurement as e:
        print(f"no projection: {e}", file=sys.stderr)
        return 2
    print(json.dumps(proj, indent=1) if a.json else render(p, proj))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
