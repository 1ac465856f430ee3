"""The layerwise prefill runner takes upstream's body-capture ("eager tail") path.

Upstream's PrefillCudaGraphRunner picks body capture + eager LM head / logits processor from the
backend *name* (breakable, full). Under the name 'layerwise' it took the tc_piecewise path: the
whole model.forward (LM head and logits processor included, with the capture batch's request
slots) went into the graph, and return_logprob prefills never used the graph. These tests run
upstream's own methods on a runner object, so they fail if that selection regresses.
"""
from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

P = pytest.importorskip("sglang.srt.model_executor.runner.prefill_cuda_graph_runner")

from sglang.sm120.runner.runners import LayerwisePrefillRunner  # noqa: E402
from sglang.srt.model_executor.cuda_graph_config import Backend  # noqa: E402


def _runner(cls, monkeypatch, calls):
    r = object.__new__(cls)
    r.prefill_backend_name = Backend.LAYERWISE
    r.layer_model = SimpleNamespace(forward=lambda *a, **k: calls.append("body") or "hidden")
    r.model_runner = SimpleNamespace(
        model=SimpleNamespace(forward=lambda *a, **k: calls.append("model+logits") or "logits"),
        _pp_kwargs=lambda proxy: {},  # 0.5.23 asks the model runner (no pipeline parallelism here)
    )
    r._prefill_forward_context = lambda fb, **kw: contextlib.nullcontext()
    r._get_layer_model_positions = lambda fb: fb.positions
    # 0.5.23 reads these too: no pipeline parallelism, no Qwen hidden-state side channel here
    r.buffers = SimpleNamespace(pp_proxy_tensors=None)
    r._qwen_bcg_hc_sidechannel = False
    monkeypatch.setattr(P, "set_dp_buffer_len", lambda *a, **k: None)
    monkeypatch.setattr(P, "set_is_extend_in_batch", lambda *a, **k: None)
    return r


def _batch(**kw):
    fb = SimpleNamespace(
        global_dp_buffer_len=None,
        dp_padding_mode=SimpleNamespace(is_max_len=lambda: False),
        global_num_tokens_cpu=None,
        input_ids=torch.arange(8),
        positions=torch.arange(8),
        input_embeds=None,
        return_logprob=False,
    )
    fb.__dict__.update(kw)
    return fb


def test_layerwise_prefill_captures_the_body_only(monkeypatch):
    calls = []
    r = _runner(LayerwisePrefillRunner, monkeypatch, calls)
    assert r._uses_eager_prefill_tail()
    assert P.PrefillCudaGraphRunner._run_forward(r, _batch(), 8) == "hidden"
    assert calls == ["body"]


def test_upstream_alone_would_capture_lm_head_for_the_layerwise_name(monkeypatch):
    """The bug the override fixes: the same object with upstream's method."""
    calls = []
    r = _runner(P.PrefillCudaGraphRunner, monkeypatch, calls)
    assert not r._uses_eager_prefill_tail()
    P.PrefillCudaGraphRunner._run_forward(r, _batch(), 8)
    assert calls == ["model+logits"]


def test_return_logprob_prefill_is_graphable_and_sizes_logits_rows(monkeypatch):
    r = _runner(LayerwisePrefillRunner, monkeypatch, [])
    fb = _batch(
        return_logprob=True,
        global_num_tokens_for_logprob_cpu=None,
        extend_logprob_start_lens_cpu=[6, 0],
        extend_seq_lens_cpu=[7, 1],
    )
    # Upstream asserts the eager tail before sizing the logits buffer of a logprob prefill.
    assert P.PrefillCudaGraphRunner._prefill_logits_buffer_rows(r, fb) == 2
