"""bench_runner's bookkeeping without a GPU: merging the halves run on two GPUs and the targets."""
import json

import pytest
import repo_scripts

pytestmark = pytest.mark.base_independent


@pytest.fixture(scope="module")
def bench():
    return repo_scripts.load("benchmarks/bench_runner.py")


def _run(decode_ms, prefill_ms, capture, host_us=()):
    return {
        "command": "x", "decode_s": {str(b): v / 1e3 for b, v in decode_ms.items()},
        "prefill_s": {str(t): v / 1e3 for t, v in prefill_ms.items()},
        "capture_totals": capture,
        "host_step": {"decode": [{"size": s, "step_host_us": u} for s, u in host_us]},
    }


def _cap(ps, pg, ds, dg):
    return {"prefill": {"capture_s": ps, "graph_mem_gb": pg}, "decode": {"capture_s": ds, "graph_mem_gb": dg}}


def test_merge_two_halves_and_compute_targets(bench, tmp_path):
    a = {"commit": "abc", "tp_size": 1, "device": "H200", "runs": {
        "disabled": _run({512: 60.0, 1024: 70.0}, {1024: 75.0, 4096: 100.0}, _cap(0, 0, 0, 0)),
        "upstream": _run({64: 20.0, 256: 23.0, 512: 58.0}, {1024: 27.6, 4096: 60.6}, _cap(4.0, 0.7, 20.0, 0.7)),
    }}
    b = {"commit": "abc", "tp_size": 1, "device": "H200", "runs": {
        "layerwise": _run({512: 30.0, 1024: 50.0}, {1024: 27.0, 4096: 61.0}, _cap(1.0, 0.3, 9.0, 0.5),
                          host_us=[(512, 80.0), (1024, 120.0)]),
        "layerwise_every_size": _run({64: 21.0, 256: 26.0}, {}, _cap(1.0, 0.3, 5.0, 0.3)),
    }}
    (tmp_path / "runner-a.json").write_text(json.dumps(a))
    (tmp_path / "runner-b.json").write_text(json.dumps(b))
    bench.main(["--tag", "m", "--merge", "a", "b", "--results-dir", str(tmp_path)])
    doc = json.loads((tmp_path / "runner-m.json").read_text())
    assert set(doc["runs"]) == {"disabled", "upstream", "layerwise", "layerwise_every_size"}
    t = doc["targets"]
    assert t["decode_speedup_vs_eager_bs512"] == {"value": 2.0, "target": ">= 1.6", "met": True}
    assert t["decode_speedup_vs_eager_bs1024"]["value"] == 1.4 and not t["decode_speedup_vs_eager_bs1024"]["met"]
    assert t["eager_moe_host_us_per_layer_bs512_1024"]["value"] == 120.0
    assert t["every_size_vs_full_graph_bs64"]["met"] and not t["every_size_vs_full_graph_bs256"]["met"]
    assert t["prefill_vs_breakable_4096"]["met"] is False and t["prefill_vs_breakable_1024"]["met"]
    assert t["prefill_capture_time_vs_breakable"]["value"] == 0.25
    md = (tmp_path / "runner-m.md").read_text()
    assert "commit abc" in md and "| prefill_vs_breakable_4096 |" in md and "NO" in md


def test_merge_of_a_missing_tag_is_refused(bench, tmp_path):
    with pytest.raises(SystemExit, match="does not exist"):
        bench.main(["--tag", "m", "--merge", "nope", "--results-dir", str(tmp_path)])


def test_a_failed_configuration_keeps_the_others_and_is_reported(bench, tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "write_model_dir", lambda path, config: path)
    monkeypatch.setattr(bench, "device_name", lambda: "H200")

    def fake_run(model, name, extra, workdir, timeout, tp=1, ep=1):
        if name == "disabled":
            raise SystemExit("disabled: one_batch still running after 5 s; log: x.log\nlog tail")
        return _run({64: 20.0}, {1024: 27.6}, _cap(4.0, 0.7, 20.0, 0.7))

    monkeypatch.setattr(bench, "run_one_batch", fake_run)
    with pytest.raises(SystemExit, match=r"failed configurations: \['disabled'\]"):
        bench.main(["--tag", "p", "--configs", "disabled", "upstream", "--results-dir", str(tmp_path),
                    "--workdir", str(tmp_path / "w")])
    doc = json.loads((tmp_path / "runner-p.json").read_text())
    assert set(doc["runs"]) == {"upstream"}
    assert doc["failed"] == {"disabled": "disabled: one_batch still running after 5 s; log: x.log"}
    assert "Not measured: `disabled`" in (tmp_path / "runner-p.md").read_text()
    # a later merge with a run that measured it clears the failure
    (tmp_path / "runner-q.json").write_text(json.dumps({"runs": {"disabled": _run({64: 30.0}, {}, _cap(0, 0, 0, 0))}}))
    bench.main(["--tag", "pq", "--merge", "p", "q", "--results-dir", str(tmp_path)])
    merged = json.loads((tmp_path / "runner-pq.json").read_text())
    assert set(merged["runs"]) == {"upstream", "disabled"} and merged["failed"] == {}


def test_graph_memory_target_compares_the_same_sizes(bench):
    up = _run({64: 20.0}, {}, _cap(3.0, 0.7, 17.5, 0.62))
    every = _run({64: 21.0}, {}, _cap(3.7, 2.8, 15.1, 1.98))
    t = bench.compute_targets({"upstream": up, "layerwise_every_size": every})
    entry = t["decode_graph_mem_layerwise_vs_full_same_sizes"]
    assert not entry["met"] and "not the same sizes" in entry["note"]
    same = _run({64: 21.0}, {}, _cap(0, 0, 5.0, 0.25))
    t = bench.compute_targets({"upstream": up, "layerwise_every_size": every, "layerwise_every_size_256": same})
    entry = t["decode_graph_mem_layerwise_vs_full_same_sizes"]
    assert {k: entry[k] for k in ("value", "target", "met")} == {"value": 0.4032, "target": "<= 0.5", "met": True}
    assert "warm-up" in entry["measure"] and "note" not in entry


def _size_memory(kinds, per_size_gb, output_gb=None):
    """A capture report's per-size readings: each size takes per_size_gb (pool, outside) GB; with
    output_gb, each size's output holds that many GB (without it, a report that predates that reading)."""
    g = 2**30
    out = {str(size): {"kind": kind, "allocated": 0, "reserved": int(per_size_gb[0] * g), "pool": int(per_size_gb[0] * g),
                       "outside": int(per_size_gb[1] * g)} for size, kind in kinds.items()}
    if output_gb is not None:
        for v in out.values():
            v["output_bytes"] = int(output_gb * g)
    return out


def test_per_size_graph_memory_compares_layerwise_sizes_with_the_same_full_sizes(bench):
    up = _run({64: 20.0}, {}, _cap(3.0, 0.7, 17.5, 0.62))
    lw = _run({}, {}, _cap(3.0, 0.7, 17.5, 1.0))
    lw["capture"] = {"layerwise": {"decode": {"size_memory": _size_memory(
        {1: "full", 2: "full", 4: "full", 512: "layerwise"}, (0.01, 0.1))}}}
    same = _run({64: 21.0}, {}, _cap(0, 0, 5.0, 0.25))
    same["capture"] = {"layerwise": {"decode": {"size_memory": _size_memory(
        {1: "layerwise", 2: "layerwise", 4: "layerwise"}, (0.002, 0.02))}}}
    t = bench.compute_targets({"upstream": up, "layerwise": lw, "layerwise_every_size_256": same})
    entry = t["decode_graph_mem_per_size_layerwise_vs_full"]
    assert entry["value"] == 0.2 and entry["met"] and "3 sizes" in entry["measure"]
    assert bench.size_memory_totals(lw, "decode", "layerwise")["sizes"] == [512]
    lines = bench.size_memory_lines({"layerwise": lw}, ["layerwise"])
    assert "| layerwise | decode | full | 3 | 0.000 | 0.030 | 0.030 | 0.300 | 0.330 | - | - | - |" in lines  # no kept or output readings
    # layerwise's own sizes against full graphs at those sizes (full_graphs_1024)
    full1024 = _run({}, {}, _cap(0, 0, 20.0, 0.5))
    full1024["capture"] = {"layerwise": {"decode": {"size_memory": _size_memory(
        {1: "full", 2: "full", 4: "full", 512: "full"}, (0.05, 0.05))}}}
    t = bench.compute_targets({"layerwise": lw, "full_graphs_1024": full1024})
    entry = t["decode_graph_mem_layerwise_sizes_vs_full_1024"]
    assert entry["value"] == 1.1 and not entry["met"] and "1 layerwise sizes (512-512)" in entry["measure"]
    # sizes that do not match (a size dropped in one run): no per-size figure rather than a skewed one
    del same["capture"]["layerwise"]["decode"]["size_memory"]["4"]
    assert "decode_graph_mem_per_size_layerwise_vs_full" not in bench.compute_targets(
        {"upstream": up, "layerwise": lw, "layerwise_every_size_256": same})


def test_rows_of_several_passes_give_medians_and_keep_samples(bench):
    rows = []
    for p, (dec, pre) in enumerate([(0.070, 1.358), (0.060, 0.030), (0.062, 0.029)]):  # pass 1: first use
        rows.append({"batch_size": 8, "median_decode_latency": dec, "prefill_latency": pre})
        rows.append({"batch_size": 1024, "median_decode_latency": 0.1 + p, "prefill_latency": 3.0})
    decode, prefill, samples = bench.summarize_rows(rows)
    assert decode["8"] == 0.062 and decode["1024"] == 1.1
    assert prefill["1024"] == 0.030 and prefill["128"] is None  # bs 1 not measured
    assert samples["prefill_s"]["1024"] == [1.358, 0.030, 0.029] and "64" not in samples["decode_s"]


def test_lean_configuration_sets_its_env_and_has_a_host_time_target(bench, tmp_path, monkeypatch):
    seen = {}

    def fake_subprocess_run(cmd, env=None, **kw):
        seen.update(env)
        raise bench.subprocess.TimeoutExpired(cmd, 1)

    monkeypatch.setattr(bench.subprocess, "run", fake_subprocess_run)
    with pytest.raises(SystemExit):
        bench.run_one_batch(tmp_path, "layerwise_every_size", bench.CONFIGS["layerwise_every_size"], tmp_path, 1)
    assert seen["SGLANG_SM120_LEAN_MOE"] == "1" and seen["SGLANG_SM120_LAYERWISE_TIMING"] == "1"
    every = {"host_step": {"decode": [{"size": 1, "step_host_us": 80.0}, {"size": 1024, "step_host_us": 120.0}]}}
    up_moe = {"host_step": {"decode": [{"size": 512, "step_host_us": 400.0}]}}
    t = bench.compute_targets({"layerwise_every_size": every, "layerwise_upstream_moe": up_moe})
    assert t["eager_moe_host_us_per_layer_all_sizes"] == {"value": 120.0, "target": "<= 100", "met": False}
    assert t["upstream_moe_host_us_per_layer_bs512_1024"]["value"] == 400.0


def test_upstream_moe_prefill_configuration_is_judged_against_breakable(bench):
    assert bench.CONFIG_ENV["layerwise_upstream_moe"] == {"SGLANG_SM120_LEAN_MOE": "0",
                                                           "SGLANG_SM120_LAYERWISE_PREFILL_ATTENTION": "eager",
                                                           "SGLANG_SM120_LAYERWISE_DECODE_ATTENTION": "eager"}
    assert bench.CONFIGS["layerwise_upstream_moe"] == bench.CONFIGS["layerwise"]  # same sizes, other MoE path
    up = _run({}, {1024: 28.0, 4096: 60.0}, _cap(3.0, 0.6, 20.0, 0.7))
    other = _run({}, {1024: 27.0, 4096: 63.0}, _cap(3.5, 0.6, 9.0, 0.5))
    t = bench.compute_targets({"upstream": up, "layerwise_upstream_moe": other})
    assert t["prefill_upstream_moe_vs_breakable_1024"] == {"value": round(27.0 / 28.0, 4), "target": "<= 1.0", "met": True}
    assert t["prefill_upstream_moe_vs_breakable_4096"]["met"] is False
    assert "prefill_vs_breakable_1024" not in t  # layerwise itself did not run


def test_capture_time_by_step_in_the_md(bench):
    rep = {"prefill": {"size_timings": {"128": {"warm_s": 0.1, "probe_s": 0.05, "capture_s": 0.2},
                                        "4096": {"warm_s": 0.3, "probe_s": 0.1, "capture_s": 0.4,
                                                 "warm_gap_s": 0.25, "capture_gap_s": 0.5}}},
           "decode": {"size_timings": {"1": {"warm_s": 0.01}, "512": {"warm_s": 0.02, "probe_s": 0.01, "capture_s": 0.03}}}}
    runs = {"layerwise": {"capture": {"layerwise": rep}}, "upstream": {"capture": {"layerwise": {}}}}
    lines = bench.capture_time_lines(runs, ["upstream", "layerwise"])
    assert "| layerwise | prefill | 4096 | 0.300 | 0.100 | 0.400 | 0.250 | 0.500 |" in lines
    assert "| layerwise | prefill | 128 | 0.100 | 0.050 | 0.200 | 0.000 | 0.000 |" in lines
    assert "| layerwise | decode | 2 sizes | 0.030 | 0.010 | 0.030 | 0.000 | 0.000 |" in lines
    assert not any("| upstream |" in line for line in lines)
    assert bench.capture_time_lines({"upstream": {"capture": {}}}, ["upstream"]) == []


def test_every_layerwise_configuration_names_its_moe_path(bench):
    for name in bench.CONFIGS:
        if name.startswith("layerwise"):
            want = "0" if name.endswith("_upstream_moe") else "1"
            assert bench.CONFIG_ENV[name]["SGLANG_SM120_LEAN_MOE"] == want, name
            want = {"layerwise_fa2_prefill": "fa2", "layerwise_captured_prefill": "auto"}.get(name, "eager")
            assert bench.CONFIG_ENV[name]["SGLANG_SM120_LAYERWISE_PREFILL_ATTENTION"] == want, name
            want = "captured" if name == "layerwise_captured_decode_attention" else "eager"
            assert bench.CONFIG_ENV[name]["SGLANG_SM120_LAYERWISE_DECODE_ATTENTION"] == want, name
    assert bench.CONFIG_ENV["layerwise_fa2_prefill"]["SGLANG_SM120_LEAN_MOE"] == "1"
    assert bench.CONFIGS["layerwise_fa2_prefill"] == bench.CONFIGS["layerwise"]
    assert "disabled" not in bench.CONFIG_ENV and "upstream" not in bench.CONFIG_ENV
    # a plain run measures the product's default and upstream's; the upstream-MoE ones on request
    assert bench.DEFAULT_CONFIGS == ["disabled", "upstream", "layerwise", "layerwise_every_size",
                                     "layerwise_every_size_256", "full_graphs_1024"]
    cfg = bench.CONFIGS["full_graphs_1024"]
    assert json.loads(cfg[cfg.index("--cuda-graph-config") + 1]) == {
        "decode": {"backend": "layerwise", "layerwise_full_max_bs": 1024}, "prefill": {"backend": "disabled"}}


def test_every_size_is_judged_against_full_graphs_on_both_moe_paths(bench):
    up = _run({64: 18.6, 256: 22.6}, {}, _cap(2.0, 0.7, 14.0, 0.6))
    every = _run({64: 19.2, 256: 25.0}, {}, _cap(0, 0, 17.0, 2.6))
    up_moe = _run({64: 20.9, 256: 23.1}, {}, _cap(0, 0, 16.0, 2.0))
    t = bench.compute_targets({"upstream": up, "layerwise_every_size": every,
                               "layerwise_every_size_upstream_moe": up_moe})
    assert t["every_size_vs_full_graph_bs64"] == {"value": round(19.2 / 18.6, 4), "target": "<= 1.10", "met": True}
    assert t["every_size_vs_full_graph_bs256"]["met"] is False
    assert t["every_size_upstream_moe_vs_full_graph_bs64"]["met"] is False


def test_capture_memory_table_splits_the_allocator_from_the_graphs(bench):
    run = _run({}, {}, _cap(0, 0, 7.0, 1.3))
    run["capture"] = {"layerwise": {"decode": {"mem_bytes": 3 << 30, "allocator_bytes": 1 << 30,
                                               "outside_allocator_bytes": 2 << 30, "graphs": 1024}}}
    lines = bench.capture_memory_lines({"layerwise_every_size_256": run}, ["layerwise_every_size_256"])
    assert lines[-1] == "| layerwise_every_size_256 | decode | 3.000 | 1.000 | 2.000 | 1024 | 2.00 |"
    assert bench.capture_memory_lines({"x": _run({}, {}, _cap(0, 0, 0, 0))}, ["x"]) == []  # older reports


def test_host_time_table_has_wall_and_cpu_per_size(bench):
    run = {"host_step": {"decode": [{"size": 1024, "step_host_us": 110.2, "step_cpu_us": 61.0, "replays": 21,
                                     "attention_step_host_us": 40.5},
                                    {"size": 512, "step_host_us": 103.0, "replays": 21}]}}
    lines = bench.host_time_lines({"layerwise": run}, ["layerwise"])
    assert lines[-2:] == ["| layerwise | decode | 512 | 103.0 | - | - | 21 |",  # older report: no CPU, captured attention
                          "| layerwise | decode | 1024 | 110.2 | 61.0 | 40.5 | 21 |"]
    assert bench.host_time_lines({"upstream": {"host_step": {}}}, ["upstream"]) == []


def test_graph_memory_table_shows_where_the_largest_sizes_logits_live(bench):
    """The largest size's output (the logits) is read per size and shown beside the graph memory;
    it is upstream's shared logits buffer, outside the pool, so no figure subtracts it."""
    lw = _run({}, {}, _cap(3.0, 0.7, 17.5, 1.0))
    lw["capture"] = {"layerwise": {"decode": {"size_memory": _size_memory(
        {512: "layerwise", 1024: "layerwise"}, (0.2, 0.06), output_gb=0.58)}}}
    full = _run({}, {}, _cap(0, 0, 20.0, 0.5))
    full["capture"] = {"layerwise": {"decode": {"size_memory": _size_memory(
        {512: "full", 1024: "full"}, (0.2, 0.02), output_gb=0.58)}}}
    t = bench.compute_targets({"layerwise": lw, "full_graphs_1024": full})
    entry = t["decode_graph_mem_layerwise_sizes_vs_full_1024"]
    assert entry["value"] == round(0.52 / 0.44, 4) and not entry["met"] and "without" not in str(entry)
    assert bench.size_memory_totals(lw, "decode", "layerwise")["largest_size_output_gb"] == 0.58
    lines = bench.size_memory_lines({"layerwise": lw}, ["layerwise"])
    assert "| layerwise | decode | layerwise | 2 | 0.000 | 0.400 | 0.400 | 0.120 | 0.520 | 0.580 | - | - |" in lines
    assert any("shared logits buffer, outside the graph pool" in line for line in lines)
