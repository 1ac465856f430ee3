"""runner/prefill_attention.py: which FlashInfer kernels the captured prefill attention plans."""
import logging
from types import SimpleNamespace

import pytest

from sglang.sm120.runner import prefill_attention as pa


@pytest.mark.parametrize("raw, want", [(None, "fa2"), ("", "fa2"), ("fa2", "fa2"), (" fa3 ", "fa3")])
def test_choice_from_the_environment(env_value, raw, want):
    env_value(pa.ENV, raw)
    assert pa.requested() == want


def test_a_bad_choice_names_the_variable(monkeypatch):
    monkeypatch.setenv(pa.ENV, "auto")
    with pytest.raises(ValueError, match=f"{pa.ENV}='auto': expected one of fa2, fa3"):
        pa.requested()


def test_wrappers_built_inside_take_the_choice_and_the_backend_gets_its_own_back(caplog):
    attn = SimpleNamespace(prefill_backend="fa2")
    seen = []
    with caplog.at_level(logging.INFO, logger=pa.__name__):
        for _ in range(2):  # the warm pass and the capture pass: one log line
            with pa.wrappers_built_with(attn, "fa3"):
                seen.append(attn.prefill_backend)
            seen.append(attn.prefill_backend)
    assert seen == ["fa3", "fa2", "fa3", "fa2"]
    assert len([r for r in caplog.records if "FlashInfer fa3" in r.getMessage()]) == 1
    with pytest.raises(RuntimeError):  # restored on an error too
        with pa.wrappers_built_with(attn, "fa3"):
            raise RuntimeError("capture failed")
    assert attn.prefill_backend == "fa2"
    with pa.wrappers_built_with(attn, "fa2"):  # the default touches nothing
        assert attn.prefill_backend == "fa2"
    with pa.wrappers_built_with(None, "fa3"):  # no FlashInfer backend: nothing to set
        pass


def test_the_captured_attention_prefill_backend_applies_it_for_its_capture_sessions(monkeypatch):
    pytest.importorskip("sglang.srt.model_executor.runner_backend.full_cuda_graph_backend")
    from sglang.sm120.runner.backend import LayerwisePrefillBackend
    from test_runner_backend import FakeDeviceModule, FakeTP

    monkeypatch.setenv(pa.ENV, "fa3")
    attn = SimpleNamespace(prefill_backend="fa2")
    runner = SimpleNamespace(device_module=FakeDeviceModule(),
                             model_runner=SimpleNamespace(tp_group=FakeTP(), attn_backend=attn),
                             capture_num_tokens=[128, 1024], device="cpu")
    backend = LayerwisePrefillBackend(runner)
    monkeypatch.setattr("sglang.sm120.runner.backend.FullCudaGraphBackend.capture_session",
                        lambda self, stream: __import__("contextlib").nullcontext())
    with backend.capture_session(None):
        assert attn.prefill_backend == "fa3"
    assert attn.prefill_backend == "fa2"
