"""Size planning and bucketing of the layerwise runner (sglang.sm120.runner.sizes / layerwise)."""
from __future__ import annotations

import logging

import pytest
import torch

from sglang.sm120.runner.layerwise import CAPTURED, FULL_FAILED, OUT_OF_MEMORY, EagerFallbackLog, SizeCapturer
from sglang.sm120.runner.sizes import (
    LAYERWISE_DECODE_MAX_BS,
    SizeLedger,
    default_prefill_req_slots,
    layerwise_decode_buckets,
    pad_to_bucket,
    plan_decode,
    plan_prefill,
    prefill_buckets,
    upstream_decode_sizes,
)


def test_upstream_decode_sizes_match_upstream_schedule():
    assert upstream_decode_sizes(256)[:6] == [1, 2, 4, 8, 12, 16]
    assert upstream_decode_sizes(256)[-3:] == [240, 248, 256]
    assert len(upstream_decode_sizes(256)) == 36  # upstream 0.5.16 captures 36 decode sizes up to 256
    assert upstream_decode_sizes(100)[-1] == 100  # max_bs itself always captured


def test_default_decode_plan_full_below_ceiling_layerwise_above():
    plan = plan_decode(ceiling=256, every_size=False)
    assert plan.full_max_bs == 256
    assert plan.full_sizes == upstream_decode_sizes(256)
    assert plan.layerwise_sizes[0] == 288 and plan.layerwise_sizes[-1] == LAYERWISE_DECODE_MAX_BS
    assert all(b % 32 == 0 for b in plan.layerwise_sizes)
    # relative padding above the ceiling stays small
    for bs in range(257, 1025):
        padded = pad_to_bucket(bs, plan.sizes)
        assert padded >= bs and (padded - bs) / bs <= 0.125, bs


def test_every_size_plan_has_no_full_graphs():
    plan = plan_decode(ceiling=256, every_size=True)
    assert plan.full_sizes == [] and plan.full_max_bs == 0
    assert plan.layerwise_sizes == list(plan.sizes)
    assert 1 in plan.sizes and 1024 in plan.sizes


def test_decode_plan_respects_explicit_sizes_and_small_tops():
    plan = plan_decode(ceiling=256, every_size=False, explicit_sizes=[512, 1, 64, 64])
    assert plan.sizes == (1, 64, 512) and plan.full_sizes == [1, 64]
    small = plan_decode(ceiling=256, every_size=False, max_bs=100)
    assert small.max_bs == 100 and small.layerwise_sizes == []
    with pytest.raises(ValueError, match="batch sizes must be >= 1"):
        plan_decode(ceiling=256, every_size=False, explicit_sizes=[0, 8])
    with pytest.raises(ValueError, match="ceiling"):
        plan_decode(ceiling=0, every_size=False)


def test_layerwise_buckets_are_bounded():
    assert layerwise_decode_buckets(256, 256) == []
    assert layerwise_decode_buckets(300, 400) == [320, 352, 384, 400]
    assert layerwise_decode_buckets(512, 1000)[-1] == 1000


def test_prefill_buckets_never_pad_more_than_1_5x_above_64():
    buckets = prefill_buckets(8192)
    assert buckets[-1] == 8192 and buckets[0] == 8
    for n in range(64, 8193):
        assert pad_to_bucket(n, buckets) <= 1.5 * n, n
    # far fewer buckets than upstream's default prefill list (58 sizes to 8192)
    assert len(buckets) < 25
    assert prefill_buckets(5000)[-1] == 5000
    assert prefill_buckets(100000)[-1] == 100000


def test_prefill_plan_explicit_and_slots():
    plan = plan_prefill(max_tokens=8192, explicit_buckets=[4096, 128, 1024], req_slots=64)
    assert plan.buckets == (128, 1024, 4096) and plan.req_slots == 64
    assert default_prefill_req_slots(8192, None) == 64
    assert default_prefill_req_slots(8192, 10) == 10
    assert default_prefill_req_slots(1024, None) == 16
    with pytest.raises(ValueError, match="token buckets"):
        plan_prefill(max_tokens=8192, explicit_buckets=[-1], req_slots=4)


def test_pad_to_bucket():
    assert pad_to_bucket(3, [1, 2, 4, 8]) == 4
    assert pad_to_bucket(8, [1, 2, 4, 8]) == 8
    assert pad_to_bucket(9, [1, 2, 4, 8]) is None


def test_ledger_drop_from_removes_size_and_larger():
    ledger = SizeLedger(planned=[1, 2, 4, 8, 16])
    assert ledger.capture_order() == [16, 8, 4, 2, 1]
    ledger.mark_captured(16)
    assert ledger.drop_from(8) == [8, 16]
    ledger.mark_captured(4)
    assert ledger.servable() == [4]
    with pytest.raises(ValueError):
        ledger.mark_captured(8)


def _capturer(planned, full_max_bs, fail_full=(), oom_at=(), agree=None):
    log = []
    released = []

    def full(size):
        if size in fail_full:
            raise RuntimeError("operation not permitted when stream is capturing")
        if size in oom_at:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        log.append(("full", size))

    def lw(size):
        if size in oom_at:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        log.append(("layerwise", size))

    kw = {} if agree is None else {"agree": agree}
    c = SizeCapturer(planned=planned, full_max_bs=full_max_bs, capture_full=full,
                     capture_layerwise=lw, release=released.append, **kw)
    return c, log, released


def test_capturer_splits_full_and_layerwise_largest_first():
    c, log, _ = _capturer([1, 8, 256, 512, 1024], full_max_bs=256)
    for s in c.order():
        c.capture(s)
    assert log == [("layerwise", 1024), ("layerwise", 512), ("full", 256), ("full", 8), ("full", 1)]
    assert c.summary()["full"] == [1, 8, 256] and c.summary()["layerwise"] == [512, 1024]


def test_capturer_falls_back_to_layerwise_when_moe_is_not_capturable(caplog):
    c, log, _ = _capturer([1, 8, 256, 512], full_max_bs=256, fail_full=(256,))
    with caplog.at_level(logging.WARNING):
        for s in c.order():
            c.capture(s)
    assert log == [("layerwise", 512), ("layerwise", 256), ("layerwise", 8), ("layerwise", 1)]
    assert c.moe_capturable is False and "stream is capturing" in c.fallback_reason
    assert "capturing this and all remaining sizes layerwise" in caplog.text


def test_capturer_oom_drops_size_and_larger_and_continues(caplog):
    c, log, released = _capturer([1, 8, 256, 512, 1024], full_max_bs=256, oom_at=(512,))
    with caplog.at_level(logging.WARNING):
        results = [c.capture(s) for s in c.order()]
    assert results == ["layerwise", None, "full", "full", "full"]
    assert released == [1024]  # captured before the OOM, dropped with it
    assert c.ledger.servable() == [1, 8, 256] and c.summary()["dropped"] == [512, 1024]
    assert "size 512 could not be captured (OutOfMemoryError" in caplog.text


def test_capturer_drops_when_another_rank_ran_out_of_memory():
    c, log, released = _capturer([8, 16], full_max_bs=0, agree=lambda code: max(code, OUT_OF_MEMORY))
    assert c.capture(16) is None
    assert released == [16]  # this rank's graph for 16 is released too
    assert c.capture(8) is None


def test_capturer_goes_layerwise_when_another_ranks_full_graph_failed(caplog):
    calls = []

    def agree(code):  # the other rank's full capture of 256 fails; nothing else does
        calls.append(code)
        return max(code, FULL_FAILED) if len(calls) == 1 else code

    c, log, released = _capturer([8, 256], full_max_bs=256, agree=agree)
    with caplog.at_level(logging.WARNING):
        assert c.capture(256) == "layerwise"
    assert log == [("full", 256), ("layerwise", 256)] and released == [256]  # its own full graph let go
    assert calls == [CAPTURED, CAPTURED]  # one agreement per attempt, the same count on every rank
    assert c.moe_capturable is False and c.fallback_reason == "full-graph capture failed on another rank"
    assert c.capture(8) == "layerwise"


def test_capturer_agrees_once_per_attempt_on_every_outcome():
    codes = []

    def agree(code):
        codes.append(code)
        return code

    c, _, _ = _capturer([1, 8, 256, 512], full_max_bs=256, fail_full=(8,), oom_at=(512,), agree=agree)
    assert [c.capture(s) for s in c.order()] == [None, "full", "layerwise", "layerwise"]
    assert codes == [OUT_OF_MEMORY, CAPTURED, FULL_FAILED, CAPTURED, CAPTURED]


def test_capturer_does_not_mistake_a_trap_for_an_uncapturable_moe():
    from sglang.sm120.traps import TrapViolation

    def full(size):
        raise TrapViolation("subprocess used after 'capture': nvcc --version")

    c = SizeCapturer(planned=[4], full_max_bs=8, capture_full=full,
                     capture_layerwise=lambda s: None, release=lambda s: None)
    with pytest.raises(TrapViolation):
        c.capture(4)
    assert c.moe_capturable


def test_capturer_reraises_real_errors():
    def lw(size):
        raise ValueError("bug")

    c = SizeCapturer(planned=[4], full_max_bs=0, capture_full=lambda s: None,
                     capture_layerwise=lw, release=lambda s: None)
    with pytest.raises(ValueError, match="bug"):
        c.capture(4)


def test_eager_fallback_logged_once_per_size():
    lines = []
    log = EagerFallbackLog("decode", log=lines.append)
    assert log.note(1500, "above the largest captured batch size 1024")
    assert not log.note(1500, "above the largest captured batch size 1024")
    assert log.note(1501, "above the largest captured batch size 1024")
    assert len(lines) == 2 and "size 1500 runs eagerly" in lines[0]
