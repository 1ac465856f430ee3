"""Graph memory per phase, ESTIMATED from a model fitted to H200 measurements.

Per backend kind k (full / layerwise / breakable) a phase's captures cost
    a_k * (number of captured sizes) + b_k * (largest captured size):
a is what every captured size pays whatever its batch (the graphs' own memory, outside torch's
allocator; a layerwise size holds one graph per segment), b * size what the graph pool and the
batch-sized buffers take, which the largest size, captured first, sets and the smaller ones reuse.
Coefficients are least-squares fits (a coefficient that comes out negative is held at 0) to the
graph memory a server paid per phase (upstream's capture log line plus the layerwise capture
report) in the runs listed in graph_memory_fit.json: Qwen3-30B-A3B shapes, bf16, TP 1, one H200.
Prefill has one measured bucket set per backend, so there a_k is the decode value of the same
kind and only b_k is fitted. Other models are extrapolated: a by their layer count, b by their
hidden size, relative to the fit model.
`python -m sglang.sm120.plan.graph_memory --refit <results.json>...` rewrites the data file from
runner benchmark results (Qwen3-30B-A3B shapes) and plan-check results (benchmarks/plan_check.py:
the tiny models and the Qwen3 shapes, each run with its model's layers and hidden size); a run of
another model enters the fit with its a and b columns scaled by its layers and width, the same
scaling the estimate applies.
"""
from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Dict, Iterable, List, Optional

FIT_FILE = Path(__file__).with_name("graph_memory_fit.json")
GB = 1 << 30
KINDS = ("full", "layerwise", "breakable")
# upstream's default decode capture list in the runs upstream's decode was full up to 256
_UPSTREAM_256 = [1, 2, 4, 8, 12] + list(range(16, 257, 8))


def load() -> dict:
    return json.loads(FIT_FILE.read_text())


def _read_json(path: str) -> dict:
    raw = Path(path).read_bytes()
    return json.loads(gzip.decompress(raw) if str(path).endswith(".gz") else raw)


def runs_from_results(paths: Iterable[str]) -> List[dict]:
    """(phase, sizes per kind, measured GB) of each configuration's capture in runner benchmark
    results (benchmarks/bench_runner.py): the graph memory a server paid per phase."""
    runs = []
    for path in map(str, paths):
        data = _read_json(path)
        for name, run in data["runs"].items():
            for phase in ("decode", "prefill"):
                measured = run["capture_totals"][phase]["graph_mem_gb"]
                if not measured:
                    continue
                report = run["capture"]["layerwise"].get(phase)
                if report:
                    sizes = {"full": report["full"], "layerwise": report["layerwise"]}
                elif phase == "decode":  # upstream's own full graphs (--cuda-graph-max-bs 256)
                    sizes = {"full": _UPSTREAM_256}
                else:  # upstream's breakable prefill at the same buckets (--cuda-graph-bs-prefill)
                    sizes = {"breakable": _flag_ints(run["command"], "--cuda-graph-bs-prefill")}
                runs.append({"source": f"{Path(path).name}:{name}", "phase": phase,
                             "sizes": {k: v for k, v in sizes.items() if v}, "measured_gb": measured})
    return runs


def runs_from_plan_check(path: str) -> List[dict]:
    """(phase, sizes per kind, measured GB, model dims) per model of a plan-check result: the sizes
    from the model's plan (plan-<model>.json beside it; checked equal to the server's), the graph
    memory its server paid (upstream's capture line plus the layerwise capture report)."""
    path = Path(path)
    doc = _read_json(path)
    runs = []
    for row in doc.get("models", []):
        verdict, dims = row.get("verdict"), row.get("model_dims")
        if not verdict or not dims or not all(c["ok"] for c in verdict["sizes"]):
            continue  # no server, no dims (runs before 175c8a0), or sizes that are not the plan's
        fork = json.loads((path.parent / f"plan-{row['model']}.json").read_text())["fork"]
        sizes = {"decode": {"full": fork["decode_full_sizes"], "layerwise": fork["decode_layerwise_sizes"]},
                 "prefill": {fork["prefill_backend"]: fork["prefill_buckets"]}}
        for m in verdict["graph_memory"]:
            if m["measured_gb"] > 0:
                runs.append({"source": f"{path.name}:{row['model']}", "phase": m["phase"],
                             "sizes": {k: v for k, v in sizes[m["phase"]].items() if v},
                             "measured_gb": m["measured_gb"], "model": dims})
    return runs


def _flag_ints(command: str, flag: str) -> List[int]:
    words = command.split()
    i = words.index(flag) + 1
    out = []
    while i < len(words) and words[i].isdigit():
        out.append(int(words[i]))
        i += 1
    return out


def _largest(sizes: List[int]) -> int:
    return max(sizes) if sizes else 0


def _lstsq(rows: List[List[float]], ys: List[float]) -> List[float]:
    """Least squares; a coefficient that comes out negative is held at 0 and the rest refitted."""
    import numpy as np

    x, y = np.array(rows, float), np.array(ys, float)
    keep = list(range(x.shape[1]))
    while True:
        c = np.linalg.lstsq(x[:, keep], y, rcond=None)[0]
        if (c >= 0).all() or len(keep) == 1:
            out = [0.0] * x.shape[1]
            for i, v in zip(keep, c):
                out[i] = float(v)
            return out
        keep.pop(int(np.argmin(c)))


def _scales(run: dict, ref: Optional[dict]):
    """(layers, width) of the run's model relative to the fit model (1, 1 for the fit model)."""
    m = run.get("model")
    if not m or not ref:
        return 1.0, 1.0
    return m["num_hidden_layers"] / ref["num_hidden_layers"], m["hidden_size"] / ref["hidden_size"]


def fit(runs: List[dict], ref: Optional[dict] = None) -> Dict[str, Dict[str, Dict[str, float]]]:
    """Coefficients {phase: {kind: {a, b}}} in GB (a per captured size, b per row of the largest),
    for the model `ref` (layers, hidden size); runs of other models scale their columns."""
    decode = [r for r in runs if r["phase"] == "decode"]
    kinds = sorted({k for r in decode for k in r["sizes"]})
    rows = []
    for r in decode:
        layers, width = _scales(r, ref)
        rows.append([v for k in kinds for v in (layers * len(r["sizes"].get(k, [])),
                                                 width * _largest(r["sizes"].get(k, [])))])
    c = _lstsq(rows, [r["measured_gb"] for r in decode])
    coef = {"decode": {k: {"a": c[2 * i], "b": c[2 * i + 1]} for i, k in enumerate(kinds)}, "prefill": {}}
    for kind in sorted({k for r in runs if r["phase"] == "prefill" for k in r["sizes"]}):
        a = coef["decode"].get(kind, coef["decode"]["full"])["a"]
        pre = [r for r in runs if r["phase"] == "prefill" and set(r["sizes"]) == {kind}]
        scales = [_scales(r, ref) for r in pre]
        b = _lstsq([[width * _largest(r["sizes"][kind])] for r, (_, width) in zip(pre, scales)],
                   [r["measured_gb"] - a * layers * len(r["sizes"][kind]) for r, (layers, _) in zip(pre, scales)])[0]
        coef["prefill"][kind] = {"a": a, "b": b}
    return coef


def estimate_gb(phase: str, sizes: Dict[str, List[int]], model: Optional[dict] = None,
                fitted: Optional[dict] = None) -> Optional[float]:
    """GB a phase's captures would take (an estimate), or None for a backend never measured.
    `model`: hf config dict of the served model (scales a by layers and b by hidden size)."""
    fitted = fitted or load()
    ref = fitted["model"]
    layers = (model or ref).get("num_hidden_layers", ref["num_hidden_layers"]) / ref["num_hidden_layers"]
    width = (model or ref).get("hidden_size", ref["hidden_size"]) / ref["hidden_size"]
    total = 0.0
    for kind, ss in sizes.items():
        if not ss:
            continue
        c = fitted["coefficients"][phase].get(kind)
        if c is None:
            return None
        total += c["a"] * layers * len(ss) + c["b"] * width * _largest(ss)
    return total


def errors(fitted: Optional[dict] = None) -> List[dict]:
    """The estimate against each run the coefficients were fitted to."""
    fitted = fitted or load()
    out = []
    for r in fitted["runs"]:
        est = estimate_gb(r["phase"], r["sizes"], r.get("model"), fitted)
        out.append({"source": r["source"], "phase": r["phase"], "measured_gb": r["measured_gb"],
                    "estimated_gb": round(est, 4), "error": round(est / r["measured_gb"] - 1, 4)})
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] != "--refit" or len(argv) < 2:
        print("usage: python -m sglang.sm120.plan.graph_memory --refit <runner-results.json>...", file=sys.stderr)
        return 2
    runs, sources = [], []
    for path in argv[1:]:
        doc = _read_json(path)
        if doc.get("benchmark") == "plan-check":
            runs += runs_from_plan_check(path)
            sources.append(f"plan-check on {doc.get('gpu')} (benchmarks/plan_check.py)")
        else:
            runs += runs_from_results([path])
            sources.append("Qwen3-30B-A3B shapes on one NVIDIA H200 (benchmarks/bench_runner.py)")
    ref = {"hidden_size": 2048, "num_hidden_layers": 48}
    data = {
        "label": "estimate",
        "fitted_on": "bf16, TP 1: " + "; ".join(dict.fromkeys(sources)),
        "model": ref,
        "coefficients": fit(runs, ref), "runs": runs,
    }
    FIT_FILE.write_text(json.dumps(data, indent=1) + "\n")
    for e in errors(data):
        print(json.dumps(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
