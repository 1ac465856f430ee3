"""bench_serving_parity without a GPU: the alternating round order, the measurement loop (warm-up,
then rounds, which configuration first), medians and ratios, targets only at full-graph sizes,
a model that failed, the report and the arguments."""
import pytest
import repo_scripts


@pytest.fixture(scope="module")
def bench():
    return repo_scripts.load("benchmarks/bench_serving_parity.py")


def test_rounds_alternate_which_configuration_goes_first(bench):
    assert bench.round_order(3) == [["upstream", "layerwise"], ["layerwise", "upstream"], ["upstream", "layerwise"]]


def test_the_loop_warms_each_server_then_measures_the_rounds_in_that_order(bench):
    calls = []

    def measure(cfg, conc, r, warmup):
        calls.append((cfg, conc, r, warmup))
        return 100.0 + r if cfg == "upstream" else 97.0 + r

    cells = bench.run_rounds([64, 256], 2, measure)
    assert calls[:6] == [("upstream", 64, -1, True), ("layerwise", 64, -1, True),
                         ("upstream", 64, 0, False), ("layerwise", 64, 0, False),
                         ("layerwise", 64, 1, False), ("upstream", 64, 1, False)]
    assert len(calls) == 12 and cells["256"] == {"upstream": [100.0, 101.0], "layerwise": [97.0, 98.0]}


def test_medians_ratio_and_targets_only_where_layerwise_replays_full_graphs(bench):
    cells = {"64": {"upstream": [100.0, 90.0, 110.0], "layerwise": [99.0, 98.0, None]},
             "512": {"upstream": [50.0], "layerwise": [60.0]}}
    s = bench.summarize(cells, full_ceiling=256)
    assert s["64"]["upstream"]["median"] == 100.0 and s["64"]["layerwise"]["median"] == 98.5
    assert s["64"]["ratio"] == 0.985 and s["64"]["on_full_graphs"] and not s["512"]["on_full_graphs"]
    assert s["64"]["upstream"]["spread"] == round(110 / 90, 4)
    t = bench.compute_targets({"m": {"summary": s}, "broken": {"error": "ServerError: no /health"}})
    assert set(t) == {"m_c64_layerwise_vs_upstream", "broken_layerwise_vs_upstream"}
    assert t["m_c64_layerwise_vs_upstream"]["met"] and t["m_c64_layerwise_vs_upstream"]["value"] == 0.985
    assert not t["broken_layerwise_vs_upstream"]["met"] and "no /health" in t["broken_layerwise_vs_upstream"]["why_missing"]
    slow = bench.summarize({"64": {"upstream": [100.0], "layerwise": [96.0]}}, full_ceiling=256)
    assert not bench.compute_targets({"m": {"summary": slow}})["m_c64_layerwise_vs_upstream"]["met"]
    none = bench.summarize({"64": {"upstream": [100.0], "layerwise": [None]}}, full_ceiling=None)
    assert none["64"]["ratio"] is None and not none["64"]["on_full_graphs"]


def test_report_and_arguments(bench):
    s = bench.summarize({"64": {"upstream": [100.0], "layerwise": [99.0]}}, full_ceiling=256)
    doc = {"gpu": "NVIDIA H200", "commit": "abc", "date": "d", "rounds": 1, "input_len": 256, "output_len": 256,
           "models": {"m": {"summary": s}, "broken": {"error": "ServerError: boom"}}}
    md = bench.render_md(doc)
    assert "| m | 64 | yes | 100.0 |" in md and "| broken | - | - | ServerError: boom" in md
    a = bench.parse_args([])
    assert a.rounds == 5 and a.concurrency == [64, 256] and a.models == bench.DEFAULT_MODELS
    assert bench.max_total_tokens([64, 256], 256, 256) == 2 * 256 * 512
    with pytest.raises(SystemExit):
        bench.parse_args(["--rounds", "0"])


def test_a_measurement_is_one_bench_serving_matrix_cell(bench, monkeypatch, tmp_path):
    seen = {}

    def cell(srv, model_dir, served, conc, a, workdir, warmup=False):
        seen.update(served=served, conc=conc, prompts=max(8, a.waves * conc), procs=a.client_procs,
                    stream=a.stream, warmup=warmup)
        return {"output_throughput": 123.0, "complete": True} if conc == 64 else {"error": "exit 1"}

    monkeypatch.setattr(bench.matrix, "run_cell", cell)
    a = bench.parse_args([])
    assert bench.measure_once(None, "/m", "m-layerwise", 64, tmp_path, a) == 123.0
    assert seen == {"served": "m-layerwise", "conc": 64, "prompts": 128, "procs": 1, "stream": True, "warmup": False}
    assert bench.measure_once(None, "/m", "m-upstream", 256, tmp_path, a, warmup=True) is None and seen["warmup"]
