"""Patch 0303: sglang's fast FlashInfer MLA plans (CUDA-graph replay) wait for the wrapper's
previous plan copy before planning into its pinned buffer again, and mark the new copy after.

Calls the installed fork's patched functions on a stand-in wrapper whose `_cached_module.plan`
records the order of events; `torch.cuda.Event` is replaced by a recorder (no GPU here).
"""
from __future__ import annotations

import pytest
import torch

from sglang.sm120 import pinned_plan

fi_mla = pytest.importorskip("sglang.srt.layers.attention.flashinfer_mla_backend")

PLANS = [name for name in ("fast_mla_decode_plan", "fast_mla_prefill_plan") if hasattr(fi_mla, name)]


class RecordingEvent:
    log: list = []

    def record(self):
        RecordingEvent.log.append("record")

    def synchronize(self):
        RecordingEvent.log.append("wait")


class PlanModule:
    def plan(self, *args):
        RecordingEvent.log.append("plan")


class Wrapper:
    def __init__(self):
        self._cached_module = PlanModule()
        self._float_workspace_buffer = self._int_workspace_buffer = self._pin_memory_int_workspace_buffer = None
        n = 2
        self._qo_indptr_buf = torch.zeros(n + 1, dtype=torch.int32)
        self._kv_indptr_buf = torch.zeros(n + 1, dtype=torch.int32)
        self._kv_indices_buf = torch.zeros(16, dtype=torch.int32)
        self._kv_len_arr_buf = torch.zeros(n, dtype=torch.int32)


def _plan(fn, wrapper):
    n = 2
    indptr = torch.arange(n + 1, dtype=torch.int32)
    getattr(fi_mla, fn)(wrapper, indptr, indptr, torch.zeros(n, dtype=torch.int32), torch.ones(n, dtype=torch.int32),
                        4, 512, 64, 1, False, 1.0, torch.bfloat16, torch.bfloat16)


@pytest.fixture
def events(monkeypatch):
    RecordingEvent.log = []
    monkeypatch.setattr(torch.cuda, "Event", RecordingEvent)
    return RecordingEvent.log


def test_the_series_patches_every_fast_mla_plan_of_this_base():
    assert "fast_mla_decode_plan" in PLANS


@pytest.mark.parametrize("fn", PLANS)
def test_each_plan_waits_for_the_previous_copy_of_its_wrapper(events, fn):
    a, b = Wrapper(), Wrapper()
    _plan(fn, a)
    assert events == ["plan", "record"]  # nothing to wait for on the first plan
    _plan(fn, a)
    assert events == ["plan", "record", "wait", "plan", "record"]
    _plan(fn, b)  # another wrapper has its own buffer and its own event
    assert events[-2:] == ["plan", "record"] and events.count("wait") == 1


@pytest.mark.parametrize("fn", PLANS)
def test_a_failed_plan_marks_no_copy(events, fn):
    class Failing(PlanModule):
        def plan(self, *args):
            raise ValueError("bad plan")

    w = Wrapper()
    w._cached_module = Failing()
    with pytest.raises(RuntimeError, match="bad plan"):
        _plan(fn, w)
    assert events == [] and getattr(w, pinned_plan._ATTR, None) is None
