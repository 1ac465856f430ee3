"""Tensor/expert parallelism of the layerwise GPU tests and the runner benchmark (for a 2-GPU host):
SGLANG_SM120_TP / SGLANG_SM120_EP reach the engines and the trap server, an expert-parallel size
sglang would refuse (anything but 1 or the TP size) is refused before a GPU is touched, and the
flags parse under the installed sglang."""
import argparse
import importlib
import sys
from pathlib import Path

import pytest

GPU_TESTS = str(Path(__file__).resolve().parents[2] / "gpu")


def _tinymodels(monkeypatch, tp, ep):
    """test/gpu/tinymodels (on pytest.ini's pythonpath) imported afresh under these sizes."""
    for name, value in (("SGLANG_SM120_TP", tp), ("SGLANG_SM120_EP", ep)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, str(value))
    monkeypatch.delitem(sys.modules, "tinymodels", raising=False)
    return importlib.import_module("tinymodels")


@pytest.mark.parametrize("tp,ep,suffix", [(None, None, ""), (2, None, "-tp2"), (2, 2, "-tp2-ep2")])
def test_sizes_and_result_names(monkeypatch, tp, ep, suffix):
    tm = _tinymodels(monkeypatch, tp, ep)
    assert (tm.TP, tm.EP, tm.PARALLEL_SUFFIX) == (tp or 1, ep or 1, suffix)


@pytest.mark.parametrize("tp,ep", [(None, 2), (4, 2)])
def test_an_expert_parallel_size_other_than_1_or_tp_is_refused(monkeypatch, tp, ep):
    with pytest.raises(ValueError, match="SGLANG_SM120_EP"):
        _tinymodels(monkeypatch, tp, ep)


def test_the_engines_and_the_trap_server_take_both_sizes():
    """The grid's engines and the trap server pass TP and EP on (read from the test sources, which
    need a GPU to run)."""
    grid = Path(GPU_TESTS, "test_layerwise_correctness.py").read_text()
    traps = Path(GPU_TESTS, "test_layerwise_traps.py").read_text()
    assert "tp_size=TP," in grid and "ep_size=EP," in grid
    assert '"--tp-size", str(TP), "--ep-size", str(EP)' in traps


def test_runner_benchmark_passes_ep_and_refuses_a_bad_one():
    from repo_scripts import load

    bench = load("benchmarks/bench_runner.py")
    cmd = bench.one_batch_cmd(Path("/m"), "layerwise", [1, 8], Path("/x.jsonl"), 2, ["--flag"], 2)
    assert cmd[cmd.index("--tp-size") + 1] == "2" and cmd[cmd.index("--ep-size") + 1] == "2"
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(["--model-path", "/m", "--tp-size", "2", "--ep-size", "2"])
    assert (ns.tp_size, ns.ep_size) == (2, 2)
    with pytest.raises(SystemExit):
        bench.main(["--tag", "x", "--tp", "1", "--ep", "2"])
