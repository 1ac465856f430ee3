"""The Dynamo / subprocess traps (sglang.sm120.traps) on CPU torch."""
from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch

from sglang.sm120 import traps


@pytest.fixture(autouse=True)
def _disarmed():
    traps.disarm()
    traps.clear_violations()
    yield
    traps.disarm()
    traps.clear_violations()


def _double(x):
    return x * 2 + 1


def test_compiled_function_raises_once_armed_even_when_cached():
    compiled = torch.compile(_double, backend="eager")
    x = torch.arange(4.0)
    assert torch.equal(compiled(x), x * 2 + 1)  # compiled and cached before arming
    traps.install()
    assert traps.dynamo_trap_error() is None
    with traps.trapped("test capture"):
        with pytest.raises(traps.TrapViolation, match="dynamo"):
            compiled(x)
        with pytest.raises(traps.TrapViolation, match="torch.compile"):
            torch.compile(_double, backend="eager")
    assert torch.equal(compiled(x), x * 2 + 1)  # disarmed again: works
    kinds = [v["kind"] for v in traps.violations()]
    assert kinds == ["dynamo", "dynamo"]


def test_compiled_module_raises_once_armed():
    mod = torch.compile(torch.nn.Linear(3, 2), backend="eager")
    x = torch.randn(5, 3)
    mod(x)
    with traps.trapped("test capture"):
        with pytest.raises(traps.TrapViolation):
            mod(x)


def test_eager_torch_is_fine_when_armed():
    with traps.trapped("test capture"):
        y = torch.nn.functional.silu(torch.randn(8, 8)) @ torch.randn(8, 8)
        assert y.shape == (8, 8)
    assert traps.violations() == []


@pytest.mark.parametrize(
    "spawn",
    [
        lambda: subprocess.run(["true"], check=True),
        lambda: subprocess.check_output(["echo", "hi"]),
        lambda: subprocess.getoutput("echo hi"),
        lambda: os.popen("echo hi").read(),
        lambda: os.system("true"),
    ],
    ids=["run", "check_output", "getoutput", "popen", "system"],
)
def test_subprocess_raises_once_armed(spawn):
    spawn()  # fine before arming
    with traps.trapped("test capture"):
        with pytest.raises(traps.TrapViolation, match="subprocess"):
            spawn()
    spawn()  # fine after


def test_log_mode_records_without_raising(tmp_path):
    log = tmp_path / "traps.jsonl"
    with traps.trapped("test capture", mode="log", log_path=str(log)):
        assert subprocess.check_output(["echo", "ok"]).strip() == b"ok"
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(lines) == 1
    assert lines[0]["kind"] == "subprocess" and "echo" in lines[0]["what"]
    assert lines[0]["armed_by"] == "test capture" and lines[0]["stack"]


def test_arm_from_env(monkeypatch, tmp_path):
    monkeypatch.delenv(traps.ENV_MODE, raising=False)
    assert traps.arm_from_env("x") is False and not traps.armed()
    monkeypatch.setenv(traps.ENV_MODE, "log")
    monkeypatch.setenv(traps.ENV_LOG, str(tmp_path / "t.jsonl"))
    assert traps.arm_from_env("layerwise capture") is True and traps.armed()
    subprocess.run(["true"])
    assert (tmp_path / "t.jsonl").read_text().count("\n") == 1
    traps.disarm()
    monkeypatch.setenv(traps.ENV_MODE, "bogus")
    with pytest.raises(ValueError, match=traps.ENV_MODE):
        traps.arm_from_env("x")
