"""`python -m sglang.sm120 check --quick` end to end on a GPU: every stage runs, the exit code is 0,
and the JSON report holds the targets the project reads (correctness, layerwise, self-check, the
quick run's time) and a timing row for every shape and M, and the MoE stage's checks and rows."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def test_quick_check_passes_end_to_end(tmp_path):
    path = tmp_path / "check.json"
    tiny = os.environ.get("SGLANG_SM120_TINY_DIR") or str(tmp_path / "tiny")
    proc = subprocess.run([sys.executable, "-m", "sglang.sm120", "check", "--quick", "--json", str(path),
                           "--tiny-dir", tiny], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "SGLANG_SM120_FAULT_INJECT": ""})
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    doc = json.loads(path.read_text())
    assert [s for s, st in doc["stages"].items() if st["status"] != "pass"] == []
    t = doc["targets"]
    for name in ("correctness_all_passed", "moe_correctness_all_passed", "layerwise_agrees_with_graphs_disabled",
                 "server_self_check_seconds"):
        assert t[name]["met"], (name, t[name])
    assert "quick_run_seconds" in t and "decode_speedup_vs_bf16_geomean" in t
    rows = doc["stages"]["timing"]["rows"]
    assert {(r["shape"], r["M"]) for r in rows} == {(s, m) for s in {r["shape"] for r in rows} for m in (1, 4, 16, 1024)}
    assert all("sm120" in r["us"] and "bf16" in r["us"] for r in rows)
    backends = doc["stages"]["timing"]["backends"]
    assert all(info["available"] or info["reason"] for info in backends.values())
    moe = doc["stages"]["moe"]
    assert {(r["shape"], r["tokens"]) for r in moe["rows"]} == {
        (s, t) for s in ("glm5-tp8", "glm5-ep8", "qwen3-30b") for t in (1, 16, 128)}
    assert all("sm120" in r["us"] for r in moe["rows"]) and len(moe["results"]) == 3 * 4
    assert all(info["available"] or info["reason"] for info in moe["backends"].values())
    assert "moe_speedup_vs_upstream_marlin_geomean" in t
    assert path.with_suffix(".md").is_file()
