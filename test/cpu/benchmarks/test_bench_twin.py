"""bench_twin's command construction and result assembly with fake outputs, the ballast's
arithmetic, and the projection's arithmetic (no GPU)."""
import gzip
import json

import pytest
import repo_scripts


@pytest.fixture(scope="module")
def bench():
    return repo_scripts.load("benchmarks/bench_twin.py")


def _opt(cmd, flag, n=1):
    i = cmd.index(flag)
    return cmd[i + 1:i + 1 + n]


def test_one_batch_command(bench, tmp_path):
    cmd = bench.one_batch_cmd(tmp_path / "m", "lw", [1, 64], 4096, tmp_path / "r.jsonl",
                              bench.config_args("upstream_ceiling", 256), passes=2)
    assert cmd[1] == "-c" and "twin_router.install()" in cmd[2] and "cli_main()" in cmd[2]
    assert "--attention-backend" not in cmd  # upstream picks GLM-5's DSA backend itself
    assert _opt(cmd, "--load-format") == ["dummy"] and _opt(cmd, "--mem-fraction-static") == ["0.92"]
    assert _opt(cmd, "--input-len") == ["4096"] and _opt(cmd, "--output-len") == ["8"]
    assert _opt(cmd, "--batch-size", 5) == ["1", "64", "1", "64", "--input-len"]
    assert _opt(cmd, "--cuda-graph-max-bs-decode") == ["256"] and _opt(cmd, "--tp-size") == ["1"]


def test_every_plan_group_is_about_256k_tokens_at_large_batches(bench):
    assert sorted(bs for v in bench.GROUPS.values() for bs in v) == bench.DECODE_BS
    for ctx, sizes in bench.GROUPS.items():
        assert max(sizes) * ctx == 262144


LOG_OK = """
KV Cache is allocated. #tokens: 300123, K size: 13.2 GB
Capture decode CUDA graph end. elapsed=41.5 s, mem usage=3.25 GB
"""


def _rows(bs_ms):
    return [{"batch_size": bs, "median_decode_latency": ms / 1e3} for bs, ms in bs_ms]


def _cell(bench, name, ctx, sizes, ms, log=LOG_OK, rc=0, probe=None, traps=0):
    c = bench.assemble_cell(name, ctx, sizes, rc, 100.0, {"kv_pool": 20.0, "decode_captured": 61.0}, log,
                            _rows([(bs, m) for bs, m in zip(sizes, ms)]) if rc == 0 else [],
                            probe or {"nonfinite_logits": False}, {"ballast_bytes": 1}, ["py", "-c", "x", "--a"])
    c["trap_hits"] = traps
    return c


def test_assemble_cell_reads_kv_capture_ready_and_oom(bench):
    c = _cell(bench, "layerwise", 256, [1024], [50.0])
    assert c["status"] == "ok" and c["kv_pool_tokens"] == 300123 and c["time_to_ready_s"] == 61.0
    assert c["decode_capture_s"] == 41.5 and c["decode_graph_mem_gb"] == 3.25
    assert c["decode_s"] == {"1024": 0.05} and c["command"] == "py -c <prelude> --a"
    oom = _cell(bench, "full_graphs_1024", 256, [1024], [], log="torch.OutOfMemoryError: CUDA out of memory", rc=1)
    assert oom["status"] == "oom" and not oom["fits"] and oom["log_tail"]


def _doc(bench, hist=None):
    cells = {
        "upstream_ceiling-ctx256": _cell(bench, "upstream_ceiling", 256, [1, 256, 1024], [10.0, 20.0, 90.0]),
        "full_graphs_1024-ctx256": _cell(bench, "full_graphs_1024", 256, [1, 256, 1024], [10.0, 20.0, 40.0],
                                         log=LOG_OK.replace("3.25", "8.0")),
        "layerwise-ctx256": _cell(bench, "layerwise", 256, [1, 256, 1024], [10.2, 22.0, 41.0]),
    }
    return {"cells": cells, "upstream_ceiling": {"ceiling": 256}, "field": {"kv_tokens": 314000},
            "histogram": {"probe": {"nonfinite_logits": False, "histogram": hist or {}}}}


def test_targets_from_fake_cells(bench):
    even = {"counts": [32] * 256, "experts": 256, "experts_hit": 256, "max_over_mean": 1.0}
    t = bench.compute_targets(_doc(bench, {"3": even, "77": even}))
    assert t["decode_graph_mem_layerwise_vs_full_1024"]["value"] == round(3.25 / 8.0, 4)
    assert t["decode_graph_mem_layerwise_vs_full_1024"]["met"]
    assert t["step_time_layerwise_vs_full_bs1"]["met"] and not t["step_time_layerwise_vs_full_bs256"]["met"]
    assert t["step_time_layerwise_vs_full_bs1024"]["value"] == round(41.0 / 40.0, 4)
    assert t["decode_capture_s_layerwise"]["met"] and t["trap_hits_layerwise"]["met"]
    assert t["kv_pool_vs_96gb_card"]["value"] == round(300123 / 314000, 4) and t["kv_pool_vs_96gb_card"]["met"]
    assert t["layerwise_decode_bs1024_in_96gb"]["met"] and t["no_nonfinite_logits"]["met"]
    assert t["router_spread_bs1024"]["met"]


def test_targets_when_full_graphs_oom_and_router_missing(bench):
    doc = _doc(bench)
    doc["cells"]["full_graphs_1024-ctx256"] = _cell(bench, "full_graphs_1024", 256, [1, 256, 1024], [],
                                                     log="CUDA out of memory", rc=1)
    doc["cells"]["layerwise-ctx256"]["probe"] = {"nonfinite_logits": True}
    t = bench.compute_targets(doc)
    m = t["decode_graph_mem_layerwise_vs_full_1024"]
    assert m["value"] is None and not m["met"] and "did not fit" in m["note"]
    # bs <= the upstream ceiling falls back to upstream's own full graphs; 1024 has no full-graph figure
    assert t["step_time_layerwise_vs_full_bs256"]["value"] == round(22.0 / 20.0, 4)
    assert "step_time_layerwise_vs_full_bs1024" not in t
    assert not t["no_nonfinite_logits"]["met"] and not t["router_spread_bs1024"]["met"]


def test_kernel_split(bench, tmp_path):
    trace = tmp_path / "x_decode.trace.json.gz"
    events = [{"cat": "kernel", "name": "fused_moe_kernel", "dur": 30.0},
              {"cat": "kernel", "name": "cutlass_fp4_grouped_gemm", "dur": 20.0},
              {"cat": "kernel", "name": "flash_mla_sparse_fwd", "dur": 15.0},
              {"cat": "kernel", "name": "fp8_mqa_logits (indexer)", "dur": 10.0},
              {"cat": "kernel", "name": "rmsnorm_kernel", "dur": 25.0},
              {"cat": "cpu_op", "name": "aten::mm", "dur": 999.0}]
    with gzip.open(trace, "wt") as f:
        json.dump({"traceEvents": events}, f)
    s = bench.kernel_split([str(trace)])
    assert (s["moe_us"], s["attention_us"], s["other_us"], s["gpu_total_us"]) == (50.0, 25.0, 25.0, 100.0)
    assert s["fractions"]["moe"] == 0.5


def test_render_md(bench):
    doc = _doc(bench)
    doc["targets"] = bench.compute_targets(doc)
    md = bench.render_md(doc)
    assert "| 1024 | 90.00 | 40.00 | 41.00 |" in md and "kv_pool_vs_96gb_card" in md


def test_ballast_leaves_the_cards_total_free():
    ballast = repo_scripts.load("benchmarks/ballast.py")
    from sglang.sm120.plan.cards import CARDS

    h200_free = 140 * 2**30
    n = ballast.ballast_bytes(h200_free, CARDS["rtx-pro-6000"].memory_bytes)
    assert h200_free - n == 97887 * 2**20
    with pytest.raises(ValueError):
        ballast.ballast_bytes(90 * 2**30, CARDS["rtx-pro-6000"].memory_bytes)


@pytest.fixture(scope="module")
def projection():
    return repo_scripts.load("benchmarks/glm5_projection.py")


def test_projection_refuses_without_the_measured_step(projection, capsys):
    assert projection.main([]) == 2  # the shipped inputs: not measured yet
    assert "not measured" in capsys.readouterr().err


def test_projection_arithmetic(projection, tmp_path):
    p = json.loads(projection.INPUTS.read_text())
    p.update(twin_gpu_ms_per_step={"64": 20.0, "1024": 60.0}, twin_bandwidth_tbs=4.0, target_bandwidth_tbs=2.0,
             pcie_allreduce_bus_gbs=10.0, allreduce_latency_us=10.0)
    r = projection.project(p)
    # 1024: GPU 60 x 2 = 120 ms; per all-reduce 0.01 ms + 2 x 7/8 x 1024 x 6144 x 2 B / 10 GB/s = 2.2121 ms,
    # x 156 all-reduces = 345.09 ms; step 465.09 ms; 1024 / 0.46509 s = 2201.7 tok/s
    one = 0.01 + 1.75 * 1024 * 6144 * 2 / 10e9 * 1e3
    assert r["1024"]["allreduce_ms"] == round(156 * one, 3)
    assert r["1024"]["output_tok_s"] == round(1024 / (120 + 156 * one) * 1e3, 1)
    assert r["64"]["gpu_ms"] == 40.0 and r["1024"]["reference"]["value"] == 1520
    f = tmp_path / "in.json"
    f.write_text(json.dumps(p))
    assert projection.main(["--inputs", str(f)]) == 0


def test_moe_backend_configs_are_layerwise_plus_the_backend_and_by_name_only(bench):
    assert bench.DEFAULT_CONFIGS == ["upstream_ceiling", "full_graphs_1024", "layerwise"]
    for backend in ("sm120", "marlin"):
        name = f"layerwise_moe_{backend}"
        args = bench.config_args(name, 256)
        assert args == bench.config_args("layerwise", 256) + ["--moe-runner-backend", backend]
        assert bench.CONFIG_ENV[name] == {"SGLANG_SM120_LEAN_MOE": "1"}


def test_empty_configs_run_only_the_histogram_and_profile(bench):
    assert bench.parse_args(["--configs"]).configs == []
    assert bench.parse_args([]).configs == bench.DEFAULT_CONFIGS
    with pytest.raises(SystemExit):
        bench.parse_args(["--configs", "nonsense"])


@pytest.mark.parametrize("ceiling, separate_run", [(512, False), (1024, True)])
def test_histogram_comes_with_upstreams_eager_bs1024_when_its_ceiling_is_below(bench, tmp_path, monkeypatch,
                                                                              ceiling, separate_run):
    even = {"counts": [32] * 256, "experts": 256, "experts_hit": 256, "max_over_mean": 1.0}
    envs, extra = [], []
    from sglang.sm120.tiny import twin

    monkeypatch.setattr(twin, "write", lambda d, v: None)
    monkeypatch.setattr(bench.bench_runner, "device_name", lambda: "gpu")
    monkeypatch.setattr(bench, "upstream_ceiling", lambda: {"ceiling": ceiling, "rule": "test"})

    def run_cell(model, name, ctx, sizes, workdir, timeout, ceil, passes, extra_env=None, **k):
        envs.append((name, extra_env))
        hist = {"3": even} if extra_env else None
        return _cell(bench, name, ctx, sizes, [10.0] * len(sizes), probe={"nonfinite_logits": False, "histogram": hist})

    monkeypatch.setattr(bench, "run_cell", run_cell)
    monkeypatch.setattr(bench, "run_histogram", lambda *a: extra.append("histogram") or {"probe": None})
    out = tmp_path / "t.json"
    bench.main(["--quick", "--configs", "layerwise", "upstream_ceiling", "--skip", "profile",
                "--workdir", str(tmp_path), "--out", str(out)])
    doc = json.loads(out.read_text())
    assert envs[0] == ("layerwise", None)
    assert envs[1] == ("upstream_ceiling", None if separate_run else {"SGLANG_SM120_TWIN_HISTOGRAM_BS": "1024"})
    assert extra == (["histogram"] if separate_run else [])
    if not separate_run:
        assert doc["histogram"]["from"] == "upstream_ceiling-ctx256" and doc["targets"]["router_spread_bs1024"]["met"]


def test_layerwise_keeps_full_graphs_up_to_the_tp8_ranks_ceiling(bench):
    args = bench.config_args("layerwise", 512)
    cfg = json.loads(_opt(args, "--cuda-graph-config")[0])
    assert cfg == {"decode": {"layerwise_full_max_bs": 512}} and _opt(args, "--cuda-graph-max-bs-decode") == ["1024"]
