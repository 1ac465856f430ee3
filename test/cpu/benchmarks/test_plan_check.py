"""plan_check's bookkeeping without a GPU: a model whose plan and server log agree meets its
targets, one whose sizes or graph memory differ does not, and a server that never came up is a
missed target, not a silent pass."""
import json

import pytest
import repo_scripts


@pytest.fixture(scope="module")
def check():
    return repo_scripts.load("benchmarks/plan_check.py")


def _verdict(sizes_ok, ratio):
    return {"sizes": [{"what": "decode full graphs (max, count)", "ok": sizes_ok}],
            "graph_memory": [{"phase": "decode", "ratio": ratio, "ok": abs(ratio - 1) <= 0.25}]}


def test_targets_follow_each_models_verdict(check, tmp_path, monkeypatch):
    rows = {"good": {"model": "good", "verdict": _verdict(True, 1.1)},
            "sizes-off": {"model": "sizes-off", "verdict": _verdict(False, 1.0)},
            "memory-off": {"model": "memory-off", "verdict": _verdict(True, 1.9)},
            "no-server": {"model": "no-server", "error": "server exited with code 1"}}
    monkeypatch.setattr(check, "check_one", lambda name, *a: dict(rows[name]))
    rc = check.main(["--out", str(tmp_path), "--models", *rows])
    doc = json.loads((tmp_path / "plan-check.json").read_text())
    met = {k: v["met"] for k, v in doc["targets"].items()}
    assert met == {"good_sizes_agree": True, "good_decode_graph_memory_ratio": True,
                   "sizes-off_sizes_agree": False, "sizes-off_decode_graph_memory_ratio": True,
                   "memory-off_sizes_agree": True, "memory-off_decode_graph_memory_ratio": False,
                   "no-server_sizes_agree": False}
    assert rc == 1


def test_the_qwen3_shape_model_is_written_with_its_config(check, tmp_path):
    path = check.model_path("qwen3-30b-a3b", tmp_path, tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 48 and cfg["num_experts"] == 128


def test_each_row_records_what_the_memory_fit_scales_by(check, tmp_path):
    path = check.model_path("qwen3-30b-a3b", tmp_path, tmp_path)
    assert check.model_dims(path) == {"num_hidden_layers": 48, "hidden_size": 2048}
