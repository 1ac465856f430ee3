"""Patch 0113 on the installed fork: upstream's own `RadixAttention.forward` hands a plain decode call
to the boundary inside a session with attention islands (where the probe runs it through the
attention backend and records an attention island), and runs as upstream otherwise."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

R = pytest.importorskip("sglang.srt.layers.radix_attention")

from sglang.sm120.runner.boundary import ATTENTION, ProbeSession, StagingArena  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402
from sglang.srt.model_executor.forward_context import ForwardContext, forward_context  # noqa: E402

HEADS, KV_HEADS, DIM, ROWS = 2, 1, 4, 3


class RecordingBackend:
    def __init__(self):
        self.calls = []

    def forward(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        self.calls.append((tuple(q.shape), tuple(k.shape), forward_batch.forward_mode, save_kv_cache, kwargs))
        return q * 2


def _call(session_attention, mode, **kwargs):
    layer = R.RadixAttention(HEADS, DIM, 0.5, KV_HEADS, layer_id=0)
    q = torch.randn(ROWS, HEADS * DIM)
    k, v = torch.randn(ROWS, KV_HEADS * DIM), torch.randn(ROWS, KV_HEADS * DIM)
    batch = SimpleNamespace(forward_mode=mode, global_num_token_non_padded_cpu=None)
    backend, records = RecordingBackend(), []
    with forward_context(ForwardContext(attn_backend=backend)), \
            ProbeSession(StagingArena(ROWS, "cpu"), records, attention=session_attention):
        out = layer(q, k, v, batch, **kwargs)
    return out, q, records, backend


def test_a_decode_call_becomes_an_attention_island_run_by_upstream_s_forward():
    out, q, records, backend = _call(True, ForwardMode.DECODE)
    assert [r.kind for r in records] == [ATTENTION] and records[0].rows == ROWS
    # the probe ran upstream's forward once, bypassing the hook: k viewed per head as upstream does
    assert backend.calls == [((ROWS, HEADS * DIM), (ROWS, KV_HEADS, DIM), ForwardMode.DECODE, True, {})]
    torch.testing.assert_close(out, q * 2)


@pytest.mark.parametrize("attention, mode, kwargs", [
    (False, ForwardMode.DECODE, {}),       # a session without attention islands (prefill, MoE only)
    (True, ForwardMode.EXTEND, {}),        # not a decode
    (True, ForwardMode.DECODE, {"sinks": torch.zeros(HEADS)}),  # extra arguments stay in the graph
])
def test_other_calls_stay_upstream_s(attention, mode, kwargs):
    out, q, records, backend = _call(attention, mode, **kwargs)
    assert records == [] and len(backend.calls) == 1
    torch.testing.assert_close(out, q * 2)
