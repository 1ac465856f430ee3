"""runner/prewarm.py: FlashInfer's sampling and cascade modules are built on a thread while the
warm passes run, and joined before the traps arm (a build spawns ninja)."""
import sys
import threading
import types
from types import SimpleNamespace

import pytest

from sglang.sm120.runner import prewarm


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(prewarm, "_BUILDER", None)
    monkeypatch.setattr(prewarm, "_BUILT", [])


def _fake_flashinfer(monkeypatch, gate: threading.Event, seen: list):
    def getter(name):
        def get():
            seen.append((name, threading.current_thread().name))
            gate.wait(10)
        return get
    pkg = types.ModuleType("flashinfer")
    sampling = types.ModuleType("flashinfer.sampling")
    sampling.get_sampling_module = getter("sampling")
    cascade = types.ModuleType("flashinfer.cascade")
    cascade.get_cascade_module = getter("cascade")
    for name, mod in (("flashinfer", pkg), ("flashinfer.sampling", sampling), ("flashinfer.cascade", cascade)):
        monkeypatch.setitem(sys.modules, name, mod)


@pytest.mark.parametrize("sampling, attention, want", [
    ("flashinfer", "flashinfer", ["sampling", "cascade"]),
    ("pytorch", "flashinfer", ["cascade"]),
    ("flashinfer", "triton", ["sampling"]),
    ("pytorch", "triton", []),
])
def test_modules_built_on_a_thread_and_joined(monkeypatch, sampling, attention, want):
    gate, seen = threading.Event(), []
    _fake_flashinfer(monkeypatch, gate, seen)
    sa = SimpleNamespace(sampling_backend=sampling, attention_backend=attention,
                         prefill_attention_backend=None, decode_attention_backend=None)
    prewarm.start_background_builds(sa)
    prewarm.start_background_builds(sa)  # once per process
    if want:
        assert prewarm._BUILDER is not None and prewarm._BUILDER.is_alive()
    gate.set()
    prewarm.join_background_builds()
    assert [n for n, _ in seen] == want and prewarm._BUILT == want
    assert all(t == "sm120-flashinfer-jit" for _, t in seen)
    assert prewarm._BUILDER is None or not prewarm._BUILDER.is_alive()


def test_upstream_decode_runner_waits_for_the_builds(monkeypatch):
    """Layerwise prefill with upstream's decode graphs: the builds end before upstream captures."""
    from sglang.sm120.runner import hooks

    joined = []
    monkeypatch.setattr(prewarm, "join_background_builds", lambda: joined.append(1))
    monkeypatch.setattr(hooks, "phase_backend", lambda sa, phase: "full")
    default = object()
    assert hooks.decode_runner_class(SimpleNamespace(server_args=None), default) is default
    assert joined == [1]
