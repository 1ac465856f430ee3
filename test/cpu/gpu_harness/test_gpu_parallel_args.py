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


# SGLANG_SM120_GPU_MOE_BACKEND: the grid on the fork's MoE kernel (issue 42 item 5)
def _grid(monkeypatch, backend):
    if backend is None:
        monkeypatch.delenv("SGLANG_SM120_GPU_MOE_BACKEND", raising=False)
    else:
        monkeypatch.setenv("SGLANG_SM120_GPU_MOE_BACKEND", backend)
    for name in ("tinymodels", "test_layerwise_correctness"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return importlib.import_module("test_layerwise_correctness")


def test_moe_backend_knob_runs_the_nvfp4_models_on_sm120_and_names_their_results(monkeypatch):
    plain = _grid(monkeypatch, None)
    assert plain.MOE_SUFFIX == "" and {q for _, q in plain.MODELS} == {"bf16", "nvfp4"}
    sm120 = _grid(monkeypatch, "sm120")
    assert sm120.MOE_SUFFIX == "-moe-sm120" and sm120.MODELS == [m for m in plain.MODELS if m[1] == "nvfp4"]
    src = Path(GPU_TESTS, "test_layerwise_correctness.py").read_text()
    assert '**({"moe_runner_backend": MOE_BACKEND} if MOE_BACKEND else {})' in src
    assert '+ MOE_SUFFIX + PARALLEL_SUFFIX' in src
    from sglang.srt.server_args import ServerArgs  # the value the engines get parses upstream's way

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    assert parser.parse_args(["--model-path", "/m", "--moe-runner-backend", "sm120"]).moe_runner_backend == "sm120"
    monkeypatch.delitem(sys.modules, "test_layerwise_correctness", raising=False)


def test_moe_backend_knob_refuses_an_unknown_backend(monkeypatch):
    with pytest.raises(ValueError, match="SGLANG_SM120_GPU_MOE_BACKEND='marlni'.*sm120"):
        _grid(monkeypatch, "marlni")
    monkeypatch.delitem(sys.modules, "tinymodels", raising=False)


def test_moe_backend_problems_finds_the_fallback_and_refusal_lines_only_under_the_knob(monkeypatch):
    log = "\n".join([
        "INFO sm120 NVFP4 MoE self-check passed on this GPU: grouped MoE E=8",
        "ERROR sm120 NVFP4 MoE self-check FAILED: grouped MoE E=8 tokens=1 -- this process uses upstream's",
        "WARNING --moe-runner-backend sm120: layer 3 (E=8 H=64 I=32) is not served by the grouped kernel: x",
    ])
    assert _grid(monkeypatch, None).moe_backend_problems(log) == []
    found = _grid(monkeypatch, "sm120").moe_backend_problems(log)
    assert [ln.split()[0] for ln in found] == ["ERROR", "WARNING"]
    assert _grid(monkeypatch, "sm120").moe_backend_problems(log.splitlines()[0]) == []
    monkeypatch.delitem(sys.modules, "test_layerwise_correctness", raising=False)
