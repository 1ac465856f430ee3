"""runner/prefill_attention.py: which FlashInfer kernels the captured prefill attention plans."""
import logging
from types import SimpleNamespace

import pytest

from sglang.sm120.runner import prefill_attention as pa


@pytest.mark.parametrize("raw, want", [(None, "eager"), ("", "eager"), ("fa2", "fa2"), (" fa3 ", "fa3"),
                                       ("auto", "auto"), ("eager", "eager")])
def test_choice_from_the_environment(env_value, raw, want):
    env_value(pa.ENV, raw)
    assert pa.requested() == want
    assert pa.captured_requested() == (want != "eager")


def test_a_bad_choice_names_the_variable(monkeypatch):
    monkeypatch.setenv(pa.ENV, "fa4")
    with pytest.raises(ValueError, match=f"{pa.ENV}='fa4': expected one of eager, auto, fa2, fa3"):
        pa.requested()


def _planning_backend(resolved: str):
    """Stands in for FlashInfer's backend: its captured prefill wrappers resolve `auto` at plan."""
    attn = SimpleNamespace(prefill_backend="fa2", full_cg_prefill_wrappers=[])

    def build_and_plan():
        w = SimpleNamespace(_backend=attn.prefill_backend)
        if w._backend == "auto":
            w._backend = resolved
        attn.full_cg_prefill_wrappers = [w, w]
    return attn, build_and_plan


@pytest.mark.parametrize("choice, resolved", [("fa3", "fa3"), ("auto", "fa3"), ("auto", "fa2")])
def test_wrappers_built_inside_take_the_choice_and_the_backend_gets_its_own_back(caplog, choice, resolved):
    attn, build_and_plan = _planning_backend(resolved)
    seen = []
    with caplog.at_level(logging.INFO, logger=pa.__name__):
        for _ in range(2):  # the warm pass and the capture pass: one log line, naming what was planned
            with pa.wrappers_built_with(attn, choice, capability=(9, 0)):
                seen.append(attn.prefill_backend)
                build_and_plan()
            seen.append(attn.prefill_backend)
    assert seen == [choice, "fa2", choice, "fa2"]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and f"planned with FlashInfer {resolved} ({pa.ENV}={choice}; upstream: fa2)" in lines[0]
    with pytest.raises(RuntimeError):  # restored on an error too
        with pa.wrappers_built_with(attn, choice, capability=(9, 0)):
            raise RuntimeError("capture failed")
    assert attn.prefill_backend == "fa2"
    for untouched in ("fa2", "eager"):  # upstream's choice, and no captured attention at all
        with pa.wrappers_built_with(attn, untouched):
            assert attn.prefill_backend == "fa2"
    with pa.wrappers_built_with(None, choice):  # no FlashInfer backend: nothing to set
        pass


def test_fa3_is_refused_off_sm90_and_auto_is_left_to_flashinfer():
    attn, _ = _planning_backend("fa2")
    with pytest.raises(ValueError, match=f"{pa.ENV}=fa3: .* SM90 GPU, this one is sm_120; use auto or fa2"):
        with pa.wrappers_built_with(attn, "fa3", capability=(12, 0)):
            pass
    assert attn.prefill_backend == "fa2"
    with pa.wrappers_built_with(attn, "auto", capability=(12, 0)):  # FlashInfer picks fa2 there
        assert attn.prefill_backend == "auto"
    assert pa.planned(SimpleNamespace()) == []


def test_the_captured_attention_prefill_backend_applies_it_for_its_capture_sessions(monkeypatch):
    pytest.importorskip("sglang.srt.model_executor.runner_backend.full_cuda_graph_backend")
    from sglang.sm120.runner.backend import LayerwisePrefillBackend
    from test_runner_backend import FakeDeviceModule, FakeTP

    monkeypatch.setenv(pa.ENV, "auto")  # the opt-in captured attention, FlashInfer's own rule
    attn = SimpleNamespace(prefill_backend="fa2")
    runner = SimpleNamespace(device_module=FakeDeviceModule(),
                             model_runner=SimpleNamespace(tp_group=FakeTP(), attn_backend=attn),
                             capture_num_tokens=[128, 1024], device="cpu")
    from sglang.srt.runtime_context import get_parallel

    # upstream's backends take the TP group from the model runner (0.5.16) or the runtime context (0.5.23)
    with get_parallel().override(tp_group=FakeTP()):
        backend = LayerwisePrefillBackend(runner)
    monkeypatch.setattr("sglang.sm120.runner.backend.FullCudaGraphBackend.capture_session",
                        lambda self, stream: __import__("contextlib").nullcontext())
    with backend.capture_session(None):
        assert attn.prefill_backend == "auto"
    assert attn.prefill_backend == "fa2"


@pytest.mark.parametrize("choice, attn_name, want", [
    (None, "FlashInferAttnBackend", "LayerwiseBreakablePrefillBackend"),  # the default: eager attention
    ("auto", "FlashInferAttnBackend", "LayerwisePrefillBackend"),
    ("fa2", "FlashInferAttnBackend", "LayerwisePrefillBackend"),
    ("auto", "TritonAttnBackend", "LayerwiseBreakablePrefillBackend"),  # cannot plan fixed slots
])
def test_prefill_backend_choice(monkeypatch, choice, attn_name, want):
    pytest.importorskip("sglang.srt.model_executor.runner_backend.full_cuda_graph_backend")
    from sglang.sm120.runner import backend as B

    if choice is None:
        monkeypatch.delenv(pa.ENV, raising=False)
    else:
        monkeypatch.setenv(pa.ENV, choice)
    attn = type(attn_name, (), {"_create_full_cg_prefill_wrappers": lambda self: None})()
    made = []
    for name in ("LayerwisePrefillBackend", "LayerwiseBreakablePrefillBackend"):
        monkeypatch.setattr(B, name, lambda runner, _n=name, **kw: made.append(_n) or _n)
    runner = SimpleNamespace(model_runner=SimpleNamespace(
        attn_backend=attn, server_args=SimpleNamespace(enable_memory_saver=False, debug_cuda_graph=False)))
    assert B.make_prefill_backend(runner) == want and made == [want]
