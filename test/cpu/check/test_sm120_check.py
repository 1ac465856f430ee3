"""`python -m sglang.sm120 check` without a GPU: CLI parsing, shape selection, stage flow and exit
codes (with fake stages), targets, report formatting, the layerwise judge, the timing summary and
the MoE stage's CPU-side logic."""
import io
import json
import os
import subprocess
import sys
import time

import pytest

from installed import skip_module_without_sglang  # noqa: E402

skip_module_without_sglang()

from sglang.sm120.check import cli, layerwise, moe_check, report, timing  # noqa: E402


def test_defaults_and_options():
    a = cli.parse_args([])
    assert (a.quick, a.json, a.shapes, a.tp, a.skip) == (False, None, "all", None, [])
    a = cli.parse_args(["--quick", "--json", "r.json", "--shapes", "glm5", "--tp", "8", "--skip", "layerwise"])
    assert a.quick and str(a.json) == "r.json" and a.shapes == "glm5" and a.tp == 8 and a.skip == ["layerwise"]


@pytest.mark.parametrize("bad", [["--tp", "3"], ["--shapes", "llama"], ["--skip", "env"], ["--bogus"]])
def test_bad_arguments_exit_2(bad, capsys):
    with pytest.raises(SystemExit) as e:
        cli.parse_args(bad)
    assert e.value.code == 2


def test_shape_selection():
    every = cli.select_shapes("all", None, False)
    assert len({(n, k) for _, n, k in every}) == len(every)  # distinct N x K
    assert {s[0].split()[0] for s in every} == {"glm5", "qwen3-30b"}
    glm8 = cli.select_shapes("glm5", 8, False)
    assert glm8 and all(s[0].startswith("glm5") for s in glm8)
    assert ("glm5 q_b tp8", 2048, 2048) in glm8 and not any("tp1" in s[0] or "tp4" in s[0] for s in glm8)
    quick = cli.select_shapes("all", None, True)
    assert len(quick) == 4
    for fam in ("glm5", "qwen3"):
        mine = [s for s in every if s[0].startswith(fam)]
        sizes = {s[1] * s[2] for s in quick if s[0].startswith(fam)}
        assert sizes == {min(s[1] * s[2] for s in mine), max(s[1] * s[2] for s in mine)}


def _env(ctx):
    ctx.result["env"] = {"gpu": "Fake GPU", "arch": "sm_120", "sm_count": 188, "kernel_archs": ["sm_120a"]}
    return {"status": "pass", "detail": "Fake GPU"}


def _correct(ok=True):
    def stage(ctx):
        results = [{"name": "server self-check", "ok": True, "detail": "passed", "seconds": 0.3},
                   {"name": "glm5 o_proj tp1 W4A16 split-K M=1", "ok": ok, "detail": "3 of 6144 outside tolerance"}]
        return {"status": "pass" if ok else "fail", "results": results, "self_check": results[0]}
    return stage


def _moe_rows():
    rows = [{"shape": "glm5-tp8", "tokens": t, "experts_hit_mean": 8.0, "weight_bytes": 8 * 2_654_208,
             "us": {"marlin": 30.0, "sm120": 20.0}} for t in (1, 16)]
    return [moe_check.cell(r, 4e12) for r in rows]


def _moe(ok=True, marlin=True):
    def stage(ctx):
        results = [{"name": "moe glm5-tp8 T=1", "ok": True, "detail": "rel err 0"},
                   {"name": "moe glm5-ep8 T=17", "ok": ok, "detail": "3 of 104448 outside tolerance"}]
        rows = _moe_rows() if marlin else [{**r, "us": {"sm120": 20.0}, "x": {}} for r in _moe_rows()]
        backends = {"marlin": {"available": marlin, "reason": None if marlin else "ImportError: no sgl_kernel"},
                    "flashinfer_cutlass": {"available": False, "reason": moe_check.NOT_TIMED["flashinfer_cutlass"]}}
        return {"status": "pass" if ok else "fail", "results": results, "rows": rows, "backends": backends,
                "upstream_choice": "flashinfer_cutlass", "copy_bw_tbps": 4.0,
                "summary": moe_check.summarize(rows, "flashinfer_cutlass")}
    return stage


def _layerwise(ctx):
    return {"status": "pass", "counts": {"identical": 40, "flip": 2, "mismatch": 0}, "detail": "40 identical"}


def _timing(ctx):
    rows = [{"shape": "glm5 o_proj tp1", "N": 6144, "K": 16384, "M": m, "phase": ph,
             "us": {"sm120": 10.0, "bf16": 35.0, "marlin": 14.0}, "bw_pct": {"sm120": 70.0},
             "x": {"bf16": 3.5, "marlin": 1.4}, "best_upstream": "marlin"} for m, ph in ((1, "decode"), (1024, "prefill"))]
    return {"status": "pass", "rows": rows, "summary": timing.summarize(rows), "copy_bw_tbps": 4.3,
            "launch_floor_us": 2.0, "backends": {"marlin": {"available": True, "reason": None, "description": "Marlin"},
                                                 "flashinfer_cutlass": {"available": False, "description": "FI",
                                                                        "reason": "ValueError: require SM100+"}}}


FAKES = {"env": _env, "correctness": _correct(), "moe": _moe(), "layerwise": _layerwise, "timing": _timing}
GPU = lambda: (True, "")  # noqa: E731


def _run(argv, stages, probe=GPU):
    out = io.StringIO()
    code = cli.main(argv, stages=stages, probe=probe, stream=out)
    return code, out.getvalue()


def test_no_gpu_exits_2_and_says_so(tmp_path, capsys):
    path = tmp_path / "r.json"
    code, _ = _run(["--json", str(path)], FAKES, probe=lambda: (False, "torch sees no CUDA device"))
    assert code == 2 and "no CUDA GPU" in capsys.readouterr().err
    doc = json.loads(path.read_text())
    assert doc["no_gpu"] and doc["exit_code"] == 2


def test_all_pass_exit_0_with_a_progress_line_per_stage_and_reports(tmp_path):
    path = tmp_path / "sub" / "r.json"
    code, out = _run(["--quick", "--json", str(path)], FAKES)
    assert code == 0 and "RESULT: PASS" in out
    for i, name in enumerate(cli.STAGES, 1):
        assert f"stage {i}/5: {name}" in out and f"stage {i}/5: {name} PASS" in out
    doc = json.loads(path.read_text())
    t = doc["targets"]
    assert t["correctness_all_passed"] == {"value": 0, "target": "0 failures", "met": True, "checks": 2}
    assert t["server_self_check_seconds"]["met"] and t["layerwise_agrees_with_graphs_disabled"]["met"]
    assert t["decode_speedup_vs_best_upstream_fp4_geomean"]["value"] == 1.4
    assert t["decode_speedup_vs_bf16_geomean"]["value"] == 3.5 and t["quick_run_seconds"]["met"]
    assert all(set(v) >= {"value", "target", "met"} for v in t.values())
    md_text = path.with_suffix(".md").read_text()
    assert "**PASS**" in md_text and "| glm5 o_proj tp1 | 1 | 10.00 |" in md_text
    assert "flashinfer_cutlass: unavailable: ValueError: require SM100+" in md_text
    # the text table names every backend that ran, with the ratio
    assert "marlin us (x)" in out and "14.00 (x1.40)" in out and "flashinfer_cutlass: unavailable" in out


def test_a_correctness_failure_exits_1_and_is_listed(tmp_path):
    path = tmp_path / "r.json"
    code, out = _run(["--json", str(path)], {**FAKES, "correctness": _correct(ok=False)})
    assert code == 1 and "RESULT: FAIL" in out and "FAILED glm5 o_proj tp1 W4A16 split-K M=1" in out
    doc = json.loads(path.read_text())
    assert doc["targets"]["correctness_all_passed"]["met"] is False
    assert "quick_run_seconds" not in doc["targets"]  # only judged with --quick
    assert "## Failures" in path.with_suffix(".md").read_text()


def test_a_layerwise_failure_exits_1():
    fail = lambda ctx: {"status": "fail", "counts": {"mismatch": 9}, "detail": "9 mismatches"}  # noqa: E731
    code, out = _run([], {**FAKES, "layerwise": fail})
    assert code == 1 and "FAILED layerwise: 9 mismatches" in out


def test_a_stage_that_crashes_is_an_error_and_exits_1():
    def boom(ctx):
        raise RuntimeError("CUDA error: no kernel image is available")
    code, out = _run([], {**FAKES, "timing": boom})
    assert code == 1 and "timing ERROR" in out and "no kernel image" in out


def test_a_slow_timing_stage_does_not_fail_the_check():
    def slow(ctx):
        res = _timing(ctx)
        for r in res["rows"]:
            r["x"] = {"bf16": 0.5, "marlin": 0.5}
            r["us"] = {"sm120": 28.0, "bf16": 14.0, "marlin": 14.0}
        res["summary"] = timing.summarize(res["rows"])
        return res
    code, out = _run([], {**FAKES, "timing": slow})
    assert code == 0 and "MISS decode_speedup_vs_best_upstream_fp4_geomean" in out


def test_without_the_kernel_library_nothing_else_runs():
    ran = []
    env = lambda ctx: {"status": "error", "error": "sm120 kernel library not loadable: libsm120_kernels.so missing"}  # noqa: E731
    stages = {"env": env, **{k: (lambda ctx, k=k: ran.append(k)) for k in ("correctness", "moe", "layerwise", "timing")}}
    code, out = _run([], stages)
    assert code == 1 and ran == [] and "libsm120_kernels.so missing" in out


def test_skipped_stages_are_recorded_and_not_run(tmp_path):
    path = tmp_path / "r.json"
    code, out = _run(["--skip", "moe", "--skip", "layerwise", "--skip", "timing", "--json", str(path)], FAKES)
    assert code == 0 and "stage 2/2: correctness PASS" in out
    doc = json.loads(path.read_text())
    assert doc["stages"]["layerwise"] == {"status": "skipped"} and "decode_speedup_vs_bf16_geomean" not in doc["targets"]
    assert doc["stages"]["moe"] == {"status": "skipped"} and not any(k.startswith("moe_") for k in doc["targets"])


def test_fault_injection_is_announced_and_a_bad_value_refused(env_value, capsys):
    env_value("SGLANG_SM120_FAULT_INJECT", "gemm")
    code, out = _run(["--skip", "moe", "--skip", "layerwise", "--skip", "timing"], FAKES)
    assert "FAULT INJECTION ON (SGLANG_SM120_FAULT_INJECT=gemm): one GEMM result" in out
    env_value("SGLANG_SM120_FAULT_INJECT", "moe")
    code, out = _run(["--skip", "layerwise", "--skip", "timing"], FAKES)
    assert "FAULT INJECTION ON (SGLANG_SM120_FAULT_INJECT=moe): one MoE result" in out
    env_value("SGLANG_SM120_FAULT_INJECT", "everything")
    code, _ = _run([], FAKES)
    assert code == 2 and "SGLANG_SM120_FAULT_INJECT" in capsys.readouterr().err


def _gen(tokens, lps=None, top=None):
    n = len(tokens)
    # default top-5: the chosen token well ahead of four others (no near ties)
    filler = {"100": -4.0, "101": -4.5, "102": -5.0, "103": -5.5}
    return {"tokens": tokens, "logprobs": lps or [-1.0] * n,
            "top": top or [{str(t): -1.0, **filler} for t in tokens]}


def test_layerwise_classify_and_judge():
    ref = _gen([5, 6, 7])
    assert layerwise.classify(ref, _gen([5, 6, 7]))["kind"] == "identical"
    near = [{"5": -1.0}, {"6": -0.70, "9": -0.80}, {"7": -1.0}]
    ref_tie = _gen([5, 6, 7], top=near)
    got_tie = _gen([5, 9, 7], top=[{"5": -1.0}, {"9": -0.72, "6": -0.75}, {"7": -1.0}])
    assert layerwise.classify(ref_tie, got_tie)["kind"] == "flip"
    far = _gen([5, 9, 7], top=[{"5": -1.0}, {"9": -0.1, "6": -3.0}, {"7": -1.0}])
    assert layerwise.classify(ref_tie, far)["kind"] == "mismatch"
    assert layerwise.classify(ref, _gen([5, 6]))["kind"] == "mismatch"
    refs = [ref] * 40
    assert layerwise.judge(refs, [_gen([5, 6, 7])] * 40)["ok"]
    two_bad = [_gen([5, 6, 7])] * 38 + [_gen([1, 1, 1])] * 2  # 5% of 40
    assert layerwise.judge(refs, two_bad)["ok"]
    assert not layerwise.judge(refs, [_gen([5, 6, 7])] * 37 + [_gen([1, 1, 1])] * 3)["ok"]
    drift = [_gen([5, 6, 7], lps=[-1.0, -2.5, -1.0])] + [_gen([5, 6, 7])] * 39
    res = layerwise.judge(refs, drift)
    assert not res["ok"] and res["max_abs_delta"] == 1.5
    assert not layerwise.judge(refs, refs[:39])["ok"]


def test_layerwise_prompts_are_deterministic_and_in_vocab():
    a = layerwise.prompt_batches(layerwise.QUICK_GRID, 4096)
    assert a == layerwise.prompt_batches(layerwise.QUICK_GRID, 4096)
    assert [len(b) for b in a] == [bs for bs in layerwise.QUICK_GRID["batch_sizes"]
                                   for _ in layerwise.QUICK_GRID["prompt_lens"]]
    assert all(3 <= t < 4096 for b in a for p in b for t in p)


def test_layerwise_engines_differ_only_in_graph_backends():
    from sglang.sm120.check.layerwise_worker import engine_kwargs

    off, on = engine_kwargs("disabled", 16, 256), engine_kwargs("layerwise", 16, 256)
    assert off["cuda_graph_backend_decode"] == off["cuda_graph_backend_prefill"] == "disabled"
    assert on["cuda_graph_backend_decode"] == on["cuda_graph_backend_prefill"] == "layerwise"
    assert on["cuda_graph_layerwise_every_size"]
    graph_keys = {"cuda_graph_backend_decode", "cuda_graph_backend_prefill", "cuda_graph_layerwise_every_size"}
    assert {k: v for k, v in off.items() if k not in graph_keys} == {k: v for k, v in on.items() if k not in graph_keys}
    with pytest.raises(ValueError):
        engine_kwargs("full", 16, 256)


def test_timing_summary_against_the_best_upstream_backend():
    rows = [{"phase": "decode", "us": {"sm120": 10.0, "bf16": 30.0, "marlin": 20.0, "flashinfer_cutlass": 15.0},
             "x": {"bf16": 3.0, "marlin": 2.0, "flashinfer_cutlass": 1.5}, "bw_pct": {"sm120": 80.0},
             "best_upstream": "flashinfer_cutlass"},
            {"phase": "decode", "us": {"sm120": 10.0, "bf16": 20.0}, "x": {"bf16": 2.0}, "bw_pct": {"sm120": 60.0},
             "best_upstream": None}]
    s = timing.summarize(rows)
    assert s["decode"]["best_upstream"] == 1.5 and s["decode"]["bf16"] == pytest.approx(2.449, abs=1e-3)
    assert s["prefill"]["best_upstream"] is None and s["decode"]["ours_bw_pct_median"] == 80.0


def test_the_fork_cli_dispatches_check_and_exits_2_without_a_gpu():
    proc = subprocess.run([sys.executable, "-m", "sglang.sm120", "check", "--quick"], capture_output=True, text=True,
                          timeout=300, cwd="/", env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 2 and "no CUDA GPU" in proc.stderr, proc.stderr[-2000:]
    proc = subprocess.run([sys.executable, "-m", "sglang.sm120", "check", "--help"], capture_output=True, text=True,
                          timeout=300, cwd="/")
    assert proc.returncode == 0 and "--shapes" in proc.stdout and "--tp" in proc.stdout


def test_clone_layer_copies_upstreams_parameter_classes_and_keeps_aliases():
    import copy

    import torch

    from sglang.sm120.check import upstream_fp4 as U
    from sglang.srt.layers.utils import alias_or_bind_derived_param

    layer = torch.nn.Module()
    U._method().create_weights(layer, 128, [256], 128, 256, torch.bfloat16, weight_loader=lambda *a, **k: None)
    with pytest.raises(TypeError):
        copy.deepcopy(layer)  # why clone_layer exists
    alias_or_bind_derived_param(layer, "weight_scale", "weight_scale_interleaved",
                                torch.ones(256, 8).to(torch.float8_e4m3fn))
    layer.workspace = torch.zeros(4)
    c = U.clone_layer(layer)
    assert c.weight_scale is c.weight_scale_interleaved and layer.weight_scale is layer.weight_scale_interleaved
    for name in ("weight", "weight_scale", "input_scale", "weight_scale_2"):
        a, b = getattr(layer, name), getattr(c, name)
        # bytes, not values: create_weights leaves torch.empty memory, which may hold NaN
        same_bytes = torch.equal(a.detach().reshape(-1).view(torch.uint8), b.detach().reshape(-1).view(torch.uint8))
        assert isinstance(b, torch.nn.Parameter) and b.data_ptr() != a.data_ptr() and same_bytes, name
    assert c.workspace.data_ptr() != layer.workspace.data_ptr()
    assert (c.output_size_per_partition, c.input_size_per_partition, c.quant_config) == (
        256, 128, layer.quant_config)


def _fake_worker(tmp_path, sleep_s: float):
    """An executable standing in for `python -m sglang.sm120.check.layerwise_worker ...`."""
    exe = tmp_path / "fake-python"
    exe.write_text("#!/bin/bash\nout=''\nwhile [ $# -gt 0 ]; do [ \"$1\" = --out ] && out=$2; shift; done\n"
                   f"echo compiling; sleep {sleep_s}\n"
                   "echo '{\"mode\": \"x\", \"startup_s\": 0.1, \"outputs\": []}' > \"$out\"\n")
    exe.chmod(0o755)
    return exe


def test_layerwise_engine_prints_progress_while_it_runs_and_returns_its_result(tmp_path, monkeypatch):
    monkeypatch.setattr(layerwise.sys, "executable", str(_fake_worker(tmp_path, 0.6)))
    monkeypatch.setattr(layerwise, "HEARTBEAT_S", 0.2)
    lines = []
    doc = layerwise._run_worker(tmp_path / "m", "disabled", tmp_path / "p.json", tmp_path / "o.json",
                                layerwise.QUICK_GRID, 30, lines.append)
    assert doc["outputs"] == [] and doc["wall_s"] >= 0.6
    assert lines and all(ln.startswith("  disabled engine: running for ") for ln in lines)


def test_layerwise_engine_over_its_limit_is_stopped_with_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(layerwise.sys, "executable", str(_fake_worker(tmp_path, 30)))
    monkeypatch.setattr(layerwise, "HEARTBEAT_S", 0.2)
    t0 = time.time()
    doc = layerwise._run_worker(tmp_path / "m", "layerwise", tmp_path / "p.json", tmp_path / "o.json",
                                layerwise.QUICK_GRID, 1.0, lambda s: None)
    assert doc == {"error": "layerwise engine did not finish in 1 s"} and time.time() - t0 < 10


def test_the_moe_stage_in_targets_report_and_table(tmp_path):
    path = tmp_path / "r.json"
    code, out = _run(["--json", str(path)], FAKES)
    assert code == 0
    t = json.loads(path.read_text())["targets"]
    assert t["moe_correctness_all_passed"] == {"value": 0, "target": "0 failures", "met": True, "checks": 2}
    assert t["moe_speedup_vs_upstream_marlin_geomean"]["value"] == 1.5 and t["moe_speedup_vs_upstream_marlin_geomean"]["met"]
    # the text table and the markdown: ours, Marlin with x, % copy BW on the bytes of the experts hit
    assert "MoE shapes" in out and "30.00 (x1.50)" in out and "MoE flashinfer_cutlass: unavailable: FlashInfer" in out
    bw = 100 * 8 * 2_654_208 / 20e-6 / 4e12
    assert f"{bw:.1f}" in out
    md = path.with_suffix(".md").read_text()
    assert "## MoE timing" in md and "| glm5-tp8 | 1 | 8.0 | 20.00 | 30.00 (x1.50) |" in md
    assert "flashinfer_cutlass: unavailable: FlashInfer's CUTLASS MoE" in md


def test_a_moe_failure_exits_1_and_marlin_missing_is_a_miss_with_the_reason(tmp_path):
    path = tmp_path / "r.json"
    code, out = _run(["--json", str(path)], {**FAKES, "moe": _moe(ok=False)})
    assert code == 1 and "FAILED moe glm5-ep8 T=17: 3 of 104448 outside tolerance" in out
    assert json.loads(path.read_text())["targets"]["moe_correctness_all_passed"]["met"] is False
    code, out = _run(["--json", str(path)], {**FAKES, "moe": _moe(marlin=False)})
    t = json.loads(path.read_text())["targets"]["moe_speedup_vs_upstream_marlin_geomean"]
    assert code == 0 and t["value"] is None and not t["met"] and t["missing"] == "ImportError: no sgl_kernel"


def test_moe_stage_shape_sets_upstream_choice_and_summary():
    assert [s.name for s in moe_check.shape_sets("all")] == ["glm5-tp8", "glm5-ep8", "qwen3-30b"]
    assert [s.name for s in moe_check.shape_sets("glm5")] == ["glm5-tp8", "glm5-ep8"]
    assert [s.name for s in moe_check.shape_sets("qwen3")] == ["qwen3-30b"]
    assert moe_check.upstream_choice((9, 0)) == "marlin" and moe_check.upstream_choice((8, 9)) == "marlin"
    assert moe_check.upstream_choice((12, 0)) == moe_check.upstream_choice((12, 1)) == "flashinfer_cutlass"
    assert moe_check.upstream_choice((10, 0)) == "flashinfer_trtllm"
    assert moe_check.upstream_choice((7, 5)) is None
    assert moe_check.timed_backends(True) == ("marlin",) and "bf16" in moe_check.timed_backends(False)
    assert set(moe_check.QUICK_TOKENS) <= set(moe_check.TOKENS) and max(moe_check.TOKENS) == 1024
    rows = [moe_check.cell({"shape": s, "tokens": 1, "weight_bytes": 1e6, "us": us}, 4e12) for s, us in
            (("a", {"sm120": 10.0, "marlin": 20.0}), ("a", {"sm120": 10.0, "marlin": 5.0}),
             ("b", {"sm120": 10.0}))]
    assert rows[0]["x"] == {"marlin": 2.0} and rows[2]["x"] == {} and rows[0]["bw_pct"]["sm120"] == 2.5
    s = moe_check.summarize(rows, "marlin")
    assert s["x_marlin_geomean"] == 1.0 and s["x_marlin_min"] == 0.5 and s["upstream_choice"] == "marlin"
    assert s["per_shape"]["a"]["x_marlin_geomean"] == 1.0 and s["per_shape"]["b"]["x_marlin_geomean"] is None


def test_moe_stage_run_assembles_checks_rows_and_backends(monkeypatch, env_value):
    """moe_check.run with stand-ins for the GPU parts (device queries, the kernel checks, the timed
    cells): every shape set of the family checked and timed at the quick sizes, Marlin's failure on
    one shape set reported with its reason, upstream's SM120 choice listed as not timed, and one
    failed check failing the stage."""
    import types

    import torch

    from sglang.sm120.check import gemm_timing, moe_timing

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (12, 0))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: types.SimpleNamespace(L2_cache_size=96 << 20))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(gemm_timing, "copy_bandwidth", lambda log: (4e12, {"memcpy": 4.0}))
    checked = []

    def correctness(shape, tokens, log, fault=False):
        checked.append((shape.name, tuple(tokens), fault))
        return [{"name": f"moe {shape.name} T={t}", "ok": not (shape.name == "glm5-ep8" and t == 17), "detail": "d"}
                for t in tokens]

    def setup(shape, backends, dev, seed=0):
        packed = types.SimpleNamespace(expert_weight_bytes=lambda: 1000)
        ops = {"sm120": None, **({} if shape.name == "glm5-ep8" else {"marlin": None})}
        return packed, ops, ({"marlin": "RuntimeError: no EP"} if shape.name == "glm5-ep8" else {})

    def time_row(shape, tokens, ops, order, expert_bytes, l2, reps, dev, seed=1):
        assert order == ("marlin", "sm120") and l2 == 96 << 20
        return {"shape": shape.name, "tokens": tokens, "ops": 2, "experts_hit_mean": 8.0, "weight_bytes": 8000,
                "us": {b: 10.0 if b == "sm120" else 15.0 for b in ops}, "failed": {}}

    monkeypatch.setattr(moe_check, "correctness", correctness)
    monkeypatch.setattr(moe_timing, "setup", setup)
    monkeypatch.setattr(moe_timing, "time_row", time_row)
    res = moe_check.run("glm5", True, 7, lambda m: None)
    assert checked == [("glm5-tp8", moe_check.QUICK_TOKENS, False), ("glm5-ep8", moe_check.QUICK_TOKENS, False)]
    assert res["status"] == "fail" and "first failure: moe glm5-ep8 T=17" in res["detail"]
    assert {(r["shape"], r["tokens"]) for r in res["rows"]} == {
        (s, t) for s in ("glm5-tp8", "glm5-ep8") for t in moe_check.QUICK_TIMING_TOKENS}
    assert res["upstream_choice"] == "flashinfer_cutlass"
    assert res["backends"]["marlin"] == {"available": True, "reason": None,
                                         "failed_shapes": {"RuntimeError: no EP": ["glm5-ep8"]}}
    assert res["backends"]["flashinfer_cutlass"]["reason"] == moe_check.NOT_TIMED["flashinfer_cutlass"]
    assert res["summary"]["x_marlin_geomean"] == 1.5 and res["summary"]["per_shape"]["glm5-ep8"]["x_marlin_geomean"] is None
    # SGLANG_SM120_FAULT_INJECT=moe corrupts the first shape set's first result, no other
    env_value("SGLANG_SM120_FAULT_INJECT", "moe")
    checked.clear()
    moe_check.run("glm5", True, 7, lambda m: None)
    assert [c[2] for c in checked] == [True, False]
