"""The sm120 backend's self-check on a real GPU: with a fault injected
(SGLANG_SM120_FAULT_INJECT=gemm) the first layer logs one failure line naming shape, M and error,
the process switches to upstream's backend and the layer still computes the right result; without
it the backend stays sm120. And `python -m sglang.sm120 check` exits 1 on the same fault.

Each case runs in a fresh process: the self-check and the backend choice are per process.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.gpu

LAYER_SCRIPT = textwrap.dedent(
    """
    import json, types, torch
    from sglang.srt.layers.quantization import fp4_utils
    from sglang.sm120 import fp4_selfcheck, nvfp4 as F
    from sglang.sm120.check import upstream_fp4 as U
    from sglang.sm120.fp4_tolerance import compare, exact_dequant

    torch.backends.cuda.matmul.allow_tf32 = False
    fp4_utils.initialize_fp4_gemm_config(types.SimpleNamespace(fp4_gemm_runner_backend="sm120"))
    n, k = 2048, 4096
    g = torch.Generator(device="cuda").manual_seed(7)
    q = F.quantize_weight_modelopt(torch.randn(n, k, device="cuda", generator=g) * 0.02)
    x = torch.randn(8, k, device="cuda", generator=g).to(torch.bfloat16)
    in_s = F.input_scale_from_amax(x.float().abs().max())
    method, layer = U.upstream_layer(q, n, k, in_s, None)  # the process's backend, as a server loads
    y = method.apply(layer, x)
    wd = exact_dequant(q["weight"], q["weight_scale"], q["weight_scale_2"])
    ref, absref = x.float() @ wd.t(), x.float().abs() @ wd.abs().t()
    rel = float((y.float() - ref).norm() / ref.norm())
    o = fp4_selfcheck.outcome()
    print("RESULT " + json.dumps({"backend": fp4_utils.get_fp4_gemm_runner_backend().value, "rel": rel,
                                  "within_tolerance": compare(y, ref, absref).ok, "ok": o.ok, "m": o.m,
                                  "seconds": o.seconds, "fallback": o.fallback}))
    """
)


def _run_layer(fault):
    env = {**os.environ, "SGLANG_SM120_FAULT_INJECT": fault}
    proc = subprocess.run([sys.executable, "-c", LAYER_SCRIPT], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):]), proc.stderr


def test_self_check_passes_and_the_backend_stays_sm120():
    res, err = _run_layer("")
    assert res["ok"] and res["backend"] == "sm120" and res["within_tolerance"], res
    assert res["seconds"] < 1.0, res
    assert "self-check FAILED" not in err


def test_injected_fault_falls_back_to_upstream_with_one_line_and_a_correct_layer():
    res, err = _run_layer("gemm")
    failed = [ln for ln in err.splitlines() if "self-check FAILED" in ln]
    assert len(failed) == 1, err[-4000:]
    assert "N=2048 K=4096 M=1 W4A16" in failed[0] and "outside tolerance" in failed[0], failed[0]
    assert not res["ok"] and res["m"] == 1 and res["backend"] != "sm120" and res["fallback"] == res["backend"]
    assert res["backend"] in failed[0]
    # upstream's path (Marlin on SM90, FlashInfer on SM120) serves the layer: close to the reference
    assert res["rel"] < 2e-2, res


CHECK = [sys.executable, "-m", "sglang.sm120", "check", "--quick", "--shapes", "qwen3", "--tp", "8",
         "--skip", "layerwise", "--skip", "timing"]


def test_check_cli_passes_and_fails_on_the_injected_fault(tmp_path):
    ok = subprocess.run(CHECK + ["--json", str(tmp_path / "ok.json")], capture_output=True, text=True, timeout=600,
                        env={**os.environ, "SGLANG_SM120_FAULT_INJECT": ""})
    assert ok.returncode == 0, ok.stdout[-4000:] + ok.stderr[-2000:]
    doc = json.loads((tmp_path / "ok.json").read_text())
    assert doc["targets"]["correctness_all_passed"]["met"] and doc["targets"]["server_self_check_seconds"]["met"]
    bad = subprocess.run(CHECK + ["--json", str(tmp_path / "bad.json")], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "SGLANG_SM120_FAULT_INJECT": "gemm"})
    assert bad.returncode == 1, bad.stdout[-4000:]
    assert "FAULT INJECTION ON" in bad.stdout and "RESULT: FAIL" in bad.stdout
    doc = json.loads((tmp_path / "bad.json").read_text())
    failed = [r["name"] for r in doc["stages"]["correctness"]["results"] if not r["ok"]]
    # the server's self-check and the first GEMM compared, nothing else
    assert len(failed) == 2 and failed[0].startswith("server self-check") and "M=1" in failed[1], failed
