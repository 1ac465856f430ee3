"""FlashInfer's MLA backend plans its ragged prefill before the traps arm.

Upstream's FlashInfer MLA backend plans the ragged prefill (MHA over the new tokens) only on the
first extend, and that plan loads FlashInfer's prefill module (ninja, or a compile on a host
without it), after capture unless warmed. The warm step plans it once the way the backend's
indices updater does.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang.srt.layers.attention.flashinfer_mla_backend")

from sglang.sm120 import upstream_api  # noqa: E402
from sglang.sm120.runner import prewarm  # noqa: E402


class Ragged:
    def __init__(self):
        self.calls = []

    def begin_forward(self, **kwargs):
        self.calls.append(kwargs)


def _runner(backend):
    return SimpleNamespace(attn_backend=backend, device="cpu")


def _mla_backend():
    cls = upstream_api.require("FlashInferMLAAttnBackend")
    backend = cls.__new__(cls)  # the planning state only: no GPU workspace
    backend.indices_updater_prefill = SimpleNamespace(num_local_heads=16, qk_nope_head_dim=128, qk_rope_head_dim=64,
                                                      v_head_dim=128, q_data_type=torch.bfloat16)
    backend.prefill_wrapper_ragged = Ragged()
    return backend


def test_plans_the_ragged_prefill_with_the_updaters_shapes():
    backend = _mla_backend()
    prewarm.warm_flashinfer_mla_prefill(_runner(backend))
    (call,) = backend.prefill_wrapper_ragged.calls
    assert call["head_dim_qk"] == 192 and call["head_dim_vo"] == 128  # nope + rope, v
    assert call["num_qo_heads"] == call["num_kv_heads"] == 16
    assert call["q_data_type"] == torch.bfloat16 and call["causal"] is True
    assert call["qo_indptr"].tolist() == call["kv_indptr"].tolist() == [0, 1]
    assert call["qo_indptr"].dtype == torch.int32


def test_other_backends_are_left_alone():
    other = SimpleNamespace(prefill_wrapper_ragged=Ragged(), indices_updater_prefill=None)
    prewarm.warm_flashinfer_mla_prefill(_runner(other))
    assert other.prefill_wrapper_ragged.calls == []


def test_a_failing_plan_is_logged_not_raised(caplog):
    backend = _mla_backend()
    del backend.indices_updater_prefill.v_head_dim
    with caplog.at_level("WARNING"):
        prewarm.warm_flashinfer_mla_prefill(_runner(backend))
    assert "could not pre-load FlashInfer's MLA ragged prefill module" in caplog.text
