#!/usr/bin/env python3
"""Apply the GPU correctness test's current rule (`judge` in test_layerwise_correctness.py, beside
this script) to recorded results files (benchmarks/results/layerwise-correctness-*.json), without a GPU.

Why: upstream's own CUDA graphs break fixed absolute limits on the tiny bf16 models, so the rule
is relative to a control; recorded runs may predate it, and this says what they give under the rule
the next GPU run will apply. One approximation, printed with every verdict that uses it: the files
hold per-cell counts, not per-prompt tokens, so where layerwise must equal the control prompt by
prompt (same kernels), "every cell of the mode equals the control's cell" stands in for it, and a
difference is counted in cells, not prompts.

    zcat benchmarks/results/layerwise-correctness-qwen3_moe-bf16.json.gz > lab/scratch/q.json
    python test/gpu/rejudge_correctness.py lab/scratch/q.json
    python test/gpu/rejudge_correctness.py --same-kernels FILE ...   # the captured prefill ran on FA2
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def _rules():
    """The test module (run as a script, this folder is on sys.path; imported by a CPU test, it
    is on pytest's): no GPU is touched at import."""
    import test_layerwise_correctness as rules

    return rules


def _totals(rules, cells: dict):
    return rules.totals({key: rules.Cell(**d) for key, d in cells.items()})  # a file cell is Cell.__dict__


def rejudge(doc: dict, same_kernels: bool) -> dict:
    """{mode: [failures]} for the modes of one results file (empty list: passes)."""
    rules = _rules()
    modes = doc["modes"]
    quant = doc["model"].rsplit("-", 1)[1]
    noise = _totals(rules, modes["disabled-repeat"]) if "disabled-repeat" in modes else None
    control = _totals(rules, modes["full"]) if "full" in modes else None
    out = {}
    for mode in rules.TEST_MODES:
        if mode not in modes:
            continue
        vs_control = None
        if mode != "full" and control is not None and same_kernels:
            differing = sum(1 for k, c in modes["full"].items() if modes[mode].get(k) != c)
            vs_control = rules.Cell(flips=differing)  # cells standing in for prompts (module docstring)
        verdict = rules.judge(mode, _totals(rules, modes[mode]), control if mode != "full" else None,
                              noise, quant, vs_control)
        out[mode] = [f.replace(" prompts differ", " cells differ") for f in verdict.failures]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--same-kernels", action="store_true",
                    help="the layerwise engines ran the control's kernels (captured prefill on FA2); "
                         "MLA models (deepseek_v2) always do")
    a = ap.parse_args(argv)
    rules = _rules()
    failed = False
    for path in a.files:
        doc = json.loads(path.read_text())
        arch = doc["model"].rsplit("-", 1)[0]
        # the recorded runs are the H200's (SM90): there `auto` took FA3 for the captured prefill
        same = rules.same_kernels_as_control(arch, "fa2" if a.same_kernels else "auto", (9, 0))
        verdicts = rejudge(doc, same)
        cells = " (same kernels: cell equality stands in for prompt identity)" if same else ""
        print(f"{path.name}{cells}")
        for mode, failures in verdicts.items():
            print(f"  {mode}: {'pass' if not failures else 'FAIL: ' + '; '.join(failures)}")
            failed |= bool(failures)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
