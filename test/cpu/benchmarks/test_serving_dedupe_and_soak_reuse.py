"""bench_serving_matrix without a GPU: configurations whose flags resolve to the same ServerArgs
are measured once (the fact behind it checked on the installed upstream), the soak run on the
matrix's layerwise server, and the soak's progress file when a run is cut off."""
from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
import textwrap
from argparse import Namespace
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

import _gpu_sampler
import bench_serving_matrix as matrix
import soak
from test_bench_serving_matrix import _LocalSglang, _cell

SPEED = {"upstream_default": 9000.0, "upstream_bs256": 9100.0, "layerwise": 12000.0}


def _fake_matrix(monkeypatch, resolved):
    """Servers and bench_serving replaced; resolved(flags) stands in for resolve_server_args."""
    started = []
    monkeypatch.setattr(matrix.setup, "prepare_model", lambda d, layers: {"spec": {"layers": 48}, "bytes": 1, "dir": d})
    monkeypatch.setattr(matrix.setup, "kv_bytes_per_token", lambda d: 98304)
    monkeypatch.setattr(matrix.setup, "start_server", lambda name, *a, **k: started.append(name) or Namespace(
        port=1, url="http://127.0.0.1:1", ready_seconds=42.0, log_path="/dev/null", alive=lambda: True,
        stop=lambda: Namespace(clean=True, seconds=1.0)))
    monkeypatch.setattr(matrix.setup, "server_facts", lambda url: {"max_total_num_tokens": 10**6})
    monkeypatch.setattr(matrix.setup, "resolve_server_args", lambda model_dir, flags: resolved(flags))
    monkeypatch.setattr(matrix, "run_cell", lambda srv, md_, name, conc, a, wd, warmup=False, timeout=None:
                        {"wall_s": 1.0} if warmup else _cell(SPEED[name], conc))
    return started


def _same_for_upstream(flags):
    return {"graphs": "layerwise" if "layerwise" in flags else "full, max bs 256"}


def test_configurations_resolving_alike_start_one_server_and_say_so(tmp_path, monkeypatch):
    started = _fake_matrix(monkeypatch, _same_for_upstream)
    args = ["--tag", "d", "--results-dir", str(tmp_path), "--workdir", str(tmp_path / "w"), "--concurrency", "1", "1024"]
    assert matrix.main(args) == 0
    assert started == ["upstream_default", "layerwise"]
    doc = json.loads((tmp_path / "serving-d.json").read_text())
    alias, src = doc["runs"]["upstream_bs256"], doc["runs"]["upstream_default"]
    assert alias["same_server_as"] == "upstream_default" and alias["resolved_args_sha256"] == src["resolved_args_sha256"]
    assert "not started" in alias["server"]["note"] and "--cuda-graph-max-bs" in alias["server"]["flags"]
    for conc in ("1", "1024"):
        assert alias["cells"][conc]["measured_as"] == "upstream_default"
        assert alias["cells"][conc]["output_throughput"] == src["cells"][conc]["output_throughput"] == 9000.0
    t = doc["targets"]
    assert t["output_tps_c1024_layerwise_vs_upstream_bs256"]["value"] == t[
        "output_tps_c1024_layerwise_vs_upstream_default"]["value"] == round(12000 / 9000, 4)
    md_text = (tmp_path / "serving-d.md").read_text()
    assert "measured as upstream_default" in md_text and "not started" in md_text


@pytest.mark.parametrize("how", ["no-dedupe", "unresolvable", "different"])
def test_each_configuration_gets_its_own_server_unless_proven_identical(tmp_path, monkeypatch, how):
    def resolved(flags):
        if how == "unresolvable":
            raise RuntimeError("resolving server args failed (exit 1): boom")
        return {"flags": list(flags)}  # "different": every configuration differs
    started = _fake_matrix(monkeypatch, resolved)
    args = ["--tag", how, "--results-dir", str(tmp_path), "--workdir", str(tmp_path / "w"), "--concurrency", "1"]
    matrix.main(args + (["--no-dedupe"] if how == "no-dedupe" else []))
    assert started == ["upstream_default", "upstream_bs256", "layerwise"]
    doc = json.loads((tmp_path / f"serving-{how}.json").read_text())
    assert not any("same_server_as" in r for r in doc["runs"].values())
    assert doc["runs"]["upstream_bs256"]["cells"]["1"]["output_throughput"] == 9100.0


def test_then_soak_soaks_the_layerwise_server_after_its_cells(tmp_path, monkeypatch):
    local = _LocalSglang(context_len=2048)
    started = _fake_matrix(monkeypatch, _same_for_upstream)
    fake = Namespace(url=f"http://127.0.0.1:{local.port}", port=local.port, ready_seconds=1.0,
                     log_path=str(tmp_path / "log"), alive=lambda: True,
                     stop=lambda: Namespace(clean=True, seconds=0.1, killed=False))
    (tmp_path / "log").write_text("server log line\n")
    flags_seen = {}
    monkeypatch.setattr(matrix.setup, "start_server",
                        lambda name, model_dir, flags, *a, **k: started.append(name) or flags_seen.update({name: flags}) or fake)
    monkeypatch.setattr(matrix.setup, "prepare_model", lambda d, layers: {
        "spec": {"layers": 48, "max_position": 2048}, "tokenizer_vocab": 512, "dir": d, "bytes": 1})
    monkeypatch.setattr(matrix.setup, "server_facts", lambda url: {"max_req_input_len": 2047, "max_total_num_tokens": 10**6})
    monkeypatch.setattr(_gpu_sampler, "QUERY", ["/nonexistent/nvidia-smi"])
    monkeypatch.setattr(soak.time, "sleep", lambda s: None)
    with pytest.raises(SystemExit):  # the soak needs the layerwise configuration
        matrix.parse_args(["--then-soak", "1", "--configs", "upstream_default"])
    matrix.main(["--tag", "s", "--results-dir", str(tmp_path), "--workdir", str(tmp_path / "w"), "--concurrency", "1",
                 "--configs", "upstream_default", "layerwise", "--then-soak", "0.05", "--soak-warmup-minutes", "0.02", "--copy-to", str(tmp_path / "out")])
    assert started == ["upstream_default", "layerwise"]
    assert "--reject-unknown-model" in flags_seen["layerwise"] and "--reject-unknown-model" not in flags_seen["upstream_default"]
    sk = json.loads((tmp_path / "soak-s.json").read_text())
    assert "serving-s.json's layerwise server" in sk["server"]["shared_with"]
    assert sk["wellformed"]["sent"] > 0 and sk["wellformed"]["ok"] == sk["wellformed"]["sent"]
    assert sk["targets"]["server_crashes"]["met"] and "partial" not in sk
    assert {"soak-s.json", "serving-s.json"} <= {p.name for p in (tmp_path / "out").iterdir()}


def test_a_soak_cut_off_keeps_its_figures_and_meets_nothing(tmp_path):
    a = soak.parse_args(["--tag", "p", "--results-dir", str(tmp_path), "--copy-to", str(tmp_path / "out"), "--minutes", "10"])
    doc = soak.new_doc(a, {"spec": {}}, "layerwise", ["--x"])
    tally = soak.Tally()
    req = Namespace(kind="generate", malformed=False, prompt_len=5, max_tokens=3)
    tally.record(req, True, "", 0.5, 3)
    soak._save_progress(a, doc, tally, t0=0.0)
    saved = json.loads((tmp_path / "out" / "soak-p.json").read_text())
    assert saved["partial"]["wellformed"]["ok"] == 1 and saved["partial"]["of_s"] == 720  # 10 min + 2 of warm-up
    assert not any(t["met"] for t in saved["targets"].values())
    soak.finish(a, doc)  # the load never finished: no "soak" section
    final = json.loads((tmp_path / "soak-p.json").read_text())
    assert set(final["targets"]) == set(soak.TARGET_NAMES)
    assert all(t == {"value": None, "target": "soak did not finish", "met": False} for t in final["targets"].values())


# ------------------------------------------------------------------------------------------------
# the upstream facts the deduplication rests on (installed fork)
# ------------------------------------------------------------------------------------------------
def _require_sglang():
    try:
        md.version("sglang")
    except md.PackageNotFoundError:
        if os.environ.get("SGLANG_SM120_REQUIRE_INSTALLED") != "1":
            pytest.skip("no sglang installed in this interpreter")
        raise
    # The matrix runs on the GPU host, so these upstream facts are those of its base (0.5.23
    # resolves ServerArgs in arg_groups/ and sizes graphs elsewhere).
    from buildenv import gpu_verified_base, load_pin

    if load_pin().version != gpu_verified_base():
        pytest.skip(f"upstream facts of the GPU host's base {gpu_verified_base()}, not {load_pin().version}")


def test_input_only_fields_are_read_nowhere_but_server_args():
    _require_sglang()
    import sglang

    root = Path(sglang.__file__).parent
    readers = [str(p.relative_to(root)) for p in [*(root / "srt").rglob("*.py"), *(root / "sm120").rglob("*.py")]
               if p.name != "server_args.py"
               and any(f in p.read_text(errors="replace") for f in matrix.setup.INPUT_ONLY_FIELDS)]
    assert readers == []


H200_MIB = 143771  # what torch reports for an H200's memory; decides upstream's graph defaults
_RESOLVE_ON_H200 = textwrap.dedent(
    """
    import dataclasses, json, sys
    from unittest import mock
    import sglang.srt.server_args as sa
    def resolve(flags):
        with mock.patch.object(sa, "get_device_memory_capacity", lambda *a, **k: float(sys.argv[2])):
            args = sa.prepare_server_args(["--model-path", sys.argv[1], "--device", "cuda", *flags])
        return json.loads(json.dumps(dataclasses.asdict(args), default=repr, sort_keys=True))
    print("RESULT " + json.dumps({name: resolve(json.loads(f)) for name, f in zip(sys.argv[3::2], sys.argv[4::2])}))
    """)


def test_upstream_default_and_max_bs_256_resolve_alike_on_an_h200_and_layerwise_does_not(tmp_path):
    _require_sglang()
    from sglang.sm120.model_shapes import QWEN3_30B_A3B_CONFIG

    (tmp_path / "config.json").write_text(json.dumps(QWEN3_30B_A3B_CONFIG))
    configs = []
    for name in ("upstream_default", "upstream_bs256", "layerwise"):
        configs += [name, json.dumps(matrix.setup.common_flags(0.8) + matrix.setup.CONFIGS[name])]
    proc = subprocess.run([sys.executable, "-c", _RESOLVE_ON_H200, str(tmp_path), str(H200_MIB), *configs],
                          env=dict(os.environ, CUDA_VISIBLE_DEVICES=""), capture_output=True, text=True, timeout=600)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, proc.stderr[-3000:]
    r = json.loads(line[len("RESULT "):])
    drop = set(matrix.setup.INPUT_ONLY_FIELDS)
    strip = {n: {k: v for k, v in d.items() if k not in drop} for n, d in r.items()}
    assert r["upstream_default"] != r["upstream_bs256"]  # the flag is seen...
    assert strip["upstream_default"] == strip["upstream_bs256"]  # ...and changes nothing else
    assert strip["upstream_default"]["cuda_graph_config"]["decode"]["max_bs"] == 256
    assert strip["layerwise"]["cuda_graph_config"] != strip["upstream_default"]["cuda_graph_config"]


def test_merging_clients_recomputes_throughput_over_the_longest_and_percentiles_over_all():
    import _serving_client as client

    def rec(duration, ttfts, itls, errors):
        n_ok = sum(1 for e in errors if not e)
        return {"completed": n_ok, "duration": duration, "total_input_tokens": 100 * n_ok,
                "total_output_tokens": 10 * n_ok, "max_concurrency": 2, "output_throughput": 10 * n_ok / duration,
                "ttfts": ttfts, "itls": itls, "errors": errors}

    a = rec(10.0, [0.1, 0.3], [[0.01, 0.02], [0.03]], ["", ""])
    b = rec(8.0, [0.2, 9.9], [[0.04], [5.0]], ["", "boom"])  # the failed request's timings are left out
    m = client.merge_records([a, b])
    assert m["completed"] == 3 and m["duration"] == 10.0 and m["output_throughput"] == 30 / 10.0
    assert m["total_throughput"] == (300 + 30) / 10.0 and m["max_concurrency"] == 4
    assert m["median_ttft_ms"] == pytest.approx(200.0) and m["p99_ttft_ms"] < 300.0 + 1e-9
    assert m["median_itl_ms"] == pytest.approx(25.0) and m["mean_itl_ms"] == pytest.approx(25.0)
    assert [c["completed"] for c in m["clients"]] == [2, 1]
    assert client.merge_records([a]) is a  # one client: upstream's own record, untouched
    assert client.split(10, 20, 4) == [(3, 5), (3, 5), (2, 5), (2, 5)] and client.split(1, 8, 4) == [(1, 8)]


def test_client_ceiling_reads_a_synthetic_decode_loop_with_upstreams_client(tmp_path):
    """A small real run: upstream's client against the synthetic server; it keeps up with a slow
    offered rate, so its TPOT is about the step and its tok/s about the offered rate."""
    _require_sglang()
    import client_ceiling

    r = client_ceiling.measure(concurrency=8, step_ms=20.0, output_len=16, waves=1, workdir=tmp_path, timeout=240)
    assert r["prompts"] == 8 and r["offered_tok_s"] == 400.0
    assert 0.5 * r["offered_tok_s"] < r["client_output_tok_s"] <= 1.05 * r["offered_tok_s"]
    assert r["client_mean_tpot_ms"] >= 19.0
    t = client_ceiling.targets(r, needed=None)
    assert t["client_keeps_up_with_offered"]["value"] == r["client_vs_offered"]
    assert t["client_carries_the_c1024_serving_target"] == {
        "value": None, "target": "1.15 x upstream at concurrency 1024 (no figure in serving-h200.json.gz)",
        "met": False}  # no serving run to compare with: never met
    assert client_ceiling.needed_tok_s(client_ceiling.SERVING_RUN) == round(1.15 * 8131.9661, 1)
