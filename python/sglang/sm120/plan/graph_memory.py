"""Graph memory per phase, ESTIMATED from a model fitted to measured captures.

Per backend kind k (full / layerwise / breakable) a phase's captures cost
    a_k * (captured sizes) + b_k * (largest size) + c_k * s * (largest size),
s = (layers * hidden size) of the model relative to the fit model's (Qwen3-30B-A3B: 48 x 2048).
a is what every captured size pays whatever the model (the graphs and per-size buffers outside
torch's allocator), b * size the batch-sized buffers every model has, c * s * size the per-layer
activations of the largest size, which is captured first and whose pool the smaller sizes reuse.
The model-independent terms are there because the tiny models (3-4 layers, width 256) paid about
the graph memory Qwen3-30B-A3B shapes paid at the same decode sizes (1.07-1.21 GB against 1.24 GB,
plan-check on an H100 and the runner benchmark on an H200, base 0.5.16): scaling everything by the
model, as the first fit did, put the tiny models at a tenth of what they paid.
Coefficients are least-squares fits (a coefficient that comes out negative is held at 0), decode
over every run, prefill per kind over that kind's runs, to the graph memory a server paid per phase
(upstream's capture log line plus the layerwise capture report) in the runs listed in
graph_memory_fit.json.
`python -m sglang.sm120.plan.graph_memory --refit <results.json>...` rewrites the data file from
runner benchmark results (Qwen3-30B-A3B shapes) and plan-check results (benchmarks/plan_check.py:
each model's runs with its layers and hidden size).
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


def _scale(model: Optional[dict], ref: dict) -> float:
    """(layers x hidden size) of `model` relative to the fit model (1 for the fit model)."""
    m = model or ref
    return (m.get("num_hidden_layers", ref["num_hidden_layers"]) * m.get("hidden_size", ref["hidden_size"])
            / (ref["num_hidden_layers"] * ref["hidden_size"]))


def _columns(sizes: List[int], scale: float) -> List[float]:
    return [len(sizes), _largest(sizes), scale * _largest(sizes)]


def fit(runs: List[dict], ref: dict) -> Dict[str, Dict[str, Dict[str, float]]]:
    """Coefficients {phase: {kind: {a, b, c}}} in GB (a per captured size, b per row of the
    largest, c per row of the largest scaled by the model), for the fit model `ref`."""
    coef: Dict[str, Dict[str, Dict[str, float]]] = {"decode": {}, "prefill": {}}
    decode = [r for r in runs if r["phase"] == "decode"]
    kinds = sorted({k for r in decode for k in r["sizes"]})
    c = _lstsq([[v for k in kinds for v in _columns(r["sizes"].get(k, []), _scale(r.get("model"), ref))]
                for r in decode], [r["measured_gb"] for r in decode])
    coef["decode"] = {k: dict(zip("abc", c[3 * i:3 * i + 3])) for i, k in enumerate(kinds)}
    for kind in sorted({k for r in runs if r["phase"] == "prefill" for k in r["sizes"]}):
        pre = [r for r in runs if r["phase"] == "prefill" and set(r["sizes"]) == {kind}]
        c = _lstsq([_columns(r["sizes"][kind], _scale(r.get("model"), ref)) for r in pre],
                   [r["measured_gb"] for r in pre])
        coef["prefill"][kind] = dict(zip("abc", c))
    return coef


def estimate_gb(phase: str, sizes: Dict[str, List[int]], model: Optional[dict] = None,
                fitted: Optional[dict] = None) -> Optional[float]:
    """GB a phase's captures would take (an estimate), or None for a backend never measured.
    `model`: hf config dict of the served model (its layers and hidden size scale the c term)."""
    fitted = fitted or load()
    scale = _scale(model, fitted["model"])
    total = 0.0
    for kind, ss in sizes.items():
        if not ss:
            continue
        c = fitted["coefficients"][phase].get(kind)
        if c is None:
            return None
        total += sum(coef * col for coef, col in zip((c["a"], c["b"], c["c"]), _columns(ss, scale)))
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
    # indented, but a run per line (a run's size lists would take a line per number)
    head = json.dumps({k: v for k, v in data.items() if k != "runs"}, indent=1)
    run_lines = ",\n  ".join(json.dumps(r, separators=(",", ":")) for r in runs)
    FIT_FILE.write_text(head.removesuffix("\n}") + ',\n "runs": [\n  ' + run_lines + "\n ]\n}\n")
    for e in errors(data):
        print(json.dumps(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
