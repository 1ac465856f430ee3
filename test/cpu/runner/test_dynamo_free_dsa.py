"""Patch 0108: the DSA indexer's torch.compile'd helpers and dsa_backend._compiled_cat run without
Dynamo when SGLANG_SM120_DYNAMO_FREE=1, compute what Dynamo's trace of the same body computes, and
still enter Dynamo when the mode is off (so the trap below can fail).

Runs the patched upstream tree (pinned wheel + series) in a subprocess on CPU: the helpers are
called on a stand-in `self` that carries what they read (n_heads, softmax_scale and the gate
projection), with random inputs of a GLM-5 indexer's shapes.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import buildenv

REPO = Path(__file__).resolve().parents[3]
PATCH = "0108-dynamo-free-dsa-indexer.patch"
PATCHED_FILES = ("sglang/srt/layers/attention/dsa/dsa_indexer.py",
                 "sglang/srt/layers/attention/dsa_backend.py")

_SCRIPT = textwrap.dedent(
    r'''
    import json, os, sys
    import torch
    from sglang.sm120 import traps
    from sglang.srt.layers.attention import dsa_backend as db
    from sglang.srt.layers.attention.dsa import dsa_indexer as di

    torch.manual_seed(0)
    T, H, D, HIDDEN = 37, 32, 128, 256
    W = torch.randn(H, HIDDEN) / HIDDEN ** 0.5

    class IndexerState:
        n_heads, softmax_scale = H, D ** -0.5
        def _weights_proj_bf16_in_fp32_out(self, x):
            return x.float() @ W.t()

    me = IndexerState()
    x = torch.randn(T, HIDDEN, dtype=torch.bfloat16)
    q_scale = torch.rand(T, H, 1) + 0.5
    raw = torch.randn(T, H)
    nope, rope = torch.randn(T, 4, 512), torch.randn(T, 4, 64)
    calls = {
        "_project_and_scale_head_gates": (di.Indexer._project_and_scale_head_gates, (me, x)),
        "_get_logits_head_gate": (di.Indexer._get_logits_head_gate, (me, x, q_scale)),
        "_apply_q_scale_and_softmax_scale": (di.Indexer._apply_q_scale_and_softmax_scale, (me, raw, q_scale)),
        "_scale_head_gates": (di.Indexer._scale_head_gates, (me, raw, q_scale)),
        "_compiled_cat": (db._compiled_cat, ([nope, rope],)),
    }
    mode = sys.argv[1]
    os.environ["SGLANG_SM120_DYNAMO_FREE"] = "1" if mode == "on" else "0"
    out = {}
    for name, (fn, args) in calls.items():
        traps.clear_violations()
        got = None
        try:  # raise mode: a Dynamo entry stops before any (slow, CPU inductor) compile
            with traps.trapped("test", mode="raise"):
                got = fn(*args)
        except traps.TrapViolation:
            pass
        body = getattr(fn, "__wrapped_eager__", None)
        rec = {"dynamo_hits": len(traps.violations()), "has_eager_body": body is not None}
        if body is not None and got is not None:
            torch._dynamo.reset()
            traced = torch.compile(body, backend="eager", dynamic=True)(*args)
            rec["max_abs_diff_vs_dynamo_trace"] = float((got - traced).abs().max())
            rec["max_abs"] = float(traced.abs().max())
            rec["shape_equal"] = list(got.shape) == list(traced.shape)
        out[name] = rec
    if mode == "on":  # _cat (the caller of _compiled_cat) as the backend calls it
        traps.clear_violations()
        with traps.trapped("test", mode="log"):
            cat = db._cat([nope, rope], dim=-1)
        out["_cat"] = {"dynamo_hits": len(traps.violations()),
                       "equal": bool(torch.equal(cat, torch.cat([nope, rope], dim=-1)))}
    print("RESULT " + json.dumps(out))
    '''
)


@pytest.fixture(scope="module")
def patched_root(tmp_path_factory):
    try:
        root, names, changed = buildenv.write_patched_tree(tmp_path_factory.mktemp("patched"))
    except buildenv.UpstreamUnavailable as e:
        pytest.fail(str(e))
    assert PATCH in names, f"{PATCH} is not in {buildenv.series_dir()}/series"
    for f in PATCHED_FILES:
        assert f in changed and "compile_unless_dynamo_free" in changed[f], f
    return root


def _run(root, mode):
    env = dict(os.environ, PYTHONPATH=str(root), CUDA_VISIBLE_DEVICES="")
    env.pop("SGLANG_SM120_DYNAMO_FREE", None)
    env.pop("SGLANG_SM120_TRAPS", None)
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, mode], env=env, capture_output=True,
                          text=True, timeout=900)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, f"script failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return json.loads(line[len("RESULT "):])


@pytest.fixture(scope="module")
def results(patched_root):
    return {"on": _run(patched_root, "on"), "off": _run(patched_root, "off")}


HELPERS = ("_project_and_scale_head_gates", "_get_logits_head_gate",
           "_apply_q_scale_and_softmax_scale", "_scale_head_gates", "_compiled_cat")


@pytest.mark.parametrize("name", HELPERS)
def test_dynamo_free_mode_runs_the_helper_without_dynamo_and_matches_its_trace(results, name):
    r = results["on"][name]
    assert r["has_eager_body"], "the helper is not routed through compile_unless_dynamo_free"
    assert r["dynamo_hits"] == 0, r
    assert r["shape_equal"]
    # same ops in the same order; Dynamo's eager backend replays them, so differences are fp32 ulps
    assert r["max_abs_diff_vs_dynamo_trace"] <= 1e-5 * max(r["max_abs"], 1.0), r


@pytest.mark.parametrize("name", HELPERS)
def test_without_the_mode_the_helper_still_enters_dynamo(results, name):
    assert results["off"][name]["dynamo_hits"] > 0, results["off"][name]


def test_cat_concatenates_without_dynamo(results):
    assert results["on"]["_cat"] == {"dynamo_hits": 0, "equal": True}
